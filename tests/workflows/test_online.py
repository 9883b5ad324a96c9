"""Mode Online, specified step by step against fake activities: replicate before the freeze, catch up after it.

The plan is plan.ONLINE_PLAN, chosen from spec.driver.mode when the run starts. What the
activities do to the databases is specified against real PostgreSQL in
tests/postgres/test_replicate.py; here, the order of steps and undos, where the approval
and the write-downtime window fall, and what the status says.
"""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from ferry.api.errors import InvalidSpec, ReplicationBroken, VerificationMismatch
from ferry.api.migration import ONLINE_STEP_ORDER, STEP_ORDER, MigrationSpec, Phase, StepName, StepState
from ferry.api.saga import (
    UNDO_WORKFLOW_NAME,
    ControlRequest,
    MigrationInput,
    MigrationResult,
    Signal,
    UndoMigrationInput,
    undo_workflow_id,
)
from tests.workflows.conftest import migration_input, record_history
from tests.workflows.fakes import (
    CATCH_UP,
    CHECK_CLUSTER,
    FREEZE,
    MIGRATE,
    PRECHECK,
    PROVISION,
    REPLICATE,
    SCALE_DOWN_OLD,
    SNAPSHOT,
    SWITCH_TRAFFIC,
    UNDO_CATCH_UP,
    UNDO_REPLICATE,
    VERIFY,
    WATCH_REPLICATION,
    FakeSaga,
    guard_of,
    step_activities,
    undo_guard_of,
    undo_of,
)
from workflows import plan
from workflows.undo import MigrationUndoWorkflow

Run = Any
pytestmark = pytest.mark.timeout(90)

STEPS = step_activities(plan.ONLINE_PLAN)
GUARD = guard_of(plan.ONLINE_PLAN)
UNDO = undo_of(plan.ONLINE_PLAN)
UNDO_GUARD = undo_guard_of(plan.ONLINE_PLAN)


def online(name: str = "orders-db-to-16", **spec: Any) -> MigrationInput:
    driver = {"type": "postgresql", "sourceSecret": "orders-db-source", "targetSecret": "orders-db-target"}
    return migration_input(name, driver={**driver, "mode": "Online"}, **spec)


def fakes(**changes: Any) -> FakeSaga:
    return FakeSaga(steps=plan.ONLINE_PLAN, **changes)


def calls_until(step: str) -> list[str]:
    """The forward path's calls up to and including `step` (and the guard before it)."""
    calls: list[str] = []
    for name in STEPS:
        calls += [GUARD[name]] if name in GUARD else []
        calls.append(name)
        if name == step:
            return calls
    raise ValueError(step)


def started_until(step: str) -> list[str]:
    return STEPS[: STEPS.index(step) + 1]


def way_back(started: list[str]) -> list[str]:
    """The rollback's calls after `started` steps: each undo, after its guard if it has one, newest first."""
    calls: list[str] = []
    for step in reversed(started):
        if step in UNDO:
            calls += [UNDO_GUARD[UNDO[step]]] if UNDO[step] in UNDO_GUARD else []
            calls.append(UNDO[step])
    return calls


def test_the_mode_chooses_the_plan_and_snapshot_stays_the_default() -> None:
    assert plan.plan_for(migration_input().spec) is plan.PLAN
    assert plan.plan_for(online().spec) is plan.ONLINE_PLAN
    assert tuple(step.name for step in plan.PLAN) == STEP_ORDER
    assert tuple(step.name for step in plan.ONLINE_PLAN) == ONLINE_STEP_ORDER
    assert MIGRATE not in STEPS


async def test_an_online_migration_replicates_before_the_freeze_and_only_catches_up_after_it(run_saga: Run) -> None:
    saga = await run_saga(fakes(), online())

    result = await saga.handle.result()

    assert result.phase is Phase.SUCCEEDED
    assert saga.fakes.step_calls == calls_until(SCALE_DOWN_OLD)
    assert STEPS.index(SNAPSHOT) < STEPS.index(REPLICATE) < STEPS.index(FREEZE) < STEPS.index(CATCH_UP)
    final = saga.final_status
    assert [step.name for step in final.steps] == list(ONLINE_STEP_ORDER)
    assert all(step.state is StepState.SUCCEEDED for step in final.steps)
    replication = final.replication
    assert replication is not None
    assert (replication.publication, replication.tables, replication.tables_synced) == ("ferry_0f1e", 3, 3)
    assert (replication.lag_bytes, replication.frozen_lsn, replication.applied_lsn) == (4096, "0/3000060", "0/3000060")
    assert (replication.sequences, replication.ended) == (2, True)
    window = final.write_downtime
    assert window is not None
    by_name = {step.name: step for step in final.steps}
    assert window.started_at == by_name[StepName.FREEZE].started_at
    assert window.ended_at == by_name[StepName.SWITCH_TRAFFIC].finished_at
    assert final.snapshot is not None, "the recovery snapshot is taken, outside the window"
    assert by_name[StepName.SNAPSHOT].finished_at is not None
    assert by_name[StepName.SNAPSHOT].finished_at < window.started_at
    await record_history(saga, "online-happy-path")


