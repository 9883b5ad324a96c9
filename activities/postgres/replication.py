"""The source's side of mode Online's logical replication: the publication, ferry's record of it, the slots.

Everything ferry creates for a Migration's replication has one name, made from the
Migration's uid (`name`): the publication and the replication slot on the source, the
subscription on the target. Any attempt and any undo finds them by that name, so a retry
never makes a second one, and an undo needs no step result.

The publication carries ferry's record of the replication as its comment, in JSON
(`Record`): which Migration it serves, which tables are REPLICA IDENTITY FULL for the
replication and what their identity was before (see replica_identity), and which
subscription copies from it (the subscription's oid and the target server's system
identifier). The last two name the
table synchronization slots that the subscription's initial copy makes on the source
(pg_<subscription oid>_sync_<table oid>_<system identifier>): a subscription dropped
without reaching the source leaves them, and they would keep WAL forever. Each part of
the record is written before what it records is done, or in the same transaction, and
the publication is dropped last, so an undo interrupted anywhere still finds everything
to undo.

A slot is dropped only once no walsender uses it: its walsender is terminated first (the
subscription is already gone or disabled then, so nothing reconnects).

One source database has one ferry replication at a time: replicate refuses to publish
a source on which another Migration's publication is (`refuse_others`), as the precheck
does, but the precheck comes hours earlier (mode Online publishes only after
provision and the recovery snapshot). The check and the creation are one transaction
under PUBLICATIONS_LOCK, an advisory lock of the source database that every change of
any ferry record takes too, so two replicates racing cannot both pass, and an end that
hands a table's replica identity over to another record (see replica_identity) never
interleaves with that record's other changes.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
from psycopg import sql
from temporalio import activity

from activities.heartbeats import Heartbeats
from activities.postgres.connection import Connection
from ferry.api.errors import InvalidSpec, ReplicationBroken

T = TypeVar("T")

LOCK_WAIT = "1s"
"""How long a change to the live source's tables (the publication, replica identities) waits for a lock before it
lets go and tries again. ALTER TABLE waits for an exclusive lock, and while it waits every later query of that
table waits behind it: behind a long query, or a vacuum, the application's own reads and writes would stop. Emptying
the target (restoring.remove) waits the same way, so that its activity heartbeats between tries."""
Retry = Callable[[str], None]
"""Called when such a change let go of a lock it waited for, with the server's words: pauses before the next try,
and raises once the activity is cancelled."""
PLUGIN = "pgoutput"
DROP_ROUNDS = 20
"""Rounds of ending walsenders and dropping slots before giving up (the next attempt tries again)."""
USER_TABLES = """
from pg_class c join pg_namespace n on n.oid = c.relnamespace
where n.nspname !~ '^pg_' and n.nspname <> 'information_schema' and c.relpersistence <> 't'
and not exists (select from pg_depend d where d.classid = 'pg_class'::regclass and d.objid = c.oid and d.deptype = 'e')
"""
"""The tables a publication of every table carries: user tables that no extension owns, temporary ones left out."""
PUBLICATIONS_LOCK = 0x6665727279_7075
"""The advisory lock (transaction-level, of the source database) under which ferry creates a publication, changes
any of its records, and gives replica identities back before dropping one."""
OTHER_REPLICATIONS = """
select pubname, obj_description(oid, 'pg_publication') from pg_publication
where pubname like 'ferry\\_%%' and pubname <> %(slot)s order by 1
"""
"""ferry's publications on the source other than this Migration's: replications of other Migrations."""
RESTORES_SHOWN = 5
"""Statements giving back replica identities that a refusal names, per publication left behind."""


def name(uid: str) -> str:
    """The publication's, the slot's and the subscription's name for a Migration's uid (63 characters at most)."""
    return "ferry_" + re.sub(r"[^a-z0-9]", "", uid.lower())


@dataclasses.dataclass
class Record:
    """ferry's record of a replication, kept as the comment of its publication."""

    owner: str
    """The Migration (namespace/name/uid) the replication serves."""
    replica_identity: dict[str, str] = dataclasses.field(default_factory=dict)
    """Tables whose identity the end of this replication gives back, with their relreplident before ('d' default, 'n'
    nothing): those replicate gave REPLICA IDENTITY FULL, and those another ended replication handed over because
    this one still published them (see replica_identity)."""
    subscription_oid: int | None = None
    """The oid of the subscription on the target, which names its table synchronization slots."""
    target_system: str | None = None
    """The target server's system identifier, the last part of those slots' names."""

    def sync_slots(self) -> str | None:
        """A regular expression matching the subscription's table synchronization slots, once the record knows it."""
        if self.subscription_oid is None or self.target_system is None:
            return None
        return f"^pg_{self.subscription_oid}_sync_[0-9]+_{self.target_system}$"


