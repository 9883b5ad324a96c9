"""Mode Snapshot in parallel streams (activities/postgres/streams.py): the largest tables' rows in objects of their own.

With spec.driver.parallelism above one, the snapshot step dumps the largest tables' rows
in streams at once, under one exported snapshot of the source, each stored in an object
beside the snapshot's and restored into the target as it is uploaded; the main archive
holds the rest, and its indexes and constraints are built once every stream committed.
The target commits piece by piece, so its marker says "incomplete" until the last piece:
an incomplete target is never taken for a restored one, a retry empties it first, and
the undo empties it; and a step that fails or is cancelled empties it itself. Whatever stops the
step stops every stream's tools.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities.postgres import streams
from activities.postgres.activities import PostgresActivities, owner
from activities.secrets import DatabaseConnection
from activities.settings import MIB, DataActivitySettings
from activities.snapshots import SnapshotStoreActivities
from devstack.stack.stack import StackInfo
from ferry.api.errors import SnapshotCorrupt
from ferry.api.saga import DeleteSnapshotInput, SnapshotResult, stream_key
from tests.cluster import eventually
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import (
    connect,
    contents,
    create_bulky,
    create_shop,
    end_copies,
    other_sessions,
    tables,
    tablespace,
    tablespaces_of,
    with_statistics,
)
from tests.postgres.test_restore_while_dumping import _children, _loaded_frozen, _objects_and_uploads

TABLES = [
    'Odd "Schema".Mixed.Case', "audit.log", "large objects", "public.blobs", "shop.by_region_0", "shop.by_region_1",
    "shop.by_region_2", "shop.customers", "shop.order_totals", "shop.orders",
]  # fmt: skip


@pytest.fixture
def in_streams(steps: Steps, kube_api: k8s.ApiClient, data_settings: DataActivitySettings) -> Steps:
    """The steps of a Migration asking for three streams, on a worker that uses streams for any size."""
    settings = dataclasses.replace(data_settings, parallel_min_size=0)
    driver = steps.driver.model_copy(update={"parallelism": 3})
    return dataclasses.replace(steps, postgres=PostgresActivities(kube_api, settings), driver=driver)


def _create_source(databases: Databases, *, bulky_rows: int = 60_000) -> None:
    """A shop, a table of incompressible rows, a partitioned table, an oddly named one, a large object and a
    materialized view: what the main archive and the streams must carry between them."""
    create_shop(databases.source, customers=2_000, orders=20_000)
    create_bulky(databases.source, rows=bulky_rows)
    with connect(databases.source) as conn:
        conn.execute('create schema "Odd ""Schema"""')
        conn.execute('create table "Odd ""Schema"""."Mixed.Case" (id int primary key, note text)')
        conn.execute('insert into "Odd ""Schema"""."Mixed.Case" select g, md5(g::text) from generate_series(1, 3000) g')
        conn.execute("create table shop.by_region (region int not null, id int not null) partition by list (region)")
        for region in range(3):
            conn.execute(f"create table shop.by_region_{region} partition of shop.by_region for values in ({region})")
        conn.execute("insert into shop.by_region select g % 3, g from generate_series(1, 9000) g")
        conn.execute(
            "create materialized view shop.order_totals as select customer_id, sum(total) from shop.orders group by 1"
        )
        conn.execute("select lo_from_bytea(4242, 'a large object')")
        conn.execute("select setval('audit.ticket_seq', 123456)")


def _sequence_and_large_object(databases: Databases, which: str) -> tuple[Any, ...]:
    endpoint = databases.source if which == "source" else databases.target
    with connect(endpoint) as conn:
        row = conn.execute(
            "select last_value, (select count(*) from shop.order_totals), (select lo_get(4242)) from audit.ticket_seq"
        ).fetchone()
    assert row is not None
    return tuple(row)


def _marker(databases: Databases) -> str | None:
    with connect(databases.target) as conn:
        row = conn.execute(
            "select (select option_value from pg_options_to_table(setconfig) where option_name = 'ferry.restored_by') "
            "from pg_db_role_setting where setrole = 0 and setdatabase = "
            "(select oid from pg_database where datname = current_database())"
        ).fetchone()
    return row[0] if row else None


