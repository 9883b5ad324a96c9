"""Mode Online survives its worker dying: replicate and catch-up resume on another worker, never with a second slot.

A worker in a process of its own (tests/postgres/worker_process.py) SIGKILLs itself in
the middle of the step: replicate once the subscription and its slot exist and the
initial copy runs, catch-up while it waits for the target to apply the last changes.
Another worker, in this process, takes over the retry that the step's workflow
(tests/postgres/step.py) schedules once the dead one stops heartbeating.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from activities.postgres.replicating import ReplicationActivities
from activities.settings import DataActivitySettings
from devstack.stack.install import Binaries
from devstack.stack.stack import StackInfo
from ferry.api.saga import CatchUpInput, ReplicateInput
from tests.end_to_end import Databases
from tests.postgres.data import connect, contents, create_shop
from tests.postgres.online import NOTHING, OnlineSteps, leftovers
from tests.postgres.step import CatchUpStep, ReplicateStep

REPOSITORY = Path(__file__).parent.parent.parent


@contextlib.asynccontextmanager
async def _worker(
    client: Client, task_queue: str, replication: ReplicationActivities | None = None
) -> AsyncIterator[None]:
    """A worker in this process hosting the step workflows, or (when given) the replication activities."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as executor:
        worker = Worker(
            client,
            task_queue=task_queue,
            workflows=[] if replication else [ReplicateStep, CatchUpStep],
            activities=[replication.replicate, replication.catch_up] if replication else [],
            activity_executor=executor,
            identity="in-test-worker",
        )
        async with worker:
            yield


async def _killed_in_the_middle(
    stack: StackInfo, binaries: Binaries, client: Client, task_queue: str, activity: str, start: Any
) -> WorkflowHandle[Any, Any]:
    """Starts the step on a worker that kills itself in the middle of `activity`; returns the step's workflow."""
    doomed = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.postgres.worker_process",
        f"--state-dir={stack.state_dir}",
        f"--task-queue={task_queue}",
        f"--bindir={binaries.postgres_bindir}",
        f"--activity={activity}",
        cwd=REPOSITORY,
    )
    try:
        handle: WorkflowHandle[Any, Any] = await start()
        code = await asyncio.wait_for(doomed.wait(), 120)
    finally:
        if doomed.returncode is None:
            doomed.kill()
            await doomed.wait()
    assert code == -9, f"the worker killed itself in the middle of {activity}"
    return handle


async def _started_attempts(handle: WorkflowHandle[Any, Any]) -> list[tuple[int, str]]:
    return [
        (event.activity_task_started_event_attributes.attempt, event.activity_task_started_event_attributes.identity)
        async for event in handle.fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]


def _replication(kube_api: k8s.ApiClient, settings: DataActivitySettings) -> ReplicationActivities:
    return ReplicationActivities(kube_api, settings)


async def test_a_worker_killed_during_replicate_is_replaced_and_the_step_goes_on_with_the_same_slot_and_subscription(
    stack: StackInfo, databases: Databases, binaries: Binaries, online: OnlineSteps, kube_api: k8s.ApiClient,
    data_settings: DataActivitySettings, temporal_client: Client, task_queue: str,
) -> None:  # fmt: skip
    create_shop(databases.source, customers=2_000, orders=200_000)
    input = ReplicateInput(ref=online.ref, driver=online.driver)

    async with _worker(temporal_client, task_queue):

        async def start() -> WorkflowHandle[Any, Any]:
            return await temporal_client.start_workflow(
                ReplicateStep.run, input, id=f"replicate-{uuid.uuid4()}", task_queue=task_queue
            )

        handle = await _killed_in_the_middle(stack, binaries, temporal_client, task_queue, "replicate", start)
        died_with = leftovers(databases)
        assert died_with["subscriptions"] == [online.name], "it died with its subscription made"

        async with _worker(temporal_client, task_queue, _replication(kube_api, data_settings)):
            result = await asyncio.wait_for(handle.result(), 180)

    assert await _started_attempts(handle) == [(2, "in-test-worker")], "its second attempt ran on the other worker"
    assert not result.schema_copied, "the second attempt went on with the first one's subscription"
    assert leftovers(databases) == {
        "slots": [online.name],
        "publications": [online.name],
        "subscriptions": [online.name],
    }
    assert contents(databases.target) == contents(databases.source)
    online.undo_replicate()
    assert leftovers(databases) == NOTHING


async def test_a_worker_killed_during_catch_up_is_replaced_and_the_replication_still_ends_with_nothing_left(
    stack: StackInfo, databases: Databases, binaries: Binaries, online: OnlineSteps, kube_api: k8s.ApiClient,
    data_settings: DataActivitySettings, temporal_client: Client, task_queue: str,
) -> None:  # fmt: skip
    create_shop(databases.source, customers=200, orders=5_000)
    online.replicate()
    with connect(databases.source) as conn:
        conn.execute("update shop.orders set total = total + 1")
    online.freeze()
    input = CatchUpInput(ref=online.ref, driver=online.driver)

    async with _worker(temporal_client, task_queue):

        async def start() -> WorkflowHandle[Any, Any]:
            return await temporal_client.start_workflow(
                CatchUpStep.run, input, id=f"catch-up-{uuid.uuid4()}", task_queue=task_queue
            )

        handle = await _killed_in_the_middle(stack, binaries, temporal_client, task_queue, "catch_up", start)
        async with _worker(temporal_client, task_queue, _replication(kube_api, data_settings)):
            result = await asyncio.wait_for(handle.result(), 180)

    assert await _started_attempts(handle) == [(2, "in-test-worker")], "its second attempt ran on the other worker"
    assert result.applied_lsn is not None, "the second attempt found the subscription and waited with it"
    assert leftovers(databases) == NOTHING
    assert contents(databases.target) == contents(databases.source)
    online.verify()
    online.undo_freeze()
