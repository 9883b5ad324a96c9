"""Fingerprints of every user table that do not depend on row order: a row count and a content checksum.

Each row is hashed into 64 bits (from its text form, or column by column: see below),
and the hashes are summed into a numeric. A sum does not depend on the order rows come
in (a restored table's physical order may differ), and it counts duplicate rows, which
an XOR would cancel in pairs. A changed row goes unnoticed only if its 64-bit hash stays
the same: a chance of 2^-64. A row's text form depends on session settings (dates, time
zone, floats, bytea, intervals, money), so both sides read with the same fixed ones.

Which hash (`agreed`), the fastest both servers compute alike:
- COLUMNS: each column hashed from its stored value where that is exact, PostgreSQL's
  own hash_record_extended of the row, mixed (below). It reads about 1.5 times as fast
  as hashing the text (on 1 GB here: 2.7 to 3.2 s against 4.4 to 4.5 s), since most
  columns need no text form at all. A column goes in as it is stored when its type's
  hash is exact (bool, "char", int2, int4, date, bytea, uuid), as text in collation "C"
  (text, varchar: their bytes), as its binary send form when the hash would fold 64 bits
  into 32 (int8, time, timestamp, timestamptz), and every other column by its text
  form: numeric (whose hash ignores the sign, 5 and -5, and trailing zeros, 1.0 and
  1.00, and takes NaN and the infinities for a null), floats (whose hash makes -0 and 0
  alike), jsonb (whose hash does not see where an array ends), enums (hashed by their
  oid, which a restore changes), any type ferry does not know. The common ones whose
  cast to text is their output function (AS_TEXT) go in one by one, `col::text`; the
  rest, in one `row(...)::text` per row, whose quoting costs more (1.1 of 6.6 seconds
  of CPU per GB of the benchmark's table) but whose text is the output function's for
  every type: a cast to text may be a function of its own, and character(n)'s strips
  the trailing blanks. The column count comes first, so that a null column more or
  less shows. hash_record_extended combines the columns linearly, so its result is
  hashed once more (hashtextextended of its digits) before the sum: without that, two
  rows that swapped a value would keep the sum.
- HASHTEXT: hashtextextended of the row's text form, which costs about half of what md5
  does (on 1 GB here, reading the text forms took 5.7 s, summing their hashtextextended
  5.3 s, their md5 11.1 s).
- MD5: md5's first 64 bits of the row's text form, the same everywhere.
These hash functions are stable across major versions (hash partitions, which
pg_upgrade keeps, depend on them), but not across byte orders, and a server older than
14 (11) lacks hash_record_extended (hashtextextended): so both sides hash the same probe
rows first, and the next hash is tried unless their answers are equal. Text is hashed
in collation "C", byte for byte, whatever the database's or column's collation. The
functions, types and collation of the checksums and of the probes are named with their
schema, pg_catalog, so that nothing of the same name on a database's search_path stands
in for them.

The tables are the ordinary tables (relkind r, so partitioned tables are checked
through their partitions) and the populated materialized views, in every schema but
pg_* and information_schema, except those belonging to an extension. A hash-partitioned
table is the exception: it is read whole, as one table, under the name of its highest
hash-partitioned ancestor (`HASH_PARTITIONED`), and its partitions are not read on their
own. The partition a row goes to there follows a hash that need not be the same on the
two servers (an enum's hashes its oid, which a restore changes, so pg_dump loads such a
table through its root), and the same rows may be spread over the partitions otherwise.
Large objects are one more entry, `large objects`, when a side has any: their count,
and the sum of a hash of each one's oid and contents (pg_dump keeps their oids).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import psycopg
from psycopg import sql

from activities.postgres.connection import Connection
from ferry.api.saga import TableCheck

MISSING = "missing"
"""The checksum shown for a table that one side does not have."""
LARGE_OBJECTS = "large objects"
"""The entry for the database's large objects, compared like a table."""

