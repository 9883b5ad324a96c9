"""The claim a run carries: what its digest covers, which runs the gate remembers, and what it lets a run do once
its Migration is gone."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput

from ferry.api.integrity import (
    CLAIM_HEADER,
    Claim,
    Scope,
    claim_of,
    digest,
    is_undo,
    plan_digest,
    signature,
    workflow_ids,
)
from ferry.api.migration import MigrationSpec
from ferry.api.saga import (
    UNDO_WORKFLOW_NAME,
    WORKFLOW_NAME,
    DeleteSnapshotInput,
    KubeActivity,
    MigrationInput,
    MigrationRef,
    SnapshotResult,
    undo_workflow_id,
    workflow_id,
)
from tests import samples
from worker.gate import MigrationGate, PassedRuns, _Gate, _to_payload
from worker.settings import WorkerSettings

pytestmark = pytest.mark.unit

SPEC = MigrationSpec.model_validate(samples.migration("orders-db-to-16")["spec"])
REF = MigrationRef(namespace="shop", name="orders-db-to-16", uid=str(uuid.uuid4()))


def test_the_plan_digest_ignores_the_control_field_paused_and_nothing_else() -> None:
    paused = SPEC.model_copy(update={"paused": True})
    other_image = SPEC.model_copy(update={"target": SPEC.target.model_copy(update={"image": "postgres:17"})})

    assert plan_digest(paused) == plan_digest(SPEC)
    assert plan_digest(other_image) != plan_digest(SPEC)


def test_a_runs_claim_comes_from_its_input_and_a_cleanups_covers_only_the_snapshot() -> None:
    run = claim_of(MigrationInput(ref=REF, generation=3, spec=SPEC))
    artifact = SnapshotResult(bucket="b", key="k", sha256="ab" * 32, size_bytes=1)
    cleanup = claim_of(DeleteSnapshotInput(ref=REF, snapshot=SPEC.snapshot, artifact=artifact))

    assert run is not None
    assert (run.ref, run.scope, run.digest, run.vouched) == (REF, Scope.PLAN, plan_digest(SPEC), False)
    assert cleanup is not None
    assert cleanup.digest == digest(SPEC.model_copy(update={"paused": True}), Scope.SNAPSHOT)
    assert claim_of("anything else") is None


def test_only_the_migrations_own_workflow_ids_may_act_for_it() -> None:
    assert workflow_id(REF) in workflow_ids(REF)
    assert workflow_id(REF.model_copy(update={"uid": str(uuid.uuid4())})) not in workflow_ids(REF)


@pytest.mark.parametrize(
    ("activity", "undoes"),
    [("postgresql.undo_freeze", True), ("undo_provision", True), ("delete_snapshot", True), ("provision", False)],
)
def test_undos_are_known_by_name(activity: str, undoes: bool) -> None:
    assert is_undo(activity) is undoes


def test_the_gate_remembers_a_bounded_number_of_runs_newest_kept() -> None:
    passed = PassedRuns(size=2)
    for run in ("a", "b", "c"):
        passed.add((run, "d"))

    assert not passed.seen(("a", "d"))
    assert passed.seen(("b", "d"))
    assert passed.seen(("c", "d"))


def test_a_claims_signature_is_bound_to_its_key_its_run_its_activity_and_all_it_says() -> None:
    claim = claim_of(MigrationInput(ref=REF, generation=1, spec=SPEC))
    assert claim is not None
    key = b"k" * 32
    signed = signature(key, claim, workflow_id(REF), "run-1", "provision")

    assert signed == signature(
        key, claim.model_copy(update={"signature": "anything"}), workflow_id(REF), "run-1", "provision"
    )
    assert signed != signature(b"x" * 32, claim, workflow_id(REF), "run-1", "provision")
    assert signed != signature(key, claim, workflow_id(REF), "run-2", "provision")
    assert signed != signature(key, claim, workflow_id(REF), "run-1", "undo_provision")
    assert signed != signature(key, claim.model_copy(update={"vouched": True}), workflow_id(REF), "run-1", "provision")


def test_a_claim_key_shorter_than_32_characters_is_refused() -> None:
    with pytest.raises(ValidationError, match="at least 32 characters"):
        WorkerSettings(claim_key=SecretStr("short"))


class _Ran(ActivityInboundInterceptor):
    """What the gate lets through reaches this; it records the call instead of running an activity."""

    def __init__(self) -> None:
        self.ran = False

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        self.ran = True
        return None


async def _through_the_gate(
    activity_type: str,
    claim: Claim,
    live: dict[str, Any] | None,
    *,
    workflow: str = workflow_id(REF),
    workflow_type: str = WORKFLOW_NAME,
) -> bool:
    """Whether the gate lets `activity_type` of a run of `workflow` (of `workflow_type`; the Migration's own saga by
    default) through, the Migration read being `live`."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        workflow_id=workflow,
        workflow_type=workflow_type,
        workflow_run_id="run-1",
        activity_type=activity_type,
    )
    ran = _Ran()
    gate = _Gate(ran, MigrationGate(lambda ref: live))
    call = ExecuteActivityInput(fn=lambda: None, args=[], executor=None, headers={CLAIM_HEADER: _to_payload(claim)})
    try:
        await env.run(gate.execute_activity, call)
    except ApplicationError as refused:
        if not refused.non_retryable:
            raise
        return False
    return ran.ran