def exists(conn: Connection, publication: str) -> bool:
    return conn.execute("select from pg_publication where pubname = %s", (publication,)).fetchone() is not None


def read_record(conn: Connection, publication: str) -> Record | None:
    """The record the publication carries; None without a publication (or without a record of ferry's)."""
    row = conn.execute(
        "select obj_description(oid, 'pg_publication') from pg_publication where pubname = %s", (publication,)
    ).fetchone()
    return None if row is None else parse_record(row[0])


def parse_record(comment: str | None) -> Record | None:
    """The record a publication's comment holds; None when it holds none of ferry's."""
    if not comment:
        return None
    try:
        fields = json.loads(comment)
        return Record(
            owner=str(fields["owner"]),
            replica_identity={str(k): str(v) for k, v in fields.get("replica_identity", {}).items()},
            subscription_oid=fields.get("subscription_oid"),
            target_system=fields.get("target_system"),
        )
    except (ValueError, KeyError, AttributeError):
        return None


def write_record(conn: Connection, publication: str, record: Record) -> None:
    text = json.dumps(dataclasses.asdict(record), sort_keys=True)
    conn.execute(sql.SQL("comment on publication {} is {}").format(sql.Identifier(publication), sql.Literal(text)))


def lock_publications(conn: Connection) -> None:
    """Takes PUBLICATIONS_LOCK in the transaction open on `conn`, until it ends: in `briefly_locked`, whose
    lock_timeout bounds the wait (a holder may stand still: another Migration's worker stopped mid-transaction)."""
    conn.execute("select pg_advisory_xact_lock(%s)", (PUBLICATIONS_LOCK,))


def record_subscription(conn: Connection, publication: str, oid: int, system: str, retry: Retry) -> None:
    """Keeps the subscription's oid and the target's system identifier in the record (unless it has them).

    Under PUBLICATIONS_LOCK, which another Migration's replicate or end may hold, its worker stopped in the middle
    of its transaction: the wait is bounded as every other (`briefly_locked`, which `retry` heartbeats between
    tries), rather than as long as that holder stands still, while the caller holds its own Migration's lock.
    """

    def record() -> None:
        lock_publications(conn)
        found = read_record(conn, publication)
        if found is not None and (found.subscription_oid, found.target_system) != (oid, system):
            write_record(conn, publication, dataclasses.replace(found, subscription_oid=oid, target_system=system))

    briefly_locked(conn, record, retry)


def other_replications(conn: Connection, publication: str) -> list[tuple[str, Record | None]]:
    """The other Migrations' ferry publications on the source, with their records (None: no record of ferry's)."""
    rows = conn.execute(OTHER_REPLICATIONS, {"slot": publication}).fetchall()
    return [(name, parse_record(comment)) for name, comment in rows]


def replicated_by_others(where: str, others: list[tuple[str, Record | None]]) -> str:
    """What the precheck and replicate say of a source that `others` (other_replications) replicate."""
    whose = ", ".join(f"{name} (Migration {record.owner if record else 'unknown'})" for name, record in others)
    removals = "; ".join(f"for {name}, {removal(name, record)}" for name, record in others)
    return (
        f"{where} is being replicated by another Migration already: publication {whose}. Online Migrations of one "
        "source run one at a time: the freeze of either ends the other's replication connections, and its "
        "scale-down-old stops the source the other replicates. Wait until that Migration has finished or rolled "
        "back, or use mode Snapshot. One left behind by a Migration that no longer runs is removed once its "
        f"subscription is dropped on the target (see the README, Recovery): on the source, {removals}."
    )


def restore_statement(table: str, before: str) -> str:
    """The statement giving `table` back the identity a record keeps for it ('d' default, 'n' nothing)."""
    return f"ALTER TABLE {table} REPLICA IDENTITY {'NOTHING' if before == 'n' else 'DEFAULT'}"


def removal(publication: str, record: Record | None) -> str:
    """The statements that remove a ferry publication left behind, its subscription gone: the slot, the identities
    its record keeps, then the publication. Dropped first, the publication takes the record along, and the tables it
    names stay REPLICA IDENTITY FULL: those its replicate gave FULL, and those another Migration's end handed over
    to it (see replica_identity), which nothing else gives back."""
    kept = record.replica_identity if record is not None else {}
    restores = [restore_statement(table, before) for table, before in sorted(kept.items())]
    steps = [f"SELECT pg_drop_replication_slot('{publication}')"]
    if restores:
        more = (
            f"; and {len(restores) - RESTORES_SHOWN} more, as its record lists them"
            if len(restores) > RESTORES_SHOWN
            else ""
        )
        steps.append(
            "give back the replica identities its record (the publication's comment, replica_identity) keeps, each "
            f"table unless another publication still publishes it: {'; '.join(restores[:RESTORES_SHOWN])}{more}"
        )
        steps.append(
            f"last DROP PUBLICATION {publication} (dropped first, it takes the record along and those tables stay "
            "REPLICA IDENTITY FULL)"
        )
    else:
        steps.append(f"DROP PUBLICATION {publication}")
    return ", then ".join(steps)


