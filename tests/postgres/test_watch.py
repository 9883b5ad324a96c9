"""Mode Online's watch over the replication while the saga waits before the freeze, against the stack's PostgreSQL.

After replicate has returned, the saga may wait days for an approval; the watch
(activities/postgres/watching.py) runs beside that wait. A replication that breaks then
must fail it, so the run rolls back and the slot stops keeping the source's WAL; a
healthy one must keep it watching until the saga cancels it. Stalls count after 10 s
here instead of a minute (longer than the 5 s a failing apply worker waits before it
starts again, so its failures are counted): the tests assert what ends the watch, not
how long it took.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities.postgres.watching import ReplicationWatch
from activities.settings import DataActivitySettings
from ferry.api.errors import ReplicationBroken
from ferry.api.saga import WatchReplicationInput
from tests.end_to_end import Databases
from tests.postgres.data import connect, create_shop
from tests.postgres.online import NOTHING, OnlineSteps, leftovers

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def watch(kube_api: k8s.ApiClient, data_settings: DataActivitySettings) -> ReplicationWatch:
    settings = dataclasses.replace(data_settings, replication_poll_interval=0.2, replication_stall_timeout=10.0)
    return ReplicationWatch(kube_api, settings)


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
