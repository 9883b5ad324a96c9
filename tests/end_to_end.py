"""Fixtures for whole migrations on the session stack: databases, Secrets, a bucket, a real worker.

A test gets a fresh source and target database (one in each PostgreSQL instance of
the stack), the Secrets a Migration names for them and for S3, the source StatefulSet
and its Service in its namespace, and ferry's worker polling its own task queue.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from kubernetes import client as k8s
from pydantic import SecretStr
from temporalio.client import Client, WorkflowHandle

from activities.settings import DataActivitySettings, KubeActivitySettings
from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.stack import StackInfo
from ferry.api.migration import MigrationSpec
from ferry.api.saga import WORKFLOW_NAME, MigrationInput, MigrationRef, workflow_id
from ferry.clients import TemporalSettings
from tests import samples
from tests.cluster import create_source
from tests.conftest import Kubectl
from watcher import runner as watcher_runner
from watcher.settings import LeaseSettings, WatcherSettings
from worker import runner
from worker.settings import WorkerSettings

CLAIM_KEY = "ferry-tests-claim-key-8d1f5c0a9e2b4f7d"
"""The claim key of the workers the tests run in this process (worker_settings): they sign and check claims as
deployed workers do."""
SOURCE_SECRET = "orders-db-source"
TARGET_SECRET = "orders-db-target"
S3_SECRET = "snapshot-credentials"


@dataclasses.dataclass(frozen=True)
class Databases:
    """One test's databases: `source` in the source instance, `target` in the target instance."""

    source: PostgresEndpoint
    target: PostgresEndpoint


def _create_database(admin: PostgresEndpoint, name: str) -> PostgresEndpoint:
    with psycopg.connect(admin.dsn, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    return dataclasses.replace(admin, database=name)


def _drop_database(admin: PostgresEndpoint, name: str) -> None:
    with psycopg.connect(admin.dsn, autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')


@pytest.fixture
def databases(stack: StackInfo) -> Iterator[Databases]:
    name = f"orders_{uuid.uuid4().hex[:10]}"
    source_admin, target_admin = stack.postgres["source"], stack.postgres["target"]
    dbs = Databases(source=_create_database(source_admin, name), target=_create_database(target_admin, name))
    yield dbs
    _drop_database(source_admin, name)
    _drop_database(target_admin, name)


def _secret(name: str, data: dict[str, str]) -> k8s.V1Secret:
    return k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name), string_data=data)


def _connection(endpoint: PostgresEndpoint) -> dict[str, str]:
    return {
        "host": endpoint.host,
        "port": str(endpoint.port),
        "username": endpoint.user,
        "password": endpoint.password,
        "database": endpoint.database,
    }


@pytest.fixture
def bucket(stack: StackInfo) -> str:
    name = f"ferry-{uuid.uuid4().hex[:12]}"
    stack.s3_client().create_bucket(Bucket=name)
    return name


@pytest.fixture
def migration_secrets(kube_api: k8s.ApiClient, namespace: str, stack: StackInfo, databases: Databases) -> None:
    """The Secrets a Migration names: both database connections and the S3 credentials."""
    core = k8s.CoreV1Api(kube_api)
    core.create_namespaced_secret(namespace, _secret(SOURCE_SECRET, _connection(databases.source)))
    core.create_namespaced_secret(namespace, _secret(TARGET_SECRET, _connection(databases.target)))
    assert stack.s3_access_key is not None
    assert stack.s3_secret_key is not None
    credentials = {"accessKeyId": stack.s3_access_key, "secretAccessKey": stack.s3_secret_key}
    core.create_namespaced_secret(namespace, _secret(S3_SECRET, credentials))


@pytest.fixture
def source_workload(kube_api: k8s.ApiClient, namespace: str) -> str:
    """The source StatefulSet orders-db and its stable Service, Ready on the kwok node."""
    return create_source(kube_api, namespace)


def migration_manifest(stack: StackInfo, bucket: str, name: str = "orders-db-to-16", **spec: Any) -> dict[str, Any]:
    """A Migration of orders-db into orders-db-16 through the test's bucket on the stack's S3."""
    snapshot = {
        "bucket": bucket,
        "endpoint": stack.s3_endpoint,
        "allowInsecureEndpoint": True,  # the stack's S3 is plain http, on loopback
        "region": stack.s3_region,
        "credentialsSecret": S3_SECRET,
    }
    spec.setdefault("snapshot", snapshot)
    spec.setdefault("driver", {"type": "postgresql", "sourceSecret": SOURCE_SECRET, "targetSecret": TARGET_SECRET})
    return samples.migration(name, **spec)