def refuse_others(conn: Connection, publication: str, where: str) -> None:
    """Raises InvalidSpec when another Migration's ferry publication is on the source (`where` describes it).

    Permanent, not retried: the other replication lasts as long as its Migration (hours, or
    days awaiting an approval), and a retry that passed once it ended would start this one
    at a time nobody chose; a person decides (wait, then migrate again, or mode Snapshot).
    InvalidSpec, as the precheck's refusal of the same source is permanent, rather than a
    new type: an attempt keeps the retry policy its activity was scheduled with (by a
    workflow worker of an earlier version during an upgrade), which would retry a type it
    does not name.
    """
    others = other_replications(conn, publication)
    if others:
        raise InvalidSpec(
            f"{replicated_by_others(where, others)} replicate refused to publish the source for this Migration, "
            "whose precheck found no other replication there (mode Online publishes only after provision and the "
            "recovery snapshot, so another Migration's may begin in between); none of this Migration's replication "
            "was made."
        )


def briefly_locked(conn: Connection, work: Callable[[], T], retry: Retry) -> T:
    """Runs `work` in one transaction whose statements wait at most LOCK_WAIT for a lock; when one would wait
    longer, the transaction is rolled back (nothing of it stays), `retry` pauses, and `work` runs again. So does a
    deadlock the server broke by ending this transaction: `work` taking several tables' locks (the publication's,
    the replica identities') may meet the application's transactions taking them in another order."""
    while True:
        try:
            with conn.transaction():
                conn.execute(f"set local lock_timeout = '{LOCK_WAIT}'")
                return work()
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as error:
            retry(str(error).strip())


def lock_retry(heartbeats: Heartbeats, doing: str, pause: float) -> Retry:
    """The `retry` of `briefly_locked` for an activity doing `doing`: says so, heartbeats, pauses `pause` seconds, and
    raises once the activity is cancelled."""

    def retry(why: str) -> None:
        activity.logger.info("%s: a lock was not granted within %s (%s); trying again", doing, LOCK_WAIT, why)
        heartbeats.progress(waiting_for_lock=why)
        activity.wait_for_cancelled_sync(pause)
        heartbeats.raise_if_cancelled(doing)

    return retry


def tables_to_publish(conn: Connection) -> list[str]:
    """Every user table a publication by name lists (partitions through their root), quoted by format('%I.%I')."""
    return [
        row[0]
        for row in conn.execute(
            f"select format('%I.%I', n.nspname, c.relname) {USER_TABLES} "
            "and c.relkind in ('r', 'p') and not c.relispartition order by 1"
        )
    ]


def create_publication(conn: Connection, publication: str, tables: list[str] | None) -> None:
    """CREATE PUBLICATION, FOR ALL TABLES when `tables` is None (only a superuser may), else FOR TABLE `tables`
    (from `tables_to_publish`; the user must own them). The caller holds PUBLICATIONS_LOCK in the transaction open on
    `conn`, which writes ferry's record before it commits: a publication without a record is not from an attempt."""
    if exists(conn, publication):
        raise RuntimeError(f"publication {publication} exists without ferry's record: drop it, then retry")
    if tables is None:
        conn.execute(sql.SQL("create publication {} for all tables").format(sql.Identifier(publication)))
    elif tables:
        listed = sql.SQL(", ").join(sql.SQL(table) for table in tables)  # quoted by format('%I.%I')
        conn.execute(sql.SQL("create publication {} for table {}").format(sql.Identifier(publication), listed))
    else:
        conn.execute(sql.SQL("create publication {}").format(sql.Identifier(publication)))


def drop_publication(conn: Connection, publication: str) -> bool:
    if not exists(conn, publication):
        return False
    conn.execute(sql.SQL("drop publication if exists {}").format(sql.Identifier(publication)))
    return True


# --- slots ---------------------------------------------------------------------------------


def has_slot(conn: Connection, slot: str) -> bool:
    return conn.execute("select from pg_replication_slots where slot_name = %s", (slot,)).fetchone() is not None


def create_slot(conn: Connection, slot: str) -> bool:
    """Creates the logical slot unless it is there; True when this call created it.

    PostgreSQL waits for the transactions running on the source to end before the slot is
    ready: a session idle in a transaction holds it up (cancel the query to stop the wait).
    """
    if has_slot(conn, slot):
        return False
    conn.execute("select pg_create_logical_replication_slot(%s, %s)", (slot, PLUGIN))
    return True