@pytest.mark.parametrize(
    "activity_type",
    ["undo_switch_traffic", "postgresql.undo_freeze", "postgresql.check_unwritten", KubeActivity.MIRROR_STATUS.value],
)
async def test_a_run_that_passed_the_gate_takes_back_what_it_did_once_its_migration_is_gone(activity_type: str) -> None:
    """A finalizer removed by hand, or a deletion given up at its deadline: the run's undos go on, and so does the
    check that guards switch-traffic's undo, without which the rollback stopped there with traffic on the target
    and the source frozen."""
    vouched = Claim(ref=REF, scope=Scope.PLAN, digest=plan_digest(SPEC), vouched=True)

    assert await _through_the_gate(activity_type, vouched, live=None)


@pytest.mark.parametrize("activity_type", ["provision", "postgresql.snapshot", "switch_traffic"])
async def test_a_run_whose_migration_is_gone_takes_no_step_forward(activity_type: str) -> None:
    vouched = Claim(ref=REF, scope=Scope.PLAN, digest=plan_digest(SPEC), vouched=True)

    assert not await _through_the_gate(activity_type, vouched, live=None)


async def test_a_run_that_never_found_its_migration_takes_nothing_back() -> None:
    never_passed = Claim(ref=REF, scope=Scope.PLAN, digest=plan_digest(SPEC), vouched=False)

    assert not await _through_the_gate("postgresql.check_unwritten", never_passed, live=None)
    assert not await _through_the_gate("postgresql.undo_freeze", never_passed, live=None)


def _live(phase: str | None, run: str | None, workflow: str = workflow_id(REF)) -> dict[str, Any]:
    """The Migration as read: its spec, and a status naming `run` of `workflow` in `phase`."""
    status: dict[str, Any] = {} if phase is None else {"phase": phase}
    if run is not None:
        status["workflow"] = {"namespace": "default", "id": workflow, "runId": run}
    return {
        "metadata": {"uid": REF.uid, "finalizers": ["ferry.dev/migration"]},
        "spec": samples.migration("orders-db-to-16")["spec"],
        "status": status,
    }


