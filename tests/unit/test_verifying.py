"""Which view queries verify has the target's server print again, and how they replace the source's own print.

Between PostgreSQL 15 and 16 or later, the same view's query reads differently; only those
queries are printed again, and only the query part of a view's description changes.
"""

from __future__ import annotations

from activities.postgres.verifying import LISTED, Side, compare, listed, queries_to_reprint, with_reprinted
from ferry.api.saga import TableCheck

QUALIFIED = "SELECT orders.id FROM shop.orders WHERE (orders.total > (50)::numeric);"
BARE = "SELECT id FROM shop.orders WHERE (total > (50)::numeric);"


def _side(**views: str) -> Side:
    """A side with one table, one index and the given views (name: query), described as schema.describe does."""
    objects = {"index shop.orders_pkey": "CREATE UNIQUE INDEX orders_pkey ON shop.orders USING btree (id)"}
    queries = {f"relation shop.{name}": query for name, query in views.items()}
    objects |= {key: f"view: {query}" for key, query in queries.items()}
    return Side(tables={"shop.orders": (3, "abc")}, objects=objects, queries=queries)


def test_only_views_the_target_has_and_describes_otherwise_are_printed_again() -> None:
    source = _side(big=QUALIFIED, same=BARE, gone=QUALIFIED)
    target = _side(big=BARE, same=BARE)

    assert queries_to_reprint(source, target) == {"relation shop.big": QUALIFIED}


def test_the_targets_print_of_the_sources_query_replaces_only_the_query_and_then_compares_equal() -> None:
    source, target = _side(big=QUALIFIED), _side(big=BARE)

    reprinted = with_reprinted(source, {"relation shop.big": BARE})

    assert reprinted.objects["relation shop.big"] == f"view: {BARE}"
    assert reprinted.queries["relation shop.big"] == BARE
    assert reprinted.objects["index shop.orders_pkey"] == source.objects["index shop.orders_pkey"]
    assert compare(reprinted, target).difference is None
    assert compare(source, target).difference is not None


def test_a_query_the_target_could_not_print_keeps_its_difference() -> None:
    source, target = _side(big=QUALIFIED), _side(big=BARE)

    comparison = compare(with_reprinted(source, {}), target)

    assert comparison.difference is not None
    assert "relation shop.big (" in comparison.difference


def test_verifys_result_lists_every_table_that_differs_and_the_equal_ones_up_to_a_bound() -> None:
    """Its result must stay under Temporal's payload limit (2 MiB): some ten thousand tables passed it, and every
    attempt of verify then failed after reading every row."""
    checks = [
        TableCheck(
            table=f"s.t{n}", source_rows=1, target_rows=1 if n != 7 else 0, source_checksum="a", target_checksum="a"
        )
        for n in range(LISTED + 50)
    ]

    shown = listed(checks)

    assert [check.table for check in shown][:1] == ["s.t7"]
    assert len(shown) == LISTED + 1
    assert listed(checks[:3]) == checks[:3]
