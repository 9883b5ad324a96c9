"""Stopping writes on the source database, and letting them resume exactly as before.

The freeze sets the database's default_transaction_read_only to on, so every
transaction of a new session is read-only, then ends the sessions that were already
there, rolling back whatever they had open: from then on the server acknowledges no
write, so no acknowledged write can be missing from a snapshot taken afterwards. The
undo puts the setting back as it was (resets it when the database had none) and ends
the sessions opened during the freeze, which would otherwise stay read-only until
they reconnect.

Idempotency: the previous value is recorded in the database itself, in the same
transaction that turns the freeze on (see database_settings). A retry after a crash
finds ferry.frozen_by naming its own Migration and takes the previous value from
ferry.read_only_before, never the "on" of its own earlier attempt. Another
Migration's marker means someone else froze this database: the freeze refuses,
rather than let its undo unfreeze a database it did not freeze.

Limits: default_transaction_read_only is a default. A client that explicitly asks
for a read-write transaction (SET TRANSACTION READ WRITE) can still write, and a role
with its own value of the setting (ALTER ROLE ... SET) would not be frozen at all,
so the freeze refuses to start while such a role exists.
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio import activity

from activities.postgres import database_settings
from activities.postgres.connection import Connection
from activities.postgres.database_settings import FROZEN_BY, READ_ONLY, READ_ONLY_BEFORE, UNSET
from activities.secrets import DatabaseConnection
from ferry.api.errors import InvalidSpec

END_SESSION_ROUNDS = 20
"""Rounds of ending sessions before the freeze gives up (and Temporal retries it)."""


def is_on(value: str) -> bool:
    """PostgreSQL's reading of a boolean setting: on, true, yes, 1 and their prefixes."""
    word = value.strip().lower()
    return word in {"on", "1"} or (bool(word) and ("true".startswith(word) or "yes".startswith(word)))


def freeze(conn: Connection, db: DatabaseConnection, owner: str) -> str:
    """Makes new transactions read-only; returns the setting before (UNSET if none). Safe to run again."""
    with conn.transaction():
        current = database_settings.read(conn)
        frozen_by = current.get(FROZEN_BY)
        if frozen_by is not None and frozen_by != owner:
            raise InvalidSpec(
                f"{db.describe()} is frozen by Migration {frozen_by}, not by {owner}. Wait until that Migration "
                "finished or rolled back. If nothing holds it any more, restore its setting by hand: "
                f"ALTER DATABASE ... SET default_transaction_read_only to ferry.read_only_before "
                f"({current.get(READ_ONLY_BEFORE, UNSET)}), then RESET ferry.frozen_by and ferry.read_only_before."
            )
        overrides = database_settings.role_overrides(conn, READ_ONLY)
        escaping = {role: value for role, value in overrides.items() if not is_on(value)}
        if escaping:
            roles = ", ".join(f"{role} ({READ_ONLY}={value})" for role, value in sorted(escaping.items()))
            raise InvalidSpec(
                f"{db.describe()} cannot be frozen: these roles set {READ_ONLY} themselves, which overrides the "
                f"database's setting, so their writes would go on: {roles}. Remove that with ALTER ROLE ... RESET "
                f"{READ_ONLY} (or ALTER ROLE ... IN DATABASE ... RESET) and retry."
            )
        if frozen_by == owner:
            previous = current.get(READ_ONLY_BEFORE, UNSET)
        else:
            previous = current.get(READ_ONLY, UNSET)
            database_settings.change(conn, READ_ONLY_BEFORE, previous)
            database_settings.change(conn, FROZEN_BY, owner)
        if current.get(READ_ONLY) != "on":
            database_settings.change(conn, READ_ONLY, "on")
    return previous


def restore(conn: Connection, db: DatabaseConnection, owner: str, expected: str | None) -> str | None:
    """Puts back the setting `owner`'s freeze recorded and returns it; None when no such freeze is there.

    The markers stay until `forget`, so that a crash before the read-only sessions
    ended leaves a retry something to find.
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
    return previous


def forget(conn: Connection, owner: str) -> None:
    """Removes `owner`'s freeze markers: the undo is complete."""
    with conn.transaction():
        if database_settings.read(conn).get(FROZEN_BY) == owner:
            database_settings.change(conn, READ_ONLY_BEFORE, None)
            database_settings.change(conn, FROZEN_BY, None)


def end_sessions(conn: Connection, timeout: float, between_rounds: Callable[[int], None]) -> int:
    """Ends every other client session of the database that began before now, and waits until they are gone.

    A session that began before the setting changed has the old default; one that begins
    after has the new one. A terminated session's open transaction is rolled back, so
    nothing it did without an acknowledgement survives. Returns how many sessions ended.
    """
    now = conn.execute("select clock_timestamp()").fetchone()
    assert now is not None
    started_before = now[0]
    ended = 0
    for round in range(END_SESSION_ROUNDS):
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
