"""Which row hash verify reads both sides with: the fast one only when both servers compute it alike.

The servers here cannot be made to disagree (both run on this machine's byte order, and
both are 11 or later), so these tests answer the probe with a stand-in connection: a
fake, only to inject what a big-endian or pre-11 server would answer. That the real
servers agree, and that the fast hash still sees a one-character difference, is in
tests/postgres/test_verify.py.
"""

from __future__ import annotations

from typing import Any, cast

import psycopg

from activities.postgres import checksums
from activities.postgres.connection import Connection


class _Answering:
    """Answers the probe query with `hashes`, or raises `error`, as a server would."""

    def __init__(self, hashes: list[int] | None = None, error: Exception | None = None) -> None:
        self._hashes, self._error = hashes, error

    def execute(self, query: str) -> _Answering:
        assert query == checksums.PROBE
        if self._error is not None:
            raise self._error
        return self

    def fetchone(self) -> tuple[Any, ...]:
        return (self._hashes,)


def _server(hashes: list[int] | None = None, error: Exception | None = None) -> Connection:
    return cast(Connection, _Answering(hashes, error))


def test_servers_that_hash_the_probe_alike_are_read_with_hashtextextended() -> None:
    assert checksums.agreed(_server([1, -2, 3]), _server([1, -2, 3])) == checksums.HASHTEXT


def test_servers_that_hash_the_probe_differently_are_read_with_md5() -> None:
    big_endian = [3, -2, 1]

    assert checksums.agreed(_server([1, -2, 3]), _server(big_endian)) == checksums.MD5


def test_a_server_without_hashtextextended_has_both_sides_read_with_md5() -> None:
    older_than_11 = _server(error=psycopg.errors.UndefinedFunction("function hashtextextended does not exist"))

    assert checksums.agreed(_server([1]), older_than_11) == checksums.MD5
    assert checksums.agreed(older_than_11, _server([1])) == checksums.MD5
