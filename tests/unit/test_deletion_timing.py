"""When a deleted Migration's run succeeded, as the watcher judges it: before the deletion (kept) or after (undone).

The success is dated by the saga's clock (Temporal's: steps' finishedAt, transitionedAt, the run's close time), the
deletion by the API server's (deletionTimestamp): two machines. What ferry reads first needs neither: when the saga
last changed its status fields, as the API server stamped it in managedFields.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ferry.api.migration import (
    CLOCK_SKEW_ALLOWANCE,
    SAGA_FIELD_MANAGER,
    SUCCESS_SHOWN_FIRST,
    Migration,
    MigrationStatus,
    ObjectMeta,
    Phase,
    SuccessTiming,
)
from watcher.deletion import keeping_what_was_shown

pytestmark = pytest.mark.unit

DELETED = datetime(2026, 11, 25, 10, 0, 0, tzinfo=UTC)
"""A deletionTimestamp: whole seconds, by the API server's clock."""
AHEAD = timedelta(minutes=10)
"""How far Temporal's clock runs ahead of the API server's in the skewed cases."""
STEPS = ("precheck", "provision", "freeze", "snapshot", "migrate", "verify", "switch-traffic", "scale-down-old")


def _at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _entry(manager: str, written: datetime, subresource: str = "status") -> dict[str, Any]:
    """A managedFields entry as the API server returns it: whole seconds, with the fields it owns."""
    return {
        "manager": manager, "operation": "Apply", "apiVersion": "ferry.dev/v1alpha1",
        "time": written.strftime("%Y-%m-%dT%H:%M:%SZ"), "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {"f:phase": {}, "f:steps": {}, "f:transitionedAt": {}}}, "subresource": subresource,
    }  # fmt: skip


def succeeded(
    at: datetime, *, saga_wrote: datetime | None = None, deleted: datetime | None = DELETED, **status: Any
) -> Migration:
    """A Migration whose status says Succeeded, its last step finished `at` and its Succeeded write stamped `at` (by
    Temporal's clock); `saga_wrote`: when the API server last saw the saga change its status (None: no managedFields,
    as a client that strips them would read it)."""
    metadata: dict[str, Any] = {"name": "m", "namespace": "shop", "uid": "u"}
    if deleted is not None:
        metadata["deletionTimestamp"] = deleted.strftime("%Y-%m-%dT%H:%M:%SZ")
    if saga_wrote is not None:
        metadata["managedFields"] = [
            _entry("kubectl-client-side-apply", saga_wrote - timedelta(hours=1), subresource=""),
            _entry(SAGA_FIELD_MANAGER, saga_wrote),
        ]
    steps = [{"name": name, "state": "Succeeded", "finishedAt": _at(at)} for name in STEPS]
    raw_status = {"phase": "Succeeded", "transitionedAt": _at(at), "steps": steps, **status}
    return Migration.parse({"metadata": metadata, "status": raw_status})


# --- the fact first: the success was written before the deletion, by the API server's clock ------------------------


def test_a_success_written_before_the_deletion_is_kept_however_far_ahead_temporals_clock_runs() -> None:
    """`kubectl wait --for=condition=Succeeded`, then `kubectl delete` 30 s later, with Temporal's clock 10 minutes
    ahead: every time the saga wrote says after the deletion; the API server saw the write before it."""
    real_success = DELETED - timedelta(seconds=30)
    migration = succeeded(real_success + AHEAD, saga_wrote=real_success)

    assert migration.success_timing() is SuccessTiming.SHOWN_FIRST
    assert migration.success_timing(closed=real_success + AHEAD + timedelta(seconds=1)) is SuccessTiming.SHOWN_FIRST
    assert not migration.may_still_undo


def test_a_success_written_in_the_second_of_the_deletion_counts_as_before() -> None:
    """Both times have whole seconds: the rule is never to undo a migration someone deleted after it finished."""
    assert succeeded(DELETED + AHEAD, saga_wrote=DELETED).success_timing() is SuccessTiming.SHOWN_FIRST


def test_without_managed_fields_the_clocks_decide_and_a_skew_beyond_the_allowance_is_not_covered() -> None:
    """What is left when the fact is missing (a client that strips managedFields): Temporal's clock 10 minutes ahead
    makes a success before the deletion read as after it. Written down so a change of the allowance is a choice."""
    migration = succeeded(DELETED - timedelta(seconds=30) + AHEAD)

    assert migration.success_timing() is SuccessTiming.AFTER


