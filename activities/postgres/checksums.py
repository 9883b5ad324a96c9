"""Fingerprints of every user table that do not depend on row order: a row count and a content checksum.

Each row is hashed as its text form (`row::text`) into 64 bits, and the hashes are
summed into a numeric. A sum does not depend on the order rows come in (a restored
table's physical order may differ), and it counts duplicate rows, which an XOR would
cancel in pairs. A changed row goes unnoticed only if its 64-bit hash stays the same: a
chance of 2^-64. A row's text form depends on session settings (dates, time zone,
floats, bytea, intervals, money), so both sides read with the same fixed ones.

Which hash (`agreed`): PostgreSQL's own hashtextextended of the text's bytes when both
servers compute it alike, md5's first 64 bits otherwise. hashtextextended costs about
half of what md5 does (on 1 GB here, reading the text forms took 5.7 s, summing their
hashtextextended 5.3 s, their md5 11.1 s), and verify reads every row of both sides
while writes are stopped. The function is stable across major versions (hash
partitions, which pg_upgrade keeps, depend on it), but not across byte orders, and a
server older than 11 has none: so both sides hash the same probe strings first, and md5
(the same everywhere) is used unless their answers are equal. The text is hashed in
collation "C", byte for byte, whatever the database's collation. The functions of the
checksums and of the probe are named with their schema, pg_catalog, so that no function
of the same name on a database's search_path stands in for them.

The tables are the ordinary tables (relkind r, so partitioned tables are checked
through their partitions) and the populated materialized views, in every schema but
pg_* and information_schema, except those belonging to an extension. Large objects
are one more entry, `large objects`, when a side has any: their count, and the sum of
a hash of each one's oid and contents (pg_dump keeps their oids).
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
}
"""Session settings of both sides' connections, so equal rows have equal text."""

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


MD5 = RowHash("md5", "('x' || pg_catalog.left(pg_catalog.md5(t::text), 16))::bit(64)::bigint")
"""The same on every server and platform; the fallback."""
HASHTEXT = RowHash("hashtextextended", 'pg_catalog.hashtextextended(t::text collate "C", 0)')
"""About twice as fast; used when both servers agree on it (see `agreed`)."""

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

LARGE_OBJECT_CHECKSUM = """
select pg_catalog.count(*), coalesce(pg_catalog.sum(('x' || pg_catalog.left(
    pg_catalog.md5(m.oid::text || ':' || pg_catalog.md5(pg_catalog.lo_get(m.oid))), 16))::bit(64)::bigint), 0)
from pg_catalog.pg_largeobject_metadata m
"""


def estimated_rows(conn: Connection) -> int | None:
    """The rows of the tables `fingerprints` reads, as the statistics estimate them; None when some table has none
    (never analyzed), since a sum without it would promise an end too soon."""
    row = conn.execute(ESTIMATE).fetchone()
    if row is None or row[1]:
        return None
    return int(row[0])


def agreed(source: Connection, target: Connection) -> RowHash:
    """The row hash to read both sides with: HASHTEXT when both servers hash the probe strings alike, else MD5."""
    probes = [_probe(conn) for conn in (source, target)]
    return HASHTEXT if probes[0] is not None and probes[0] == probes[1] else MD5


def _probe(conn: Connection) -> list[int] | None:
    try:
        row = conn.execute(PROBE).fetchone()
    except psycopg.errors.UndefinedFunction:  # a server older than 11
        return None
    return None if row is None else list(row[0])


def fingerprints(
    conn: Connection,
    done: Callable[[int, int], None],
    wanted: Callable[[str], bool] = lambda _: True,
    large_objects: bool = True,
    row_hash: RowHash = MD5,
) -> dict[str, tuple[int, str]]:
    """Row count and checksum of each `wanted` user table, by `schema.table`, with `row_hash` (both sides of a
    comparison must use the same, see `agreed`); calls `done` with the tables and rows read so far."""
    tables = conn.execute(TABLES).fetchall()
    result: dict[str, tuple[int, str]] = {}
    counted = 0
    named = "" if row_hash == MD5 else f"{row_hash.name}:"  # md5's checksums read as they always did
    for schema, name in tables:
        if not wanted(f"{schema}.{name}"):
            continue
        query = sql.SQL(CHECKSUM).format(hash=sql.SQL(row_hash.sql), table=sql.Identifier(schema, name))
        row = conn.execute(query).fetchone()
        assert row is not None
        rows, total = row
        checksum = hashlib.sha256(f"{named}{rows}:{total}".encode()).hexdigest()[:32]
        result[f"{schema}.{name}"] = (int(rows), checksum)
        counted += int(rows)
        done(len(result), counted)
    if not large_objects:
        return result
    row = conn.execute(LARGE_OBJECT_CHECKSUM).fetchone()
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
