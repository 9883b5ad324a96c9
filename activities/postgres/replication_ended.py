"""The source's record that a Migration's replication was ended for good, which a late attempt of replicate cannot pass.

CREATE SUBSCRIPTION uses a logical slot on the source, and a slot nobody reads keeps the
source's WAL forever: it fills the disk of the very database being migrated. An attempt
of replicate whose worker stood still (SIGSTOP, a frozen VM) or lost Temporal can outlive
the saga's decision that it failed: the saga ends the replication (undo_replicate,
undo_catch_up, or catch-up once the target has caught up), and the attempt, going on,
would publish the source and make the slot and the subscription again, after the end.
Nothing would ever drop them.

So whatever ends a replication for good first records it on the source, in the
database setting ferry.replication_ended: a JSON object with an entry per Migration uid
saying which activity ended it (`attempts.Attempt`: its workflow run, its activity id,
when Temporal scheduled it). An attempt of replicate refuses, with ReplicationEnded, to
create the publication, the slot or the subscription when the entry of its Migration
names an activity scheduled after it (`Attempt.before`): it is a late attempt of a step
the saga has moved past. An attempt scheduled after the end (failurePolicy Pause undoes
back to replicate, and retry runs replicate again in the same run) goes on, and so does
any retry of a replicate nothing ended, and any other Migration of the same source. The
setting lives on the source, so it outlives the target; it keeps the newest KEPT entries,
so it stays small, and no snapshot carries it (pg_dump writes no database settings
without --create).

The record and the creation do not interleave. Both take LOCK for the Migration on the
source, a session-level advisory lock: the creation from its check until the subscription
is committed, the end from before its record until the replication is ended. The
subscription is created in a transaction on the target that holds the same lock there
and checks the source again (through the session holding the source's lock) before it
commits. So an attempt either created everything before the record, and the end finds
and drops it, or finds the record and creates nothing. A holder of the lock that stands
still would hold it forever, so whoever ends the replication ends the other sessions
holding it (`holding`): they are attempts of this Migration the saga has written off,
ending their session rolls back what they had not committed, and a late attempt whose
source session was ended fails at its next query of the source, before its subscription
commits, or before the emptying of the target it began commits (replicate empties the
target in a transaction that holds the lock there and asks the source again before it
commits). replicate ends the sessions of other replicate attempts the same way, but not
those of an activity ending the replication (each of those also holds ENDING while it
holds the lock): it waits for them, then finds their record and refuses. A late attempt
of replicate must not cut short a catch-up that the source's writes wait for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator

import psycopg
from temporalio import activity

from activities.postgres import attempts, database_settings, kept_records
from activities.postgres.attempts import Attempt
from activities.postgres.connection import Connection
from activities.postgres.database_settings import REPLICATION_ENDED
from activities.postgres.replication import Retry, briefly_locked
from activities.secrets import DatabaseConnection
from ferry.api.errors import ReplicationEnded

KEPT = 32
"""How many Migrations' entries the setting keeps, the newest (see kept_records): one entry is a hundred-odd bytes."""
SETTING_LOCK = 0x6665727279_656E
"""The advisory lock (transaction-level) under which the setting is read and written, whichever Migration's entry."""
POLL = 0.2
"""Seconds between two tries to take LOCK while other sessions hold it and are being ended."""
KEY = "select hashtextextended('ferry replication ' || %s, 0)"
"""A Migration's LOCK: a bigint made from its uid, the same on every server."""
ENDING_KEY = "select hashtextextended('ferry replication ending ' || %s, 0)"
"""A second lock of the Migration's, which the activities ending its replication hold beside LOCK, and only they: it
tells replicate which holders of LOCK not to end."""


@dataclasses.dataclass(frozen=True)
class Ended:
    """A Migration's entry in the setting."""

    owner: str
    """The Migration (namespace/name/uid)."""
    by: str
    """What ended its replication: undo_replicate, undo_catch_up (a rollback), or catch-up."""
    attempt: Attempt
    """The activity that ended it."""
    at: str
    """When, by the source's clock: UTC, ISO 8601 (kept_records.STAMP); an older ferry's in its session's own form."""


def key(conn: Connection, uid: str, statement: str = KEY) -> int:
    row = conn.execute(statement, (uid,)).fetchone()
    assert row is not None
    return int(row[0])


@contextlib.contextmanager
def holding(conn: Connection, uid: str, between_tries: Callable[[], None], *, ending: bool = False) -> Iterator[None]:
    """Holds the Migration's LOCK on `conn`'s server for the block (session-level); `between_tries` heartbeats (and
    raises once the activity is cancelled) while it waits.

    `ending`: the caller ends the replication for good; it holds ENDING too, and ends every other session holding
    either. Otherwise (replicate) it ends the other sessions holding LOCK except those holding ENDING, which it waits
    for.
    """
    taken: list[int] = []
    try:
        if ending:
            taken.append(_take(conn, key(conn, uid, ENDING_KEY), "select pg_try_advisory_lock(%s)", between_tries))
            spare = None
        else:
            spare = key(conn, uid, ENDING_KEY)
        taken.append(_take(conn, key(conn, uid), "select pg_try_advisory_lock(%s)", between_tries, spare))
        yield
    finally:
        if not conn.closed:
            with contextlib.suppress(psycopg.Error):
                for lock in reversed(taken):
                    conn.execute("select pg_advisory_unlock(%s)", (lock,))


