"""Mode Online's watch over the replication while the saga waits before the freeze, against the stack's PostgreSQL.

After replicate has returned, the saga may wait days for an approval; the watch
(activities/postgres/watching.py) runs beside that wait. A replication that breaks then
must fail it, so the run rolls back and the slot stops keeping the source's WAL; a
healthy one must keep it watching until the saga cancels it, and so must a moment's
trouble, however long the source has written nothing. Stalls count after 10 s here
instead of a minute (longer than the 5 s a failing apply worker waits before it starts
again, so its failures are counted): the tests assert what ends the watch, not how long
it took.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities.postgres.watching import ReplicationWatch
from activities.settings import DataActivitySettings
from devstack.stack.readiness import LOOPBACK
from ferry.api.errors import ReplicationBroken
from ferry.api.saga import WatchReplicationInput
from tests.cluster import eventually, stopped
from tests.end_to_end import Databases
from tests.postgres.conftest import create_secret
from tests.postgres.data import connect, create_shop
from tests.postgres.online import NOTHING, OnlineSteps, leftovers

pytestmark = pytest.mark.timeout(180)

LIMIT = 10.0
"""The stall limit of these tests."""
RELAYED_TARGET = "relayed-target-db"


@pytest.fixture
def watch(kube_api: k8s.ApiClient, data_settings: DataActivitySettings) -> ReplicationWatch:
    settings = dataclasses.replace(data_settings, replication_poll_interval=0.2, replication_stall_timeout=LIMIT)
    return ReplicationWatch(kube_api, settings)


class Relay:
    """A fake, standing between ferry and the target: a TCP relay on loopback that the test cuts and restores.

    Cut, it ends every connection through it and closes each new one at once, as ferry
    sees a target whose Pod restarts; the replication (the target's server connecting to
    the source) does not go through it.
    """

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="relay", daemon=True).start()

    def cut(self) -> None:
        self._cut.set()
        self._end_all()

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self._listener.close()
        self._end_all()

    def _end_all(self) -> None:
        with self._lock:
            for end in self._open:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self._cut.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open.update((client, server))
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
        with self._lock:
            self._open.discard(source)
        source.close()


@pytest.fixture
def relay(databases: Databases) -> Iterator[Relay]:
    relaying = Relay(databases.target.host, databases.target.port)
    yield relaying
    relaying.close()


class Looks:
    """The watch's heartbeats (one per look, and the watchdog's between), with when each came."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, dict[str, Any]]] = []

    def record(self, *details: Any) -> None:
        self.seen.append((time.monotonic(), details[0] if details else {}))

    def still_for(self) -> float:
        """Seconds the slot's confirmed position has stood still, as the watch has seen it."""
        since, confirmed = None, None
        for at, details in list(self.seen):
            if "confirmed_lsn" in details and details["confirmed_lsn"] != confirmed:
                since, confirmed = at, details["confirmed_lsn"]
        return 0.0 if since is None else time.monotonic() - since

    def after(self, moment: float) -> list[dict[str, Any]]:
        return [details for at, details in list(self.seen) if at > moment]


