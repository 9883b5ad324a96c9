"""Undoing a Migration whose run succeeded after its deletion was asked for: every undo, in reverse, from the world."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from ferry.api.errors import WritesOnTarget
from ferry.api.migration import MigrationStatus, Phase, StepState
from ferry.api.saga import UNDO_WORKFLOW_NAME, MigrationResult, UndoMigrationInput, undo_workflow_id
from tests.workflows.conftest import history_path, migration_input
from tests.workflows.fakes import CHECK_UNWRITTEN, STEP_ACTIVITIES, UNDO, UNDO_GUARD, FakeSaga
from workflows import plan
from workflows.undo import MigrationUndoWorkflow

pytestmark = pytest.mark.timeout(90)


async def undo(client: Client, task_queue: str, fakes: FakeSaga, status: MigrationStatus | None) -> MigrationResult:
    migration = migration_input()
    input = UndoMigrationInput(
        ref=migration.ref, generation=1, spec=migration.spec, reason="deleted while it ran", status=status
    )
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[MigrationUndoWorkflow],
        activities=fakes.activities(),
        max_heartbeat_throttle_interval=timedelta(milliseconds=200),
    ):
        handle = await client.start_workflow(
            UNDO_WORKFLOW_NAME,
            input,
            id=undo_workflow_id(input.ref),
            task_queue=task_queue,
            result_type=MigrationResult,
        )
        result = await handle.result()
        if os.environ.get("FERRY_RECORD_HISTORIES") == "1":
            history = await handle.fetch_history()
            history_path("undo-after-success").write_text(history.to_json())
    return result


async def test_every_step_is_undone_in_reverse_without_the_steps_results(
    time_skipping: WorkflowEnvironment, task_queue: str
) -> None:
    fakes = FakeSaga()

    result = await undo(time_skipping.client, task_queue, fakes, status=None)

    assert result.phase is Phase.ROLLED_BACK
    assert result.message == "rolled back: deleted while it ran"
    undos = [UNDO[name] for name in reversed(STEP_ACTIVITIES) if name in UNDO]
    assert fakes.step_calls == [call for undo in undos for call in (UNDO_GUARD.get(undo), undo) if call is not None]
    assert fakes.step_calls.index(CHECK_UNWRITTEN) == fakes.step_calls.index(UNDO["switch_traffic"]) - 1
    assert fakes.inputs[CHECK_UNWRITTEN][0].get("fence") is None, "the check reads the mark verify left in the target"
    assert fakes.inputs[UNDO["switch_traffic"]][0].get("previousSelector") is None
    assert fakes.inputs[UNDO["scale_down_old"]][0].get("replicas") is None
    assert fakes.inputs[UNDO["postgresql.snapshot"]][0].get("artifact") is None


async def test_writes_on_the_target_since_traffic_moved_stop_the_undo_before_traffic_goes_back(
    time_skipping: WorkflowEnvironment, task_queue: str
) -> None:
    fakes = FakeSaga(fail={CHECK_UNWRITTEN: WritesOnTarget("2 rows were inserted, updated or deleted")})

    with pytest.raises(WorkflowFailureError):
        await undo(time_skipping.client, task_queue, fakes, status=None)

    assert fakes.step_calls == [UNDO["scale_down_old"], CHECK_UNWRITTEN]
    final = fakes.statuses[-1]
    assert final.phase is Phase.FAILED
    assert final.message is not None
    assert "the check before undoing switch-traffic failed (WritesOnTarget: 2 rows were inserted" in final.message


async def test_writes_found_by_the_undo_that_empties_the_target_keep_the_target_and_the_source_as_they_are(
    time_skipping: WorkflowEnvironment, task_queue: str
) -> None:
    """A connection to the target that stayed open wrote after the check (WritesOnTarget faked here; see
    tests/postgres/test_unwritten.py): the Migration's deletion does not remove the target's volumes."""
    taken = "refused to empty database 'orders': it took writes since traffic moved to it: 1 row was inserted"
    fakes = FakeSaga(fail={UNDO["postgresql.migrate"]: WritesOnTarget(taken)})

    with pytest.raises(WorkflowFailureError):
        await undo(time_skipping.client, task_queue, fakes, status=None)

    assert fakes.undo_calls == [UNDO["scale_down_old"], UNDO["switch_traffic"], UNDO["postgresql.migrate"]]
    final = fakes.statuses[-1]
    assert final.phase is Phase.FAILED
    assert final.message is not None
    assert f"the undo of migrate left the target as it is (WritesOnTarget: {taken})" in final.message
    assert final.message.split("(which would remove the target): ")[1].startswith(
        "migrate, snapshot, freeze, provision"
    )


async def test_the_status_goes_on_from_the_succeeded_run(time_skipping: WorkflowEnvironment, task_queue: str) -> None:
    succeeded = MigrationStatus.model_validate(
        {
            "phase": "Succeeded",
            "message": "migrated",
            "steps": [{"name": name, "state": "Succeeded", "attempts": 1} for name in STEP_NAMES],
            "approvedBy": "alice",
        }
    )
    fakes = FakeSaga()

    await undo(time_skipping.client, task_queue, fakes, status=succeeded)

    final = fakes.statuses[-1]
    assert final.phase is Phase.ROLLED_BACK
    assert final.approved_by == "alice"
    states = {step.name: step.state for step in final.steps}
    assert states["verify"] is StepState.SUCCEEDED
    assert states["switch-traffic"] is StepState.COMPENSATED
    assert states["provision"] is StepState.COMPENSATED


STEP_NAMES = ["precheck", "provision", "freeze", "snapshot", "migrate", "verify", "switch-traffic", "scale-down-old"]


@pytest.mark.parametrize(
    "freeze",
    [StepState.RUNNING, StepState.INTERRUPTED],
    ids=["as-the-run-left-it", "marked-interrupted-by-the-watcher"],
)
async def test_given_a_status_the_undo_takes_back_only_the_steps_that_may_have_run(
    freeze: StepState, time_skipping: WorkflowEnvironment, task_queue: str
) -> None:
    """A run whose history went while it froze the source (watcher/deletion.py): the steps after the freeze never ran,
    and the check before switch-traffic's undo, which must reach the target, would hold the rollback for nothing. The
    step after the last one shown begun counts as begun: it may have started before the status said so. The freeze
    shown Interrupted (the watcher marked the Migration Abandoned, watcher/patching.py) is undone as the Running one
    it was: it may have had effects."""
    order = [step.name for step in plan.PLAN]
    shown = {"precheck": StepState.SUCCEEDED, "provision": StepState.SUCCEEDED, "freeze": freeze}
    status = MigrationStatus.model_validate(
        {"phase": "Running", "steps": [{"name": name, "state": shown.get(name, StepState.PENDING)} for name in order]}
    )
    fakes = FakeSaga()

    result = await undo(time_skipping.client, task_queue, fakes, status=status)

    assert result.phase is Phase.ROLLED_BACK
    snapshot, freeze, provision = (UNDO[name] for name in ("postgresql.snapshot", "postgresql.freeze", "provision"))
    assert fakes.step_calls == [UNDO_GUARD[snapshot], snapshot, freeze, provision]
