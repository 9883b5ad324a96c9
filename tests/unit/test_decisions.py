"""What one pass of the watcher does with a Migration, decided from the object alone."""

from __future__ import annotations

from typing import Any

from ferry.api.migration import FINALIZER, WORKFLOW_ANNOTATION, Migration
from ferry.api.saga import Signal
from tests import samples
from watcher.controls import Control, Rejection
from watcher.decisions import NOTHING, Action, decide, handling_order, started
from watcher.inventory import keep

UID = "0b7c"
WORKFLOW = f"migration/shop/orders-db-to-16/{UID}"


def migration(
    *, finalizers: tuple[str, ...] = (FINALIZER,), annotations: dict[str, str] | None = None,
    deleted: bool = False, spec: dict[str, Any] | None = None, **status: Any,
) -> Migration:  # fmt: skip
    raw = samples.migration("orders-db-to-16")
    raw["metadata"] = {
        "name": "orders-db-to-16", "namespace": "shop", "uid": UID, "generation": 1, "resourceVersion": "1",
        "finalizers": list(finalizers), "annotations": annotations or {},
    }  # fmt: skip
    if deleted:
        raw["metadata"]["deletionTimestamp"] = "2026-11-22T12:30:00Z"
    if spec is not None:
        raw["spec"] = spec
    return Migration.parse({**raw, "status": status})


RUNNING = {"phase": "Running", "workflow": {"namespace": "default", "id": WORKFLOW}}


def test_a_new_migration_gets_its_workflow_then_the_finalizer_before_anything_else() -> None:
    action = decide(migration(finalizers=()))

    assert action == Action(start=True, add_finalizer=True)
    assert action.urgent
    assert action.summary == "start+finalizer"


def test_a_migration_whose_status_names_its_workflow_costs_nothing() -> None:
    assert decide(migration(**RUNNING)) == NOTHING


def test_the_watchers_annotation_says_the_workflow_exists_before_the_saga_wrote_any_status() -> None:
    annotated = migration(annotations={WORKFLOW_ANNOTATION: WORKFLOW})

    assert started(annotated)
    assert decide(annotated).nothing


def test_a_workflow_of_an_earlier_migration_with_the_same_name_does_not_count() -> None:
    earlier = "migration/shop/orders-db-to-16/another-uid"
    created_again = migration(
        annotations={WORKFLOW_ANNOTATION: earlier}, phase="Running", workflow={"namespace": "default", "id": earlier}
    )

    assert decide(created_again).start


def test_a_finished_migration_costs_nothing_even_without_the_finalizer() -> None:
    for phase in ("Succeeded", "RolledBack", "Failed", "Abandoned"):
        assert decide(migration(finalizers=(), phase=phase)).nothing, phase


def test_a_finished_migration_whose_snapshot_goes_with_it_gets_the_finalizer_back_when_it_lost_it() -> None:
    """`kubectl replace` of a manifest without finalizers drops ferry's: the deletion would then skip the retention
    cleanup and leave the snapshot (afterSuccess: DeleteWithMigration) in the bucket."""
    snapshot = {"location": f"s3://ferry-snapshots/{UID}", "sha256": "ab" * 32, "sizeBytes": 1}
    succeeded = {"phase": "Succeeded", "snapshot": snapshot, "workflow": RUNNING["workflow"]}

    assert decide(migration(finalizers=(), **succeeded)) == Action(add_finalizer=True)
    assert keep(migration(finalizers=(), **succeeded)).migration is not None, "a list keeps it for its pass"
    assert decide(migration(**succeeded)).nothing, "held already"
    assert decide(migration(finalizers=(), **{**succeeded, "snapshot": {**snapshot, "deleted": True}})).nothing
    kept = samples.migration("orders-db-to-16")["spec"]
    kept["snapshot"]["retention"] = {"afterSuccess": "Keep"}
    keeping = migration(finalizers=(), spec=kept, **succeeded)
    assert keeping.spec is not None
    assert decide(keeping).nothing
    for phase in ("RolledBack", "Failed", "Abandoned"):
        assert decide(migration(finalizers=(), **{**succeeded, "phase": phase})).nothing, phase


def test_a_finished_migration_with_a_new_control_only_acknowledges_it() -> None:
    action = decide(migration(annotations={"ferry.dev/retry": "bob"}, phase="Succeeded"))

    [control] = action.controls
    assert isinstance(control, Control)
    assert control.signal is Signal.RETRY
    assert action.summary == "controls"


def test_an_acknowledged_control_is_not_given_again() -> None:
    acknowledged = {"acknowledged": {"ferry.dev/retry": "bob"}}
    given = migration(annotations={"ferry.dev/retry": "bob"}, controls=acknowledged, **RUNNING)

    assert decide(given).nothing