@pytest.mark.parametrize("phase", ["Succeeded", "RolledBack", "Failed", "Abandoned", "Planned"])
@pytest.mark.parametrize(
    "activity_type", ["postgresql.precheck", "undo_switch_traffic", "postgresql.undo_migrate", "mirror_status"]
)
async def test_another_run_of_a_finished_migrations_workflow_does_nothing_at_all(
    phase: str, activity_type: str
) -> None:
    """A reset of the closed run (temporal workflow reset), or a start by hand under its ID once it closed: replaying
    the finished run's history to some point, it would act on a world that moved on, and write a phase over the one
    the Migration ended in. Neither steps, undos nor status writes."""
    claim = Claim(ref=REF, scope=Scope.PLAN, digest=plan_digest(SPEC), vouched=True)

    assert not await _through_the_gate(activity_type, claim, _live(phase, run="run-0"))


@pytest.mark.parametrize(
    ("phase", "run", "workflow"),
    [
        ("Succeeded", "run-1", workflow_id(REF)),  # its own run, writing its last status
        ("Running", "run-0", workflow_id(REF)),  # a run reset while it runs: the guards of each step decide
        ("Succeeded", "run-0", "cleanup/shop/orders-db-to-16/x"),  # some other workflow's write: not a finisher
        ("Succeeded", None, workflow_id(REF)),  # no run named (an older ferry): nothing to tell
        (None, None, workflow_id(REF)),
    ],
    ids=["its-own-last-write", "reset-while-running", "another-workflows-write", "no-run-named", "no-status"],
)
async def test_the_run_that_finished_and_runs_of_a_migration_still_going_pass(
    phase: str | None, run: str | None, workflow: str
) -> None:
    claim = Claim(ref=REF, scope=Scope.PLAN, digest=plan_digest(SPEC), vouched=True)

    assert await _through_the_gate("postgresql.precheck", claim, _live(phase, run, workflow))


@pytest.mark.parametrize(
    ("workflow", "workflow_type"),
    [(workflow_id(REF), UNDO_WORKFLOW_NAME), (undo_workflow_id(REF), WORKFLOW_NAME), (workflow_id(REF), "Forger")],
    ids=["undo-under-the-sagas-id", "saga-under-the-undos-id", "another-type"],
)
async def test_a_run_under_one_of_the_migrations_workflow_ids_must_be_that_ids_workflow(
    workflow: str, workflow_type: str
) -> None:
    """The undo acts only while its Migration is being deleted, a rule tied to its own ID: started under the saga's ID
    (with `--id-conflict-policy TerminateExisting`, say) it would roll a live migration back with no deletion."""
    claim = Claim(ref=REF, scope=Scope.PLAN, digest=plan_digest(SPEC), vouched=True)

    assert not await _through_the_gate(
        "undo_switch_traffic", claim, _live(None, None), workflow=workflow, workflow_type=workflow_type
    )


async def test_the_saga_may_not_act_once_the_undo_of_its_deletion_finished_the_migration_nor_a_later_undo() -> None:
    """The undo of a deletion finishes the Migration (RolledBack) in a run of its own workflow: a reset of the saga then
    acts on nothing, nor does another run of the undo. The undo's own first run acts, though the status names the
    saga's finished run: it starts after the saga finished."""
    claim = Claim(ref=REF, scope=Scope.PLAN, digest=plan_digest(SPEC), vouched=True)
    deleting = _live("RolledBack", "undo-run-0", undo_workflow_id(REF))
    deleting["metadata"]["deletionTimestamp"] = "2026-11-29T04:00:00Z"

    assert not await _through_the_gate("postgresql.precheck", claim, deleting)
    assert not await _through_the_gate(
        "undo_switch_traffic", claim, deleting, workflow=undo_workflow_id(REF), workflow_type=UNDO_WORKFLOW_NAME
    )
    succeeded = _live("Succeeded", "run-0")
    succeeded["metadata"]["deletionTimestamp"] = "2026-11-29T04:00:00Z"
    assert await _through_the_gate(
        "undo_switch_traffic", claim, succeeded, workflow=undo_workflow_id(REF), workflow_type=UNDO_WORKFLOW_NAME
    )