def test_without_managed_fields_a_skew_within_the_allowance_keeps_the_success() -> None:
    ahead = CLOCK_SKEW_ALLOWANCE - timedelta(seconds=31)
    migration = succeeded(DELETED - timedelta(seconds=30) + ahead)

    assert migration.success_timing() is SuccessTiming.WITHIN_ALLOWANCE
    assert migration.success_timing().kept
    assert not migration.may_still_undo


def test_the_entries_of_other_managers_do_not_count() -> None:
    """The watcher's (status.deletion), the progress writer's and the precheck's writes are no success."""
    migration = succeeded(DELETED + timedelta(minutes=5), saga_wrote=DELETED + timedelta(minutes=5))
    raw_metadata = migration.metadata.model_dump(by_alias=True, mode="json")
    raw_metadata["managedFields"] = [
        _entry(manager, DELETED - timedelta(minutes=1))
        for manager in ("ferry-watcher", "ferry-progress", "ferry-precheck")
    ] + [_entry(SAGA_FIELD_MANAGER, DELETED + timedelta(minutes=5))]
    others_earlier = Migration.parse({"metadata": raw_metadata, "status": migration.status.model_dump(by_alias=True)})

    assert others_earlier.success_timing() is SuccessTiming.AFTER


def test_a_saga_write_after_the_deletion_leaves_the_decision_to_the_clocks() -> None:
    """The saga writes again after the write that showed the success (its retention cleanup's, the write saying
    Succeeded, a failed write tried again): its entry's time is then later, which only errs toward the clocks."""
    last_step = DELETED - timedelta(seconds=5)
    migration = succeeded(last_step, saga_wrote=DELETED + timedelta(seconds=20))

    assert migration.success_timing() is SuccessTiming.BEFORE


def test_the_watchers_record_that_the_success_was_shown_first_outlasts_the_sagas_later_writes() -> None:
    """Recorded while the run closed (status.deletion); its Succeeded write came after the deletion."""
    waiting = {
        "message": f"its run has succeeded and is closing, and {SUCCESS_SHOWN_FIRST}; the finalizer ...",
        "waitingSince": _at(DELETED), "deadline": _at(DELETED + timedelta(minutes=30)),
    }  # fmt: skip
    migration = succeeded(DELETED + AHEAD, saga_wrote=DELETED + timedelta(seconds=40), deletion=waiting)

    assert migration.success_timing() is SuccessTiming.SHOWN_FIRST
    assert not migration.may_still_undo


def test_the_record_that_the_success_was_shown_first_outlasts_the_wait_for_the_retention_cleanup() -> None:
    """Once the run has closed, the next reason the deletion waits is its retention cleanup (afterSuccess:
    DeleteWithMigration, the default): written without the record, the pass after the cleanup dated the success by the
    clocks alone, ten minutes after the deletion by Temporal's, and undid it."""
    waiting = {
        "message": f"its run has succeeded and is closing, and {SUCCESS_SHOWN_FIRST}; the finalizer ...",
        "waitingSince": _at(DELETED), "deadline": _at(DELETED + timedelta(minutes=30)),
    }  # fmt: skip
    closed = succeeded(DELETED + AHEAD, saga_wrote=DELETED + timedelta(seconds=40), deletion=waiting)

    why = keeping_what_was_shown(closed, "deleting the snapshot (retention) before deletion")

    after_the_cleanup = succeeded(
        DELETED + AHEAD, saga_wrote=DELETED + timedelta(seconds=40), deletion={**waiting, "message": f"{why}; ..."}
    )
    assert after_the_cleanup.success_timing() is SuccessTiming.SHOWN_FIRST
    assert keeping_what_was_shown(closed, why) == why, "once"
    never_shown = succeeded(DELETED + AHEAD, saga_wrote=DELETED + timedelta(seconds=40))
    assert keeping_what_was_shown(never_shown, "deleting the snapshot") == "deleting the snapshot"


def test_a_status_that_shows_no_success_is_no_fact_of_one() -> None:
    """The saga's last write before the deletion said Running: the run's close time decides."""
    metadata = {
        "name": "m", "uid": "u", "deletionTimestamp": DELETED.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "managedFields": [_entry(SAGA_FIELD_MANAGER, DELETED - timedelta(seconds=30))],
    }  # fmt: skip
    running = Migration.parse({"metadata": metadata, "status": {"phase": "AwaitingApproval"}})

    assert running.success_timing() is SuccessTiming.UNKNOWN
    assert running.success_timing(closed=DELETED + timedelta(minutes=5)) is SuccessTiming.AFTER


