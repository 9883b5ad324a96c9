"""The freeze's safety net: has anything been written to the frozen source since the freeze?

The freeze keeps out whom it can (see grants), but superusers and members of ferry's
role can still connect, and any client can open a read-write transaction explicitly.
So the freeze takes a FenceMark of the source once it is quiet, and check_frozen,
run before traffic moves and before the source is scaled down, compares the present
with it and fails with WritesAfterFreeze when anything changed.

What the mark holds, and why each part:
- writes: n_tup_ins + n_tup_upd + n_tup_del summed over the database's user tables
  (temporary ones left out: a read-only transaction may write those, and they are not
  migrated) and over pg_largeobject and pg_largeobject_metadata. Every insert, update,
  delete, COPY, and large object write counts, in any table. Nothing else moves these
  counters: ANALYZE, VACUUM and autovacuum change other columns of the same view, and
  reads (pg_dump, verify) none; ferry's own ALTER DATABASE and GRANT write shared
  catalogs, which are not user tables. LSN and xid counters are not used: they are
  instance-wide, and other databases, checkpoints and standby snapshots move them.
- stats_reset: when the database's statistics were last reset, and when the server's
  were (pg_stat_archiver.stats_reset, which also changes when a crash discards every
  statistic). A reset means the counters cannot vouch for anything: the check fails.
- catalog: a fingerprint of each user relation's oid and relfilenode, which catches
  TRUNCATE (it counts no rows), and of the normalized schema (see schema), which
  catches DDL. A rewrite by VACUUM FULL or CLUSTER changes the relfilenode as TRUNCATE
  does and cannot be told from it: the check then fails, on the safe side.
- sequences: a fingerprint of every sequence's last value; nextval and setval count
  (and, in `sequences_next`, of the value one set to start again hands out next)
  no rows.

Why the counters are exact enough. Since PostgreSQL 15 statistics live in shared
memory, but a backend keeps its counts in local memory until it flushes them: at most
once a second while it is idle, later when the shared entries are contended, and
always when it exits (before it leaves pg_stat_activity). A transaction's counts are
taken when it ends, committed or aborted (so a write attempted and rolled back counts
too); a prepared transaction's when it is committed or rolled back, not when it is
prepared. Hence:
- A prepared transaction still pending is invisible to the counters, and outlives the
  sessions the freeze ends. The freeze refuses to complete while the database has one
  (see freezing), and check_frozen fails while it has one: it was prepared after the
  mark, and its commit would be a write the target lacks. One prepared and ended
  (committed or rolled back) after the mark is counted like any other write.
- The freeze reads its mark once every session that began before the freeze has been
  ended and is gone: all that was written before the freeze is in the mark, and no late
  flush of it can raise a false alarm. A write by a session that began after the freeze
  (a superuser's) is either not yet counted, and then check_frozen sees it, or counted,
  and then it was over before the mark was read, hence before the snapshot began: the
  snapshot has it.
- check_frozen ends every session that began before it (client backends and walsenders
  of the database: a replication=database session runs SQL too; see freezing), and reads
  once they are gone: every write of theirs is counted. A session that connects while the check runs may
  not have flushed yet; only a superuser or a member of ferry's role can connect at
  all, and the next check (check_frozen runs before switch-traffic and again before
  scale-down-old) sees what it wrote.

All of this needs the statistics to count at all: the precheck refuses a source or a
target where track_counts is off, for the server, the database or any role (a session
of a superuser that turns it off itself remains outside what any count can see, as a
superuser is outside every fence).

verify takes the same mark of the target before traffic moves to it, and check_unwritten
compares it before traffic goes back: see unwritten, which says why that mark is exact
and what a check of a live target, which ends no session, cannot see.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence

from activities.postgres import freezing, schema
from activities.postgres.connection import Connection
from ferry.api.saga import FenceMark

RESET = "to_char(stats_reset at time zone 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
WRITES = f"""
select
    (select coalesce(sum(s.n_tup_ins + s.n_tup_upd + s.n_tup_del), 0)
        from pg_stat_user_tables s join pg_class c on c.oid = s.relid where c.relpersistence <> 't')
    + (select coalesce(sum(s.n_tup_ins + s.n_tup_upd + s.n_tup_del), 0) from pg_stat_all_tables s
        where s.relid in ('pg_catalog.pg_largeobject'::regclass, 'pg_catalog.pg_largeobject_metadata'::regclass)),
    (select {RESET} from pg_stat_database where datname = current_database()),
    (select {RESET} from pg_stat_archiver)
