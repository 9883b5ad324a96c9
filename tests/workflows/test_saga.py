"""The migration saga, specified step by step against fake activities on a time-skipping server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import WorkflowEnvironment

from activities.postgres.connection import DatabaseReplaced
from ferry.api.errors import (
    BadCredentials,
    DatabaseUnreachable,
    InvalidSpec,
    PrecheckFailed,
    WritesAfterFreeze,
    WritesOnTarget,
)
from ferry.api.integrity import NOT_BACKED
from ferry.api.migration import STEP_ORDER, Phase, StepName, StepState
from ferry.api.saga import CheckUnwrittenResult, ControlRequest, MigrationResult, Signal
from tests.workflows.conftest import migration_input, record_history
from tests.workflows.fakes import (
    CHECK_CLUSTER,
    CHECK_FROZEN,
    CHECK_UNWRITTEN,
    DELETE_SNAPSHOT,
    FREEZE,
    GUARD,
    MIGRATE,
    PRECHECK,
    PROVISION,
    SCALE_DOWN_OLD,
    SNAPSHOT,
    STEP_ACTIVITIES,
    SWITCH_TRAFFIC,
    UNDO,
    UNDO_GUARD,
    VERIFY,
    FakeSaga,
)
from workflows import plan
from workflows.steps import PERSISTING_ATTEMPTS, UNDO_RETRY

Run = Any
pytestmark = pytest.mark.timeout(90)
README = Path(__file__).parents[2] / "README.md"


def calls_until(step: str) -> list[str]:
    """The forward path's calls up to and including `step` (and the guard before it)."""
    calls: list[str] = []
    for name in STEP_ACTIVITIES:
        if name in GUARD:
            calls.append(GUARD[name])
        calls.append(name)
        if name == step:
            return calls
    raise ValueError(step)


FORWARD = calls_until(SCALE_DOWN_OLD)


def started_until(step: str) -> list[str]:
    return STEP_ACTIVITIES[: STEP_ACTIVITIES.index(step) + 1]


def undos_of(started: list[str]) -> list[str]:
    """The undo calls expected after `started` steps: those that have one, newest first."""
    return [UNDO[step] for step in reversed(started) if step in UNDO]


def way_back(started: list[str]) -> list[str]:
    """The rollback's calls after `started` steps: each undo, after its guard if it has one, newest first."""
    calls: list[str] = []
    for undo in undos_of(started):
        if undo in UNDO_GUARD:
            calls.append(UNDO_GUARD[undo])
        calls.append(undo)
    return calls


def states(status: Any) -> dict[str, StepState]:
    return {step.name.value: step.state for step in status.steps}


async def test_happy_path_runs_every_step_in_order_and_succeeds(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga())

    result = await saga.handle.result()

    assert isinstance(result, MigrationResult)
    assert result.phase is Phase.SUCCEEDED
    assert saga.fakes.step_calls == FORWARD
    final = saga.final_status
    assert final.phase is Phase.SUCCEEDED
    assert final.current_step is None
    assert [step.name for step in final.steps] == list(STEP_ORDER)
    assert [step.state for step in final.steps] == [StepState.SUCCEEDED] * len(STEP_ORDER)
    assert all(step.attempts == 1 for step in final.steps)
    assert {c.type: c.status.value for c in final.conditions}["Succeeded"] == "True"
    assert final.snapshot is not None
    assert final.snapshot.location == "s3://ferry-snapshots/ns/orders/uid/snapshot.dump"
    assert (final.snapshot.bucket, final.snapshot.key) == ("ferry-snapshots", "ns/orders/uid/snapshot.dump")
    reasons = [event.reason for event in saga.fakes.events]
    assert reasons.count("StepStarted") == len(STEP_ORDER)
    assert reasons.count("StepSucceeded") == len(STEP_ORDER)
    assert reasons[-1] == "Succeeded"
    await record_history(saga, "happy-path")


async def test_retention_delete_removes_the_snapshot_after_success(run_saga: Run) -> None:
    spec = migration_input().spec.model_dump(by_alias=True)
    spec["snapshot"]["retention"]["afterSuccess"] = "Delete"
    saga = await run_saga(FakeSaga(), migration_input(snapshot=spec["snapshot"]))

    await saga.handle.result()

    assert saga.fakes.step_calls[-1] == DELETE_SNAPSHOT
    assert saga.final_status.snapshot is not None
    assert saga.final_status.snapshot.deleted


@pytest.mark.parametrize("failing", STEP_ACTIVITIES)
async def test_a_failure_at_a_step_undoes_every_started_step_in_reverse_including_the_failed_one(
    run_saga: Run, failing: str
) -> None:
    saga = await run_saga(FakeSaga(fail={failing: InvalidSpec(f"{failing} cannot work")}))

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "MigrationRolledBack"
    started = started_until(failing)
    assert saga.fakes.step_calls == [*calls_until(failing), *way_back(started)]
    final = saga.final_status
    assert final.phase is Phase.ROLLED_BACK
    by_activity = dict(zip(STEP_ACTIVITIES, final.steps, strict=True))
    assert by_activity[failing].last_error == f"InvalidSpec: {failing} cannot work"
    for name in started:
        if name in UNDO:
            expected = StepState.COMPENSATED
        else:
            expected = StepState.FAILED if name == failing else StepState.SUCCEEDED
        assert by_activity[name].state is expected, name
    if failing == PROVISION:
        await record_history(saga, "provision-fails")


@pytest.mark.parametrize("running", STEP_ACTIVITIES)
async def test_cancelling_during_a_step_stops_it_and_undoes_every_started_step(run_saga: Run, running: str) -> None:
    saga = await run_saga(FakeSaga(hold={running}))
    await saga.wait_for(f"{running} to start", lambda: saga.fakes.started(running))

    await saga.handle.cancel()

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    assert saga.fakes.cancelled == [running]
    assert saga.fakes.step_calls == [*calls_until(running), *way_back(started_until(running))]
    final = saga.final_status
    assert final.phase is Phase.ROLLED_BACK
    assert not [step.name for step in final.steps if step.state in (StepState.RUNNING, StepState.RETRYING)]
    if running == SNAPSHOT:
        await record_history(saga, "cancelled-during-snapshot")


@pytest.mark.parametrize("finishing", [name for name in STEP_ACTIVITIES if name in UNDO])
async def test_a_step_that_completes_after_the_cancel_is_registered_as_done_and_undone_with_its_result(
    run_saga: Run, finishing: str
) -> None:
    fakes = FakeSaga(hold={finishing}, finish_when_cancelled={finishing})
    saga = await run_saga(fakes)
    await saga.wait_for(f"{finishing} to start", lambda: fakes.started(finishing))

    await saga.handle.cancel()

    with pytest.raises(WorkflowFailureError):
        await saga.handle.result()
    assert fakes.step_calls == [*calls_until(finishing), *way_back(started_until(finishing))]
    undo_input = fakes.inputs[UNDO[finishing]][0]
    if finishing == SWITCH_TRAFFIC:
        assert undo_input["previousSelector"] == {"app": "orders-db"}
    if finishing == SCALE_DOWN_OLD:
        assert undo_input["replicas"] == 2
    step = saga.final_status.steps[STEP_ACTIVITIES.index(finishing)]
    assert step.state is StepState.COMPENSATED


