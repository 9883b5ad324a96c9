"""The claim a run carries: what its digest covers, and which runs the gate remembers."""

from __future__ import annotations

import uuid

import pytest

from ferry.api.integrity import Scope, claim_of, digest, is_undo, plan_digest, workflow_ids
from ferry.api.migration import MigrationSpec
from ferry.api.saga import DeleteSnapshotInput, MigrationInput, MigrationRef, SnapshotResult, workflow_id
from tests import samples
from worker.gate import PassedRuns

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