# --- then the clocks, with the allowance in favour of keeping ------------------------------------------------------


def test_a_success_clearly_after_the_deletion_is_undone() -> None:
    """The leader died between the deletion and the cancel, and the run succeeded minutes later: a rollback asked."""
    migration = succeeded(
        DELETED + CLOCK_SKEW_ALLOWANCE + timedelta(seconds=30), saga_wrote=DELETED + timedelta(minutes=3)
    )

    assert migration.success_timing() is SuccessTiming.AFTER
    assert migration.may_still_undo


def test_a_success_within_the_allowance_after_the_deletion_is_kept() -> None:
    migration = succeeded(DELETED + CLOCK_SKEW_ALLOWANCE, saga_wrote=DELETED + CLOCK_SKEW_ALLOWANCE)

    assert migration.success_timing() is SuccessTiming.WITHIN_ALLOWANCE


def test_a_temporal_clock_behind_errs_toward_keeping() -> None:
    """Temporal's clock 10 minutes behind: a success 5 minutes after the deletion reads as before it, and is kept."""
    really = DELETED + timedelta(minutes=5)
    migration = succeeded(really - AHEAD, saga_wrote=really)

    assert migration.success_timing() is SuccessTiming.BEFORE


def test_a_success_within_the_second_of_the_deletion_counts_as_before() -> None:
    assert succeeded(DELETED + timedelta(seconds=0.4)).success_timing() is SuccessTiming.BEFORE


def test_a_run_that_closed_before_the_deletion_succeeded_before_it_whatever_the_status_says() -> None:
    """A run closes after its success, by the same clock: the earlier of the two counts."""
    late_status = succeeded(DELETED + timedelta(minutes=5))

    assert late_status.success_timing(closed=DELETED - timedelta(seconds=2)) is SuccessTiming.BEFORE


def test_a_success_is_dated_by_its_last_step_not_by_the_succeeded_write() -> None:
    last_step = DELETED - timedelta(seconds=5)
    migration = succeeded(last_step, transitionedAt=_at(DELETED + timedelta(minutes=5)))

    assert migration.status.succeeded_at == last_step
    assert migration.success_timing() is SuccessTiming.BEFORE


def test_not_deleted_says_nothing() -> None:
    assert succeeded(DELETED, deleted=None).success_timing() is SuccessTiming.UNKNOWN


@pytest.mark.parametrize(
    ("after", "written"),
    [
        (timedelta(seconds=-30), None),
        (timedelta(seconds=30), None),
        (timedelta(minutes=5), None),
        (timedelta(minutes=5), timedelta(seconds=-30)),
        (timedelta(minutes=5), timedelta(minutes=5)),
        (timedelta(seconds=0), timedelta(seconds=0)),
    ],
)
def test_may_still_undo_says_yes_exactly_when_the_watcher_would_undo(
    after: timedelta, written: timedelta | None
) -> None:
    """Another Migration is refused the target or the source of one the watcher may still undo: the two must agree."""
    migration = succeeded(DELETED + after, saga_wrote=None if written is None else DELETED + written)

    assert migration.may_still_undo is (migration.success_timing() is SuccessTiming.AFTER)


# --- what the watcher keeps of managedFields --------------------------------------------------------------------------


def test_only_the_sagas_status_entry_is_kept_and_none_of_its_fields() -> None:
    """The watcher may hold ten thousand Migrations whole: fieldsV1 is most of an object's metadata."""
    migration = succeeded(DELETED, saga_wrote=DELETED)
    raw_metadata = migration.metadata.model_dump(by_alias=True, mode="json")
    raw_metadata["managedFields"] = [
        _entry("ferry-watcher", DELETED), _entry("ferry-progress", DELETED), _entry(SAGA_FIELD_MANAGER, DELETED),
        _entry(SAGA_FIELD_MANAGER, DELETED, subresource=""),
    ]  # fmt: skip
    migration = Migration.parse({"metadata": raw_metadata})

    [entry] = migration.metadata.managed_fields
    assert (entry.manager, entry.subresource, entry.time) == (SAGA_FIELD_MANAGER, "status", DELETED)
    assert set(type(entry).model_fields) == {"manager", "subresource", "time"}


