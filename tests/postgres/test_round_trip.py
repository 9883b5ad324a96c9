"""A database with every kind of object goes through freeze, snapshot, migrate and verify, and arrives whole."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from devstack.stack.postgres import PostgresEndpoint
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import connect, contents, create_shop, database_settings, tablespace, tablespaces_of

CATALOG = {
    "schemas": "select nspname from pg_namespace where nspname !~ '^pg_' and nspname <> 'information_schema'",
    "indexes": "select schemaname, tablename, indexdef from pg_indexes where schemaname in ('shop', 'audit')",
    # PostgreSQL 18 also lists NOT NULL in pg_constraint (contype 'n'), 15 does not: nullability is
    # compared with the columns instead, where both majors report it.
    "constraints": "select conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid) from pg_constraint "
    "where connamespace in ('shop'::regnamespace, 'audit'::regnamespace) and contype <> 'n'",
    "sequences": "select schemaname, sequencename, last_value, increment_by from pg_sequences",
    "columns": "select table_schema, table_name, column_name, data_type, is_nullable, is_identity, column_default "
    "from information_schema.columns where table_schema in ('shop', 'audit')",
    "view": "select count(*), sum(total) from shop.big_orders",
    "function": "select shop.order_count(7)",
}


def _catalog(endpoint: PostgresEndpoint) -> dict[str, list[tuple[Any, ...]]]:
    with connect(endpoint) as conn:
        return {name: sorted(conn.execute(query).fetchall(), key=repr) for name, query in CATALOG.items()}


def test_a_shop_with_every_kind_of_object_migrates_whole_and_verifies_equal(steps: Steps, databases: Databases) -> None:
    create_shop(databases.source, customers=20_000, orders=300_000)

    frozen = steps.freeze()
    artifact = steps.snapshot()
    restored = steps.migrate(artifact)
    verified = steps.verify()
    steps.undo_freeze(frozen.previous_setting)

    assert [(check.table, check.target_rows, check.equal) for check in verified.tables] == [
        ("audit.log", 50_000, True),
        ("shop.customers", 20_000, True),
        ("shop.orders", 300_000, True),
    ]
    assert restored.tables == 3
    assert restored.bytes_restored == artifact.total_bytes
    source, target = _catalog(databases.source), _catalog(databases.target)
    assert target == source
    assert {row[2] for row in target["constraints"]} == {"p", "f", "u", "c"}
    assert ("shop", "customers", "email", "text", "NO", "NO", None) in target["columns"]
    assert ("audit", "ticket_seq", 1000 + 7 * (50_000 - 1), 7) in target["sequences"]
    assert database_settings(databases.source) == [], "the source is writable again, as before"


def test_the_migrated_target_enforces_the_sources_constraints_and_continues_its_sequences(
    steps: Steps, databases: Databases
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    steps.freeze()
    steps.migrate(steps.snapshot())

    with connect(databases.target) as conn:
        order = conn.execute(
            "insert into shop.orders (customer_id, total, items, placed_at) values (1, 5, '[]', now()) returning id"
        ).fetchone()
        customer = conn.execute(
            "insert into shop.customers (email, created_at) values ('new@example.com', now()) returning id"
        ).fetchone()
        ticket = conn.execute("insert into audit.log (order_id, note) values (1, 'new') returning id").fetchone()
        receipt = conn.execute("select receipt from shop.orders where id = 7").fetchone()
        profile = conn.execute("select profile -> 'tags' ->> 1 from shop.customers where id = 5").fetchone()
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("insert into shop.orders (customer_id, total, items, placed_at) values (1, -1, '[]', now())")
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("insert into shop.orders (customer_id, total, items, placed_at) values (999, 1, '[]', now())")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("insert into shop.customers (email, created_at) values ('customer1@example.com', now())")

    assert (order, customer, ticket) == ((1_001,), (101,), (1000 + 7 * 166,))
    assert receipt == (bytes.fromhex("8f14e45fceea167a5a36dedd4bea2543"),)  # md5('7')
    assert profile == ("b5",)


@pytest.mark.parametrize("while_dumping", [True, False], ids=["restored while dumping", "restored by migrate"])
def test_relations_in_a_tablespace_the_target_lacks_land_in_its_default_one_and_verify_equal(
    steps: Steps, databases: Databases, while_dumping: bool
) -> None:
    """A restore that kept the source's tablespaces would stop, in its one transaction after the freeze, at the first
    one the target's server lacks: ferry's leaves them out (the precheck says so)."""
    create_shop(databases.source, customers=100, orders=1_000)
    with tablespace(databases.source) as fast:
        with connect(databases.source) as conn:
            conn.execute(f"alter table shop.orders set tablespace {fast}")
            conn.execute(f"alter index shop.orders_by_customer set tablespace {fast}")
            conn.execute(f"alter index shop.customers_pkey set tablespace {fast}")  # a constraint's index
            conn.execute(
                f"create materialized view shop.totals tablespace {fast} as "
                "select customer_id, sum(total) from shop.orders group by 1"
            )
        source_tablespaces = tablespaces_of(databases.source)
        frozen = steps.freeze()

        migrated = steps.migrate(steps.snapshot(restore=while_dumping))
        verified = steps.verify()

        steps.undo_freeze(frozen.previous_setting)
    assert {name for name, where in source_tablespaces.items() if where == fast} == {
        "shop.orders", "shop.orders_by_customer", "shop.customers_pkey", "shop.totals"
    }  # fmt: skip
    assert migrated.during_snapshot is while_dumping
    assert all(check.equal for check in verified.tables)
    assert contents(databases.target) == contents(databases.source)
    assert tablespaces_of(databases.target) == {name: "pg_default" for name in source_tablespaces}
