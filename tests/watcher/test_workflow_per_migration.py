"""Each Migration becomes exactly one durable workflow, whatever happens to the watcher."""

from __future__ import annotations

import asyncio
import json
import random
import signal

import pytest
from kubernetes import client as k8s
from temporalio.client import Client

from devstack.stack.stack import StackInfo
from ferry.api.migration import FINALIZER, WORKFLOW_ANNOTATION
from ferry.api.saga import WORKFLOW_NAME, MigrationRef, workflow_id
from tests.cluster import without_finalizer_at_create
from tests.conftest import Kubectl
from tests.end_to_end import apply_migration, eventually, migration_manifest, watcher_settings
from tests.watcher.conftest import has_workflow, pass_handler, workflows_in
from watcher.decisions import decide
from watcher.kube import Kube
from watcher.settings import WatcherSettings

GROUP, VERSION, PLURAL = "ferry.dev", "v1alpha1", "migrations"
OTHER_FINALIZER = "example.com/backup-first"


async def test_applying_a_migration_starts_one_workflow_and_sets_the_finalizer(
    kubectl: Kubectl, migration_crd: str, namespace: str, stack: StackInfo, temporal_client: Client,
    running_watcher: WatcherSettings,
) -> None:  # fmt: skip
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, "snapshots"))

    await eventually("the workflow", lambda: has_workflow(temporal_client, ref))

    description = await temporal_client.get_workflow_handle(workflow_id(ref)).describe()
    assert description.workflow_type == WORKFLOW_NAME
    assert description.task_queue == running_watcher.task_queue
    finalizers = json.loads(kubectl("get", "migration", ref.name, "-n", namespace, "-o", "json").stdout)["metadata"][
        "finalizers"
    ]
    assert finalizers == [FINALIZER]
    # Later events about the same object (here: a new label) start nothing more. The watch delivers the label's
    # event before a later Migration's, and that pass does nothing: it is over before the later one's start.
    await asyncio.to_thread(kubectl, "label", "migration", ref.name, "-n", namespace, "team=payments")
    later = apply_migration(kubectl, namespace, migration_manifest(stack, "snapshots", name="later"))
    await eventually("the later Migration's workflow", lambda: has_workflow(temporal_client, later))
    assert sorted(await workflows_in(temporal_client, namespace)) == sorted([workflow_id(ref), workflow_id(later)])


async def test_a_migration_created_again_under_the_same_name_gets_a_new_workflow(
    kubectl: Kubectl, migration_crd: str, namespace: str, stack: StackInfo, temporal_client: Client,
    running_watcher: WatcherSettings,
) -> None:  # fmt: skip
    manifest = migration_manifest(stack, "snapshots")
    first = apply_migration(kubectl, namespace, manifest)
    await eventually("the first workflow", lambda: has_workflow(temporal_client, first))
    await temporal_client.get_workflow_handle(workflow_id(first)).terminate("test: make room")
    # kubectl runs in a thread: the watcher under test shares this event loop.
    await asyncio.to_thread(kubectl, "delete", "migration", first.name, "-n", namespace, "--timeout=60s")

    second = apply_migration(kubectl, namespace, manifest)

    assert second.uid != first.uid
    await eventually("the second workflow", lambda: has_workflow(temporal_client, second))
    await eventually("both runs in visibility", lambda: _count_is(temporal_client, namespace, 2))


async def _count_is(client: Client, namespace: str, count: int) -> bool:
    return len(await workflows_in(client, namespace)) == count


async def test_a_burst_of_creates_with_the_watcher_killed_and_restarted_gives_one_workflow_each(
    kubectl: Kubectl, migration_crd: str, namespace: str, stack: StackInfo, temporal_client: Client,
    kube_api: k8s.ApiClient, watcher_process,  # type: ignore[no-untyped-def]
) -> None:  # fmt: skip
    count = 200
    watcher = watcher_process("burst")
    watcher.start()
    custom = k8s.CustomObjectsApi(kube_api)
    rng = random.Random(20261121)
    kill_after = sorted(rng.sample(range(10, count - 10), 4))

    async def create_all() -> list[str]:
        uids = []
        for index in range(count):
            manifest = migration_manifest(stack, "snapshots", name=f"burst-{index:03d}")
            created = await asyncio.to_thread(
                custom.create_namespaced_custom_object, "ferry.dev", "v1alpha1", namespace, "migrations", manifest
            )
            uids.append(created["metadata"]["uid"])
            if kill_after and index == kill_after[0]:
                kill_after.pop(0)
                watcher.kill()  # SIGKILL, like a crashing pod: no clean shutdown
                await asyncio.sleep(rng.uniform(0.0, 1.5))
                watcher.start()
        return uids

    uids = await create_all()

    async def every_migration_has_a_workflow() -> bool:
        return len(await workflows_in(temporal_client, namespace)) >= count

    await eventually("a workflow for every Migration", every_migration_has_a_workflow, within=240)
    await asyncio.sleep(6)  # one more resync: it must not add anything
    ids = await workflows_in(temporal_client, namespace)
    assert len(ids) == count
    assert sorted(workflow.rsplit("/", 1)[1] for workflow in ids) == sorted(uids)
    watcher.signal(signal.SIGTERM)
    await _terminate_all(temporal_client, ids)


async def _terminate_all(client: Client, ids: list[str]) -> None:
    for workflow in ids:
        await client.get_workflow_handle(workflow).terminate("test finished")


