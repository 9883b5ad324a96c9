"""Every wait on S3 or PostgreSQL is bounded: an endpoint that takes connections and never answers fails the step.

Once, an S3 endpoint that accepted connections and said nothing kept a source frozen for
twenty minutes without an error: the activity's watchdog went on heartbeating while
the upload waited forever. Now each client has connect and read timeouts, and the step
ends with a message naming the endpoint and the timeout.

A database server that took a query and then stopped answering (a stopped process, a
frozen cgroup, storage that hangs) is another silence: its kernel still answers TCP
keepalives, and its postmaster takes a cancel request its backend cannot act on. The
tests make one for real, stopping the backend of a session (SIGSTOP).
"""

from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio import activity
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities.heartbeats import Heartbeats
from activities.postgres import dumping
from activities.postgres.activities import PostgresActivities
from activities.postgres.connection import connect
from activities.s3 import S3NotAnswering
from activities.secrets import DatabaseConnection
from activities.settings import DataActivitySettings
from devstack.stack.stack import StackInfo
from ferry.api.errors import DatabaseUnreachable
from ferry.api.saga import SnapshotResult
from tests.cluster import eventually, stopped
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps, create_secret
from tests.postgres.data import connect as connect_as_superuser

SILENT_DB = "silent-db"


class SilentServer:
    """A fake, injecting a failure the real S3 server and PostgreSQL cannot produce on demand.

    It is a TCP server on loopback that accepts every connection and then neither reads
    nor answers nor closes, as a hung endpoint or a black-holing proxy would.
    """

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="silent-server", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:  # closed
                return
            self._held.append(connection)

    def close(self) -> None:
        self._listener.close()
        self._thread.join(5)
        for connection in self._held:
            connection.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


@pytest.fixture
def quick(data_settings: DataActivitySettings) -> DataActivitySettings:
    """Short timeouts, so that the test takes seconds; the defaults are minutes."""
    return dataclasses.replace(data_settings, s3_connect_timeout=1, s3_read_timeout=1, s3_attempts=2, connect_timeout=2)


@pytest.mark.timeout(120)
def test_a_snapshot_to_an_s3_endpoint_that_never_answers_fails_naming_the_endpoint_and_the_timeout(
    steps: Steps, databases: Databases, silent: SilentServer, quick: DataActivitySettings, kube_api: k8s.ApiClient
) -> None:
    endpoint = f"http://127.0.0.1:{silent.port}"
    hung = dataclasses.replace(
        steps,
        postgres=PostgresActivities(kube_api, quick),
        snapshot_spec=steps.snapshot_spec.model_copy(update={"endpoint": endpoint}),
    )

    with pytest.raises(S3NotAnswering) as raised:
        hung.snapshot()

    assert str(raised.value).startswith(f"the S3 endpoint {endpoint} did not answer within 1s, in 2 attempts.")


@pytest.mark.timeout(120)
def test_a_database_that_takes_the_connection_and_never_answers_is_unreachable_naming_the_timeout(
    steps: Steps,
    databases: Databases,
    silent: SilentServer,
    quick: DataActivitySettings,
    kube_api: k8s.ApiClient,
    namespace: str,
) -> None:
    create_secret(
        kube_api,
        namespace,
        SILENT_DB,
        {
            "host": "127.0.0.1",
            "port": str(silent.port),
            "username": "postgres",
            "password": "silent-password-1f2e",
            "database": "d",
        },
    )
    hung = dataclasses.replace(
        steps,
        postgres=PostgresActivities(kube_api, quick),
        driver=steps.driver.model_copy(update={"source_secret": SILENT_DB}),
    )

    with pytest.raises(DatabaseUnreachable) as raised:
        hung.freeze()

    message = str(raised.value)
    assert message.startswith(f"could not connect to database 'd' on 127.0.0.1:{silent.port}")
    assert "in 2 attempts" in message
    assert "(each attempt waits at most 2s for the server's answer)" in message
    assert "silent-password-1f2e" not in message


