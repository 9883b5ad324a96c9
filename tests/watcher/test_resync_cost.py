"""What a resync costs: nothing per Migration that needs nothing, whatever their number (issue #17).

Counted, not timed: the watcher's own counters (passes over a Migration by what each did,
events by type, calls to Temporal by name, from its /metrics), the Migrations'
resourceVersions, which any write would change, and the objects the watcher holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import re
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import Client

from devstack.stack.readiness import free_port
from devstack.stack.stack import StackInfo
from ferry.api.migration import WORKFLOW_ANNOTATION, Migration
from ferry.api.saga import MigrationRef, workflow_id
from ferry.observability.settings import ObservabilitySettings
from tests.end_to_end import eventually, migration_manifest, watcher_settings
from tests.watcher.conftest import has_workflow
from watcher import runner

COUNT = 30
GROUP, VERSION, PLURAL = "ferry.dev", "v1alpha1", "migrations"


@dataclasses.dataclass
class Counters:
    """What the watcher's /metrics says it did."""

    passes: dict[str, float]
    """Passes over a Migration, by action (`nothing`, `start+finalizer`, ...)."""
    calls: dict[str, float]
    """Calls to Temporal, by name."""
    events: dict[str, float]
    """Migrations received, by how (`LISTED`, `ADDED`, `MODIFIED`, ...)."""

    def calls_but(self, call: str) -> float:
        return sum(count for name, count in self.calls.items() if name != call)


def _scrape(url: str) -> Counters:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()

    def by(name: str, label: str) -> dict[str, float]:
        found: dict[str, float] = {}
        for match in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE):
            value = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))[label]
            found[value] = found.get(value, 0.0) + float(match.group(2))
        return found

    return Counters(
        by("ferry_watcher_passes_total", "action"),
        by("ferry_watcher_temporal_calls_total", "call"),
        by("ferry_watcher_events_total", "type"),
    )


Watch = Callable[..., contextlib.AbstractAsyncContextManager[Callable[[], Counters]]]
"""Runs a watcher while the block runs (keyword arguments change its settings); the block gets a reader of its
counters."""


@pytest.fixture
def counted_watcher(stack: StackInfo, task_queue: str, namespace: str) -> Watch:
    """Runs ferry's watcher in this process with a metrics endpoint; yields a reader of its counters."""

    @contextlib.asynccontextmanager
    async def watching(**changes: Any) -> AsyncIterator[Callable[[], Counters]]:
        address = f"127.0.0.1:{free_port()}"
        settings = dataclasses.replace(
            watcher_settings(stack, task_queue, namespace, **changes),
            observability=ObservabilitySettings(metrics_address=address),
        )
        stop = asyncio.Event()
        running = asyncio.create_task(runner.run(settings, stop=stop))

        def read() -> Counters:
            return _scrape(f"http://{address}/metrics")

        async def answers() -> bool:
            try:
                await asyncio.to_thread(read)
            except urllib.error.URLError:
                return False
            return True

        try:
            await eventually("the watcher's metrics endpoint", answers)
            yield read
        finally:
            stop.set()
            await asyncio.wait_for(running, timeout=30)

    return watching


def _create(custom: k8s.CustomObjectsApi, stack: StackInfo, namespace: str, name: str) -> MigrationRef:
    created = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, migration_manifest(stack, "snapshots", name=name)
    )
    return MigrationRef(namespace=namespace, name=name, uid=created["metadata"]["uid"])


def _objects(custom: k8s.CustomObjectsApi, namespace: str) -> dict[str, dict[str, Any]]:
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    return {item["metadata"]["name"]: item for item in listed["items"]}


def _versions(custom: k8s.CustomObjectsApi, namespace: str) -> dict[str, str]:
    return {name: item["metadata"]["resourceVersion"] for name, item in _objects(custom, namespace).items()}


def _finish(custom: k8s.CustomObjectsApi, ref: MigrationRef) -> None:
    """Finished, as the saga's last status mirror leaves a Migration."""
    _mirror(custom, ref, "Succeeded")


def _mirror(custom: k8s.CustomObjectsApi, ref: MigrationRef, phase: str) -> None:
    """The phase, naming the run, as the saga's status mirror writes it."""
    status = {
        "phase": phase,
        "observedGeneration": 1,
        "workflow": {"namespace": "default", "id": workflow_id(ref)},
    }
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ref.namespace, PLURAL, ref.name, {"status": status},
        _content_type="application/merge-patch+json",
    )  # fmt: skip


async def _resyncs(read: Callable[[], Counters], at_least: int) -> bool:
    """Each resync asks Temporal exactly one visibility query."""
    return (await asyncio.to_thread(read)).calls.get("list_workflows", 0.0) >= at_least