SESSION = {
    "DateStyle": "ISO,MDY",
    "TimeZone": "UTC",
    "IntervalStyle": "postgres",
    "extra_float_digits": "1",
    "bytea_output": "hex",
    "lc_monetary": "C",
    "statement_timeout": "0",
    "row_security": "off",
}
"""Session settings of both sides' connections, so equal rows have equal text; and so that a read row-level security
would show only some rows of fails instead (pg_dump reads so too)."""

TABLES = """
select n.nspname, c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace
where (c.relkind = 'r' or (c.relkind = 'm' and c.relispopulated))
and n.nspname !~ '^pg_' and n.nspname <> 'information_schema'
and not exists (select from pg_depend d where d.classid = 'pg_class'::regclass and d.objid = c.oid and d.deptype = 'e')
order by 1, 2
"""

ESTIMATE = f"""
select coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint, count(*) filter (where c.reltuples < 0)
from ({TABLES}) t join pg_namespace n on n.nspname = t.nspname join pg_class c on c.relnamespace = n.oid
    and c.relname = t.relname
"""
"""The statistics' row estimate of those tables, and how many have none (reltuples -1: never vacuumed or analyzed)."""

CHECKSUM = """
select pg_catalog.count(*), coalesce(pg_catalog.sum({hash}), 0) from {table} as t
"""


@dataclasses.dataclass(frozen=True)
class RowHash:
    """A 64-bit hash of a row `t`, as SQL; `name` tells checksums made with different hashes apart."""

    name: str
    sql: str
    """The hash of `t`; with `by_column`, a template whose {columns} are the row's columns as `columns` puts them."""
    by_column: bool = False


MD5 = RowHash("md5", "('x' || pg_catalog.left(pg_catalog.md5(t::text), 16))::bit(64)::bigint")
"""The same on every server and platform; the fallback."""
HASHTEXT = RowHash("hashtextextended", 'pg_catalog.hashtextextended(t::text collate "C", 0)')
"""About twice as fast as MD5; used when both servers agree on it (see `agreed`)."""
COLUMNS = RowHash(
    "hash_record_extended",
    "pg_catalog.hashtextextended(pg_catalog.hash_record_extended(row({columns}), 0)::pg_catalog.text, 0)",
    by_column=True,
)
"""About 1.5 times as fast as HASHTEXT; used when both servers agree on it (see `agreed`)."""

AS_STORED = {16: "bool", 18: "char", 21: "int2", 23: "int4", 1082: "date", 17: "bytea", 2950: "uuid"}
"""Types (by their fixed oids) whose hash sees every bit of the value: such a column goes into COLUMNS as it is."""
AS_BYTES = {25: "text", 1043: "varchar"}
"""Types whose hash, in collation "C", is that of their bytes."""
AS_SENT = {20: "int8send", 1083: "time_send", 1114: "timestamp_send", 1184: "timestamptz_send"}
"""64-bit types whose hash folds them into 32 bits: their binary send form (8 bytes) goes in instead."""
AS_TEXT = {
    **{1700: "numeric", 700: "float4", 701: "float8", 3802: "jsonb", 114: "json", 1186: "interval"},
    **{1266: "timetz", 790: "money", 142: "xml", 1560: "bit", 1562: "varbit", 829: "macaddr", 3614: "tsvector"},
    **{1007: "int4[]", 1016: "int8[]", 1009: "text[]", 1015: "varchar[]", 1022: "float8[]", 1231: "numeric[]"},
    **{2951: "uuid[]", 3807: "jsonb[]", 1000: "bool[]", 1185: "timestamptz[]", 1182: "date[]"},
}
"""Types whose hash is not exact and whose cast to text is their output function (checked against pg_cast): such
a column goes in as its text, in collation "C"."""
ROW_ITEMS = 1000
"""Past this many items, COLUMNS hashes rows of this many, then the row of their hashes' digits."""

