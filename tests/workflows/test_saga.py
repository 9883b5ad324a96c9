"""The migration saga, specified step by step against fake activities on a time-skipping server."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError, CancelledError

from ferry.api.errors import InvalidSpec
from ferry.api.migration import Phase, StepState
from ferry.api.saga import ControlRequest, MigrationResult, Signal
from tests.workflows.conftest import migration_input, record_history
from tests.workflows.fakes import (
    FREEZE,
    PROVISION,
    SCALE_DOWN_OLD,
    SNAPSHOT,
    STEP_ACTIVITIES,
    SWITCH_TRAFFIC,
    UNDO,
    VERIFY,
    FakeSaga,
)

Run = Any
pytestmark = pytest.mark.timeout(90)


def undos_of(completed: list[str]) -> list[str]:
    """The undo calls expected after `completed` steps: those that have one, newest first."""
    return [UNDO[step] for step in reversed(completed) if step in UNDO]


async def test_happy_path_runs_every_step_in_order_and_succeeds(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga())

    result = await saga.handle.result()

    assert isinstance(result, MigrationResult)
    assert result.phase is Phase.SUCCEEDED
    assert saga.fakes.step_calls == STEP_ACTIVITIES
    final = saga.final_status
    assert final.phase is Phase.SUCCEEDED
    assert final.current_step is None
    assert [step.state for step in final.steps] == [StepState.SUCCEEDED] * 7
    assert all(step.attempts == 1 for step in final.steps)
    assert {c.type: c.status.value for c in final.conditions}["Succeeded"] == "True"
    assert final.snapshot is not None
    assert final.snapshot.location == "s3://ferry-snapshots/ns/orders/uid/snapshot.dump"
    reasons = [event.reason for event in saga.fakes.events]
    assert reasons.count("StepStarted") == 7
    assert reasons.count("StepSucceeded") == 7
    assert reasons[-1] == "Succeeded"
    await record_history(saga, "happy-path")


async def test_retention_delete_removes_the_snapshot_after_success(run_saga: Run) -> None:
    spec = migration_input().spec.model_dump(by_alias=True)
    spec["snapshot"]["retention"]["afterSuccess"] = "Delete"
    saga = await run_saga(FakeSaga(), migration_input(snapshot=spec["snapshot"]))

    await saga.handle.result()

    assert saga.fakes.step_calls[-1] == "delete_snapshot"
    assert saga.final_status.snapshot is not None
    assert saga.final_status.snapshot.deleted


@pytest.mark.parametrize("failing", STEP_ACTIVITIES)
async def test_a_failure_at_a_step_undoes_exactly_the_completed_steps_in_reverse(run_saga: Run, failing: str) -> None:
    completed = STEP_ACTIVITIES[: STEP_ACTIVITIES.index(failing)]
    saga = await run_saga(FakeSaga(fail={failing: InvalidSpec(f"{failing} cannot work")}))

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "MigrationRolledBack"
    assert saga.fakes.step_calls == [*completed, failing, *undos_of(completed)]
    final = saga.final_status
    assert final.phase is Phase.ROLLED_BACK
    states = {step.name.value: step.state for step in final.steps}
    failed_step = final.steps[STEP_ACTIVITIES.index(failing)]
    assert failed_step.state is StepState.FAILED
    assert failed_step.last_error == f"InvalidSpec: {failing} cannot work"
    for step in final.steps[: len(completed)]:
        expected = StepState.COMPENSATED if STEP_ACTIVITIES[final.steps.index(step)] in UNDO else StepState.SUCCEEDED
        assert states[step.name.value] is expected
    if failing == PROVISION:
        await record_history(saga, "provision-fails")


@pytest.mark.parametrize("running", STEP_ACTIVITIES)
async def test_cancelling_during_a_step_stops_it_and_undoes_the_completed_steps(run_saga: Run, running: str) -> None:
    completed = STEP_ACTIVITIES[: STEP_ACTIVITIES.index(running)]
    saga = await run_saga(FakeSaga(hold={running}))
    await saga.wait_for(f"{running} to start", lambda: saga.fakes.started(running))

    await saga.handle.cancel()

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    assert saga.fakes.cancelled == [running]
    assert saga.fakes.step_calls == [*completed, running, *undos_of(completed)]
    assert saga.final_status.phase is Phase.ROLLED_BACK
    if running == SNAPSHOT:
        await record_history(saga, "cancelled-during-snapshot")


async def test_a_rollback_signal_during_a_step_stops_it_and_undoes_the_completed_steps(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(hold={SNAPSHOT}))
    await saga.wait_for("snapshot to start", lambda: saga.fakes.started(SNAPSHOT))

    await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="alice", reason="wrong target"))

    result = await saga.handle.result()
    assert result.phase is Phase.ROLLED_BACK
    assert result.message == "rolled back: rollback requested by alice: wrong target"
    assert saga.fakes.cancelled == [SNAPSHOT]
    assert saga.fakes.undo_calls == undos_of([PROVISION, FREEZE])


async def test_required_approval_holds_switch_traffic_until_approved(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(), migration_input(approval={"required": True}))
    await saga.wait_for("the approval gate", phase=Phase.AWAITING_APPROVAL.value)
    assert SWITCH_TRAFFIC not in saga.fakes.calls
    assert VERIFY in saga.fakes.calls

    await saga.handle.signal(Signal.APPROVE.value, ControlRequest(by="alice"))

    result = await saga.handle.result()
    assert result.phase is Phase.SUCCEEDED
    assert saga.final_status.approved_by == "alice"
    assert "Approved" in [event.reason for event in saga.fakes.events]
    await record_history(saga, "approved")


async def test_an_approval_given_early_does_not_hold_the_saga(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(hold={PROVISION}), migration_input(approval={"required": True}))
    await saga.handle.signal(Signal.APPROVE.value, ControlRequest(by="bob"))
    saga.fakes.release()

    result = await saga.handle.result()

    assert result.phase is Phase.SUCCEEDED
    assert Phase.AWAITING_APPROVAL not in [status.phase for status in saga.fakes.statuses]


async def test_approval_deadline_passing_rolls_back_under_the_rollback_policy(run_saga: Run) -> None:
    approval = {"required": True, "deadlineSeconds": 3600, "onDeadline": "RollBack"}
    saga = await run_saga(FakeSaga(), migration_input(approval=approval))

    result = await saga.handle.result()

    assert result.phase is Phase.ROLLED_BACK
    assert result.message == "rolled back: no approval within 3600s (onDeadline: RollBack)"
    assert SWITCH_TRAFFIC not in saga.fakes.calls
    assert saga.fakes.undo_calls == undos_of([PROVISION, FREEZE, SNAPSHOT])


async def test_approval_deadline_passing_proceeds_under_the_proceed_policy(run_saga: Run) -> None:
    approval = {"required": True, "deadlineSeconds": 600, "onDeadline": "Proceed"}
    saga = await run_saga(FakeSaga(), migration_input(approval=approval))

    result = await saga.handle.result()

    assert result.phase is Phase.SUCCEEDED
    assert saga.final_status.approved_by == "nobody: the 600s deadline passed (onDeadline: Proceed)"


async def test_pause_holds_the_saga_before_its_next_step_until_resume(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(hold={PROVISION}))
    await saga.wait_for("provision to start", lambda: saga.fakes.started(PROVISION))

    await saga.handle.signal(Signal.PAUSE.value, ControlRequest(by="carol"))
    saga.fakes.release()
    await saga.wait_for("the pause", phase=Phase.PAUSED.value)
    assert FREEZE not in saga.fakes.calls
    assert (await saga.progress()).message == "paused before freeze; send resume to go on"

    await saga.handle.signal(Signal.RESUME.value, ControlRequest(by="carol"))

    result = await saga.handle.result()
    assert result.phase is Phase.SUCCEEDED
    assert saga.fakes.step_calls == STEP_ACTIVITIES
    await record_history(saga, "paused-and-resumed")


async def test_a_migration_created_paused_waits_before_provision(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(), migration_input(paused=True))

    await saga.wait_for("the pause", phase=Phase.PAUSED.value)
    assert saga.fakes.step_calls == []
    await saga.handle.signal(Signal.RESUME.value)

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED


async def test_under_the_pause_policy_a_failed_step_waits_and_retry_runs_it_again(run_saga: Run) -> None:
    fakes = FakeSaga(fail={SNAPSHOT: InvalidSpec("bucket policy denies writes")}, fail_times={SNAPSHOT: 1})
    saga = await run_saga(fakes, migration_input(failurePolicy="Pause"))
    await saga.wait_for("the failure pause", phase=Phase.PAUSED.value)
    paused = await saga.progress()
    assert paused.steps[2].state is StepState.FAILED
    assert paused.message is not None
    assert paused.message.startswith("snapshot failed: InvalidSpec: bucket policy denies writes; send retry")
    assert saga.fakes.undo_calls == []

    await saga.handle.signal(Signal.RETRY.value, ControlRequest(by="dave"))

    result = await saga.handle.result()
    assert result.phase is Phase.SUCCEEDED
    assert saga.fakes.step_calls.count(SNAPSHOT) == 2
    assert saga.final_status.steps[2].attempts == 2
    assert saga.final_status.steps[2].state is StepState.SUCCEEDED
    await record_history(saga, "pause-policy-retry")


async def test_under_the_pause_policy_rollback_undoes_the_completed_steps(run_saga: Run) -> None:
    fakes = FakeSaga(fail={VERIFY: InvalidSpec("row counts differ")})
    saga = await run_saga(fakes, migration_input(failurePolicy="Pause"))
    await saga.wait_for("the failure pause", phase=Phase.PAUSED.value)

    await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="erin"))

    result = await saga.handle.result()
    assert result.phase is Phase.ROLLED_BACK
    assert saga.fakes.undo_calls == undos_of(STEP_ACTIVITIES[:4])


async def test_a_compensation_that_keeps_failing_ends_failed_naming_the_step(run_saga: Run) -> None:
    undo_switch = UNDO[SWITCH_TRAFFIC]
    fakes = FakeSaga(fail={SCALE_DOWN_OLD: InvalidSpec("no scale subresource"), undo_switch: RuntimeError("API down")})
    saga = await run_saga(fakes)

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "RollbackIncomplete"
    final = saga.final_status
    assert final.phase is Phase.FAILED
    assert final.message is not None
    assert "undo of switch-traffic" in final.message
    assert final.steps[5].state is StepState.COMPENSATION_FAILED
    # The other undos still ran, in reverse order, after the one that kept failing.
    assert saga.fakes.undo_calls[-3:] == undos_of([PROVISION, FREEZE, SNAPSHOT])
    assert saga.fakes.calls.count(undo_switch) == 12
    assert {c.type: c.status.value for c in final.conditions}["Succeeded"] == "False"


async def test_a_retryable_step_failure_is_retried_before_it_counts(run_saga: Run) -> None:
    fakes = FakeSaga(fail={FREEZE: RuntimeError("connection reset")}, fail_times={FREEZE: 2})
    saga = await run_saga(fakes)

    result = await saga.handle.result()

    assert result.phase is Phase.SUCCEEDED
    assert saga.fakes.step_calls.count(FREEZE) == 3
    assert saga.fakes.undo_calls == []


async def test_progress_query_reports_the_running_step(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(hold={SNAPSHOT}))
    await saga.wait_for("snapshot to start", lambda: saga.fakes.started(SNAPSHOT))

    progress = await saga.progress()

    assert progress.phase is Phase.RUNNING
    assert progress.current_step is not None
    assert progress.current_step.value == "snapshot"
    assert [step.state for step in progress.steps[:3]] == [StepState.SUCCEEDED, StepState.SUCCEEDED, StepState.RUNNING]
    saga.fakes.release()
    await saga.handle.result()
