"""Stopping writes on the source database, and letting them resume exactly as before.

The freeze, in one transaction, sets the database's default_transaction_read_only to
on, so every transaction of a new session is read-only, and revokes CONNECT from
everyone but ferry's own role (see grants), so that a client cannot come back and
open a read-write transaction explicitly. Then it ends the sessions that were already
there, rolling back whatever they had open: from then on the server acknowledges no
write of theirs, so no acknowledged write can be missing from a snapshot taken
afterwards. Those sessions are the client backends and the walsenders of the database
(a role with REPLICATION connected with replication=database runs SQL, and writes, in a
walsender), except the walsenders of this Migration's own replication slots in mode
Online. What the fence cannot keep out (superusers, members of ferry's role) is caught
by check_frozen (see fencing).

A prepared transaction (PREPARE TRANSACTION, phase one of a two-phase commit that an
XA/JTA transaction manager drives) belongs to no session: ending sessions leaves it
there, neither committed nor rolled back. Its coordinator may already have told its
client "committed", and will send COMMIT PREPARED, but no longer can once CONNECT is
revoked; meanwhile neither pg_dump nor logical decoding carries its rows, and its
statistics are counted only when it ends. So once the sessions are ended, the freeze
looks for prepared transactions of the database: if there are any, it undoes itself and
fails with PreparedTransactionsPending, which the saga retries (a coordinator normally
ends them within seconds, once it may connect again). The undo puts the setting and the CONNECT grants
back as they were and ends the sessions opened during the freeze, which would otherwise
stay read-only until they reconnect.

A subscription in the database (the source itself subscribes to a publication elsewhere)
writes through its apply worker, a background worker that is no session to end: it
applies rows with no read-only check, and the launcher starts it again if it is ended.
So the freeze, at the same point, undoes itself as well if the database has an enabled
subscription, and fails with InvalidSpec: a subscription does not disable itself, and
each retry would end the application's sessions again for nothing.

Idempotency: the previous setting and ACL are recorded in the database itself, in the
same transaction that turns the freeze on (see database_settings). A retry after a
crash finds ferry.frozen_by naming its own Migration and takes the previous values from
ferry.read_only_before and ferry.connect_before, never the frozen state of its own
earlier attempt. Another Migration's marker means someone else froze this database: the
freeze refuses, rather than let its undo unfreeze a database it did not freeze.

Late attempts (their worker stood still past the heartbeat timeout, then went on; see
attempts): the freeze and its undo take one advisory lock (`LOCK`) and each records its
attempt, the undo in ferry.unfrozen_by, the freeze in ferry.frozen_attempt beside
ferry.frozen_by. A freeze scheduled before an undo that ran refuses (Overtaken), or
nothing would ever undo it; an undo (or a freeze's cleanup of itself) scheduled before
the freeze in place refuses too, or, under failurePolicy Pause, a first cycle's undo
going on late would unfreeze the source under the second cycle's snapshot. A freeze by
an older ferry records no attempt, and its undo goes on as before.

Standbys: the freeze and its undo are WAL like any write, and the physical standbys of the
source (a failover manager's replicas) replay them. The sessions of the freeze, its undo and
the checks refuse a standby (connection.ServerInRecovery). The undo, once committed, waits a
bounded while until every standby streaming from the source has replayed it
(`wait_for_standbys`): see there why.

Limits: a role with its own value of default_transaction_read_only (ALTER ROLE ... SET)
would not be frozen at all, so the freeze refuses to start while such a role exists.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence

import psycopg
from temporalio import activity

from activities.postgres import database_settings, grants, kept_records
from activities.postgres.attempts import Attempt
from activities.postgres.connection import Connection
from activities.postgres.database_settings import (
    CONNECT_BEFORE,
    FROZEN_ATTEMPT,
    FROZEN_BY,
    READ_ONLY,
    READ_ONLY_BEFORE,
    UNFROZEN_BY,
    UNSET,
)
from activities.secrets import DatabaseConnection
from ferry.api.errors import InvalidSpec, Overtaken

LOCK = 0x6665727279_667A
"""The advisory lock (transaction-level) under which the freeze and its undo read and write the markers: a late freeze
either commits before an undo, which then finds it and takes it back, or finds the undo's record and refuses."""
UNFREEZES_KEPT = 32
"""How many Migrations' entries ferry.unfrozen_by keeps, the newest (see kept_records): one entry is a hundred-odd
bytes."""