HASH_PARTITIONED = """
with recursive up(leaf, ancestor, depth) as (
    select i.inhrelid, i.inhparent, 1 from pg_catalog.pg_inherits i
    join pg_catalog.pg_class c on c.oid = i.inhrelid and c.relispartition and c.relkind = 'r'
    union all
    select up.leaf, i.inhparent, up.depth + 1 from up
    join pg_catalog.pg_class p on p.oid = up.ancestor and p.relispartition
    join pg_catalog.pg_inherits i on i.inhrelid = up.ancestor
)
select distinct on (up.leaf) ln.nspname, l.relname, an.nspname, a.relname
from up join pg_catalog.pg_partitioned_table pt on pt.partrelid = up.ancestor and pt.partstrat = 'h'
join pg_catalog.pg_class l on l.oid = up.leaf join pg_catalog.pg_namespace ln on ln.oid = l.relnamespace
join pg_catalog.pg_class a on a.oid = up.ancestor join pg_catalog.pg_namespace an on an.oid = a.relnamespace
order by up.leaf, up.depth desc
"""
"""Each partition with a hash-partitioned ancestor, and the highest such ancestor, which is read in its stead."""

COLUMN_TYPES = """
select n.nspname, c.relname, a.attname, a.atttypid::bigint
from pg_catalog.pg_attribute a join pg_catalog.pg_class c on c.oid = a.attrelid
join pg_catalog.pg_namespace n on n.oid = c.relnamespace
where a.attnum > 0 and not a.attisdropped and c.relkind in ('r', 'm', 'p')
and n.nspname !~ '^pg_' and n.nspname <> 'information_schema'
order by 1, 2, a.attnum
"""
"""The columns of every table TABLES can name, in their order, with their types' oids."""

PROBE = """
select pg_catalog.array_agg(
    pg_catalog.hashtextextended(
        pg_catalog.left(pg_catalog.repeat('ferry checks rows 0123456789,', 8), n) collate "C", 0
    )
    order by n
)
from pg_catalog.generate_series(0, 200) as n
"""
"""hashtextextended of strings of every length up to 200 bytes, so that a difference in how words are read shows."""

COLUMNS_PROBE = """
select pg_catalog.array_agg(pg_catalog.hashtextextended(pg_catalog.hash_record_extended(row(
    11, n % 3 = 0, pg_catalog.chr(65 + n % 26)::pg_catalog."char", (n - 100)::pg_catalog.int2, n * 65599 - 6000000,
    pg_catalog.date '2000-01-01' + n * 37, pg_catalog.decode(pg_catalog.md5(n::pg_catalog.text), 'hex'),
    pg_catalog.md5(n::pg_catalog.text)::pg_catalog.uuid,
    pg_catalog.left(pg_catalog.repeat('ferry checks rows 0123456789,', 8), n) collate pg_catalog."C",
    pg_catalog.int8send(n::pg_catalog.int8 * 4294967311 - 400000000000),
    (n / 7.0 - 3)::pg_catalog.numeric::pg_catalog.text collate pg_catalog."C",
    row(n / 3.0::pg_catalog.float8, n)::pg_catalog.text collate pg_catalog."C"
), 0)::pg_catalog.text, 0) order by n)
from pg_catalog.generate_series(0, 200) as n
"""
"""COLUMNS of probe rows with a column of every kind it reads, so that a difference in how a kind is hashed shows."""