async def test_a_step_that_completes_after_a_rollback_request_is_undone(run_saga: Run) -> None:
    fakes = FakeSaga(hold={SCALE_DOWN_OLD}, finish_when_cancelled={SCALE_DOWN_OLD})
    saga = await run_saga(fakes)
    await saga.wait_for("scale-down-old to start", lambda: fakes.started(SCALE_DOWN_OLD))

    await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="alice", reason="wrong target"))

    result = await saga.handle.result()
    assert result.phase is Phase.ROLLED_BACK
    assert result.message == "rolled back: rollback requested by alice: wrong target"
    assert fakes.undo_calls == undos_of(STEP_ACTIVITIES)
    assert fakes.inputs[UNDO[SCALE_DOWN_OLD]][0]["replicas"] == 2


@pytest.mark.parametrize("single_batch", [False, True], ids=["jobs-apart", "jobs-in-one-batch"])
async def test_a_rollback_that_comes_with_the_last_steps_result_is_carried_out(
    run_saga: Run, single_batch: bool
) -> None:
    """Under load the rollback and scale-down-old's result reach the run in one activation (a status write held the
    workflow task open meanwhile). The request was accepted, so the run rolls back, however the SDK orders the two."""
    fakes = FakeSaga(hold={SCALE_DOWN_OLD})
    saga = await run_saga(fakes, single_batch=single_batch)
    await saga.wait_for("scale-down-old to start", lambda: fakes.started(SCALE_DOWN_OLD))
    fakes.mirrors_held = True
    await saga.handle.signal(Signal.APPROVE.value, ControlRequest(by="bob"))  # ignored, with an Event: a status write
    await saga.wait_for("a status write to hold the workflow task open", lambda: fakes.mirrors_waiting > 0)

    await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="alice", reason="wrong target"))
    fakes.release()
    await saga.wait_for_history("the rollback and scale-down-old's result", _signalled_and_completed(SCALE_DOWN_OLD))
    fakes.release_mirrors()

    result = await saga.handle.result()
    assert result.phase is Phase.ROLLED_BACK
    assert fakes.undo_calls == undos_of(STEP_ACTIVITIES)


async def test_a_rollback_asked_for_once_every_step_is_done_is_refused_and_the_run_succeeds(run_saga: Run) -> None:
    """While the snapshot is deleted for retention (the last thing before Succeeded) the run has finished: it says so
    to a rollback, rather than accept it and then end Succeeded all the same."""
    spec = migration_input().spec.model_dump(by_alias=True)
    spec["snapshot"]["retention"]["afterSuccess"] = "Delete"
    fakes = FakeSaga(hold={DELETE_SNAPSHOT})
    saga = await run_saga(fakes, migration_input(snapshot=spec["snapshot"]))
    await saga.wait_for("the snapshot's deletion to start", lambda: fakes.started(DELETE_SNAPSHOT))

    await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="alice", reason="too late"))
    await saga.wait_for("the rollback to be answered", lambda: any("rollback" in e.message for e in fakes.events))
    fakes.release()

    result = await saga.handle.result()
    assert result.phase is Phase.SUCCEEDED
    assert fakes.undo_calls == []
    answers = [(e.reason, e.message) for e in fakes.events if "rollback" in e.message]
    assert answers == [
        ("ControlIgnored", "rollback (signal from alice) ignored: rollback refused: the migration has finished")
    ]


@pytest.mark.parametrize("held", ["the snapshot's deletion", "the status write that says Succeeded"])
async def test_a_cancel_that_comes_once_every_step_is_done_is_ignored_and_the_run_succeeds(
    run_saga: Run, held: str
) -> None:
    """Once the last step is done the migration has finished: the retention's deletion and the status write that
    says Succeeded are all that is left. A cancel then (a person who saw Succeeded and took the run for lingering, or
    a watcher acting on what it saw) must not undo a finished migration: traffic back to the source, the target
    emptied, after `kubectl wait` returned."""
    spec = migration_input().spec.model_dump(by_alias=True)
    spec["snapshot"]["retention"]["afterSuccess"] = "Delete"
    fakes = FakeSaga(hold={DELETE_SNAPSHOT})
    saga = await run_saga(fakes, migration_input(snapshot=spec["snapshot"]))
    await saga.wait_for("the snapshot's deletion to start", lambda: fakes.started(DELETE_SNAPSHOT))
    if held == "the status write that says Succeeded":
        fakes.mirrors_held = True
        fakes.release()
        await saga.wait_for("the status write to start", lambda: fakes.mirrors_waiting > 0)

    await saga.handle.cancel()
    fakes.release()
    fakes.release_mirrors()

    result = await saga.handle.result()
    assert result.phase is Phase.SUCCEEDED
    assert fakes.undo_calls == []
    assert Phase.ROLLING_BACK not in {status.phase for status in fakes.statuses}
    assert fakes.statuses[-1].phase is Phase.SUCCEEDED
    assert [e.reason for e in fakes.events if e.reason in ("CancelIgnored", "RollingBack")] == ["CancelIgnored"]
    ignored = next(e.message for e in fakes.events if e.reason == "CancelIgnored")
    assert "nothing was undone" in ignored
    assert "Deleting the Migration does not undo a finished migration" in ignored, "only the retention cleanup runs"
    section = ignored.rsplit('"', 2)[-2]
    assert f"\n### {section}\n" in README.read_text(), "the README section it points at, to go back"
    if held == "the snapshot's deletion":
        await record_history(saga, "cancel-ignored-after-success")


def _a_workflow_task_after_the_cancel(events: list[HistoryEvent]) -> bool:
    kinds = [e.event_type for e in events]
    if EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED not in kinds:
        return False
    after = kinds[kinds.index(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED) :]
    return EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED in after


def _signalled_and_completed(activity_type: str) -> Callable[[list[HistoryEvent]], bool]:
    def seen(events: list[HistoryEvent]) -> bool:
        scheduled = {
            e.event_id
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name == activity_type
        }
        completed = any(
            e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
            and e.activity_task_completed_event_attributes.scheduled_event_id in scheduled
            for e in events
        )
        signalled = any(
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            and e.workflow_execution_signaled_event_attributes.signal_name == Signal.ROLLBACK.value
            for e in events
        )
        return completed and signalled

    return seen


async def test_a_rollback_during_a_step_stops_it_and_undoes_it_without_a_result(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(hold={SNAPSHOT}))
    await saga.wait_for("snapshot to start", lambda: saga.fakes.started(SNAPSHOT))

    await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="alice", reason="wrong target"))

    result = await saga.handle.result()
    assert result.phase is Phase.ROLLED_BACK
    assert saga.fakes.cancelled == [SNAPSHOT]
    assert saga.fakes.undo_calls == undos_of([PROVISION, FREEZE, SNAPSHOT])
    undo_snapshot = saga.fakes.inputs[UNDO[SNAPSHOT]][0]
    assert undo_snapshot.get("artifact") is None
    assert undo_snapshot["key"].endswith("/snapshot.dump")
    step = saga.final_status.steps[STEP_ACTIVITIES.index(SNAPSHOT)]
    assert step.state is StepState.COMPENSATED


async def test_a_rollback_that_deletes_the_snapshot_says_so_in_the_status(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(fail={VERIFY: InvalidSpec("different")}))

    with pytest.raises(WorkflowFailureError):
        await saga.handle.result()

    assert saga.final_status.snapshot is not None
    assert saga.final_status.snapshot.deleted


