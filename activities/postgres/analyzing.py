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
warning, as there. A cancellation, or the failure of one session, stops them all.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable

import psycopg
from psycopg import sql

from activities.heartbeats import Heartbeats
from activities.postgres.connection import Connection

RELATIONS = """
select n.nspname, c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.relkind in ('r', 'm', 'p') and c.relpersistence <> 't'
order by c.relpages desc, n.nspname, c.relname
"""
"""What a plain ANALYZE analyzes, the largest first (by the pages the restore's statistics know of)."""


def analyze(connect: Callable[[], Connection], heartbeats: Heartbeats, sessions: int) -> None:
    """ANALYZE of every relation of the database that `connect` opens sessions to, `sessions` at a time."""
    try:
        with connect() as conn:
            heartbeats.on_cancel(conn.cancel_safe)
            relations = collections.deque(
                sql.Identifier(schema, name) for schema, name in conn.execute(RELATIONS).fetchall()
            )
            if sessions < 2 or len(relations) < 2:
                conn.execute("analyze")
                return
        _shared(connect, heartbeats, relations, min(sessions, len(relations)))
    except BaseException:
        heartbeats.raise_if_cancelled("gathering the target's statistics")  # a cancelled query says why
        raise
    heartbeats.raise_if_cancelled("gathering the target's statistics")


def _shared(
    connect: Callable[[], Connection], heartbeats: Heartbeats, relations: collections.deque[sql.Identifier],
    sessions: int,
) -> None:  # fmt: skip
    """`sessions` sessions analyze `relations`, each taking the next one left; the first failure stops them all."""
    lock = threading.Lock()
    stopped = threading.Event()
    open_sessions: list[Connection] = []

    def stop_all() -> None:
        stopped.set()
        with lock:
            for conn in open_sessions:
                with contextlib.suppress(psycopg.Error):
                    conn.cancel_safe()

    def session() -> None:
        with connect() as conn:
            with lock:
                open_sessions.append(conn)
            while not stopped.is_set():
                with lock:
                    if not relations:
                        return
                    relation = relations.popleft()
                conn.execute(sql.SQL("analyze {}").format(relation))

    heartbeats.on_cancel(stop_all)
    with concurrent.futures.ThreadPoolExecutor(max_workers=sessions, thread_name_prefix="analyze") as pool:
        futures = [pool.submit(session) for _ in range(sessions)]
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()
        except BaseException:
            stop_all()
            raise
