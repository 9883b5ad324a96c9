"""Mode Online fails at once, with ReplicationBroken, when the source invalidated the replication slot.

A source with max_slot_wal_keep_size set removes WAL a slot still needs once the slot
holds more than that: the slot's wal_status becomes 'lost', and the subscription's
worker, failing every few seconds with "cannot read from logical replication slot", can
never stream again. Those failures come before pg_stat_subscription_stats counts
anything, so a wait that looked only at counted errors waited for the activity's
timeout (catch-up: ten minutes a try, five tries, the source frozen all along).

The slot is lost on a PostgreSQL instance of this module's own (wal_level=logical, like
the stack's source), so that the small max_slot_wal_keep_size reaches no other test's
slots; the target is the stack's.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from temporalio.exceptions import CancelledError

from devstack.stack import postgres_home
from devstack.stack.install import Binaries
from devstack.stack.postgres import PostgresEndpoint, PostgresInstance
from devstack.stack.readiness import PortBook
from devstack.stack.stack import START_TIMEOUT, StackInfo
from ferry.api.errors import ReplicationBroken
from tests.cluster import eventually
from tests.conftest import make_state_dir, remove_state_dir
from tests.end_to_end import Databases
from tests.postgres.data import connect, create_shop
from tests.postgres.online import NOTHING, OnlineSteps, leftovers

BOUND = 120.0
"""Seconds after which the test cancels an activity still waiting: only a replication that was never found broken
gets there (the stall limit of these tests is 5 s)."""


@pytest.fixture(scope="module")
def own_source(binaries: Binaries) -> Iterator[PostgresEndpoint]:
    """A source instance of this module's own, with logical replication (named `source`, as the stack's is)."""
    folder = make_state_dir("ferry-lost-slot-")
    user = postgres_home.ServiceUser.when_root()
    home = postgres_home.choose(folder / "postgres", ["source"], user)
    bindir, ports = binaries.source_postgres_bindir, PortBook(folder / "ports.json")
    instance = PostgresInstance("source", bindir, folder / "postgres" / "source", ports, folder / "logs", home, user)
    process = instance.start()
    try:
        instance.wait(START_TIMEOUT)
        yield instance.endpoint
    finally:
        process.stop()
    remove_state_dir(folder)


@pytest.fixture
def databases(own_source: PostgresEndpoint, stack: StackInfo) -> Iterator[Databases]:
    """A source database on this module's instance, a target database on the stack's target instance."""
    name = f"lost_{uuid.uuid4().hex[:10]}"
    target_admin = stack.postgres["target"]
    for admin in (own_source, target_admin):
        with psycopg.connect(admin.dsn, autocommit=True) as conn:
            conn.execute(f'create database "{name}"')
    yield Databases(
        source=dataclasses.replace(own_source, database=name), target=dataclasses.replace(target_admin, database=name)
    )
    for admin in (own_source, target_admin):
        with psycopg.connect(admin.dsn, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{name}" with (force)')


def _lose_the_slot(databases: Databases, slot: str) -> None:
    """Has the source invalidate the slot the way production does: the subscription stays away while the source
    writes past max_slot_wal_keep_size, and a checkpoint removes the WAL the slot still needed."""
    with connect(databases.target) as conn:
        conn.execute(f"alter subscription {slot} disable")
    with connect(databases.source) as conn:
        eventually("the slot to be let go", lambda: _active(conn, slot) is False)
        conn.execute("alter system set max_slot_wal_keep_size = '1MB'")
        conn.execute("select pg_reload_conf()")
        try:
            for _ in range(4):
                conn.execute("insert into shop.customers (email, created_at) values (gen_random_uuid(), now())")
                conn.execute("select pg_switch_wal()")
            conn.execute("checkpoint")
            row = conn.execute("select wal_status from pg_replication_slots where slot_name = %s", (slot,)).fetchone()
            assert row == ("lost",), "the source invalidated the slot"
        finally:
            conn.execute("alter system reset max_slot_wal_keep_size")
            conn.execute("select pg_reload_conf()")
    with connect(databases.target) as conn:
        conn.execute(f"alter subscription {slot} enable")


def _active(conn: psycopg.Connection[tuple[object, ...]], slot: str) -> object:
    row = conn.execute("select active from pg_replication_slots where slot_name = %s", (slot,)).fetchone()
    return row[0] if row else None


def test_catch_up_fails_at_once_with_replication_broken_when_the_source_invalidated_the_slot(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    online.replicate()
    _lose_the_slot(databases, online.name)
    online.freeze()

    bound = threading.Timer(BOUND, online.env.cancel)
    bound.start()
    started = time.monotonic()
    try:
        with pytest.raises(ReplicationBroken) as broken:
            online.catch_up()
    except CancelledError:
        pytest.fail(f"catch-up still waited for the lost slot after {time.monotonic() - started:.0f}s")
    finally:
        bound.cancel()

    assert "invalidated the replication slot" in str(broken.value)
    assert "max_slot_wal_keep_size" in str(broken.value)
    online.undo_catch_up()
    online.undo_replicate()
    online.undo_freeze()
    assert leftovers(databases) == NOTHING


def test_replicate_run_again_fails_at_once_with_replication_broken_when_the_source_invalidated_the_slot(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    online.replicate()
    _lose_the_slot(databases, online.name)

    bound = threading.Timer(BOUND, online.env.cancel)
    bound.start()
    try:
        with pytest.raises(ReplicationBroken, match="invalidated the replication slot"):
            online.replicate()
    except CancelledError:
        pytest.fail("replicate still waited for the lost slot")
    finally:
        bound.cancel()

    online.undo_replicate()
    assert leftovers(databases) == NOTHING