async def test_writes_after_the_freeze_stop_the_saga_before_traffic_moves(run_saga: Run) -> None:
    fakes = FakeSaga(fail={CHECK_FROZEN: WritesAfterFreeze("12 rows were written to the source after the freeze")})
    saga = await run_saga(fakes)

    with pytest.raises(WorkflowFailureError):
        await saga.handle.result()

    assert SWITCH_TRAFFIC not in fakes.calls
    final = saga.final_status
    assert final.phase is Phase.ROLLED_BACK
    switch = final.steps[STEP_ACTIVITIES.index(SWITCH_TRAFFIC)]
    assert switch.last_error is not None
    assert switch.last_error.startswith("WritesAfterFreeze: 12 rows")
    assert fakes.undo_calls == undos_of(started_until(SWITCH_TRAFFIC))


async def test_a_switch_whose_check_never_passed_moved_no_traffic_so_a_silent_target_does_not_keep_the_source_frozen(
    run_saga: Run,
) -> None:
    """The target stops answering after verify: the check before switch-traffic cannot seal verify's mark at any
    attempt, so switch-traffic never runs. The check before its undo asks the stable Service instead of the silent
    target, and, no traffic having moved, migrate's undo failing on that target is gone past: the source is unfrozen.
    The way back stopped there, the source frozen."""
    silent = ApplicationError("orders-db-16 did not answer to have verify's mark sealed", type="TargetUnsealed")
    fakes = FakeSaga(
        fail={CHECK_FROZEN: silent, UNDO[MIGRATE]: DatabaseUnreachable("orders-db-16 did not answer")},
        extra_results={CHECK_UNWRITTEN: CheckUnwrittenResult(compared=False, no_traffic_moved=True)},
    )
    saga = await run_saga(fakes)

    with pytest.raises(WorkflowFailureError):
        await saga.handle.result()

    assert SWITCH_TRAFFIC not in fakes.calls
    assert fakes.step_calls.count(CHECK_FROZEN) == plan.SWITCH_TRAFFIC.retry.attempts, "tried at every attempt"
    [asked] = [given for given in fakes.inputs[CHECK_UNWRITTEN] if not given.get("sourceOnly")]
    assert (asked["service"], asked["targetStatefulSet"]) == ("orders-db", "orders-db-16"), "the Service is asked"
    assert UNDO[FREEZE] in fakes.undo_calls, "the source takes writes again"
    assert fakes.undo_calls[-1] == UNDO[PROVISION]
    final = saga.final_status
    assert final.phase is Phase.FAILED
    assert final.message is not None
    assert "not undone: migrate" in final.message
    await record_history(saga, "no-traffic-moved")


async def test_a_failed_precheck_ends_the_migration_before_anything_changes(run_saga: Run) -> None:
    problem = "the target database orders does not exist; the bucket snapshots refuses writes"
    saga = await run_saga(FakeSaga(fail={PRECHECK: PrecheckFailed(problem)}))

    with pytest.raises(WorkflowFailureError):
        await saga.handle.result()

    assert saga.fakes.step_calls == [CHECK_CLUSTER, PRECHECK]
    assert saga.final_status.message is not None
    assert problem in saga.final_status.message


async def test_a_target_that_already_serves_traffic_ends_the_migration_before_anything_changes(run_saga: Run) -> None:
    live = (
        "spec.target.statefulSet: orders-db-16 already serves traffic (Service orders-db selects it); "
        "ferry changed nothing"
    )
    saga = await run_saga(FakeSaga(fail={CHECK_CLUSTER: InvalidSpec(live)}))

    with pytest.raises(WorkflowFailureError):
        await saga.handle.result()

    assert saga.fakes.step_calls == [CHECK_CLUSTER]
    assert saga.final_status.phase is Phase.ROLLED_BACK
    assert saga.final_status.message is not None
    assert live in saga.final_status.message


async def test_a_retryable_failure_is_retried_and_every_attempt_shows_in_the_status(run_saga: Run) -> None:
    fakes = FakeSaga(fail={FREEZE: RuntimeError("connection reset")}, fail_times={FREEZE: 2})
    saga = await run_saga(fakes)

    result = await saga.handle.result()

    assert result.phase is Phase.SUCCEEDED
    assert fakes.step_calls.count(FREEZE) == 3
    assert fakes.undo_calls == []
    freeze = saga.final_status.steps[STEP_ACTIVITIES.index(FREEZE)]
    assert freeze.attempts == 3
    assert freeze.state is StepState.SUCCEEDED
    waiting = [s.steps[STEP_ACTIVITIES.index(FREEZE)] for s in fakes.statuses]
    assert any(
        step.state is StepState.RETRYING and step.last_error == "RuntimeError: connection reset" for step in waiting
    )
    retries = [event for event in fakes.events if event.reason == "StepRetrying"]
    assert [event.message.split(";")[0] for event in retries] == [
        "freeze: attempt 1 failed: RuntimeError: connection reset",
        "freeze: attempt 2 failed: RuntimeError: connection reset",
    ]


async def test_a_step_whose_errors_repeat_gives_up_and_rolls_back_without_promising_another_attempt(
    run_saga: Run,
) -> None:
    fakes = FakeSaga(fail={SNAPSHOT: RuntimeError("S3 did not answer within 30s")})
    saga = await run_saga(fakes)

    with pytest.raises(WorkflowFailureError):
        await saga.handle.result()

    assert fakes.step_calls.count(SNAPSHOT) == 5
    final = saga.final_status
    assert final.phase is Phase.ROLLED_BACK
    assert final.steps[STEP_ACTIVITIES.index(SNAPSHOT)].attempts == 5
    failed = [event for event in fakes.events if event.reason == "StepFailed"]
    assert (
        failed[-1].message
        == "snapshot failed (after 5 attempts): RuntimeError: S3 did not answer within 30s; rolling back"
    )
    assert not any("next attempt" in event.message or "retry" in event.message for event in failed)


async def test_required_approval_is_asked_before_freeze_so_the_source_takes_writes_while_a_person_decides(
    run_saga: Run,
) -> None:
    saga = await run_saga(FakeSaga(), migration_input(approval={"required": True}))
    await saga.wait_for("the approval gate", phase=Phase.AWAITING_APPROVAL.value)
    assert FREEZE not in saga.fakes.calls
    assert PROVISION in saga.fakes.calls
    assert (await saga.progress()).current_step == StepName.FREEZE

    await saga.handle.signal(Signal.APPROVE.value, ControlRequest(by="alice"))

    result = await saga.handle.result()
    assert result.phase is Phase.SUCCEEDED
    assert saga.final_status.approved_by == "alice"
    assert "Approved" in [event.reason for event in saga.fakes.events]
    await record_history(saga, "writes-flow-approved")


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
    assert FREEZE not in saga.fakes.calls
    assert saga.fakes.undo_calls == undos_of(started_until(PROVISION))


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
    paused = await saga.progress()
    assert paused.message == "paused before freeze; send resume to go on"
    assert paused.current_step == StepName.FREEZE

    await saga.handle.signal(Signal.RESUME.value, ControlRequest(by="carol"))

    result = await saga.handle.result()
    assert result.phase is Phase.SUCCEEDED
    assert saga.fakes.step_calls == FORWARD
    await record_history(saga, "paused-and-resumed")


