"""A client's lock on the target holds up neither the emptying of it for a restore nor the undo, until verify marks it.

Emptying the target drops its schemas, which waits for every lock another session holds
there: a client left in a transaction after one SELECT (a GUI, a psql in another window) held
the snapshot step, the source frozen, until its start-to-close timeout, and the undo tried
again for ever. Until verify marks it, the target is ferry's alone: its other sessions are
ended. Once verify marked it, they may be the application's, and a late attempt leaves them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import pytest

from ferry.api.errors import TargetVerified
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import Connection, connect, contents, create_shop, tables

CLIENT = "someones-sql-window"


def _client_reading(databases: Databases) -> Connection:
    """A client's session on the target left in a transaction that read a table: it holds an ACCESS SHARE lock."""
    client = connect(databases.target, application_name=CLIENT)
    client.execute("begin")
    client.execute("select count(*) from shop.orders")
    return client


def _in_a_thread(work: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    ended: dict[str, object] = {}

    def run() -> None:
        try:
            ended["result"] = work()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            ended["error"] = error

    thread = threading.Thread(target=run, name="step")
    thread.start()
    return thread, ended


def _ended(client: Connection) -> bool:
    try:
        client.execute("select 1")
    except psycopg.OperationalError:
        return True
    return False


@pytest.mark.timeout(300)
def test_a_retried_snapshot_empties_its_earlier_restore_ending_a_client_that_holds_a_lock_there(
    steps: Steps, databases: Databases
) -> None:
    create_shop(databases.source, customers=200, orders=2_000)
    steps.freeze()
    steps.snapshot(restore=True)  # the attempt that restored, then was written off (its worker lost, say)
    client = _client_reading(databases)

    again, ended = _in_a_thread(lambda: steps.snapshot(restore=True))
    try:
        again.join(120)
        assert not again.is_alive(), "the retry waited for the client's lock"
        assert _ended(client), "the client's session on the target was ended"
    finally:
        client.close()  # without the fix, the retry goes on once the lock is free
        again.join(120)

    assert "error" not in ended, ended
    assert contents(databases.target) == contents(databases.source)


@pytest.mark.timeout(300)
def test_the_undo_empties_a_target_never_verified_ending_a_client_that_holds_a_lock_there(
    steps: Steps, databases: Databases
) -> None:
    create_shop(databases.source, customers=200, orders=2_000)
    steps.freeze()
    steps.snapshot(restore=True)
    client = _client_reading(databases)

    undo, ended = _in_a_thread(steps.undo_migrate)
    try:
        undo.join(120)
        assert not undo.is_alive(), "the undo waited for the client's lock"
        assert _ended(client), "the client's session on the target was ended"
    finally:
        client.close()
        undo.join(120)

    assert "error" not in ended, ended
    with connect(databases.target) as conn:
        assert tables(conn) == []


def test_a_late_snapshot_leaves_the_sessions_of_a_verified_target_which_may_be_the_applications(
    steps: Steps, databases: Databases
) -> None:
    create_shop(databases.source, customers=200, orders=2_000)
    steps.freeze()
    steps.migrate(steps.snapshot(restore=True))
    steps.verify()
    client = _client_reading(databases)  # traffic may have moved to it since

    with pytest.raises(TargetVerified):
        steps.snapshot(restore=True)  # a late attempt, going on after verify marked the target

    assert not _ended(client), "the application's session on the target goes on"
    client.close()
