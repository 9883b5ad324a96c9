"""Connecting to the source or target database: a few quick retries, then a failure that says what is wrong.

A database that refuses the credentials, or does not exist, will not change its mind
on retry: those fail at once. One that does not answer gets `connect_attempts` tries
(it may be restarting); after that the step fails for good with DatabaseUnreachable,
so a person looks at it instead of Temporal retrying for an hour. What bounds a wait:
connecting (the session's first queries included) gives up after connect_timeout even when
the server accepted the connection and never answered, and TCP keepalives with tcp_user_timeout end a connection whose
server's machine vanished in the middle of a query (see `parameters`). Neither notices a
server that is there and stopped answering mid-query (a stopped process, a frozen
cgroup, storage that hangs): its kernel still answers the keepalives. So a session
opened while an activity's Heartbeats runs is stopped with the activity, even blocked
(see Session: its call is cancelled, then its socket shut down), and the polling loops
bound each of their calls (`answering_within`); a long query of the work itself waits
as long as the activity's start-to-close timeout, which ends the attempt and its
sessions with it. TLS is as
the Secret says (tls.py); a certificate that does not verify fails at once. Every message is
scrubbed of the password (libpq's messages do not contain it today, but they are
about to become status and Events, and that must hold whatever libpq says) and of the
values the server quoted (ferry.api.scrubbing).

A session that must act on the primary (the freeze, its undo, the checks of the frozen
source, verify's reads of it) opens with `connect_primary`: one that reached a standby
fails with ServerInRecovery, retried, as one that reached another database fails with
DatabaseReplaced. Other sessions do not ask (mode Online's replication, whose
subscription connects through `replicationHost`, is as it was).

Errors are raised `from None`: a chained psycopg error would travel into the
workflow's history unscrubbed.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.abc import RV, PQGen
from psycopg.conninfo import make_conninfo
from temporalio import activity
from temporalio.exceptions import CancelledError

from activities import heartbeats
from activities.postgres import tls
from activities.secrets import DatabaseConnection
from activities.settings import DataActivitySettings
from ferry.api.errors import BadCredentials, DatabaseUnreachable, InvalidSpec
from ferry.api.migration import DatabaseIdentity
from ferry.api.scrubbing import EXCERPT_LIMIT, scrub

APPLICATION_NAME = "ferry"
"""application_name of ferry's sessions, as pg_stat_activity shows them."""

Connection = psycopg.Connection[tuple[Any, ...]]


class DatabaseReplaced(Exception):
    """A database Secret now names another database than the one the precheck checked. Not a PermanentError, so
    retried: pointing the Secret back lets the step, or the undo, go on with the database it is for."""


class ServerInRecovery(Exception):
    """A session that must reach the primary reached a server in recovery: a physical standby. Not a PermanentError,
    so retried: after a failover, the address the Secret names usually moves to the new primary within seconds."""


CANCEL_TIMEOUT = 2.0
"""Seconds a stop waits for the server to take its cancel request. psycopg waits 30 s by default; a server whose
postmaster is frozen too never takes it, and the socket is shut down after this anyway."""
STOP_GRACE = 2.0
"""Seconds a stopped call then has to return, its query cancelled, before its socket is shut down. A live server
ends a cancelled query at once, and its session stays usable (for the activity's cleanup)."""
POLL_ANSWER = 60.0
"""Seconds a polling loop's call (a short catalog query, repeated until something happens: replicate's and
catch-up's waits for the target, the undo's for the standbys, the checks of verify's mark for the statistics) waits
for the server's answer (see `answering_within`). Such a query answers in milliseconds: a server silent for a minute
has stopped answering, and waiting longer would only keep the step blocked, heartbeating, until its start-to-close
timeout (days for some)."""