async def test_a_migration_deleted_before_its_first_pass_gets_neither_a_finalizer_nor_a_workflow(
    migration_crd: str, namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, temporal_client: Client,
    task_queue: str,
) -> None:  # fmt: skip
    """Deleted while someone else's finalizer holds it, before the watcher's first pass: the API server refuses any
    new finalizer, so that pass must add none, start nothing, and not fail and retry forever. (A deletion that lands
    during the pass, after the start: tests/watcher/test_deletion.py.)"""
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, "snapshots", name="held")
    manifest["metadata"]["finalizers"] = [OTHER_FINALIZER]
    await asyncio.to_thread(without_finalizer_at_create, kube_api, namespace, manifest)  # no policy adds ferry's
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    ref = MigrationRef(namespace=namespace, name="held", uid=created["metadata"]["uid"])
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, ref.name)
    kube = Kube(kube_api, "test")
    seen = await kube.read_migration(ref)  # what the watch delivers
    assert seen is not None
    handler = pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace))

    try:
        await handler.handle(seen, gone=False, run_closed=False, received=0.0)

        now = await kube.read_migration(ref)
        assert now is not None
        assert now.metadata.deletion_timestamp is not None
        assert now.metadata.finalizers == [OTHER_FINALIZER]
        assert not await has_workflow(temporal_client, ref)
    finally:
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, ref.name, {"metadata": {"finalizers": None}}
        )


@pytest.mark.finalizer_at_create
async def test_a_migration_held_from_its_creation_costs_the_watcher_no_write_when_its_workflow_starts(
    migration_crd: str, namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, temporal_client: Client,
    task_queue: str,
) -> None:  # fmt: skip
    """deploy/admission/finalizer has the API server set ferry's finalizer as it creates a Migration, so the pass
    that starts the workflow writes nothing: in a burst of creates, that write was the API server's largest cost.
    No worker runs here, so no status names the run; after --record-start-after the Migration is looked at again,
    and that pass records the start in the annotation. Passes after it ask Temporal nothing."""
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, "snapshots", name="held-at-create")
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    assert created["metadata"]["finalizers"] == [FINALIZER]
    ref = MigrationRef(namespace=namespace, name="held-at-create", uid=created["metadata"]["uid"])
    kube = Kube(kube_api, "test")
    looked_again: list[MigrationRef] = []
    settings = watcher_settings(stack, task_queue, namespace, record_start_after=0.5)
    handler = pass_handler(temporal_client, kube, settings, looked_again.append)
    seen = await kube.read_migration(ref)
    assert seen is not None

    try:
        assert await handler.handle(seen, gone=False, run_closed=False, received=0.0) == []
        assert await has_workflow(temporal_client, ref)
        unchanged = await kube.read_migration(ref)
        assert unchanged is not None
        assert unchanged.metadata.resource_version == created["metadata"]["resourceVersion"]

        async def asked_again() -> bool:
            return looked_again == [ref]

        await eventually("the handler to ask for another look", asked_again)
        written = await handler.handle(unchanged, gone=False, run_closed=False, received=0.0)

        recorded = await kube.read_migration(ref)
        assert recorded is not None
        assert written == [recorded.metadata.resource_version]
        assert recorded.metadata.annotations[WORKFLOW_ANNOTATION] == workflow_id(ref)
        assert recorded.metadata.finalizers == [FINALIZER]
        assert decide(recorded).nothing
        assert await workflows_in(temporal_client, namespace) == [workflow_id(ref)]
        handler.close()
    finally:
        await temporal_client.get_workflow_handle(workflow_id(ref)).terminate("test finished")


async def test_without_the_finalizer_policy_the_starting_pass_adds_finalizer_and_annotation_in_one_write(
    migration_crd: str, namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, temporal_client: Client,
    task_queue: str,
) -> None:  # fmt: skip
    """A cluster without deploy/admission/finalizer (MutatingAdmissionPolicy is beta in Kubernetes 1.34)."""
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, "snapshots", name="unheld-at-create")
    await asyncio.to_thread(without_finalizer_at_create, kube_api, namespace, manifest)
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    assert not created["metadata"].get("finalizers")
    ref = MigrationRef(namespace=namespace, name="unheld-at-create", uid=created["metadata"]["uid"])
    kube = Kube(kube_api, "test")
    looked_again: list[MigrationRef] = []
    handler = pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace), looked_again.append)
    seen = await kube.read_migration(ref)
    assert seen is not None

    try:
        written = await handler.handle(seen, gone=False, run_closed=False, received=0.0)

        held = await kube.read_migration(ref)
        assert held is not None
        assert written == [held.metadata.resource_version]
        assert held.metadata.finalizers == [FINALIZER]
        assert held.metadata.annotations[WORKFLOW_ANNOTATION] == workflow_id(ref)
        assert await has_workflow(temporal_client, ref)
        assert decide(held).nothing
        handler.close()
        assert looked_again == []
    finally:
        await temporal_client.get_workflow_handle(workflow_id(ref)).terminate("test finished")


@pytest.mark.finalizer_at_create
async def test_a_migration_held_from_its_creation_and_deleted_before_the_watcher_saw_it_is_let_go_without_a_run(
    migration_crd: str, namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, temporal_client: Client,
    task_queue: str,
) -> None:  # fmt: skip
    """The policy's finalizer holds a Migration before any watcher has looked at it (say none runs yet): deleting it
    must not leave it stuck. The first pass finds no run, starts none, and releases the finalizer."""
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, "snapshots", name="gone-before-seen")
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    assert created["metadata"]["finalizers"] == [FINALIZER]
    ref = MigrationRef(namespace=namespace, name="gone-before-seen", uid=created["metadata"]["uid"])
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, ref.name)
    kube = Kube(kube_api, "test")
    seen = await kube.read_migration(ref)  # what the watch delivers: deleted, still held
    assert seen is not None
    assert seen.metadata.deletion_timestamp is not None
    handler = pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace))

    await handler.handle(seen, gone=False, run_closed=False, received=0.0)

    assert await kube.read_migration(ref) is None
    assert not await has_workflow(temporal_client, ref)