async def test_the_online_plan_compares_the_tables_in_replicate_and_leaves_only_the_rest_in_the_write_downtime(
    run_saga: Run,
) -> None:
    saga = await run_saga(fakes(), online(dryRun=True))

    assert (await saga.handle.result()).phase is Phase.PLANNED

    planned = saga.final_status.plan
    assert planned is not None
    assert planned.steps == list(ONLINE_STEP_ORDER)
    assert planned.estimates is not None
    # 8192 bytes: snapshot at min(read 4096, upload 8192) = 2 s, the initial copy at min(read, write 2048) = 4 s and
    # the tables compared at 4096 = 2 s, all while writes flow; 5 s for freeze, catch-up and verify of the tables
    # written since, while they do not.
    estimates = planned.estimates
    assert (estimates.snapshot_seconds, estimates.replicate_seconds, estimates.migrate_seconds) == (2.0, 6.0, 0.0)
    assert (estimates.write_downtime_seconds, estimates.total_seconds) == (5.0, 18.0)


@pytest.mark.own_time_server  # its replication's watch runs beside a wait
async def test_approval_is_asked_before_the_freeze_while_the_replication_goes_on(run_saga: Run) -> None:
    saga = await run_saga(fakes(), online(approval={"required": True}))
    await saga.wait_for("the approval gate", phase=Phase.AWAITING_APPROVAL.value)

    assert REPLICATE in saga.fakes.calls
    assert FREEZE not in saga.fakes.calls
    assert (await saga.progress()).current_step == StepName.FREEZE
    await saga.handle.signal(Signal.APPROVE.value, ControlRequest(by="alice"))

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    assert saga.final_status.approved_by == "alice"


BROKEN_WHILE_WAITING = ReplicationBroken(
    "the replication of orders into orders-16 broke while the migration waited before the freeze: its workers keep "
    "failing to apply the source's changes"
)
"""What the real watch raises (tests/postgres/test_watch.py); a fake raises it here, when the test wants."""


@pytest.mark.own_time_server  # its replication's watch runs beside a wait
async def test_a_replication_that_breaks_while_awaiting_approval_rolls_back_and_ends_the_replication(
    run_saga: Run,
) -> None:
    saga = await run_saga(fakes(fail={WATCH_REPLICATION: BROKEN_WHILE_WAITING}), online(approval={"required": True}))

    # Before the watch, the run stood AwaitingApproval for as long as nobody answered, the slot keeping the WAL.
    await saga.wait_for("the rollback", phase=Phase.ROLLED_BACK.value)
    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "MigrationRolledBack"
    assert FREEZE not in saga.fakes.calls
    assert saga.fakes.step_calls == [*calls_until(REPLICATE), WATCH_REPLICATION, *way_back(started_until(REPLICATE))]
    final = saga.final_status
    assert final.phase is Phase.ROLLED_BACK
    assert final.message is not None
    assert "replicate failed: broke while the saga waited before freeze: ReplicationBroken" in final.message
    replicate = next(step for step in final.steps if step.name == StepName.REPLICATE)
    assert replicate.state is StepState.COMPENSATED
    assert replicate.last_error is not None
    assert "broke while the migration waited before the freeze" in replicate.last_error
    broke = [event for event in saga.fakes.events if event.reason == "BrokeWhileWaiting"]
    assert len(broke) == 1
    assert "ReplicationBroken" in broke[0].message
    assert "rolling back" in broke[0].message
    await record_history(saga, "online-broke-while-awaiting-approval-own-queue")


@pytest.mark.own_time_server  # its replication's watch runs beside a wait
async def test_an_approval_in_time_cancels_the_watch_and_the_migration_goes_on(run_saga: Run) -> None:
    saga = await run_saga(fakes(), online(approval={"required": True}))
    await saga.wait_for("the watch beside the approval", lambda: saga.fakes.started(WATCH_REPLICATION))
    assert (await saga.progress()).phase is Phase.AWAITING_APPROVAL

    await saga.handle.signal(Signal.APPROVE.value, ControlRequest(by="alice"))

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    await saga.wait_for("the watch's cancellation", lambda: WATCH_REPLICATION in saga.fakes.cancelled)
    calls = saga.fakes.step_calls
    assert calls.count(WATCH_REPLICATION) == 1
    assert calls.index(REPLICATE) < calls.index(WATCH_REPLICATION) < calls.index(FREEZE)
    assert saga.fakes.inputs[WATCH_REPLICATION][0]["ref"]["uid"] == saga.fakes.inputs[REPLICATE][0]["ref"]["uid"]
    await record_history(saga, "online-watched-while-awaiting-approval-own-queue")


