"""verify compares every user table on both sides by row count and a checksum that ignores row order."""

from __future__ import annotations

import pytest

from activities.postgres import checksums
from ferry.api.errors import VerificationMismatch
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import connect

TABLES = """
create schema shop;
create table shop.orders (id int primary key, note text, body jsonb, blob bytea, at timestamptz, amount float8);
create table public.events (kind text, n int);
"""


def _fill(databases: Databases, *, reverse_on_target: bool = True) -> None:
    """The same rows on both sides; on the target inserted in the opposite order and moved around by updates."""
    rows = (
        "select i, 'note ' || i, jsonb_build_object('i', i, 'tags', jsonb_build_array(i % 3)), "
        "decode(md5(i::text), 'hex'), timestamptz '2024-01-01 00:00+00' + i * interval '1 hour', i / 3.0 "
        "from generate_series(1, 5000) as i"
    )
    with connect(databases.source) as conn:
        conn.execute(TABLES)
        conn.execute(f"insert into shop.orders {rows} order by 1")
        conn.execute("insert into public.events values ('a', 1), ('a', 1), ('b', 2)")
    with connect(databases.target, TimeZone="Asia/Kolkata", DateStyle="German") as conn:
        conn.execute(TABLES)
        conn.execute(f"insert into shop.orders {rows} order by 1 {'desc' if reverse_on_target else ''}")
        conn.execute("update shop.orders set note = note where id % 2 = 0")  # new row versions, elsewhere on disk
        conn.execute("insert into public.events values ('b', 2), ('a', 1), ('a', 1)")


def test_verify_finds_tables_equal_whatever_order_their_rows_are_in(steps: Steps, databases: Databases) -> None:
    _fill(databases)

    result = steps.verify()

    assert [(check.table, check.source_rows, check.target_rows, check.equal) for check in result.tables] == [
        ("public.events", 3, 3, True),
        ("shop.orders", 5000, 5000, True),
    ]
    assert result.tables[0].source_checksum != result.tables[1].source_checksum


def test_verify_names_each_table_that_differs_and_how(steps: Steps, databases: Databases) -> None:
    _fill(databases)
    with connect(databases.target) as conn:
        conn.execute("update shop.orders set body = jsonb_set(body, '{i}', '0') where id = 4711")
        conn.execute("delete from public.events where kind = 'a'")
        conn.execute("insert into public.events values ('b', 2), ('b', 2)")  # same count, other duplicates
        conn.execute("create table public.extra (id int)")
    with connect(databases.source) as conn:
        conn.execute("create table shop.returns (id int)")

    with pytest.raises(VerificationMismatch) as raised:
        steps.verify()

    assert str(raised.value).startswith(
        "source and target differ in 4 of 4 tables: public.events (same 3 rows, different contents); "
        "public.extra (missing in the source); shop.orders (same 5000 rows, different contents); "
        "shop.returns (missing in the target)."
    )


def test_verify_sees_a_missing_row(steps: Steps, databases: Databases) -> None:
    _fill(databases)
    with connect(databases.target) as conn:
        conn.execute("delete from shop.orders where id = 1")

    with pytest.raises(VerificationMismatch, match=r"shop\.orders \(5000 rows in the source, 4999 in the target\)"):
        steps.verify()


def test_postgresql_15_and_18_hash_rows_alike_so_verify_reads_them_with_hashtextextended(databases: Databases) -> None:
    with connect(databases.source) as source, connect(databases.target) as target:
        versions = [conn.info.server_version // 10000 for conn in (source, target)]

        assert checksums.agreed(source, target) == checksums.HASHTEXT
    assert versions == [15, 18]


def test_verify_with_hashtextextended_sees_a_number_written_with_one_more_digit(
    steps: Steps, databases: Databases
) -> None:
    for endpoint, amount in ((databases.source, "1.0"), (databases.target, "1.00")):
        with connect(endpoint) as conn:
            conn.execute("create table public.prices (id int, amount numeric)")
            conn.execute(f"insert into public.prices values (1, {amount}), (2, 2.5)")  # 1.0 = 1.00, but not the same

    with pytest.raises(VerificationMismatch, match=r"public\.prices \(same 2 rows, different contents\)"):
        steps.verify()
