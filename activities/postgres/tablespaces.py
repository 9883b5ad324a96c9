"""Tablespaces: where the source keeps tables and indexes apart, which the target's server need not have.

A tablespace is a folder on the server's host, made by a superuser (CREATE TABLESPACE
... LOCATION). pg_dump records the tablespace of every table and index outside the
database's default one, and a pg_restore that kept it would stop at the first one the
target's server lacks, in the snapshot's single transaction, after the freeze. So every
restore of ferry leaves them out (pg_restore --no-tablespaces, see restoring, streams
and schema_copy), and everything lands in the target database's default tablespace;
the precheck says which relations that moves, and from which tablespaces, so that
whoever wants them apart on the target can make the tablespaces there and move them.
"""

from __future__ import annotations

from activities.postgres import schema
from activities.postgres.connection import Connection
from activities.secrets import DatabaseConnection

RESTORE_OPTION = "--no-tablespaces"
"""pg_restore's option that leaves every tablespace out, for all of ferry's restores."""
SHOWN = 5
"""Relations named per tablespace."""
PLACED = f"""
select t.spcname, n.nspname || '.' || c.relname
from pg_class c join pg_namespace n on n.oid = c.relnamespace join pg_tablespace t on t.oid = c.reltablespace
where c.relkind in ('r', 'p', 'm', 'i', 'I') and {schema.USER}
and {schema.NOT_EXTENSION_MEMBER.format(catalog="'pg_class'", oid="c.oid")}
order by 1, 2
"""
"""User tables, materialized views and indexes in a tablespace other than their database's default (reltablespace 0
is that default, whatever it is)."""


def placed(conn: Connection) -> dict[str, tuple[str, ...]]:
    """The relations the restore moves into the target database's default tablespace, per tablespace."""
    found: dict[str, list[str]] = {}
    for tablespace, relation in conn.execute(PLACED).fetchall():
        found.setdefault(str(tablespace), []).append(str(relation))
    return {tablespace: tuple(relations) for tablespace, relations in found.items()}


def warning(source: DatabaseConnection, target: DatabaseConnection, found: dict[str, tuple[str, ...]]) -> str | None:
    if not found:
        return None
    listed = "; ".join(f"{tablespace} ({_listed(relations)})" for tablespace, relations in found.items())
    return (
        f"{source.describe()} keeps relations in tablespaces of their own: {listed}. A restore that named them would "
        "stop, after the freeze, at the first one the target's server lacks, so ferry's restore leaves tablespaces "
        f"out (pg_restore {RESTORE_OPTION}): on the target, database {target.database!r}, they land in its default "
        "tablespace with everything else. To keep them apart there, create the tablespaces on the target's server "
        "(CREATE TABLESPACE ... LOCATION, on a volume of the target's Pods) and move them once the migration is done "
        "(ALTER TABLE / ALTER INDEX ... SET TABLESPACE, which rewrites each under an exclusive lock)."
    )


def _listed(names: tuple[str, ...]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more
