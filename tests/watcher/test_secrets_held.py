"""The Secrets a Migration names stay while ferry may need them: deleted with their Migration (`kubectl delete -k` of
the samples, a GitOps prune), they are still there for the undo and the retention cleanup, and go once it is done."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import psycopg
import pytest
from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from activities.secrets import MIGRATION_UNHELD, SecretProtection
from devstack.stack.stack import StackInfo
from ferry.api.migration import Migration, secret_finalizer
from ferry.api.saga import MigrationRef, workflow_id
from tests.conftest import Kubectl
from tests.end_to_end import (
    S3_SECRET,
    SOURCE_SECRET,
    TARGET_SECRET,
    Databases,
    apply_migration,
    eventually,
    migration_manifest,
    running_worker,
    watcher_settings,
    worker_settings,
)
from tests.postgres.data import application_role
from watcher.deletion import DeletionHandler
from watcher.kube import Kube
from watcher.patching import MigrationWriter
from watcher.settings import WatcherSettings
from worker.settings import WorkerSettings

pytestmark = pytest.mark.usefixtures("migration_crd", "source_workload", "migration_secrets")

SECRETS = (SOURCE_SECRET, TARGET_SECRET, S3_SECRET)
UNMARKED: dict[str, list[str]] = {name: [] for name in SECRETS}


@pytest.fixture
def orders(databases: Databases) -> None:
    with psycopg.connect(databases.source.dsn) as conn:
        conn.execute("create table orders (id bigserial primary key, note text not null)")
        conn.execute("insert into orders (note) select 'order ' || n from generate_series(1, 300) as n")


def _migration(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    result = kubectl("get", "migration", name, "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:
        assert "NotFound" in result.stderr
        return None
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def _phase(kubectl: Kubectl, namespace: str, name: str) -> str | None:
    return ((_migration(kubectl, namespace, name) or {}).get("status") or {}).get("phase")


def _secrets_left(api: k8s.ApiClient, namespace: str) -> dict[str, list[str]]:
    """The test's Secrets that are still there, with their finalizers."""
    items = k8s.CoreV1Api(api).list_namespaced_secret(namespace).items
    return {s.metadata.name: sorted(s.metadata.finalizers or []) for s in items if s.metadata.name in SECRETS}


def _events(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = kubectl("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json")
    events: list[dict[str, Any]] = json.loads(listed.stdout)["items"]
    return events


async def test_a_migration_deleted_with_its_secrets_during_its_run_unfreezes_the_source_before_the_secrets_go(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: None, databases: Databases,
    kube_api: k8s.ApiClient, running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    with application_role(databases.source) as app:
        ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, soakSeconds=3600))

        async def soaking() -> bool:  # after switch-traffic: the source stays frozen until scale-down-old
            status = (await asyncio.to_thread(_migration, kubectl, namespace, ref.name) or {}).get("status") or {}
            return {step["name"]: step["state"] for step in status.get("steps", [])}.get(
                "switch-traffic"
            ) == "Succeeded"

        await eventually("the soak after switch-traffic", soaking, within=240)
        with pytest.raises(psycopg.OperationalError, match="permission denied"):
            psycopg.connect(app.dsn).close()  # frozen: CONNECT revoked
        assert sorted(_secrets_left(kube_api, namespace).values()) == [[secret_finalizer(ref.uid)]] * 3

        # What `kubectl delete -k deploy/samples/` does: the Secrets and the Migration, at once.
        kubectl("delete", "secret", *SECRETS, "-n", namespace, "--wait=false")
        kubectl("delete", "migration", ref.name, "-n", namespace, "--wait=false")

        async def all_gone() -> bool:
            return await asyncio.to_thread(_migration, kubectl, namespace, ref.name) is None and not _secrets_left(
                kube_api, namespace
            )

        await eventually("the Migration and then its Secrets to go", all_gone, within=240)
        with psycopg.connect(app.dsn) as conn:  # the freeze was undone: the application connects and writes
            conn.execute("insert into orders (note) values ('after the rollback')")
    reasons = [event["reason"] for event in _events(kubectl, namespace, ref.name)]
    assert "RollbackIncomplete" not in reasons
    assert "UndoIncomplete" not in reasons


