"""Stopping writes on the source database, and letting them resume exactly as before.

The freeze, in one transaction, sets the database's default_transaction_read_only to
on, so every transaction of a new session is read-only, and revokes CONNECT from
everyone but ferry's own role (see grants), so that a client cannot come back and
open a read-write transaction explicitly. Then it ends the sessions that were already
there, rolling back whatever they had open: from then on the server acknowledges no
write of theirs, so no acknowledged write can be missing from a snapshot taken
afterwards. What the fence cannot keep out (superusers, members of ferry's role) is
caught by check_frozen (see fencing). The undo puts the setting and the CONNECT grants
back as they were and ends the sessions opened during the freeze, which would otherwise
stay read-only until they reconnect.

Idempotency: the previous setting and ACL are recorded in the database itself, in the
same transaction that turns the freeze on (see database_settings). A retry after a
crash finds ferry.frozen_by naming its own Migration and takes the previous values from
ferry.read_only_before and ferry.connect_before, never the frozen state of its own
earlier attempt. Another Migration's marker means someone else froze this database: the
freeze refuses, rather than let its undo unfreeze a database it did not freeze.

Limits: a role with its own value of default_transaction_read_only (ALTER ROLE ... SET)
would not be frozen at all, so the freeze refuses to start while such a role exists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from temporalio import activity

from activities.postgres import database_settings, grants
from activities.postgres.connection import Connection
from activities.postgres.database_settings import CONNECT_BEFORE, FROZEN_BY, READ_ONLY, READ_ONLY_BEFORE, UNSET
from activities.secrets import DatabaseConnection
from ferry.api.errors import InvalidSpec

END_SESSION_ROUNDS = 20
"""Rounds of ending sessions before the freeze gives up (and Temporal retries it)."""


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


def freeze(conn: Connection, db: DatabaseConnection, owner: str) -> Frozen:
    """Makes new transactions read-only and keeps other roles out; returns what was there before. Safe to run again."""
    with conn.transaction():
        current = database_settings.read(conn)
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


def restore(conn: Connection, db: DatabaseConnection, owner: str, expected: str | None) -> str | None:
    """Puts back the setting and CONNECT grants `owner`'s freeze recorded; None when no such freeze is there.

    Returns the setting restored. The markers stay until `forget`, so that a crash
    before the read-only sessions ended leaves a retry something to find.
    """
    with conn.transaction():
        current = database_settings.read(conn)
        frozen_by = current.get(FROZEN_BY)
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


def forget(conn: Connection, owner: str) -> None:
    """Removes `owner`'s freeze markers: the undo is complete."""
    with conn.transaction():
        if database_settings.read(conn).get(FROZEN_BY) == owner:
            for marker in (READ_ONLY_BEFORE, CONNECT_BEFORE, FROZEN_BY):
                database_settings.change(conn, marker, None)


def frozen_by(conn: Connection) -> str | None:
    """Which Migration's freeze holds the database, if any."""
    return database_settings.read(conn).get(FROZEN_BY)


def end_sessions(conn: Connection, timeout: float, between_rounds: Callable[[int], None]) -> int:
    """Ends every other client session of the database that began before now, and waits until they are gone.

    A session that began before the setting changed has the old default; one that begins
    after has the new one. A terminated session's open transaction is rolled back, so
    nothing it did without an acknowledgement survives, and it flushes its statistics
    as it exits (see fencing). Returns how many sessions ended.
    """
    now = conn.execute("select clock_timestamp()").fetchone()
    assert now is not None
    started_before = now[0]
    ended = 0
    for round in range(END_SESSION_ROUNDS):
        conn.execute("select pg_stat_clear_snapshot()")  # in a transaction, pg_stat_activity is read once otherwise
        pids = [
            row[0]
            for row in conn.execute(
                "select pid from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid() "
                "and backend_type = 'client backend' and backend_start < %s",
                (started_before,),
            )
        ]
        if not pids:
            return ended
        for pid in pids:
            row = conn.execute("select pg_terminate_backend(%s, %s)", (pid, int(timeout * 1000))).fetchone()
            ended += bool(row and row[0])
        between_rounds(ended)
        activity.logger.debug("round %d: ended %d sessions so far", round + 1, ended)
    raise RuntimeError(f"sessions of the database were still there after {END_SESSION_ROUNDS} rounds of ending them")
