"""The status the saga keeps: attempts, retries, conditions, and the order of steps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ferry.api.migration import ConditionStatus, MigrationStatus, Phase, StepState, WorkflowRef
from workflows.status import SagaStatus, conditions_for

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
REF = WorkflowRef(namespace="default", id="migration/shop/x/uid")


def test_each_start_of_a_step_counts_an_attempt_and_clears_its_finish() -> None:
    status = SagaStatus(workflow=REF, generation=1)
    status.update_step("freeze", T0, state=StepState.RUNNING)
    status.update_step("freeze", T0 + timedelta(seconds=1), state=StepState.RETRYING, last_error="reset")

    entry = status.update_step("freeze", T0 + timedelta(seconds=3), state=StepState.RUNNING, last_error="reset")

    assert entry.attempts == 2
    assert entry.last_error == "reset"
    assert entry.finished_at is None


def test_conditions_keep_their_transition_time_while_their_status_holds() -> None:
    first = conditions_for(Phase.RUNNING, "going", 1, {}, T0)
    later = conditions_for(Phase.PAUSED, "paused", 1, first, T0 + timedelta(minutes=5))

    assert later["Succeeded"].status is ConditionStatus.UNKNOWN
    assert later["Succeeded"].last_transition_time == T0
    assert later["Paused"].status is ConditionStatus.TRUE
    assert later["Paused"].last_transition_time == T0 + timedelta(minutes=5)
    assert conditions_for(Phase.ROLLED_BACK, "undone", 1, later, T0)["Succeeded"].status is ConditionStatus.FALSE


def test_the_model_lists_the_steps_of_the_run_in_its_order() -> None:
    status = SagaStatus(workflow=REF, generation=3, order=("provision", "notify"))

    model = status.to_model()

    assert [step.name for step in model.steps] == ["provision", "notify"]
    assert model.observed_generation == 3


def test_a_later_run_goes_on_from_a_finished_status() -> None:
    earlier = MigrationStatus.model_validate(
        {"phase": "Succeeded", "approvedBy": "alice", "steps": [{"name": "verify", "state": "Succeeded"}]}
    )

    resumed = SagaStatus.resumed_from(earlier, REF, 2, order=("verify", "switch-traffic"))

    assert resumed.approved_by == "alice"
    assert resumed.steps["verify"].state is StepState.SUCCEEDED
    assert resumed.steps["switch-traffic"].state is StepState.PENDING