def apply_migration(kubectl: Kubectl, namespace: str, manifest: dict[str, Any]) -> MigrationRef:
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
    name = manifest["metadata"]["name"]
    uid = kubectl("get", "migration", name, "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout
    return MigrationRef(namespace=namespace, name=name, uid=uid)


async def start_migration(
    client: Client, ref: MigrationRef, manifest: dict[str, Any], task_queue: str
) -> WorkflowHandle[Any, Any]:
    """Starts the saga for an applied Migration directly, as the watcher would."""
    spec = MigrationSpec.model_validate(manifest["spec"])
    return await client.start_workflow(
        WORKFLOW_NAME,
        MigrationInput(ref=ref, generation=1, spec=spec),
        id=workflow_id(ref),
        task_queue=task_queue,
    )


def readable_history(history_json: str) -> str:
    """A history as JSON, with every payload's data decoded: the JSON form keeps payloads in base64."""
    decoded: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "metadata" in node and isinstance(node.get("data"), str):
                decoded.append(base64.b64decode(node["data"]).decode(errors="replace"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.loads(history_json))
    return "\n".join([history_json, *decoded])


def worker_settings(stack: StackInfo, task_queue: str) -> WorkerSettings:
    assert stack.temporal_address is not None
    return WorkerSettings(
        temporal=TemporalSettings(address=stack.temporal_address, namespace=stack.temporal_namespace or "default"),
        task_queue=task_queue,
        kubeconfig=stack.kubeconfig,
        kube_activities=KubeActivitySettings(poll_interval=0.2, temporal_ui_url=stack.temporal_ui_url),
        data_activities=DataActivitySettings(postgres_bindir=stack.postgres_bindir),
        claim_key=SecretStr(CLAIM_KEY),
    )


@contextlib.asynccontextmanager
async def running_worker(settings: WorkerSettings) -> AsyncIterator[None]:
    """ferry's real worker, in this process, with `settings`, until the block ends; then a graceful stop."""
    stop = asyncio.Event()
    running = asyncio.create_task(runner.run(settings, stop=stop))
    try:
        yield
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(running, timeout=60)


@pytest.fixture
async def ferry_worker(stack: StackInfo, task_queue: str) -> AsyncIterator[WorkerSettings]:
    """ferry's real worker, in this process, polling the test's task queue."""
    settings = worker_settings(stack, task_queue)
    async with running_worker(settings):
        yield settings


@dataclasses.dataclass(frozen=True)
class Ready:
    """A namespace set for whole Migrations: its Secrets, the source workload and a worker on the test's queue."""

    stack: StackInfo
    bucket: str
    kubectl: Kubectl
    namespace: str
    temporal_client: Client
    task_queue: str

    def manifest(self, **spec: Any) -> dict[str, Any]:
        """A Migration of orders-db through the test's bucket (see migration_manifest)."""
        return migration_manifest(self.stack, self.bucket, **spec)

    def apply(self, manifest: dict[str, Any]) -> MigrationRef:
        return apply_migration(self.kubectl, self.namespace, manifest)

    async def start(self, ref: MigrationRef, manifest: dict[str, Any]) -> WorkflowHandle[Any, Any]:
        """Starts the saga of an applied Migration, as the watcher would."""
        return await start_migration(self.temporal_client, ref, manifest, self.task_queue)

    def migration(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            self.kubectl("get", "migration", name, "-n", self.namespace, "-o", "json").stdout
        )
        return found

    def status(self, name: str) -> dict[str, Any]:
        """The Migration's status; empty before its first write."""
        return dict(self.migration(name).get("status") or {})

    def events(self) -> str:
        """The namespace's Events, as JSON."""
        return self.kubectl("get", "events", "-n", self.namespace, "-o", "json").stdout


@pytest.fixture
def ready(
    stack: StackInfo,
    bucket: str,
    migration_secrets: None,
    source_workload: str,
    migration_crd: str,
    ferry_worker: WorkerSettings,
    kubectl: Kubectl,
    namespace: str,
    temporal_client: Client,
    task_queue: str,
) -> Ready:
    return Ready(stack, bucket, kubectl, namespace, temporal_client, task_queue)


def watcher_settings(stack: StackInfo, task_queue: str, namespace: str, **changes: Any) -> WatcherSettings:
    assert stack.temporal_address is not None
    settings = WatcherSettings(
        temporal=TemporalSettings(address=stack.temporal_address),
        task_queue=task_queue,
        kubeconfig=stack.kubeconfig,
        namespaces=(namespace,),
        lease=LeaseSettings(name="ferry-watcher", namespace=namespace, duration=4, renew_deadline=3, retry_period=0.5),
        resync_interval=2,
        lost_runs_interval=2,
        deletion_timeout=120,
        record_start_after=1,
    )
    return dataclasses.replace(settings, **changes)


@pytest.fixture
async def running_watcher(stack: StackInfo, task_queue: str, namespace: str) -> AsyncIterator[WatcherSettings]:
    """ferry's watcher in this process, watching the test's namespace, starting workflows on its task queue."""
    settings = watcher_settings(stack, task_queue, namespace)
    stop = asyncio.Event()
    task = asyncio.create_task(watcher_runner.run(settings, stop=stop))
    yield settings
    stop.set()
    await asyncio.wait_for(task, timeout=30)


async def eventually(
    what: str, check: Callable[[], Awaitable[bool]], within: float = 60, seen: Callable[[], str] | None = None
) -> None:
    """Waits until `check` holds; at the deadline fails naming `what` and, when given, what was `seen` last."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            last = f"; last seen: {seen()}" if seen else ""
            raise AssertionError(f"timed out after {within:.0f}s waiting for {what}{last}")
        await asyncio.sleep(0.2)
