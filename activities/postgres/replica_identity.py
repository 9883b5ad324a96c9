"""REPLICA IDENTITY FULL for the tables mode Online publishes without a key, given back without breaking a publication.

The source refuses to publish the updates and deletes of a table that has no primary key
and no other replica identity. With spec.driver.allowReplicaIdentityFull, replicate gives
such tables REPLICA IDENTITY FULL for the time of the replication, recording in ferry's
record on its publication (see replication) what each had before, and the end of the
replication gives it back. The publication, the identities and the record are made in
one transaction (`publish`): a table published without the identity it needs would have
the source refuse its updates and deletes, as the next paragraph says.

The identity belongs to the table, not to one publication: every publication that
publishes the table's updates or deletes needs it, and once it is gone every UPDATE and
DELETE of the table on the live source fails ("cannot update table ... because it does
not have a replica identity and publishes updates"). Another publication may rely on the
FULL ferry set: another Migration's (its replicate found the table FULL already, so it
set and recorded nothing; replicate refuses a source another Migration replicates, but
replications begun by a ferry without that refusal can overlap), or someone's own
logical replication. So the end gives a table back only when no other publication
publishes its updates or deletes (pg_publication_tables, which expands FOR ALL TABLES
and FOR TABLES IN SCHEMA; a partition counts as published when an ancestor is, as a
publication may publish through the root). Otherwise:
- another ferry publication publishes it: the table is handed over, its identity from
  before written into that publication's record (unless it is there), so the last of the
  replications to end gives it back, as it was before either began;
- only publications not ferry's do: it stays FULL, and the end logs what it was, to be
  given back by hand once they no longer publish it (ferry cannot tell when).

Giving back, handing over and dropping the publication are one transaction (`unpublish`),
under replication.PUBLICATIONS_LOCK, which every change of a ferry record takes: two
replications ending at once never each hand a table to the other and both drop their
publication, and a hand-over never interleaves with the other record's own changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import psycopg
from psycopg import sql

from activities.postgres import replication
from activities.postgres.connection import Connection

LACKING_IDENTITY = f"""
select format('%I.%I', n.nspname, c.relname), c.relreplident {replication.USER_TABLES}
and c.relkind = 'r' and c.relpersistence = 'p' and (
    c.relreplident = 'n'
    or (c.relreplident = 'd' and not exists (
        select from pg_index i where i.indrelid = c.oid and i.indisprimary and i.indimmediate and i.indisvalid
    ))
    or (c.relreplident = 'i' and not exists (select from pg_index i where i.indrelid = c.oid and i.indisreplident))
)
order by 1
"""
"""Tables whose updates and deletes the source refuses to publish: no primary key, and no other replica identity. A
DEFERRABLE primary key is none: PostgreSQL takes only an immediate one as the replica identity."""
OTHER_PUBLISHERS = """
with recursive published_as(name, relid) as (
    select r.name, to_regclass(r.name)::oid from unnest(%(tables)s::text[]) as r(name)
    union
    select a.name, i.inhparent from published_as a
    join pg_class c on c.oid = a.relid and c.relispartition
    join pg_inherits i on i.inhrelid = a.relid
)
select distinct a.name, p.pubname, obj_description(p.oid, 'pg_publication') from published_as a
join pg_class c on c.oid = a.relid
join pg_namespace n on n.oid = c.relnamespace
join pg_publication_tables t on t.schemaname = n.nspname and t.tablename = c.relname
join pg_publication p on p.pubname = t.pubname
where p.pubname <> %(own)s and (p.pubupdate or p.pubdelete)
order by 1, 2
"""
"""For each of `tables`, the publications other than `own` that publish its updates or deletes, or those of a
partitioned table it is a partition of (publish_via_partition_root lists the root), with their comments: (table,
publication, comment). pg_inherits rather than pg_partition_ancestors, which PostgreSQL 11 and older lack."""
WITHOUT_EQUALITY = """
with recursive columns(name, attname, type) as (
    select r.name, a.attname, a.atttypid from unnest(%(tables)s::text[]) as r(name)
    join pg_catalog.pg_attribute a on a.attrelid = pg_catalog.to_regclass(r.name)
    where a.attnum > 0 and not a.attisdropped and a.attgenerated = ''
    union all  -- a domain is compared as its base type, an array element by element
    select c.name, c.attname, case when t.typtype = 'd' then t.typbasetype else t.typelem end
    from columns c join pg_catalog.pg_type t on t.oid = c.type
    where t.typtype = 'd' or (t.typcategory = 'A' and t.typelem <> 0)
)
select c.name, c.attname, pg_catalog.format_type(c.type, null) from columns c
join pg_catalog.pg_type t on t.oid = c.type
where t.typtype not in ('d', 'c') and not (t.typcategory = 'A' and t.typelem <> 0) and not exists (
    select from pg_catalog.pg_opclass o join pg_catalog.pg_am m on m.oid = o.opcmethod
    where m.amname in ('btree', 'hash') and o.opcdefault and (
        o.opcintype = t.oid
        or o.opcintype = case t.typtype when 'e' then 'pg_catalog.anyenum'::pg_catalog.regtype
            when 'r' then 'pg_catalog.anyrange'::pg_catalog.regtype
            when 'm' then 'pg_catalog.anymultirange'::pg_catalog.regtype end
        or exists (
            select from pg_catalog.pg_cast k
            where k.castsource = t.oid and k.casttarget = o.opcintype and k.castmethod = 'b'
        )
    )
)
order by 1, 2
"""
"""For each of `tables`, its columns whose type has no equality operator (json, xml, point and other geometric types,
a type of an extension that defines none), with the type: (table, column, type). With REPLICA IDENTITY FULL the
subscriber finds the row an UPDATE or DELETE names by comparing every column (generated ones aside), and fails on
such a column ("could not identify an equality operator for type json"), for good. It finds the operator as
PostgreSQL's type cache does: the default btree or hash operator class of the type, of a type it is binary-coercible
to (varchar compares as text), or of the polymorphic type of enums and ranges; a domain as its base type, an array by
its elements. Composite columns are left out (compared field by field)."""
TABLES = """
select r.name, n.nspname, c.relname, c.relreplident from unnest(%(tables)s::text[]) as r(name)
join pg_class c on c.oid = to_regclass(r.name)
join pg_namespace n on n.oid = c.relnamespace
"""
"""Each of `tables` that exists: its schema and name as the catalog has them, and its relreplident."""


@dataclasses.dataclass(frozen=True)
class Kept:
    """A table left REPLICA IDENTITY FULL for publications that are not ferry's."""

    table: str
    before: str
    """Its relreplident before ferry made it FULL ('d' default, 'n' nothing)."""
    publications: list[str]
    """The publications that still publish its updates or deletes."""

    def restore_statement(self) -> str:
        return replication.restore_statement(self.table, self.before)