LARGE_OBJECT_PIECE = 1 << 20
"""Bytes of a large object read at a time: `lo_get` of a whole object over 1 GB fails (PostgreSQL allocates the whole
result), so each object is hashed piece by piece, the md5 of its pieces' md5s, in order."""
LARGE_OBJECT_CHECKSUM = """
with recursive pieces(oid, at, digest, more) as (
    select m.oid, 0::bigint, pg_catalog.md5(g.piece), pg_catalog.length(g.piece) = %(piece)s
    from pg_catalog.pg_largeobject_metadata m, lateral (select pg_catalog.lo_get(m.oid, 0, %(piece)s) as piece) g
    union all
    select p.oid, p.at + %(piece)s, pg_catalog.md5(g.piece), pg_catalog.length(g.piece) = %(piece)s
    from pieces p, lateral (select pg_catalog.lo_get(p.oid, p.at + %(piece)s, %(piece)s) as piece) g
    where p.more
), objects(oid, digest) as (
    select oid, pg_catalog.md5(pg_catalog.string_agg(digest, '' order by at)) from pieces group by oid
)
select pg_catalog.count(*), coalesce(pg_catalog.sum(('x' || pg_catalog.left(
    pg_catalog.md5(oid::text || ':' || digest), 16))::bit(64)::bigint), 0)
from objects
"""


def estimated_rows(conn: Connection) -> int | None:
    """The rows of the tables `fingerprints` reads, as the statistics estimate them; None when some table has none
    (never analyzed), since a sum without it would promise an end too soon."""
    row = conn.execute(ESTIMATE).fetchone()
    if row is None or row[1]:
        return None
    return int(row[0])


def agreed(source: Connection, target: Connection) -> RowHash:
    """The row hash to read both sides with: the first of COLUMNS and HASHTEXT whose probe both servers answer
    alike, else MD5."""
    for row_hash, probe in ((COLUMNS, COLUMNS_PROBE), (HASHTEXT, PROBE)):
        answers = [_probe(conn, probe) for conn in (source, target)]
        if answers[0] is not None and answers[0] == answers[1]:
            return row_hash
    return MD5


def _probe(conn: Connection, probe: str) -> list[int] | None:
    try:
        row = conn.execute(probe).fetchone()
    except psycopg.errors.UndefinedFunction:  # a server older than 14 (COLUMNS) or 11 (HASHTEXT)
        return None
    return None if row is None else list(row[0])


def columns(names_and_types: list[tuple[str, int]]) -> sql.Composable:
    """A table's columns (name and type oid, in their order) as COLUMNS reads them: the count first, then each column
    whose type it knows (those of AS_TEXT by their text), then the others' text form as one row."""
    items: list[sql.Composable] = [sql.Literal(len(names_and_types))]
    others: list[sql.Composable] = []
    for name, type_oid in names_and_types:
        column = sql.SQL("t.{}").format(sql.Identifier(name))
        if type_oid in AS_STORED:
            items.append(column)
        elif type_oid in AS_BYTES:
            items.append(sql.SQL('{} collate pg_catalog."C"').format(column))
        elif type_oid in AS_SENT:
            items.append(sql.SQL("pg_catalog.{}({})").format(sql.Identifier(AS_SENT[type_oid]), column))
        elif type_oid in AS_TEXT:
            items.append(sql.SQL('{}::pg_catalog.text collate pg_catalog."C"').format(column))
        else:
            others.append(column)
    if others:
        items.append(sql.SQL('row({})::pg_catalog.text collate pg_catalog."C"').format(sql.SQL(", ").join(others)))
    if len(items) > ROW_ITEMS:  # a row holds at most 1664 items
        items = [
            sql.SQL('pg_catalog.hash_record_extended(row({}), 0)::pg_catalog.text collate pg_catalog."C"').format(
                sql.SQL(", ").join(items[at : at + ROW_ITEMS])
            )
            for at in range(0, len(items), ROW_ITEMS)
        ]
    return sql.SQL(", ").join(items)


def read_tables(conn: Connection) -> list[tuple[str, str]]:
    """The tables `fingerprints` reads, as (schema, name), in order: TABLES, each partition of a hash-partitioned
    table replaced by its highest hash-partitioned ancestor (see HASH_PARTITIONED), once."""
    tables = [(str(schema), str(name)) for schema, name in conn.execute(TABLES).fetchall()]
    if conn.info.server_version < 100000:  # no partitioning before PostgreSQL 10
        return tables
    partitioned = conn.execute(HASH_PARTITIONED).fetchall()
    instead = {(leaf_schema, leaf): (schema, name) for leaf_schema, leaf, schema, name in partitioned}
    return sorted({instead.get(table, table) for table in tables})


