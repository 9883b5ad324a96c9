"""In mode Snapshot the snapshot step restores the target from its own dump stream while it uploads it.

The restore commits only once pg_dump exited cleanly and the whole object is stored;
whatever stops the step before that (pg_dump failing, a cancellation) leaves the target
without a table, S3 without the object, and no pg_dump or pg_restore running. migrate
then finds the target restored and reads nothing back; the step's undo empties the
target and deletes the object.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from psycopg import sql
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities.heartbeats import Heartbeats
from activities.postgres.activities import PostgresActivities
from activities.postgres.restoring import Restore
from activities.secrets import SecretReader
from activities.settings import MIB, DataActivitySettings
from devstack.stack.processes import process_stats
from devstack.stack.stack import StackInfo
from ferry.api.errors import InvalidSpec
from ferry.api.saga import SnapshotResult
from tests.cluster import eventually
from tests.end_to_end import TARGET_SECRET, Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import (
    as_new,
    connect,
    contents,
    create_bulky,
    create_shop,
    end_copies,
    other_sessions,
    tables,
    with_statistics,
)


@pytest.fixture
def snapshot(steps: Steps, databases: Databases) -> SnapshotResult:
    """A snapshot of a small shop, taken from the frozen source while it was restored into the target."""
    create_shop(databases.source, customers=500, orders=5_000)
    steps.freeze()
    return steps.snapshot(restore=True)


def _objects_and_uploads(stack: StackInfo, bucket: str) -> tuple[list[str], list[str]]:
    s3 = stack.s3_client()
    objects = [item["Key"] for item in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    uploads = [upload["Key"] for upload in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    return objects, uploads


def _children(*names: str, running: bool = False) -> list[str]:
    """This process's child processes with one of `names` (the activity runs here, in ActivityEnvironment); with
    `running`, not those that exited and wait to be reaped."""
    return [
        f"{stat.command} (pid {stat.pid}, state {stat.state})"
        for stat in process_stats()
        if stat.parent == os.getpid() and stat.command in names and not (running and stat.state == "Z")
    ]


def _target_tables(databases: Databases) -> list[str]:
    with connect(databases.target) as conn:
        return tables(conn)


def test_the_snapshot_restores_the_target_while_uploading_and_migrate_finds_it_done(
    steps: Steps, databases: Databases, stack: StackInfo, bucket: str, snapshot: SnapshotResult
) -> None:
    migrated = steps.migrate(snapshot)
    verified = steps.verify()

    assert snapshot.restored
    assert contents(databases.target) == contents(databases.source)
    assert with_statistics(databases.target) == ["audit.log", "shop.customers", "shop.orders"], (
        "the planner has statistics"
    )
    assert (migrated.during_snapshot, migrated.tables, migrated.bytes_restored) == (True, 3, snapshot.size_bytes)
    assert len(verified.tables) == 3
    assert _objects_and_uploads(stack, bucket) == ([snapshot.key], [])


def test_migrate_restores_from_s3_when_the_target_no_longer_holds_the_snapshots_restore(
    steps: Steps, databases: Databases, snapshot: SnapshotResult
) -> None:
    steps.undo_migrate()  # what a person emptying the target would leave: nothing, and no marker

    migrated = steps.migrate(snapshot)

    assert not migrated.during_snapshot
    assert migrated.bytes_restored == snapshot.size_bytes
    assert contents(databases.target) == contents(databases.source)
    assert _loaded_frozen(databases) == dict.fromkeys(["audit.log", "shop.customers", "shop.orders"], True)


def test_a_snapshot_run_again_after_its_restore_committed_restores_once_more_from_a_clean_target(
    steps: Steps, databases: Databases, snapshot: SnapshotResult
) -> None:
    """The attempt whose worker died after the commit, before its result was recorded."""
    again = steps.snapshot(restore=True)

    assert again.restored
    assert contents(databases.target) == contents(databases.source)
    assert _target_tables(databases) == ["audit.log", "shop.customers", "shop.orders"]


@pytest.fixture
def published(steps: Steps, databases: Databases) -> Iterator[None]:
    """A source with a publication (what a CDC consumer reads) and a subscription, which pg_dump carries (the
    subscription disabled, connect = false); both dropped from both databases afterwards, since a database that has a
    subscription cannot be dropped."""
    create_shop(databases.source, customers=100, orders=1_000)
    with connect(databases.source) as conn:
        conn.execute("create publication orders_feed for table shop.orders")
        conn.execute("create publication everything for all tables")
        conn.execute(
            "create subscription upstream connection 'host=192.0.2.1 dbname=nowhere' publication up "
            "with (connect = false)"
        )
    yield
    for endpoint in (databases.source, databases.target):
        with connect(endpoint, default_transaction_read_only="off") as conn:  # the source is frozen
            for (name,) in conn.execute(
                "select subname from pg_subscription "
                "where subdbid = (select oid from pg_database where datname = current_database())"
            ).fetchall():
                conn.execute(f'alter subscription "{name}" set (slot_name = none)')
                conn.execute(f'drop subscription "{name}"')


def _publications_and_subscriptions(databases: Databases) -> list[str]:
    with connect(databases.target) as conn:
        rows = conn.execute(
            "select 'publication ' || pubname from pg_publication union all select 'subscription ' || subname "
            "from pg_subscription where subdbid = (select oid from pg_database where datname = current_database()) "
            "order by 1"
        ).fetchall()
    return [row[0] for row in rows]


def test_a_snapshot_of_a_source_with_publications_runs_again_after_its_commit_and_its_undo_leaves_nothing(
    steps: Steps, databases: Databases, published: None
) -> None:
    """Publications and subscriptions belong to no schema: the target keeps the source's (a CDC consumer may need
    them on the new primary), a retry after the commit drops them with the rest before restoring, and the undo
    drops them too."""
    steps.freeze()
    steps.snapshot(restore=True)

    again = steps.snapshot(restore=True)  # the attempt whose worker died after the commit

    assert again.restored
    assert contents(databases.target) == contents(databases.source)
    assert _publications_and_subscriptions(databases) == [
        "publication everything",
        "publication orders_feed",
        "subscription upstream",
    ]
    steps.undo_snapshot()
    assert _publications_and_subscriptions(databases) == []
    assert as_new(databases.target)


def _loaded_frozen(databases: Databases) -> dict[str, bool]:
    """Whether every row of each of the target's tables is frozen, as COPY ... FREEZE loads them; a partitioned
    table's rows by the name of its root.

    A row's header says so (HEAP_XMIN_FROZEN: both of t_infomask's bits 0x0100 and 0x0200);
    a row loaded by a plain COPY has at most the first, once a read set its hint bits.
    Read with pageinspect, created once the steps are done, as the target's superuser.
    """
    with connect(databases.target) as conn:
        conn.execute("create extension if not exists pageinspect")
        rows = conn.execute(
            "select format('%s.%s', n.nspname, r.relname), count(*) = count(*) filter (where t_infomask & 768 = 768) "
            "from pg_class c join pg_class r on r.oid = coalesce(pg_partition_root(c.oid), c.oid) "
            "join pg_namespace n on n.oid = r.relnamespace, "
            "generate_series(0, pg_relation_size(c.oid) / current_setting('block_size')::int - 1) as page, "
            "heap_page_items(get_raw_page(c.oid::regclass::text, page::int)) "
            "where c.relkind = 'r' and n.nspname !~ '^pg_' and n.nspname <> 'information_schema' and lp_flags = 1 "
            "group by 1 order by 1"
        ).fetchall()
    return dict(rows)


def test_the_restore_loads_rows_frozen_and_a_partitioned_table_loaded_through_its_root_as_before(
    steps: Steps, databases: Databases
) -> None:
    """Frozen rows spare verify's first read of the target a write of every page (activities/postgres/restore_script).

    pg_dump loads a table hash-partitioned on an enum through its root, where FREEZE is
    refused: those rows load as before, and the restore commits. A target whose sessions
    default to serializable transactions takes FREEZE too.
    """
    create_shop(databases.source, customers=500, orders=5_000)
    with connect(databases.source) as conn:
        conn.execute('create schema "Odd Schema"')
        conn.execute('create table "Odd Schema"."Mixed Case" (id int primary key, note text)')
        conn.execute("""insert into "Odd Schema"."Mixed Case" select g, md5(g::text) from generate_series(1, 2000) g""")
        conn.execute("create type shop.tier as enum ('bronze', 'silver', 'gold')")
        conn.execute("create table shop.by_tier (tier shop.tier not null, id int not null) partition by hash (tier)")
        for remainder in range(2):
            conn.execute(
                f"create table shop.by_tier_{remainder} partition of shop.by_tier "
                f"for values with (modulus 2, remainder {remainder})"
            )
        conn.execute(
            "insert into shop.by_tier select (array['bronze', 'silver', 'gold']::shop.tier[])[1 + g % 3], g "
            "from generate_series(1, 3000) g"
        )
    with connect(databases.target) as conn:
        conn.execute(
            sql.SQL("alter database {} set default_transaction_isolation = 'serializable'").format(
                sql.Identifier(databases.target.database)
            )
        )
    steps.freeze()

    steps.snapshot(restore=True)
    verified = steps.verify()

    assert [check.table for check in verified.tables] == [
        "Odd Schema.Mixed Case", "audit.log", "shop.by_tier", "shop.customers", "shop.orders"
    ]  # fmt: skip
    assert _loaded_frozen(databases) == {
        "Odd Schema.Mixed Case": True,
        "audit.log": True,
        "shop.by_tier": False,
        "shop.customers": True,
        "shop.orders": True,
    }


def test_a_dump_that_fails_midway_commits_nothing_on_the_target(
    steps: Steps, databases: Databases, stack: StackInfo, bucket: str
) -> None:
    """pg_dump's session is ended on the source after the first parts: pg_restore had all but the end of the stream."""
    create_bulky(databases.source, rows=400_000)  # about 26 MB: several 5 MiB parts
    env = ActivityEnvironment()
    ended: list[int] = []
    once = threading.Lock()  # heartbeats come from the step's thread and from its heartbeat watchdog

    def end_pg_dump_after_two_parts(*details: Any) -> None:
        if details[0].get("dumped_bytes", 0) < 10 * MIB:
            return
        with once:
            if ended:
                return
            ended.append(end_copies(databases.source))

    env.on_heartbeat = end_pg_dump_after_two_parts

    with pytest.raises(RuntimeError, match="could not dump"):
        dataclasses.replace(steps, env=env).snapshot(restore=True)

    assert ended == [1], "pg_dump's session was ended while it dumped"
    assert _target_tables(databases) == []
    assert _objects_and_uploads(stack, bucket) == ([], [])
    assert _children("pg_dump", "pg_restore", "psql") == []
    eventually("pg_restore's session to end", lambda: other_sessions(databases.target) == 0, timeout=10)


