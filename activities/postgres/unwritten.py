"""Has the target been written since traffic moved to it? Verify's mark of the target, kept in it, and the check.

A rollback after switch-traffic points the clients' Service back at the source, and
undo_migrate then empties the target: whatever the clients wrote to the target
meanwhile would be lost without a word. So verify, once it found the target equal to
the source, takes the target's FenceMark (see fencing) and records it in the target as
the setting ferry.verified_mark (with the Migration that took it); check_unwritten, run
before every attempt of switch-traffic's undo, compares the target with that mark and
fails with WritesOnTarget when anything changed, so traffic stays on the target. The
undo that then empties the target (restoring.remove, for undo_migrate, the snapshot's
undo and replicate's) compares again (`vouch`), once the target's sessions are ended,
and fails the same way, dropping nothing: the saga stops the rollback there, before
provision's undo deletes the target's volumes.

Why verify's mark raises no false alarm later. When verify ends, the target is still
ferry's own: nobody but ferry wrote to it. The mark is read (fencing.mark) once every
other session of the target that began before it has been ended and is gone: the
restore's (pg_restore's, and migrate's own that prepared the target), verify's readers,
and any left behind by an attempt whose worker died. A session flushes its statistics
as it exits, before it leaves pg_stat_activity, so every row the restore wrote (or an
aborted attempt tried to) is counted in the mark, and none can be counted after it.
Verify's reads move none of the counters (only inserts, updates and deletes do), nor the
catalog or sequence fingerprints. Recording the marker is an ALTER DATABASE, which
writes a shared catalog, not a user table. What the target may see later without a
client writing to it changes nothing either: autovacuum and ANALYZE (other columns of
the same statistics, the same relfilenodes), reads, ferry's own checks, a clean restart
(the server keeps its statistics). A crash of the target's server discards them: the
check then fails, since it cannot vouch for anything, which is the safe side.

Why check_unwritten ends no session, and what that leaves. The target is live: its
sessions are the application's. So the check reads the present as the shared
statistics know it, after waiting (at most `SETTLE` seconds) until every other session
has been idle long enough to have flushed its counts. A backend that goes idle flushes
at once, unless it flushed less than a second before: then it flushes when it has been
idle for 10 seconds (PostgreSQL's PGSTAT_IDLE_INTERVAL); when the shared statistics are
contended, it tries again every 10 seconds, for a minute at most. Sequences and the
catalog are read directly, exactly. What no check short of freezing the target can see:
a write whose counts are not flushed when the wait ends (a session busy all along, or
one whose flush met contention), and a write made after the check, before the Service's
selector is back (or over a connection to the target that stays open: changing a
Service ends none). Such a write is seen before it could be lost: the next undo empties
the target, and it compares first (`vouch`). Still, stop the clients' writes before
rolling back after switch-traffic: a write the undo finds stops the rollback, with the
source frozen and traffic on it, until a person has copied the write into the source.

Why the undo that empties the target can compare exactly, and nothing commits between
its comparison and its DROP. By then traffic has left the target, so `vouch`, in the
transaction that then drops everything, may end the target's sessions: the application's
pooled ones first, then it takes ACCESS EXCLUSIVE locks on every user table, then it
ends every session again (one that connected between the two rounds may have written
before the locks) and waits until they are gone. Every write committed before the locks
was made by a session that has exited since, flushing its counts, so the mark read now
counts it; no session can write a user table after the locks until the transaction ends,
by commit (after the DROP) or rollback (after WritesOnTarget, with nothing dropped). A
session blocked behind the locks is ended with its transaction, which counts the rows it
tried before it blocked, and so refuses, on the safe side. Revoking CONNECT or a
connection limit would not do: they are transactional, so they keep nobody out before
they commit, and ferry's role and superusers are not kept out by them at all. What the
locks do not cover: a session that connects after the second round may still, before the
DROP, call nextval (harmless: sequences are dropped with the rest, and one moved before
the comparison refuses), write a large object, or create a table of its own and fill it.
Nothing of the application's reaches the target that way once its Service selects the
source, and a session that connects to the target itself in those milliseconds is
outside what any check short of stopping the server can see.

Why a late attempt cannot undo verify. A worker paused (SIGSTOP, a frozen VM) in the
middle of snapshot or migrate is written off after its heartbeat timeout, and the saga
goes on with another attempt, then verify, then switch-traffic. When it resumes, what it
was about to do (empty the target for its restore, truncate a table for a stream, mark
the restore complete, commit a restore) would destroy a target that may be serving
traffic. So each of those refuses, with TargetVerified, once the target carries verify's
mark (`refuse_if_verified`), and the two are serialized: the refusing check and verify's
`record` both take LOCK, a transaction-level advisory lock, in the transaction that does
their work, so a destructive transaction either commits before verify's mark (and its
writes show as writes on the target) or sees the mark. A restore by pg_restore or psql
commits in a session of its own: `unverified` holds the check's transaction, on a
session of ferry's, until that restore has committed (it cannot commit before the check:
restoring.Restore holds back the end of its input). Only the undos (restoring.remove)
clear the mark, and only once it vouched for the target (`vouch`); every legitimate
restore again comes after an undo.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator

import pydantic
from psycopg import sql

from activities.postgres import database_settings, fencing, schema
from activities.postgres.connection import NO_TRANSACTION_TIMEOUTS, Connection
from activities.postgres.database_settings import VERIFIED_MARK
from activities.secrets import DatabaseConnection
from ferry.api.errors import TargetVerified, WritesOnTarget
from ferry.api.saga import FenceMark

FLUSHED_AFTER = 11.0
"""Seconds a session must have been idle for its counts to be in the shared statistics (PostgreSQL: 10 s at most)."""
SETTLE = 15.0
"""Seconds check_unwritten waits at most for sessions to flush: a busy target may never be all idle."""
POLL = 0.2
LOCK = 0x6665727279_766D
"""The advisory lock (pg_advisory_xact_lock) verify's marking and every destructive change by a restore take."""

