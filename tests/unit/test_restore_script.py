"""pg_restore's script on its way to psql: FREEZE on the COPY of each named table, and nothing else changed.

The script below has the shape pg_restore 18 writes (--single-transaction --file=-): a
\\restrict line, BEGIN, the schema, each table's COPY and rows, COMMIT. Every test feeds
it in pieces cut at every place that matters, as the pipe from pg_restore may cut it.
That real pg_restore and psql restore through it is in
tests/postgres/test_restore_while_dumping.py.
"""

from __future__ import annotations

import itertools
import stat
from pathlib import Path

import pytest

from activities.postgres import restore_script
from activities.postgres.restore_script import LINE_LIMIT, Copies, ScriptRefused

ROWS_LIKE_A_COPY = b"COPY public.orders (id, note) FROM stdin;"
"""A row of a one-column text table holding this text: COPY writes it as it is, on a line of its own."""

SCRIPT = b"".join(
    [
        b"--\n-- PostgreSQL database dump\n--\n\n",
        b"\\restrict h3gStSzRD1lvpMgqWb0xRCwEy1LDJXxzq9HGHzTqv4LObK5R6oPeYOZjIK6uax8\n\n",
        b"BEGIN;\n\nSET statement_timeout = 0;\nSELECT pg_catalog.set_config('search_path', '', false);\n\n",
        b"CREATE TABLE public.orders (\n    id bigint NOT NULL,\n    note text\n);\n\n",
        b'CREATE TABLE "Sales"."Order Lines" (\n    id integer\n);\n\n',
        b"CREATE FUNCTION public.load() RETURNS void LANGUAGE sql\n    AS $$\n",
        b"COPY public.orders (id, note) FROM stdin;\n$$;\n\n",
        b"--\n-- Data for Name: orders; Type: TABLE DATA; Schema: public; Owner: -\n--\n\n",
        b"COPY public.orders (id, note) FROM stdin;\n",
        b"1\tfirst\n2\t\\\\.\n3\t\\N\n\\.\n\n",
        b"COPY public.texts (line) FROM stdin;\n",
        b"\\.\n\n",
        b"COPY public.texts (line) FROM stdin;\n",
        ROWS_LIKE_A_COPY + b"\n",
        b"\\.\n\n",
        b'COPY "Sales"."Order Lines" (id) FROM stdin;\n',
        b"\\.\n\n",
        b"COPY public.measurements (id) FROM stdin;\n",
        b"7\n\\.\n\n",
        b"COMMIT;\n\n--\n-- PostgreSQL database dump complete\n--\n\n",
        b"\\unrestrict h3gStSzRD1lvpMgqWb0xRCwEy1LDJXxzq9HGHzTqv4LObK5R6oPeYOZjIK6uax8\n\n",
    ]
)
TABLES = frozenset({b"public.orders", b'"Sales"."Order Lines"', b"public.texts"})
"""What the source names: public.measurements is not among them (as a partitioned table would not be)."""

EXPECTED = (
    SCRIPT.replace(
        b"\n\nCOPY public.orders (id, note) FROM stdin;\n1",
        b"\n\nCOPY public.orders (id, note) FROM stdin WITH (FREEZE);\n1",
    )
    .replace(b"COPY public.texts (line) FROM stdin;\n", b"COPY public.texts (line) FROM stdin WITH (FREEZE);\n")
    .replace(b'"Order Lines" (id) FROM stdin;', b'"Order Lines" (id) FROM stdin WITH (FREEZE);')
)


def _through(copies: Copies, pieces: list[bytes]) -> bytes:
    return b"".join(bytes(part) for piece in pieces for part in copies.feed(piece))


def _cut(data: bytes, *at: int) -> list[bytes]:
    edges = [0, *sorted(at), len(data)]
    return [data[start:end] for start, end in itertools.pairwise(edges)]


def test_each_named_tables_copy_gets_freeze_and_nothing_else_changes() -> None:
    copies = Copies(TABLES)

    assert _through(copies, [SCRIPT]) == EXPECTED
    assert copies.frozen == 4
    assert copies.complete