def test_a_dump_that_outgrows_the_largest_object_the_store_takes_stops_at_once_and_commits_nothing(
    steps: Steps, databases: Databases, stack: StackInfo, bucket: str, kube_api: k8s.ApiClient,
    data_settings: DataActivitySettings,
) -> None:  # fmt: skip
    """Without compression a dump can be larger than the database: it stops when it passes the store's limit, not
    after the whole dump, and the next move is named."""
    create_bulky(databases.source, rows=400_000)  # about 26 MB
    small_store = dataclasses.replace(data_settings, max_object_size=12 * MIB)
    limited = dataclasses.replace(steps, postgres=PostgresActivities(kube_api, small_store))

    with pytest.raises(InvalidSpec, match=r"outgrew the largest object the snapshot store takes \(0\.0 GiB") as raised:
        limited.snapshot(restore=True)

    assert "this worker does not compress dumps" in str(raised.value)
    assert "--snapshot-compression 1" in str(raised.value)
    assert _target_tables(databases) == []
    assert _objects_and_uploads(stack, bucket) == ([], [])
    assert _children("pg_dump", "pg_restore", "psql") == []
    eventually("pg_dump's session to end", lambda: other_sessions(databases.source) == 0, timeout=10)
    eventually("pg_restore's session to end", lambda: other_sessions(databases.target) == 0, timeout=10)