PENDING = """
select count(*) from pg_stat_activity
where datname = current_database() and pid <> pg_backend_pid() and backend_type = 'client backend'
and (state is distinct from 'idle' or state_change > clock_timestamp() - make_interval(secs => %s))
"""
"""Other sessions that may hold counts not yet flushed: busy, in a transaction, lately idle, or not visible."""
TABLES = f"""
select n.nspname, c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.relkind in ('r', 'p') and {schema.USER}
order by 1, 2
"""
"""The user tables, which `vouch` locks: every write that FenceMark counts but sequences and large objects."""


def record(conn: Connection, owner: str, fence: FenceMark) -> None:
    """Keeps `fence` in the target as `owner`'s mark, replacing any earlier one, under LOCK."""
    value = json.dumps({"migration": owner, "fence": fence.model_dump(mode="json")}, sort_keys=True)
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(%s)", (LOCK,))
        database_settings.change(conn, VERIFIED_MARK, value)


def refuse_if_verified(conn: Connection, db: DatabaseConnection, doing: str) -> None:
    """Takes LOCK in the caller's transaction on `conn`, then raises TargetVerified if the target carries verify's mark
    (anyone's: a mark names a Migration whose traffic may be there), so that the transaction's work, `doing`, never
    follows verify's marking.
    """
    conn.execute("select pg_advisory_xact_lock(%s)", (LOCK,))
    value = database_settings.read(conn).get(VERIFIED_MARK)
    if value is None:
        return
    try:
        whose = f"Migration {json.loads(value)['migration']}"
    except (ValueError, KeyError, TypeError):
        whose = "a Migration"
    raise TargetVerified(
        f"refused to {doing} on {db.describe()}: verify of {whose} has marked it ({VERIFIED_MARK}), so it may "
        "be taking traffic. This is a late attempt of a step the saga has moved past (its worker stood still past "
        "its heartbeat timeout), and it changed nothing. To migrate into this target again, roll the Migration "
        "back (the undo checks the target took no writes, then empties it and removes the mark); a mark left by "
        f"hand on a database no traffic uses goes with ALTER DATABASE ... RESET {VERIFIED_MARK}."
    )


