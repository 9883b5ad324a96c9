"""Mode Online's comparison ahead: which tables verify may take as compared, and which it must read again."""

from __future__ import annotations

from activities.postgres.ahead import Marks, compare, largest, vouched
from ferry.api.saga import TableAhead

RESET = "database never, server 2026-11-23T06:00:00.000000Z"


def _marks(stats_reset: str = RESET, columns: dict[str, str] | None = None, **tables: tuple[int, int]) -> Marks:
    named = {name.replace("__", "."): value for name, value in tables.items()}
    digests = {name: f"columns of {name}" for name in named} | (columns or {})
    return Marks(tables=named, sizes={name: 1000 for name in named}, stats_reset=stats_reset, columns=digests)


SOURCE_TABLES = {"shop__orders": (3000, 16400), "shop__customers": (200, 16390)}
TARGET_TABLES = {"shop__orders": (3000, 24600), "shop__customers": (200, 24590)}
SOURCE = _marks(**SOURCE_TABLES)
TARGET = _marks(**TARGET_TABLES)
EQUAL = {"shop.orders": (3000, "c1"), "shop.customers": (200, "c2")}
AHEAD = compare(SOURCE, TARGET, EQUAL, EQUAL)


def test_only_tables_found_equal_on_both_sides_are_recorded() -> None:
    different = {"shop.orders": (3000, "c1"), "shop.customers": (199, "other")}

    recorded = compare(SOURCE, TARGET, EQUAL, different)

    assert recorded.tables == [
        TableAhead(
            table="shop.orders",
            rows=3000,
            checksum="c1",
            source_writes=3000,
            source_file=16400,
            target_writes=3000,
            target_file=24600,
            source_columns="columns of shop.orders",
            target_columns="columns of shop.orders",
        )
    ]


def test_tables_nothing_wrote_since_are_vouched_for() -> None:
    assert sorted(vouched(AHEAD, SOURCE, TARGET)) == ["shop.customers", "shop.orders"]


def test_a_table_written_on_either_side_since_is_read_again() -> None:
    written_on_source = _marks(shop__orders=(3001, 16400), shop__customers=(200, 16390))
    written_on_target = _marks(shop__orders=(3000, 24600), shop__customers=(201, 24590))

    assert sorted(vouched(AHEAD, written_on_source, TARGET)) == ["shop.customers"]
    assert sorted(vouched(AHEAD, SOURCE, written_on_target)) == ["shop.orders"]


def test_a_truncated_or_rewritten_table_is_read_again_though_it_counts_no_row() -> None:
    truncated = _marks(shop__orders=(3000, 16500), shop__customers=(200, 16390))

    assert sorted(vouched(AHEAD, truncated, TARGET)) == ["shop.customers"]


def test_a_table_gone_or_renamed_is_not_vouched_for() -> None:
    renamed = _marks(shop__orders=(3000, 16400), shop__clients=(200, 16390))

    assert sorted(vouched(AHEAD, renamed, TARGET)) == ["shop.orders"]


def test_a_table_whose_columns_changed_on_either_side_is_read_again_though_it_counts_no_row() -> None:
    """ADD COLUMN ... DEFAULT now() writes no row and keeps the file, yet gives every row a new value on each side."""
    altered = {"shop.orders": "columns of shop.orders, with c default now()"}

    assert sorted(vouched(AHEAD, _marks(columns=altered, **SOURCE_TABLES), TARGET)) == ["shop.customers"]
    assert sorted(vouched(AHEAD, SOURCE, _marks(columns=altered, **TARGET_TABLES))) == ["shop.customers"]


def test_a_record_without_the_columns_digests_vouches_for_nothing() -> None:
    """One made by a worker from before the digests were kept."""
    older = AHEAD.model_copy(
        update={"tables": [t.model_copy(update={"source_columns": None, "target_columns": None}) for t in AHEAD.tables]}
    )

    assert vouched(older, SOURCE, TARGET) == {}


def test_statistics_reset_on_either_side_vouch_for_nothing() -> None:
    reset_now = "database 2026-11-23T07:00:00.000000Z, server 2026-11-23T06:00:00.000000Z"

    assert vouched(AHEAD, _marks(reset_now, **{"shop__orders": (3000, 16400)}), TARGET) == {}
    assert vouched(AHEAD, SOURCE, _marks(reset_now, shop__orders=(3000, 24600), shop__customers=(200, 24590))) == {}


def test_the_largest_tables_are_compared_ahead_first() -> None:
    marks = Marks(
        tables={"a.small": (1, 1), "a.big": (1, 2), "a.mid": (1, 3)},
        sizes={"a.small": 10, "a.big": 10_000, "a.mid": 500},
        stats_reset=RESET,
    )

    assert largest(marks, limit=2) == {"a.big", "a.mid"}