"""

STORAGE = f"""
select c.oid::bigint, c.relfilenode::bigint from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.relkind in ('r', 'p', 'm', 'S') and c.relpersistence <> 't' and {schema.USER}
order by 1
"""


def mark(
    conn: Connection,
    session_end_timeout: float,
    between_rounds: Callable[[int], None],
    spare_slots: Sequence[str] = (),
) -> tuple[FenceMark, int]:
    """Ends every other session that began before now, then reads; returns the mark and how many sessions ended.

    `spare_slots`: replication slots whose walsenders are not ended (this Migration's own, see freezing).
    """
    ended = freezing.end_sessions(conn, session_end_timeout, between_rounds, spare_slots)
    return read(conn), ended


def pending(conn: Connection) -> list[str]:
    """The prepared transactions still pending, in words: writes no count shows until they end.

    The freeze refuses to complete while any exists, so one found later was prepared after the
    mark; once its coordinator commits it, the source holds a write the target lacks.
    """
    found = freezing.prepared(conn)
    if not found:
        return []
    return [
        f"transactions were prepared (PREPARE TRANSACTION) and are still pending: {freezing.listed(found)}; "
        "once committed, their writes would be on the source alone"
    ]


def read(conn: Connection) -> FenceMark:
    """Where the database's writes, catalog and sequences stand now, as far as the shared statistics know."""
    conn.execute("select pg_stat_clear_snapshot()")
    row = conn.execute(WRITES).fetchone()
    assert row is not None
    writes, database_reset, server_reset = row
    storage = conn.execute(STORAGE).fetchall()
    standing = schema.sequence_values(conn)
    return FenceMark(
        writes=int(writes),
        stats_reset=f"database {database_reset or 'never'}, server {server_reset or 'never'}",
        catalog=_digest({"storage": storage, "schema": schema.describe(conn)}),
        sequences=_digest(schema.as_last_values(standing)),
        sequences_next=_digest(standing),
    )


def changes(mark: FenceMark, present: FenceMark, since: str = "the freeze") -> list[str]:
    """What changed since `mark` (taken at `since`), in words; empty when nothing did."""
    found: list[str] = []
    if present.stats_reset != mark.stats_reset:
        found.append(
            f"the statistics were reset since {since} (was: {mark.stats_reset}; now: {present.stats_reset}), by "
            "pg_stat_reset or a crash of the server, so ferry cannot tell whether anything was written"
        )
    if present.writes > mark.writes:
        written = present.writes - mark.writes
        found.append(f"{written} {'row was' if written == 1 else 'rows were'} inserted, updated or deleted")
    elif present.writes < mark.writes:
        found.append(
            f"the count of rows written went back from {mark.writes} to {present.writes} (a table was dropped, "
            "or statistics were lost)"
        )
    if present.catalog != mark.catalog:
        found.append("tables or the schema changed (TRUNCATE, DDL, or a rewrite such as VACUUM FULL or CLUSTER)")
    if mark.sequences_next is not None and present.sequences_next is not None:
        moved = present.sequences != mark.sequences or present.sequences_next != mark.sequences_next
    else:  # a mark without sequences_next: its `sequences` read sequences one way or the other, as its worker did
        moved = mark.sequences is not None and mark.sequences not in (present.sequences, present.sequences_next)
    if moved:
        found.append("sequences moved (nextval or setval)")
    return found


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
