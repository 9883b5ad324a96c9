"""verify compares more than rows: sequences, materialized views, large objects and the schema as a whole.

Each test builds the same database on both sides, changes one kind of object on one
side, and expects verify to fail naming that object. The last ones show that a
database with every kind migrates and verifies equal.
"""

from __future__ import annotations

import pytest

from activities.postgres import schema, verifying
from ferry.api.errors import VerificationMismatch
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import connect, create_shop

BOTH = """
create schema shop;
create table shop.orders (id bigserial primary key, customer int not null, total numeric(12, 2) default 0,
    note text, check (total >= 0));
create index orders_by_customer on shop.orders (customer);
insert into shop.orders (customer, total) select i % 7, i from generate_series(1, 100) as i;
create materialized view shop.totals as select customer, sum(total) as total from shop.orders group by customer;
create function shop.total_of(c int) returns numeric language sql stable
    as $$ select sum(total) from shop.orders where customer = c $$;
select lo_from_bytea(424242, 'a large object'), lo_from_bytea(424243, 'another one');
"""


def _both(databases: Databases, *statements: str) -> None:
    for endpoint in (databases.source, databases.target):
        with connect(endpoint) as conn:
            for statement in (BOTH, *statements):
                conn.execute(statement)


def _on_target(databases: Databases, *statements: str) -> None:
    with connect(databases.target) as conn:
        for statement in statements:
            conn.execute(statement)


def _mismatch(steps: Steps) -> str:
    with pytest.raises(VerificationMismatch) as raised:
        steps.verify()
    return str(raised.value)


def test_the_same_database_on_both_sides_verifies_equal_with_every_kind_compared(
    steps: Steps, databases: Databases
) -> None:
    _both(databases)

    result = steps.verify()

    assert [(check.table, check.source_rows, check.equal) for check in result.tables] == [
        ("large objects", 2, True),
        ("shop.orders", 100, True),
        ("shop.totals", 7, True),
    ]
    assert result.objects > 10


def test_verify_sees_a_sequence_that_is_behind(steps: Steps, databases: Databases) -> None:
    _both(databases)
    _on_target(databases, "select setval('shop.orders_id_seq', 50)")

    message = _mismatch(steps)

    assert (
        "The schemas differ in 1 object: value of sequence shop.orders_id_seq ('100' in the source, '50' in" in message
    )


def test_verify_sees_a_sequence_set_to_hand_out_another_value_next(steps: Steps, databases: Databases) -> None:
    """Set with setval(..., false) on the source, untouched on the target: neither has handed out a value since,
    and the target would hand out keys from 1 again."""
    _both(databases, "create sequence shop.invoice_seq")
    with connect(databases.source) as conn:
        conn.execute("select setval('shop.invoice_seq', 500, false)")

    message = _mismatch(steps)

    assert (
        "value of sequence shop.invoice_seq ('next value 500' in the source, 'not used yet' in the target)" in message
    )


def test_verify_sees_a_materialized_view_defined_differently(steps: Steps, databases: Databases) -> None:
    _both(databases)
    _on_target(
        databases,
        "drop materialized view shop.totals",
        "create materialized view shop.totals as select customer, sum(total) as total from shop.orders "
        "where total > 0 group by customer",
    )

    assert "relation shop.totals ('materialized view, populated: SELECT" in _mismatch(steps)


def test_verify_sees_a_materialized_view_with_other_contents(steps: Steps, databases: Databases) -> None:
    _both(databases)
    _on_target(
        databases,
        "insert into shop.orders (id, customer, total) values (1000, 1, 5)",
        "refresh materialized view shop.totals",
        "delete from shop.orders where id = 1000",  # the table is the same again; the view is not
    )

    message = _mismatch(steps)

    assert message.startswith(
        "source and target differ in 1 of 3 tables: shop.totals (same 7 rows, different contents)"
    )


def test_verify_sees_a_materialized_view_left_unpopulated(steps: Steps, databases: Databases) -> None:
    _both(databases)
    _on_target(databases, "refresh materialized view shop.totals with no data")

    message = _mismatch(steps)

    assert "shop.totals (missing in the target)" in message
    assert "'materialized view, not populated: SELECT" in message


def test_a_view_that_postgresql_15_and_18_print_differently_verifies_equal(steps: Steps, databases: Databases) -> None:
    view = "create view shop.big as select id, total from shop.orders where total > 50"
    _both(databases, view)
    with connect(databases.source) as source, connect(databases.target) as target:
        printed = (schema.view_queries(source), schema.view_queries(target))

    result = steps.verify()

    # 15 qualifies the columns of a query over one relation, 18 does not: the same view, in other words.
    assert (
        printed[0]["relation shop.big"]
        == "SELECT orders.id, orders.total FROM shop.orders WHERE (orders.total > (50)::numeric);"
    )
    assert printed[1]["relation shop.big"] == "SELECT id, total FROM shop.orders WHERE (total > (50)::numeric);"
    assert all(check.equal for check in result.tables)


