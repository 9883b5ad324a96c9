"""pg_dump and the restoring psql get the connection and English messages in their environment, nothing of the worker's.

The worker's environment here holds what a real one does: its Temporal API key, cloud
credentials, PG* settings of its own. Each test holds the real tool on a lock in the
stack's real database, reads the environment the kernel gave the running child
(/proc/<pid>/environ), then lets it finish.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from activities.settings import DataActivitySettings
from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.processes import process_stats
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import connect

WORKER_ENVIRONMENT = {
    "FERRY_TEMPORAL_API_KEY": "temporal-api-key-5b1e",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-77c0",
    "PGSSLKEY": "/var/run/worker/own.key",
    "LC_ALL": "de_DE.UTF-8",
}
WAIT = 30.0


@pytest.fixture(autouse=True)
def worker_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in WORKER_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)


def _expected(endpoint: PostgresEndpoint, settings: DataActivitySettings) -> dict[str, str]:
    return {
        "PGHOST": endpoint.host,
        "PGPORT": str(endpoint.port),
        "PGUSER": endpoint.user,
        "PGPASSWORD": endpoint.password,
        "PGDATABASE": endpoint.database,
        "PGAPPNAME": "ferry",
        "PGCONNECT_TIMEOUT": str(settings.connect_timeout),
        "PGSSLMODE": "prefer",  # the Secret gives no ca.crt and no sslmode: libpq's own default, said out loud
        "LC_MESSAGES": "C",
    }


def _child_environment(tool: str) -> dict[str, str]:
    """The environment of this process's running child `tool`, as the kernel holds it."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        for stat in process_stats():
            if stat.command != tool or stat.parent != os.getpid():
                continue
            try:
                raw = Path(f"/proc/{stat.pid}/environ").read_bytes()
            except OSError:
                continue  # a process that ended while being read
            if raw:
                return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if entry)
        time.sleep(0.05)
    raise AssertionError(f"no {tool} child of this process ran within {WAIT:.0f}s")


def test_pg_dump_runs_with_the_connection_and_none_of_the_workers_variables(
    steps: Steps, databases: Databases, data_settings: DataActivitySettings
) -> None:
    with connect(databases.source) as conn:
        conn.execute("create table public.orders (id int primary key)")
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        with connect(databases.source) as locker, locker.transaction():
            locker.execute("lock table public.orders in access exclusive mode")  # pg_dump waits for it
            snapshot = pool.submit(steps.snapshot)
            seen = _child_environment("pg_dump")
        snapshot.result(timeout=WAIT)

    assert seen == _expected(databases.source, data_settings)


def test_psql_restoring_runs_with_the_connection_and_none_of_the_workers_variables(
    steps: Steps, databases: Databases, data_settings: DataActivitySettings
) -> None:
    """The target is PostgreSQL 18, so psql runs pg_restore's script (restore_script) and is the tool that connects;
    pg_restore, which only writes the script, gets the same environment from the same code (tools.Tool)."""
    with connect(databases.source) as conn:
        conn.execute("create table public.orders (id int primary key); insert into public.orders values (1)")
    artifact = steps.snapshot()
    migrated: concurrent.futures.Future[Any]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        with connect(databases.target) as locker, locker.transaction():
            # The restore's first table in public waits for this drop of the schema to end.
            locker.execute("drop schema public cascade")
            migrated = pool.submit(steps.migrate, artifact)
            seen = _child_environment("psql")
            raise psycopg.Rollback  # public is back, and the restore goes on
        migrated.result(timeout=WAIT)

    assert seen == _expected(databases.target, data_settings)
