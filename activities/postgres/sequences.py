"""Sequence values, from the frozen source onto the target: logical replication does not carry them.

A sequence's rows never go through the replication stream (nextval writes no row a
publication sees), so after the initial copy every sequence of the target is where the
schema left it. catch-up, once the source is frozen, sets each target sequence to the
source's last value and is_called, exactly (setval), so the next value handed out on the
target follows the last one handed out on the source; verify then compares them.
"""

from __future__ import annotations

from psycopg import sql
from temporalio import activity

from activities.postgres.connection import Connection
from activities.postgres.schema import NOT_EXTENSION_MEMBER, USER

SEQUENCES = f"""
select n.nspname, c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.relkind = 'S' and c.relpersistence <> 't' and {USER}
and {NOT_EXTENSION_MEMBER.format(catalog="'pg_class'", oid="c.oid")}
order by 1, 2
"""


def copy(source: Connection, target: Connection) -> int:
    """Sets every sequence of the target that the source has to the source's state; returns how many."""
    copied = 0
    missing = []
    for schema, name in source.execute(SEQUENCES).fetchall():
        row = source.execute(
            sql.SQL("select last_value, is_called from {}").format(sql.Identifier(schema, name))
        ).fetchone()
        assert row is not None
        last_value, is_called = row
        qualified = sql.Identifier(schema, name).as_string(target)
        if target.execute("select to_regclass(%s)", (qualified,)).fetchone() in (None, (None,)):
            missing.append(qualified)
            continue
        target.execute("select setval(%s::regclass, %s, %s)", (qualified, last_value, is_called))
        copied += 1
    if missing:
        activity.logger.warning("these sequences of the source are not in the target (verify names them): %s", missing)
    return copied
