"""Which view queries verify has the target's server print again, and how they replace the source's own print.

Between PostgreSQL 15 and 16 or later, the same view's query reads differently; only those
queries are printed again, and only the query part of a view's description changes.
"""

from __future__ import annotations

from activities.postgres.verifying import Side, compare, queries_to_reprint, with_reprinted

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
