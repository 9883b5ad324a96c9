"""When a deleted Migration's run succeeded, as the watcher judges it: before the deletion (kept) or after (undone)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ferry.api.migration import MigrationStatus, Phase
from watcher.deletion import succeeded_before

pytestmark = pytest.mark.unit

DELETED = datetime(2026, 11, 25, 10, 0, 0, tzinfo=UTC)
"""A deletionTimestamp: whole seconds."""


def test_a_success_the_status_showed_before_the_deletion_counts_as_before_however_late_the_run_closed() -> None:
    shown = MigrationStatus(phase=Phase.SUCCEEDED, transitioned_at=DELETED - timedelta(seconds=12))

    assert succeeded_before(shown, DELETED)


def test_a_success_within_the_second_of_the_deletion_counts_as_before() -> None:
    assert succeeded_before(
        MigrationStatus(phase=Phase.SUCCEEDED, transitioned_at=DELETED + timedelta(seconds=0.4)), DELETED
    )


def test_a_success_decided_after_the_deletion_does_not() -> None:
    later = MigrationStatus(phase=Phase.SUCCEEDED, transitioned_at=DELETED + timedelta(seconds=3))

    assert not succeeded_before(later, DELETED)


def test_a_status_that_does_not_say_succeeded_says_nothing_of_when() -> None:
    assert not succeeded_before(MigrationStatus(phase=Phase.RUNNING, transitioned_at=DELETED), DELETED)
    assert not succeeded_before(MigrationStatus(phase=Phase.SUCCEEDED), DELETED)
