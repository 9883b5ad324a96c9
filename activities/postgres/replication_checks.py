"""What mode Online needs of both databases, checked by the precheck before anything changes.

Logical replication asks more of the source than a dump does, and some of it can only be
changed with a restart or by the application's owners, so every gap is a problem of the
precheck, listed with the others, each saying what to change:
- wal_level must be logical (a server setting that only a restart changes);
- free replication slots and WAL senders: one of each for the subscription, and one more
  per table synchronization worker the target runs at once during the initial copy
  (its max_sync_workers_per_subscription);
- the Secret's user must be a superuser, or have REPLICATION (the target's server
  connects as it) and own every table (a publication of every table needs a superuser;
  otherwise ferry lists the tables, which needs their owner);
- every table needs a primary key or a replica identity, or the source refuses to
  publish its updates and deletes (unless spec.driver.allowReplicaIdentityFull, which
  replicate then sets to FULL for the time of the replication);
- no unlogged tables (their changes are not in the WAL) and no large objects (not
  replicated): mode Snapshot moves both;
- no table hash-partitioned on an enum: an enum's hash is its oid, which is not the
  same in the target, so the target's partitions would refuse the rows replicated into
  them by name; mode Snapshot loads such a table through its root (pg_dump does so);
- no trigger enabled ALWAYS or REPLICA on a replicated table: the schema copy carries
  that state to the target, whose subscription copies and applies every change with
  session_replication_role = replica, so such a trigger fires there for each one. An
  ALWAYS trigger has fired on the source already, and what it wrote is replicated, so
  its effect would happen twice (an audit row written twice, a notification sent
  again); a REPLICA one, which the source's own writes never fire, would do on the
  target what the source never did (a replicated row rewritten). Plain ENABLE (or, for
  a REPLICA one, DISABLE) keeps the source's own writes as they were; mode Snapshot
  creates the triggers after it has loaded the rows, so the rows it moves fire none;
- no other Migration replicates the source (one at a time: see
  replication.replicated_by_others); replicate asks again where it publishes, since
  another Migration may publish the source between this precheck and then;
- the target's user must be allowed to create a subscription (a superuser, or from
  PostgreSQL 16 a member of pg_create_subscription with CREATE on the database).
"""

from __future__ import annotations

from collections.abc import Sequence

from activities.postgres import replica_identity, replication
from activities.postgres.connection import Connection, connect
from activities.postgres.database_settings import REPLICATION_ENDED
from activities.secrets import DatabaseConnection
from activities.settings import DataActivitySettings
from ferry.api.errors import PermanentError
from ferry.api.migration import DriverSpec

SHOWN = 10
"""Tables named in one problem."""
SOURCE = """
select current_setting('wal_level'), current_setting('max_replication_slots')::int,
    current_setting('max_wal_senders')::int,
    (select count(*) from pg_replication_slots where slot_name <> %(slot)s),
    (select count(*) from pg_stat_activity where backend_type = 'walsender' and application_name <> %(slot)s),
    r.rolsuper, r.rolreplication
from pg_roles r where r.rolname = current_user
"""
NOT_OWNED = f"""
select format('%I.%I', n.nspname, c.relname) {replication.USER_TABLES}
and c.relkind in ('r', 'p') and not pg_has_role(current_user, c.relowner, 'USAGE') order by 1
"""
UNLOGGED = f"""
select format('%I.%I', n.nspname, c.relname) {replication.USER_TABLES}
and c.relkind in ('r', 'p') and c.relpersistence = 'u' order by 1
"""
ENUM_HASHED = f"""
select format('%I.%I', n.nspname, c.relname) {replication.USER_TABLES}
and c.relkind = 'p' and exists (
    select from pg_partitioned_table p
    join pg_attribute a on a.attrelid = p.partrelid and a.attnum = any(p.partattrs::int2[])
    join pg_type t on t.oid = a.atttypid
    left join pg_type base on base.oid = t.typbasetype
    where p.partrelid = c.oid and p.partstrat = 'h' and (t.typtype = 'e' or base.typtype = 'e')
) order by 1
"""
"""Tables hash-partitioned on an enum column (or a domain over one)."""
REPLICA_TRIGGERS = f"""
with replicated as (select c.oid, n.nspname, c.relname, c.relispartition {replication.USER_TABLES}
    and c.relkind in ('r', 'p'))
select format('%I.%I.%I', t.nspname, t.relname, g.tgname), g.tgenabled
from replicated t join pg_trigger g on g.tgrelid = t.oid
where not g.tgisinternal and g.tgenabled in ('A', 'R') and not (t.relispartition and exists (
    select from pg_inherits i join pg_trigger up on up.tgrelid = i.inhparent
    where i.inhrelid = t.oid and up.tgname = g.tgname and up.tgenabled = g.tgenabled
)) order by 1
"""
"""Triggers that fire for a subscription's changes (enabled ALWAYS, 'A', or REPLICA, 'R'), with that state, on the
tables a publication carries, partitions too: the target applies a partition's rows to its partition, whose own
trigger fires. A partition's clone of its parent's trigger in the same state is left out: the parent's is named, and
ALTER TABLE on the parent changes its partitions' too."""
ENABLED = {"A": "ALWAYS", "R": "REPLICA"}
TARGET = """
select r.rolsuper,
    exists (select from pg_roles g
        where g.rolname = 'pg_create_subscription' and pg_has_role(current_user, g.oid, 'USAGE'))
    and has_database_privilege(current_database(), 'CREATE'),
    current_setting('max_sync_workers_per_subscription')::int
from pg_roles r where r.rolname = current_user
"""