END_SESSION_ROUNDS = 20
"""Rounds of ending sessions before the freeze gives up (and Temporal retries it)."""


PREPARED = """
select gid, owner::text, to_char(prepared at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), database::text,
    extract(epoch from clock_timestamp() - prepared)::float8
from pg_prepared_xacts where database = current_database() or %s
order by prepared, gid
"""

SUBSCRIPTIONS = """
select format('%I', subname) from pg_subscription
where subenabled and subdbid = (select oid from pg_database where datname = current_database())
order by subname
"""
"""The database's enabled subscriptions, named as ALTER SUBSCRIPTION takes them. pg_subscription is shared by every
database of the server; PUBLIC may read all its columns but subconninfo."""
DISABLE_SUBSCRIPTIONS = (
    "Disable them for the migration (ALTER SUBSCRIPTION ... DISABLE: their slots on the publisher keep what is "
    "published meanwhile) and, once traffic is on the target, subscribe the target in their place"
)
"""What to do about a source's enabled subscriptions; the precheck says it too."""

WALSENDERS_SPARED = """
select active_pid from pg_replication_slots where active_pid is not null and slot_name = any(%s)
"""

NOW = kept_records.STAMP
"""The server's clock when `end_sessions` is called, in a form every session reads back (a timestamptz read into
Python would need DateStyle ISO, which a role or database may set otherwise)."""
SESSIONS = f"""
select pid, to_char(backend_start at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'), backend_start < %s::timestamptz
from pg_stat_activity
where datname = current_database() and pid <> pg_backend_pid() and backend_type in ('client backend', 'walsender')
and pid not in ({WALSENDERS_SPARED})
"""
"""The sessions `end_sessions` may end: each one's pid, backend_start, and whether it began before a time (`NOW`)."""

STANDBY_WAIT = 30.0
"""Seconds at most that an undo waits for the streaming standbys to replay it (less when a quarter of the undo's
attempt timeout is less: see `wait_for_standbys`)."""
STANDBY_POLL = 0.2
"""Seconds between two looks at where the standbys stand."""

STANDBYS = """
select coalesce(nullif(r.application_name, ''), 'a standby') || coalesce(' at ' || host(r.client_addr), ''),
    r.state, r.replay_lsn >= %s::pg_lsn
from pg_stat_replication r join pg_stat_activity a on a.pid = r.pid
where a.datid is null
order by 1
"""
"""The physical standbys connected to the server (a walsender of a logical replication is connected to a database),
whether each is streaming, and whether it has replayed the WAL up to a position. A standby reports its replay with
the WAL it receives and once it has replayed all it received, so one that keeps up is seen at once. Without
pg_read_all_stats, the session's user sees no state and no position (null)."""


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A prepared transaction (phase one of a two-phase commit) that nobody committed or rolled back yet."""

    gid: str
    owner: str
    prepared: str
    """When it was prepared (UTC)."""
    database: str
    age: float
    """Seconds since it was prepared."""

    def describe(self) -> str:
        return f"{self.gid!r} (owner {self.owner}, prepared {self.prepared})"


class PreparedTransactionsPending(Exception):
    """Prepared transactions of the source were pending when ferry needed none. Not a PermanentError: the saga
    retries the step, since their coordinator normally commits or rolls them back within seconds."""


def prepared(conn: Connection, *, every_database: bool = False) -> list[Prepared]:
    """The prepared transactions of the database (of every database of the server, with `every_database`)."""
    return [Prepared(*row) for row in conn.execute(PREPARED, (every_database,))]


def listed(pending: list[Prepared]) -> str:
    return ", ".join(transaction.describe() for transaction in pending)


def refuse_prepared(conn: Connection, db: DatabaseConnection) -> None:
    """Raises PreparedTransactionsPending when the database has prepared transactions; the freeze undoes itself."""
    pending = prepared(conn)
    if pending:
        raise PreparedTransactionsPending(
            f"{db.describe()} has prepared transactions that nobody committed or rolled back yet: "
            f"{listed(pending)}. Their rows are in neither the snapshot nor the replication, and their coordinator "
            "(an XA/JTA transaction manager) could not commit them once the freeze keeps it out, so the freeze "
            "undid itself and the source takes writes again. The step is retried: their coordinator normally "
            "commits or rolls them back within seconds. If they stay, have it resolve them (or, knowing the "
            "outcome, COMMIT PREPARED or ROLLBACK PREPARED them as a superuser or their owner), then retry."
        )


def enabled_subscriptions(conn: Connection) -> list[str]:
    """The database's enabled subscriptions: their apply workers write to it whatever the freeze says."""
    return [name for (name,) in conn.execute(SUBSCRIPTIONS)]


