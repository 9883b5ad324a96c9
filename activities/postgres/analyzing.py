"""The target's planner statistics after a restore, gathered by several sessions at once.

pg_restore leaves the target without statistics: until autovacuum gets to the tables,
the first queries after traffic moves would be planned blind. So the step that restored
runs ANALYZE, inside the write-downtime window. ANALYZE samples a bounded number of
rows of each relation (300 times default_statistics_target), so a relation larger than
that many pages costs about the same whatever its size, and most of that time is spent
waiting for the sampled pages to be read. So the relations are shared among a few
sessions, the largest first, each taking the next one when it is done: the waits
overlap. It analyzes what a plain ANALYZE does (every table, partitioned table and
materialized view of the database, the system catalogs included, no other session's
temporary tables); a relation its user may not analyze is skipped with the server's
warning, as there. The session that lists the relations is one of them; another that
cannot connect (a target short of connections) is done without. A cancellation, or the
failure of one ANALYZE, stops them all.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import contextvars
import threading
from collections.abc import Callable

import psycopg
from psycopg import sql
from temporalio import activity

from activities.heartbeats import Heartbeats
from activities.postgres.connection import Connection
from ferry.api.errors import BadCredentials, DatabaseUnreachable

RELATIONS = """
select n.nspname, c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.relkind in ('r', 'm', 'p') and c.relpersistence <> 't'
order by c.relpages desc, n.nspname, c.relname
"""
"""What a plain ANALYZE analyzes, the largest first (by the pages the restore's statistics know of)."""


def analyze(
    connect: Callable[[], Connection], extra: Callable[[], Connection], heartbeats: Heartbeats, sessions: int
) -> None:
    """ANALYZE of every relation of the database, `sessions` at a time: the session `connect` opens, which lists
    them, and up to `sessions - 1` that `extra` opens. An extra session that cannot connect (a target short of
    connections) is done without: the others take its share."""
    try:
        with connect() as conn:  # a cancellation stops its ANALYZE (connection.Session)
            relations = collections.deque(
                sql.Identifier(schema, name) for schema, name in conn.execute(RELATIONS).fetchall()
            )
            if sessions < 2 or len(relations) < 2:
                conn.execute("analyze")
            else:
                _shared(conn, extra, heartbeats, relations, min(sessions, len(relations)))
    except BaseException:
        heartbeats.raise_if_cancelled("gathering the target's statistics")  # a cancelled query says why
        raise
    heartbeats.raise_if_cancelled("gathering the target's statistics")


def _shared(
    first: Connection, extra: Callable[[], Connection], heartbeats: Heartbeats,
    relations: collections.deque[sql.Identifier], sessions: int,
) -> None:  # fmt: skip
    """`first` and up to `sessions - 1` more sessions analyze `relations`, each taking the next one left; the first
    failure of an ANALYZE stops them all."""
    lock = threading.Lock()
    stopped = threading.Event()
    open_sessions: list[Connection] = [first]

    def stop_all() -> None:
        stopped.set()
        with lock:
            for conn in open_sessions:
                with contextlib.suppress(psycopg.Error):
                    conn.cancel_safe()

    def work(conn: Connection) -> None:
        while not stopped.is_set():
            with lock:
                if not relations:
                    return
                relation = relations.popleft()
            conn.execute(sql.SQL("analyze {}").format(relation))

    def another() -> None:
        try:
            conn = extra()
        except (psycopg.Error, DatabaseUnreachable, BadCredentials) as error:
            activity.logger.info("one session fewer gathers the target's statistics: %s", error)
            return
        with conn:
            with lock:
                open_sessions.append(conn)
            if stopped.is_set():
                return
            work(conn)

    heartbeats.on_cancel(stopped.set)  # the sessions' own stops end their ANALYZE (connection.Session)
    with concurrent.futures.ThreadPoolExecutor(max_workers=sessions, thread_name_prefix="analyze") as pool:
        # In a copy of the activity's context each: the sessions `extra` opens there register their stops.
        futures = [pool.submit(work, first)] + [
            pool.submit(contextvars.copy_context().run, another) for _ in range(sessions - 1)
        ]
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()
        except BaseException:
            stop_all()
            raise
