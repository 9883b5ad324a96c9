"""Fingerprints of every user table that do not depend on row order: a row count and a content checksum.

Each row is hashed as its text form (md5 of `row::text`), and the first 64 bits of the
hashes are summed into a numeric. A sum does not depend on the order rows come in (a
restored table's physical order may differ), and it counts duplicate rows, which an
XOR would cancel in pairs. A changed row goes unnoticed only if its hash's first 64
bits stay the same: a chance of 2^-64 (summing the other half too would cost a third
more time for nothing a migration needs). md5 rather than PostgreSQL's internal hash
functions, whose results may differ between platforms. A row's text form depends on
session settings (dates, time zone, floats, bytea, intervals, money), so both sides
read with the same fixed ones.

The tables are the ordinary tables (relkind r, so partitioned tables are checked
through their partitions) and the populated materialized views, in every schema but
pg_* and information_schema, except those belonging to an extension. Large objects
are one more entry, `large objects`, when a side has any: their count, and the sum of
a hash of each one's oid and contents (pg_dump keeps their oids).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

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
select count(*), coalesce(sum(('x' || left(md5(t::text), 16))::bit(64)::bigint), 0) from {table} as t
"""

LARGE_OBJECT_CHECKSUM = """
select count(*), coalesce(sum(('x' || left(md5(m.oid::text || ':' || md5(lo_get(m.oid))), 16))::bit(64)::bigint), 0)
from pg_largeobject_metadata m
"""


def estimated_rows(conn: Connection) -> int | None:
    """The rows of the tables `fingerprints` reads, as the statistics estimate them; None when some table has none
    (never analyzed), since a sum without it would promise an end too soon."""
    row = conn.execute(ESTIMATE).fetchone()
    if row is None or row[1]:
        return None
    return int(row[0])


def fingerprints(
    conn: Connection,
    done: Callable[[int, int], None],
    wanted: Callable[[str], bool] = lambda _: True,
    large_objects: bool = True,
) -> dict[str, tuple[int, str]]:
    """Row count and checksum of each `wanted` user table, by `schema.table`; calls `done` with the tables and rows
    read so far."""
    tables = conn.execute(TABLES).fetchall()
    result: dict[str, tuple[int, str]] = {}
    counted = 0
    for schema, name in tables:
        if not wanted(f"{schema}.{name}"):
            continue
        query = sql.SQL(CHECKSUM).format(table=sql.Identifier(schema, name))
        row = conn.execute(query).fetchone()
        assert row is not None
        rows, total = row
        checksum = hashlib.sha256(f"{rows}:{total}".encode()).hexdigest()[:32]
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