def test_a_snapshot_cancelled_while_restoring_stops_pg_dump_and_pg_restore_and_leaves_no_partial_target(
    steps: Steps, databases: Databases, stack: StackInfo, bucket: str
) -> None:
    create_bulky(databases.source, rows=400_000)
    env = ActivityEnvironment()
    seen: list[dict[str, Any]] = []

    def cancel_after_two_parts(*details: Any) -> None:
        seen.append(details[0])
        if details[0].get("dumped_bytes", 0) >= 10 * MIB:
            env.cancel()

    env.on_heartbeat = cancel_after_two_parts
    give_up = threading.Timer(60, env.cancel)  # should the heartbeats never come
    give_up.start()
    try:
        with pytest.raises(CancelledError):
            dataclasses.replace(steps, env=env).snapshot(restore=True)
    finally:
        give_up.cancel()

    assert seen[-1]["dumped_bytes"] < 26 * MIB, "it stopped before the dump was through"
    assert _target_tables(databases) == []
    assert _objects_and_uploads(stack, bucket) == ([], [])
    assert _children("pg_dump", "pg_restore", "psql") == []
    eventually("pg_dump's session to end", lambda: other_sessions(databases.source) == 0, timeout=10)
    eventually("pg_restore's session to end", lambda: other_sessions(databases.target) == 0, timeout=10)