class Session(Connection):
    """An autocommit session whose `with` block closes it and does nothing else, and which `stop` can end while a
    call on it is blocked.

    Every statement commits as it runs, so the end of a block has nothing to commit. psycopg's
    own exit commits all the same, and on a session the server has just ended that commit can
    raise and leave the connection open until it is collected. Closing alone ends the session
    the same way whether the server is still there or not.

    A server that stops answering in the middle of a query (a stopped process, a frozen cgroup,
    storage that hangs) leaves the call blocked for ever: its kernel still answers TCP
    keepalives, and a cancel request reaches a postmaster whose backend cannot act on it. What
    ends the call is shutting the socket down from another thread: the call then raises at once.
    `watched` keeps a duplicate of libpq's socket for that, so that shutting it down never
    reaches a descriptor libpq closed meanwhile (it does when the server goes away) and the
    process reused; `close` closes the duplicate, and libpq its own.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._calls = threading.Condition()
        self._started = 0
        """Calls started on the session: which call `stop` found blocked."""
        self._in_call = False
        self._cleaning_up = False
        """Whether the call in progress began once the activity was cancelled already: its cleanup, which a stop
        leaves alone."""
        self._answer_within: float | None = None
        """Seconds each call waits for the server's answer (see `answering_within`); None: as long as it takes."""
        self._closing = threading.Lock()
        """Held while the session is closed, and while a stop cancels or shuts down: neither acts on a closed one."""
        self._socket: int | None = None
        """A duplicate of libpq's socket, from `watched` until `close`."""
        self._given_up = False
        """Whether `stop` shut the socket down: what the blocked call then raises is the cancellation's."""
        self._stopped_by: heartbeats.Heartbeats | None = None

    def __exit__(self, exc_type: object, exc_val: object, exc_tb: object) -> None:
        self.close()

    def watched(self) -> None:
        """Keeps a duplicate of the socket, and registers `stop` with the activity's Heartbeats, if one is running
        (taken back on `close`). Called once connected, before the session's first query."""
        self._socket = os.dup(self.pgconn.socket)
        running = heartbeats.current()
        if running is not None:
            self._stopped_by = running
            running.on_cancel(self.stop)

    def stop(self) -> None:
        """Ends the call in progress, from another thread, for the activity's cancellation: cancels its query, waits
        STOP_GRACE for it to return, and shuts the socket down when it has not (the blocked call then raises
        CancelledError). A session between two calls is left as it is, and so is a call begun once the activity was
        cancelled: what its owner runs then is its cleanup after the cancellation (undoing half a freeze, say), and
        the stops run in threads of their own, so they may find it under way.

        The call's lock is held from the look at the call to the cancel, and again from the end of the grace to the
        shutdown (a next call waits for it to start): a cancel or a shutdown meant for the blocked call never reaches
        one begun after it, the cleanup's."""
        with self._calls:
            if not self._in_call or self._cleaning_up:
                return
            blocked = self._started
            with self._closing:  # always taken after `_calls`, never the other way round
                if self.closed:
                    return
                with contextlib.suppress(psycopg.Error):  # CancellationTimeout: a server that answers that neither
                    self.cancel_safe(timeout=CANCEL_TIMEOUT)
            returned = self._calls.wait_for(lambda: not self._in_call or self._started != blocked, STOP_GRACE)
            if not returned:
                self._given_up = True
                self._shut_down()
        if not returned:
            activity.logger.warning(
                "the server did not end a cancelled query within %gs: its session's socket was shut down", STOP_GRACE
            )

    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        """Every call on the session waits here (psycopg's own, with what `stop` and `answering_within` need)."""
        bound = self._answer_within
        ours = bound is not None and (timeout is None or bound < timeout)
        cleaning_up = _cancelled()
        with self._calls:
            self._started += 1
            self._in_call = True
            self._cleaning_up = cleaning_up
        try:
            return super().wait(gen, interval, bound if ours else timeout)
        except psycopg.errors._WaitTimeout:  # psycopg's, when `timeout` expires
            if not ours:
                raise
            with self._closing:
                with contextlib.suppress(psycopg.Error):
                    self.cancel_safe(timeout=CANCEL_TIMEOUT)
                self._shut_down_locked()
            self.close()  # its protocol is halfway through a call: nothing more can run on it
            raise psycopg.OperationalError(
                f"the server did not answer within {bound:g}s (a stopped process, a frozen cgroup or storage that "
                "hangs do that while the server's machine still answers): the session was given up"
            ) from None
        except psycopg.OperationalError:
            if self._given_up:  # the socket `stop` shut down
                raise CancelledError(
                    f"cancelled while waiting for the server, which did not end the query within {STOP_GRACE:g}s of "
                    "the cancel request: the session was given up"
                ) from None
            raise
        finally:
            with self._calls:
                self._in_call = False
                self._calls.notify_all()

    @contextlib.contextmanager
    def answering_within(self, seconds: float) -> Iterator[None]:
        """See the module's `answering_within`."""
        previous, self._answer_within = self._answer_within, seconds
        try:
            yield
        finally:
            self._answer_within = previous

    def close(self) -> None:
        with self._closing:
            try:
                super().close()
            finally:
                if self._socket is not None:
                    os.close(self._socket)
                    self._socket = None
        if self._stopped_by is not None:
            self._stopped_by.forget(self.stop)
            self._stopped_by = None

    def _shut_down(self) -> None:
        with self._closing:
            self._shut_down_locked()

    def _shut_down_locked(self) -> None:
        if self._socket is None:  # closed, or never watched
            return
        with contextlib.suppress(OSError):
            shared = socket.socket(fileno=self._socket)
            try:
                shared.shutdown(socket.SHUT_RDWR)
            finally:
                shared.detach()  # the duplicate stays open, and `close` closes it


