"""Fixtures of the PostgreSQL driver's tests: its activities wired to the session stack, and the saga's steps.

Activities run through Temporal's ActivityEnvironment (an activity context without a
worker) against the stack's real PostgreSQL instances, S3 server and API server; the
connections come from real Secrets, as in a Migration. Whole migrations run through
the real worker and workflow instead (see test_whole_migration).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from kubernetes import client as k8s
from temporalio.testing import ActivityEnvironment

from activities.postgres.activities import PostgresActivities
from activities.postgres.replicating import ReplicationActivities
from activities.settings import MIB, DataActivitySettings
from activities.snapshots import SnapshotStoreActivities
from devstack.stack.install import Binaries
from devstack.stack.stack import StackInfo
from ferry.api.errors import PrecheckFailed
from ferry.api.migration import DriverMode, DriverSpec, SnapshotSpec
from ferry.api.saga import (
    CheckFrozenInput,
    CheckFrozenResult,
    CheckUnwrittenInput,
    CheckUnwrittenResult,
    FenceMark,
    FreezeInput,
    FreezeResult,
    MigrateInput,
    MigrateResult,
    MigrationRef,
    PrecheckInput,
    PrecheckResult,
    SnapshotInput,
    SnapshotResult,
    UndoFreezeInput,
    UndoMigrateInput,
    UndoMigrateResult,
    UndoSnapshotInput,
    UndoSnapshotResult,
    VerifyInput,
    VerifyResult,
    snapshot_key,
)
from tests import samples
from tests.conftest import Kubectl
from tests.end_to_end import S3_SECRET, SOURCE_SECRET, TARGET_SECRET, Databases
from tests.postgres.data import create_shop
from tests.postgres.online import OnlineSteps


@pytest.fixture
def data_settings(binaries: Binaries) -> DataActivitySettings:
    """Small parts and quick connection retries, so outages and multipart uploads show in small databases."""
    return DataActivitySettings(
        postgres_bindir=binaries.postgres_bindir,
        connect_attempts=2,
        connect_retry_delay=0.2,
        connect_timeout=5,
        part_size=5 * MIB,
        upload_concurrency=2,
        heartbeat_interval=0.5,
    )


@pytest.fixture
def heartbeats() -> list[dict[str, Any]]:
    """The details of every heartbeat the activities under test sent, in order."""
    return []


@pytest.fixture
def activity_env(heartbeats: list[dict[str, Any]]) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: heartbeats.append(details[0] if details else {})
    return env


@pytest.fixture
def ref(namespace: str) -> MigrationRef:
    return MigrationRef(namespace=namespace, name="orders-db-to-16", uid=str(uuid.uuid4()))


@pytest.fixture
def applied_ref(kubectl: Kubectl, migration_crd: str, namespace: str) -> MigrationRef:
    """A Migration created in the cluster, for the tests of the precheck (they take `ref` from here): after marking the
    Secrets a Migration names, the precheck reads it, and lets them go again if it does not exist (SecretProtection)."""
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(samples.migration("orders-db-to-16")))
    uid = kubectl("get", "migration", "orders-db-to-16", "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout
    return MigrationRef(namespace=namespace, name="orders-db-to-16", uid=uid)


@pytest.fixture
def snapshot_spec(stack: StackInfo, bucket: str) -> SnapshotSpec:
    return SnapshotSpec(
        bucket=bucket,
        endpoint=stack.s3_endpoint,
        allow_insecure_endpoint=True,  # the stack's S3 is plain http, on loopback
        region=stack.s3_region or "us-east-1",
        credentials_secret=S3_SECRET,
    )


@pytest.fixture
def postgres(
    kube_api: k8s.ApiClient, data_settings: DataActivitySettings, migration_secrets: None
) -> PostgresActivities:
    return PostgresActivities(kube_api, data_settings)


@pytest.fixture
def snapshots(
    kube_api: k8s.ApiClient, data_settings: DataActivitySettings, migration_secrets: None
) -> SnapshotStoreActivities:
    return SnapshotStoreActivities(kube_api, data_settings)


@dataclasses.dataclass
class Steps:
    """The driver's steps for one Migration, called the way the saga calls them."""

    env: ActivityEnvironment
    postgres: PostgresActivities
    ref: MigrationRef
    driver: DriverSpec
    snapshot_spec: SnapshotSpec

    @property
    def key(self) -> str:
        return snapshot_key(self.ref, self.snapshot_spec)

    def precheck(self, **changes: Any) -> PrecheckResult:
        call = PrecheckInput(ref=self.ref, driver=self.driver, snapshot=self.snapshot_spec, **changes)
        return self.env.run(self.postgres.precheck, call)

    def freeze(self) -> FreezeResult:
        return self.env.run(self.postgres.freeze, FreezeInput(ref=self.ref, driver=self.driver))

    def undo_freeze(self, previous: str | None = None) -> None:
        """Undoes the freeze; without `previous`, as the saga does when it has no result of the freeze."""
        undo = UndoFreezeInput(ref=self.ref, driver=self.driver, previous_setting=previous)
        self.env.run(self.postgres.undo_freeze, undo)

    def check_frozen(self, fence: FenceMark | None, before: str = "the test's look") -> CheckFrozenResult:
        """The check of the frozen source; before switch-traffic (`before`), it also seals verify's mark on the
        target, and fails where there is none; before scale-down-old, it fails where the target (reachable) lacks the
        mark. Before anything else (the default), the source alone."""
        assert fence is not None, "the freeze returned its mark"
        call = CheckFrozenInput(ref=self.ref, driver=self.driver, fence=fence, before=before)
        return self.env.run(self.postgres.check_frozen, call)

    def snapshot(self, *, restore: bool = False) -> SnapshotResult:
        """Dumps the source into S3; with `restore`, into the target too, as mode Snapshot's plan asks."""
        call = SnapshotInput(
            ref=self.ref, driver=self.driver, snapshot=self.snapshot_spec, key=self.key, restore=restore
        )
        return self.env.run(self.postgres.snapshot, call)

    def undo_snapshot(self, artifact: SnapshotResult | None = None) -> UndoSnapshotResult:
        """The undo of a snapshot that restored too (the driver's), with or without its result."""
        call = UndoSnapshotInput(
            ref=self.ref, snapshot=self.snapshot_spec, artifact=artifact, key=self.key, keep=False, driver=self.driver
        )
        return self.env.run(self.postgres.undo_snapshot, call)

    def migrate(self, artifact: SnapshotResult) -> MigrateResult:
        call = MigrateInput(ref=self.ref, driver=self.driver, snapshot=self.snapshot_spec, artifact=artifact)
        return self.env.run(self.postgres.migrate, call)

    def undo_migrate(self) -> UndoMigrateResult:
        return self.env.run(self.postgres.undo_migrate, UndoMigrateInput(ref=self.ref, driver=self.driver))

    def verify(self) -> VerifyResult:
        return self.env.run(self.postgres.verify, VerifyInput(ref=self.ref, driver=self.driver))

    def check_unwritten(self, fence: FenceMark | None) -> CheckUnwrittenResult:
        """The check before traffic goes back; with `fence` None, as an undo without verify's result runs it."""
        call = CheckUnwrittenInput(ref=self.ref, driver=self.driver, fence=fence)
        return self.env.run(self.postgres.check_unwritten, call)