def slots(conn: Connection, slot: str, record: Record | None) -> list[str]:
    """This replication's slots on the source: the subscription's, and its table synchronization slots."""
    pattern = record.sync_slots() if record is not None else None
    rows = conn.execute(
        "select slot_name from pg_replication_slots where slot_name = %s or slot_name ~ %s order by 1",
        (slot, pattern or "^$"),
    ).fetchall()
    return [row[0] for row in rows]


def drop_slots(conn: Connection, names: list[str], between_rounds: Callable[[], None]) -> None:
    """Ends the walsenders using the slots, then drops them; raises RuntimeError if they stay."""
    left = list(names)
    for _ in range(DROP_ROUNDS):
        rows = conn.execute(
            "select slot_name, active_pid from pg_replication_slots where slot_name = any(%s)", (left,)
        ).fetchall()
        left = []
        for slot, pid in rows:
            if pid is not None:
                conn.execute("select pg_terminate_backend(%s, 5000)", (pid,))
            try:
                conn.execute("select pg_drop_replication_slot(%s)", (slot,))
            except psycopg.errors.ObjectInUse:  # its walsender has not exited yet: next round
                left.append(slot)
            except psycopg.errors.UndefinedObject:  # gone meanwhile
                pass
        if not left:
            return
        between_rounds()
        time.sleep(0.5)
    raise RuntimeError(f"the replication slots {', '.join(left)} stayed in use after {DROP_ROUNDS} rounds")


# --- positions -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Behind:
    """Where the slot's consumer stands against a position of the source's WAL."""

    bytes: int
    """Bytes of WAL up to that position the consumer has not confirmed."""
    confirmed: str
    """The position it confirmed (confirmed_flush_lsn)."""
    streaming: bool
    """Whether a walsender streams from the slot now: False while the subscription's worker is not connected."""


SLOT_STATE = """
select greatest(pg_wal_lsn_diff({lsn}, s.confirmed_flush_lsn), 0)::bigint, s.confirmed_flush_lsn::text, s.active,
    to_jsonb(s) ->> 'wal_status', to_jsonb(s) ->> 'invalidation_reason'
from pg_replication_slots s where s.slot_name = %s
"""
"""wal_status (PostgreSQL 13+) and invalidation_reason (17+) read through to_jsonb: NULL where the server lacks them."""


def lag(conn: Connection, slot: str) -> Behind | None:
    """Where the slot's consumer stands against the end of the source's WAL; None without the slot.

    Raises ReplicationBroken when the slot was invalidated (see `_behind`).
    """
    return _behind(conn, slot, SLOT_STATE.format(lsn="pg_current_wal_lsn()"), (slot,))


def position(conn: Connection) -> str:
    """Where the source's WAL ends now: every transaction it acknowledged committed before this position."""
    row = conn.execute("select pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def still_to_apply(conn: Connection, slot: str, lsn: str) -> Behind | None:
    """Where the slot's consumer stands against `lsn`; None without the slot.

    Raises ReplicationBroken when the slot was invalidated (see `_behind`).
    """
    return _behind(conn, slot, SLOT_STATE.format(lsn="%s::pg_lsn"), (lsn, slot))


def _behind(conn: Connection, slot: str, query: str, params: tuple[str, ...]) -> Behind | None:
    """The slot's state; ReplicationBroken at once when the source invalidated the slot.

    An invalidated slot (wal_status 'lost': the source removed WAL its consumer had not
    received, because max_slot_wal_keep_size capped what the slot may hold; or, from
    PostgreSQL 17, any invalidation_reason) can never stream again: the subscription's
    worker fails every few seconds with "cannot read from logical replication slot",
    failures pg_stat_subscription_stats does not count.
    """
    row = conn.execute(query, params).fetchone()
    if row is None:
        return None
    remaining, confirmed, active, wal_status, reason = row
    if wal_status == "lost" or reason is not None:
        raise ReplicationBroken(
            f"the source invalidated the replication slot {slot} (wal_status {wal_status or 'unknown'}"
            f"{f', invalidation_reason {reason}' if reason else ''}): it removed WAL the target had not received yet, "
            "typically because the slot held more than max_slot_wal_keep_size while the target was behind or "
            "disconnected. The replication cannot resume from it; the run rolls back (the source keeps every write). "
            "Raise max_slot_wal_keep_size on the source (or set it to -1), make sure the target's server keeps "
            "connected to the source, and migrate again."
        )
    return Behind(bytes=int(remaining or 0), confirmed=str(confirmed), streaming=bool(active))
