"""A late attempt of a step that restores never touches a target verify has marked.

A worker paused (SIGSTOP, a frozen VM) inside snapshot or migrate is written off past its
heartbeat timeout; the saga's next attempt restores, verify passes and marks the target,
and traffic may move to it. When the paused worker goes on, whatever it was about to do
to the target (empty it, truncate a table for a stream, mark the restore complete,
commit a restore) is refused with TargetVerified, and the target keeps everything,
the writes its clients made since included. The pause itself is not made here: what the
late attempt does next is called on the target verify marked.
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from kubernetes import client as k8s
from temporalio.testing import ActivityEnvironment

from activities.heartbeats import Heartbeats
from activities.postgres import restore_script, restoring, unwritten, verifying
from activities.postgres.activities import PostgresActivities, owner
from activities.postgres.attempts import Attempt
from activities.postgres.connection import connect as connect_to
from activities.secrets import DatabaseConnection, SecretReader
from activities.settings import DataActivitySettings
from devstack.stack.stack import StackInfo
from ferry.api.errors import TargetVerified
from ferry.api.saga import FenceMark
from tests.cluster import eventually
from tests.end_to_end import TARGET_SECRET, Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import connect, contents, create_bulky, create_shop, verified_mark

VERIFY = Attempt(run="run-1", activity="20", scheduled=datetime(2026, 1, 1, tzinfo=UTC), number=1)
"""The attempt of verify that marks the target in the tests that call unwritten.record alone."""


@pytest.fixture
def target(steps: Steps, kube_api: k8s.ApiClient) -> DatabaseConnection:
    return SecretReader(kube_api).database(steps.ref.namespace, TARGET_SECRET, "spec.driver.targetSecret")


def _clients_write(databases: Databases) -> None:
    """What the application does once traffic moved to the verified target."""
    with connect(databases.target) as conn:
        conn.execute("insert into public.blobs values (-1, 'written after traffic moved')")


def test_a_late_snapshot_attempt_refuses_to_empty_a_verified_target_which_keeps_its_data_and_mark(
    steps: Steps, databases: Databases
) -> None:
    create_bulky(databases.source, rows=1_000)
    create_shop(databases.source, customers=100, orders=1_000)
    steps.freeze()
    steps.migrate(steps.snapshot(restore=True))
    steps.verify()
    mark = verified_mark(databases.target)
    _clients_write(databases)
    before = contents(databases.target)

    with pytest.raises(TargetVerified, match=r"verify of Migration .* has marked it"):
        steps.snapshot(restore=True)  # the late attempt, going on from where it connected to the target

    assert contents(databases.target) == before, "nothing dropped: the clients' write is there"
    assert verified_mark(databases.target) == mark, "verify's mark stays, so check_unwritten still guards the way back"


def test_a_late_migrate_from_the_store_refuses_to_empty_a_verified_target(steps: Steps, databases: Databases) -> None:
    create_bulky(databases.source, rows=1_000)
    steps.freeze()
    snapshot = steps.snapshot()
    steps.migrate(snapshot)
    steps.verify()
    _clients_write(databases)
    before = contents(databases.target)

    with pytest.raises(TargetVerified):
        steps.migrate(snapshot)

    assert contents(databases.target) == before


@pytest.fixture
def in_streams(steps: Steps, kube_api: k8s.ApiClient, data_settings: DataActivitySettings) -> Steps:
    """The steps of a Migration asking for two streams, on a worker that uses streams for any size."""
    settings = dataclasses.replace(data_settings, parallel_min_size=0)
    driver = steps.driver.model_copy(update={"parallelism": 2})
    return dataclasses.replace(steps, postgres=PostgresActivities(kube_api, settings), driver=driver)


def test_a_late_stream_restore_refuses_to_truncate_and_reload_a_table_of_a_verified_target(
    in_streams: Steps, databases: Databases, stack: StackInfo, target: DatabaseConnection,
    data_settings: DataActivitySettings,
) -> None:  # fmt: skip
    """A stream's restore empties each of its tables (TRUNCATE, for COPY FREEZE) before it loads the stream's rows:
    going on late, it would put the source's rows back over the clients' writes."""
    create_bulky(databases.source, rows=5_000)
    create_shop(databases.source, customers=100, orders=1_000)
    in_streams.freeze()
    snapshot = in_streams.snapshot(restore=True)
    in_streams.verify()
    _clients_write(databases)
    before = contents(databases.target)
    with connect(databases.source) as conn:
        freeze = restore_script.freezable(conn)
    assert snapshot.streams, "the snapshot went in streams"

    def late_stream(index: int) -> None:
        stream = snapshot.stream(index)
        body = restoring.open_snapshot(stack.s3_client(), stream)
        try:
            with Heartbeats(data_settings.heartbeat_interval) as heartbeats:
                restoring.restore(target, data_settings, body, stream, heartbeats, None, freeze, truncate=True)
        finally:
            body.close()

    for index in range(len(snapshot.streams)):
        with pytest.raises(TargetVerified) as refused:
            ActivityEnvironment().run(late_stream, index)
        # Refused before pg_restore starts, not at its commit: its TRUNCATE would have locked the table meanwhile.
        assert str(refused.value).startswith("refused to restore into the target"), refused.value

    assert contents(databases.target) == before


def test_a_late_mark_of_a_complete_restore_is_refused_on_a_verified_target(
    steps: Steps, databases: Databases, target: DatabaseConnection, data_settings: DataActivitySettings
) -> None:
    create_bulky(databases.source, rows=100)
    steps.freeze()
    steps.snapshot(restore=True)
    steps.verify()

    def late_mark() -> None:
        with connect_to(target, data_settings) as conn:
            restoring.mark_complete(conn, target, owner(steps.ref))

    with pytest.raises(TargetVerified):
        ActivityEnvironment().run(late_mark)


def test_verify_marks_a_target_only_once_a_restore_that_found_it_unmarked_has_committed(
    steps: Steps, databases: Databases, target: DatabaseConnection, data_settings: DataActivitySettings
) -> None:
    """The check and verify's marking are serialized: a destructive transaction that found no mark keeps verify from
    marking until it ends, so it never commits after the mark; and once the mark is there, the next one is refused."""
    fence = FenceMark(writes=0, catalog="")
    with connect_to(target, data_settings) as restore, connect_to(target, data_settings) as verify:
        with restore.transaction():
            unwritten.refuse_if_verified(restore, target, "empty the target")  # no mark yet: goes on
            marking = threading.Thread(target=unwritten.record, args=(verify, target, owner(steps.ref), fence, VERIFY))
            marking.start()
            eventually("verify's marking to wait for the lock", lambda: _waiting_for_advisory_lock(databases))
            assert verified_mark(databases.target) is None
        marking.join(10)
        assert not marking.is_alive()
        assert verified_mark(databases.target) is not None

        with pytest.raises(TargetVerified), restore.transaction():
            unwritten.refuse_if_verified(restore, target, "empty the target")


def _waiting_for_advisory_lock(databases: Databases) -> bool:
    with connect(databases.target) as conn:
        row = conn.execute(
            "select count(*) from pg_locks l join pg_stat_activity a on a.pid = l.pid "
            "where l.locktype = 'advisory' and not l.granted and a.datname = current_database()"
        ).fetchone()
    return row is not None and row[0] > 0


def test_a_late_restore_that_resumes_while_verify_compares_waits_for_the_mark_then_refuses_instead_of_emptying(
    steps: Steps, databases: Databases, target: DatabaseConnection, data_settings: DataActivitySettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A written-off snapshot attempt goes on between verify's reading of the target and its mark: its emptying of the
    target for its restore committed before the mark, so verify marked (and switch-traffic would move the clients to)
    an empty target it had compared full. verify now keeps restores off the target from its first read."""
    create_shop(databases.source, customers=100, orders=1_000)
    steps.freeze()
    steps.snapshot(restore=True)
    before = contents(databases.target)
    late: dict[str, BaseException | None] = {}

    def prepare_again() -> None:
        with connect_to(target, data_settings) as conn:
            restoring.prepare_target(conn, target, owner(steps.ref))

    def resumes() -> None:
        try:
            ActivityEnvironment().run(prepare_again)
            late["ended"] = None
        except BaseException as error:  # noqa: BLE001 - handed to the test
            late["ended"] = error

    compare = verifying.compare

    def compared_then_the_late_attempt_resumes(*args: Any, **kwargs: Any) -> verifying.Comparison:
        thread = threading.Thread(target=resumes)
        thread.start()
        eventually(
            "the late attempt to wait for verify's lock, or to have emptied the target",
            lambda: "ended" in late or _waiting_for_advisory_lock(databases),
        )
        late["thread"] = thread  # type: ignore[assignment]
        return compare(*args, **kwargs)

    monkeypatch.setattr(verifying, "compare", compared_then_the_late_attempt_resumes)

    steps.verify()
    thread = late.pop("thread")
    assert isinstance(thread, threading.Thread)
    thread.join(30)

    # Refused once verify committed its mark, or ended by verify's marking while it waited: either way, it did nothing.
    assert isinstance(late.get("ended"), (TargetVerified, psycopg.errors.AdminShutdown)), late
    assert contents(databases.target) == before, "the target verify marked holds what it compared"