def test_a_snapshot_in_streams_restores_everything_and_stores_one_object_per_stream(
    in_streams: Steps, databases: Databases, stack: StackInfo, bucket: str
) -> None:
    _create_source(databases)
    in_streams.freeze()

    snapshot = in_streams.snapshot(restore=True)
    migrated = in_streams.migrate(snapshot)
    verified = in_streams.verify()

    assert len(snapshot.streams) == 3
    assert sum(stream.tables for stream in snapshot.streams) == 8, "every table with rows of its own, partitions too"
    assert [stream.key for stream in snapshot.streams] == [stream_key(in_streams.key, index) for index in (1, 2, 3)]
    objects, uploads = _objects_and_uploads(stack, bucket)
    assert sorted(objects) == sorted([snapshot.key, *(stream.key for stream in snapshot.streams)])
    assert uploads == []
    assert contents(databases.target) == contents(databases.source)
    assert _sequence_and_large_object(databases, "target") == _sequence_and_large_object(databases, "source")
    assert [check.table for check in verified.tables] == TABLES
    assert (migrated.during_snapshot, migrated.bytes_restored) == (True, snapshot.total_bytes)
    assert _marker(databases) == f"{in_streams.ref.namespace}/{in_streams.ref.name}/{in_streams.ref.uid}"
    assert _loaded_frozen(databases)["public.blobs"], "a stream's rows load frozen"
    assert {"shop.customers", "shop.orders", "shop.by_region_0"} <= set(with_statistics(databases.target))


def test_migrate_restores_a_snapshot_in_streams_from_s3(in_streams: Steps, databases: Databases) -> None:
    _create_source(databases)
    in_streams.freeze()
    snapshot = in_streams.snapshot(restore=True)
    in_streams.undo_migrate()

    migrated = in_streams.migrate(snapshot)
    in_streams.verify()

    assert (migrated.during_snapshot, migrated.bytes_restored) == (False, snapshot.total_bytes)
    assert contents(databases.target) == contents(databases.source)
    assert _sequence_and_large_object(databases, "target") == _sequence_and_large_object(databases, "source")
    assert _loaded_frozen(databases)["public.blobs"]