@pytest.fixture
def steps(
    activity_env: ActivityEnvironment, postgres: PostgresActivities, ref: MigrationRef, snapshot_spec: SnapshotSpec
) -> Steps:
    driver = DriverSpec(source_secret=SOURCE_SECRET, target_secret=TARGET_SECRET)
    return Steps(activity_env, postgres, ref, driver, snapshot_spec)


@pytest.fixture
def restored(steps: Steps, databases: Databases) -> Steps:
    """A small shop frozen and restored into the target: what verify compares."""
    create_shop(databases.source, customers=100, orders=1_000)
    steps.freeze()
    steps.migrate(steps.snapshot())
    return steps


@pytest.fixture
def online(
    activity_env: ActivityEnvironment,
    postgres: PostgresActivities,
    kube_api: k8s.ApiClient,
    data_settings: DataActivitySettings,
    ref: MigrationRef,
    snapshot_spec: SnapshotSpec,
) -> OnlineSteps:
    """The driver's steps of a Migration of mode Online; stalls count after 5 s instead of a minute."""
    settings = dataclasses.replace(data_settings, replication_poll_interval=0.2, replication_stall_timeout=5.0)
    replication = ReplicationActivities(kube_api, settings)
    driver = DriverSpec(source_secret=SOURCE_SECRET, target_secret=TARGET_SECRET, mode=DriverMode.ONLINE)
    return OnlineSteps(activity_env, postgres, replication, ref, driver, snapshot_spec)


def create_secret(kube_api: k8s.ApiClient, namespace: str, name: str, data: dict[str, str]) -> None:
    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
    k8s.CoreV1Api(kube_api).create_namespaced_secret(
        namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name), data=encoded)
    )


def precheck_problems(precheck: Callable[..., object], **changes: Any) -> list[str]:
    """The numbered problems of the PrecheckFailed that `precheck` raises for an input with these changes."""
    with pytest.raises(PrecheckFailed) as raised:
        precheck(**changes)
    message = str(raised.value)
    assert "changed nothing" in message
    listed = message.split(": (1) ", 1)[1].rsplit(" Fix ", 1)[0]
    problems = []
    for number in range(2, 20):
        head, _, rest = listed.partition(f" ({number}) ")
        problems.append(head)
        if not rest:
            break
        listed = rest
    return problems


SCHEDULED = datetime(2026, 1, 1, tzinfo=UTC)
RUN = "run-1"
S = TypeVar("S", Steps, OnlineSteps)


def scheduled_as(
    steps: S, activity_id: int, *, run: str = RUN, attempt: int = 1, scheduled: datetime | None = None
) -> S:
    """The steps as Temporal's attempt `attempt` of the activity `activity_id` of workflow run `run` calls them."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        workflow_run_id=run,
        activity_id=str(activity_id),
        attempt=attempt,
        scheduled_time=scheduled or SCHEDULED + timedelta(seconds=activity_id),
    )
    return dataclasses.replace(steps, env=env)
