"""verify compares every user table on both sides by row count and a checksum that ignores row order."""

from __future__ import annotations

import dataclasses

import pytest
from kubernetes import client as k8s
from psycopg import sql

from activities.postgres import checksums
from ferry.api.errors import BadCredentials, VerificationMismatch
from ferry.api.migration import DriverSpec
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps, create_secret
from tests.postgres.data import connect, connection_of, database_owner

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


HASH_PARTITIONED = """
create type public.tier as enum ('bronze', 'silver', 'gold');
create table public.by_tier (tier public.tier not null, id int not null) partition by hash (tier);
create table public.by_tier_0 partition of public.by_tier for values with (modulus 2, remainder 0);
create table public.by_tier_1 partition of public.by_tier for values with (modulus 2, remainder 1)
    partition by range (id);
create table public.by_tier_1_low partition of public.by_tier_1 for values from (0) to (1000);
create table public.by_tier_1_high partition of public.by_tier_1 for values from (1000) to (maxvalue);
create table public.by_id (id int not null) partition by range (id);
create table public.by_id_low partition of public.by_id for values from (0) to (10);
create table public.by_id_high partition of public.by_id for values from (10) to (maxvalue);
insert into public.by_tier select (array['bronze', 'silver', 'gold']::public.tier[])[1 + g % 3], g
from generate_series(1, 3000) as g;
insert into public.by_id select generate_series(1, 20);
"""


def test_verify_reads_a_hash_partitioned_table_whole_since_its_rows_may_sit_in_other_partitions_on_the_target(
    steps: Steps, databases: Databases
) -> None:
    """An enum hashes its oid, which differs between the two databases: the same rows land in other partitions."""
    spread = "select count(*) from public.by_tier_0"
    with connect(databases.source) as conn:
        conn.execute(HASH_PARTITIONED)
        on_source = conn.execute(spread).fetchone()
    with connect(databases.target) as conn:
        for _ in range(30):  # each try gives the enum's values new oids, until the rows sit elsewhere
            conn.execute(HASH_PARTITIONED)
            if conn.execute(spread).fetchone() != on_source:
                break
            conn.execute("drop table public.by_tier, public.by_id; drop type public.tier")
    with connect(databases.target) as conn:
        assert conn.execute(spread).fetchone() != on_source, "the rows sit in other partitions on the target"

    result = steps.verify()

    assert [(check.table, check.source_rows, check.equal) for check in result.tables] == [
        ("public.by_id_high", 11, True),
        ("public.by_id_low", 9, True),
        ("public.by_tier", 3000, True),
    ]


def test_verify_sees_a_row_missing_from_a_hash_partitioned_table(steps: Steps, databases: Databases) -> None:
    for side in (databases.source, databases.target):
        with connect(side) as conn:
            conn.execute(HASH_PARTITIONED)
    with connect(databases.target) as conn:
        conn.execute("delete from public.by_tier where id = 1500")

    with pytest.raises(VerificationMismatch, match=r"public.by_tier \(3000 rows in the source, 2999 in the target\)"):
        steps.verify()


def test_verify_sees_a_missing_row(steps: Steps, databases: Databases) -> None:
    _fill(databases)
    with connect(databases.target) as conn:
        conn.execute("delete from shop.orders where id = 1")

    with pytest.raises(VerificationMismatch, match=r"shop\.orders \(5000 rows in the source, 4999 in the target\)"):
        steps.verify()


