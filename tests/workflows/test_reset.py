"""A run reset to an earlier point (`temporal workflow reset`) shows what it does again as Events of its own.

An Event is named after its key (activities/events.py), and one whose name is taken is not
recorded again: that is what makes a retried status write record its Events once. A reset
run replays its history to the reset point and goes on from there, counting its transitions
as the run before it did: keyed by that count alone, its steps' Events had the names of the
earlier run's and were never recorded. The test server has no reset, so this runs on the
stack's Temporal (the dev server).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.service import RPCError

from ferry.api.saga import workflow_id
from tests.workflows.conftest import migration_input, saga_workers
from tests.workflows.fakes import FREEZE, FakeSaga
from workflows.migration import MigrationWorkflow

pytestmark = pytest.mark.timeout(120)


async def _until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_run_reset_to_an_earlier_point_records_each_event_of_its_own_under_a_name_of_its_own(
    temporal_client: Client, task_queue: str
) -> None:
    fakes = FakeSaga(hold={FREEZE})
    workers = saga_workers(temporal_client, task_queue, fakes, [MigrationWorkflow])
    running = [asyncio.create_task(worker.run()) for worker in workers]
    input = migration_input()
    handle = await temporal_client.start_workflow(
        MigrationWorkflow.run, input, id=workflow_id(input.ref), task_queue=task_queue
    )
    try:
        await _until("the first run to reach the freeze", lambda: fakes.calls.count(FREEZE) == 1)
        first_run = list(fakes.events)
        history = [event async for event in handle.fetch_history_events()]
        first_task = next(e.event_id for e in history if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)

        await temporal_client.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=temporal_client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=handle.id, run_id=handle.result_run_id or ""),
                reason="an operator goes back to the start",
                workflow_task_finish_event_id=first_task,
                request_id=str(uuid.uuid4()),
            )
        )
        await _until("the reset run to reach the freeze", lambda: fakes.calls.count(FREEZE) == 2)
        reset_run = fakes.events[len(first_run) :]

        assert {"StepStarted", "StepSucceeded"} <= {event.reason for event in reset_run}, "it ran its steps again"
        taken = {event.key for event in first_run} & {event.key for event in reset_run}
        assert not taken, f"Events of the reset run named as the earlier run's, so never recorded: {sorted(taken)}"
        assert len({event.key for event in reset_run}) == len(reset_run), "within a run, one name per Event"
    finally:
        fakes.release()
        with contextlib.suppress(RPCError):
            await temporal_client.get_workflow_handle(handle.id).terminate("the test is over")
        for worker in workers:
            await worker.shutdown()
        await asyncio.gather(*running, return_exceptions=True)
