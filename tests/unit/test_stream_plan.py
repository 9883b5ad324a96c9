"""How a snapshot in parallel streams shares the source's tables (activities/postgres/streams.py), without a database.

Largest first, each table to the stream with the fewest bytes so far; no stream without
a table; a bounded number of names on pg_dump's command line; and patterns that match
exactly one table whatever characters its name holds.
"""

from __future__ import annotations

import re

from activities.postgres import streams
from activities.postgres.streams import NAMED_LIMIT, Table, main_options, pattern, share, stream_options
from activities.settings import MIB, DataActivitySettings, default_streams
from ferry.api.saga import stream_key, stream_prefix


def _tables(*sizes: int) -> list[Table]:
    return [Table(f"public.t{index}", pattern("public", f"t{index}"), size) for index, size in enumerate(sizes)]


def test_tables_go_largest_first_to_the_stream_with_the_fewest_bytes() -> None:
    groups = share(_tables(100, 60, 50, 40, 10, 5), 3)

    assert [[table.size for table in group] for group in groups] == [[100], [60, 10, 5], [50, 40]]


def test_no_stream_is_left_without_a_table() -> None:
    assert [[table.size for table in group] for group in share(_tables(7, 3), 8)] == [[7], [3]]
    assert share([], 4) == []


def test_only_the_largest_tables_are_named_and_the_rest_stay_with_the_main_archive() -> None:
    groups = share(_tables(*range(3 * NAMED_LIMIT, 0, -1)), 4)

    named = [table for group in groups for table in group]
    assert len(named) == NAMED_LIMIT
    assert min(table.size for table in named) == 2 * NAMED_LIMIT + 1


def test_a_pattern_quotes_every_character_of_the_names() -> None:
    assert pattern('Odd "Schema"', "Mixed.Case*?") == '"Odd ""Schema"""."Mixed.Case*?"'
    assert pattern("public", "orders") == '"public"."orders"'


def test_the_main_archive_leaves_out_exactly_the_streamed_tables_rows_and_each_stream_holds_only_rows() -> None:
    groups = share(_tables(9, 8, 7), 2)

    main = main_options("00000003-0000001B-1", groups)
    second = stream_options("00000003-0000001B-1", groups[1])

    assert main == [
        "--snapshot=00000003-0000001B-1",
        '--exclude-table-data="public"."t0"',
        '--exclude-table-data="public"."t1"',
        '--exclude-table-data="public"."t2"',
    ]
    assert second[:3] == ["--snapshot=00000003-0000001B-1", "--data-only", "--strict-names"]
    assert second[3:] == ['--table="public"."t1"', '--table="public"."t2"']


def test_each_stream_gets_an_equal_share_of_the_snapshots_memory_and_never_less_than_ten_mib() -> None:
    settings = DataActivitySettings(upload_memory=256 * MIB)

    assert streams.stream_settings(settings, 4).upload_memory == 64 * MIB
    assert streams.stream_settings(settings, 64).upload_memory == 10 * MIB


def test_the_default_number_of_streams_follows_the_cpus() -> None:
    assert [default_streams(cpus) for cpus in (None, 1, 2, 3, 4, 8, 16, 64)] == [1, 1, 2, 3, 4, 8, 8, 8]


def test_a_migration_asks_for_its_streams_and_the_worker_caps_them() -> None:
    worker = DataActivitySettings(snapshot_streams=2, snapshot_max_streams=8)

    assert worker.streams_for(None) == 2, "the worker's --snapshot-streams when the Migration does not say"
    assert worker.streams_for(5) == 5
    assert worker.streams_for(64) == 8, "never more than --snapshot-max-streams, whatever the Migration asks"
    assert DataActivitySettings(snapshot_streams=16, snapshot_max_streams=4).streams_for(None) == 4
    assert DataActivitySettings().snapshot_max_streams == 8


def test_the_streams_keys_sit_beside_the_snapshots_and_match_no_other_snapshots_key() -> None:
    key = "ferry/shop/orders-db/6f1c/snapshot.dump"

    assert stream_key(key, 2) == "ferry/shop/orders-db/6f1c/snapshot.tables-2.dump"
    assert stream_key(key, 2).startswith(stream_prefix(key))
    assert not key.startswith(stream_prefix(key))
    assert re.fullmatch(r".*/snapshot\.tables-\d+\.dump", stream_key(key, 12))