@dataclasses.dataclass
class GivenBack:
    """What the end of a replication did with the tables its record names (those no longer FULL are left out)."""

    restored: list[str] = dataclasses.field(default_factory=list)
    """Given their identity back."""
    handed_over: dict[str, str] = dataclasses.field(default_factory=dict)
    """Left FULL, by table: the other ferry publication whose record now gives it back."""
    kept: list[Kept] = dataclasses.field(default_factory=list)
    """Left FULL for publications that are not ferry's (or whose record the source's user may not write)."""


def lacking_identity(conn: Connection) -> dict[str, str]:
    """Tables that have no primary key and no replica identity, with their relreplident."""
    return {table: identity for table, identity in conn.execute(LACKING_IDENTITY).fetchall()}


def without_equality(conn: Connection, tables: list[str]) -> list[tuple[str, str, str]]:
    """The columns of `tables` that REPLICA IDENTITY FULL cannot compare on the subscriber: (table, column, type)."""
    return [(str(t), str(c), str(k)) for t, c, k in conn.execute(WITHOUT_EQUALITY, {"tables": tables}).fetchall()]


def publish(
    conn: Connection, publication: str, owner: str, *, every_table: bool, where: str,
    lacking: Callable[[], dict[str, str]], refuse_others: bool, retry: replication.Retry,
) -> replication.Record:  # fmt: skip
    """Publishes the source with ferry's record and gives the tables `lacking` names REPLICA IDENTITY FULL, recorded
    with what they had, all in one transaction; returns the record as it is then. A publication already there (an
    earlier attempt's) keeps its record, and the tables lacking an identity now are given FULL and added to it; a
    table the record names already keeps what the record says it had.

    No table is ever published without the identity its updates need: the source refuses every UPDATE and DELETE of
    such a table ("cannot update table ... because it does not have a replica identity and publishes updates").
    Published first and given FULL after, a table the application held (a long transaction, a vacuum) stayed so for
    as long as replicate waited for its lock. So the transaction takes every lock it needs first, each waiting at
    most LOCK_WAIT (`replication.briefly_locked`: when one would wait longer, nothing of it stays, and it tries again
    after `retry`), and commits the publication, the identities and the record together.

    `every_table`: FOR ALL TABLES, which only a superuser may create; otherwise FOR TABLE with every user table there
    is now, which the user must own (the precheck says so), listed before `lacking` runs, so that every table listed
    is one `lacking` sees. `lacking` (the tables needing FULL; it raises InvalidSpec when the spec allows none) runs
    in the transaction, under PUBLICATIONS_LOCK. With `refuse_others`, refused (InvalidSpec, see
    `replication.refuse_others`), nothing made, when another Migration's publication is on the source `where`
    describes; without it (replicate found this Migration's replication under way when it started, see
    ReplicationActivities._start), it publishes whatever else does.
    """

    def work() -> replication.Record:
        replication.lock_publications(conn)
        record = replication.read_record(conn, publication)
        made, tables = record is None, None
        if record is None:
            if refuse_others:
                replication.refuse_others(conn, publication, where)
            tables = None if every_table else replication.tables_to_publish(conn)
            record = replication.Record(owner=owner)
        wanted = lacking()
        names = {table: name for table, (name, _) in _tables(conn, list(wanted)).items()}
        for table in sorted(names):  # before the publication: the locks it needs first, in one order
            _set_identity(conn, names[table], "full")
        if made:
            replication.create_publication(conn, publication, tables)
        added = {t: v for t, v in wanted.items() if t not in record.replica_identity}
        if made or added:
            record = dataclasses.replace(record, replica_identity={**record.replica_identity, **added})
            replication.write_record(conn, publication, record)
        return record

    return replication.briefly_locked(conn, work, retry)


