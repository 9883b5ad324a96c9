"""Has the target been written since traffic moved to it? Verify's mark of the target, kept in it, and the check.

A rollback after switch-traffic points the clients' Service back at the source, and
undo_migrate then empties the target: whatever the clients wrote to the target
meanwhile would be lost without a word. So verify, once it found the target equal to
the source, takes the target's FenceMark (see fencing) and records it in the target as
the setting ferry.verified_mark (with the Migration and the attempt that took it); check_unwritten, run
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

Why a late attempt of verify cannot replace the mark. An attempt of verify whose worker
stood still between its comparison and its marking is written off; the next one marks,
traffic moves, the clients write. Going on, the stalled one would end the application's
sessions on the live target and put in a mark that counts those writes, which an undo
without step results (check_unwritten's recorded mark, `vouch`) would then take for
unwritten: traffic back to the source, the target emptied, the writes lost. So the mark
names the attempt that took it (attempts.Attempt: workflow run, activity id, schedule
time, Temporal's attempt), and verify, in a transaction holding LOCK (`marking`), first
refuses with TargetVerified, having done nothing, when the mark there must stay
(`refuse_if_overtaken`): another Migration's (or not ferry's), one made by an activity
scheduled after this attempt, or one sealed; only then does it end the target's other
sessions, read and record (`record`, which checks again). Its start in mode Online, which
ends the target's sessions too, is refused the same way. The check before switch-traffic
(check_frozen) seals the mark once it found the source still frozen (`seal`): traffic may
move from then on, so no verify marks the target again, not even an attempt of the very
activity that marked it (a late one whose result the saga has) or of a reset's new run,
which is scheduled later; the undo that empties the target removes the seal with the mark.
A mark of a ferry from before attempts were recorded names none: it is taken for an
earlier attempt's and replaced, as before (a late attempt of a newer worker after an older
worker's marking, while the one replaces the other, is not stopped); a seal that cannot be
read counts as a seal. LOCK is held in these transactions by ferry alone, so `hold` ends
a session that keeps it: an attempt the saga wrote off may stand still with it for ever.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pydantic
from psycopg import sql
from temporalio import activity

from activities.postgres import attempts, database_settings, fencing, schema
from activities.postgres.attempts import Attempt
from activities.postgres.connection import NO_TRANSACTION_TIMEOUTS, Connection
from activities.postgres.database_settings import VERIFIED_MARK
from activities.secrets import DatabaseConnection
from ferry.api.errors import Overtaken, TargetVerified, WritesOnTarget
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


@dataclasses.dataclass(frozen=True)
class Mark:
    """verify's mark as the target keeps it (the setting VERIFIED_MARK, a JSON object)."""

    migration: str | None
    """The Migration whose verify took it (namespace/name/uid); None when the setting is not ferry's JSON."""
    attempt: Attempt | None
    """The attempt of verify that took it; None in a mark of a ferry from before it was kept (unknown)."""
    sealed_by: Attempt | None
    """The check before switch-traffic that found the source still frozen (`seal`): from then on traffic may move to
    the target, and no verify marks it again. None when none did, or in a mark from before seals."""
    entry: dict[str, Any]
    """The whole JSON object, kept as it is when it is sealed."""

    @staticmethod
    def parse(value: str) -> Mark:
        try:
            entry = json.loads(value)
        except ValueError:
            entry = None
        if not isinstance(entry, dict) or not isinstance(entry.get("migration"), str):
            return Mark(migration=None, attempt=None, sealed_by=None, entry={})
        return Mark(
            migration=entry["migration"],
            attempt=_attempt(entry.get("attempt")),
            sealed_by=_attempt(entry.get("sealed_by"), unreadable=UNREADABLE_SEAL),
            entry=entry,
        )


UNREADABLE_SEAL = Attempt(run="", activity="", scheduled=datetime.max.replace(tzinfo=UTC))
"""What a seal that cannot be read stands for: one (traffic may have moved), later than any attempt."""


def _attempt(value: object, unreadable: Attempt | None = None) -> Attempt | None:
    """The attempt in a mark's field; None when the field is missing, `unreadable` when it cannot be read."""
    if value is None:
        return None
    try:
        return Attempt.from_json(value)
    except (KeyError, TypeError, ValueError):
        return unreadable


def read_mark(conn: Connection) -> Mark | None:
    """The target's mark as it is; None when it has none."""
    value = database_settings.read(conn).get(VERIFIED_MARK)
    return None if value is None else Mark.parse(value)