async def test_a_resync_relists_nothing_and_asks_temporal_only_its_one_query(
    migration_crd: str, namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, temporal_client: Client,
    counted_watcher: Watch,
) -> None:  # fmt: skip
    """The watch resumes from its resourceVersion, so a resync has nothing to relist: ten thousand finished
    Migrations once cost a relist and a pass each every 30 seconds."""
    custom = k8s.CustomObjectsApi(kube_api)
    for index in range(COUNT):
        _finish(custom, _create(custom, stack, namespace, f"done-{index:02d}"))
    before = _versions(custom, namespace)

    async with counted_watcher() as read:
        await eventually("two resyncs (every 2s)", lambda: _resyncs(read, 2), seen=lambda: str(read()))
        counted = await asyncio.to_thread(read)
        assert counted.events.get("LISTED") == COUNT  # the first list, and no other
        assert counted.passes == {"nothing": COUNT}
        assert counted.calls_but("list_workflows") == 0, counted.calls
        assert _versions(custom, namespace) == before  # no finalizer, no status, no annotation: no write

        # The watcher still acts on a new Migration: one start, for it alone.
        new = _create(custom, stack, namespace, "new")
        await eventually("the new Migration's workflow", lambda: has_workflow(temporal_client, new))
        await eventually("the new Migration's annotation", lambda: _annotated(custom, namespace, new))
        assert (await asyncio.to_thread(read)).calls.get("start_workflow") == 1
    await temporal_client.get_workflow_handle(workflow_id(new)).terminate("test finished")


async def test_between_events_the_watcher_holds_no_migration_object_that_needs_nothing(
    migration_crd: str, namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, counted_watcher: Watch
) -> None:
    """What a finished Migration costs the watcher's memory is a summary, not the object: ten thousand of them
    once held 360 MiB."""
    custom = k8s.CustomObjectsApi(kube_api)
    for index in range(COUNT):
        _finish(custom, _create(custom, stack, namespace, f"done-{index:02d}"))

    async with counted_watcher() as read:
        await eventually("two resyncs (every 2s)", lambda: _resyncs(read, 2), seen=lambda: str(read()))
        gc.collect()
        held = [item for item in gc.get_objects() if isinstance(item, Migration)]
        assert [item.metadata.name for item in held if item.metadata.namespace == namespace] == []


async def _annotated(custom: k8s.CustomObjectsApi, namespace: str, ref: MigrationRef) -> bool:
    item = (await asyncio.to_thread(_objects, custom, namespace))[ref.name]
    return bool((item["metadata"].get("annotations") or {}).get(WORKFLOW_ANNOTATION) == workflow_id(ref))


async def test_a_restarted_watcher_starts_nothing_again_for_migrations_whose_workflows_exist_with_no_worker_running(
    migration_crd: str, namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, temporal_client: Client,
    counted_watcher: Watch,
) -> None:  # fmt: skip
    """No worker runs them, so no status says they started: the watcher's annotation does (it was 10,000 start
    calls per resync once a bounded cache of started IDs overflowed)."""
    custom = k8s.CustomObjectsApi(kube_api)
    refs = [_create(custom, stack, namespace, f"waiting-{index:02d}") for index in range(COUNT)]
    async with counted_watcher():
        for ref in refs:
            await eventually(f"the annotation of {ref.name}", lambda ref=ref: _annotated(custom, namespace, ref))
    before = _versions(custom, namespace)

    async with counted_watcher() as read:
        await eventually("two resyncs (every 2s)", lambda: _resyncs(read, 2), seen=lambda: str(read()))
        counted = await asyncio.to_thread(read)
        assert counted.calls_but("list_workflows") == 0, counted.calls
        assert counted.passes == {"nothing": COUNT}
        assert _versions(custom, namespace) == before
    for ref in refs:
        assert await has_workflow(temporal_client, ref)
        await temporal_client.get_workflow_handle(workflow_id(ref)).terminate("test finished")


@pytest.mark.finalizer_at_create
async def test_a_start_no_status_names_in_time_is_recorded_once_and_one_the_saga_mirrored_costs_nothing_more(
    migration_crd: str, namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, temporal_client: Client,
    counted_watcher: Watch,
) -> None:  # fmt: skip
    """Both Migrations hold ferry's finalizer from their creation, so their starts write nothing. The saga of the
    first mirrors its status in time: after --record-start-after nothing is read, asked or written for it. The
    second gets no status (no worker runs here): after --record-start-after its start is refused and the annotation
    records it, once."""
    custom = k8s.CustomObjectsApi(kube_api)
    async with counted_watcher(record_start_after=5) as read:
        mirrored = _create(custom, stack, namespace, "mirrored")
        await eventually("the first Migration's workflow", lambda: has_workflow(temporal_client, mirrored))
        _mirror(custom, mirrored, "Running")  # the saga's first status

        async def status_seen() -> bool:
            return (await asyncio.to_thread(read)).passes.get("nothing") == 1

        await eventually("the pass the status brings", status_seen)
        unmirrored = _create(custom, stack, namespace, "unmirrored")  # its timer fires after the first one's
        await eventually("the second Migration's annotation", lambda: _annotated(custom, namespace, unmirrored))

        async def settled() -> bool:  # the annotation's own event brings a pass, which does nothing
            return (await asyncio.to_thread(read)).passes.get("nothing") == 2

        # A look again at the first Migration would be a third `nothing` pass: this would time out, showing it.
        await eventually("the pass the annotation brings, and no other", settled, seen=lambda: str(read()))
        counted = await asyncio.to_thread(read)
        assert counted.passes == {"start": 3, "nothing": 2}
        assert counted.calls.get("start_workflow") == 3, counted.calls
        assert not await _annotated(custom, namespace, mirrored)
    for ref in (mirrored, unmirrored):
        await temporal_client.get_workflow_handle(workflow_id(ref)).terminate("test finished")


