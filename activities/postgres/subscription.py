"""The target's side of mode Online's logical replication: the subscription, its progress, and its removal.

The subscription is made with `create_slot = false` on the slot ferry made on the source
beforehand (see replication), so its name is ferry's, found again by any retry; and with
`copy_data = true`, so that each table is first copied whole (one table synchronization
worker at a time per table, each with a slot of its own on the source), then kept up to
date from the slot. pg_subscription_rel says how far each table is: state `r` (ready)
once its copy is done and it follows the stream.

The subscription connects from the target's server, not from the worker: its connection
string names the source's replicationHost and replicationPort from the Secret, when given
(in a cluster, the source's Service), else its host and port, and its sslmode. It holds
the source user's password, which the target keeps in pg_subscription (readable by
superusers only). The Secret's ca.crt cannot go along: with a verifying sslmode the
target's server must trust the source's CA itself.

Removing it never depends on the source: it is disabled and detached from its slot
(slot_name = NONE) before DROP SUBSCRIPTION, which then drops nothing remote; ferry drops
the slots on the source itself (see replication). A dead or unreachable source cannot
keep the undo from removing the subscription, and the slots are dropped explicitly, so
none is left behind either way.
"""

from __future__ import annotations

import dataclasses

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from activities.postgres.connection import Connection
from activities.secrets import DatabaseConnection
from activities.settings import DataActivitySettings
from ferry.api.errors import InvalidSpec


@dataclasses.dataclass(frozen=True)
class Subscription:
    oid: int
    enabled: bool
    slot: str | None


@dataclasses.dataclass(frozen=True)
class Progress:
    tables: int
    ready: int
    errors: int
    """Errors the subscription's workers had applying or copying (0 where the server does not count them)."""
    worker: bool = True
    """Whether the subscription's apply worker runs now (pg_stat_subscription lists it with a pid)."""


def find(conn: Connection, name: str) -> Subscription | None:
    row = conn.execute(
        "select oid, subenabled, subslotname from pg_subscription "
        "where subname = %s and subdbid = (select oid from pg_database where datname = current_database())",
        (name,),
    ).fetchone()
    return Subscription(oid=int(row[0]), enabled=bool(row[1]), slot=row[2]) if row else None


VERIFYING = ("verify-ca", "verify-full")


def conninfo(source: DatabaseConnection, settings: DataActivitySettings) -> str:
    """How the target's server connects to the source: with the Secret's sslmode, as the worker does."""
    return make_conninfo(
        host=source.replication_host or source.host,
        port=str(source.replication_port or source.port),
        user=source.username,
        password=source.password,
        dbname=source.database,
        sslmode=source.tls_mode(),
        connect_timeout=str(settings.connect_timeout),
    )


QUIET = (("log_statement", "none"), ("log_min_error_statement", "panic"), ("log_min_duration_statement", "-1"))
"""What keeps CREATE SUBSCRIPTION's text, which holds the source's password, out of the target's server log: the
statement is logged when it fails (log_min_error_statement, error by default), and by log_statement = ddl or all, or
a duration threshold."""


def _unlogged(conn: Connection) -> None:
    """Turns off, for the rest of the transaction open on `conn`, the logging of statements that QUIET names; each
    that the user may not set (they are a superuser's; a user granted pg_create_subscription may lack them) is left
    as the server has it."""
    for name, value in QUIET:
        try:
            with conn.transaction():
                conn.execute(sql.SQL("set local {} = {}").format(sql.Identifier(name), sql.Literal(value)))
        except psycopg.errors.InsufficientPrivilege:
            pass  # a superuser's setting: the server's own value stands


def create(conn: Connection, name: str, source: DatabaseConnection, settings: DataActivitySettings) -> Subscription:
    """Subscribes to the publication `name` through the slot `name`, with the initial copy of every table."""
    statement = sql.SQL(
        "create subscription {name} connection {conninfo} publication {name} "
        "with (create_slot = false, slot_name = {slot}, copy_data = true, enabled = true)"
    ).format(name=sql.Identifier(name), conninfo=sql.Literal(conninfo(source, settings)), slot=sql.Literal(name))
    try:
        with conn.transaction():
            _unlogged(conn)
            conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege:
        raise  # the caller says which privilege is missing
    except psycopg.Error as error:
        if not (error.sqlstate or "").startswith("08"):  # class 08: connection exceptions
            raise RuntimeError(f"could not create subscription {name}: {source.redact(str(error)).strip()}") from None
        where = f"{source.replication_host or source.host}:{source.replication_port or source.port}"
        raise InvalidSpec(
            f"the target's server could not connect to the source at {where} to subscribe: "
            f"{source.redact(str(error)).strip()}. The target's server, not the worker, makes this connection: set "
            f"the keys replicationHost and replicationPort of Secret {source.secret} to where it reaches the source "
            "(in a cluster, the source's Service), and let the source's pg_hba.conf accept it."
            + (
                f" With sslmode {source.tls_mode()} the target's server must also trust the CA of the source's "
                "certificate (root.crt in ~/.postgresql of its operating-system user): ferry cannot hand it the "
                "Secret's ca.crt."
                if source.tls_mode() in VERIFYING
                else ""
            )
        ) from None
    made = find(conn, name)
    assert made is not None
    return made


def enable(conn: Connection, name: str) -> None:
    conn.execute(sql.SQL("alter subscription {} enable").format(sql.Identifier(name)))


def progress(conn: Connection, subscription: Subscription) -> Progress:
    row = conn.execute(
        "select count(*), count(*) filter (where srsubstate = 'r') from pg_subscription_rel where srsubid = %s",
        (subscription.oid,),
    ).fetchone()
    assert row is not None
    return Progress(
        tables=int(row[0]), ready=int(row[1]), errors=_errors(conn, subscription), worker=_worker(conn, subscription)
    )


def _worker(conn: Connection, subscription: Subscription) -> bool:
    """Whether the apply worker runs: it is gone while it cannot connect to the source or start streaming (it tries
    again every wal_retrieve_retry_interval), failures that pg_stat_subscription_stats does not count."""
    row = conn.execute(
        "select exists (select from pg_stat_subscription where subid = %s and relid is null and pid is not null)",
        (subscription.oid,),
    ).fetchone()
    return bool(row and row[0])


def _errors(conn: Connection, subscription: Subscription) -> int:
    if conn.info.server_version < 150000:  # pg_stat_subscription_stats came with PostgreSQL 15
        return 0
    conn.execute("select pg_stat_clear_snapshot()")
    row = conn.execute(
        "select apply_error_count + sync_error_count from pg_stat_subscription_stats where subid = %s",
        (subscription.oid,),
    ).fetchone()
    return int(row[0]) if row else 0


def system_identifier(conn: Connection) -> str:
    """The target server's system identifier, the last part of the table synchronization slots' names."""
    row = conn.execute("select system_identifier::text from pg_control_system()").fetchone()
    assert row is not None
    return str(row[0])


def drop(conn: Connection, name: str) -> bool:
    """Disables the subscription, detaches it from its slot, and drops it; False when there was none."""
    found = find(conn, name)
    if found is None:
        return False
    subscription = sql.Identifier(name)
    if found.enabled:
        conn.execute(sql.SQL("alter subscription {} disable").format(subscription))
    if found.slot is not None:
        conn.execute(sql.SQL("alter subscription {} set (slot_name = none)").format(subscription))
    conn.execute(sql.SQL("drop subscription if exists {}").format(subscription))
    return True