def test_a_column_added_on_the_source_and_written_after_replicate_fails_the_watch_with_replication_broken(
    online: OnlineSteps,
    databases: Databases,
    watch: ReplicationWatch,
    activity_env: ActivityEnvironment,
    heartbeats: list[dict[str, Any]],
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    online.replicate()
    with connect(databases.source) as conn:  # an application deploy while the run awaits approval
        conn.execute("alter table shop.customers add column nickname text")
        conn.execute("insert into shop.customers (email, created_at, nickname) values ('x@example.com', now(), 'x')")

    with pytest.raises(ReplicationBroken) as broken:
        activity_env.run(watch.watch_replication, WatchReplicationInput(ref=online.ref, driver=online.driver))

    message = str(broken.value)
    assert "broke while the migration waited before the freeze" in message
    assert "schema change on the source" in message
    assert f"replication slot {online.name} keeps every change" in message
    assert "Roll back" in message
    assert any(beat.get("lag_bytes", 0) > 0 for beat in heartbeats), "the lag is reported while it watches"
    online.undo_replicate()
    assert leftovers(databases) == NOTHING


def test_a_disabled_subscription_fails_the_watch_naming_it(
    online: OnlineSteps, databases: Databases, watch: ReplicationWatch, activity_env: ActivityEnvironment
) -> None:
    create_shop(databases.source, customers=10, orders=10)
    online.replicate()
    with connect(databases.target) as conn:
        conn.execute(f"alter subscription {online.name} disable")
    with connect(databases.source) as conn:
        conn.execute("insert into shop.customers (email, created_at) values ('y@example.com', now())")

    with pytest.raises(ReplicationBroken) as broken:
        activity_env.run(watch.watch_replication, WatchReplicationInput(ref=online.ref, driver=online.driver))

    assert f"the subscription {online.name} on the target is disabled" in str(broken.value)
    online.undo_replicate()
    assert leftovers(databases) == NOTHING


def test_a_healthy_replication_is_watched_until_the_watch_is_cancelled(
    online: OnlineSteps, databases: Databases, watch: ReplicationWatch
) -> None:
    create_shop(databases.source, customers=10, orders=10)
    online.replicate()
    cancelling = ActivityEnvironment()
    ended: list[BaseException] = []

    def watching() -> None:
        try:
            cancelling.run(watch.watch_replication, WatchReplicationInput(ref=online.ref, driver=online.driver))
        except BaseException as error:  # noqa: BLE001 - cancelled, as the saga cancels it once the wait ends
            ended.append(error)

    running = threading.Thread(target=watching)
    running.start()
    for number in range(60):  # writes go on, and are applied, for longer than the stall limit
        with connect(databases.source) as conn:
            conn.execute("insert into shop.customers (email, created_at) values (%s, now())", (f"w{number}@x",))
        time.sleep(0.25)
    assert running.is_alive(), f"the watch ended on a healthy replication: {ended}"
    cancelling.cancel()
    running.join(30)

    assert [type(error) for error in ended] == [CancelledError]
    online.undo_replicate()
    assert leftovers(databases) == NOTHING


def test_a_target_unreachable_for_a_moment_while_the_source_writes_nothing_keeps_the_watch_watching(
    online: OnlineSteps,
    databases: Databases,
    watch: ReplicationWatch,
    relay: Relay,
    kube_api: k8s.ApiClient,
    namespace: str,
) -> None:
    """An idle source writes no WAL, so the slot's confirmed position stands still for as long as the approval takes.
    The target's Pod restarting then is a moment's trouble, not a broken replication that needs rolling back."""
    create_shop(databases.source, customers=10, orders=10)
    online.replicate()
    target = databases.target
    create_secret(
        kube_api, namespace, RELAYED_TARGET,
        {"host": LOOPBACK, "port": str(relay.port), "username": target.user, "password": target.password,
         "database": target.database},
    )  # fmt: skip
    driver = online.driver.model_copy(update={"target_secret": RELAYED_TARGET})
    looks = Looks()
    watching_env = ActivityEnvironment()
    watching_env.on_heartbeat = looks.record
    ended: list[BaseException] = []

    def watching() -> None:
        try:
            watching_env.run(watch.watch_replication, WatchReplicationInput(ref=online.ref, driver=driver))
        except BaseException as error:  # noqa: BLE001 - cancelled, as the saga cancels it once the wait ends
            ended.append(error)

    running = threading.Thread(target=watching)
    running.start()
    for _ in range(3):  # again if the source wrote something (autovacuum, a checkpoint) as the target went away
        eventually(
            "the watch to see the slot stand still for longer than the stall limit",
            lambda: looks.still_for() > LIMIT + 1,
        )
        still = looks.seen[-1][1]["confirmed_lsn"]
        cut = time.monotonic()
        relay.cut()
        eventually(
            "a look to find the target unreachable",
            lambda cut=cut: any("cannot reach the target" in (b.get("trouble") or "") for b in looks.after(cut)),
        )
        relay.restore()
        restored = time.monotonic()
        unreachable = next(
            beat for beat in looks.after(cut) if "cannot reach the target" in (beat.get("trouble") or "")
        )
        if unreachable["confirmed_lsn"] == still:
            break  # the trouble came while the slot had stood still for longer than the limit
    assert unreachable["confirmed_lsn"] == still, "the slot stood still when the target was unreachable"
    eventually(
        "the watch to go on looking for longer than the stall limit after the target came back (or to end)",
        lambda: not running.is_alive() or bool(looks.after(restored + LIMIT + 1)),
    )

    assert running.is_alive(), f"the watch ended after a moment's trouble: {ended}"
    assert looks.seen[-1][1].get("trouble") is None, "it finds nothing wrong"
    watching_env.cancel()
    running.join(30)
    assert [type(error) for error in ended] == [CancelledError]
    online.undo_replicate()
    assert leftovers(databases) == NOTHING


def _watch_sessions_on(databases: Databases) -> set[int]:
    """The process IDs of the watch's sessions on the source (their last query read the slot's lag)."""
    with connect(databases.source) as conn:
        rows = conn.execute(
            "select pid from pg_stat_activity where datname = current_database() and application_name = 'ferry' "
            "and backend_type = 'client backend' and query like '%pg_current_wal_lsn()%'"
        ).fetchall()
    return {int(pid) for (pid,) in rows}


def test_a_source_that_stops_answering_in_the_middle_of_a_look_fails_that_look_and_the_watch_goes_on(
    online: OnlineSteps, databases: Databases, kube_api: k8s.ApiClient, data_settings: DataActivitySettings
) -> None:
    """A server that stops answering (a stopped process, a frozen cgroup, storage that hangs) still answers TCP
    keepalives: a look without a bound blocked on it, and the watch heartbeated as if all were well for as long as its
    attempt's timeout (a day) while the slot kept the source's WAL. The look fails as one that cannot reach the source
    does, and the next one, on a session of its own, looks again. The bound is a second here, not 30."""
    create_shop(databases.source, customers=10, orders=10)
    online.replicate()
    settings = dataclasses.replace(data_settings, replication_poll_interval=0.2, replication_stall_timeout=LIMIT)
    watch = ReplicationWatch(kube_api, settings, look_timeout=1.0)
    looks = Looks()
    watching_env = ActivityEnvironment()
    watching_env.on_heartbeat = looks.record
    ended: list[BaseException] = []

    def watching() -> None:
        try:
            watching_env.run(watch.watch_replication, WatchReplicationInput(ref=online.ref, driver=online.driver))
        except BaseException as error:  # noqa: BLE001 - cancelled, as the saga cancels it once the wait ends
            ended.append(error)

    running = threading.Thread(target=watching, daemon=True)
    running.start()
    eventually("the watch to look at the source's slot", lambda: len(_watch_sessions_on(databases)) == 1)
    (silent,) = _watch_sessions_on(databases)
    with stopped(silent):
        since = time.monotonic()
        eventually(
            "a look to find that the source does not answer",
            lambda: any(
                "did not answer within 6s" in beat.get("source_unreachable", "") for beat in looks.after(since)
            ),
        )
        eventually(
            "a later look to read the slot again, on a session of its own",
            lambda: bool(_watch_sessions_on(databases) - {silent}),
        )

    assert running.is_alive(), f"the watch ended: {ended}"
    watching_env.cancel()
    running.join(30)
    assert [type(error) for error in ended] == [CancelledError]
    online.undo_replicate()
    assert leftovers(databases) == NOTHING