def unpublish(conn: Connection, publication: str, retry: replication.Retry) -> GivenBack | None:
    """Gives back the identities the record names (`restore_identities`) and drops the publication, in one transaction
    under PUBLICATIONS_LOCK; None when there is no publication."""

    def end() -> GivenBack | None:
        replication.lock_publications(conn)
        if not replication.exists(conn, publication):
            return None
        record = replication.read_record(conn, publication)
        given = restore_identities(conn, publication, record) if record is not None else GivenBack()
        replication.drop_publication(conn, publication)
        return given

    return replication.briefly_locked(conn, end, retry)


def restore_identities(conn: Connection, publication: str, record: replication.Record) -> GivenBack:
    """Gives the tables `record` names their identity back, those still FULL that no other publication publishes; hands
    those another ferry publication publishes over to its record; keeps the others FULL.

    The caller holds PUBLICATIONS_LOCK in the transaction open on `conn` (see `unpublish`). Each ALTER TABLE holds
    its table's exclusive lock until that transaction ends, and every query of the table waits meanwhile: so what
    the tables are and who publishes them is read for all of them, in two queries, before the first ALTER.
    """
    given = GivenBack()
    found = _tables(conn, sorted(record.replica_identity))
    # Only those still FULL: the others (dropped since, or changed by someone else) are theirs now.
    tables = {table: name for table, (name, identity) in found.items() if identity == "f"}
    publishers: dict[str, list[str]] = {}
    records: dict[str, replication.Record | None] = {}
    for table, other, comment in conn.execute(OTHER_PUBLISHERS, {"own": publication, "tables": list(tables)}):
        publishers.setdefault(table, []).append(other)
        records[other] = replication.parse_record(comment)
    for table, name in sorted(tables.items()):
        before = record.replica_identity[table]
        others = publishers.get(table)
        if not others:
            _set_identity(conn, name, _identity_clause(before))
            given.restored.append(table)
            continue
        heir = _hand_over(conn, table, before, others, records)
        if heir is not None:
            given.handed_over[table] = heir
        else:
            given.kept.append(Kept(table, before, others))
    return given


def _hand_over(
    conn: Connection, table: str, before: str, others: list[str], records: dict[str, replication.Record | None]
) -> str | None:
    """The ferry publication among `others` whose record gives `table` back when its replication ends: one whose record
    names it already, else the first whose record takes it; None when none is ferry's, or none may be written.

    `records` holds each publication's record as read before the first hand-over (None: not ferry's, or this user
    may not write it), and is kept as written since: a record taking several tables keeps every one of them.
    """
    ferrys = [(name, record) for name in others if (record := records.get(name)) is not None]
    for name, record in ferrys:
        if table in record.replica_identity:
            return name
    for name, record in ferrys:
        heir = dataclasses.replace(record, replica_identity={**record.replica_identity, table: before})
        try:
            with conn.transaction():  # a savepoint: a record this user may not write (not its publication) is skipped
                replication.write_record(conn, name, heir)
        except psycopg.errors.InsufficientPrivilege:
            records[name] = None
            continue
        records[name] = heir
        return name
    return None


def _identity_clause(before: str) -> str:
    return "nothing" if before == "n" else "default"


def _tables(conn: Connection, tables: list[str]) -> dict[str, tuple[sql.Identifier, str]]:
    """Each of `tables` that exists, by its name in the record: its name as the catalog has it (not as the record
    spells it) and its relreplident; one query, whatever their number."""
    rows = conn.execute(TABLES, {"tables": tables}).fetchall()
    return {table: (sql.Identifier(schema, name), str(identity)) for table, schema, name, identity in rows}


def _set_identity(conn: Connection, table: sql.Identifier, identity: str) -> None:
    conn.execute(sql.SQL("alter table {} replica identity {}").format(table, sql.SQL(identity)))