async def test_a_succeeded_migration_deleted_with_its_s3_credentials_still_deletes_its_snapshot(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: None, kube_api: k8s.ApiClient,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket))  # afterSuccess: DeleteWithMigration

    async def succeeded() -> bool:
        return await asyncio.to_thread(_phase, kubectl, namespace, ref.name) == "Succeeded"

    await eventually("the migration to succeed", succeeded, within=180)
    assert stack.s3_client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) > 0

    kubectl("delete", "secret", S3_SECRET, "-n", namespace, "--wait=false")
    kubectl("delete", "migration", ref.name, "-n", namespace, "--wait=false")

    async def gone() -> bool:
        return await asyncio.to_thread(_migration, kubectl, namespace, ref.name) is None

    await eventually("the Migration to go", gone, within=180)
    assert stack.s3_client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0, "the snapshot was deleted"
    assert S3_SECRET not in _secrets_left(kube_api, namespace), "released with its Migration, the Secret went"
    assert _secrets_left(kube_api, namespace) == {SOURCE_SECRET: [], TARGET_SECRET: []}


async def test_a_retention_cleanup_that_fails_leaves_a_warning_naming_the_snapshot_left_in_s3(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: None, kube_api: k8s.ApiClient,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket))

    async def succeeded() -> bool:
        return await asyncio.to_thread(_phase, kubectl, namespace, ref.name) == "Succeeded"

    await eventually("the migration to succeed", succeeded, within=180)
    location = (_migration(kubectl, namespace, ref.name) or {})["status"]["snapshot"]["location"]
    wrong = {"accessKeyId": "nobody", "secretAccessKey": "wrong-secret-key"}  # S3 refuses them: a permanent failure
    k8s.CoreV1Api(kube_api).patch_namespaced_secret(S3_SECRET, namespace, {"stringData": wrong})

    kubectl("delete", "migration", ref.name, "-n", namespace, "--wait=false")

    async def gone() -> bool:
        return await asyncio.to_thread(_migration, kubectl, namespace, ref.name) is None

    await eventually("the Migration to go", gone, within=180)
    assert stack.s3_client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) > 0, "the cleanup could not delete it"
    warnings = [e["message"] for e in _events(kubectl, namespace, ref.name) if e["reason"] == "RetentionCleanupFailed"]
    assert len(warnings) == 1, warnings
    assert location in warnings[0]


def _applied(kubectl: Kubectl, stack: StackInfo, bucket: str, namespace: str, name: str) -> Migration:
    """A Migration created in the cluster (no watcher runs: nothing holds it), as the watcher would parse it."""
    manifest = migration_manifest(stack, bucket, name=name)
    ref = apply_migration(kubectl, namespace, manifest)
    return Migration.parse({**manifest, "metadata": {"name": name, "namespace": namespace, "uid": ref.uid}})


async def test_a_released_migration_takes_only_its_own_finalizer_off_a_secret_another_migration_names(
    kubectl: Kubectl, stack: StackInfo, bucket: str, namespace: str, kube_api: k8s.ApiClient, temporal_client: Client,
    task_queue: str,
) -> None:  # fmt: skip
    first = _applied(kubectl, stack, bucket, namespace, "first")
    second = _applied(kubectl, stack, bucket, namespace, "second")
    protection = SecretProtection(kube_api)
    for migration in (first, second):  # what each one's precheck does
        assert migration.spec is not None
        ref = MigrationRef(namespace=namespace, name=migration.metadata.name, uid=migration.metadata.uid)
        protection.protect(ref, migration.spec.secrets())
        protection.protect(ref, migration.spec.secrets())  # a second attempt: once
    both = sorted([secret_finalizer(first.metadata.uid), secret_finalizer(second.metadata.uid)])
    assert _secrets_left(kube_api, namespace) == dict.fromkeys(SECRETS, both)

    settings = watcher_settings(stack, task_queue, namespace)
    handler = DeletionHandler(temporal_client, MigrationWriter(Kube(kube_api, "test")), settings, lambda ref: None)
    await handler.release_secrets(first)
    await handler.release_secrets(first)  # a watcher that stopped before releasing the Migration does it again
    assert _secrets_left(kube_api, namespace) == {name: [secret_finalizer(second.metadata.uid)] for name in SECRETS}

    k8s.CoreV1Api(kube_api).delete_namespaced_secret(S3_SECRET, namespace)
    assert S3_SECRET in _secrets_left(kube_api, namespace), "held by the second Migration"
    await handler.release_secrets(second)
    assert _secrets_left(kube_api, namespace) == {SOURCE_SECRET: [], TARGET_SECRET: []}
    await handler.release_secrets(second)  # a Secret already gone is no error