def test_postgresql_15_and_18_hash_rows_alike_so_verify_reads_them_with_hash_record_extended(
    databases: Databases,
) -> None:
    with connect(databases.source) as source, connect(databases.target) as target:
        versions = [conn.info.server_version // 10000 for conn in (source, target)]

        assert checksums.agreed(source, target) == checksums.COLUMNS
    assert versions == [15, 18]


def test_verify_sees_a_number_written_with_one_more_digit(steps: Steps, databases: Databases) -> None:
    for endpoint, amount in ((databases.source, "1.0"), (databases.target, "1.00")):
        with connect(endpoint) as conn:
            conn.execute("create table public.prices (id int, amount numeric)")
            conn.execute(f"insert into public.prices values (1, {amount}), (2, 2.5)")  # 1.0 = 1.00, but not the same

    with pytest.raises(VerificationMismatch, match=r"public\.prices \(same 2 rows, different contents\)"):
        steps.verify()


ALIKE_TO_THEIR_HASH = {
    "bigint_folded": ("bigint", "0", "4294967297"),  # int8's hash folds its halves together: 0 xor 0 = 1 xor 1
    "timestamptz_folded": ("timestamptz", "'2000-01-01 00:00+00'", "'2000-01-01 01:11:34.967297+00'"),
    "time_folded": ("time", "'00:00'", "'01:11:34.967297'"),  # 2^32 + 1 microseconds later
    "numeric_sign": ("numeric", "5", "-5"),  # numeric's hash ignores the sign
    "numeric_scale": ("numeric", "1.0", "1.00"),
    "numeric_nan_or_null": ("numeric", "'NaN'", "null"),  # numeric's hash of NaN and the infinities is 0, as a null's
    "numeric_infinities": ("numeric", "'Infinity'", "'-Infinity'"),
    "float_negative_zero": ("float8", "'0'", "'-0'"),
    "jsonb_nesting": ("jsonb", "'[[1], 2]'", "'[[1, 2]]'"),
    "interval_units": ("interval", "'1 day'", "'24 hours'"),
    "bpchar_trailing_space": ("bpchar", "'a'", "'a '"),
    "text_empty_or_null": ("text", "''", "null"),
    "int_zero_or_null": ("int", "0", "null"),
}
"""Per table: a column type, and two values its type's own hash function takes for equal, though their text differs."""

OTHERWISE_ALIKE = {
    "values_swapped": (  # each row hashes apart, but a sum of hashes combined linearly would not see the swap
        "create table values_swapped (id int, v text); insert into values_swapped values (1, 'x'), (2, 'y')",
        "create table values_swapped (id int, v text); insert into values_swapped values (1, 'y'), (2, 'x')",
    ),
    "null_column_added": (  # a column of nulls adds nothing to a linear combination's sum
        "create table null_column_added (v int); insert into null_column_added values (5)",
        "create table null_column_added (added int, v int); insert into null_column_added (v) values (5)",
    ),
}
"""Per table: the source's statements and the target's, whose rows differ in a way a hash of hashes could miss."""

EVERY_KIND = """
create type public.mood as enum ('sad', 'ok', 'happy');
create domain public.positive as int check (value > 0);
create type public.pair as (a int, b text);
create table public.every_kind (
    a bool, b "char", c smallint, d int, e bigint, f date, g bytea, h uuid, i text, j varchar(20), k time,
    l timestamp, m timestamptz, n numeric, o real, p float8, q jsonb, r json, s public.mood, t public.positive,
    u public.pair, v int[], w interval, x inet, y money, z char(5), aa int4range, ab point, ac bit(4), ad name
);
insert into public.every_kind select
    i % 2 = 0, 'x', i, i * 1000, i * 10000000000, date '2024-02-29' + i, decode(md5(i::text), 'hex'),
    md5(i::text)::uuid, 'Zoë ' || i, 'v' || i, time '12:34:56.789', timestamp '2024-01-01' + i * interval '1 s',
    timestamptz '2024-01-01 00:00+00' + i * interval '1 min', i / 7.0, i / 3.0, i / 3.0, jsonb_build_object('i', i),
    json_build_object('i', i), (array['sad', 'ok', 'happy'])[1 + i % 3]::public.mood, i + 1,
    row(i, 'p' || i)::public.pair, array[i, null, -i], i * interval '1 h 3 min', '10.0.0.1'::inet + i, i * 1.5,
    'c' || i % 10, int4range(i, i + 10), point(i, -i), (i % 16)::bit(4), 'name' || i
from generate_series(1, 300) as i;
insert into public.every_kind (a) values (null);
"""
"""A table with a column of many kinds, enums and other types of the database's own among them."""


def _fingerprints(databases: Databases) -> tuple[checksums.RowHash, list[dict[str, tuple[int, str]]]]:
    """The row hash both sides agree on, and each side's fingerprints read with it, as verify reads them."""
    with (
        connect(databases.source, **checksums.SESSION) as source,
        connect(databases.target, **checksums.SESSION) as target,
    ):
        row_hash = checksums.agreed(source, target)
        return row_hash, [
            checksums.fingerprints(conn, lambda _t, _r: None, row_hash=row_hash) for conn in (source, target)
        ]


def test_checksums_see_every_difference_in_text_that_a_types_own_hash_would_miss(databases: Databases) -> None:
    for side, endpoint in ((0, databases.source), (1, databases.target)):
        with connect(endpoint) as conn:
            conn.execute(EVERY_KIND)
            for table, (kind, *values) in ALIKE_TO_THEIR_HASH.items():
                conn.execute(f"create table public.{table} (id int, v {kind})")
                conn.execute(f"insert into public.{table} values (1, {values[side]}), (2, null)")
            for statements in OTHERWISE_ALIKE.values():
                conn.execute(statements[side])

    row_hash, sides = _fingerprints(databases)

    assert row_hash == checksums.COLUMNS
    assert {table for table in sides[0] if sides[0][table] != sides[1][table]} == {
        f"public.{table}" for table in [*ALIKE_TO_THEIR_HASH, *OTHERWISE_ALIKE]
    }
    assert sides[0]["public.every_kind"] == sides[1]["public.every_kind"]


def test_checksums_tell_apart_text_that_its_collation_takes_for_equal(databases: Databases) -> None:
    with connect(databases.source, **checksums.SESSION) as conn:  # PostgreSQL 15 here has ICU; the 18 has not
        conn.execute(
            "create collation public.anycase (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
        )
        for table, word in (("lower", "ferry"), ("upper", "FERRY")):
            conn.execute(f"create table public.{table} (word text collate public.anycase)")
            conn.execute(f"insert into public.{table} values (%s)", [word])
        equal = conn.execute("select (select word from public.lower) = (select word from public.upper)").fetchone()
        tables = checksums.fingerprints(conn, lambda _tables, _rows: None, row_hash=checksums.COLUMNS)

    assert equal == (True,)
    assert tables["public.lower"][1] != tables["public.upper"][1]


def test_checksums_read_a_table_as_wide_as_postgresql_allows(databases: Databases) -> None:
    widest = ", ".join(f"n{number} numeric" for number in range(1, 1601))  # each numeric column is read twice
    for endpoint in (databases.source, databases.target):
        with connect(endpoint) as conn:
            conn.execute(f"create table public.wide ({widest}); create table public.wider ({widest})")
            conn.execute("insert into public.wide (n1, n1600) values (1, 2.5), (3, null)")
    with connect(databases.target) as conn:
        conn.execute("insert into public.wider (n1, n1600) values (1, 2.5), (3, 7)")
    with connect(databases.source) as conn:
        conn.execute("insert into public.wider (n1, n1600) values (1, 2.5), (3, 7.0)")

    row_hash, sides = _fingerprints(databases)

    assert row_hash == checksums.COLUMNS
    assert sides[0]["public.wide"] == sides[1]["public.wide"]
    assert sides[0]["public.wider"] != sides[1]["public.wider"]


def test_verify_compares_no_rows_when_row_level_security_would_hide_some_from_it(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    sides = {
        "source": (databases.source, "(1, 'everyone'), (2, 'auditors')"),
        "target": (databases.target, "(1, 'everyone')"),
    }
    with database_owner(databases.source) as source_owner, database_owner(databases.target) as target_owner:
        for (side, (endpoint, rows)), owner in zip(sides.items(), (source_owner, target_owner), strict=True):
            with connect(endpoint) as conn:
                conn.execute(
                    f"create table public.notes (id int, readers text); insert into public.notes values {rows}"
                )
                conn.execute("create policy everyone on public.notes using (readers = 'everyone')")
                conn.execute("alter table public.notes enable row level security, force row level security")
                conn.execute(f"alter table public.notes owner to {owner.user}")  # FORCE: the owner sees row 1 only
            create_secret(kube_api, namespace, f"{side}-owner", connection_of(owner))
        as_owners = DriverSpec(source_secret="source-owner", target_secret="target-owner")

        with pytest.raises(BadCredentials) as raised:
            dataclasses.replace(steps, driver=as_owners).verify()

    assert 'query would be affected by row-level security policy for table "notes"' in str(raised.value)
    assert str(raised.value).endswith(
        "give the users BYPASSRLS (or use superusers), then retry the step or create the Migration again."
    )


FOLDING = (
    "(n::bigint * 4294967297)"  # values whose halves xor alike: a hash that folds 64 bits into 32 takes them for one
)
VALUES_OF = {
    "bool": "n % 2 = 0",
    '"char"': 'pg_catalog.chr(1 + (n + 2000) % 127)::"char"',
    "smallint": "n::smallint",
    "int": "n * 1073741",
    "date": "case n when 0 then 'infinity'::date when 1 then '-infinity'::date else date '2000-01-01' + n * 37 end",
    "bytea": "case when n = 0 then ''::bytea else decode(md5(n::text), 'hex') end",
    "uuid": "md5(n::text)::uuid",
    "text": "repeat(n::text, 3)",
    "varchar": "case when n = 0 then '' else n::text end",
    "bigint": FOLDING,
    "time": "time '00:00' + (abs(n) % 21) * interval '4294.967297 s' + (n < 0)::int * interval '1 us'",
    "timestamp": f"timestamp '2000-01-01' + {FOLDING} * interval '1 us'",
    "timestamptz": f"timestamptz '2000-01-01 00:00+00' + {FOLDING} * interval '1 us'",
}
"""For each type read as stored (or as its bytes, or its send form), values of n from -2000 to 2000."""


def test_checksums_hash_every_value_of_the_types_read_as_stored_apart(databases: Databases) -> None:
    distinct: dict[str, tuple[int, int]] = {}  # by server and type: how many text forms, how many hashes
    for endpoint in (databases.source, databases.target):
        with connect(endpoint, **checksums.SESSION) as conn:
            major = conn.info.server_version // 10000
            for kind, values in VALUES_OF.items():
                conn.execute(f"create table public.kind (v {kind})")
                conn.execute(f"insert into public.kind select {values} from generate_series(-2000, 2000) as n")
                row = conn.execute("select atttypid::bigint from pg_attribute where attrelid = 'public.kind'::regclass "
                                   "and attname = 'v'").fetchone()  # fmt: skip
                assert row is not None
                hashed = sql.SQL(checksums.COLUMNS.sql).format(columns=checksums.columns([("v", row[0])]))
                counts = conn.execute(
                    sql.SQL("select count(distinct t.v::text), count(distinct {}) from public.kind as t").format(hashed)
                ).fetchone()
                assert counts is not None
                distinct[f"{major} {kind}"] = counts
                conn.execute("drop table public.kind")

    assert len(distinct) == 2 * len(VALUES_OF)
    assert {kind: counts for kind, counts in distinct.items() if counts[0] != counts[1]} == {}
    assert min(texts for texts, _ in distinct.values()) == 2  # bool


def test_the_types_read_by_their_cast_to_text_cast_by_their_output_function_on_both_servers(
    databases: Databases,
) -> None:
    """A cast to text may be a function of its own (character(n)'s strips trailing blanks, so 'a' and 'a ' would read
    alike): AS_TEXT holds only types whose cast is their output function (or their stored text, as xml's), as pg_cast
    says on both servers."""
    for side in (databases.source, databases.target):
        with connect(side) as conn:
            rows = conn.execute(
                "select t.oid::bigint, coalesce(c.castmethod, 'i') from pg_type t "
                "left join pg_cast c on c.castsource = t.oid and c.casttarget = 'text'::regtype "
                "where t.oid = any(%s)",
                (list(checksums.AS_TEXT),),
            ).fetchall()
            assert sorted(oid for oid, _ in rows) == sorted(checksums.AS_TEXT), "every type of AS_TEXT exists"
            assert [checksums.AS_TEXT[oid] for oid, method in rows if method == "f"] == []
            assert conn.execute("select castmethod from pg_cast where castsource = 'bpchar'::regtype "
                                "and casttarget = 'text'::regtype").fetchone() == ("f",)  # fmt: skip
