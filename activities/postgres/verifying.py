"""What verify reads of each side, and how the two sides' readings are compared.

Rows alone do not make a database: verify compares the tables' rows (and populated
materialized views and large objects) by checksum (see checksums), and besides them
the schema object by object and each sequence's value (see schema). Any difference
fails the step, naming the objects. Source and target may run different major versions,
whose servers print a view's query differently: such queries are printed again by the
target's server before they are compared (see schema.reprinted).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from activities.postgres import checksums, schema
from activities.postgres.connection import Connection
from ferry.api.saga import TableAhead, TableCheck


@dataclasses.dataclass(frozen=True)
class Side:
    """One database as verify sees it."""

    tables: dict[str, tuple[int, str]]
    """Row count and checksum by table (see checksums)."""
    objects: dict[str, str]
    """Normalized description by schema object, and each sequence's value (see schema)."""
    queries: dict[str, str] = dataclasses.field(default_factory=dict)
    """The query of each view and materialized view, keyed and collapsed as in `objects`, which ends with it."""


@dataclasses.dataclass(frozen=True)
class Comparison:
    checks: list[TableCheck]
    objects: int
    """How many schema objects and sequences were compared."""
    difference: str | None
    """What differs, in words; None when nothing does."""


def read(
    conn: Connection,
    row_hash: checksums.RowHash,
    done: Callable[[int, int], None],
    compared: frozenset[str] = frozenset(),
) -> Side:
    """Reads a side: the schema first (quick), then the checksum of every table but those `compared` already, by
    `row_hash` (the other side's too), calling `done` with the tables and rows read."""
    objects = schema.describe(conn) | schema.describe(conn, schema.BEHAVIOUR) | schema.sequence_values(conn)
    queries = schema.view_queries(conn)
    tables = checksums.fingerprints(conn, done, lambda table: table not in compared, row_hash=row_hash)
    return Side(tables=tables, objects=objects, queries=queries)


def queries_to_reprint(source: Side, target: Side) -> dict[str, str]:
    """The source's view queries where the target has the same view but describes it otherwise (see schema)."""
    return {
        key: query
        for key, query in source.queries.items()
        if key in target.queries and source.objects.get(key) != target.objects.get(key)
    }


def with_reprinted(source: Side, reprinted: dict[str, str]) -> Side:
    """The source with each reprinted query in place of the one its own server printed, the rest of each view as read.

    What the target's server printed of the source's query is what the source's view
    means, in the words the target's own views are printed in (see schema).
    """
    objects, queries = dict(source.objects), dict(source.queries)
    for key, query in reprinted.items():
        described = objects.get(key, "")
        if key in queries and described.endswith(queries[key]):
            objects[key] = described.removesuffix(queries[key]) + query
            queries[key] = query
    return dataclasses.replace(source, objects=objects, queries=queries)


def compare(source: Side, target: Side, ahead: Mapping[str, TableAhead] | None = None) -> Comparison:
    """Both sides' readings compared; the tables of `ahead` count as the equal tables they were before the freeze."""
    ahead = ahead or {}
    before = {table.table: (table.rows, table.checksum) for table in ahead.values()}
    checks = checksums.compare(source.tables | before, target.tables | before, frozenset(ahead))
    in_tables = checksums.differences(checks)
    in_objects = schema.differences(source.objects, target.objects)
    sentences = [in_tables] if in_tables else []
    if in_objects:
        many = len(in_objects) > 1
        sentences.append(
            f"The schemas differ in {len(in_objects)} object{'s' if many else ''}: {schema.listed(in_objects)}"
        )
    return Comparison(
        checks=checks,
        objects=len(source.objects.keys() | target.objects.keys()),
        difference=". ".join(sentences) if sentences else None,
    )


LISTED = 500
"""How many equal tables verify's result lists at most: a result past Temporal's payload limit (2 MiB, some ten
thousand tables) fails the attempt, after every row was read, and every attempt after it."""


def listed(checks: list[TableCheck]) -> list[TableCheck]:
    """The checks verify's result carries: every one that differs, then equal ones up to LISTED, in their order."""
    different = [check for check in checks if not check.equal]
    return different + [check for check in checks if check.equal][:LISTED]