@pytest.mark.own_time_server  # its replication's watch runs beside a wait
async def test_a_migration_waiting_with_its_watch_leaves_the_workers_activity_slots_to_another_migrations_steps(
    run_saga: Run,
) -> None:
    shared = fakes()
    waiting = await run_saga(shared, online(approval={"required": True}), activity_slots=1)
    await waiting.wait_for("the watch beside the approval", lambda: shared.started(WATCH_REPLICATION))
    assert (await waiting.progress()).phase is Phase.AWAITING_APPROVAL

    # Before, the watch held the worker's one activity slot for the whole wait, on the run's own task queue: the other
    # Migration's first step waited in that queue until an approval came.
    other = await run_saga(shared, online("customers-db-to-16"), new_workers=False)
    await other.wait_for("the other Migration's every step, on the one activity slot", phase=Phase.SUCCEEDED.value)

    assert (await waiting.progress()).phase is Phase.AWAITING_APPROVAL
    assert WATCH_REPLICATION not in shared.cancelled, "the first one is watched all along"
    assert shared.step_calls.count(SCALE_DOWN_OLD) == 1
    await waiting.handle.signal(Signal.APPROVE.value, ControlRequest(by="alice"))
    assert (await waiting.handle.result()).phase is Phase.SUCCEEDED


async def test_without_a_wait_before_the_freeze_nothing_is_watched(run_saga: Run) -> None:
    saga = await run_saga(fakes(), online())

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    assert WATCH_REPLICATION not in saga.fakes.calls


@pytest.mark.own_time_server  # its replication's watch runs beside a wait
async def test_a_replication_that_breaks_while_paused_under_the_pause_policy_is_undone_and_retry_replicates_again(
    run_saga: Run,
) -> None:
    saga = await run_saga(
        fakes(fail={WATCH_REPLICATION: BROKEN_WHILE_WAITING}, fail_times={WATCH_REPLICATION: 1}, hold={REPLICATE}),
        online(failurePolicy="Pause"),
    )
    await saga.wait_for("replicate", lambda: saga.fakes.started(REPLICATE))
    await saga.handle.signal(Signal.PAUSE.value, ControlRequest(by="carol"))
    saga.fakes.release()
    await saga.wait_for("the failure pause", lambda: saga.fakes.undo_calls == [UNDO_REPLICATE])

    assert FREEZE not in saga.fakes.calls
    paused = await saga.progress()
    assert paused.phase is Phase.PAUSED
    assert paused.message is not None
    assert "broke while the saga waited before freeze" in paused.message
    await saga.handle.signal(Signal.RESUME.value, ControlRequest(by="carol"))
    await saga.handle.signal(Signal.RETRY.value, ControlRequest(by="carol"))

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    assert saga.fakes.step_calls.count(REPLICATE) == 2


@pytest.mark.parametrize("failing", STEPS)
async def test_a_failure_at_an_online_step_undoes_every_started_step_in_reverse(run_saga: Run, failing: str) -> None:
    saga = await run_saga(fakes(fail={failing: InvalidSpec(f"{failing} cannot work")}), online())

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "MigrationRolledBack"
    assert saga.fakes.step_calls == [*calls_until(failing), *way_back(started_until(failing))]
    final = saga.final_status
    assert final.phase is Phase.ROLLED_BACK
    if failing in (REPLICATE, CATCH_UP) or STEPS.index(failing) > STEPS.index(CATCH_UP):
        assert UNDO_REPLICATE in saga.fakes.undo_calls
        assert final.replication is None or final.replication.ended


async def test_after_catch_up_a_rollback_ends_the_replication_unfreezes_then_empties_the_target(run_saga: Run) -> None:
    saga = await run_saga(
        fakes(fail={VERIFY: VerificationMismatch("index public.by_sku (missing in the target)")}), online()
    )

    with pytest.raises(WorkflowFailureError):
        await saga.handle.result()

    undos = saga.fakes.undo_calls
    assert undos == [UNDO_CATCH_UP, UNDO[FREEZE], UNDO_REPLICATE, UNDO[SNAPSHOT], UNDO[PROVISION]]
    final = saga.final_status
    assert final.replication is not None
    assert final.replication.ended
    verify = next(step for step in final.steps if step.name == StepName.VERIFY)
    assert verify.last_error == "VerificationMismatch: index public.by_sku (missing in the target)"


