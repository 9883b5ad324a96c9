"""The plan: every step in the API's order, each with its undo or a reason, inputs built from the spec and results."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from ferry.api.migration import STEP_ORDER, MigrationSpec
from ferry.api.saga import (
    CheckUnwrittenInput,
    FenceMark,
    FreezeResult,
    MigrateInput,
    MigrationRef,
    SnapshotInput,
    SnapshotResult,
    UndoFreezeInput,
    UndoScaleDownOldInput,
    UndoSnapshotInput,
    VerifyResult,
)
from tests import samples
from workflows import plan
from workflows.steps import STEP_RETRY, UNDO_RETRY, Context, Results

SPEC = MigrationSpec.model_validate(samples.migration("orders-db-to-16")["spec"])
REF = MigrationRef(namespace="shop", name="orders-db-to-16", uid=str(uuid.uuid4()))
SNAPSHOT = SnapshotResult(bucket="b", key="k/snapshot.dump", sha256="ab" * 32, size_bytes=10)


def context() -> Context:
    return Context(ref=REF, spec=SPEC, results=Results())


def test_the_plan_runs_the_steps_in_the_order_of_the_api() -> None:
    assert tuple(step.name for step in plan.PLAN) == STEP_ORDER


def test_every_step_has_an_undo_or_says_why_not() -> None:
    for step in plan.PLAN:
        assert step.undo is not None or step.why_no_undo, step.name


def test_data_steps_resolve_to_the_drivers_activities() -> None:
    assert plan.FREEZE.call(context()).activity == "postgresql.freeze"
    assert plan.PROVISION.call(context()).activity == "provision"


def test_a_steps_attempt_may_take_what_the_spec_allows() -> None:
    assert plan.SNAPSHOT.call(context()).timeout == timedelta(seconds=SPEC.timeouts.snapshot)
    assert plan.PRECHECK.call(context()).timeout == timedelta(seconds=SPEC.timeouts.precheck)


def test_migrate_reads_the_snapshots_result() -> None:
    c = context()
    with pytest.raises(LookupError, match="snapshot"):
        plan.MIGRATE.call(c)
    c.results.put(plan.SNAPSHOT, SNAPSHOT)

    argument = plan.MIGRATE.call(c).argument

    assert isinstance(argument, MigrateInput)
    assert argument.artifact == SNAPSHOT


def test_undos_are_built_with_or_without_their_steps_result() -> None:
    c = context()
    without = plan.FREEZE.undo_call(c)
    assert without is not None
    assert isinstance(without.argument, UndoFreezeInput)
    assert without.argument.previous_setting is None

    c.results.put(plan.FREEZE, FreezeResult(previous_setting="off"))
    with_result = plan.FREEZE.undo_call(c)
    assert with_result is not None
    assert isinstance(with_result.argument, UndoFreezeInput)
    assert with_result.argument.previous_setting == "off"

    snapshot_undo = plan.SNAPSHOT.undo_call(c)
    assert snapshot_undo is not None
    assert isinstance(snapshot_undo.argument, UndoSnapshotInput)
    assert snapshot_undo.argument.artifact is None
    assert snapshot_undo.argument.key == f"{REF.namespace}/{REF.name}/{REF.uid}/snapshot.dump"

    scale_undo = plan.SCALE_DOWN_OLD.undo_call(c)
    assert scale_undo is not None
    assert isinstance(scale_undo.argument, UndoScaleDownOldInput)
    assert scale_undo.argument.replicas is None


def test_in_mode_snapshot_the_snapshot_restores_while_dumping_and_its_undo_empties_the_target() -> None:
    c = context()
    step = plan.plan_for(SPEC)[STEP_ORDER.index("snapshot")]

    call = step.call(c)
    undo = step.undo_call(c)

    assert isinstance(call.argument, SnapshotInput)
    assert call.argument.restore
    assert undo is not None
    assert undo.activity == "postgresql.undo_snapshot", "the step may have restored even if migrate never started"
    assert isinstance(undo.argument, UndoSnapshotInput)
    assert undo.argument.driver == SPEC.driver


def test_runs_started_before_restoring_while_dumping_keep_the_sequential_plan() -> None:
    c = context()
    before = plan.plan_for(SPEC, restores_while_dumping=False)

    assert tuple(step.name for step in before) == STEP_ORDER
    snapshot = before[STEP_ORDER.index("snapshot")]
    assert snapshot is plan.SNAPSHOT
    assert isinstance(snapshot.call(c).argument, SnapshotInput)
    assert not snapshot.call(c).argument.restore
    undo = snapshot.undo_call(c)
    assert undo is not None
    assert undo.activity == "undo_snapshot"
    assert [a is b for a, b in zip(before, plan.PLAN, strict=True)].count(False) == 1


def test_traffic_moves_only_after_checking_for_writes_since_a_freeze_that_left_a_mark() -> None:
    c = context()
    assert plan.SWITCH_TRAFFIC.guard_call(c) is None, "no freeze yet: nothing to compare with"
    c.results.put(plan.FREEZE, FreezeResult(previous_setting="off"))
    assert plan.SWITCH_TRAFFIC.guard_call(c) is None, "a freeze of the previous version left no mark"
    c.results.put(plan.FREEZE, FreezeResult(previous_setting="off", fence=FenceMark(writes=7, catalog="x")))

    guard = plan.SWITCH_TRAFFIC.guard_call(c)

    assert guard is not None
    assert guard.activity == "postgresql.check_frozen"
    assert plan.SCALE_DOWN_OLD.guard_call(c) is not None
    assert plan.VERIFY.guard_call(c) is None


def test_traffic_goes_back_only_after_checking_the_target_with_verifys_mark_or_the_one_kept_in_it() -> None:
    c = context()
    from_marker = plan.SWITCH_TRAFFIC.undo_guard_call(c)
    assert from_marker is not None, "an undo without verify's result still checks: the target keeps the mark"
    assert from_marker.activity == "postgresql.check_unwritten"
    assert isinstance(from_marker.argument, CheckUnwrittenInput)
    assert from_marker.argument.fence is None
    mark = FenceMark(writes=1_100, catalog="t")
    c.results.put(plan.VERIFY, VerifyResult(tables=[], target_fence=mark))

    from_result = plan.SWITCH_TRAFFIC.undo_guard_call(c)

    assert from_result is not None
    assert isinstance(from_result.argument, CheckUnwrittenInput)
    assert from_result.argument.fence == mark
    assert from_result.timeout == timedelta(seconds=SPEC.timeouts.switch_traffic)
    checked = [step.name for step in plan.PLAN if step.undo_guard_call(c) is not None]
    assert checked == ["snapshot", "migrate", "switch-traffic"], "and before the undos that empty the target"
    assert "WritesOnTarget" in UNDO_RETRY.non_retryable


def test_a_step_that_returns_the_wrong_type_is_a_bug_not_a_success() -> None:
    with pytest.raises(TypeError, match="returned"):
        plan.SNAPSHOT.accept(context(), FreezeResult(previous_setting="off"), status=None)  # type: ignore[arg-type]


def test_attempts_wait_longer_each_time_up_to_a_minute() -> None:
    assert [STEP_RETRY.delay(n).total_seconds() for n in range(1, 5)] == [1, 2, 4, 8]
    assert STEP_RETRY.delay(20) == timedelta(seconds=60)
    assert UNDO_RETRY.attempts > STEP_RETRY.attempts
    assert "WritesAfterFreeze" in STEP_RETRY.non_retryable
