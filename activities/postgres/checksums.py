"""Fingerprints of every user table that do not depend on row order: a row count and a content checksum.

Each row is hashed as its text form (md5 of `row::text`) and the hashes are summed, as
two 64-bit halves, into numerics. A sum does not depend on the order rows come in
(a restored table's physical order may differ), it counts duplicate rows (an XOR would
cancel pairs), and the two halves keep all 128 bits of each row's hash. md5 rather
than PostgreSQL's internal hash functions, whose results may differ between
platforms. A row's text form depends on session settings (dates, time zone, floats,
bytea, intervals, money), so both sides read with the same fixed ones.

The tables are the ordinary tables (relkind r, so partitioned tables are checked
through their partitions) in every schema but pg_* and information_schema, except
those belonging to an extension.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from psycopg import sql

from activities.postgres.connection import Connection

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
where c.relkind = 'r' and n.nspname !~ '^pg_' and n.nspname <> 'information_schema'
and not exists (select from pg_depend d where d.classid = 'pg_class'::regclass and d.objid = c.oid and d.deptype = 'e')
order by 1, 2
"""

CHECKSUM = """
select count(*), coalesce(sum(('x' || substr(h, 1, 16))::bit(64)::bigint), 0),
       coalesce(sum(('x' || substr(h, 17, 16))::bit(64)::bigint), 0)
from (select md5(t::text) as h from {table} as t) as rows
"""


def fingerprints(conn: Connection, done: Callable[[int], None]) -> dict[str, tuple[int, str]]:
    """Row count and checksum of each user table, by `schema.table`; calls `done` with the count so far."""
    tables = conn.execute(TABLES).fetchall()
    result: dict[str, tuple[int, str]] = {}
    for schema, name in tables:
        query = sql.SQL(CHECKSUM).format(table=sql.Identifier(schema, name))
        row = conn.execute(query).fetchone()
        assert row is not None
        rows, high, low = row
        checksum = hashlib.sha256(f"{rows}:{high}:{low}".encode()).hexdigest()[:32]
        result[f"{schema}.{name}"] = (int(rows), checksum)
        done(len(result))
    return result