def test_controls_given_to_a_migration_being_deleted_are_answered_not_left_waiting() -> None:
    """kubectl ferry waits for an answer in status.controls: silence would read as a watcher that is not running."""
    deleted = migration(deleted=True, annotations={"ferry.dev/approve": "alice"}, **RUNNING)

    action = decide(deleted)

    assert action.deletion
    [refused] = action.controls
    assert isinstance(refused, Rejection)
    assert (refused.key, refused.value) == ("ferry.dev/approve", "alice")
    assert refused.why.startswith("ferry.dev/approve refused: the Migration is being deleted")


def test_a_deleted_migration_goes_to_the_deletion_handler_while_it_holds_the_finalizer() -> None:
    assert decide(migration(deleted=True, **RUNNING)) == Action(deletion=True)


def test_a_deleted_migration_without_the_finalizer_has_its_run_cancelled_until_it_is_finished() -> None:
    """Its deletion landed between the start and the write of the finalizer, another finalizer holding it: the
    object may not say that a run started, so an unfinished one is cancelled whatever it says."""
    held = ("example.com/other",)
    for status in ({}, RUNNING, {"phase": "RollingBack"}):
        action = decide(migration(deleted=True, finalizers=held, **status))
        assert action == Action(cancel=True), status
        assert action.summary == "cancel"
        assert not action.urgent
    for phase in ("Succeeded", "RolledBack", "Failed", "Abandoned"):
        assert decide(migration(deleted=True, finalizers=held, phase=phase)).nothing, phase
    assert decide(migration(deleted=True, finalizers=held, annotations={"ferry.dev/retry": "bob"})).controls == ()


def test_a_migration_the_watch_saw_go_lets_its_secrets_go_however_it_went() -> None:
    """ferry's own release, its finalizer removed by hand, or a deletion it never held: the last state is the same
    (deleted, without ferry's finalizer), and its Secrets may still carry its mark."""
    for state in (
        migration(finalizers=(), deleted=True, phase="RolledBack"),
        migration(finalizers=(), deleted=True, **RUNNING),
        migration(finalizers=("example.com/other",), deleted=True),
        migration(finalizers=(), annotations={"ferry.dev/retry": "bob"}),
    ):
        action = decide(state, gone=True)
        assert action == Action(release_secrets=True)
        assert action.summary == "release-secrets"
        assert not action.urgent


def test_a_migration_whose_spec_does_not_parse_needs_nothing_once_gone() -> None:
    """It never ran, so it never marked a Secret (and its spec names none the watcher could read)."""
    spec = samples.migration()["spec"]
    del spec["target"]["image"]

    assert decide(migration(spec=spec, finalizers=(), deleted=True), gone=True).nothing


def test_an_invalid_spec_fails_the_migration_once() -> None:
    spec = samples.migration()["spec"]
    del spec["target"]["image"]

    action = decide(migration(spec=spec, finalizers=()))

    assert action.invalid_spec is not None
    assert "spec.target.image: Field required" in action.invalid_spec
    assert not action.start
    assert decide(migration(spec=spec, phase="Failed")).nothing


def test_a_run_ended_from_outside_is_checked_only_while_the_status_is_not_finished() -> None:
    assert decide(migration(**RUNNING), run_closed=True) == Action(check_run=True)
    assert decide(migration(phase="Abandoned"), run_closed=True).nothing


def test_a_list_hands_over_the_migrations_no_workflow_has_taken_first_and_keeps_its_order_otherwise() -> None:
    def named(name: str, **status: Any) -> Migration:
        raw = migration(**status).model_dump(mode="json", by_alias=True)
        raw["metadata"].update(name=name, uid=name)
        return Migration.parse({**raw, "spec": samples.migration()["spec"]})

    listed = [
        named("a", phase="Succeeded"),
        named("b", phase="Running", workflow={"namespace": "default", "id": "migration/shop/b/b"}),
        named("new"),
        named("c", phase="Failed"),
    ]

    order = handling_order(listed)

    assert [item.metadata.name for item in order] == ["new", "a", "b", "c"]


def test_a_progress_write_costs_the_watcher_nothing() -> None:
    """snapshot, migrate and verify write status.progress every few seconds; each write is a watch event."""
    progress = {
        "step": "migrate", "attempt": 1, "bytesDone": 1024, "bytesTotal": 4096, "updatedAt": "2026-11-22T12:00:05Z",
        "summary": "migrate: 1.0 KiB of 4.0 KiB",
    }  # fmt: skip
    running = {**RUNNING, "currentStep": "migrate", "steps": [{"name": "migrate", "state": "Running", "attempts": 1}]}

    with_progress = migration(**running, progress=progress)

    assert with_progress.status.progress is not None, "the watcher reads the field"
    assert decide(with_progress) == NOTHING
    assert keep(with_progress).migration is None, "and keeps only the summary it kept before"
    assert keep(with_progress).summary == keep(migration(**running)).summary
