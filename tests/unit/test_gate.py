"""The claim a run carries: what its digest covers, and which runs the gate remembers."""

from __future__ import annotations

import uuid

import pytest
from pydantic import SecretStr, ValidationError

from ferry.api.integrity import Scope, claim_of, digest, is_undo, plan_digest, signature, workflow_ids
from ferry.api.migration import MigrationSpec
from ferry.api.saga import DeleteSnapshotInput, MigrationInput, MigrationRef, SnapshotResult, workflow_id
from tests import samples
from worker.gate import PassedRuns
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