async def test_a_migration_whose_finalizer_is_removed_by_hand_lets_its_secrets_go(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: None, kube_api: k8s.ApiClient,
    temporal_client: Client, task_queue: str, running_watcher: WatcherSettings,
) -> None:  # fmt: skip
    """The README's way out of a deletion that waits for a rollback nobody runs (here, no worker is left): removing
    ferry's finalizer by hand. The Migration then goes without the watcher's release; the pass its DELETED event brings
    takes its finalizer off the Secrets, and a Secret deleted meanwhile goes too."""
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, soakSeconds=3600))
    mark = secret_finalizer(ref.uid)
    try:

        async def marked() -> bool:
            return await asyncio.to_thread(_secrets_left, kube_api, namespace) == {name: [mark] for name in SECRETS}

        async with running_worker(worker_settings(stack, task_queue)):
            await eventually("the precheck to mark the Secrets", marked, within=120)
        kubectl("delete", "secret", S3_SECRET, "-n", namespace, "--wait=false")
        kubectl("delete", "migration", ref.name, "-n", namespace, "--wait=false")

        async def waiting() -> bool:
            found = await asyncio.to_thread(_migration, kubectl, namespace, ref.name)
            return bool(((found or {}).get("status") or {}).get("deletion"))

        await eventually("the deletion to wait for the rollback", waiting, within=60)
        assert S3_SECRET in _secrets_left(kube_api, namespace), "held while the Migration is"
        kubectl(
            "patch", "migration", ref.name, "-n", namespace, "--type=merge", "-p", '{"metadata":{"finalizers":null}}'
        )

        async def let_go() -> bool:
            return await asyncio.to_thread(
                _migration, kubectl, namespace, ref.name
            ) is None and await asyncio.to_thread(_secrets_left, kube_api, namespace) == {
                SOURCE_SECRET: [],
                TARGET_SECRET: [],
            }

        seen = lambda: str(_secrets_left(kube_api, namespace))  # noqa: E731
        await eventually("the Migration to go and its Secrets to be let go", let_go, within=60, seen=seen)
    finally:
        with contextlib.suppress(Exception):
            await temporal_client.get_workflow_handle(workflow_id(ref)).terminate("test over")


async def test_a_precheck_that_marks_the_secrets_of_a_migration_nothing_holds_any_more_takes_the_mark_off_again(
    kubectl: Kubectl, stack: StackInfo, bucket: str, namespace: str, kube_api: k8s.ApiClient,
) -> None:  # fmt: skip
    """A late attempt of the precheck (its worker stood still past the heartbeat timeout) may mark the Secrets after
    the watcher let the Migration go: no release would come after it. It reads the Migration after marking, and takes
    its mark off again when the Migration is gone, is another object, or is being deleted without ferry's finalizer."""
    protection = SecretProtection(kube_api)
    first = _applied(kubectl, stack, bucket, namespace, "orders-db-to-16")
    assert first.spec is not None
    secrets = first.spec.secrets()
    gone = MigrationRef(namespace=namespace, name=first.metadata.name, uid=first.metadata.uid)
    kubectl("delete", "migration", gone.name, "-n", namespace)  # nothing holds it: gone at once

    with pytest.raises(ApplicationError) as refused:
        protection.protect(gone, secrets)
    assert (refused.value.type, refused.value.non_retryable) == (MIGRATION_UNHELD, True)
    assert f"Migration {namespace}/{gone.name} no longer exists" in refused.value.message
    assert _secrets_left(kube_api, namespace) == UNMARKED

    manifest = migration_manifest(stack, bucket)
    manifest["metadata"]["finalizers"] = ["example.com/hold"]  # another controller's
    again = apply_migration(kubectl, namespace, manifest)  # created again under the name: another uid
    with pytest.raises(ApplicationError, match="is another object now"):
        protection.protect(gone, secrets)
    assert _secrets_left(kube_api, namespace) == UNMARKED

    kubectl("delete", "migration", again.name, "-n", namespace, "--wait=false")  # lingers, held by the other one
    with pytest.raises(
        ApplicationError, match=r"is being deleted, and ferry's finalizer ferry\.dev/migration does not"
    ):
        protection.protect(again, secrets)
    assert _secrets_left(kube_api, namespace) == UNMARKED
