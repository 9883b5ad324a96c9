"""A dry run (spec.dryRun) runs the checks, writes the plan and ends Planned, having changed nothing."""

from __future__ import annotations

from typing import Any

import pytest

from ferry.api.migration import STEP_ORDER, ConditionStatus, Phase, StepState
from tests.workflows.conftest import migration_input, record_history
from tests.workflows.fakes import CHECK_CLUSTER, MIRROR, PRECHECK, FakeSaga

Run = Any
pytestmark = pytest.mark.timeout(90)


async def test_a_dry_run_runs_only_the_checks_and_ends_planned_with_the_plan(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(), migration_input(dryRun=True, approval={"required": True}))

    result = await saga.handle.result()

    assert result.phase is Phase.PLANNED
    assert [call for call in saga.fakes.calls if call != MIRROR] == [CHECK_CLUSTER, PRECHECK]
    assert saga.fakes.undo_calls == []
    final = saga.final_status
    assert final.phase is Phase.PLANNED
    assert final.current_step is None
    assert final.message is not None
    assert final.message.startswith("planned: every check passed and nothing was changed")
    assert [(step.name, step.state) for step in final.steps][:2] == [
        ("precheck", StepState.SUCCEEDED),
        ("provision", StepState.PENDING),
    ]
    plan = final.plan
    assert plan is not None
    assert plan.steps == list(STEP_ORDER)
    assert (plan.source_version, plan.target_version, plan.source_size_bytes) == ("15.18", "18.1", 8192)
    assert plan.target_storage_bytes == 2**30
    assert plan.estimates is not None
    # 8192 bytes: snapshot (restoring as it uploads) at min(read 4096, upload 8192, write 2048) = 4 s, migrate
    # nothing left, verify at 4096 = 2 s.
    assert (plan.estimates.snapshot_seconds, plan.estimates.migrate_seconds, plan.estimates.verify_seconds) == (
        4.0,
        0.0,
        2.0,
    )
    assert plan.estimates.write_downtime_seconds == 11.0
    assert plan.estimates.total_seconds == 16.0


async def test_a_dry_run_ends_with_the_condition_planned_true_which_kubectl_wait_can_wait_for(run_saga: Run) -> None:
    """`kubectl wait --for=condition=Planned` returns once the plan is written: that condition is True, of the
    Migration's generation (kubectl wait takes no condition of an older one). Succeeded stays False: nothing was
    migrated, and a script waiting for a migration must not take a plan for one."""
    saga = await run_saga(FakeSaga(), migration_input(dryRun=True))

    await saga.handle.result()
    # Recorded before the condition existed: a dry run in flight replays on a worker that writes it.
    await record_history(saga, "dry-run-planned")

    conditions = {condition.type: condition for condition in saga.final_status.conditions}
    planned = conditions["Planned"]
    assert (planned.status, planned.reason, planned.observed_generation) == (ConditionStatus.TRUE, "Planned", 1)
    assert planned.message == saga.final_status.message
    assert [kind for kind, condition in conditions.items() if condition.status is ConditionStatus.TRUE] == ["Planned"]
    running = {condition.type: condition.status for condition in saga.fakes.statuses[0].conditions}
    assert running["Planned"] is ConditionStatus.FALSE, "not before the plan is done"


async def test_a_run_that_is_not_dry_writes_the_same_plan_and_goes_on(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(), migration_input())

    result = await saga.handle.result()

    assert result.phase is Phase.SUCCEEDED
    assert saga.final_status.plan is not None
    assert saga.final_status.plan.estimates is not None
    conditions = {condition.type: condition.status for condition in saga.final_status.conditions}
    assert (conditions["Succeeded"], conditions["Planned"]) == (ConditionStatus.TRUE, ConditionStatus.FALSE)