def test_for_a_script_of_rows_alone_each_frozen_copy_empties_its_table_first_in_the_same_transaction() -> None:
    """A parallel stream's script creates no table, and FREEZE needs one created or emptied in its transaction."""
    copies = Copies(TABLES, truncate=True)

    out = _through(copies, [SCRIPT[: len(SCRIPT) // 2], SCRIPT[len(SCRIPT) // 2 :]])

    assert out == (
        EXPECTED.replace(
            b"\n\nCOPY public.orders (id, note) FROM stdin WITH",
            b"\n\nTRUNCATE ONLY public.orders;\nCOPY public.orders (id, note) FROM stdin WITH",
        )
        .replace(b"COPY public.texts", b"TRUNCATE ONLY public.texts;\nCOPY public.texts")
        .replace(b'COPY "Sales"', b'TRUNCATE ONLY "Sales"."Order Lines";\nCOPY "Sales"')
    )
    assert out.count(b"TRUNCATE") == 4
    assert b"TRUNCATE ONLY public.measurements" not in out, "a table that loads without FREEZE is not emptied"
    assert copies.complete


def test_rows_that_read_like_a_copy_statement_or_hold_an_escaped_end_are_passed_on_as_they_are() -> None:
    out = _through(Copies(TABLES), [SCRIPT])

    assert b"\n" + ROWS_LIKE_A_COPY + b"\n\\.\n" in out
    assert b"2\t\\\\.\n3\t\\N\n" in out


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 13, 64])
def test_any_cutting_of_the_script_into_pieces_gives_the_same_script(size: int) -> None:
    copies = Copies(TABLES)

    assert _through(copies, [SCRIPT[at : at + size] for at in range(0, len(SCRIPT), size)]) == EXPECTED
    assert copies.complete


def test_the_end_of_the_rows_cut_at_each_of_its_bytes_is_still_found() -> None:
    end = SCRIPT.index(b"3\t\\N\n\\.\n") + len(b"3\t\\N")  # the newline before the end of the rows
    for at in range(end - 2, end + 5):
        assert _through(Copies(TABLES), _cut(SCRIPT, at)) == EXPECTED, f"cut at {at}"


def test_a_script_that_does_not_begin_with_restrict_is_refused() -> None:
    unrestricted = SCRIPT.replace(b"\\restrict", b"-- restrict")

    with pytest.raises(ScriptRefused, match=r"does not begin with \\restrict"):
        _through(Copies(TABLES), [unrestricted])


def test_a_meta_command_before_restrict_is_refused() -> None:
    with pytest.raises(ScriptRefused):
        _through(Copies(TABLES), [b"--\n\\! touch /tmp/owned\n" + SCRIPT])


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(b"COMMIT;\n", id="before COMMIT"),
        pytest.param(b"2\t\\\\.", id="inside a COPY's rows"),
        pytest.param(b"SET statement_timeout = 0", id="inside a line"),
    ],
)
def test_a_script_cut_short_is_not_complete(cut: bytes) -> None:
    copies = Copies(TABLES)

    _through(copies, [SCRIPT[: SCRIPT.index(cut)]])

    assert not copies.complete


def test_a_line_past_the_limit_is_passed_on_as_it_comes_and_a_copy_after_it_still_gets_freeze() -> None:
    body = b"-- " + b"x" * (LINE_LIMIT + 10) + b"\n"
    script = SCRIPT.replace(b"BEGIN;\n", b"BEGIN;\n" + body)
    copies = Copies(TABLES)

    pieces = [script[at : at + 65536] for at in range(0, len(script), 65536)]
    assert _through(copies, pieces) == EXPECTED.replace(b"BEGIN;\n", b"BEGIN;\n" + body)
    assert copies.complete