def _may_set(conn: Connection, parameter: str) -> bool:
    """Whether the current user may set `parameter` for a database; before PostgreSQL 15 anyone could."""
    if conn.info.server_version < 150000:
        return True
    row = conn.execute("select has_parameter_privilege(current_user, %s, 'SET')", (parameter,)).fetchone()
    return bool(row and row[0])


def check(
    source: DatabaseConnection,
    target: DatabaseConnection,
    settings: DataActivitySettings,
    driver: DriverSpec,
    uid: str,
    problems: list[str],
) -> None:
    """Adds every problem mode Online would meet on either database; reads only."""
    try:
        with connect(target, settings, default_transaction_read_only="on") as conn:
            needed = check_target(conn, target, problems)
        with connect(source, settings, default_transaction_read_only="on") as conn:
            check_source(conn, source, driver, replication.name(uid), needed, problems)
    except PermanentError as error:  # the general checks have said so already
        problems.append(str(error))


def check_target(conn: Connection, db: DatabaseConnection, problems: list[str]) -> int:
    """Adds the target's problems; returns how many slots and WAL senders the source must have free."""
    row = conn.execute(TARGET).fetchone()
    assert row is not None
    superuser, may_subscribe, workers = row
    if not (superuser or may_subscribe):
        problems.append(
            f"the user in Secret {db.secret} may not create a subscription in {db.describe()} (mode Online): use "
            "a superuser, or on PostgreSQL 16 and later GRANT pg_create_subscription TO that user and give it CREATE "
            "on the database."
        )
    return 1 + int(workers)