def test_a_changed_stream_object_fails_migrate_and_the_target_is_emptied_of_what_the_other_objects_restored(
    in_streams: Steps, databases: Databases, stack: StackInfo
) -> None:
    _create_source(databases)
    in_streams.freeze()
    snapshot = in_streams.snapshot(restore=True)
    in_streams.undo_migrate()
    changed = snapshot.streams[1]
    s3 = stack.s3_client()
    body = bytearray(s3.get_object(Bucket=snapshot.bucket, Key=changed.key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.put_object(Bucket=snapshot.bucket, Key=changed.key, Body=bytes(body))

    with pytest.raises(SnapshotCorrupt, match=changed.key):
        in_streams.migrate(snapshot)

    with connect(databases.target) as conn:
        assert tables(conn) == [], "the schema and the other streams had committed; the failed step emptied them"
    assert _marker(databases) is None
    assert _children("pg_dump", "pg_restore", "psql") == []
    with pytest.raises(SnapshotCorrupt):  # and so again: nothing is taken for restored
        in_streams.migrate(snapshot)
    assert not in_streams.undo_migrate().removed, "nothing was left to undo"


def test_an_attempt_written_off_while_another_completed_the_restore_leaves_that_restore_alone_as_it_fails(
    in_streams: Steps, databases: Databases
) -> None:
    """Attempt A's worker stops (a paused VM) past the heartbeat timeout; the saga's next attempt, B, restores the
    target whole, and verify and switch-traffic may follow. When A goes on, its heartbeat is refused and it fails:
    its cleanup, meant for its own partial restore, finds B's complete one, and keeps it. (A's pause is not made
    here: what A does as it fails is called directly, on the target B completed.)"""
    _create_source(databases)
    in_streams.freeze()
    in_streams.snapshot(restore=True)  # B
    target = DatabaseConnection(
        databases.target.host, databases.target.port, databases.target.user, databases.target.password,
        databases.target.database, secret="test/target",
    )  # fmt: skip

    in_streams.postgres._clear_quietly(target, in_streams.ref)  # A, failing

    assert contents(databases.target) == contents(databases.source)
    assert _marker(databases) == owner(in_streams.ref), "still marked complete"


def test_a_stream_that_fails_stops_the_others_and_a_retry_restores_from_a_clean_target(
    in_streams: Steps, databases: Databases, stack: StackInfo, bucket: str
) -> None:
    """One stream's pg_dump loses its session on the source midway: the other streams stop, the target keeps its
    incomplete marker, and the next attempt starts over and restores everything."""
    _create_source(databases, bulky_rows=400_000)  # about 26 MB in the largest table
    env = ActivityEnvironment()
    ended: list[int] = []
    once = threading.Lock()

    def end_one_dump(*details: Any) -> None:
        dumped = [value for name, value in details[0].items() if name.endswith("_dumped_bytes")]
        if not dumped or max(dumped) < 10 * MIB:
            return
        with once:
            if ended:
                return
            ended.append(end_copies(databases.source, "copy public.blobs%"))

    env.on_heartbeat = end_one_dump
    in_streams.freeze()

    with pytest.raises(RuntimeError, match="could not dump"):
        dataclasses.replace(in_streams, env=env).snapshot(restore=True)

    assert ended == [1]
    assert _children("pg_dump", "pg_restore", "psql") == []
    with connect(databases.target) as conn:
        assert tables(conn) == [], "the failed step emptied what the schema and the other streams had committed"
    assert _marker(databases) is None
    eventually("every session on the source to end", lambda: other_sessions(databases.source) == 0, timeout=10)
    eventually("every session on the target to end", lambda: other_sessions(databases.target) == 0, timeout=10)

    snapshot = in_streams.snapshot(restore=True)

    assert contents(databases.target) == contents(databases.source)
    objects, uploads = _objects_and_uploads(stack, bucket)
    assert sorted(objects) == sorted([snapshot.key, *(stream.key for stream in snapshot.streams)])
    assert uploads == []


def test_a_snapshot_in_streams_cancelled_midway_stops_every_tool_and_its_undo_leaves_nothing(
    in_streams: Steps, databases: Databases, stack: StackInfo, bucket: str
) -> None:
    _create_source(databases, bulky_rows=400_000)
    env = ActivityEnvironment()

    def cancel_midway(*details: Any) -> None:
        dumped = [value for name, value in details[0].items() if name.endswith("_dumped_bytes")]
        if dumped and max(dumped) >= 10 * MIB:
            env.cancel()

    env.on_heartbeat = cancel_midway
    in_streams.freeze()

    with pytest.raises(CancelledError):
        dataclasses.replace(in_streams, env=env).snapshot(restore=True)

    assert _children("pg_dump", "pg_restore", "psql") == []
    eventually("every session on the source to end", lambda: other_sessions(databases.source) == 0, timeout=10)
    with connect(databases.target) as conn:
        assert tables(conn) == [], "no partial target, even before the undo"
    assert _marker(databases) is None
    in_streams.undo_snapshot()
    assert _objects_and_uploads(stack, bucket) == ([], [])


def test_a_source_under_the_parallel_minimum_or_with_one_table_is_snapshotted_in_one_object(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, data_settings: DataActivitySettings
) -> None:
    create_shop(databases.source, customers=200, orders=1_000)
    driver = steps.driver.model_copy(update={"parallelism": 4})
    small = dataclasses.replace(steps, driver=driver)  # the fixture's worker: 64 MiB at least
    small.freeze()

    snapshot = small.snapshot(restore=True)

    assert snapshot.streams == []
    assert contents(databases.target) == contents(databases.source)
    assert _marker(databases) == f"{steps.ref.namespace}/{steps.ref.name}/{steps.ref.uid}"


def test_the_retention_delete_removes_the_streams_objects_with_the_snapshot(
    in_streams: Steps, databases: Databases, stack: StackInfo, bucket: str, snapshots: SnapshotStoreActivities
) -> None:
    _create_source(databases)
    in_streams.freeze()
    snapshot: SnapshotResult = in_streams.snapshot(restore=True)
    assert len(_objects_and_uploads(stack, bucket)[0]) == 4

    in_streams.env.run(
        snapshots.delete_snapshot,
        DeleteSnapshotInput(ref=in_streams.ref, snapshot=in_streams.snapshot_spec, artifact=snapshot),
    )

    assert _objects_and_uploads(stack, bucket) == ([], [])


def test_tables_beyond_those_the_streams_name_load_with_the_main_archive_in_parallel_sessions(
    in_streams: Steps, databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source with more tables than the streams take (NAMED_LIMIT, lowered here): the smallest tables' rows stay in
    the main archive, which pg_restore --jobs restores from the worker's copy after the streams."""
    monkeypatch.setattr(streams, "NAMED_LIMIT", 2)
    _create_source(databases)
    in_streams.freeze()

    snapshot = in_streams.snapshot(restore=True)
    in_streams.undo_migrate()
    in_streams.migrate(snapshot)  # from S3 too
    verified = in_streams.verify()

    assert sum(stream.tables for stream in snapshot.streams) == 2
    assert contents(databases.target) == contents(databases.source)
    assert _sequence_and_large_object(databases, "target") == _sequence_and_large_object(databases, "source")
    assert [check.table for check in verified.tables] == TABLES


def test_tables_of_every_awkward_kind_are_carried_whole_in_streams(in_streams: Steps, databases: Databases) -> None:
    """A stored generated column, a dropped column, inheritance (the parent's own rows and the
    child's), pattern characters in a name (beside a table that name would match as a pattern),
    an unlogged table, a forced row-level security policy, a domain, a self-referencing foreign
    key and a trigger that would change rows as they load: each table's rows go in a stream, and
    the target holds the same rows."""
    create_shop(databases.source, customers=200, orders=2_000)
    with connect(databases.source) as conn:
        conn.execute("create schema odd")
        conn.execute("create domain odd.positive as int check (value > 0)")
        conn.execute(
            "create table odd.generated (id int primary key, n int, twice int generated always as (n * 2) stored)"
        )
        conn.execute("insert into odd.generated (id, n) select g, g from generate_series(1, 2000) g")
        conn.execute("create table odd.dropped (id int primary key, gone text, kept odd.positive)")
        conn.execute("insert into odd.dropped select g, 'x', g from generate_series(1, 2000) g")
        conn.execute("alter table odd.dropped drop column gone")
        conn.execute("create table odd.parent (id int, note text)")
        conn.execute("create table odd.child (extra int) inherits (odd.parent)")
        conn.execute("insert into odd.parent select g, 'parent' from generate_series(1, 1000) g")
        conn.execute("insert into odd.child select g, 'child', g from generate_series(1001, 2500) g")
        conn.execute('create table odd."star*and?[x]$1" (id int primary key)')
        conn.execute('insert into odd."star*and?[x]$1" select generate_series(1, 1100)')
        conn.execute('create table odd."starZZandQx$1" (id int primary key)')
        conn.execute('insert into odd."starZZandQx$1" select generate_series(1, 1050)')
        conn.execute("create unlogged table odd.scratch (id int primary key)")
        conn.execute("insert into odd.scratch select generate_series(1, 1500)")
        conn.execute("create table odd.guarded (id int primary key, owner_name text)")
        conn.execute("insert into odd.guarded select g, 'someone' from generate_series(1, 1200) g")
        conn.execute("alter table odd.guarded enable row level security")
        conn.execute("alter table odd.guarded force row level security")
        conn.execute("create policy only_mine on odd.guarded using (owner_name = current_user)")
        conn.execute("create table odd.tree (id int primary key, parent int references odd.tree)")
        conn.execute("insert into odd.tree select g, nullif(g - 1, 0) from generate_series(1, 1800) g")
        conn.execute(
            "create function odd.bump() returns trigger language plpgsql as "
            "$$ begin new.n := new.n + 1000000; return new; end $$"
        )
        conn.execute("create trigger bump before insert on odd.generated for each row execute function odd.bump()")
    in_streams.freeze()

    snapshot = in_streams.snapshot(restore=True)
    in_streams.migrate(snapshot)
    in_streams.verify()

    assert sum(stream.tables for stream in snapshot.streams) >= 9
    assert contents(databases.target) == contents(databases.source)
    with connect(databases.target) as conn:
        assert conn.execute("select count(*) from only odd.parent").fetchone() == (1000,)
        assert conn.execute("select count(*) from odd.parent").fetchone() == (2500,)
        assert conn.execute("select max(twice) from odd.generated").fetchone() == (4000,)


def test_a_worker_runs_no_more_streams_than_its_maximum_whatever_the_migration_asks(
    steps: Steps, kube_api: k8s.ApiClient, data_settings: DataActivitySettings, databases: Databases
) -> None:
    """Each stream costs the worker a pg_dump, a psql and memory: spec.driver.parallelism 64 on a worker whose
    --snapshot-max-streams is 2 runs two."""
    settings = dataclasses.replace(data_settings, parallel_min_size=0, snapshot_max_streams=2)
    greedy = dataclasses.replace(
        steps,
        postgres=PostgresActivities(kube_api, settings),
        driver=steps.driver.model_copy(update={"parallelism": 64}),
    )
    _create_source(databases, bulky_rows=5_000)
    greedy.freeze()

    snapshot = greedy.snapshot(restore=True)
    greedy.migrate(snapshot)
    greedy.verify()

    assert len(snapshot.streams) == 2
    assert contents(databases.target) == contents(databases.source)


def test_relations_in_a_tablespace_the_target_lacks_are_restored_in_streams_into_its_default_one(
    in_streams: Steps, databases: Databases
) -> None:
    """The main archive's schema, the streams' rows and the indexes built after them all leave tablespaces out."""
    _create_source(databases)
    with tablespace(databases.source) as fast:
        with connect(databases.source) as conn:
            conn.execute(f"alter table public.blobs set tablespace {fast}")
            conn.execute(f"alter table shop.by_region_1 set tablespace {fast}")
            conn.execute(f"alter index shop.orders_by_customer set tablespace {fast}")
        in_streams.freeze()

        snapshot = in_streams.snapshot(restore=True)
        verified = in_streams.verify()

    assert len(snapshot.streams) == 3
    assert [check.table for check in verified.tables] == TABLES
    assert contents(databases.target) == contents(databases.source)
    assert set(tablespaces_of(databases.target).values()) == {"pg_default"}