async def test_a_pause_given_while_awaiting_approval_holds_the_saga_before_freeze_once_approved(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(), migration_input(approval={"required": True}))
    await saga.wait_for("the approval gate", phase=Phase.AWAITING_APPROVAL.value)

    await saga.handle.signal(Signal.PAUSE.value, ControlRequest(by="carol"))
    await saga.handle.signal(Signal.APPROVE.value, ControlRequest(by="alice"))

    await saga.wait_for("the pause", phase=Phase.PAUSED.value)
    assert FREEZE not in saga.fakes.calls
    assert (await saga.progress()).message == "paused before freeze; send resume to go on"
    await saga.handle.signal(Signal.RESUME.value, ControlRequest(by="carol"))
    result = await saga.handle.result()
    assert result.phase is Phase.SUCCEEDED
    assert saga.final_status.approved_by == "alice"
    await record_history(saga, "paused-while-awaiting-approval")


async def test_a_pause_given_while_soaking_holds_the_saga_before_scale_down_old(
    run_saga: Run, time_skipping: Any
) -> None:
    with time_skipping.auto_time_skipping_disabled():
        saga = await run_saga(FakeSaga(), migration_input(soakSeconds=600))
        await saga.wait_for(
            "the soak", lambda: any((s.message or "").startswith("soaking") for s in saga.fakes.statuses)
        )

        await saga.handle.signal(Signal.PAUSE.value, ControlRequest(by="carol"))
        await saga.wait_for_history(
            "the pause",
            lambda events: any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED for e in events),
        )
        await time_skipping.sleep(timedelta(seconds=600))

        await saga.wait_for("the pause", phase=Phase.PAUSED.value)
    assert SCALE_DOWN_OLD not in saga.fakes.calls
    assert (await saga.progress()).message == "paused before scale-down-old; send resume to go on"
    await saga.handle.signal(Signal.RESUME.value, ControlRequest(by="carol"))
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    assert saga.fakes.step_calls == FORWARD


async def test_a_migration_created_paused_waits_before_its_first_step(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(), migration_input(paused=True))

    await saga.wait_for("the pause", phase=Phase.PAUSED.value)
    assert saga.fakes.step_calls == []
    assert (await saga.progress()).current_step == StepName.PRECHECK
    await saga.handle.signal(Signal.RESUME.value)

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED


async def test_under_the_pause_policy_a_step_failing_before_freeze_waits_and_retry_runs_it_again(
    run_saga: Run,
) -> None:
    fakes = FakeSaga(fail={PROVISION: InvalidSpec("quota exceeded")}, fail_times={PROVISION: 1})
    saga = await run_saga(fakes, migration_input(failurePolicy="Pause"))
    await saga.wait_for("the failure pause", phase=Phase.PAUSED.value)
    paused = await saga.progress()
    provision = STEP_ACTIVITIES.index(PROVISION)
    assert paused.steps[provision].state is StepState.FAILED
    assert paused.current_step == StepName.PROVISION
    assert paused.message is not None
    assert paused.message.startswith("provision failed: InvalidSpec: quota exceeded; send retry")
    assert saga.fakes.undo_calls == []

    await saga.handle.signal(Signal.RETRY.value, ControlRequest(by="dave"))

    result = await saga.handle.result()
    assert result.phase is Phase.SUCCEEDED
    assert saga.fakes.step_calls.count(PROVISION) == 2
    assert saga.final_status.steps[provision].attempts == 2
    assert saga.final_status.steps[provision].state is StepState.SUCCEEDED


async def test_under_the_pause_policy_a_step_failing_while_writes_are_stopped_unfreezes_the_source_before_waiting(
    run_saga: Run,
) -> None:
    fakes = FakeSaga(fail={SNAPSHOT: InvalidSpec("bucket policy denies writes")}, fail_times={SNAPSHOT: 1})
    saga = await run_saga(fakes, migration_input(failurePolicy="Pause"))
    await saga.wait_for("the failure pause", phase=Phase.PAUSED.value)
    paused = await saga.progress()
    assert saga.fakes.undo_calls == undos_of([FREEZE, SNAPSHOT])
    assert paused.steps[STEP_ACTIVITIES.index(FREEZE)].state is StepState.COMPENSATED
    assert paused.current_step == StepName.SNAPSHOT
    assert paused.message is not None
    assert paused.message.startswith(
        "snapshot failed: InvalidSpec: bucket policy denies writes; the source takes writes again (undone back to "
        "before freeze), so retry runs again from freeze; send retry"
    )

    await saga.handle.signal(Signal.RETRY.value, ControlRequest(by="dave"))

    result = await saga.handle.result()
    assert result.phase is Phase.SUCCEEDED
    assert saga.fakes.step_calls.count(FREEZE) == 2
    assert saga.fakes.step_calls.count(SNAPSHOT) == 2
    assert saga.fakes.step_calls.count(PROVISION) == 1
    assert saga.final_status.steps[STEP_ACTIVITIES.index(SNAPSHOT)].state is StepState.SUCCEEDED
    await record_history(saga, "writes-flow-pause-policy-retry")


async def test_under_the_pause_policy_a_cancellation_while_writes_are_made_to_flow_again_rolls_back_the_rest(
    run_saga: Run,
) -> None:
    """The undos that let writes flow before the pause are part of the way back: the workflow's cancellation lets the
    running one finish, then undoes what is left (provision), and the run ends cancelled, not paused for ever."""
    undo_freeze = UNDO[FREEZE]
    fakes = FakeSaga(fail={SNAPSHOT: InvalidSpec("bucket policy denies writes")}, hold={undo_freeze})
    saga = await run_saga(fakes, migration_input(failurePolicy="Pause"))
    await saga.wait_for("the freeze's undo to run", lambda: fakes.started(undo_freeze))

    await saga.handle.cancel()
    await saga.wait_for_history("the run to take the cancellation in", _a_workflow_task_after_the_cancel)
    fakes.release()

    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(saga.handle.result(), timeout=30)
    assert isinstance(failure.value.cause, CancelledError)
    assert fakes.cancelled == [], "the undo was let finish"
    assert fakes.undo_calls == undos_of([PROVISION, FREEZE, SNAPSHOT])
    assert fakes.undo_calls.count(undo_freeze) == 1
    final = saga.final_status
    assert final.phase is Phase.ROLLED_BACK
    assert final.steps[STEP_ACTIVITIES.index(PROVISION)].state is StepState.COMPENSATED


async def test_a_pause_asked_for_while_writes_are_stopped_takes_effect_once_traffic_has_moved(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(hold={SNAPSHOT}), migration_input())
    await saga.wait_for("the snapshot to run", lambda: SNAPSHOT in saga.fakes.calls)

    await saga.handle.signal(Signal.PAUSE.value, ControlRequest(by="frank"))
    saga.fakes.release()
    await saga.wait_for("the pause", phase=Phase.PAUSED.value)

    paused = await saga.progress()
    assert paused.current_step == StepName.SCALE_DOWN_OLD
    assert SWITCH_TRAFFIC in saga.fakes.calls
    assert SCALE_DOWN_OLD not in saga.fakes.calls
    assert "PauseHeldOff" in [event.reason for event in saga.fakes.events]
    await saga.handle.signal(Signal.RESUME.value, ControlRequest(by="frank"))
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED


async def test_under_the_pause_policy_rollback_undoes_the_started_steps(run_saga: Run) -> None:
    fakes = FakeSaga(fail={VERIFY: InvalidSpec("row counts differ")})
    saga = await run_saga(fakes, migration_input(failurePolicy="Pause"))
    await saga.wait_for("the failure pause", phase=Phase.PAUSED.value)

    await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="erin"))

    result = await saga.handle.result()
    assert result.phase is Phase.ROLLED_BACK
    assert saga.fakes.undo_calls == undos_of(started_until(VERIFY))