def test_verify_sees_a_view_that_means_something_else_in_the_targets_words(steps: Steps, databases: Databases) -> None:
    _both(databases)
    with connect(databases.source) as conn:
        conn.execute("create view shop.big as select id, total from shop.orders where total > 50")
    _on_target(databases, "create view shop.big as select id, total from shop.orders where total > 60")

    message = _mismatch(steps)

    assert (
        "The schemas differ in 1 object: relation shop.big ('view: SELECT id, total FROM shop.orders WHERE (total > "
        "(50)::numeric);' in the source, 'view: SELECT id, total FROM shop.orders WHERE (total > (60)::numeric);' in "
        "the target)"
    ) in message


def test_the_target_reprints_queries_it_can_parse_leaves_out_the_others_and_keeps_nothing(databases: Databases) -> None:
    _both(databases)
    queries = {
        "relation shop.big": "SELECT orders.id FROM shop.orders WHERE (orders.total > (50)::numeric);",
        "relation shop.lost": "SELECT nowhere.id FROM shop.nowhere;",
    }

    with connect(databases.target) as conn:
        reprinted = schema.reprinted(conn, queries)
        left = conn.execute("select count(*) from pg_class where relname like 'ferry_reprinted%'").fetchone()

    assert reprinted == {"relation shop.big": "SELECT id FROM shop.orders WHERE (total > (50)::numeric);"}
    assert left == (0,)


def test_verify_sees_a_missing_large_object(steps: Steps, databases: Databases) -> None:
    _both(databases)
    _on_target(databases, "select lo_unlink(424243)")

    assert "large objects (2 in the source, 1 in the target)" in _mismatch(steps)


def test_verify_sees_a_large_object_with_other_contents(steps: Steps, databases: Databases) -> None:
    _both(databases)
    _on_target(databases, "select lo_put(424242, 0, 'A')")

    assert "large objects (same 2, different contents)" in _mismatch(steps)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        pytest.param(
            "alter table shop.orders alter column note type varchar(20)", "column shop.orders.note (", id="type"
        ),
        pytest.param(
            "alter table shop.orders alter column customer drop not null", "column shop.orders.customer (", id="null"
        ),
        pytest.param(
            "alter table shop.orders alter column total set default 1", "column shop.orders.total (", id="default"
        ),
    ],
)
def test_verify_sees_a_column_defined_differently(steps: Steps, databases: Databases, change: str, named: str) -> None:
    _both(databases)
    _on_target(databases, change)

    assert f"The schemas differ in 1 object: {named}" in _mismatch(steps)


def test_verify_sees_a_missing_constraint(steps: Steps, databases: Databases) -> None:
    _both(databases)
    _on_target(databases, "alter table shop.orders drop constraint orders_total_check")

    message = _mismatch(steps)

    assert "constraint shop.orders.orders_total_check (missing in the target)" in message


def test_verify_sees_a_missing_index(steps: Steps, databases: Databases) -> None:
    _both(databases)
    _on_target(databases, "drop index shop.orders_by_customer")

    assert "The schemas differ in 1 object: index shop.orders_by_customer (missing in the target)" in _mismatch(steps)


def test_verify_sees_a_function_that_does_something_else(steps: Steps, databases: Databases) -> None:
    _both(databases)
    _on_target(
        databases,
        "create or replace function shop.total_of(c int) returns numeric language sql stable "
        "as $$ select max(total) from shop.orders where customer = c $$",
    )

    message = _mismatch(steps)

    assert "The schemas differ in 1 object: function shop.total_of(c integer) ('function returns numeric" in message


def test_verify_sees_a_missing_extension(steps: Steps, databases: Databases) -> None:
    _both(databases)
    with connect(databases.source) as conn:
        conn.execute("create extension hstore")

    assert "extension hstore (missing in the target)" in _mismatch(steps)


def test_a_shop_with_a_materialized_view_large_objects_and_an_extension_migrates_and_verifies_equal(
    steps: Steps, databases: Databases
) -> None:
    create_shop(databases.source, customers=200, orders=2_000)
    with connect(databases.source) as conn:
        conn.execute("create extension hstore")
        conn.execute("create table shop.tags (order_id bigint primary key references shop.orders, tags hstore)")
        conn.execute("insert into shop.tags select id, hstore('k', id::text) from shop.orders where id % 3 = 0")
        conn.execute(
            "create materialized view shop.daily as select placed_at::date, count(*) from shop.orders group by 1"
        )
        conn.execute("select lo_from_bytea(0, decode(md5(i::text), 'hex')) from generate_series(1, 20) as i")
        conn.execute("select nextval('audit.ticket_seq')")  # a sequence ahead of its table

    steps.freeze()
    steps.migrate(steps.snapshot())
    result = steps.verify()

    assert [check.table for check in result.tables] == [
        "audit.log",
        "large objects",
        "shop.customers",
        "shop.daily",
        "shop.orders",
        "shop.tags",
    ]
    assert all(check.equal for check in result.tables)