def _cancelled() -> bool:
    """Whether the activity whose context this is was cancelled already; False outside an activity."""
    try:
        return activity.is_cancelled()
    except RuntimeError:  # not in an activity (a test's session, the CLI)
        return False


@contextlib.contextmanager
def answering_within(conn: Connection, seconds: float = POLL_ANSWER) -> Iterator[None]:
    """Each call on `conn` in the block that the server leaves unanswered for `seconds` is cancelled, its session
    given up (closed) and psycopg.OperationalError raised: for polling loops, whose short queries a server that
    stopped answering would otherwise hold for as long as the activity's start-to-close timeout. A connection that
    is not one of connect's sessions is not bounded."""
    if not isinstance(conn, Session):
        yield
        return
    with conn.answering_within(seconds):
        yield


MARKERS = (
    "ferry.frozen_by",
    "ferry.read_only_before",
    "ferry.connect_before",
    "ferry.restored_by",
    "ferry.verified_mark",
    "ferry.replication_ended",
    "ferry.unfrozen_by",
    "ferry.frozen_attempt",
)
"""The database settings where ferry keeps what it must remember (see database_settings)."""

NO_TRANSACTION_TIMEOUTS = """
select set_config(name, '0', false) from pg_settings
where name in ('idle_in_transaction_session_timeout', 'transaction_timeout')
"""
"""For a session that waits in its transaction while other sessions work: no timeout of the server's may end it."""

IDENTITY = """
select system_identifier::text, (select oid from pg_database where datname = current_database())::bigint,
    current_database()
from pg_control_system()
"""
"""Which database a session reached: its server's system identifier and its oid there (see DatabaseIdentity)."""

REFUSED_CREDENTIALS = (
    "authentication failed",
    "no pg_hba.conf entry",
    "permission denied for database",
    "password is missing",
    "no password supplied",
)


PINNED = {"search_path": "pg_catalog,pg_temp"}
"""Every session of ferry's resolves names in pg_catalog first and the database's schemas never. ferry's queries
name catalog operators and functions unqualified (`nspname !~ '^pg_'` compares a name with a literal); with the
database's own search_path, an operator or function someone created in public with closer argument types (!~ for
two names, which pg_catalog lacks) would win, and run with the rights of the Secret's user, often a superuser.
Queries that mean a user's relation name its schema. pg_dump, pg_restore and the restore's psql pin theirs the
same way."""


def parameters(settings: DataActivitySettings) -> dict[str, str]:
    """libpq's connection parameters that bound every wait; pg_dump and pg_restore get them too."""
    return {
        "connect_timeout": str(settings.connect_timeout),
        "keepalives": "1",
        "keepalives_idle": str(settings.tcp_keepalives_idle),
        "keepalives_interval": str(settings.tcp_keepalives_interval),
        "keepalives_count": str(settings.tcp_keepalives_count),
        "tcp_user_timeout": str(settings.tcp_user_timeout * 1000),
    }