async def test_an_undo_that_keeps_failing_stops_the_rollback_before_older_undos_act_on_what_depends_on_it(
    run_saga: Run,
) -> None:
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
    assert "the undo of switch-traffic kept failing (RuntimeError: API down)" in final.message
    assert "not undone, so as not to act on what depends on it: migrate, snapshot, freeze, provision" in final.message
    switch = final.steps[STEP_ACTIVITIES.index(SWITCH_TRAFFIC)]
    assert switch.state is StepState.COMPENSATION_FAILED
    assert switch.undo_attempts == 12
    assert switch.last_error == "undo: RuntimeError: API down"
    # The target still serves: its data and its StatefulSet are not undone under it.
    assert fakes.undo_calls == [UNDO[SCALE_DOWN_OLD], *[undo_switch] * 12]
    assert final.steps[STEP_ACTIVITIES.index(MIGRATE)].state is StepState.SUCCEEDED
    assert {c.type: c.status.value for c in final.conditions}["Succeeded"] == "False"


@pytest.mark.parametrize(
    "refusal",
    [
        DatabaseUnreachable("orders-db-0 refused connections: its Pod is being rescheduled"),
        BadCredentials("orders-db refused the credentials: the Secret has the new password, the role not yet"),
    ],
    ids=["unreachable", "credentials"],
)
async def test_an_undo_whose_database_does_not_answer_for_a_while_is_tried_again_and_the_rollback_finishes(
    run_saga: Run, refusal: Exception
) -> None:
    """For a step, a database that does not answer (after the driver's own quick retries) or refuses the credentials
    ends it at once, and the failure policy decides. For the undo of the freeze that would leave the source frozen:
    it is tried again, as any other failure of an undo is."""
    fakes = FakeSaga(
        fail={VERIFY: InvalidSpec("row counts differ"), UNDO[FREEZE]: refusal}, fail_times={UNDO[FREEZE]: 2}
    )
    saga = await run_saga(fakes)

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "MigrationRolledBack"
    assert saga.final_status.phase is Phase.ROLLED_BACK
    freeze = saga.final_status.steps[STEP_ACTIVITIES.index(FREEZE)]
    assert freeze.state is StepState.COMPENSATED
    assert freeze.undo_attempts == 3
    assert fakes.undo_calls.count(UNDO[FREEZE]) == 3
    assert fakes.undo_calls[-1] == UNDO[PROVISION], "and the older undos after it"
    if isinstance(refusal, DatabaseUnreachable):
        await record_history(saga, "undos-retry-an-unreachable-database")


async def test_the_undo_of_the_freeze_goes_on_being_tried_past_its_attempts_until_someone_fixes_the_secret(
    run_saga: Run,
) -> None:
    """Credentials rotated to a role the freeze shut out, fixed in the Secret hours later: the undo that lets writes in
    again is still being tried then, every ten minutes, and the rollback finishes with no SQL by hand."""
    rotated = BadCredentials("orders-db refused the connection: permission denied for database orders")
    failures = UNDO_RETRY.attempts + 8
    fakes = FakeSaga(
        fail={VERIFY: InvalidSpec("row counts differ"), UNDO[FREEZE]: rotated}, fail_times={UNDO[FREEZE]: failures}
    )
    saga = await run_saga(fakes)

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "MigrationRolledBack"
    assert saga.final_status.phase is Phase.ROLLED_BACK
    freeze = saga.final_status.steps[STEP_ACTIVITIES.index(FREEZE)]
    assert freeze.state is StepState.COMPENSATED
    assert freeze.undo_attempts == failures + 1
    assert fakes.undo_calls[-1] == UNDO[PROVISION], "and the older undos after it"
    waited = [event.message for event in fakes.events if event.reason == "CompensationRetrying"]
    assert f"attempt {failures + 1} of {UNDO_RETRY.attempts + PERSISTING_ATTEMPTS} in 600s" in waited[-1]
    assert waited[-1].endswith("writes to the source stay stopped until it succeeds")
    await record_history(saga, "undos-that-let-writes-in-persist")


async def test_an_undo_that_does_not_let_writes_in_gives_up_after_its_own_attempts(run_saga: Run) -> None:
    """Only the freeze's undo persists: a Service that cannot be pointed back ends the rollback where it was."""
    fakes = FakeSaga(fail={SCALE_DOWN_OLD: InvalidSpec("no"), UNDO[SWITCH_TRAFFIC]: RuntimeError("refused")})
    saga = await run_saga(fakes)

    with pytest.raises(WorkflowFailureError):
        await saga.handle.result()

    assert fakes.undo_calls.count(UNDO[SWITCH_TRAFFIC]) == UNDO_RETRY.attempts
    assert saga.final_status.phase is Phase.FAILED


@pytest.mark.parametrize("undo_failing", [MIGRATE, SNAPSHOT])
async def test_an_undo_that_only_empties_the_target_or_the_bucket_failing_does_not_keep_the_source_frozen(
    run_saga: Run, undo_failing: str
) -> None:
    """The target's database or the S3 endpoint unreachable (often why the rollback started): nothing older depends
    on emptying them, so the source is unfrozen and the target removed all the same, and the run says what is left."""
    unreachable = RuntimeError("connection refused")
    fakes = FakeSaga(fail={VERIFY: InvalidSpec("row counts differ"), UNDO[undo_failing]: unreachable})
    saga = await run_saga(fakes)

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "RollbackIncomplete"
    undone = [undo for undo in undos_of(started_until(VERIFY)) if undo != UNDO[undo_failing]]
    assert [call for call in fakes.undo_calls if call != UNDO[undo_failing]] == undone
    assert UNDO[FREEZE] in undone
    assert UNDO[PROVISION] in undone
    final = saga.final_status
    assert final.phase is Phase.FAILED
    assert final.write_downtime is not None
    assert final.write_downtime.ended_by == "freeze undone"
    step = "migrate" if undo_failing == MIGRATE else "snapshot"
    assert final.message is not None
    assert f"not undone: {step} (RuntimeError: connection refused)" in final.message
    assert "The source takes writes again" in final.message
    assert final.steps[STEP_ACTIVITIES.index(undo_failing)].state is StepState.COMPENSATION_FAILED
    assert final.steps[STEP_ACTIVITIES.index(FREEZE)].state is StepState.COMPENSATED
    if undo_failing == MIGRATE:
        await record_history(saga, "rollback-past-leftovers")


async def test_a_rollback_after_switch_traffic_checks_the_target_against_verifys_mark_before_traffic_goes_back(
    run_saga: Run,
) -> None:
    fakes = FakeSaga(hold={SCALE_DOWN_OLD})
    saga = await run_saga(fakes)
    await saga.wait_for("scale-down-old to start", lambda: fakes.started(SCALE_DOWN_OLD))

    await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="alice", reason="slow queries"))

    result = await saga.handle.result()
    assert result.phase is Phase.ROLLED_BACK
    assert fakes.step_calls == [*FORWARD, *way_back(STEP_ACTIVITIES)]
    assert fakes.step_calls.index(CHECK_UNWRITTEN) == fakes.step_calls.index(UNDO[SWITCH_TRAFFIC]) - 1
    fence = {"writes": 3, "statsReset": None, "catalog": "7a2c3e", "sequences": "5eq", "sequencesNext": None}
    # Before traffic goes back; then, of the source only, before each undo that empties the target.
    checks = [(checked["fence"], checked["sourceOnly"]) for checked in fakes.inputs[CHECK_UNWRITTEN]]
    assert checks == [(fence, False), (None, True), (None, True)]


