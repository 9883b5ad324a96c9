"""The watcher's own status writes land on the Migration they were decided for, never on one created again under
its name, on the real API server."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from devstack.stack.stack import StackInfo
from ferry.api.migration import DeletionStatus, Migration
from ferry.api.saga import MigrationRef
from tests.end_to_end import eventually, migration_manifest
from watcher.kube import Kube
from watcher.patching import MigrationWriter

pytestmark = pytest.mark.usefixtures("migration_crd")

GROUP, VERSION, PLURAL = "ferry.dev", "v1alpha1", "migrations"


def _create(custom: k8s.CustomObjectsApi, stack: StackInfo, namespace: str, name: str) -> dict[str, Any]:
    created: dict[str, Any] = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, migration_manifest(stack, "snapshots", name=name)
    )
    return created


def _gone(custom: k8s.CustomObjectsApi, namespace: str, name: str) -> bool:
    try:
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def _status(custom: k8s.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = (
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status") or {}
    )
    return status


async def test_status_decided_for_a_deleted_migration_is_not_written_on_the_one_created_again_under_its_name(
    namespace: str, stack: StackInfo, kube_api: k8s.ApiClient
) -> None:
    custom = k8s.CustomObjectsApi(kube_api)
    old = Migration.parse(_create(custom, stack, namespace, "orders"))
    old_ref = MigrationRef(namespace=namespace, name="orders", uid=old.metadata.uid)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "orders")
    await eventually("the first Migration to be gone", lambda: asyncio.to_thread(_gone, custom, namespace, "orders"))
    new_uid = _create(custom, stack, namespace, "orders")["metadata"]["uid"]
    writer = MigrationWriter(Kube(kube_api, "test"))

    # What a pass over the old Migration decided, written once it is gone and another one has its name.
    await writer.acknowledge(old_ref, "ferry.dev/rollback", "1", "rollback sent")
    now = datetime.now(UTC)
    passed = DeletionStatus(message="rolling back before deletion", waiting_since=now, deadline=now - timedelta(1))
    await writer.waiting_for_deletion(old_ref, passed)
    await writer.mark_abandoned(old, "the workflow was terminated")
    await writer.patch_status(old_ref, {"phase": "Failed", "message": "ferry cannot run this Migration"})

    status = await asyncio.to_thread(_status, custom, namespace, "orders")
    assert status == {}, f"the Migration {new_uid} got the status of the one deleted before it: {status}"
    assert writer.take_written(old_ref) == []


async def test_a_status_write_lands_on_its_migration_when_another_writer_changed_it_meanwhile(
    namespace: str, stack: StackInfo, kube_api: k8s.ApiClient
) -> None:
    custom = k8s.CustomObjectsApi(kube_api)
    created = Migration.parse(_create(custom, stack, namespace, "orders"))
    ref = MigrationRef(namespace=namespace, name="orders", uid=created.metadata.uid)

    class Busy(Kube):
        """Injects the race the real API server cannot be asked for: the saga writes its status between the
        watcher's read and its write, twice."""

        races = 2

        def _patch_status(self, ref: MigrationRef, status: Any, resource_version: str) -> Migration | None:
            if self.races:
                self.races -= 1
                custom.patch_namespaced_custom_object_status(
                    GROUP, VERSION, namespace, PLURAL, ref.name, {"status": {"message": f"saga {self.races}"}},
                    _content_type="application/merge-patch+json",
                )  # fmt: skip
            return super()._patch_status(ref, status, resource_version)

    kube = Busy(kube_api, "test")
    writer = MigrationWriter(kube)

    await writer.acknowledge(ref, "ferry.dev/pause", "1", "paused")

    status = await asyncio.to_thread(_status, custom, namespace, "orders")
    assert kube.races == 0
    assert status["controls"] == {"acknowledged": {"ferry.dev/pause": "1"}, "message": "paused"}
    assert status["message"] == "saga 0"
    written = writer.take_written(ref)
    assert len(written) == 1
    assert (
        written[0]
        == custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "orders")["metadata"][
            "resourceVersion"
        ]
    )