@contextlib.contextmanager
def unverified(conn: Connection, db: DatabaseConnection, doing: str) -> Iterator[None]:
    """Holds, on `conn` (a session of its own), a transaction that found no verify's mark on the target (see
    `refuse_if_verified`) and keeps verify from marking it until the block ends: for work that another session commits
    within the block (pg_restore's, psql's)."""
    conn.execute(NO_TRANSACTION_TIMEOUTS)
    with conn.transaction():
        refuse_if_verified(conn, db, doing)
        yield


def recorded(conn: Connection, owner: str) -> FenceMark | None:
    """The mark `owner`'s verify recorded in the target; None when there is none of `owner`'s (or it is unreadable)."""
    value = database_settings.read(conn).get(VERIFIED_MARK)
    if value is None:
        return None
    try:
        entry = json.loads(value)
        if not isinstance(entry, dict) or entry.get("migration") != owner:
            return None
        return FenceMark.model_validate(entry.get("fence"))
    except (ValueError, pydantic.ValidationError):
        return None


def forget(conn: Connection) -> None:
    """Removes the mark, whoever's it is: called where the target's restore is removed or started again."""
    if VERIFIED_MARK in database_settings.read(conn):
        database_settings.change(conn, VERIFIED_MARK, None)


def settle(conn: Connection, between_polls: Callable[[], None]) -> bool:
    """Waits until no other session may hold unflushed counts, at most SETTLE seconds; False if some still may."""
    deadline = time.monotonic() + SETTLE
    while True:
        row = conn.execute(PENDING, (FLUSHED_AFTER,)).fetchone()
        if row is None or row[0] == 0:
            return True
        if time.monotonic() >= deadline:
            return False
        between_polls()
        time.sleep(POLL)


def vouch(conn: Connection, db: DatabaseConnection, owner: str, end_sessions: Callable[[Connection], int]) -> None:
    """In the caller's transaction on `conn`, which goes on to empty the target: raises WritesOnTarget, so that
    nothing is dropped, unless the target carries no verify's mark or is as `owner`'s mark says.

    `end_sessions` ends every other session of the target that began before it was called and returns once they are
    gone (freezing.end_sessions). See the module's docstring for why the comparison comes after it and under the
    locks taken here.
    """
    value = database_settings.read(conn).get(VERIFIED_MARK)
    if value is None:
        return  # never verified: ferry moved no traffic to it
    mark = recorded(conn, owner)
    end_sessions(conn)  # the application's (traffic has left the target), so that no lock of theirs holds ours up
    tables = [sql.Identifier(namespace, name) for namespace, name in conn.execute(TABLES).fetchall()]
    if tables:
        conn.execute(sql.SQL("lock table {} in access exclusive mode").format(sql.SQL(", ").join(tables)))
    end_sessions(conn)  # whoever wrote before the locks flushed their counts as they exited
    present = fencing.read(conn)
    if mark is None:
        why = f"its mark ({VERIFIED_MARK}) is not this Migration's, so nothing vouches for what it took"
    else:
        found = fencing.changes(mark, present, since="verify marked it, before traffic moved")
        why = f"it took writes since traffic moved to it: {'; '.join(found)}" if found else ""
    if why:
        raise WritesOnTarget(
            f"refused to empty {db.describe()}: {why}. "
            "They were made after the check before traffic went back to the source (over a connection to the "
            "target that stayed open: changing a Service ends none), so only the target has them: the source does "
            "not. Nothing was dropped and the rollback stops here. Copy those writes into the source by hand, then "
            "empty the target and finish the rollback by hand as the README's recovery section says, and delete "
            "the Migration (which leaves the target as it is)."
        )