@pytest.mark.timeout(120)
def test_migrate_heartbeats_while_it_tries_to_reach_a_target_that_never_answers(
    steps: Steps,
    silent: SilentServer,
    quick: DataActivitySettings,
    kube_api: k8s.ApiClient,
    namespace: str,
    heartbeats: list[dict[str, Any]],
) -> None:
    """Its tries to connect can outlast the heartbeat timeout: without heartbeats then, Temporal would take the
    attempt for dead and start another while it went on."""
    create_secret(
        kube_api,
        namespace,
        SILENT_DB,
        {"host": "127.0.0.1", "port": str(silent.port), "username": "postgres", "password": "p", "database": "d"},
    )
    hung = dataclasses.replace(
        steps,
        postgres=PostgresActivities(kube_api, dataclasses.replace(quick, heartbeat_interval=0.2)),
        driver=steps.driver.model_copy(update={"target_secret": SILENT_DB}),
    )
    artifact = SnapshotResult(bucket=steps.snapshot_spec.bucket, key=steps.key, sha256="ab" * 32, size_bytes=1)

    with pytest.raises(DatabaseUnreachable):
        hung.migrate(artifact)

    assert len(heartbeats) >= 5, heartbeats


@pytest.mark.timeout(120)
def test_pg_dump_against_a_database_that_never_answers_gives_up_after_its_connect_timeout(
    stack: StackInfo, bucket: str, silent: SilentServer, quick: DataActivitySettings
) -> None:
    """pg_dump gets the same bounded waits, through its connection string."""
    db = DatabaseConnection("127.0.0.1", silent.port, "postgres", "silent-password-1f2e", "d", secret="test/silent")
    s3 = stack.s3_client()

    def dump() -> None:
        with Heartbeats(quick.heartbeat_interval) as heartbeats:
            dumping.dump_to_s3(db, quick, s3, bucket, "silent.dump", heartbeats, estimate=0)

    with pytest.raises(RuntimeError, match=r"could not dump .*pg_dump exited with code 1: .*timeout expired"):
        ActivityEnvironment().run(dump)

    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


LONG_QUERY = "select pg_sleep(600) -- the test's long query"


def _backend_running(databases: Databases, query: str) -> int | None:
    """The process ID of the session running `query` on the source, if one is."""
    with connect_as_superuser(databases.source) as conn:
        row = conn.execute(
            "select pid from pg_stat_activity where query = %s and state = 'active'", (query,)
        ).fetchone()
    return None if row is None else int(row[0])


@pytest.mark.timeout(180)
def test_a_cancelled_activity_whose_database_stopped_answering_in_the_middle_of_a_query_is_released(
    databases: Databases, data_settings: DataActivitySettings
) -> None:
    """Without its session's stop, the activity's thread, its worker slot and its session stayed blocked for ever
    after the cancellation (or the start-to-close timeout, which the SDK turns into one): nothing else ends the call."""
    source = databases.source
    db = DatabaseConnection(source.host, source.port, source.user, source.password, source.database, secret="t/s")
    env = ActivityEnvironment()
    ended: list[BaseException] = []

    @activity.defn(no_thread_cancel_exception=True)  # as ferry's: only the stops reach the work
    def work() -> None:
        with Heartbeats(0.2), connect(db, data_settings) as conn:
            conn.execute(LONG_QUERY)

    def running_activity() -> None:
        try:
            env.run(work)
        except BaseException as error:  # noqa: BLE001 - what the activity raised, for the assertions
            ended.append(error)

    running = threading.Thread(target=running_activity, name="activity", daemon=True)
    running.start()
    found: list[int] = []

    def query_running() -> bool:
        pid = _backend_running(databases, LONG_QUERY)
        found.extend([] if pid is None else [pid])
        return pid is not None

    eventually("the query to run", query_running)
    backend = found[-1]
    try:
        with stopped(backend):
            env.cancel()
            running.join(60)
    finally:
        if running.is_alive():  # a test that failed leaves no query running for ten minutes
            with connect_as_superuser(source) as conn:
                conn.execute("select pg_terminate_backend(%s)", (backend,))

    assert not running.is_alive(), "the activity's thread is still blocked on its query"
    assert [type(error) for error in ended] == [CancelledError], ended
    eventually("the stopped session to end", lambda: _backend_running(databases, LONG_QUERY) is None)