async def test_writes_on_the_target_stop_the_rollback_before_traffic_goes_back_and_nothing_older_is_undone(
    run_saga: Run,
) -> None:
    taken = "database 'orders' took writes since traffic moved to it: 3 rows were inserted, updated or deleted"
    fakes = FakeSaga(hold={SCALE_DOWN_OLD}, fail={CHECK_UNWRITTEN: WritesOnTarget(taken)})
    saga = await run_saga(fakes)
    await saga.wait_for("scale-down-old to start", lambda: fakes.started(SCALE_DOWN_OLD))

    await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="alice", reason="slow queries"))

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()
    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "RollbackIncomplete"
    assert fakes.step_calls == [*FORWARD, UNDO[SCALE_DOWN_OLD], CHECK_UNWRITTEN], "checked once: it is permanent"
    final = saga.final_status
    assert final.phase is Phase.FAILED
    assert final.message == (
        "rollback stopped after rollback requested by alice: slow queries: the check before undoing switch-traffic "
        f"failed (WritesOnTarget: {taken}); not undone, as the check requires: switch-traffic, migrate, snapshot, "
        "freeze, provision"
    )
    switch = final.steps[STEP_ACTIVITIES.index(SWITCH_TRAFFIC)]
    assert switch.state is StepState.COMPENSATION_FAILED
    assert switch.last_error == f"check before undo: WritesOnTarget: {taken}"
    assert final.steps[STEP_ACTIVITIES.index(SCALE_DOWN_OLD)].state is StepState.COMPENSATED
    assert final.steps[STEP_ACTIVITIES.index(MIGRATE)].state is StepState.SUCCEEDED
    assert {c.type: c.status.value for c in final.conditions}["Succeeded"] == "False"
    failed = [event for event in fakes.events if event.reason == "CompensationFailed"]
    assert [event.message for event in failed] == [
        f"the check before undoing switch-traffic failed: WritesOnTarget: {taken}"
    ]


@pytest.mark.parametrize("emptying", [MIGRATE, SNAPSHOT])
async def test_an_undo_that_would_empty_a_target_a_service_sends_the_clients_to_stops_the_rollback_there(
    run_saga: Run, emptying: str
) -> None:
    """No switch of this run sent traffic to the target (a run reset to before switch-traffic, a Service pointed there
    by hand), yet a Service sends the clients there: the undo that would empty it refuses, tried again up to its
    attempts (its TargetServesTraffic is faked here; tests/postgres/test_served_target.py makes it for real). Going
    past it would unfreeze the source, which no client reaches, and delete the target's volumes under the clients:
    the rollback stops, the target kept, the source frozen."""
    serving = (
        "not emptying database 'orders': Service orders-db still sends its traffic to StatefulSet shop/orders-db-18. "
        "Undo switch-traffic first"
    )
    fakes = FakeSaga(
        fail={
            VERIFY: InvalidSpec("row counts differ"),
            UNDO[emptying]: ApplicationError(serving, type="TargetServesTraffic"),
        }
    )
    saga = await run_saga(fakes)

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "RollbackIncomplete"
    assert fakes.undo_calls.count(UNDO[emptying]) > 1, "tried again: the Service may be pointed back meanwhile"
    assert UNDO[FREEZE] not in fakes.undo_calls
    assert UNDO[PROVISION] not in fakes.undo_calls
    final = saga.final_status
    assert final.phase is Phase.FAILED
    assert final.message is not None
    step = "migrate" if emptying == MIGRATE else "snapshot"
    assert f"the undo of {step} left the target as it is (TargetServesTraffic: {serving}" in final.message
    assert "The source takes writes again" not in final.message
    assert final.steps[STEP_ACTIVITIES.index(FREEZE)].state is StepState.SUCCEEDED
    assert final.write_downtime is None or final.write_downtime.ended_by != "freeze undone"


@pytest.mark.parametrize("emptying", [MIGRATE, SNAPSHOT])
async def test_writes_found_by_the_undo_that_empties_the_target_stop_the_rollback_before_the_target_is_removed(
    run_saga: Run, emptying: str
) -> None:
    """The check before traffic went back passed, then a connection to the target that stayed open wrote to it: the
    undo that empties the target refuses (its WritesOnTarget is faked here; tests/postgres/test_unwritten.py makes it
    for real), and provision's undo, which deletes the target's volumes, never runs."""
    taken = "refused to empty database 'orders': it took writes since traffic moved to it: 1 row was inserted"
    fakes = FakeSaga(hold={SCALE_DOWN_OLD}, fail={UNDO[emptying]: WritesOnTarget(taken)})
    saga = await run_saga(fakes)
    await saga.wait_for("scale-down-old to start", lambda: fakes.started(SCALE_DOWN_OLD))

    await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="alice", reason="slow queries"))

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()
    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "RollbackIncomplete"
    back = way_back(STEP_ACTIVITIES)
    assert fakes.step_calls == [*FORWARD, *back[: back.index(UNDO[emptying]) + 1]], "refused once: it is permanent"
    assert UNDO[FREEZE] not in fakes.undo_calls
    assert UNDO[PROVISION] not in fakes.undo_calls
    step, left = (
        ("migrate", "migrate, snapshot, freeze, provision")
        if emptying == MIGRATE
        else ("snapshot", "snapshot, freeze, provision")
    )
    final = saga.final_status
    assert final.phase is Phase.FAILED
    assert final.message is not None
    assert final.message.startswith(
        f"rollback stopped after rollback requested by alice: slow queries: the undo of {step} left the target as it "
        f"is (WritesOnTarget: {taken}). Traffic moved to the target, and what it took since may be there alone, so "
        f"nothing older is undone (which would remove the target): {left}. "
    )
    assert "copy what it took since the switch into the source" in final.message
    assert final.steps[STEP_ACTIVITIES.index(emptying)].state is StepState.COMPENSATION_FAILED
    assert final.steps[STEP_ACTIVITIES.index(SWITCH_TRAFFIC)].state is StepState.COMPENSATED
    assert final.steps[STEP_ACTIVITIES.index(PROVISION)].state is StepState.SUCCEEDED
    if emptying == MIGRATE:
        await record_history(saga, "rollback-keeps-a-written-target")


async def test_an_undo_that_empties_the_target_failing_after_traffic_moved_stops_the_rollback_there(
    run_saga: Run,
) -> None:
    """Nothing compared the target with verify's mark after traffic left it: going past would delete its volumes."""
    fakes = FakeSaga(hold={SCALE_DOWN_OLD}, fail={UNDO[MIGRATE]: RuntimeError("connection refused")})
    saga = await run_saga(fakes)
    await saga.wait_for("scale-down-old to start", lambda: fakes.started(SCALE_DOWN_OLD))

    await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="alice", reason="slow queries"))

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()
    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "RollbackIncomplete"
    assert fakes.undo_calls == [UNDO[SCALE_DOWN_OLD], UNDO[SWITCH_TRAFFIC], *[UNDO[MIGRATE]] * 12]
    final = saga.final_status
    assert final.message is not None
    assert "the undo of migrate left the target as it is (RuntimeError: connection refused)" in final.message
    assert final.message.endswith("(see the README's recovery section)")
    assert final.steps[STEP_ACTIVITIES.index(PROVISION)].state is StepState.SUCCEEDED


