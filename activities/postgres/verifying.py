"""What verify reads of each side, and how the two sides' readings are compared.

Rows alone do not make a database: verify compares the tables' rows (and populated
materialized views and large objects) by checksum (see checksums), and besides them
the schema object by object and each sequence's value (see schema). Any difference
fails the step, naming the objects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from activities.postgres import checksums, schema
from activities.postgres.connection import Connection
from ferry.api.saga import TableCheck


@dataclasses.dataclass(frozen=True)
class Side:
    """One database as verify sees it."""

    tables: dict[str, tuple[int, str]]
    """Row count and checksum by table (see checksums)."""
    objects: dict[str, str]
    """Normalized description by schema object, and each sequence's value (see schema)."""


@dataclasses.dataclass(frozen=True)
class Comparison:
    checks: list[TableCheck]
    objects: int
    """How many schema objects and sequences were compared."""
    difference: str | None
    """What differs, in words; None when nothing does."""


def read(conn: Connection, done: Callable[[int], None]) -> Side:
    """Reads a side: the schema first (quick), then every table's checksum, calling `done` with the tables read."""
    objects = schema.describe(conn) | schema.sequence_values(conn)
    return Side(tables=checksums.fingerprints(conn, done), objects=objects)


def compare(source: Side, target: Side) -> Comparison:
    checks = checksums.compare(source.tables, target.tables)
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