def subscribing(db: DatabaseConnection, enabled: list[str]) -> str:
    """What is wrong with a database that has the enabled subscriptions `enabled`, for the precheck and the freeze."""
    return (
        f"{db.describe()} subscribes to publications elsewhere, and these subscriptions are enabled: "
        f"{', '.join(enabled)}. Their apply workers write to it whatever the freeze says (and are started again when "
        "ended), so the target would miss what they apply"
    )


def refuse_subscriptions(conn: Connection, db: DatabaseConnection) -> None:
    """Raises InvalidSpec when the database has enabled subscriptions; the freeze undoes itself."""
    enabled = enabled_subscriptions(conn)
    if enabled:
        raise InvalidSpec(
            f"{subscribing(db, enabled)}: the freeze undid itself and the source takes writes again. "
            f"{DISABLE_SUBSCRIPTIONS}, then retry."
        )


@dataclasses.dataclass(frozen=True)
class Frozen:
    """What a freeze changed."""

    previous: str
    """default_transaction_read_only before the freeze (UNSET if the database had none)."""
    revoked: list[str]
    """Roles (or PUBLIC) whose CONNECT on the database was revoked."""


def is_on(value: str) -> bool:
    """PostgreSQL's reading of a boolean setting: on, true, yes, 1 and their prefixes."""
    word = value.strip().lower()
    return word in {"on", "1"} or (bool(word) and ("true".startswith(word) or "yes".startswith(word)))


def freeze(conn: Connection, db: DatabaseConnection, owner: str, attempt: Attempt | None = None) -> Frozen:
    """Makes new transactions read-only and keeps other roles out; returns what was there before. Safe to run again.

    `attempt`, the freeze's own: refused (Overtaken, nothing changed) when an undo of `owner`'s freeze scheduled after
    it has run (see `restore`). Such an attempt is one the saga wrote off (its worker stood still past its heartbeat
    timeout, then went on): the saga rolled back, and nothing would ever undo the freeze it would make now. Else it is
    recorded in ferry.frozen_attempt, so that an undo scheduled before it refuses to take this freeze back."""
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(%s)", (LOCK,))
        current = database_settings.read(conn)
        if attempt is not None:
            _refuse_if_undone_since(current, db, owner, attempt)
        frozen_by = current.get(FROZEN_BY)
        if frozen_by is not None and frozen_by != owner:
            raise InvalidSpec(
                f"{db.describe()} is frozen by Migration {frozen_by}, not by {owner}. Wait until that Migration "
                "finished or rolled back. If nothing holds it any more, unfreeze it by hand as the README's "
                "section Recovery says (the settings ferry.read_only_before and ferry.connect_before hold what "
                "to restore)."
            )
        _refuse_escaping_roles(conn, db)
        if frozen_by == owner:
            previous = current.get(READ_ONLY_BEFORE, UNSET)
        else:
            previous = current.get(READ_ONLY, UNSET)
            database_settings.change(conn, READ_ONLY_BEFORE, previous)
            database_settings.change(conn, FROZEN_BY, owner)
        if frozen_by != owner or CONNECT_BEFORE not in current:  # a freeze by ferry 0.1 recorded no ACL
            database_settings.change(conn, CONNECT_BEFORE, grants.current(conn))
        _record_freeze(conn, db, current, owner, attempt, again=frozen_by == owner)
        if current.get(READ_ONLY) != "on":
            database_settings.change(conn, READ_ONLY, "on")
        revoked = grants.revoke(conn)
    return Frozen(previous=previous, revoked=revoked)


def _refuse_escaping_roles(conn: Connection, db: DatabaseConnection) -> None:
    overrides = database_settings.role_overrides(conn, READ_ONLY)
    escaping = {role: value for role, value in overrides.items() if not is_on(value)}
    if escaping:
        roles = ", ".join(f"{role} ({READ_ONLY}={value})" for role, value in sorted(escaping.items()))
        raise InvalidSpec(
            f"{db.describe()} cannot be frozen: these roles set {READ_ONLY} themselves, which overrides the "
            f"database's setting, so their writes would go on: {roles}. Remove that with ALTER ROLE ... RESET "
            f"{READ_ONLY} (or ALTER ROLE ... IN DATABASE ... RESET) and retry."
        )


