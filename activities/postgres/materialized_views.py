"""Materialized views, filled on the target once it has every row: logical replication does not carry them.

Mode Online copies the schema with pg_dump --schema-only, which creates each materialized
view WITH NO DATA and never refreshes it (a full dump refreshes them after the data); the
subscription replicates tables only. So catch-up, once the target has every change of
the frozen source, refreshes on the target each materialized view the source has
populated, and leaves the others unpopulated, as they are on the source; verify then
compares their rows and their populated flag like the rest.

A materialized view may read another, directly or through plain views, so they are
refreshed in dependency order: each after every materialized view its query reaches
(pg_depend of its rewrite rule, followed through views). Refreshing again gives the same
rows, so a retry of catch-up simply refreshes again.
"""

from __future__ import annotations

import graphlib
from collections.abc import Callable

import psycopg
from psycopg import sql

from activities.postgres.connection import Connection
from activities.postgres.schema import NOT_EXTENSION_MEMBER, USER

MATERIALIZED_VIEWS = f"""
select c.oid, n.nspname, c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.relkind = 'm' and {{populated}} and {USER} and {NOT_EXTENSION_MEMBER.format(catalog="'pg_class'", oid="c.oid")}
order by 2, 3
"""

READS = """
select distinct r.ev_class, d.refobjid, c.relkind
from pg_rewrite r
join pg_depend d on d.classid = 'pg_rewrite'::regclass and d.objid = r.oid and d.refclassid = 'pg_class'::regclass
join pg_class c on c.oid = d.refobjid
where d.refobjid <> r.ev_class and c.relkind in ('v', 'm')
"""
"""Which views and materialized views each view's or materialized view's query reads."""


def populated(conn: Connection) -> list[tuple[str, str]]:
    """The materialized views that hold rows, as (schema, name)."""
    return [(schema, name) for _, schema, name in conn.execute(MATERIALIZED_VIEWS.format(populated="c.relispopulated"))]


def refresh(conn: Connection, wanted: list[tuple[str, str]], refreshing: Callable[[str], None]) -> list[str]:
    """Refreshes the materialized views `wanted` of the target that it has, in dependency order; returns them.

    `refreshing` is called with each one's name before its refresh (a long one is one statement).
    Raises RuntimeError naming the view whose refresh failed, and why.
    """
    views = {(schema, name): oid for oid, schema, name in conn.execute(MATERIALIZED_VIEWS.format(populated="true"))}
    by_oid = {oid: key for key, oid in views.items()}
    reads: dict[int, set[int]] = {}
    kinds: dict[int, str] = {}
    for reader, read, kind in conn.execute(READS):
        reads.setdefault(reader, set()).add(read)
        kinds[read] = kind
    order = graphlib.TopologicalSorter({oid: _materialized_reached(oid, reads, kinds) for oid in by_oid})
    refreshed = []
    wanted_here = {key for key in wanted if key in views}
    for oid in order.static_order():
        key = by_oid[oid]
        if key not in wanted_here:
            continue
        qualified = sql.Identifier(*key).as_string(conn)
        refreshing(qualified)
        try:
            conn.execute(sql.SQL("refresh materialized view {}").format(sql.Identifier(*key)))
        except (psycopg.errors.QueryCanceled, psycopg.errors.InsufficientPrivilege):
            raise  # the caller says what was cancelled, or which privilege is missing
        except psycopg.Error as error:
            raise RuntimeError(
                f"could not refresh the materialized view {qualified} on the target: {str(error).strip()}. The "
                "source has it populated, and logical replication does not fill it. Fix what its query needs on "
                "the target (the target server's log names it), or roll back."
            ) from None
        refreshed.append(qualified)
    return refreshed


def _materialized_reached(start: int, reads: dict[int, set[int]], kinds: dict[int, str]) -> set[int]:
    """The materialized views the query of `start` reads, directly or through plain views."""
    reached: set[int] = set()
    seen = {start}
    todo = list(reads.get(start, ()))
    while todo:
        oid = todo.pop()
        if oid in seen:
            continue
        seen.add(oid)
        if kinds.get(oid) == "m":
            reached.add(oid)
        else:
            todo.extend(reads.get(oid, ()))
    return reached