BEHAVING = """
create table shop.archive (id bigint primary key, deleted_at timestamptz);
create rule no_delete as on delete to shop.archive
    do instead update shop.archive set deleted_at = now() where id = old.id;
alter table shop.orders enable row level security;
alter table shop.orders force row level security;
create policy by_customer on shop.orders for select to public
    using (customer = current_setting('app.customer', true)::int);
create policy no_refunds on shop.orders as restrictive for update to public with check (total >= 0);
create function shop.stamp() returns trigger language plpgsql as $$ begin return new; end $$;
create trigger stamped before update on shop.orders for each row execute function shop.stamp();
alter table shop.orders disable trigger stamped;
alter table shop.orders set (fillfactor = 80);
create view shop.big_orders with (security_barrier) as select id, total from shop.orders where total > 50;
alter function shop.total_of(int) set search_path = shop, pg_temp;
alter function shop.total_of(int) parallel safe;
"""
"""What makes the objects behave otherwise without changing their definitions: a rule that turns deletes into updates,
row-level security and its policies, a disabled trigger, storage and view options, a function's settings."""


def test_rules_policies_trigger_states_options_and_function_settings_printed_by_15_and_18_verify_equal(
    steps: Steps, databases: Databases
) -> None:
    _both(databases, BEHAVING)

    steps.verify()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        pytest.param("drop rule no_delete on shop.archive", "rule shop.archive.no_delete (missing", id="rule"),
        pytest.param("drop policy by_customer on shop.orders", "policy shop.orders.by_customer (missing", id="policy"),
        pytest.param(
            "alter policy no_refunds on shop.orders with check (total > 0)",
            "policy shop.orders.no_refunds ('restrictive for update to public with check ((total >= (0)",
            id="policy-check",
        ),
        pytest.param(
            "alter table shop.orders no force row level security",
            "row security shop.orders ('enabled, forced on the owner too' in the source, 'enabled' in the target)",
            id="row-security",
        ),
        pytest.param(
            "alter table shop.orders enable trigger stamped",
            "trigger state shop.orders.stamped (missing in the target)",
            id="trigger-enabled",
        ),
        pytest.param("alter table shop.orders reset (fillfactor)", "options shop.orders (missing", id="table-options"),
        pytest.param(
            "alter view shop.big_orders reset (security_barrier)", "options shop.big_orders (missing", id="view-options"
        ),
        pytest.param(
            "alter function shop.total_of(int) reset search_path",
            "function settings shop.total_of(c integer) ('parallel safe, set search_path=shop, pg_temp' in the "
            "source, 'parallel safe' in the target)",
            id="function-settings",
        ),
    ],
)
def test_verify_sees_what_changes_how_an_object_behaves(
    steps: Steps, databases: Databases, change: str, named: str
) -> None:
    """In mode Online the schema is copied when replicate starts, and no DDL is replicated: one made on the source
    while the target catches up (or awaits approval) is on the target only if verify sees it missing."""
    _both(databases, BEHAVING)
    _on_target(databases, change)

    assert f"The schemas differ in 1 object: {named}" in _mismatch(steps)


def test_what_changes_how_objects_behave_is_restored_and_verifies_equal(steps: Steps, databases: Databases) -> None:
    with connect(databases.source) as conn:
        conn.execute(BOTH)
        conn.execute(BEHAVING)

    steps.freeze()
    steps.migrate(steps.snapshot())

    steps.verify()


def test_verify_names_every_table_it_compared_up_to_a_bound_and_counts_them_all(
    steps: Steps, databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    _both(databases, "create table shop.a (id int primary key)", "create table shop.b (id int primary key)")
    monkeypatch.setattr(verifying, "LISTED", 2)

    result = steps.verify()

    assert len(result.tables) == 2
    assert result.tables_compared == 5, "shop.orders, shop.totals, shop.a, shop.b and the large objects"


def test_a_large_object_over_a_gigabyte_verifies_equal_and_a_change_in_its_last_piece_is_seen(
    steps: Steps, databases: Databases
) -> None:
    """lo_get of a whole object over 1 GB fails (PostgreSQL allocates the whole result): verify failed for every
    Migration with one. The object here is sparse, a byte written past 1.1 GB, so it costs no disk."""
    _both(databases, "select lo_from_bytea(7, 'head'), lo_put(7, 1100000000, 'tail')")

    result = steps.verify()

    assert ("large objects", 3, True) in [(c.table, c.source_rows, c.equal) for c in result.tables]
    _on_target(databases, "select lo_put(7, 1100000000, 'TAIL')")
    assert "large objects" in _mismatch(steps)
