"""Runs started by the previous version of the saga finish on this worker, and bad input never loops."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowFailureError, WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import (
    Interceptor,
    Replayer,
    StartActivityInput,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from ferry.api.migration import Phase
from ferry.api.saga import WORKFLOW_NAME, WORKFLOW_NAME_V1, ControlRequest, Signal
from ferry.clients import data_converter
from tests.workflows.conftest import HISTORIES, migration_input
from tests.workflows.fakes import FREEZE, PROVISION, FakeSaga
from worker.gate import VOUCHED_ATTRIBUTE
from workflows.legacy import MigrationWorkflowV1
from workflows.migration import MigrationWorkflow
from workflows.undo import MigrationUndoWorkflow

Run = Any
pytestmark = pytest.mark.timeout(90)

RECORDED = sorted(HISTORIES.glob("*.json"))


def test_there_are_recorded_histories_of_both_versions_to_replay() -> None:
    names = [path.stem for path in RECORDED]
    assert len([name for name in names if name.startswith("v1-")]) >= 6
    assert len([name for name in names if name.startswith("v2-")]) >= 6
    assert len([name for name in names if name.startswith("v2.1-")]) >= 6


@pytest.mark.parametrize("as_a_reset_run", [False, True], ids=["as-recorded", "as-a-reset-run"])
@pytest.mark.parametrize("history", RECORDED, ids=[path.stem for path in RECORDED])
async def test_recorded_history_replays_without_nondeterminism(history: Path, as_a_reset_run: bool) -> None:
    """And as the history a reset copies into its new run, whose run ID is not the first one's: nothing the workflow
    decides may depend on which run it is, or a reset run fails on the decisions its copied history holds."""
    replayer = Replayer(
        workflows=[MigrationWorkflowV1, MigrationWorkflow, MigrationUndoWorkflow],
        data_converter=data_converter(),
    )
    events = json.loads(history.read_text())  # noqa: ASYNC240
    if as_a_reset_run:
        started = events["events"][0]["workflowExecutionStartedEventAttributes"]
        started["originalExecutionRunId"] = str(uuid.uuid4())
    recorded = WorkflowHistory.from_json(f"migration/{history.stem}", json.dumps(events))

    result = await replayer.replay_workflow(recorded, raise_on_replay_failure=True)

    assert result.replay_failure is None


VOUCHED: list[bool] = []
"""What the worker's gate would be told of each activity a replayed run starts: whether the run passed it once."""


class _Vouching(Interceptor):
    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _VouchingWorkflow


class _VouchingWorkflow(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_VouchingOutbound(outbound))


class _VouchingOutbound(WorkflowOutboundInterceptor):
    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        VOUCHED.append(bool(getattr(workflow.instance(), VOUCHED_ATTRIBUTE, False)))
        return self.next.start_activity(input)


@pytest.mark.parametrize("named", [True, False], ids=["writes-name-their-run", "writes-of-an-older-worker"])
async def test_a_reset_run_is_not_vouched_for_by_the_status_writes_of_the_run_it_was_made_from(
    run_saga: Run, named: bool
) -> None:
    """The worker's gate lets the undos of a run that once found its Migration through even when it is gone. A run
    made by a reset replays its earlier run's status writes, which found the Migration for that run: a closed run
    reset after its Migration was deleted must not be let through by them (nor by an older worker's writes, which
    do not say their run: they were the first run's)."""
    saga = await run_saga(FakeSaga(mirrors_name_their_run=named))
    await saga.handle.result()
    history = await saga.handle.fetch_history()
    replayer = Replayer(
        workflows=[MigrationWorkflowV1, MigrationWorkflow, MigrationUndoWorkflow],
        data_converter=data_converter(),
        interceptors=[_Vouching()],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    events = json.loads(history.to_json())
    as_recorded: list[bool] = []
    for reset in (False, True):
        if reset:
            events["events"][0]["workflowExecutionStartedEventAttributes"]["originalExecutionRunId"] = str(uuid.uuid4())
        VOUCHED.clear()
        replayed = WorkflowHistory.from_json(history.workflow_id, json.dumps(events))
        result = await replayer.replay_workflow(replayed, raise_on_replay_failure=True)
        assert result.replay_failure is None
        if not reset:
            as_recorded = list(VOUCHED)

    assert any(as_recorded), "the run itself was vouched for once its first status write found the Migration"
    assert len(VOUCHED) == len(as_recorded)
    assert not any(VOUCHED), "a reset run is vouched for by none of the writes it replays"


async def test_a_run_of_the_previous_version_finishes_on_a_worker_of_this_one(run_saga: Run) -> None:
    fakes = FakeSaga(hold={PROVISION})
    saga = await run_saga(fakes, migration_input(), workflow_class=MigrationWorkflowV1)
    await saga.wait_for("provision to start", lambda: fakes.started(PROVISION))
    description = await saga.handle.describe()
    assert description.workflow_type == WORKFLOW_NAME_V1

    await saga.handle.signal(Signal.PAUSE.value, ControlRequest(by="carol"))
    fakes.release()
    await saga.wait_for("the pause", phase=Phase.PAUSED.value)
    await saga.handle.signal(Signal.RESUME.value, ControlRequest(by="carol"))

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    assert FREEZE in fakes.calls


FORGED = {
    "missing-source": ({"source": None}, "source"),
    "unreadable-timeout": ({"timeouts": {"migrate": "forever"}}, "migrate"),
    "huge-timeout": ({"timeouts": {"migrate": 99999999999999}}, "migrate"),
    "huge-deadline": ({"approval": {"required": True, "deadlineSeconds": 99999999999999}}, "deadlineSeconds"),
}


@pytest.mark.parametrize("case", FORGED, ids=list(FORGED))
async def test_an_input_that_cannot_be_read_fails_the_run_at_once_naming_the_field(
    time_skipping: WorkflowEnvironment, task_queue: str, case: str
) -> None:
    """A run started by hand with input the API server would refuse: one failure, never a workflow task loop."""
    changes, field = FORGED[case]
    forged = migration_input().model_dump(mode="json", by_alias=True)
    for key, value in changes.items():
        if value is None:
            forged["spec"].pop(key)
        else:
            forged["spec"][key] = value
    async with Worker(time_skipping.client, task_queue=task_queue, workflows=[MigrationWorkflow]):
        handle = await time_skipping.client.start_workflow(
            WORKFLOW_NAME, forged, id=f"forged-{uuid.uuid4()}", task_queue=task_queue
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()

    assert field in str(failure.value.cause)