def restore(
    conn: Connection, db: DatabaseConnection, owner: str, expected: str | None, attempt: Attempt | None = None
) -> str | None:
    """Puts back the setting and CONNECT grants `owner`'s freeze recorded; None when no such freeze is there.

    Returns the setting restored. The markers stay until `forget`, so that a crash
    before the read-only sessions ended leaves a retry something to find. First, in the
    same transaction, it records `attempt` (the undo's) in ferry.unfrozen_by, whether or
    not it finds a freeze: a late attempt of the freeze that has not committed yet then
    refuses to (see `freeze`). Before that, it refuses (Overtaken, nothing changed) when
    the freeze in place was made by an attempt scheduled after `attempt`: a later cycle's
    (see `_refuse_if_frozen_since`).
    """
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(%s)", (LOCK,))
        current = database_settings.read(conn)
        frozen_by = current.get(FROZEN_BY)
        if attempt is not None and frozen_by == owner:
            _refuse_if_frozen_since(current, db, owner, attempt, "unfreeze")
        if attempt is not None:
            _record_undo(conn, db, current, owner, attempt)
        if frozen_by != owner:
            if frozen_by is not None:
                activity.logger.warning(
                    "%s is frozen by Migration %s, not %s: left frozen", db.describe(), frozen_by, owner
                )
            return None
        previous = current.get(READ_ONLY_BEFORE, UNSET)
        if expected is not None and previous != expected:
            activity.logger.warning(
                "%s recorded %s=%s before the freeze, the saga %s; restoring what the database recorded",
                db.describe(),
                READ_ONLY,
                previous,
                expected,
            )
        database_settings.change(conn, READ_ONLY, None if previous == UNSET else previous)
        if CONNECT_BEFORE in current:
            lost = grants.restore(conn, current[CONNECT_BEFORE])
            if lost:
                activity.logger.warning("%s: could not restore CONNECT for %s", db.describe(), ", ".join(lost))
    return previous


def _undos(current: dict[str, str]) -> dict[str, dict[str, object]]:
    """ferry.unfrozen_by's entries by Migration; an unreadable value reads as none (it refuses nothing)."""
    try:
        entries = json.loads(current.get(UNFROZEN_BY) or "{}")
    except ValueError:
        entries = None
    if not isinstance(entries, dict):
        activity.logger.warning("the setting %s is not ferry's: %r", UNFROZEN_BY, current.get(UNFROZEN_BY))
        return {}
    return {owner: entry for owner, entry in entries.items() if isinstance(entry, dict)}


def _refuse_if_undone_since(current: dict[str, str], db: DatabaseConnection, owner: str, attempt: Attempt) -> None:
    entry = _undos(current).get(owner)
    if entry is None:
        return
    try:
        undone = Attempt.from_json(entry.get("attempt"))
    except (KeyError, TypeError, ValueError):
        return
    if attempt.before(undone):
        raise Overtaken(
            f"refused to freeze {db.describe()}: the freeze of Migration {owner} was undone ({undone.describe()}) "
            f"after this attempt ({attempt.describe()}) was scheduled. It is a late attempt the saga has moved past "
            "(its worker stood still past its heartbeat timeout, then went on), and nothing would undo a freeze it "
            "made now. It changed nothing. Nothing to do."
        )


def _freezer(current: dict[str, str], owner: str) -> Attempt | None:
    """The attempt ferry.frozen_attempt records for `owner`'s freeze; None for none (a freeze by an older ferry, or
    another Migration's record) or an unreadable one, which refuses nothing."""
    try:
        entries = json.loads(current.get(FROZEN_ATTEMPT) or "{}")
        entry = entries.get(owner) if isinstance(entries, dict) else None
        return None if entry is None else Attempt.from_json(entry.get("attempt"))
    except (AttributeError, KeyError, TypeError, ValueError):
        activity.logger.warning("the setting %s is not ferry's: %r", FROZEN_ATTEMPT, current.get(FROZEN_ATTEMPT))
        return None