# --- times without a zone -----------------------------------------------------------------------------------------


def test_a_time_without_a_zone_in_a_status_edited_by_hand_is_read_as_utc() -> None:
    """Kept naive, it raised TypeError at its first comparison with an aware time: the watcher's pass failed at every
    try and never let the Migration go. Refused, it would drop all of status.steps (or status.deletion)."""
    zoneless = (DELETED - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%S")
    steps = [{"name": name, "state": "Succeeded", "startedAt": zoneless, "finishedAt": zoneless} for name in STEPS]
    deletion = {"message": "waiting", "waitingSince": zoneless, "deadline": "2026-11-25T10:30:00"}
    status = {
        "phase": "Succeeded", "transitionedAt": zoneless, "steps": steps, "deletion": deletion,
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "Succeeded", "lastTransitionTime": zoneless}],
        "writeDowntime": {"startedAt": zoneless, "endedAt": zoneless},
        "progress": {"step": "migrate", "updatedAt": zoneless, "summary": "migrate"},
    }  # fmt: skip
    metadata = {"name": "m", "uid": "u", "deletionTimestamp": "2026-11-25T10:00:00"}
    migration = Migration.parse({"metadata": metadata, "status": status})

    assert migration.status_problem is None
    assert migration.success_timing() is SuccessTiming.BEFORE
    assert migration.status.deletion is not None
    assert migration.status.deletion.deadline == DELETED + timedelta(minutes=30)
    read = migration.status
    assert read.progress is not None
    assert read.write_downtime is not None
    for moment in (
        read.transitioned_at, read.steps[0].started_at, read.steps[0].finished_at,
        read.conditions[0].last_transition_time, migration.status.deletion.waiting_since,
        read.write_downtime.started_at, read.write_downtime.ended_at, read.progress.updated_at,
        migration.metadata.deletion_timestamp,
    ):  # fmt: skip
        assert moment is not None
        assert moment.utcoffset() == timedelta(0)


def test_a_time_with_a_zone_keeps_it() -> None:
    moment = datetime.fromisoformat("2026-11-25T12:00:00+02:00")

    assert MigrationStatus(phase=Phase.SUCCEEDED, transitioned_at=moment).transitioned_at == DELETED


# --- which Migrations may still undo --------------------------------------------------------------------------------


def _migration(status: MigrationStatus, deleted: datetime | None = None) -> Migration:
    return Migration(metadata=ObjectMeta(name="m", uid="u", deletion_timestamp=deleted), status=status)


@pytest.mark.parametrize("phase", [None, *(phase for phase in Phase if not phase.finished)])
def test_a_migration_not_finished_may_still_undo_what_it_did(phase: Phase | None) -> None:
    assert _migration(MigrationStatus(phase=phase)).may_still_undo


@pytest.mark.parametrize("phase", [phase for phase in Phase if phase.finished])
def test_a_finished_migration_undoes_nothing_more_unless_deleted_before_it_succeeded(phase: Phase) -> None:
    before = DELETED - timedelta(seconds=12)
    after = DELETED + CLOCK_SKEW_ALLOWANCE + timedelta(seconds=3)

    assert not _migration(MigrationStatus(phase=phase, transitioned_at=before)).may_still_undo
    assert not _migration(MigrationStatus(phase=phase, transitioned_at=before), deleted=DELETED).may_still_undo
    later = _migration(MigrationStatus(phase=phase, transitioned_at=after), deleted=DELETED)
    assert later.may_still_undo is (phase is Phase.SUCCEEDED), "the undo workflow runs only after a success"


def _created(at: datetime | None) -> Migration:
    return Migration(metadata=ObjectMeta(name="m", uid="u", creation_timestamp=at))


def test_a_migration_created_earlier_or_in_the_same_second_counts_as_created_first() -> None:
    """Creation times have whole seconds: of two from one second, each counts as the first, so each may refuse the
    other and never both go on."""
    assert _created(DELETED - timedelta(seconds=1)).created_no_later_than(DELETED)
    assert _created(DELETED).created_no_later_than(DELETED)
    assert not _created(DELETED + timedelta(seconds=1)).created_no_later_than(DELETED)


def test_an_unknown_creation_time_counts_as_created_first() -> None:
    assert _created(None).created_no_later_than(DELETED)
    assert _created(DELETED + timedelta(seconds=1)).created_no_later_than(None), "this Migration is gone"
