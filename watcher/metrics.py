"""The watcher's metrics, from what it sees of Migrations and what it asks of Temporal (names in
ferry.observability.metrics).

Temporal calls are counted by a client interceptor, so every call is counted, whichever
part of the watcher makes it: what a resync costs is a number to read, not to guess.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from temporalio.client import (
    CancelWorkflowInput,
    DescribeWorkflowInput,
    FetchWorkflowHistoryEventsInput,
    Interceptor,
    ListWorkflowsInput,
    OutboundInterceptor,
    SignalWorkflowInput,
    StartWorkflowInput,
    StartWorkflowUpdateInput,
    TerminateWorkflowInput,
    WorkflowExecutionAsyncIterator,
    WorkflowExecutionDescription,
    WorkflowHandle,
    WorkflowHistoryEventAsyncIterator,
    WorkflowUpdateHandle,
)
from temporalio.common import MetricCounter, MetricMeter

from ferry.api.migration import Phase
from ferry.observability import metrics as names
from watcher.inventory import Summary


class WatcherMetrics:
    def __init__(self, meter: MetricMeter) -> None:
        self.events = meter.create_counter(names.WATCHER_EVENTS, "Migration events the watcher received")
        self.passes = meter.create_counter(names.WATCHER_PASSES, "Passes over a Migration, by what each did")
        self.temporal_calls = meter.create_counter(names.WATCHER_TEMPORAL_CALLS, "Calls the watcher made to Temporal")
        self.event_to_start = meter.create_histogram_float(
            names.EVENT_TO_START, "From receiving a Migration without a workflow to that workflow existing", "s"
        )
        self._migrations = meter.create_gauge(names.MIGRATIONS, "Migrations by phase, as of the last resync")
        self._step_started = meter.create_gauge_float(
            names.STEP_STARTED, "When the running step of a Migration started (0: none running)", "s"
        )
        self._deletion_pending = meter.create_gauge_float(
            names.DELETION_PENDING, "Since when a deleted Migration waits for its undo (0: not waiting)", "s"
        )
        self._running: set[tuple[str, str, str]] = set()
        self._deleting: set[tuple[str, str]] = set()

    def observe(self, summaries: Iterable[tuple[tuple[str, str], Summary]]) -> None:
        """Sets the gauges from what the watcher knows of every Migration (gauges cannot forget a series: they go
        to 0)."""
        by_phase = dict.fromkeys(Phase, 0)
        running: dict[tuple[str, str, str], float] = {}
        deleting: dict[tuple[str, str], float] = {}
        for key, summary in summaries:
            by_phase[summary.phase or Phase.PENDING] += 1
            if summary.step:
                running[(*key, summary.step)] = summary.step_started
            if summary.deletion_since:
                deleting[key] = summary.deletion_since
        for phase, count in by_phase.items():
            self._migrations.set(count, {"phase": phase.value})
        for namespace, name, step in self._running - running.keys():
            self._step_started.set(0.0, {"namespace": namespace, "name": name, "step": step})
        for (namespace, name, step), started in running.items():
            self._step_started.set(started, {"namespace": namespace, "name": name, "step": step})
        for namespace, name in self._deleting - deleting.keys():
            self._deletion_pending.set(0.0, {"namespace": namespace, "name": name})
        for (namespace, name), since in deleting.items():
            self._deletion_pending.set(since, {"namespace": namespace, "name": name})
        self._running, self._deleting = set(running), set(deleting)

    def changed(self, key: tuple[str, str], summary: Summary | None) -> None:
        """Sets one Migration's gauges as a watch event shows it (None: gone), so that a running step or a
        deletion shorter than a resync still shows."""
        namespace, name = key
        for running in [entry for entry in self._running if entry[:2] == key]:
            if summary is None or summary.step != running[2]:
                self._step_started.set(0.0, {"namespace": namespace, "name": name, "step": running[2]})
                self._running.discard(running)
        if summary is not None and summary.step:
            self._step_started.set(summary.step_started, {"namespace": namespace, "name": name, "step": summary.step})
            self._running.add((namespace, name, summary.step))
        if summary is not None and summary.deletion_since:
            self._deletion_pending.set(summary.deletion_since, {"namespace": namespace, "name": name})
            self._deleting.add(key)
        elif key in self._deleting:
            self._deletion_pending.set(0.0, {"namespace": namespace, "name": name})
            self._deleting.discard(key)


class CountingInterceptor(Interceptor):
    """Counts each call the watcher's Temporal client makes, by its name."""

    def __init__(self, counter: MetricCounter) -> None:
        self._counter = counter

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Counting(next, self._counter)


class _Counting(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, counter: MetricCounter) -> None:
        super().__init__(next)
        self._counter = counter

    def _count(self, call: str) -> None:
        self._counter.add(1, {"call": call})

    async def start_workflow(self, input: StartWorkflowInput) -> WorkflowHandle[Any, Any]:
        self._count("start_workflow")
        return await super().start_workflow(input)

    async def describe_workflow(self, input: DescribeWorkflowInput) -> WorkflowExecutionDescription:
        self._count("describe_workflow")
        return await super().describe_workflow(input)

    async def cancel_workflow(self, input: CancelWorkflowInput) -> None:
        self._count("cancel_workflow")
        await super().cancel_workflow(input)

    async def terminate_workflow(self, input: TerminateWorkflowInput) -> None:
        self._count("terminate_workflow")
        await super().terminate_workflow(input)

    async def signal_workflow(self, input: SignalWorkflowInput) -> None:
        self._count("signal_workflow")
        await super().signal_workflow(input)

    async def start_workflow_update(self, input: StartWorkflowUpdateInput) -> WorkflowUpdateHandle[Any]:
        self._count("start_workflow_update")
        return await super().start_workflow_update(input)

    def fetch_workflow_history_events(
        self, input: FetchWorkflowHistoryEventsInput
    ) -> WorkflowHistoryEventAsyncIterator:
        self._count("fetch_workflow_history_events")
        return super().fetch_workflow_history_events(input)

    def list_workflows(self, input: ListWorkflowsInput) -> WorkflowExecutionAsyncIterator:
        self._count("list_workflows")
        return super().list_workflows(input)