def _record_freeze(
    conn: Connection, db: DatabaseConnection, current: dict[str, str], owner: str, attempt: Attempt | None, again: bool
) -> None:
    """Records in ferry.frozen_attempt that `attempt` froze for `owner`; in the caller's transaction, holding LOCK.

    `again`: the database was frozen for `owner` already (a retry, or a late attempt), and an attempt recorded there
    scheduled after `attempt` stays. A first freeze without an attempt removes a record left by a freeze undone by
    hand, which its undo would otherwise take for its own. A user who may not set it (granted SET on the other
    markers only) is warned about: the freeze goes on, and a late undo would not be refused."""
    recorded = _freezer(current, owner) if again else None
    if recorded is not None and (attempt is None or attempt.before(recorded)):
        return
    if attempt is None and FROZEN_ATTEMPT not in current:
        return
    value = None if attempt is None else json.dumps({owner: {"attempt": attempt.as_json()}}, sort_keys=True)
    try:
        with conn.transaction():
            database_settings.change(conn, FROZEN_ATTEMPT, value)
    except psycopg.errors.InsufficientPrivilege as error:
        activity.logger.warning(
            "could not record on %s which attempt froze it for Migration %s (%s): a late attempt of its undo would "
            "not be refused. As a superuser, GRANT SET ON PARAMETER %s TO %s.",
            db.describe(), owner, str(error).strip(), FROZEN_ATTEMPT, db.username,
        )  # fmt: skip


def _refuse_if_frozen_since(
    current: dict[str, str], db: DatabaseConnection, owner: str, attempt: Attempt, doing: str
) -> None:
    """Raises Overtaken when `owner`'s freeze in place was made by an attempt scheduled after `attempt` (an undo's,
    or a freeze's cleaning up after itself): `attempt` is a late one the saga wrote off, and the freeze is a later
    cycle's (failurePolicy Pause, then retry), which the saga goes on from."""
    frozen = _freezer(current, owner)
    if frozen is not None and attempt.before(frozen):
        raise Overtaken(
            f"refused to {doing} {db.describe()}: Migration {owner} froze it again ({frozen.describe()}) after this "
            f"attempt ({attempt.describe()}) was scheduled. It is a late attempt the saga has moved past (its worker "
            "stood still past its heartbeat timeout, then went on), and the freeze is a later one's, which the saga "
            "goes on from. It changed nothing. Nothing to do."
        )


def _record_undo(
    conn: Connection, db: DatabaseConnection, current: dict[str, str], owner: str, attempt: Attempt
) -> None:
    """Records in ferry.unfrozen_by that `attempt` undoes `owner`'s freeze, keeping the newest entries; in the caller's
    transaction, holding LOCK. An entry of an undo scheduled after `attempt` stays as it is. A user who may not set it
    (granted SET on the other markers only) is warned about: the undo goes on, and a late freeze would not be
    refused."""
    entries = _undos(current)
    try:
        recorded = Attempt.from_json(entries[owner].get("attempt"))
    except (KeyError, TypeError, ValueError):
        recorded = None
    if recorded is not None and attempt.before(recorded):
        return  # a late undo: the later one's record stays, and refuses the freezes scheduled before it
    entries[owner] = {"attempt": attempt.as_json(), "at": kept_records.stamp(conn)}
    kept = kept_records.newest(entries, lambda entry: entry.get("at"), UNFREEZES_KEPT, owner)
    try:
        with conn.transaction():
            database_settings.change(conn, UNFROZEN_BY, json.dumps(kept, sort_keys=True))
    except psycopg.errors.InsufficientPrivilege as error:
        activity.logger.warning(
            "could not record on %s that the freeze of Migration %s is undone (%s): a late attempt of its freeze "
            "would not be refused. As a superuser, GRANT SET ON PARAMETER %s TO %s.",
            db.describe(), owner, str(error).strip(), UNFROZEN_BY, db.username,
        )  # fmt: skip


def forget(conn: Connection, owner: str) -> None:
    """Removes `owner`'s freeze markers: the undo is complete."""
    with conn.transaction():
        current = database_settings.read(conn)
        if current.get(FROZEN_BY) == owner:
            for marker in (READ_ONLY_BEFORE, CONNECT_BEFORE, FROZEN_BY, FROZEN_ATTEMPT):
                if marker in current:  # a user granted SET on an older ferry's markers only may not reset the others
                    database_settings.change(conn, marker, None)


def frozen_by(conn: Connection) -> str | None:
    """Which Migration's freeze holds the database, if any."""
    return database_settings.read(conn).get(FROZEN_BY)