async def test_a_cancel_during_replicate_undoes_it_without_a_result(run_saga: Run) -> None:
    saga = await run_saga(fakes(hold={REPLICATE}), online())
    await saga.wait_for("replicate to start", lambda: saga.fakes.started(REPLICATE))

    await saga.handle.signal(Signal.ROLLBACK.value, ControlRequest(by="alice", reason="wrong target"))

    assert (await saga.handle.result()).phase is Phase.ROLLED_BACK
    assert saga.fakes.cancelled == [REPLICATE]
    assert saga.fakes.undo_calls == [UNDO_REPLICATE, UNDO[SNAPSHOT], UNDO[PROVISION]]
    assert saga.fakes.inputs[UNDO_REPLICATE][0]["ref"]["uid"], "the undo finds the replication by the Migration"


async def test_under_the_pause_policy_a_failed_catch_up_undoes_back_to_replicate_and_retry_replicates_again(
    run_saga: Run,
) -> None:
    broken = ReplicationBroken("the target has applied nothing for 60s")
    saga = await run_saga(fakes(fail={CATCH_UP: broken}, fail_times={CATCH_UP: 1}), online(failurePolicy="Pause"))
    await saga.wait_for("the failure pause", phase=Phase.PAUSED.value)

    assert saga.fakes.undo_calls == [UNDO_CATCH_UP, UNDO[FREEZE], UNDO_REPLICATE], "the snapshot stays"
    paused = await saga.progress()
    assert paused.message is not None
    assert "undone back to before replicate), so retry runs again from replicate" in paused.message
    states = {step.name: step.state for step in paused.steps}
    assert states[StepName.FREEZE] is StepState.COMPENSATED
    assert states[StepName.SNAPSHOT] is StepState.SUCCEEDED
    await saga.handle.signal(Signal.RETRY.value, ControlRequest(by="dave"))

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    calls = saga.fakes.step_calls
    assert [calls.count(name) for name in (SNAPSHOT, REPLICATE, FREEZE, CATCH_UP)] == [1, 2, 2, 2]
    await record_history(saga, "online-pause-policy-retry")


async def test_under_the_pause_policy_a_failed_replicate_waits_with_writes_flowing_and_nothing_undone(
    run_saga: Run,
) -> None:
    saga = await run_saga(
        fakes(fail={REPLICATE: InvalidSpec("wal_level is replica")}, fail_times={REPLICATE: 1}),
        online(failurePolicy="Pause"),
    )
    await saga.wait_for("the failure pause", phase=Phase.PAUSED.value)

    assert saga.fakes.undo_calls == []
    assert FREEZE not in saga.fakes.calls
    await saga.handle.signal(Signal.RETRY.value, ControlRequest(by="dave"))
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    assert saga.fakes.step_calls.count(REPLICATE) == 2


async def test_a_precheck_refusal_ends_an_online_migration_before_anything_changes(run_saga: Run) -> None:
    saga = await run_saga(fakes(fail={PRECHECK: InvalidSpec("wal_level=replica")}), online())

    with pytest.raises(WorkflowFailureError):
        await saga.handle.result()

    assert saga.fakes.step_calls == [CHECK_CLUSTER, PRECHECK]


async def test_undoing_a_succeeded_online_migration_ends_its_replication_and_empties_the_target(
    time_skipping: WorkflowEnvironment, task_queue: str
) -> None:
    fake = fakes()
    migration = online()
    input = UndoMigrationInput(ref=migration.ref, generation=1, spec=migration.spec, reason="deleted while it ran")
    async with Worker(
        time_skipping.client, task_queue=task_queue, workflows=[MigrationUndoWorkflow], activities=fake.activities()
    ):
        result = await time_skipping.client.execute_workflow(
            UNDO_WORKFLOW_NAME,
            input,
            id=undo_workflow_id(input.ref),
            task_queue=task_queue,
            result_type=MigrationResult,
        )

    assert result.phase is Phase.ROLLED_BACK
    assert fake.undo_calls == [UNDO[name] for name in reversed(STEPS) if name in UNDO]
    assert (
        fake.undo_calls.index(UNDO_CATCH_UP)
        < fake.undo_calls.index(UNDO[FREEZE])
        < fake.undo_calls.index(UNDO_REPLICATE)
    )
    assert SWITCH_TRAFFIC in UNDO


def test_an_online_spec_round_trips_with_its_defaults() -> None:
    spec = online().spec
    assert spec.driver.mode.value == "Online"
    assert (spec.driver.max_lag, spec.driver.allow_replica_identity_full) == ("16Mi", False)
    assert (spec.timeouts.replicate, spec.timeouts.catch_up) == (7200, 600)
    again = MigrationSpec.model_validate(spec.model_dump(mode="json", by_alias=True))
    assert again == spec
    assert spec.model_dump(mode="json", by_alias=True)["driver"]["allowReplicaIdentityFull"] is False