def check_source(
    conn: Connection, db: DatabaseConnection, driver: DriverSpec, slot: str, needed: int, problems: list[str]
) -> None:
    """Adds the source's problems, if any."""
    row = conn.execute(SOURCE, {"slot": slot}).fetchone()
    assert row is not None
    wal_level, max_slots, max_senders, slots_used, senders_used, superuser, may_replicate = row
    if wal_level != "logical":
        problems.append(
            f"the server of {db.describe()} has wal_level={wal_level}; mode Online needs wal_level=logical. Set it "
            "(ALTER SYSTEM SET wal_level = logical, or in postgresql.conf) and restart that server: wal_level only "
            "changes with a restart. Or use mode Snapshot."
        )
    free_slots, free_senders = max_slots - slots_used, max_senders - senders_used
    if free_slots < needed or free_senders < needed:
        problems.append(
            f"the server of {db.describe()} has {free_slots} free replication slots and {free_senders} free WAL "
            f"senders; mode Online needs {needed} of each (one for the subscription, one per table the target copies "
            f"at once). Raise max_replication_slots (now {max_slots}) and max_wal_senders (now {max_senders}) and "
            "restart that server, or drop unused slots (pg_replication_slots)."
        )
    if not (superuser or may_replicate):
        problems.append(
            f"the user in Secret {db.secret} has no REPLICATION attribute, and the target's server connects to "
            f"{db.describe()} as that user to replicate (mode Online). ALTER ROLE {db.username} REPLICATION, or use "
            "a superuser."
        )
    if not superuser:
        not_owned = [name for (name,) in conn.execute(NOT_OWNED)]
        if not_owned:
            problems.append(
                f"the user in Secret {db.secret} is not a superuser, so ferry publishes the tables of "
                f"{db.describe()} by name, which needs their owner; it does not own {listed(not_owned)}. Use a "
                "superuser (who may publish every table), or the tables' owner."
            )
    if not superuser and not _may_set(conn, REPLICATION_ENDED):
        problems.append(
            f"the user in Secret {db.secret} may not record in {db.describe()} that a replication has ended "
            f"({REPLICATION_ENDED}, which keeps a late attempt of replicate from making a slot again after a "
            "rollback): since PostgreSQL 15 only superusers may set custom parameters. As a superuser, GRANT SET ON "
            f"PARAMETER {REPLICATION_ENDED} TO {db.username}, or use a superuser."
        )
    others = replication.other_replications(conn, slot)
    if others:  # replicate asks again where it publishes (see replication.refuse_others)
        problems.append(replication.replicated_by_others(db.describe(), others))
    lacking = replica_identity.lacking_identity(conn)
    if lacking and not driver.allow_replica_identity_full:
        problems.append(
            f"these tables of {db.describe()} have no primary key and no replica identity, so the source cannot "
            f"replicate their updates and deletes: {listed(list(lacking))}. Give them a primary key (or ALTER TABLE "
            "... REPLICA IDENTITY USING INDEX), or set spec.driver.allowReplicaIdentityFull: true to have ferry set "
            "REPLICA IDENTITY FULL while replicating (slower updates and deletes; restored afterwards), or use mode "
            "Snapshot."
        )
    if lacking and driver.allow_replica_identity_full:
        uncomparable = replica_identity.without_equality(conn, list(lacking))
        if uncomparable:
            columns = [f"{table}.{column} ({kind})" for table, column, kind in uncomparable]
            problems.append(
                f"these columns of {db.describe()} are in tables with no primary key, which ferry would give REPLICA "
                f"IDENTITY FULL, and their types have no equality operator: {listed(columns)}. The target finds the "
                "row of each replicated UPDATE and DELETE by comparing every column, and cannot compare these: the "
                "replication would stop at the first one. Give those tables a primary key (or ALTER TABLE ... "
                "REPLICA IDENTITY USING INDEX), or change the columns' types (jsonb for json), or use mode Snapshot."
            )
    unlogged = [name for (name,) in conn.execute(UNLOGGED)]
    if unlogged:
        problems.append(
            f"these tables of {db.describe()} are unlogged, and logical replication only carries what the WAL "
            f"holds: {listed(unlogged)}. ALTER TABLE ... SET LOGGED, or use mode Snapshot."
        )
    enum_hashed = [name for (name,) in conn.execute(ENUM_HASHED)]
    if enum_hashed:
        problems.append(
            f"these tables of {db.describe()} are hash-partitioned on an enum, whose hash is its oid, which differs "
            f"in the target: replicated by partition, their rows would be refused by the target's partitions: "
            f"{listed(enum_hashed)}. Use mode Snapshot, which loads them through their root."
        )
    fired = [f"{name} ({ENABLED[state]})" for name, state in conn.execute(REPLICA_TRIGGERS)]
    if fired:
        problems.append(replica_triggers(db.describe(), fired))
    if conn.execute("select from pg_largeobject_metadata limit 1").fetchone() is not None:
        problems.append(
            f"{db.describe()} has large objects, which logical replication does not carry. Use mode Snapshot, or move "
            "them into bytea columns."
        )


def replica_triggers(database: str, fired: Sequence[str]) -> str:
    """The refusal of the triggers `fired` (`schema.table.trigger (ALWAYS)` or `(REPLICA)`) on the target."""
    return (
        f"these triggers of {database} are enabled ALWAYS or REPLICA: {listed(fired)}. The target's subscription "
        "copies and applies every change as a replica, so they would fire on the target for each one, on top of what "
        "is replicated: an ALWAYS trigger has fired for that change on the source already, and what it wrote is "
        "replicated too, so its effect would happen twice (a second audit row, a notification sent again); a "
        "REPLICA one would do on the target what the source's own writes never make it do (a replicated row "
        "rewritten). For the Migration's duration, ALTER TABLE ... ENABLE TRIGGER name each ALWAYS one (plain "
        "ENABLE fires on the source's own writes only, as before) and ALTER TABLE ... DISABLE TRIGGER name each "
        "REPLICA one (the source's own writes never fire it), and set them back once the Migration has finished, "
        "on the database that serves then. Or use spec.driver.mode Snapshot."
    )


def listed(tables: Sequence[str]) -> str:
    """The first SHOWN names, and how many more there are."""
    more = f" and {len(tables) - SHOWN} more" if len(tables) > SHOWN else ""
    return ", ".join(tables[:SHOWN]) + more
