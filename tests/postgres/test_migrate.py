"""migrate restores the snapshot into the target, whole or not at all, and only the snapshot that was written.

undo_migrate takes back what this Migration restored, and nothing else.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from typing import Any

import pytest

from activities.postgres import unwritten
from devstack.stack.stack import StackInfo
from ferry.api.errors import InvalidSpec, SnapshotCorrupt
from ferry.api.saga import SnapshotResult, UndoMigrateResult
from tests.cluster import eventually
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import as_new, connect, contents, create_shop, database_settings, tables


@pytest.fixture
def snapshot(steps: Steps, databases: Databases) -> SnapshotResult:
    """A snapshot of a small shop, taken from the frozen source."""
    create_shop(databases.source, customers=500, orders=5_000)
    steps.freeze()
    return steps.snapshot()


def _target_tables(databases: Databases) -> list[str]:
    with connect(databases.target) as conn:
        return tables(conn)


def _another_migration(steps: Steps) -> Steps:
    return dataclasses.replace(steps, ref=steps.ref.model_copy(update={"uid": str(uuid.uuid4())}))


def test_migrate_restores_the_snapshot_into_the_target(
    steps: Steps, databases: Databases, snapshot: SnapshotResult
) -> None:
    result = steps.migrate(snapshot)

    assert result.tables == 3
    assert result.bytes_restored == snapshot.size_bytes
    assert contents(databases.target) == contents(databases.source)
    with connect(databases.target) as conn:
        analyzed = conn.execute(
            "select count(distinct (schemaname, tablename)) from pg_stats where schemaname in ('shop', 'audit')"
        ).fetchone()
    assert analyzed == (3,), "the planner has statistics of the restored tables"


def test_migrate_run_again_starts_from_a_clean_target(
    steps: Steps, databases: Databases, snapshot: SnapshotResult
) -> None:
    steps.migrate(snapshot)
    with connect(databases.target) as conn:  # what a half-finished attempt could leave behind
        conn.execute("create schema leftover; create table leftover.junk (id int)")
        conn.execute("delete from audit.log where id % 2 = 0")
        conn.execute("create table public.stray (id int)")

    steps.migrate(snapshot)

    assert contents(databases.target) == contents(databases.source)
    assert _target_tables(databases) == ["audit.log", "shop.customers", "shop.orders"]


def test_migrate_refuses_a_target_holding_data_it_did_not_restore(
    steps: Steps, databases: Databases, snapshot: SnapshotResult
) -> None:
    with connect(databases.target) as conn:
        conn.execute("create table public.precious (id int); insert into public.precious values (42)")

    with pytest.raises(InvalidSpec, match=r"is not empty \(it has public\).*point Secret .*/orders-db-target"):
        steps.migrate(snapshot)

    assert _target_tables(databases) == ["public.precious"]
    with connect(databases.target) as conn:
        assert conn.execute("select id from public.precious").fetchall() == [(42,)]


@pytest.mark.parametrize(
    "where",
    ["first byte", "middle byte", "last byte", "an owner's name, which pg_restore --no-owner ignores", "other bytes"],
)
def test_a_snapshot_changed_in_s3_is_refused_and_nothing_of_it_is_restored(
    steps: Steps, databases: Databases, stack: StackInfo, snapshot: SnapshotResult, where: str
) -> None:
    s3 = stack.s3_client()
    stored = bytearray(s3.get_object(Bucket=snapshot.bucket, Key=snapshot.key)["Body"].read())
    if where == "other bytes":
        stored = bytearray(b"not a snapshot at all")
    elif where.startswith("an owner"):
        owner = stored.index(b"postgres")  # the owner of the first object in the archive's table of contents
        stored[owner : owner + 8] = b"postgrez"
    else:
        position = {"first byte": 0, "middle byte": len(stored) // 2, "last byte": len(stored) - 1}[where]
        stored[position] ^= 0xFF
    s3.put_object(Bucket=snapshot.bucket, Key=snapshot.key, Body=bytes(stored))

    with pytest.raises(SnapshotCorrupt, match=rf"{snapshot.location} is not the one written.*Nothing.*restored"):
        steps.migrate(snapshot)

    assert _target_tables(databases) == []


def test_migrate_of_a_snapshot_that_is_gone_fails_saying_so(
    steps: Steps, databases: Databases, stack: StackInfo, snapshot: SnapshotResult
) -> None:
    stack.s3_client().delete_object(Bucket=snapshot.bucket, Key=snapshot.key)

    with pytest.raises(SnapshotCorrupt, match=rf"{snapshot.location} is gone"):
        steps.migrate(snapshot)

    assert _target_tables(databases) == []


def test_undo_migrate_empties_the_target_so_that_another_migration_can_migrate_into_it(
    steps: Steps, databases: Databases, snapshot: SnapshotResult
) -> None:
    steps.migrate(snapshot)

    undone = steps.undo_migrate()
    again = steps.undo_migrate()  # a second run finds nothing to do

    assert (undone.removed, again.removed) == (True, False)
    assert as_new(databases.target)
    steps.undo_freeze()
    other = _another_migration(steps)
    other.freeze()
    other.migrate(other.snapshot())
    other.verify()
    assert contents(databases.target) == contents(databases.source)


def test_undo_migrate_behind_a_lock_it_leaves_keeps_heartbeating_naming_its_holder_and_empties_the_target_once_free(
    steps: Steps, databases: Databases, snapshot: SnapshotResult, heartbeats: list[dict[str, Any]]
) -> None:
    """The undo ends the client sessions of a target never verified, whose locks would hold its DROP SCHEMA up
    (test_locked_target), once it holds the lock of verify's mark (unwritten.LOCK), which ferry's own sessions take: a
    restore of an attempt the saga wrote off holds it until that restore commits or fails. The undo must not go silent
    meanwhile (the saga gives it a 30 s heartbeat timeout, and an attempt taken for dead would be tried again behind
    the first): it waits a second at a time and heartbeats between, naming who holds locks there."""
    steps.migrate(snapshot)
    undone: list[UndoMigrateResult] = []
    with connect(databases.target, application_name="late-restore") as holder:
        holder.execute("begin")
        holder.execute("select pg_advisory_xact_lock(%s)", (unwritten.LOCK,))  # as a restore's guard holds it
        undo = threading.Thread(target=lambda: undone.append(steps.undo_migrate()), name="undo-migrate")
        undo.start()
        try:
            eventually(
                "the undo to heartbeat that it waits for a lock held by the late restore",
                lambda: sum("late-restore" in str(beat.get("waiting_for_lock")) for beat in heartbeats) >= 3,
                timeout=30,
            )
            assert _target_tables(databases) != [], "nothing is dropped while the lock is held"
        finally:
            holder.execute("rollback")
            undo.join(60)

    assert not undo.is_alive()
    assert [result.removed for result in undone] == [True]
    assert as_new(databases.target)


def test_undo_migrate_leaves_a_target_holding_someone_elses_data_alone(
    steps: Steps, databases: Databases, snapshot: SnapshotResult
) -> None:
    with connect(databases.target) as conn:
        conn.execute("create table public.precious (id int); insert into public.precious values (42)")

    assert not steps.undo_migrate().removed

    assert _target_tables(databases) == ["public.precious"]
    with connect(databases.target) as conn:
        conn.execute("drop table public.precious")
    other = _another_migration(steps)
    other.migrate(other.snapshot())  # another Migration's restore is someone else's data too

    assert not steps.undo_migrate().removed

    assert contents(databases.target) == contents(databases.source)
    assert database_settings(databases.target) == [
        f"ferry.restored_by={other.ref.namespace}/orders-db-to-16/{other.ref.uid}"
    ]


def test_migrate_refuses_an_empty_target_another_migration_has_begun_restoring_into(
    steps: Steps, databases: Databases, snapshot: SnapshotResult
) -> None:
    """Its restore is one transaction: until it commits, the target looks empty, and only the marker says whose it is.
    Taking the target over, then cleaning it on a retry, would drop the other Migration's restore."""
    other = _another_migration(steps).ref
    restoring = f"{other.namespace}/{other.name}/{other.uid}"
    with connect(databases.target) as conn:
        conn.execute(f"alter database {databases.target.database} set ferry.restored_by = '{restoring}'")
    marker = f"ferry.restored_by={restoring}"

    with pytest.raises(InvalidSpec, match=r"is marked as restored into by Migration .* not by Migration"):
        steps.migrate(snapshot)

    assert database_settings(databases.target) == [marker], "still the other Migration's"
    assert _target_tables(databases) == []


def test_undo_migrate_after_a_migrate_that_never_ran_or_failed_half_way(
    steps: Steps, databases: Databases, stack: StackInfo, snapshot: SnapshotResult
) -> None:
    assert not steps.undo_migrate().removed  # migrate never ran
    stack.s3_client().put_object(Bucket=snapshot.bucket, Key=snapshot.key, Body=b"not the snapshot")
    with pytest.raises(SnapshotCorrupt):
        steps.migrate(snapshot)  # marked the target, then refused the snapshot
    assert database_settings(databases.target) != []

    assert steps.undo_migrate().removed

    assert as_new(databases.target)
