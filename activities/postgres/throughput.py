"""Rates measured with small real transfers, so that a plan can say how long the frozen part will take.

The precheck asks for them when it writes a plan. Each transfer is small (SAMPLE_ROWS
rows of the source's largest table, topped up with generated rows to at least
ENOUGH_BYTES, at most SAMPLE_BYTES) and leaves nothing behind:
the source is only read, the target receives the sample into a table created in a
transaction that is rolled back (so the rate includes writing the WAL, as a restore does,
and nothing is committed), and the bucket receives an object deleted at once. Rates of a
small sample are rough: the plan says so.
"""

from __future__ import annotations

import time

from psycopg import sql

from activities.postgres.connection import Connection

SAMPLE_ROWS = 50_000
SAMPLE_BYTES = 8 * 2**20
"""At most this much is copied out of the source, then into the target and the bucket."""
ENOUGH_BYTES = 2**20
"""Below this, a transfer's round trips outweigh its bytes: a small table's sample is topped up with generated rows."""
MINIMUM_SECONDS = 0.001
LARGEST_TABLE = """
select n.nspname, c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.relkind in ('r', 'p', 'm') and n.nspname not in ('pg_catalog', 'information_schema')
    and n.nspname not like 'pg\\_%'
order by pg_total_relation_size(c.oid) desc limit 1
"""
GENERATED = "copy (select n, repeat(md5(n::text), 8) from generate_series(1, 6000) as n) to stdout"
"""Rows the server generates (about 1.5 MB), to top up the sample of a small (or missing) table. Wide rows: COPY
sends one message per row, and the worker reads each in Python; 40,000 narrow rows cost it 45 ms of CPU per precheck
(fifty at once felt it) and measured that loop more than the server, where 6,000 wide ones cost 8 ms."""
PROBE_TABLE = "ferry_precheck_probe"


def rate(size: int, seconds: float) -> float:
    return size / max(seconds, MINIMUM_SECONDS)


def read_sample(conn: Connection) -> tuple[bytes, float]:
    """Rows of the source's largest table in COPY's text format, topped up with rows the server generates when the
    table is small, and the bytes per second they came at."""
    queries: list[sql.SQL | sql.Composed] = []
    found = conn.execute(LARGEST_TABLE).fetchone()
    if found is not None:
        queries.append(
            sql.SQL("copy (select * from {} limit {}) to stdout").format(
                sql.Identifier(found[0], found[1]), sql.Literal(SAMPLE_ROWS)
            )
        )
    queries.append(sql.SQL(GENERATED))
    sample = bytearray()
    started = time.monotonic()
    for query in queries:
        if len(sample) >= ENOUGH_BYTES:
            break
        with conn.cursor().copy(query) as copy:
            for chunk in copy:
                if len(sample) < SAMPLE_BYTES:
                    sample += chunk
    return bytes(sample[:SAMPLE_BYTES]), rate(len(sample), time.monotonic() - started)


def write_rate(conn: Connection, sample: bytes) -> float:
    """Bytes per second of writing `sample` into the target, in a transaction that is rolled back."""
    if not sample:
        return 0.0
    lines = sample[: sample.rfind(b"\n") + 1] or sample + b"\n"
    started = time.monotonic()
    with conn.transaction(force_rollback=True):
        conn.execute("set transaction read write")
        conn.execute(sql.SQL("create table {} (line text)").format(sql.Identifier(PROBE_TABLE)))
        # One column per line: \x01 never occurs in COPY's text output, so no line is split.
        query = sql.SQL("copy {} from stdin with (format text, delimiter E'\\x01')").format(sql.Identifier(PROBE_TABLE))
        with conn.cursor().copy(query) as copy:
            copy.write(lines)
    return rate(len(lines), time.monotonic() - started)