def test_the_undo_of_a_restoring_snapshot_empties_the_target_and_deletes_the_object(
    steps: Steps, databases: Databases, stack: StackInfo, bucket: str, snapshot: SnapshotResult
) -> None:
    first = steps.undo_snapshot(snapshot)
    again = steps.undo_snapshot()  # without the result, as after an interrupted step: harmless

    assert (first.deleted, again.deleted) == (True, True)
    assert as_new(databases.target)
    assert _objects_and_uploads(stack, bucket) == ([], [])


def test_the_undo_of_a_restoring_snapshot_leaves_a_target_another_migration_restored(
    steps: Steps, databases: Databases, snapshot: SnapshotResult
) -> None:
    other = dataclasses.replace(steps, ref=steps.ref.model_copy(update={"uid": "another-uid"}))

    other.undo_snapshot()

    assert contents(databases.target) == contents(databases.source)


class RestoreSession:
    """pg_restore's session on the target, sampled: whether it has sat waiting for input with nothing restored since."""

    def __init__(self, databases: Databases) -> None:
        self._databases = databases
        self._last: tuple[object, ...] | None = None
        self._since = time.monotonic()

    def stalled(self, seconds: float = 1.0) -> bool:
        """Waiting for its client (ClientRead), the same bytes copied, for `seconds` or more."""
        with connect(self._databases.target) as conn:
            row = conn.execute(
                "select a.pid, a.state, a.wait_event, p.bytes_processed from pg_stat_activity a "
                "left join pg_stat_progress_copy p on p.pid = a.pid where a.datname = current_database() "
                "and a.pid <> pg_backend_pid() and a.backend_type = 'client backend'"
            ).fetchone()
        sample = tuple(row) if row is not None and row[2] == "ClientRead" else None
        if sample is None or sample != self._last:
            self._last, self._since = sample, time.monotonic()
            return False
        return time.monotonic() - self._since >= seconds


@pytest.mark.parametrize(
    "freeze", [pytest.param(None, id="pg_restore alone"), pytest.param(frozenset({b"public.blobs"}), id="through psql")]
)
def test_pg_restore_given_all_but_the_held_back_piece_never_commits_and_commits_once_given_it(
    steps: Steps, databases: Databases, stack: StackInfo, bucket: str, kube_api: k8s.ApiClient,
    data_settings: DataActivitySettings, freeze: frozenset[bytes] | None,
) -> None:  # fmt: skip
    """Without the held-back piece, pg_restore would reach the end of the dump and commit before anyone knew the
    stream was whole: here it has the complete dump, the upload could still fail, and it must not commit. Through
    psql (restore_script), the same: pg_restore writes the script's COMMIT only once it has read the end."""
    create_bulky(databases.source, rows=100_000)  # about 6 MB: pg_restore gets all but the last of six pieces
    steps.freeze()
    snapshot = steps.snapshot()
    dump = stack.s3_client().get_object(Bucket=bucket, Key=snapshot.key)["Body"].read()
    target = SecretReader(kube_api).database(steps.ref.namespace, TARGET_SECRET, "spec.driver.targetSecret")

    def restore(commit: bool) -> None:
        with Heartbeats(data_settings.heartbeat_interval) as heartbeats, Restore(
            target, data_settings, heartbeats, snapshot.location, freeze
        ) as restoring:  # fmt: skip
            restoring.feed(dump)
            if commit:
                restoring.commit()
                return
            session = RestoreSession(databases)
            eventually(
                "pg_restore to wait for the held-back piece (or to commit without it)",
                lambda: session.stalled() or not _children("pg_restore", running=True),
                timeout=60,
            )
            assert _children("pg_restore", running=True), "pg_restore ended before it was given the last piece"
            if freeze is not None:
                assert _children("psql", running=True), "psql ended before pg_restore was given the last piece"

    ActivityEnvironment().run(restore, False)

    assert _target_tables(databases) == []
    eventually("pg_restore's session to end", lambda: other_sessions(databases.target) == 0, timeout=10)

    ActivityEnvironment().run(restore, True)

    assert contents(databases.target) == contents(databases.source)
