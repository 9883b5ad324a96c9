"""ferry's sessions end cleanly however the server ended them: the end of a `with` block closes, nothing else."""

from __future__ import annotations

import pytest

from activities.postgres.connection import Connection, connect
from activities.secrets import DatabaseConnection
from activities.settings import DataActivitySettings
from tests.end_to_end import Databases
from tests.postgres.data import connect as admin_session


def _as_ferry_sees_it(databases: Databases) -> DatabaseConnection:
    source = databases.source
    return DatabaseConnection(
        source.host, source.port, source.user, source.password, source.database, secret="test/source"
    )


def _end(backend: int, databases: Databases) -> None:
    with admin_session(databases.source) as admin:
        admin.execute("select pg_terminate_backend(%s, 10000)", (backend,))


def test_a_block_whose_session_the_server_ended_leaves_without_failing_and_closes_it(databases: Databases) -> None:
    """The freeze ends sessions, and a database can restart under a step. Every statement of an
    autocommit session has committed as it ran, so the block's end has nothing to commit: a
    commit sent there on an ended session would fail a step whose work was done, and leave the
    connection open until collected."""
    with connect(_as_ferry_sees_it(databases), DataActivitySettings()) as conn:
        conn.execute("begin")  # a transaction open, as the session holding a snapshot for the streams has
        _end(conn.info.backend_pid, databases)
    assert conn.closed


def test_a_block_that_raises_keeps_its_own_error_and_closes_the_session(databases: Databases) -> None:
    opened: list[Connection] = []

    def fail_inside_a_block() -> None:
        with connect(_as_ferry_sees_it(databases), DataActivitySettings()) as conn:
            opened.append(conn)
            conn.execute("begin")
            raise LookupError("the block's own error")

    with pytest.raises(LookupError, match="the block's own error"):
        fail_inside_a_block()
    assert opened[0].closed
