"""Which row hash verify reads both sides with: the fastest both servers compute alike.

The servers here cannot be made to disagree (both run on this machine's byte order, and
both are 14 or later), so these tests answer the probes with a stand-in connection: a
fake, only to inject what a big-endian, pre-14 or pre-11 server would answer. That the
real servers agree, and that the fast hashes still see every difference in text, is in
tests/postgres/test_verify.py.
"""

from __future__ import annotations

from typing import Any, cast

import psycopg

from activities.postgres import checksums
from activities.postgres.connection import Connection


class _Answering:
    """Answers each probe query with its hashes, or raises UndefinedFunction for a probe it has none for, as a
    server without the probe's function would."""

    def __init__(self, answers: dict[str, list[int]]) -> None:
        self._answers = answers
        self._answer: list[int] = []

    def execute(self, query: str) -> _Answering:
        assert query in (checksums.COLUMNS_PROBE, checksums.PROBE)
        if query not in self._answers:
            raise psycopg.errors.UndefinedFunction("function does not exist")
        self._answer = self._answers[query]
        return self

    def fetchone(self) -> tuple[Any, ...]:
        return (self._answer,)


def _server(columns: list[int] | None = None, text: list[int] | None = None) -> Connection:
    answers = {checksums.COLUMNS_PROBE: columns, checksums.PROBE: text}
    return cast(Connection, _Answering({query: hashes for query, hashes in answers.items() if hashes is not None}))


def test_servers_that_hash_both_probes_alike_are_read_with_hash_record_extended() -> None:
    assert checksums.agreed(_server([4, 5], [1, -2, 3]), _server([4, 5], [1, -2, 3])) == checksums.COLUMNS


def test_servers_that_hash_the_columns_probe_differently_are_read_with_hashtextextended() -> None:
    assert checksums.agreed(_server([4, 5], [1, -2, 3]), _server([5, 4], [1, -2, 3])) == checksums.HASHTEXT


def test_servers_that_hash_both_probes_differently_are_read_with_md5() -> None:
    big_endian = _server([5, 4], [3, -2, 1])

    assert checksums.agreed(_server([4, 5], [1, -2, 3]), big_endian) == checksums.MD5


def test_a_server_without_hash_record_extended_has_both_sides_read_with_hashtextextended() -> None:
    older_than_14 = _server(text=[1, -2, 3])

    assert checksums.agreed(_server([4, 5], [1, -2, 3]), older_than_14) == checksums.HASHTEXT
    assert checksums.agreed(older_than_14, _server([4, 5], [1, -2, 3])) == checksums.HASHTEXT


def test_a_server_without_hashtextextended_has_both_sides_read_with_md5() -> None:
    older_than_11 = _server()

    assert checksums.agreed(_server([1], [1]), older_than_11) == checksums.MD5
    assert checksums.agreed(older_than_11, _server([1], [1])) == checksums.MD5