async def test_an_emptying_undo_failing_after_another_emptied_the_target_in_the_same_rollback_is_gone_past(
    run_saga: Run,
) -> None:
    """Traffic had moved, and went back; migrate's undo then compared the target with verify's mark and emptied it.
    Snapshot's undo, which empties the target again and deletes the object, keeps failing (S3 unreachable): nothing
    only the target had is left, so the rollback goes past it, unfreezes the source and removes the target."""
    fakes = FakeSaga(hold={SCALE_DOWN_OLD}, fail={UNDO[SNAPSHOT]: RuntimeError("S3 endpoint unreachable")})
    saga = await run_saga(fakes)
    await saga.wait_for("scale-down-old to start", lambda: fakes.started(SCALE_DOWN_OLD))

    await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="alice", reason="slow queries"))

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()
    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "RollbackIncomplete"
    snapshot_attempts = fakes.undo_calls.count(UNDO[SNAPSHOT])
    assert fakes.undo_calls == [
        UNDO[SCALE_DOWN_OLD], UNDO[SWITCH_TRAFFIC], UNDO[MIGRATE], *[UNDO[SNAPSHOT]] * snapshot_attempts,
        UNDO[FREEZE], UNDO[PROVISION],
    ]  # fmt: skip
    final = saga.final_status
    assert final.phase is Phase.FAILED
    assert final.message is not None
    assert "but not undone: snapshot (RuntimeError: S3 endpoint unreachable)" in final.message
    assert "The source takes writes again" in final.message
    assert final.steps[STEP_ACTIVITIES.index(SNAPSHOT)].state is StepState.COMPENSATION_FAILED
    assert final.steps[STEP_ACTIVITIES.index(FREEZE)].state is StepState.COMPENSATED
    assert final.steps[STEP_ACTIVITIES.index(PROVISION)].state is StepState.COMPENSATED


async def test_under_the_pause_policy_an_emptying_undo_failing_after_traffic_went_back_stops_the_way_back_there(
    run_saga: Run,
) -> None:
    """Within one way back to writes flowing: switch-traffic's undo sent traffic back (its check passed), then the
    undo that empties the target kept failing, so nothing compared the target after it had the traffic. The freeze's
    and provision's undos do not run, although switch-traffic is no longer among the started steps."""
    fakes = FakeSaga(
        fail={SWITCH_TRAFFIC: InvalidSpec("selector refused"), UNDO[MIGRATE]: RuntimeError("connection refused")}
    )
    saga = await run_saga(fakes, migration_input(failurePolicy="Pause"))

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "RollbackIncomplete"
    assert fakes.undo_calls == [UNDO[SWITCH_TRAFFIC], *[UNDO[MIGRATE]] * 12]
    final = saga.final_status
    assert final.phase is Phase.FAILED
    assert final.message is not None
    assert final.message.startswith(
        "rollback stopped after switch-traffic failed: InvalidSpec: selector refused: the undo of migrate left the "
        "target as it is (RuntimeError: connection refused). Traffic moved to the target"
    )
    assert "nothing older is undone (which would remove the target): migrate, snapshot, freeze, provision" in (
        final.message
    )
    assert final.steps[STEP_ACTIVITIES.index(SWITCH_TRAFFIC)].state is StepState.COMPENSATED
    assert final.steps[STEP_ACTIVITIES.index(FREEZE)].state is StepState.SUCCEEDED
    assert final.steps[STEP_ACTIVITIES.index(PROVISION)].state is StepState.SUCCEEDED


@pytest.mark.parametrize("second_cycle_ends", ["migrate fails", "rollback asked"])
async def test_an_emptying_undo_failing_after_an_earlier_pause_cycle_emptied_the_target_does_not_keep_the_source_frozen(
    run_saga: Run, second_cycle_ends: str, time_skipping: WorkflowEnvironment
) -> None:
    """Under failurePolicy Pause, switch-traffic failed and the way back to writes flowing undid it, then emptied the
    target (migrate's undo compares it with verify's mark first). Retry ran again from freeze, and this time migrate
    did not get through, nor, the target being unreachable, did its undo. No traffic reached the target since it was
    emptied: the source is unfrozen and the target removed all the same, and the run names what is left."""
    unreachable = DatabaseUnreachable("orders-db-16-0 refused connections")
    fakes = FakeSaga(fail={SWITCH_TRAFFIC: InvalidSpec("selector refused")}, fail_times={SWITCH_TRAFFIC: 1})
    saga = await run_saga(fakes, migration_input(failurePolicy="Pause"))
    await saga.wait_for("the failure pause", phase=Phase.PAUSED.value)
    assert fakes.undo_calls == undos_of([FREEZE, SNAPSHOT, MIGRATE, SWITCH_TRAFFIC])

    fakes.fail[UNDO[MIGRATE]] = unreachable
    if second_cycle_ends == "migrate fails":
        fakes.fail[MIGRATE] = unreachable
    else:
        fakes.hold.add(MIGRATE)
    await saga.handle.signal(Signal.RETRY.value, ControlRequest(by="dave"))
    await saga.wait_for("migrate to run again", lambda: fakes.step_calls.count(MIGRATE) == 2)
    if second_cycle_ends == "rollback asked":
        await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="erin"))
    else:
        await time_skipping.sleep(timedelta(minutes=15))  # the undo's attempts, spaced out by its retry's delays
        await saga.wait_for(
            "the way back of the second cycle to end",
            lambda: UNDO[MIGRATE] in fakes.undo_calls[4:] and fakes.statuses[-1].phase in (Phase.PAUSED, Phase.FAILED),
        )
        assert collapsed(fakes.undo_calls[4:]) == undos_of([FREEZE, SNAPSHOT, MIGRATE]), "the source takes writes again"
        assert fakes.undo_calls.count(UNDO[MIGRATE]) == 1 + 12, "tried again, as an undo is, while it did not answer"
        paused = await saga.progress()
        assert paused.phase is Phase.PAUSED
        assert paused.message is not None
        assert paused.message.startswith(
            "migrate failed: DatabaseUnreachable: orders-db-16-0 refused connections; the source takes writes again "
            "(undone back to before freeze), so retry runs again from freeze; not undone: migrate "
            "(DatabaseUnreachable: orders-db-16-0 refused connections), and a retry may fail on what is left"
        )
        await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="erin"))

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()
    if second_cycle_ends == "rollback asked":
        await record_history(saga, "traffic-since-the-target-was-emptied")

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "RollbackIncomplete"
    assert collapsed(fakes.undo_calls[4:]) == undos_of([PROVISION, FREEZE, SNAPSHOT, MIGRATE]), (
        "the source takes writes again"
    )
    final = saga.final_status
    assert final.phase is Phase.FAILED
    assert final.message is not None
    assert "but not undone: migrate (DatabaseUnreachable: orders-db-16-0 refused connections)" in final.message
    assert "The source takes writes again" in final.message
    assert final.write_downtime is not None
    assert final.write_downtime.ended_by == "freeze undone"
    assert final.steps[STEP_ACTIVITIES.index(MIGRATE)].state is StepState.COMPENSATION_FAILED
    assert final.steps[STEP_ACTIVITIES.index(FREEZE)].state is StepState.COMPENSATED
    assert final.steps[STEP_ACTIVITIES.index(PROVISION)].state is StepState.COMPENSATED