class VerifyGuardLost(Exception):
    """verify's marking session, which held LOCK from its first read of the target, was ended before the mark was
    recorded. Not a PermanentError, so retried: a later attempt of verify ends it (`hold`) and marks the target; a
    session ended on the server leaves the next attempt to compare again."""


class TargetWrittenDuringVerify(Exception):
    """Someone wrote to the target while verify read it. Not a PermanentError: the next attempt of verify reads every
    table again, so a write that changed the target's data fails it with VerificationMismatch."""


class TargetUnsealed(Exception):
    """The target did not answer when the check before switch-traffic came to seal verify's mark on it. Not a
    PermanentError, so the check is tried again at the step's next attempt; traffic never moves to a target nothing
    has looked at since verify: a server that lost its volume and came back empty answers Ready all the same."""


@contextlib.contextmanager
def marking(conn: Connection, db: DatabaseConnection, owner: str, between_tries: Callable[[], None]) -> Iterator[None]:
    """A transaction on `conn` holding LOCK in which verify of `owner` may end the target's other sessions and mark it:
    refused first (TargetVerified, nothing done) when the running attempt must leave the target alone
    (`refuse_if_overtaken`). `between_tries` heartbeats (and raises once the activity is cancelled) while LOCK is
    taken (`hold`)."""
    conn.execute(NO_TRANSACTION_TIMEOUTS)  # the transaction spans ending sessions and reading every sequence
    with conn.transaction():
        hold(conn, between_tries)
        refuse_if_overtaken(conn, db, owner, Attempt.current())
        yield


def hold(conn: Connection, between_tries: Callable[[], None]) -> None:
    """Takes LOCK in the transaction open on `conn`, ending the other sessions that hold it meanwhile.

    Only ferry's sessions take LOCK: a restore's (`unverified`, `refuse_if_verified`), verify's marking, the seal. When
    verify marks or the seal is made, a holder is an attempt the saga wrote off (a restore verify follows, another
    attempt of verify), which may stand still with it for ever, or one that fails for it and is tried again. Ending it
    rolls back what it had not committed; the marking then ends the session of its pg_restore, which began before.
    """
    while True:
        row = conn.execute("select pg_try_advisory_xact_lock(%s)", (LOCK,)).fetchone()
        if row is not None and row[0]:
            return
        for pid in attempts.holders(conn, LOCK):
            activity.logger.warning("ending session %s, which holds the lock of verify's mark", pid)
            conn.execute("select pg_terminate_backend(%s, 5000)", (pid,))
        between_tries()
        time.sleep(POLL)


def refuse_if_overtaken(conn: Connection, db: DatabaseConnection, owner: str, attempt: Attempt) -> None:
    """Raises TargetVerified when `attempt`, of verify of `owner`, must neither end the target's sessions nor mark it:
    the target carries a mark of another Migration (or one that is not ferry's), a sealed one (`seal`), or one made by
    an activity scheduled after `attempt` (attempts.Attempt.before). The caller holds LOCK. A mark that names no
    attempt (an older ferry's) is taken for an earlier attempt's.
    """
    mark = read_mark(conn)
    if mark is None:
        return
    done = "It changed nothing: it ended no session of the target and left the mark as it is."
    undo = (
        "roll the Migration back (the undo checks the target took no writes, then empties it and removes the mark); "
        f"a mark left by hand on a database no traffic uses goes with ALTER DATABASE ... RESET {VERIFIED_MARK}."
    )
    if mark.migration != owner:
        whose = f"Migration {mark.migration}" if mark.migration else "a Migration"
        raise TargetVerified(
            f"refused to mark {db.describe()} as verified by Migration {owner}: verify of {whose} has marked it "
            f"({VERIFIED_MARK}), so it may be taking that Migration's traffic. {done} Two Migrations cannot share a "
            f"target: point this one's spec.driver.targetSecret at a database of its own, or, to use this one, {undo}"
        )
    if mark.sealed_by is not None:
        why = f"traffic may have moved to it: the check before switch-traffic ({mark.sealed_by.describe()}) sealed "
        why += "verify's mark"
    elif mark.attempt is not None and attempt.before(mark.attempt):
        why = f"a later attempt of verify ({mark.attempt.describe()}) has marked it, and traffic may have moved since"
    else:
        return
    raise TargetVerified(
        f"refused to mark {db.describe()} as verified: {why} ({VERIFIED_MARK}). This is a late attempt of verify "
        f"({attempt.describe()}) the saga has moved past (its worker stood still past its heartbeat timeout). {done} "
        f"Nothing to do; to migrate into this target again, {undo}"
    )


