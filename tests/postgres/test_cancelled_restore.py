"""A cancelled pg_restore --jobs stops whole: none of its processes goes on, and none of its rows lands in the target.

pg_restore --jobs (the rest of a snapshot taken in streams: its rows, indexes and constraints,
in several sessions) forks a worker per job, each with a session of its own. A cancellation
used to kill the leader alone: its workers went on, waiting for the lock a client held, kept
its stderr open so that the activity never got past the restore, and once the lock was free
they committed their rows into the target of the cancelled restore.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from kubernetes import client as k8s
from temporalio import activity
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities.heartbeats import Heartbeats
from activities.postgres import streams
from activities.secrets import DatabaseConnection, SecretReader
from activities.settings import DataActivitySettings
from devstack.stack.install import Binaries
from devstack.stack.processes import ProcessStat, process_stats
from tests.cluster import eventually
from tests.end_to_end import TARGET_SECRET, Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import connect, create_shop

LOCKED = "shop.customers, shop.orders, audit.log"


@activity.defn(no_thread_cancel_exception=True)  # as the driver's activities: a cancellation reaches it by its stops
def _restore_the_rest(db: DatabaseConnection, settings: DataActivitySettings, archive: Path) -> None:
    """What a snapshot in streams restores once every stream committed: the rows and what is built on them."""
    with Heartbeats(settings.heartbeat_interval) as heartbeats:
        streams.restore_sections(
            db, settings, archive, heartbeats, "the test's archive", "--section=data", "--section=post-data", "--jobs=2"
        )


def _ferry_sessions_waiting_for_a_lock(databases: Databases) -> int:
    with connect(databases.target) as conn:
        row = conn.execute(
            "select count(*) from pg_stat_activity where datname = current_database() and application_name = 'ferry' "
            "and wait_event_type = 'Lock'"
        ).fetchone()
    return int(row[0]) if row else 0


def _ferry_sessions(databases: Databases) -> int:
    with connect(databases.target) as conn:
        row = conn.execute(
            "select count(*) from pg_stat_activity where datname = current_database() and application_name = 'ferry'"
        ).fetchone()
    return int(row[0]) if row else 0


def _pg_restore_and_its_workers() -> set[tuple[int, int]]:
    """The pg_restore this process started (the activity runs here, in ActivityEnvironment) and the workers it forked,
    each by its pid and start time (a pid may go to another process later)."""
    stats = list(process_stats())
    leaders = {stat.pid for stat in stats if stat.parent == os.getpid() and stat.command == "pg_restore"}
    return {(stat.pid, stat.start_time) for stat in stats if stat.pid in leaders or stat.parent in leaders}


def _alive(processes: set[tuple[int, int]]) -> list[int]:
    """Those of `processes` still running (not exited, whether reaped or not)."""
    alive = []
    for pid, started in processes:
        stat = ProcessStat.read(pid)
        if stat is not None and stat.start_time == started and stat.state != "Z":
            alive.append(pid)
    return alive


@pytest.mark.timeout(300)
def test_a_cancelled_parallel_restore_leaves_no_process_running_and_no_row_in_the_target(
    steps: Steps,
    databases: Databases,
    kube_api: k8s.ApiClient,
    data_settings: DataActivitySettings,
    binaries: Binaries,
    tmp_path: Path,
) -> None:
    create_shop(databases.source, customers=2_000, orders=20_000)
    archive = tmp_path / "shop.dump"
    subprocess.run(
        [str(binaries.postgres_bindir / "pg_dump"), "--format=custom", f"--file={archive}", databases.source.dsn],
        check=True,
        capture_output=True,
    )
    pre_data = ["--section=pre-data", f"--dbname={databases.target.dsn}", str(archive)]
    subprocess.run([str(binaries.postgres_bindir / "pg_restore"), *pre_data], check=True, capture_output=True)
    target = SecretReader(kube_api).database(steps.ref.namespace, TARGET_SECRET, "spec.driver.targetSecret")
    env = ActivityEnvironment()
    ended: dict[str, BaseException | None] = {}

    def restore() -> None:
        try:
            env.run(_restore_the_rest, target, data_settings, archive)
            ended["error"] = None
        except BaseException as error:  # noqa: BLE001 - handed to the test
            ended["error"] = error

    holder = connect(databases.target)  # a client's transaction, holding every table the rows go to
    holder.execute("begin")
    holder.execute(f"lock table {LOCKED} in access exclusive mode")
    restoring = threading.Thread(target=restore, name="restore")
    restore_processes: set[tuple[int, int]] = set()
    try:
        restoring.start()
        eventually("pg_restore's two workers to wait for the client's lock", lambda: (
            _ferry_sessions_waiting_for_a_lock(databases) >= 2
        ))  # fmt: skip
        restore_processes = _pg_restore_and_its_workers()
        assert len(_alive(restore_processes)) == 3, "pg_restore and its two workers run"

        env.cancel()
        restoring.join(60)

        assert not restoring.is_alive(), "the cancelled activity did not end: pg_restore's workers still held it"
        assert isinstance(ended["error"], CancelledError), ended
        assert _alive(restore_processes) == [], "no process of the cancelled pg_restore is left"
    finally:
        holder.execute("rollback")  # the lock is free: a worker left over would now load its rows
        holder.close()
        restoring.join(60)
        for pid in _alive(restore_processes):  # none, unless the test failed: then none is left to the next test
            os.kill(pid, signal.SIGKILL)

    eventually("the cancelled restore's sessions to end", lambda: _ferry_sessions(databases) == 0)
    with connect(databases.target) as conn:
        rows = conn.execute(
            "select (select count(*) from shop.customers) + (select count(*) from shop.orders) "
            "+ (select count(*) from audit.log)"
        ).fetchone()
    assert rows == (0,), "nothing of the cancelled restore was committed"