def fingerprints(
    conn: Connection,
    done: Callable[[int, int], None],
    wanted: Callable[[str], bool] = lambda _: True,
    large_objects: bool = True,
    row_hash: RowHash = MD5,
) -> dict[str, tuple[int, str]]:
    """Row count and checksum of each `wanted` user table, by `schema.table`, with `row_hash` (both sides of a
    comparison must use the same, see `agreed`); calls `done` with the tables and rows read so far."""
    tables = read_tables(conn)
    types: dict[tuple[str, str], list[tuple[str, int]]] = {}
    if row_hash.by_column:
        for schema, name, column, type_oid in conn.execute(COLUMN_TYPES).fetchall():
            types.setdefault((schema, name), []).append((column, int(type_oid)))
    result: dict[str, tuple[int, str]] = {}
    counted = 0
    named = "" if row_hash == MD5 else f"{row_hash.name}:"  # md5's checksums read as they always did
    for schema, name in tables:
        if not wanted(f"{schema}.{name}"):
            continue
        template = sql.SQL(row_hash.sql)
        hashed = template.format(columns=columns(types.get((schema, name), []))) if row_hash.by_column else template
        query = sql.SQL(CHECKSUM).format(hash=hashed, table=sql.Identifier(schema, name))
        row = conn.execute(query).fetchone()
        assert row is not None
        rows, total = row
        checksum = hashlib.sha256(f"{named}{rows}:{total}".encode()).hexdigest()[:32]
        result[f"{schema}.{name}"] = (int(rows), checksum)
        counted += int(rows)
        done(len(result), counted)
    if not large_objects:
        return result
    row = conn.execute(LARGE_OBJECT_CHECKSUM, {"piece": LARGE_OBJECT_PIECE}).fetchone()
    assert row is not None
    if row[0]:
        result[LARGE_OBJECTS] = (int(row[0]), hashlib.sha256(f"{row[0]}:{row[1]}".encode()).hexdigest()[:32])
    return result


def compare(
    source: dict[str, tuple[int, str]], target: dict[str, tuple[int, str]], ahead: frozenset[str] = frozenset()
) -> list[TableCheck]:
    """One check per table of either side, by name; those in `ahead` were compared before the freeze."""
    absent = (0, MISSING)
    return [
        TableCheck(
            table=table,
            source_rows=source.get(table, absent)[0],
            target_rows=target.get(table, absent)[0],
            source_checksum=source.get(table, absent)[1],
            target_checksum=target.get(table, absent)[1],
            ahead=table in ahead,
        )
        for table in sorted(source.keys() | target.keys())
    ]


def differences(checks: list[TableCheck], shown: int = 10) -> str | None:
    """Which tables differ and how, in words; None when none does."""
    different = [check for check in checks if not check.equal]
    if not different:
        return None
    described = "; ".join(_difference(check) for check in different[:shown])
    more = f"; and {len(different) - shown} more" if len(different) > shown else ""
    return f"source and target differ in {len(different)} of {len(checks)} tables: {described}{more}"


def _difference(check: TableCheck) -> str:
    if check.table == LARGE_OBJECTS and check.source_rows != check.target_rows:
        return f"{check.table} ({check.source_rows} in the source, {check.target_rows} in the target)"
    if check.table == LARGE_OBJECTS:
        return f"{check.table} (same {check.source_rows}, different contents)"
    if MISSING in (check.source_checksum, check.target_checksum):
        side = "target" if check.target_checksum == MISSING else "source"
        return f"{check.table} (missing in the {side})"
    if check.source_rows != check.target_rows:
        return f"{check.table} ({check.source_rows} rows in the source, {check.target_rows} in the target)"
    return f"{check.table} (same {check.source_rows} rows, different contents)"