def end_sessions(
    conn: Connection, timeout: float, between_rounds: Callable[[int], None], spare_slots: Sequence[str] = ()
) -> int:
    """Ends every other session of the database that was there when it was called, and waits until they are gone.

    A session that began before the setting changed has the old default; one that begins
    after has the new one. A terminated session's open transaction is rolled back, so
    nothing it did without an acknowledgement survives, and it flushes its statistics
    as it exits (see fencing). The sessions are client backends and walsenders connected
    to the database (replication=database: they run SQL too), but for the walsenders
    serving the replication slots `spare_slots` (this Migration's own replication).
    Returns how many sessions ended.

    Which sessions were there (`SESSIONS`): those listed at the call, each by its pid and
    backend_start (a pid may be reused by a later session), whatever the server's clock
    says of them since; and those that began before the call by the server's clock (one
    still connecting at the call, not yet shown in the database, may have read the old
    setting). Sessions that begin after the call are left alone: they have the new
    setting, and ending them too could go on for ever, a client pool (a superuser's
    monitoring) reconnecting each time. By the clock alone, a step backwards (NTP
    correcting a clock that ran fast) would have spared every session opened in the
    stepped-back span, their backend_start being "in the future".
    """
    row = conn.execute(NOW).fetchone()
    assert row is not None
    called = str(row[0])
    listed: set[tuple[int, str]] | None = None
    ended = 0
    for round in range(END_SESSION_ROUNDS):
        conn.execute("select pg_stat_clear_snapshot()")  # in a transaction, pg_stat_activity is read once otherwise
        sessions = conn.execute(SESSIONS, (called, list(spare_slots))).fetchall()
        if listed is None:
            listed = {(pid, began) for pid, began, _ in sessions}
        pids = [pid for pid, began, before in sessions if before or (pid, began) in listed]
        if not pids:
            return ended
        for pid in pids:
            row = conn.execute("select pg_terminate_backend(%s, %s)", (pid, int(timeout * 1000))).fetchone()
            ended += bool(row and row[0])
        between_rounds(ended)
        activity.logger.debug("round %d: ended %d sessions so far", round + 1, ended)
    raise RuntimeError(f"sessions of the database were still there after {END_SESSION_ROUNDS} rounds of ending them")


def wait_for_standbys(
    conn: Connection, db: DatabaseConnection, bound: float, between_polls: Callable[[list[str]], None]
) -> list[str]:
    """Waits until every standby streaming from the server has replayed all the server wrote so far, at most `bound`
    seconds; returns the standbys still behind then, which a warning names.

    Why the undo waits: it commits on the primary and the saga counts it done, but a standby
    has the unfreeze only once it replayed it. Should the primary fail before that, the
    failover manager promotes a standby still frozen (every new transaction read-only,
    CONNECT revoked from the application) under a Migration that says RolledBack, and nothing
    of ferry's runs again to unfreeze it. Why bounded: a standby that is stuck (replay paused,
    a query holding it back, a network gone that TCP has not noticed yet) must not hold up
    the undo, and the rollback with it, for ever. Past the bound the undo goes on, naming the
    standbys; they have the unfreeze once they replay it. A standby not streaming (not
    connected, or still catching up) is not waited for. The caller bounds the wait by a
    quarter of its attempt's timeout too: an attempt that timed out is retried, finds
    nothing to undo, and waits again.

    `between_polls(behind)` runs between two looks, with the standbys still behind: the caller heartbeats there, and
    raises once the activity is cancelled.
    """
    row = conn.execute("select pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    written = str(row[0])  # at or past the end of every commit so far, the undo's among them
    deadline = time.monotonic() + bound
    while True:
        standbys = conn.execute(STANDBYS, (written,)).fetchall()
        # No replay position (NULL): a WAL receiver that replays nothing (pg_receivewal, a base backup's WAL stream).
        behind = [name for name, state, replayed in standbys if state == "streaming" and replayed is False]
        if not behind or time.monotonic() >= deadline:
            break
        between_polls(behind)
        time.sleep(STANDBY_POLL)
    unseen = [name for name, state, _ in standbys if state is None]
    if unseen:
        activity.logger.warning(
            "%s: cannot tell whether the standbys %s replayed the unfreeze: the Secret's user may not read where they "
            "stand in pg_stat_replication (grant it pg_read_all_stats, or pg_monitor)",
            db.describe(),
            ", ".join(unseen),
        )
    if behind:
        activity.logger.warning(
            "%s: the streaming standbys %s had not replayed the unfreeze (WAL up to %s) after %.1f s; going on. "
            "They have it once they replay it; one promoted by a failover without it is still frozen: unfreeze it "
            "by hand as the README's section Recovery says",
            db.describe(),
            ", ".join(behind),
            written,
            bound,
        )
    return behind
