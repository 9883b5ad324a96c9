"""A list of Migrations, read in pages from the real API server, keeping only what handling needs."""

from __future__ import annotations

import contextlib

from kubernetes import client as k8s

from devstack.stack.stack import StackInfo
from ferry.api.saga import MigrationRef, workflow_id
from tests.end_to_end import migration_manifest
from watcher.inventory import keep
from watcher.kube import Kube

GROUP, VERSION, PLURAL = "ferry.dev", "v1alpha1", "migrations"


async def test_a_list_read_in_pages_hands_over_every_migration_once_and_a_version_to_watch_from(
    migration_crd: str, namespace: str, stack: StackInfo, kube_api: k8s.ApiClient
) -> None:
    custom = k8s.CustomObjectsApi(kube_api)
    for index in range(12):
        created = custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, migration_manifest(stack, "snapshots", name=f"m-{index:02d}")
        )
        if index % 3:  # two in three finished, one in three new
            ref = MigrationRef(namespace=namespace, name=f"m-{index:02d}", uid=created["metadata"]["uid"])
            status = {"phase": "Succeeded", "workflow": {"namespace": "default", "id": workflow_id(ref)}}
            custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, ref.name, {"status": status},
                _content_type="application/merge-patch+json",
            )  # fmt: skip
    kube = Kube(kube_api, "test")

    listing = await kube.list_migrations(namespace, keep, page=5)

    assert sorted(item.key[1] for item in listing.items) == [f"m-{index:02d}" for index in range(12)]
    assert [item.key[1] for item in listing.items if item.migration is not None] == ["m-00", "m-03", "m-06", "m-09"]
    later = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, migration_manifest(stack, "snapshots", name="later")
    )
    events = kube.watch_migrations(namespace, listing.resource_version)
    async with contextlib.aclosing(events):
        first = await anext(events)
        while first.type == "BOOKMARK":
            first = await anext(events)
    assert first.type == "ADDED"
    assert first.migration is not None
    assert first.migration.metadata.uid == later["metadata"]["uid"]