def record(conn: Connection, db: DatabaseConnection, owner: str, fence: FenceMark, by: Attempt) -> None:
    """Keeps `fence` in the target as `owner`'s mark taken by the attempt `by`, replacing an earlier one, under LOCK
    (taken here unless the caller's transaction, `marking`, holds it); refuses, changing nothing, as
    `refuse_if_overtaken` says."""
    entry = {"migration": owner, "fence": fence.model_dump(mode="json"), "attempt": by.as_json()}
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(%s)", (LOCK,))
        refuse_if_overtaken(conn, db, owner, by)
        database_settings.change(conn, VERIFIED_MARK, json.dumps(entry, sort_keys=True))


def seal(
    conn: Connection,
    owner: str,
    by: Attempt,
    between_tries: Callable[[], None],
    unchanged: Callable[[FenceMark], None] = lambda _: None,
) -> bool:
    """Adds to `owner`'s mark on the target that traffic may move to it from now on (the check before switch-traffic,
    `by`, found the source still frozen): no verify marks it again, whatever attempt it is, until an undo has emptied
    it and removed the mark. False when the target holds no mark of `owner` (nothing to seal); idempotent.

    Before it seals a mark, it calls `unchanged` with the mark's fence, in the same transaction: raising there leaves
    the mark unsealed. A sealed mark is not compared again: traffic may have moved to the target since."""
    conn.execute(NO_TRANSACTION_TIMEOUTS)
    with conn.transaction():
        hold(conn, between_tries)
        mark = read_mark(conn)
        if mark is None or mark.migration != owner:
            return False
        if mark.sealed_by is None:
            fence = recorded(conn, owner)
            if fence is not None:
                unchanged(fence)
            entry = {**mark.entry, "sealed_by": by.as_json()}
            database_settings.change(conn, VERIFIED_MARK, json.dumps(entry, sort_keys=True))
        return True


def refuse_if_undo_overtaken(db: DatabaseConnection, owner: str, mark: Mark, attempt: Attempt) -> None:
    """Raises Overtaken when `owner`'s mark was taken, or sealed, by an activity scheduled after `attempt`."""
    if mark.migration != owner:
        return  # vouch refuses it: the mark is not this Migration's
    later = [by for by in (mark.attempt, mark.sealed_by) if by not in (None, UNREADABLE_SEAL) and attempt.before(by)]
    if not later:
        return
    raise Overtaken(
        f"refused to empty {db.describe()}: this attempt of the undo ({attempt.describe()}) was scheduled before "
        f"{later[-1].describe()}, which marked the target ({VERIFIED_MARK}) after a later restore; it is a late "
        "attempt the saga has moved past (its worker stood still past its heartbeat timeout, then went on), and the "
        "target may be taking traffic now. It changed nothing: it ended no session and dropped nothing. Nothing to "
        "do: the saga's own steps and undos act on the target from here."
    )


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


def unmarked(conn: Connection) -> bool:
    """Takes LOCK in the caller's transaction on `conn`, then tells whether the target carries no verify's mark: none
    can be made until the transaction ends (verify's marking takes LOCK), so until then no traffic can move to it."""
    conn.execute("select pg_advisory_xact_lock(%s)", (LOCK,))
    return VERIFIED_MARK not in database_settings.read(conn)


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


def vouch(
    conn: Connection,
    db: DatabaseConnection,
    owner: str,
    end_sessions: Callable[[Connection], int],
    attempt: Attempt | None = None,
) -> None:
    """In the caller's transaction on `conn`, which goes on to empty the target: raises WritesOnTarget, so that
    nothing is dropped, unless the target carries no verify's mark or is as `owner`'s mark says.

    `end_sessions` ends every other session of the target that began before it was called and returns once they are
    gone (freezing.end_sessions). See the module's docstring for why the comparison comes after it and under the
    locks taken here.

    `attempt`, the undo's own: an undo scheduled before the verify that took `owner`'s mark, or before the check that
    sealed it, is a late attempt the saga has moved past (its worker stood still past its heartbeat timeout, then
    went on): since then the saga went forward again (failurePolicy Pause, then retry), so the target it would empty
    was restored, verified and perhaps given the traffic by later steps. It is refused (Overtaken) before it
    ends any session.
    """
    value = database_settings.read(conn).get(VERIFIED_MARK)
    if value is None:
        return  # never verified: ferry moved no traffic to it
    if attempt is not None:
        refuse_if_undo_overtaken(db, owner, Mark.parse(value), attempt)
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