def connect(db: DatabaseConnection, settings: DataActivitySettings, **session: str) -> Connection:
    """An autocommit session; `session` sets parameters for it, e.g. default_transaction_read_only='off'.

    Raises:
        BadCredentials: the server refused the username or password.
        InvalidSpec: the database does not exist.
        TlsMismatch: the server's certificate did not verify, or it and the Secret disagree on encryption.
        DatabaseUnreachable: no attempt reached the server.
        DatabaseReplaced: the session reached another database than the precheck checked.
    """
    with tls.ca_file(db) as ca:
        return _connect(db, settings, tls.parameters(db, ca), session)


def connect_primary(db: DatabaseConnection, settings: DataActivitySettings, **session: str) -> Connection:
    """`connect`, to the primary: the freeze, its undo, the checks of the frozen source and verify's reads of it.

    Raises, besides what `connect` raises:
        ServerInRecovery: the session reached a standby (see `_refuse_standby`).
    """
    with tls.ca_file(db) as ca:
        return _connect(db, settings, tls.parameters(db, ca), session, primary=True)


def _connect(
    db: DatabaseConnection,
    settings: DataActivitySettings,
    secured: dict[str, str],
    session: dict[str, str],
    *,
    primary: bool = False,
) -> Connection:
    options = " ".join(f"-c {name}={value}" for name, value in {**PINNED, **session}.items())
    last_error = ""
    for attempt in range(1, settings.connect_attempts + 1):
        try:
            conn = Session.connect(
                make_conninfo(**parameters(settings), **secured),
                host=db.host,
                port=db.port,
                user=db.username,
                password=db.password,
                dbname=db.database,
                application_name=APPLICATION_NAME,
                options=options,
                autocommit=True,
            )
            with contextlib.ExitStack() as closing:
                closing.callback(conn.close)
                conn.watched()  # before the first query: the server may stop answering that one already
                with conn.answering_within(settings.connect_timeout):  # a part of connecting, and bounded as such
                    _refuse_another_database(conn, db)
                    if primary:
                        _refuse_standby(conn, db)
                closing.pop_all()
            return conn
        except psycopg.OperationalError as error:  # connecting, or the session ended before its first query
            last_error = said(db, error)
        _raise_if_permanent(db, last_error)
        activity.logger.info(
            "could not connect to %s (attempt %d of %d): %s",
            db.describe(),
            attempt,
            settings.connect_attempts,
            last_error,
        )
        if attempt < settings.connect_attempts:
            activity.wait_for_cancelled_sync(settings.connect_retry_delay)
            if activity.is_cancelled():
                raise CancelledError(f"cancelled while connecting to {db.describe()}")
    raise DatabaseUnreachable(
        f"could not connect to {db.describe()} in {settings.connect_attempts} attempts: {last_error} "
        f"(each attempt waits at most {settings.connect_timeout}s for the server's answer). "
        f"Check that the database is running and that the host and port in Secret {db.secret} are right; "
        "then retry the step (failurePolicy Pause) or create the Migration again."
    )


def identity_of(conn: Connection) -> DatabaseIdentity | None:
    """Which database `conn` reached; None where the server lets its user not call pg_control_system() (PUBLIC may,
    unless an administrator revoked it): that database is then not checked (identity.py)."""
    try:
        row = conn.execute(IDENTITY).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        activity.logger.warning(
            "cannot tell which database the Secret's user reaches (pg_control_system() is not granted): "
            "a Secret edited during the run to name another database will not be noticed"
        )
        return None
    assert row is not None
    system_identifier, oid, name = row
    return DatabaseIdentity(system_identifier=str(system_identifier), database_oid=int(oid), database=str(name))


