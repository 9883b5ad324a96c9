"""When each control applies to a running saga, and what the saga says it does."""

from __future__ import annotations

import pytest

from ferry.api.saga import CONTROL_BY_LIMIT, CONTROL_ID_LIMIT, CONTROL_REASON_LIMIT, ControlRequest, Signal
from workflows.controls import Controls, Stage

ALICE = ControlRequest(by="alice", reason="looks good")


def test_a_fresh_saga_refuses_retry_and_resume_and_approval_it_does_not_need() -> None:
    controls = Controls(approval_required=False)

    assert controls.refusal(Signal.RETRY) == "retry refused: no failed step waits for a decision"
    assert controls.refusal(Signal.RESUME) == "resume refused: the saga is not paused"
    assert controls.refusal(Signal.APPROVE) == (
        "approve refused: this Migration does not ask for approval (spec.approval.required)"
    )
    assert controls.refusal(Signal.PAUSE) is None
    assert controls.refusal(Signal.ROLLBACK) is None


def test_an_approval_is_taken_once() -> None:
    controls = Controls(approval_required=True)

    assert controls.refusal(Signal.APPROVE) is None
    assert controls.apply(Signal.APPROVE, ALICE).startswith("approved by alice")
    assert controls.refusal(Signal.APPROVE) == "approve refused: already approved by alice"


def test_an_approval_after_the_gate_is_moot() -> None:
    controls = Controls(approval_required=True, approval_settled=True)

    assert controls.refusal(Signal.APPROVE) == "approve refused: the approval gate is already behind the saga"


def test_pause_then_resume() -> None:
    controls = Controls(approval_required=False, next_step="freeze")

    assert controls.apply(Signal.PAUSE, ALICE) == (
        "paused by alice: the saga holds before freeze once the running step (if any) ends"
    )
    assert controls.refusal(Signal.PAUSE) == "pause refused: the saga is already paused, or pauses before its next step"
    assert controls.refusal(Signal.RESUME) is None
    assert controls.apply(Signal.RESUME, ALICE) == "resumed by alice"
    assert not controls.pause_requested


def test_retry_applies_only_to_a_step_waiting_for_a_decision() -> None:
    controls = Controls(approval_required=False, awaiting_decision="snapshot")

    assert controls.refusal(Signal.RETRY) is None
    assert controls.apply(Signal.RETRY, ALICE) == "retrying snapshot by alice"
    assert controls.retry_requested


def test_one_rollback_and_nothing_once_rolling_back_or_finished() -> None:
    controls = Controls(approval_required=True)
    controls.apply(Signal.ROLLBACK, ALICE)

    assert controls.refusal(Signal.ROLLBACK) == "rollback refused: a rollback was already asked for"
    assert controls.rollback_reason() == "rollback requested by alice: looks good"
    controls.stage = Stage.ROLLING_BACK
    assert controls.refusal(Signal.APPROVE) == "approve refused: it is rolling back"
    assert controls.refusal(Signal.ROLLBACK) == "rollback refused: it is already rolling back"
    controls.stage = Stage.FINISHED
    for control in Signal:
        assert controls.refusal(control) == f"{control} refused: the migration has finished"


@pytest.mark.parametrize("request_id", ["ferry.dev/pause=alice"])
def test_a_request_is_acted_on_once(request_id: str) -> None:
    controls = Controls(approval_required=False)
    request = ControlRequest(by="alice", request_id=request_id)

    assert not controls.is_repeat(request)
    assert controls.is_repeat(request)
    assert not controls.is_repeat(ControlRequest(by="alice"))
    assert not controls.is_repeat(ControlRequest(by="alice"))


def test_a_control_sent_by_hand_with_huge_texts_is_cut_not_refused() -> None:
    """`temporal workflow update --input '{"by": "<a megabyte>"}'`: `by` goes into the status and every later status
    write, which the API server would refuse for good, and into every mirror in the run's history."""
    request = ControlRequest.model_validate({"by": "x" * 1_000_000, "reason": "y" * 5_000, "requestId": "z" * 5_000})

    assert (len(request.by), len(request.reason), len(request.request_id)) == (
        CONTROL_BY_LIMIT, CONTROL_REASON_LIMIT, CONTROL_ID_LIMIT,
    )  # fmt: skip
    assert request.by.endswith("x…")
    assert ControlRequest(by="alice", reason="wrong target").by == "alice"
    one, other = ("z" * 5_000 + "1", "z" * 5_000 + "2")
    assert ControlRequest(request_id=one).request_id != ControlRequest(request_id=other).request_id, "still two"
    longest = "ferry.dev/rollback=" + "a" * 63 + ": " + "r" * 256  # the longest the watcher makes
    assert ControlRequest(request_id=longest).request_id == longest
