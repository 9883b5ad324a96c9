"""After a restore, the target's planner statistics are gathered by several sessions at once, for every relation a
plain ANALYZE covers; a failure of one session stops the others and fails the step."""

from __future__ import annotations

import threading

import psycopg
import pytest
from temporalio.testing import ActivityEnvironment

from activities.heartbeats import Heartbeats
from activities.postgres import analyzing
from tests.cluster import eventually
from tests.end_to_end import Databases
from tests.postgres.data import connect, create_shop, other_sessions, with_statistics

MORE = """
create table shop.events (id bigint, at date not null, kind text) partition by range (at);
create table shop.events_2024 partition of shop.events for values from ('2024-01-01') to ('2025-01-01');
create table shop.events_2025 partition of shop.events for values from ('2025-01-01') to ('2026-01-01');
insert into shop.events select i, date '2024-01-01' + (i % 700), 'k' || i % 5 from generate_series(1, 5000) as i;
create materialized view shop.totals as select customer_id, sum(total) as total from shop.orders group by 1;
"""
RELATIONS = [
    "audit.log",
    "shop.customers",
    "shop.events",
    "shop.events_2024",
    "shop.events_2025",
    "shop.orders",
    "shop.totals",
]


@pytest.fixture
def target(databases: Databases) -> Databases:
    """The target holding the shop, a partitioned table and a materialized view, never analyzed."""
    create_shop(databases.target, customers=300, orders=2_000)
    with connect(databases.target) as conn:
        conn.execute(MORE)
        conn.execute("select pg_stat_reset()")
        conn.execute("delete from pg_statistic s using pg_class c where c.oid = s.starelid and "
                     "c.relnamespace in ('shop'::regnamespace, 'audit'::regnamespace)")  # fmt: skip
    assert with_statistics(databases.target) == []
    return databases


def _analyze(databases: Databases, sessions: int, extra_refused: bool = False, **session: str) -> list[int]:
    """Runs analyzing.analyze against the target as an activity; returns the pids of the sessions it opened. With
    `extra_refused`, every extra session is refused as a server out of connections refuses it."""
    pids: list[int] = []
    lock = threading.Lock()

    def opened() -> psycopg.Connection[tuple[object, ...]]:
        conn = connect(databases.target, **session)
        with lock:
            pids.append(conn.info.backend_pid)
        return conn

    def extra() -> psycopg.Connection[tuple[object, ...]]:
        if extra_refused:
            raise psycopg.OperationalError("FATAL:  sorry, too many clients already")
        return opened()

    def run() -> None:
        with Heartbeats(1.0) as heartbeats:
            analyzing.analyze(opened, extra, heartbeats, sessions)

    ActivityEnvironment().run(run)
    return pids


def test_several_sessions_analyze_every_relation_a_plain_analyze_covers(target: Databases) -> None:
    pids = _analyze(target, sessions=3)

    assert with_statistics(target.target) == RELATIONS
    assert len(set(pids)) == 3, "the session that listed the relations and two more, at once"


def test_one_session_analyzes_the_whole_database_at_once(target: Databases) -> None:
    pids = _analyze(target, sessions=1)

    assert with_statistics(target.target) == RELATIONS
    assert len(pids) == 1


def test_a_target_short_of_connections_is_analyzed_by_the_sessions_it_takes(target: Databases) -> None:
    pids = _analyze(target, sessions=4, extra_refused=True)

    assert with_statistics(target.target) == RELATIONS
    assert len(pids) == 1


def test_an_analyze_that_fails_stops_the_others_and_fails_the_step(target: Databases) -> None:
    with connect(target.target) as holder:
        holder.execute("begin")
        holder.execute("lock table shop.orders in access exclusive mode")

        with pytest.raises(psycopg.errors.LockNotAvailable):
            _analyze(target, sessions=3, lock_timeout="200ms")

        holder.execute("rollback")
    eventually("every session the analyze opened to end", lambda: other_sessions(target.target) == 0, timeout=10)