def hold_in_transaction(conn: Connection, uid: str, between_tries: Callable[[], None]) -> None:
    """Takes the Migration's LOCK in the transaction open on `conn` (replicate's, never an end's), ending the sessions
    of other replicate attempts that hold it and waiting for those of an activity ending the replication."""
    _take(conn, key(conn, uid), "select pg_try_advisory_xact_lock(%s)", between_tries, key(conn, uid, ENDING_KEY))


def _take(
    conn: Connection, lock: int, statement: str, between_tries: Callable[[], None], spare: int | None = None
) -> int:
    """Takes `lock`, ending the other sessions that hold it, except those holding `spare`; returns `lock`."""
    while True:
        row = conn.execute(statement, (lock,)).fetchone()
        if row is not None and row[0]:
            return lock
        spared = set(attempts.holders(conn, spare)) if spare is not None else set()
        for pid in attempts.holders(conn, lock):
            if pid in spared:
                activity.logger.info("waiting for session %s, which is ending the replication", pid)
                continue
            activity.logger.warning("ending session %s, which holds the lock of a late attempt of replicate", pid)
            conn.execute("select pg_terminate_backend(%s, 5000)", (pid,))
        between_tries()
        time.sleep(POLL)


def read(conn: Connection) -> dict[str, Ended]:
    """The entries of the setting, by Migration uid; an unreadable one is left out (it refuses nothing)."""
    value = database_settings.read(conn).get(REPLICATION_ENDED)
    entries: dict[str, Ended] = {}
    try:
        fields = json.loads(value) if value else {}
        for uid, entry in fields.items():
            entries[uid] = Ended(
                owner=str(entry["owner"]),
                by=str(entry["by"]),
                attempt=Attempt.from_json(entry["attempt"]),
                at=str(entry["at"]),
            )
    except (ValueError, KeyError, TypeError, AttributeError):
        activity.logger.warning("the setting %s of the source is not ferry's: %r", REPLICATION_ENDED, value)
    return entries


def record(conn: Connection, db: DatabaseConnection, uid: str, owner: str, by: str, retry: Retry) -> bool:
    """Records on the source that the current activity, `by`, ends `owner`'s replication; False when the Secret's user
    may not set the setting (then a late attempt is not refused: see the warning logged).

    The caller holds the Migration's LOCK (`holding`), from before this until the replication is ended. SETTING_LOCK,
    which every Migration's end of this source takes, is waited for LOCK_WAIT at a time (replication.briefly_locked):
    an end of another Migration whose worker stood still in its transaction would otherwise hold this one, without a
    word, for as long; `retry` says so, heartbeats, and raises once the activity is cancelled.
    """
    attempt = Attempt.current()

    def write() -> None:
        conn.execute("select pg_advisory_xact_lock(%s)", (SETTING_LOCK,))
        entries = read(conn)
        entries[uid] = Ended(owner=owner, by=by, attempt=attempt, at=kept_records.stamp(conn))
        kept = kept_records.newest(entries, lambda ended: ended.at, KEPT, uid)
        value = {
            uid: {
                "owner": ended.owner,
                "by": ended.by,
                "attempt": ended.attempt.as_json(),
                "at": ended.at,
            }
            for uid, ended in kept.items()
        }
        database_settings.change(conn, REPLICATION_ENDED, json.dumps(value, sort_keys=True))

    try:
        briefly_locked(conn, write, retry)
    except psycopg.errors.InsufficientPrivilege as error:
        activity.logger.warning(
            "could not record on %s that the replication of Migration %s has ended (%s): a late attempt of its "
            "replicate would not be refused. As a superuser, GRANT SET ON PARAMETER %s TO %s.",
            db.describe(), owner, str(error).strip(), REPLICATION_ENDED, db.username,
        )  # fmt: skip
        return False
    return True


def refuse_if_ended(conn: Connection, db: DatabaseConnection, uid: str, doing: str) -> None:
    """Raises ReplicationEnded when the source records that the current attempt's Migration's replication was ended by
    an activity scheduled after this attempt. Under the Migration's LOCK, nothing ends it until the lock is let go."""
    ended = read(conn).get(uid)
    attempt = Attempt.current()
    if ended is None or not attempt.before(ended.attempt):
        return
    how = "by catch-up, once the target had caught up" if ended.by == "catch-up" else f"by the rollback ({ended.by})"
    raise ReplicationEnded(
        f"refused to {doing} on {db.describe()} for Migration {ended.owner}: its replication was ended {how} at "
        f"{ended.at}, after this attempt of replicate was scheduled. This is a late attempt of a step the saga has "
        "moved past (its worker stood still or lost Temporal past its heartbeat timeout); it created no publication, "
        "slot or subscription, and there is nothing to do. The saga schedules a new attempt if it replicates again."
    )