def test_a_long_copy_statement_still_starts_its_rows() -> None:
    columns = b", ".join(b"c%d" % number for number in range(LINE_LIMIT // 4))
    statement = b"COPY public.wide (" + columns + b") FROM stdin;\n"
    script = SCRIPT.replace(b"COMMIT;\n", statement + ROWS_LIKE_A_COPY + b"\n\\.\nCOMMIT;\n")
    copies = Copies(TABLES)

    out = _through(copies, [script[at : at + 65536] for at in range(0, len(script), 65536)])

    assert out.endswith(statement + ROWS_LIKE_A_COPY + b"\n\\.\n" + EXPECTED[EXPECTED.index(b"COMMIT;\n") :])
    assert copies.complete


def _tools(folder: Path, versions: dict[str, str]) -> Path:
    """A fake, injecting what this machine has not: client tools of other versions. Each script only reports one."""
    folder.mkdir(exist_ok=True)
    for tool, said in versions.items():
        script = folder / tool
        script.write_text(f"#!/bin/sh\necho '{tool} (PostgreSQL) {said}'\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


@pytest.mark.parametrize(
    ("tools", "server", "usable"),
    [
        pytest.param("18.1", 180001, True, id="18 into 18"),
        pytest.param("18.1", 190002, True, id="18 into a newer server"),
        pytest.param("18.1", 170005, False, id="18 into 17: the script's settings are 18's"),
        pytest.param("17.6", 170006, True, id="17.6 restricts"),
        pytest.param("17.5", 170006, False, id="17.5 does not restrict"),
        pytest.param("15.14", 150014, True, id="15.14 restricts"),
        pytest.param("12.22", 150014, False, id="12 never restricts"),
    ],
)
def test_psql_restores_only_with_restricting_tools_and_a_server_of_their_version_or_newer(
    tmp_path: Path, tools: str, server: int, usable: bool
) -> None:
    bindir = _tools(tmp_path, {"pg_dump": tools, "pg_restore": tools, "psql": tools})

    assert restore_script.usable(bindir, server) is usable


def test_psql_does_not_restore_when_missing_or_of_another_version(tmp_path: Path) -> None:
    missing = _tools(tmp_path / "missing", {"pg_dump": "18.1", "pg_restore": "18.1"})
    mixed = _tools(tmp_path / "mixed", {"pg_dump": "18.1", "pg_restore": "18.1", "psql": "17.2"})

    assert not restore_script.usable(missing, 180001)
    assert not restore_script.usable(mixed, 180001)


@pytest.mark.parametrize(
    "holder",
    [
        pytest.param(b"CREATE FUNCTION public.f() RETURNS text LANGUAGE sql AS $b$\n%s\n$b$;\n", id="dollar quote"),
        pytest.param(b"COMMENT ON TABLE public.orders IS 'it''s\n%s\n';\n", id="single quote"),
        pytest.param(b"COMMENT ON TABLE public.orders IS E'\\'\n%s\n';\n", id="escape string"),
        pytest.param(b'CREATE TABLE public."odd\n%s\n" (id integer);\n', id="quoted name"),
        pytest.param(b"/* outer /* inner */\n%s\n*/\n", id="nested comment"),
        pytest.param(b"CREATE RULE r AS ON INSERT TO public.orders DO INSTEAD (SELECT 1;\n%s\n);\n", id="parentheses"),
        pytest.param(b"CREATE VIEW public.v AS SELECT 1 AS one\n%s\n", id="inside a statement"),
    ],
)
def test_a_line_reading_like_a_copy_where_psql_would_not_run_one_is_left_alone(holder: bytes) -> None:
    """psql runs a COPY only where a statement begins: not in a quote, a comment or another statement."""
    held = holder % ROWS_LIKE_A_COPY
    script = SCRIPT.replace(b"BEGIN;\n", b"BEGIN;\n" + held)
    copies = Copies(TABLES)

    out = _through(copies, [script[at : at + 5] for at in range(0, len(script), 5)])

    assert out == EXPECTED.replace(b"BEGIN;\n", b"BEGIN;\n" + held)
    assert copies.frozen == 4


def test_after_standard_conforming_strings_off_a_backslash_escapes_a_quote_as_psql_reads_it() -> None:
    """A dump of a server with standard_conforming_strings off: 'it\\'s' is one string there, and what follows
    it on the next lines is still inside it until its last quote."""
    held = b"SET standard_conforming_strings = off;\nCOMMENT ON TABLE public.orders IS 'it\\'s\n%s\n';\n"
    held %= ROWS_LIKE_A_COPY
    script = SCRIPT.replace(b"BEGIN;\n", b"BEGIN;\n" + held)
    copies = Copies(TABLES)

    assert _through(copies, [script]) == EXPECTED.replace(b"BEGIN;\n", b"BEGIN;\n" + held)
    assert copies.frozen == 4
