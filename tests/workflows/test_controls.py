"""Controls given to a running saga: updates that say what the saga did or why not, signals that leave Events."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from ferry.api.errors import InvalidSpec
from ferry.api.migration import Phase
from ferry.api.saga import ControlOutcome, ControlRequest, Signal
from tests.workflows.conftest import migration_input, record_history
from tests.workflows.fakes import PROVISION, SNAPSHOT, SWITCH_TRAFFIC, UNDO, VERIFY, FakeSaga

Run = Any
pytestmark = pytest.mark.timeout(90)


async def update(saga: Any, control: Signal, by: str = "alice", request_id: str = "") -> ControlOutcome:
    outcome: ControlOutcome = await saga.handle.execute_update(
        control.value, ControlRequest(by=by, request_id=request_id), result_type=ControlOutcome
    )
    return outcome


async def refusal(saga: Any, control: Signal) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await update(saga, control)
    cause = refused.value.cause
    assert isinstance(cause, ApplicationError)
    return cause.message


async def test_an_accepted_update_says_what_the_saga_does(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(hold={PROVISION}))
    await saga.wait_for("provision to start", lambda: saga.fakes.started(PROVISION))

    outcome = await update(saga, Signal.PAUSE, by="carol")

    assert outcome.message == "paused by carol: the saga holds before provision once the running step (if any) ends"
    saga.fakes.release()
    await saga.wait_for("the pause", phase=Phase.PAUSED.value)
    resumed = await update(saga, Signal.RESUME, by="carol")
    assert resumed.message == "resumed by carol"
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED


async def test_updates_that_cannot_apply_are_refused_with_the_reason(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(hold={SNAPSHOT}))
    await saga.wait_for("snapshot to start", lambda: saga.fakes.started(SNAPSHOT))

    assert await refusal(saga, Signal.RETRY) == "retry refused: no failed step waits for a decision"
    assert await refusal(saga, Signal.APPROVE) == (
        "approve refused: this Migration does not ask for approval (spec.approval.required)"
    )
    assert await refusal(saga, Signal.RESUME) == "resume refused: the saga is not paused"
    await update(saga, Signal.ROLLBACK)
    assert await refusal(saga, Signal.ROLLBACK) in (
        "rollback refused: a rollback was already asked for",
        "rollback refused: it is already rolling back",
    )

    assert (await saga.handle.result()).phase is Phase.ROLLED_BACK


async def test_an_approval_is_refused_once_given(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(), migration_input(approval={"required": True}))
    await saga.wait_for("the approval gate", phase=Phase.AWAITING_APPROVAL.value)

    approved = await update(saga, Signal.APPROVE, by="alice")

    assert approved.message.startswith("approved by alice")
    assert await refusal(saga, Signal.APPROVE) == "approve refused: already approved by alice"
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    assert SWITCH_TRAFFIC in saga.fakes.calls


async def test_retry_is_accepted_only_while_a_failed_step_waits(run_saga: Run) -> None:
    fakes = FakeSaga(fail={VERIFY: InvalidSpec("row counts differ")}, fail_times={VERIFY: 1})
    saga = await run_saga(fakes, migration_input(failurePolicy="Pause"))
    await saga.wait_for("the failure pause", phase=Phase.PAUSED.value)

    outcome = await update(saga, Signal.RETRY, by="dave")

    assert outcome.message == "retrying verify by dave"
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED


async def test_the_same_request_twice_is_acted_on_once(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(hold={PROVISION}))
    await saga.wait_for("provision to start", lambda: saga.fakes.started(PROVISION))

    first = await update(saga, Signal.PAUSE, request_id="ferry.dev/pause=carol")
    again = await update(saga, Signal.PAUSE, request_id="ferry.dev/pause=carol")

    assert first.message.startswith("paused")
    assert again.message == "pause was already acted on"
    saga.fakes.release()
    await saga.wait_for("the pause", phase=Phase.PAUSED.value)
    await update(saga, Signal.RESUME)
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED


async def test_a_control_sent_as_a_signal_leaves_an_event_naming_it(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(hold={PROVISION}))
    await saga.wait_for("provision to start", lambda: saga.fakes.started(PROVISION))

    await saga.handle.signal(Signal.RETRY.value, ControlRequest(by="tctl-user"))
    await saga.handle.signal(Signal.PAUSE.value, ControlRequest(by="tctl-user"))
    await saga.wait_for(
        "the Events", lambda: {e.reason for e in saga.fakes.events} >= {"ControlIgnored", "ControlReceived"}
    )

    messages = {event.reason: event.message for event in saga.fakes.events}
    assert messages["ControlIgnored"] == (
        "retry (signal from tctl-user) ignored: retry refused: no failed step waits for a decision"
    )
    assert messages["ControlReceived"].startswith("pause (signal from tctl-user): paused by tctl-user")
    saga.fakes.release()
    await saga.wait_for("the pause", phase=Phase.PAUSED.value)
    await saga.handle.signal(Signal.RESUME.value)
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED


async def test_a_change_of_spec_paused_that_cannot_apply_is_still_seen_so_observed_generation_catches_up(
    run_saga: Run,
) -> None:
    """`kubectl wait --for=condition=...` reads a condition of an older generation as not met: a spec.paused that
    asks for what already holds (or comes while rolling back) must still be seen, or every wait hangs. The undo of
    snapshot is held, so the rollback is still under way when the second change comes."""
    saga = await run_saga(FakeSaga(hold={SNAPSHOT, UNDO[SNAPSHOT]}))
    await saga.wait_for("snapshot to start", lambda: saga.fakes.started(SNAPSHOT))
    await update(saga, Signal.PAUSE, by="carol")  # by annotation

    spec_paused = ControlRequest(by="spec.paused", generation=2, request_id="spec.paused=true@2", of_spec=True)
    outcome: ControlOutcome = await saga.handle.execute_update(
        Signal.PAUSE.value, spec_paused, result_type=ControlOutcome
    )

    assert outcome.message == (
        "pause refused: the saga is already paused, or pauses before its next step; nothing to do for this spec"
    )
    assert (await saga.progress()).observed_generation == 2
    await update(saga, Signal.ROLLBACK)
    await saga.wait_for("the rollback to reach the undo of snapshot", lambda: saga.fakes.started(UNDO[SNAPSHOT]))
    assert (await saga.progress()).phase is Phase.ROLLING_BACK
    resume = spec_paused.model_copy(update={"generation": 3, "request_id": "spec.paused=false@3"})
    outcome = await saga.handle.execute_update(Signal.RESUME.value, resume, result_type=ControlOutcome)
    assert outcome.message.endswith("; nothing to do for this spec")
    saga.fakes.release()
    await saga.handle.result()
    final = saga.final_status
    assert final.phase is Phase.ROLLED_BACK
    assert {condition.observed_generation for condition in final.conditions} == {3}


async def test_controls_given_after_a_rollback_was_accepted_are_refused_saying_so(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(hold={SNAPSHOT}))
    await saga.wait_for("snapshot to start", lambda: saga.fakes.started(SNAPSHOT))
    await update(saga, Signal.ROLLBACK)

    assert await refusal(saga, Signal.PAUSE) in (
        "pause refused: a rollback was asked for; the running step is stopped and the started steps undone",
        "pause refused: it is rolling back",
    )
    saga.fakes.release()
    assert (await saga.handle.result()).phase is Phase.ROLLED_BACK


async def test_resume_after_a_failure_under_the_pause_policy_says_to_retry_or_roll_back(run_saga: Run) -> None:
    fakes = FakeSaga(fail={VERIFY: InvalidSpec("row counts differ")}, fail_times={VERIFY: 1})
    saga = await run_saga(fakes, migration_input(failurePolicy="Pause"))
    await saga.wait_for("the failure pause", phase=Phase.PAUSED.value)

    await saga.handle.signal(Signal.RESUME.value, ControlRequest(by="erin"))

    await saga.wait_for("the resume's Event", lambda: "ControlIgnored" in {e.reason for e in saga.fakes.events})
    [ignored] = [event for event in saga.fakes.events if event.reason == "ControlIgnored"]
    assert ignored.message == (
        "resume (signal from erin) ignored: resume refused: verify failed and waits for a decision: send retry to "
        "run it again, or rollback to undo the started steps"
    )
    await update(saga, Signal.RETRY)
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED


async def test_a_signal_carrying_a_generation_no_migration_can_have_is_dropped(run_saga: Run) -> None:
    """Kept, it would be status.observedGeneration: every later spec.paused ignored by the watcher, and every status
    write refused by the API server (an int64) while the run goes on."""
    saga = await run_saga(FakeSaga(hold={PROVISION}))
    await saga.wait_for("provision to start", lambda: saga.fakes.started(PROVISION))

    await saga.handle.signal(Signal.RETRY.value, {"by": "tctl-user", "generation": 10**20})
    await saga.handle.signal(Signal.PAUSE.value, ControlRequest(by="tctl-user"))
    await saga.wait_for("the pause's Event", lambda: "ControlReceived" in {e.reason for e in saga.fakes.events})

    assert {status.observed_generation for status in saga.fakes.statuses} == {1}
    assert "ControlIgnored" not in {event.reason for event in saga.fakes.events}
    saga.fakes.release()
    await saga.wait_for("the pause", phase=Phase.PAUSED.value)
    await saga.handle.signal(Signal.RESUME.value)
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED


async def test_a_generation_a_signal_carries_is_not_taken_as_seen(run_saga: Run) -> None:
    """The watcher sends updates: a generation sent by hand, above the Migration's, would make it ignore every later
    spec.paused."""
    saga = await run_saga(FakeSaga(hold={PROVISION}))
    await saga.wait_for("provision to start", lambda: saga.fakes.started(PROVISION))

    await saga.handle.signal(Signal.PAUSE.value, ControlRequest(by="tctl-user", generation=50))

    await saga.wait_for("the pause's Event", lambda: "ControlReceived" in {e.reason for e in saga.fakes.events})
    assert (await saga.progress()).observed_generation == 1
    saga.fakes.release()
    await saga.wait_for("the pause", phase=Phase.PAUSED.value)
    await saga.handle.signal(Signal.RESUME.value)
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED


async def test_a_change_of_spec_paused_after_a_rollback_was_accepted_is_taken_in_without_pausing(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(hold={SNAPSHOT}))
    await saga.wait_for("snapshot to start", lambda: saga.fakes.started(SNAPSHOT))
    await update(saga, Signal.ROLLBACK)

    spec_paused = ControlRequest(by="spec.paused", generation=2, request_id="spec.paused=true@2", of_spec=True)
    outcome: ControlOutcome = await saga.handle.execute_update(
        Signal.PAUSE.value, spec_paused, result_type=ControlOutcome
    )

    assert outcome.message.startswith("pause refused: "), outcome.message
    assert outcome.message.endswith("; nothing to do for this spec")
    saga.fakes.release()
    assert (await saga.handle.result()).phase is Phase.ROLLED_BACK
    assert (await saga.progress()).observed_generation == 2


async def test_a_signal_ignored_as_it_could_not_apply_is_acted_on_when_sent_again_once_it_can(run_saga: Run) -> None:
    """A refused signal is not acted on, so its request ID is not spent: the same command sent again from the shell's
    history once a step waits for a decision retries it, instead of being dropped as a repeat with no Event."""
    fakes = FakeSaga(hold={PROVISION}, fail={VERIFY: InvalidSpec("row counts differ")}, fail_times={VERIFY: 1})
    saga = await run_saga(fakes, migration_input(failurePolicy="Pause"))
    await saga.wait_for("provision to start", lambda: saga.fakes.started(PROVISION))
    again = ControlRequest(by="tctl-user", request_id="retry-1")

    await saga.handle.signal(Signal.RETRY.value, again)
    await saga.wait_for("the refusal's Event", lambda: any(e.reason == "ControlIgnored" for e in saga.fakes.events))
    saga.fakes.release()
    await saga.wait_for("the failure pause", phase=Phase.PAUSED.value)
    await saga.handle.signal(Signal.RETRY.value, again)

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    received = [e.message for e in saga.fakes.events if e.reason == "ControlReceived"]
    assert received == ["retry (signal from tctl-user): retrying verify by tctl-user"]
    await record_history(saga, "refused-signals-forgotten")