async def test_a_check_before_an_undo_that_fails_for_a_while_runs_before_every_attempt_of_the_undo(
    run_saga: Run,
) -> None:
    fakes = FakeSaga(
        fail={SCALE_DOWN_OLD: InvalidSpec("no scale subresource"), CHECK_UNWRITTEN: RuntimeError("target restarting")},
        fail_times={CHECK_UNWRITTEN: 2},
    )
    saga = await run_saga(fakes)

    with pytest.raises(WorkflowFailureError):
        await saga.handle.result()

    assert fakes.step_calls[len(FORWARD) :] == [
        UNDO[SCALE_DOWN_OLD],
        *[CHECK_UNWRITTEN] * 3,
        *way_back(started_until(SWITCH_TRAFFIC))[1:],
    ]
    final = saga.final_status
    assert final.phase is Phase.ROLLED_BACK
    switch = final.steps[STEP_ACTIVITIES.index(SWITCH_TRAFFIC)]
    assert switch.state is StepState.COMPENSATED
    assert switch.undo_attempts == 3
    retrying = [event.message for event in fakes.events if event.reason == "CompensationRetrying"]
    assert retrying[0].startswith(
        "the check before undoing switch-traffic: attempt 1 failed: RuntimeError: target restarting; attempt 2 of 12"
    )


async def test_progress_query_reports_the_running_step(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(hold={SNAPSHOT}))
    await saga.wait_for("snapshot to start", lambda: saga.fakes.started(SNAPSHOT))

    progress = await saga.progress()

    assert progress.phase is Phase.RUNNING
    assert progress.current_step == StepName.SNAPSHOT
    assert [step.state for step in progress.steps[:4]] == [StepState.SUCCEEDED] * 3 + [StepState.RUNNING]
    saga.fakes.release()
    await saga.handle.result()


async def test_a_run_whose_migration_is_gone_before_its_first_step_changes_nothing(run_saga: Run) -> None:
    """A start whose sender never learned it landed, after the watcher let the deleted Migration go."""
    saga = await run_saga(FakeSaga(gone_after=0))

    result = await saga.handle.result()

    assert result.phase is Phase.ROLLED_BACK
    assert "the Migration is gone" in result.message
    assert saga.fakes.step_calls == []


async def test_a_run_whose_migration_disappears_midway_undoes_what_it_started(run_saga: Run) -> None:
    fakes = FakeSaga(hold={SNAPSHOT})
    saga = await run_saga(fakes)
    await saga.wait_for("snapshot to start", lambda: fakes.started(SNAPSHOT))
    fakes.gone_after = len(fakes.statuses)
    fakes.release()

    result = await saga.handle.result()

    assert result.phase is Phase.ROLLED_BACK
    assert "the Migration is gone" in result.message
    assert MIGRATE not in fakes.step_calls
    assert fakes.undo_calls == undos_of(started_until(SNAPSHOT))


async def test_the_write_downtime_window_runs_from_the_freezes_start_until_traffic_has_moved(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(), migration_input())

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED

    final = saga.final_status
    window = final.write_downtime
    assert window is not None
    assert window.started_at == final.steps[STEP_ACTIVITIES.index(FREEZE)].started_at
    assert window.ended_at == final.steps[STEP_ACTIVITIES.index(SWITCH_TRAFFIC)].finished_at
    assert window.ended_by == "traffic moved"
    assert window.seconds == (window.ended_at - window.started_at).total_seconds()


async def test_a_rollback_ends_the_write_downtime_window_when_the_freeze_is_undone(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(fail={VERIFY: InvalidSpec("row counts differ")}), migration_input())

    with pytest.raises(WorkflowFailureError):
        await saga.handle.result()

    final = saga.final_status
    assert final.write_downtime is not None
    assert final.write_downtime.ended_at == final.steps[STEP_ACTIVITIES.index(FREEZE)].finished_at
    assert final.write_downtime.ended_by == "freeze undone"


def collapsed(calls: list[str]) -> list[str]:
    """The calls with the attempts of one undo in a row counted once."""
    return [call for index, call in enumerate(calls) if index == 0 or calls[index - 1] != call]


@pytest.mark.parametrize(
    "gone",
    [
        pytest.param(InvalidSpec("database 'orders' does not exist on the source's server"), id="dropped"),
        pytest.param(DatabaseReplaced("Secret shop/orders-db-source now reaches another database"), id="replaced"),
    ],
)
async def test_a_source_gone_while_it_was_copied_stops_the_rollback_before_the_target_is_emptied_or_snapshot_deleted(
    run_saga: Run, gone: Exception
) -> None:
    """Its volume lost or replaced, or its database dropped, while the saga copied it: the target's restore and the
    snapshot are the only copies left. The check before each undo that empties the target reaches the source first,
    and its failure stops the rollback there (a retried one once its attempts are spent)."""
    fakes = FakeSaga(fail={VERIFY: InvalidSpec("the source does not answer"), CHECK_UNWRITTEN: gone})
    saga = await run_saga(fakes)

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "RollbackIncomplete"
    assert UNDO[MIGRATE] not in fakes.step_calls
    assert UNDO[SNAPSHOT] not in fakes.step_calls
    assert UNDO[PROVISION] not in fakes.step_calls, "nor the target's volumes"
    final = saga.final_status
    assert final.phase is Phase.FAILED
    assert "the check before undoing migrate failed" in (final.message or "")
    await record_history(saga, f"source-checked-before-the-target-is-emptied-{type(gone).__name__}")


async def test_the_status_that_says_the_run_finished_is_written_however_long_the_api_refuses_it(run_saga: Run) -> None:
    """Once the run closes nothing writes the status again: a final write given up after a few minutes left the
    Migration showing Running for good, and every `kubectl wait` hanging."""
    fakes = FakeSaga(final_mirrors_failing=6)
    saga = await run_saga(fakes)

    result = await saga.handle.result()

    assert result.phase is Phase.SUCCEEDED
    assert fakes.final_mirrors_failing == 0
    assert saga.final_status.phase is Phase.SUCCEEDED
    await record_history(saga, "final-status-until-written")


async def test_a_status_write_refused_for_good_mid_run_does_not_end_the_run(run_saga: Run) -> None:
    """A status write that used up its attempts reached the run as a local activity's failure, which escaped the
    handler: the run closed Failed wherever it stood (here at its sixth write, steps under way), nothing undone. And
    the Events it carried are recorded by a later write, not lost."""
    fakes = FakeSaga(mirrors_failing_from=(6, 1))  # one write, the source frozen
    saga = await run_saga(fakes)

    result = await saga.handle.result()

    assert result.phase is Phase.SUCCEEDED
    assert fakes.step_calls == FORWARD
    reasons = [event.reason for event in fakes.events]
    assert reasons.count("StepStarted") == reasons.count("StepSucceeded") == len(STEP_ORDER)
    assert len({event.key for event in fakes.events}) == len(reasons)


async def test_a_final_status_write_the_workers_gate_refuses_is_not_tried_again(run_saga: Run) -> None:
    """The gate refuses every write of a run that is not the Migration's (a reset of a finished one): the run ends."""
    fakes = FakeSaga(final_mirrors_failing=1_000, mirror_failure=NOT_BACKED)
    saga = await run_saga(fakes)

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    assert fakes.final_mirrors_failing == 999, "tried once"
