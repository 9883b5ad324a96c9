"""A restore whose one transaction needs more locks than the target's lock table holds fails for good at once, saying
which setting to raise: another attempt, during the write downtime, would fail the same way.

The target here is a PostgreSQL 18 instance of its own with a small lock table
(max_locks_per_transaction=10, 20 connections), so a few hundred tables exceed it, as some
thousands do with a server's defaults.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from kubernetes import client as k8s

from devstack.stack import postgres_home
from devstack.stack.install import Binaries
from devstack.stack.postgres import PostgresEndpoint, PostgresInstance
from devstack.stack.readiness import PortBook
from devstack.stack.stack import START_TIMEOUT
from ferry.api.errors import NON_RETRYABLE_TYPES, InvalidSpec
from tests.conftest import make_state_dir, remove_state_dir
from tests.end_to_end import TARGET_SECRET, Databases
from tests.postgres.conftest import Steps, create_secret
from tests.postgres.data import connect, connection_of

SMALL_LOCK_TABLE = ("max_locks_per_transaction=10", "max_connections=20")
TABLES = 600


@pytest.fixture(scope="module")
def small_target(binaries: Binaries) -> Iterator[PostgresEndpoint]:
    folder = make_state_dir("ferry-locks-")
    user = postgres_home.ServiceUser.when_root()
    home = postgres_home.choose(folder / "postgres", ["locks"], user)
    instance = PostgresInstance(
        "locks", binaries.target_postgres_bindir, folder / "postgres" / "locks", PortBook(folder / "ports.json"),
        folder / "logs", home, user, settings=SMALL_LOCK_TABLE,
    )  # fmt: skip
    process = instance.start()
    try:
        instance.wait(START_TIMEOUT)
        yield instance.endpoint
    finally:
        process.stop()
    remove_state_dir(folder)


@pytest.fixture
def target_database(small_target: PostgresEndpoint) -> Iterator[PostgresEndpoint]:
    name = f"locks_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(small_target.dsn, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    yield dataclasses.replace(small_target, database=name)
    with psycopg.connect(small_target.dsn, autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')


def test_a_restore_the_targets_lock_table_cannot_hold_fails_for_good_naming_the_setting(
    steps: Steps, databases: Databases, target_database: PostgresEndpoint, kube_api: k8s.ApiClient, namespace: str
) -> None:
    with connect(databases.source) as conn:
        conn.execute("create schema many")
        conn.execute("; ".join(f"create table many.t{n} (id int primary key, body text)" for n in range(TABLES)))
    k8s.CoreV1Api(kube_api).delete_namespaced_secret(TARGET_SECRET, namespace)
    create_secret(kube_api, namespace, TARGET_SECRET, connection_of(target_database))
    steps.freeze()

    with pytest.raises(InvalidSpec, match="Raise max_locks_per_transaction on that server") as failed:
        steps.snapshot(restore=True)

    assert "out of shared memory" in str(failed.value)
    assert "InvalidSpec" in NON_RETRYABLE_TYPES, "the step fails at once: no attempt in the downtime would pass"
    with connect(target_database) as conn:
        row = conn.execute("select count(*) from pg_tables where schemaname = 'many'").fetchone()
    assert row == (0,), "the restore's one transaction left nothing"
    steps.undo_freeze()