async def _phase(custom: k8s.CustomObjectsApi, ref: MigrationRef) -> str | None:
    item = (await asyncio.to_thread(_objects, custom, ref.namespace))[ref.name]
    phase: str | None = (item.get("status") or {}).get("phase")
    return phase


async def test_a_resync_asks_temporal_about_no_unfinished_migration_whose_run_it_lists_running(
    migration_crd: str, namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, temporal_client: Client,
    counted_watcher: Watch,
) -> None:  # fmt: skip
    """The same one query says which runs are Running: only a Migration whose run it does not list costs a describe
    (and one more in its pass), here the one whose run was deleted from Temporal, and only until it is marked
    Abandoned."""
    custom = k8s.CustomObjectsApi(kube_api)
    refs = [_create(custom, stack, namespace, f"running-{index:02d}") for index in range(COUNT)]
    async with counted_watcher():
        for ref in refs:
            await eventually(f"the annotation of {ref.name}", lambda ref=ref: _annotated(custom, namespace, ref))
    for ref in refs:
        _mirror(custom, ref, "Running")  # the saga's status (no worker runs them here)
    lost, *kept = refs
    await temporal_client.workflow_service.delete_workflow_execution(
        DeleteWorkflowExecutionRequest(
            namespace=temporal_client.namespace, workflow_execution=WorkflowExecution(workflow_id=workflow_id(lost))
        )
    )
    await eventually("Temporal to forget the run", lambda: _not(has_workflow(temporal_client, lost)))

    async with counted_watcher() as read:
        await eventually("the lost run's Migration to be Abandoned", lambda: _is(_phase(custom, lost), "Abandoned"))
        resyncs = (await asyncio.to_thread(read)).calls.get("list_workflows", 0.0)
        await eventually("two more resyncs", lambda: _resyncs(read, int(resyncs) + 2), seen=lambda: str(read()))
        counted = await asyncio.to_thread(read)
        assert counted.calls.get("describe_workflow") == 2, counted.calls  # the resync's, then its pass's
        assert counted.calls_but("list_workflows") == 2, counted.calls
        assert counted.passes.get("check-run") == 1, counted.passes
    for ref in kept:
        assert await _phase(custom, ref) == "Running"
        await temporal_client.get_workflow_handle(workflow_id(ref)).terminate("test finished")


async def _not(check: Awaitable[bool]) -> bool:
    return not await check


async def _is(value: Awaitable[str | None], wanted: str) -> bool:
    return await value == wanted


async def test_the_running_runs_are_listed_once_per_lost_runs_interval_not_at_every_resync(
    migration_crd: str, namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, temporal_client: Client,
    counted_watcher: Watch,
) -> None:  # fmt: skip
    """Listing a fleet's Running runs costs a page per thousand: at 5,000 paused Migrations and a resync every 30 s, it
    was most of the watcher's idle CPU. The first resync lists them; a run lost after it waits for the next listing,
    --lost-runs-interval later, while the resyncs in between ask only for the runs ended from outside."""
    custom = k8s.CustomObjectsApi(kube_api)
    refs = [_create(custom, stack, namespace, f"paused-{index:02d}") for index in range(2)]
    async with counted_watcher():
        for ref in refs:
            await eventually(f"the annotation of {ref.name}", lambda ref=ref: _annotated(custom, namespace, ref))
    for ref in refs:
        _mirror(custom, ref, "Paused")
    lost, kept = refs

    async with counted_watcher(lost_runs_interval=3600) as read:
        await eventually("the first resync, which lists the Running runs", lambda: _resyncs(read, 1))
        await temporal_client.workflow_service.delete_workflow_execution(
            DeleteWorkflowExecutionRequest(
                namespace=temporal_client.namespace, workflow_execution=WorkflowExecution(workflow_id=workflow_id(lost))
            )
        )
        await eventually("Temporal to forget the run", lambda: _not(has_workflow(temporal_client, lost)))
        resyncs = (await asyncio.to_thread(read)).calls.get("list_workflows", 0.0)
        await eventually("three more resyncs", lambda: _resyncs(read, int(resyncs) + 3), seen=lambda: str(read()))
        counted = await asyncio.to_thread(read)
        assert counted.calls_but("list_workflows") == 0, counted.calls  # no describe: nothing was listed since
    assert await _phase(custom, lost) == "Paused"

    async with counted_watcher(lost_runs_interval=3600):  # a watcher that starts lists them at its first resync
        await eventually("the lost run's Migration to be Abandoned", lambda: _is(_phase(custom, lost), "Abandoned"))
    assert await _phase(custom, kept) == "Paused"
    await temporal_client.get_workflow_handle(workflow_id(kept)).terminate("test finished")
