"""When a deleted Migration's run succeeded, as the watcher judges it: before the deletion (kept) or after (undone)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ferry.api.migration import Migration, MigrationStatus, ObjectMeta, Phase

pytestmark = pytest.mark.unit

DELETED = datetime(2026, 11, 25, 10, 0, 0, tzinfo=UTC)
"""A deletionTimestamp: whole seconds."""


def test_a_success_the_status_showed_before_the_deletion_counts_as_before_however_late_the_run_closed() -> None:
    shown = MigrationStatus(phase=Phase.SUCCEEDED, transitioned_at=DELETED - timedelta(seconds=12))

    assert shown.succeeded_before(DELETED)


def test_a_success_within_the_second_of_the_deletion_counts_as_before() -> None:
    within = MigrationStatus(phase=Phase.SUCCEEDED, transitioned_at=DELETED + timedelta(seconds=0.4))

    assert within.succeeded_before(DELETED)


def test_a_success_decided_after_the_deletion_does_not() -> None:
    later = MigrationStatus(phase=Phase.SUCCEEDED, transitioned_at=DELETED + timedelta(seconds=3))

    assert not later.succeeded_before(DELETED)


def test_a_status_that_does_not_say_succeeded_says_nothing_of_when() -> None:
    assert not MigrationStatus(phase=Phase.RUNNING, transitioned_at=DELETED).succeeded_before(DELETED)
    assert not MigrationStatus(phase=Phase.SUCCEEDED).succeeded_before(DELETED)


def _migration(status: MigrationStatus, deleted: datetime | None = None) -> Migration:
    return Migration(metadata=ObjectMeta(name="m", uid="u", deletion_timestamp=deleted), status=status)


@pytest.mark.parametrize("phase", [None, *(phase for phase in Phase if not phase.finished)])
def test_a_migration_not_finished_may_still_undo_what_it_did(phase: Phase | None) -> None:
    assert _migration(MigrationStatus(phase=phase)).may_still_undo


@pytest.mark.parametrize("phase", [phase for phase in Phase if phase.finished])
def test_a_finished_migration_undoes_nothing_more_unless_deleted_before_it_succeeded(phase: Phase) -> None:
    before = DELETED - timedelta(seconds=12)

    assert not _migration(MigrationStatus(phase=phase, transitioned_at=before)).may_still_undo
    assert not _migration(MigrationStatus(phase=phase, transitioned_at=before), deleted=DELETED).may_still_undo
    after = _migration(MigrationStatus(phase=phase, transitioned_at=DELETED + timedelta(seconds=3)), deleted=DELETED)
    assert after.may_still_undo is (phase is Phase.SUCCEEDED), "the undo workflow runs only after a success"


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