def _refuse_another_database(conn: Connection, db: DatabaseConnection) -> None:
    """Raises DatabaseReplaced when `db` carries the identity the precheck recorded and `conn` reached another."""
    expected = db.identity
    if expected is None:
        return
    found = identity_of(conn)
    if found is None:
        raise DatabaseReplaced(
            f"Secret {db.secret} may no longer name the database the precheck checked: {db.describe()} lets its user "
            "not call pg_control_system(), which the precheck could, so ferry cannot tell which database it reached "
            "and changed nothing. Point the Secret at the database the precheck checked; the step is tried again."
        )
    if (found.system_identifier, found.database_oid) == (expected.system_identifier, expected.database_oid):
        return
    raise DatabaseReplaced(
        f"Secret {db.secret} no longer names the database the precheck checked: it reaches {db.describe()}, database "
        f"oid {found.database_oid} of the server with system identifier {found.system_identifier}, and the precheck "
        f"checked {expected.database!r}, oid {expected.database_oid} of the server {expected.system_identifier}. "
        "ferry acts on no database but the one it checked, and changed nothing on this one. Point the Secret at "
        "that database again (a physical replica promoted by a failover keeps its identity); the step is tried again."
    )


def in_recovery(conn: Connection) -> bool:
    """Whether the server `conn` reached is in recovery: a physical standby."""
    row = conn.execute("select pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


def _refuse_standby(conn: Connection, db: DatabaseConnection) -> None:
    """Raises ServerInRecovery when `conn` reached a server in recovery.

    A physical standby shares its primary's identity, so `_refuse_another_database` lets it
    through, and every query of the freeze's checks works there, but it is no place to check
    the frozen source: replaying WAL moves none of the statistics counters the fence compares
    (fencing), it lags, and after a switchover the old primary, a standby of the new one,
    shows the freeze's mark unchanged while the new primary takes writes.
    """
    if not in_recovery(conn):
        return
    raise ServerInRecovery(
        f"Secret {db.secret}'s host reaches a standby: {db.describe()} is in recovery (a physical replica, replaying "
        "its primary's WAL), and ferry's freeze, its undo and its checks of the frozen source must reach the primary: "
        "a standby counts none of the writes it replays and may lag. ferry changed nothing there. Point the Secret at "
        "the primary (e.g. the failover manager's Service for the primary); after a failover its address usually "
        "moves to the new primary within seconds. The step, or the undo, is tried again."
    )


def _raise_if_permanent(db: DatabaseConnection, message: str) -> None:
    refused = tls.refusal(db, message)
    if refused is not None:  # before the credentials: a hostssl-only server says "no pg_hba.conf entry" too
        raise refused
    lowered = message.lower()
    if "permission denied for database" in lowered:
        raise BadCredentials(
            f"{db.describe()} refused the connection: {message}. The role in Secret {db.secret} may not connect to "
            "the database: if a Migration froze it, its freeze took CONNECT from every role but the one it froze "
            "with (credentials rotated to a new role since, say). Put that role's credentials, or a superuser's, in "
            f"Secret {db.secret}; the next attempt reads them again (an undo tries again by itself)."
        )
    if any(phrase in lowered for phrase in REFUSED_CREDENTIALS) or ("role" in lowered and "does not exist" in lowered):
        raise BadCredentials(
            f"{db.describe()} refused the credentials: {message}. Fix the username and password in "
            f"Secret {db.secret}; the next attempt reads them again (an undo tries again by itself; a step under "
            "failurePolicy Pause waits for retry)."
        )
    if "database" in lowered and "does not exist" in lowered:
        raise InvalidSpec(
            f"{db.describe()} does not exist: {message}. Create it, or fix the key 'database' in Secret {db.secret}."
        )


@contextlib.contextmanager
def privileged(db: DatabaseConnection, what: str) -> Iterator[None]:
    """Turns "permission denied" into BadCredentials saying which privilege the Secret's user lacks."""
    try:
        yield
    except psycopg.errors.InsufficientPrivilege as error:
        refused = said(db, error)
        remedy = (
            f"As a superuser, GRANT SET ON PARAMETER {', '.join(MARKERS)} TO {db.username} (since PostgreSQL 15, "
            "only superusers may keep ferry's markers in a database otherwise), or use a superuser."
            if "permission denied to set parameter" in refused
            else "Use the database owner or a superuser (ending other sessions needs pg_signal_backend)."
        )
        raise BadCredentials(
            f"the user in Secret {db.secret} may not {what} on {db.describe()}: {refused}. {remedy}"
        ) from None


def said(db: DatabaseConnection, error: psycopg.Error) -> str:
    """What the server or libpq said, for a message: without the password and the values it quoted, on one line."""
    return scrub(db.redact(str(error)), EXCERPT_LIMIT)
