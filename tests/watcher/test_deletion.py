"""Deleting a Migration: during a run it is undone first; after success the new database stays."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import psycopg
import pytest
from botocore.exceptions import ClientError
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio import workflow
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.events import Recorded, record_event
from activities.kube_calls import APPLY_PATCH, migration_status_apply
from devstack.stack.stack import StackInfo
from ferry.api.migration import (
    CLOCK_SKEW_ALLOWANCE,
    FINALIZER,
    SAGA_FIELD_MANAGER,
    SUCCESS_SHOWN_FIRST,
    Migration,
    Phase,
    SnapshotSpec,
)
from ferry.api.migration import EventType as KubernetesEventType
from ferry.api.saga import (
    ControlRequest,
    MigrationRef,
    Signal,
    cleanup_workflow_id,
    snapshot_key,
    undo_workflow_id,
    workflow_id,
)
from tests.cluster import FINALIZER_AT_CREATE, endpoint_pods, without_finalizer_at_create
from tests.conftest import Kubectl
from tests.end_to_end import Databases, apply_migration, eventually, migration_manifest, watcher_settings
from tests.watcher.conftest import WatcherProcess, has_workflow, pass_handler
from watcher.handling import MigrationHandler
from watcher.kube import Kube
from watcher.settings import WatcherSettings
from worker.settings import WorkerSettings

pytestmark = pytest.mark.usefixtures("migration_crd", "source_workload", "migration_secrets")

GROUP, VERSION, PLURAL = "ferry.dev", "v1alpha1", "migrations"
HOLD = "example.com/hold"
"""Another controller's finalizer."""


@pytest.fixture
def orders(databases: Databases) -> None:
    with psycopg.connect(databases.source.dsn) as conn:
        conn.execute("create table orders (id bigserial primary key, note text not null)")
        conn.execute("insert into orders (note) select 'order ' || n from generate_series(1, 300) as n")


async def _migration(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    result = await asyncio.to_thread(kubectl, "get", "migration", name, "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:
        assert "NotFound" in result.stderr
        return None
    migration: dict[str, Any] = json.loads(result.stdout)
    return migration


async def _phase(kubectl: Kubectl, namespace: str, name: str) -> str | None:
    migration = await _migration(kubectl, namespace, name)
    return ((migration or {}).get("status") or {}).get("phase")


def _stateful_sets(api: k8s.ApiClient, namespace: str) -> list[str]:
    return sorted(item.metadata.name for item in k8s.AppsV1Api(api).list_namespaced_stateful_set(namespace).items)


async def _results(handle: WorkflowHandle[Any, Any], activity_type: str) -> list[dict[str, Any]]:
    """What each completed run of `activity_type` returned, as the history holds it (JSON)."""
    scheduled: set[int] = set()
    results: list[dict[str, Any]] = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == activity_type:
                scheduled.add(event.event_id)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            completed = event.activity_task_completed_event_attributes
            if completed.scheduled_event_id in scheduled:
                results.append(json.loads(completed.result.payloads[0].data))
    return results


def _read_only_default(databases: Databases) -> str | None:
    with psycopg.connect(databases.source.dsn) as conn:
        row = conn.execute(
            "select (select array_agg(entry) from unnest(setconfig) entry where entry not like 'ferry.unfrozen_by=%') "
            "from pg_db_role_setting s join pg_database d on d.oid = s.setdatabase "
            "where d.datname = current_database() and s.setrole = 0"
        ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


@pytest.mark.finalizer_at_create  # held from its creation: the deletion waits for the undo all the same
async def test_deleting_a_running_migration_undoes_it_then_lets_it_go(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: None, databases: Databases,
    kube_api: k8s.ApiClient, running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, soakSeconds=3600))

    async def soaking() -> bool:
        status = ((await _migration(kubectl, namespace, ref.name)) or {}).get("status") or {}
        return {step["name"]: step["state"] for step in status.get("steps", [])}.get("switch-traffic") == "Succeeded"

    await eventually("the soak after switch-traffic", soaking, within=240)
    assert _stateful_sets(kube_api, namespace) == ["orders-db", "orders-db-16"]

    await asyncio.to_thread(kubectl, "delete", "migration", ref.name, "-n", namespace, "--wait=false")

    async def gone() -> bool:
        return await _migration(kubectl, namespace, ref.name) is None

    await eventually("the Migration to be gone", gone, within=120)
    assert _stateful_sets(kube_api, namespace) == ["orders-db"]  # provision was undone
    assert _selector(kube_api, namespace) == {"app": "orders-db"}  # switch-traffic was undone
    assert _read_only_default(databases) is None  # freeze was undone: writes are allowed again
    listed = stack.s3_client().list_objects_v2(Bucket=bucket)
    assert listed.get("KeyCount", 0) == 0  # the snapshot was undone (afterRollback: Delete)
    events = await asyncio.to_thread(
        kubectl, "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={ref.name}", "-o", "json"
    )
    reasons = [event["reason"] for event in json.loads(events.stdout)["items"]]
    assert "WaitingBeforeDeletion" in reasons
    assert reasons.count("StepCompensated") == 5  # provision, freeze, snapshot, migrate, switch-traffic


async def test_deleting_a_succeeded_migration_keeps_the_target_and_its_data(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: None, databases: Databases,
    kube_api: k8s.ApiClient, running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    """Even after a `kubectl replace` of the manifest as applied, which drops ferry's finalizer: the watcher puts it
    back, so the deletion still runs the snapshot's retention cleanup."""
    manifest = migration_manifest(stack, bucket)
    ref = apply_migration(kubectl, namespace, manifest)

    async def succeeded() -> bool:
        return await _phase(kubectl, namespace, ref.name) == "Succeeded"

    await eventually("the migration to succeed", succeeded, within=120)
    snapshot = (await _migration(kubectl, namespace, ref.name) or {})["status"]["snapshot"]
    await asyncio.to_thread(kubectl, "replace", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))

    async def held() -> bool:
        return FINALIZER in ((await _migration(kubectl, namespace, ref.name)) or {})["metadata"].get("finalizers", [])

    await eventually("ferry's finalizer to be back after the replace", held, within=30)

    await asyncio.to_thread(kubectl, "delete", "migration", ref.name, "-n", namespace, "--timeout=120s")

    assert await _migration(kubectl, namespace, ref.name) is None
    assert _stateful_sets(kube_api, namespace) == ["orders-db", "orders-db-16"]
    target = k8s.AppsV1Api(kube_api).read_namespaced_stateful_set("orders-db-16", namespace)
    assert target.metadata.owner_references is None
    with psycopg.connect(databases.target.dsn) as conn:
        assert conn.execute("select count(*) from orders").fetchone() == (300,)
    # Retention afterSuccess: DeleteWithMigration (the default) removed the snapshot with the Migration.
    key = snapshot["location"].removeprefix(f"s3://{bucket}/")
    with pytest.raises(ClientError) as missing:
        stack.s3_client().head_object(Bucket=bucket, Key=key)
    assert missing.value.response["Error"]["Code"] in ("404", "NoSuchKey")


async def test_a_run_that_succeeds_after_its_deletion_was_asked_for_is_undone_before_the_migration_goes(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: None, databases: Databases,
    kube_api: k8s.ApiClient, temporal_client: Client, watcher_process: Callable[..., WatcherProcess],
    ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    """The leader dies between the deletion and the cancel; the run then succeeds; the next leader undoes it.

    The success comes more than CLOCK_SKEW_ALLOWANCE (2 minutes) after the deletion: within it, the watcher counts a
    success as before the deletion (the saga's clock and the API server's are two machines'), and keeps it."""
    first = watcher_process("first")
    first.start()
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, approval={"required": True}))

    async def awaiting() -> bool:
        return await _phase(kubectl, namespace, ref.name) == "AwaitingApproval"

    await eventually("the approval gate", awaiting, within=180)
    first.kill()
    await asyncio.to_thread(kubectl, "delete", "migration", ref.name, "-n", namespace, "--wait=false")
    deleted_at = datetime.fromisoformat(
        ((await _migration(kubectl, namespace, ref.name)) or {})["metadata"]["deletionTimestamp"].replace("Z", "+00:00")
    )

    async def past_the_allowance() -> bool:
        return datetime.now(UTC) >= deleted_at + CLOCK_SKEW_ALLOWANCE + timedelta(seconds=1.5)

    allowance = CLOCK_SKEW_ALLOWANCE.total_seconds()
    await eventually("the clock to pass the allowance for skew", past_the_allowance, within=allowance + 30)
    run = temporal_client.get_workflow_handle(workflow_id(ref))
    await run.signal(Signal.APPROVE.value, ControlRequest(by="someone-unaware"))
    assert (await run.result())["phase"] == "Succeeded"
    assert _selector(kube_api, namespace) == {"ferry.dev/statefulset": "orders-db-16"}

    watcher_process("second").start()

    async def gone() -> bool:
        return await _migration(kubectl, namespace, ref.name) is None

    await eventually("the undo and the Migration to be gone", gone, within=240)
    assert _stateful_sets(kube_api, namespace) == ["orders-db"]
    assert _selector(kube_api, namespace) == {"app": "orders-db"}
    source = k8s.AppsV1Api(kube_api).read_namespaced_stateful_set("orders-db", namespace)
    assert source.spec.replicas == 2
    assert _read_only_default(databases) is None
    events = await asyncio.to_thread(
        kubectl, "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={ref.name}", "-o", "json"
    )
    reasons = [event["reason"] for event in json.loads(events.stdout)["items"]]
    assert "UndoingBeforeDeletion" in reasons
    assert "UndoneBeforeDeletion" in reasons
    undo = temporal_client.get_workflow_handle(undo_workflow_id(ref))
    # Before traffic goes back; then, of the source alone, before each undo that empties the target.
    checked, *sources = await _results(undo, "postgresql.check_unwritten")
    assert checked["compared"], "without the run's results, the check found verify's mark in the target"
    assert [source["compared"] for source in sources] == [False, False]


def _selector(api: k8s.ApiClient, namespace: str) -> dict[str, str]:
    service = k8s.CoreV1Api(api).read_namespaced_service("orders-db", namespace)
    return dict(service.spec.selector or {})


@pytest.mark.parametrize(
    "finalizer", ["from the watcher", pytest.param("at creation", marks=pytest.mark.finalizer_at_create)]
)
async def test_applying_a_deleted_migration_again_leaves_the_live_target_its_data_and_its_traffic_alone(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: None, databases: Databases,
    kube_api: k8s.ApiClient, running_watcher: WatcherSettings, ferry_worker: WorkerSettings, finalizer: str,
) -> None:  # fmt: skip
    """GitOps applies the manifest again after the Migration was deleted: the new one must not touch the live target."""
    manifest = migration_manifest(stack, bucket)
    first = apply_migration(kubectl, namespace, manifest)

    async def succeeded() -> bool:
        return await _phase(kubectl, namespace, first.name) == "Succeeded"

    await eventually("the first migration to succeed", succeeded, within=180)
    await asyncio.to_thread(kubectl, "delete", "migration", first.name, "-n", namespace, "--timeout=120s")
    apps = k8s.AppsV1Api(kube_api)
    live_uid = apps.read_namespaced_stateful_set("orders-db-16", namespace).metadata.uid

    again = apply_migration(kubectl, namespace, manifest)

    async def ended() -> bool:
        return await _phase(kubectl, namespace, again.name) in ("RolledBack", "Failed", "Succeeded")

    await eventually("the Migration applied again to end", ended, within=180)
    status = ((await _migration(kubectl, namespace, again.name)) or {})["status"]
    assert status["phase"] == "RolledBack"
    assert "already serves traffic" in status["message"]
    assert "ferry changed nothing" in status["message"]
    assert apps.read_namespaced_stateful_set("orders-db-16", namespace).metadata.uid == live_uid
    assert _selector(kube_api, namespace) == {"ferry.dev/statefulset": "orders-db-16"}
    assert endpoint_pods(kube_api, namespace, "orders-db") == ["orders-db-16-0"]
    claims = k8s.CoreV1Api(kube_api).list_namespaced_persistent_volume_claim(namespace).items
    assert sorted(claim.metadata.name for claim in claims if "orders-db-16" in claim.metadata.name) == [
        "data-orders-db-16-0"
    ]
    with psycopg.connect(databases.target.dsn) as conn:
        assert conn.execute("select count(*) from orders").fetchone() == (300,)
    steps = {step["name"]: step["state"] for step in status["steps"]}
    assert steps["provision"] == "Pending", "provision never ran"


class DeletedBeforeTheFirstWrite(Kube):
    """The watcher's Kubernetes calls, with the Migration deleted just before the pass's first write to it lands."""

    def __init__(self, api: k8s.ApiClient, delete: Callable[[], object]) -> None:
        super().__init__(api, "test")
        self._delete: Callable[[], object] | None = delete

    async def patch_migration(self, ref: MigrationRef, patch: Any) -> Migration | None:
        if self._delete is not None:
            delete, self._delete = self._delete, None
            await asyncio.to_thread(delete)
        return await super().patch_migration(ref, patch)


class Window(NamedTuple):
    """A new Migration as the watch delivered it, and the pass about to handle it, which sees it deleted just before
    its first write to it lands."""

    ref: MigrationRef
    seen: Migration
    """What the watch delivered, just before the deletion."""
    kube: DeletedBeforeTheFirstWrite
    handler: MigrationHandler


@pytest.fixture
def window(
    namespace: str, stack: StackInfo, bucket: str, kube_api: k8s.ApiClient, temporal_client: Client, task_queue: str
) -> Callable[..., Awaitable[Window]]:
    """Makes the Migration `name`, with `finalizers` besides, and the pass that sees it deleted before it writes.

    The window exists on a cluster without deploy/admission/finalizer, where the watcher adds ferry's finalizer
    after the start: the test's namespace is left out of that policy. (With it, the Migration holds the finalizer
    from its creation, and its deletion waits for the run's undo like any other.)"""
    custom = k8s.CustomObjectsApi(kube_api)

    async def make(name: str, finalizers: list[str] | None = None) -> Window:
        manifest = migration_manifest(stack, bucket, name=name)
        manifest["metadata"]["namespace"] = namespace
        if finalizers:
            manifest["metadata"]["finalizers"] = finalizers
        await asyncio.to_thread(without_finalizer_at_create, kube_api, namespace, manifest)
        created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
        ref = MigrationRef(namespace=namespace, name=name, uid=created["metadata"]["uid"])
        kube = DeletedBeforeTheFirstWrite(
            kube_api, lambda: custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        )
        seen = await kube.read_migration(ref)
        assert seen is not None
        handler = pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace))
        return Window(ref, seen, kube, handler)

    return make


async def _closed(client: Client, ref: MigrationRef) -> WorkflowExecutionStatus | None:
    """How the Migration's run ended, once it has."""
    run = client.get_workflow_handle(workflow_id(ref))

    async def ended() -> bool:
        return (await run.describe()).status is not WorkflowExecutionStatus.RUNNING

    await eventually("the run to end", ended, within=120)
    return (await run.describe()).status


async def test_a_migration_deleted_after_its_run_started_and_before_the_watcher_wrote_leaves_a_run_that_does_nothing(
    namespace: str, stack: StackInfo, bucket: str, kube_api: k8s.ApiClient, temporal_client: Client,
    window: Callable[..., Awaitable[Window]], ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    """Nothing else holds it, so it is gone before the write that adds ferry's finalizer, and no pass sees it again.
    The run acts on nothing: the worker's gate refuses the activities of a run whose Migration does not exist, and a
    status write that passed it earlier finds the Migration gone, which rolls the run back before its first step."""
    ref, seen, kube, handler = await window("unheld")

    await handler.handle(seen, gone=False, run_closed=False, received=0.0)

    assert await kube.read_migration(ref) is None
    assert await has_workflow(temporal_client, ref), "the run started before the deletion"
    ended = await _closed(temporal_client, ref)
    run = temporal_client.get_workflow_handle(workflow_id(ref))
    if ended is WorkflowExecutionStatus.COMPLETED:
        assert (await run.result())["phase"] == "RolledBack"
    else:
        assert ended is WorkflowExecutionStatus.FAILED
    completed = [
        event.event_id
        async for event in run.fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    ]
    assert completed == [], "no step ran (status writes are local activities, recorded as markers)"
    assert _stateful_sets(kube_api, namespace) == ["orders-db"]
    assert stack.s3_client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


async def test_a_migration_another_finalizer_holds_deleted_after_its_run_started_has_its_run_cancelled(
    namespace: str, kube_api: k8s.ApiClient, temporal_client: Client, window: Callable[..., Awaitable[Window]],
    ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    """The deletion lands after the start, before the write that adds ferry's finalizer with the annotation: the
    API server then refuses a new finalizer, and the Migration lingers, held by the other one alone, while its run
    goes on. The pass the deletion brings cancels the run (it rolls back) and leaves the other finalizer alone."""
    ref, seen, kube, handler = await window("held", finalizers=[HOLD])

    await handler.handle(seen, gone=False, run_closed=False, received=0.0)
    deleted = await kube.read_migration(ref)
    assert deleted is not None
    assert deleted.metadata.deletion_timestamp is not None
    assert deleted.metadata.finalizers == [HOLD], "the API server adds no finalizer to a Migration being deleted"
    assert await has_workflow(temporal_client, ref), "the run started before the deletion"
    await handler.handle(deleted, gone=False, run_closed=False, received=0.0)  # the state the watch brings next

    assert await _closed(temporal_client, ref) is WorkflowExecutionStatus.CANCELED
    await handler.handle(deleted, gone=False, run_closed=False, received=0.0)  # again, once the run has closed
    after = await kube.read_migration(ref)
    assert after is not None
    assert after.status.phase is Phase.ROLLED_BACK
    assert "the workflow was cancelled" in (after.status.message or "")
    assert after.metadata.finalizers == [HOLD]
    assert FINALIZER not in after.metadata.finalizers
    assert _stateful_sets(kube_api, namespace) == ["orders-db"]


async def test_a_migration_whose_whole_namespace_is_deleted_is_let_go_at_the_deadline(
    stack: StackInfo, bucket: str, kube_api: k8s.ApiClient, temporal_client: Client, task_queue: str
) -> None:
    """`kubectl delete namespace` deletes the Migration with everything else, and the API server then refuses every
    new object there, Events included (403, the namespace "is being terminated"). The deadline is the way out when the
    run cannot end (here no worker runs it at all): ferry asks it to roll back, and at the deadline lets the Migration
    go, so the namespace can go too."""
    core, custom = k8s.CoreV1Api(kube_api), k8s.CustomObjectsApi(kube_api)
    doomed = f"t-doomed-{uuid.uuid4().hex[:8]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=doomed)))
    manifest = migration_manifest(stack, bucket, name="orders-db-to-16")
    manifest["metadata"].update(namespace=doomed, finalizers=[FINALIZER])
    created = custom.create_namespaced_custom_object(GROUP, VERSION, doomed, PLURAL, manifest)
    ref = MigrationRef(namespace=doomed, name="orders-db-to-16", uid=created["metadata"]["uid"])
    kube = Kube(kube_api, "test")
    handler = pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, doomed, deletion_timeout=1))
    try:
        seen = await kube.read_migration(ref)
        assert seen is not None
        await handler.handle(seen, gone=False, run_closed=False, received=0.0)
        assert await has_workflow(temporal_client, ref)
        core.delete_namespace(doomed)

        async def deleted() -> bool:
            found = await kube.read_migration(ref)
            return found is not None and found.metadata.deletion_timestamp is not None

        await eventually("the namespace's deletion to reach the Migration", deleted, within=60)
        doomed_migration = await kube.read_migration(ref)
        assert doomed_migration is not None
        await handler.handle(doomed_migration, gone=False, run_closed=False, received=0.0)
        asked = [
            event.event_type
            async for event in temporal_client.get_workflow_handle(workflow_id(ref)).fetch_history_events()
        ]
        assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED in asked, "asked to roll back first"
        await asyncio.sleep(1.5)
        past_deadline = await kube.read_migration(ref)
        assert past_deadline is not None
        await handler.handle(past_deadline, gone=False, run_closed=False, received=0.0)

        assert await kube.read_migration(ref) is None, "ferry's finalizer released"
        await eventually(
            "the namespace to go",
            lambda: asyncio.to_thread(lambda: doomed not in {n.metadata.name for n in core.list_namespace().items}),
            within=120,
        )
        late = await asyncio.to_thread(
            record_event, core, ref, type=KubernetesEventType.NORMAL, reason="Late", message="after it all", key="late",
            component="test", instance="test",
        )  # fmt: skip
        assert late is Recorded.NAMESPACE_GOING, "no Event where the namespace is gone, and no error either"
    finally:
        with contextlib.suppress(ApiException):
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, doomed, PLURAL, ref.name, {"metadata": {"finalizers": None}}
            )
        with contextlib.suppress(Exception):
            await temporal_client.get_workflow_handle(workflow_id(ref)).terminate("test over")
        with contextlib.suppress(ApiException):
            core.delete_namespace(doomed)


async def test_a_migration_deleted_once_its_status_says_succeeded_is_not_rolled_back_while_its_run_closes(
    namespace: str, stack: StackInfo, bucket: str, kube_api: k8s.ApiClient, temporal_client: Client, task_queue: str
) -> None:
    """`kubectl wait --for=condition=Succeeded` returns as the saga's last status write lands; the run closes with
    its next workflow task, seconds later if its worker died just then (here no worker runs it). A deletion in
    between is a deletion after success: the run is left to close, not cancelled (which would roll it back)."""
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, bucket, name="orders-db-to-16")
    manifest["metadata"].update(namespace=namespace, finalizers=[FINALIZER])
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    ref = MigrationRef(namespace=namespace, name="orders-db-to-16", uid=created["metadata"]["uid"])
    kube = Kube(kube_api, "test")
    handler = pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace))
    seen = await kube.read_migration(ref)
    assert seen is not None
    await handler.handle(seen, gone=False, run_closed=False, received=0.0)
    run = temporal_client.get_workflow_handle(workflow_id(ref))
    try:
        succeeded = {"phase": "Succeeded", "transitionedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
        await _deleted_while_closing(custom, kube, handler, run, ref, succeeded)
    finally:
        with contextlib.suppress(Exception):
            await run.terminate("test over")


async def _reasons(kubectl: Kubectl, namespace: str, name: str) -> dict[str, list[str]]:
    """The Migration's Events: their messages by reason."""
    listed = await asyncio.to_thread(
        kubectl, "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json"
    )
    reasons: dict[str, list[str]] = {}
    for event in json.loads(listed.stdout)["items"]:
        reasons.setdefault(event["reason"], []).append(event["message"])
    return reasons


def _a_row_the_restore_refuses(databases: Databases) -> None:
    """A customer whose domain was blocked after the row was written, by a CHECK that reads another table: the source
    keeps the row (a CHECK is checked only on writes), and the restore, which loads blocked_domains first (name
    order), refuses it. The snapshot step fails for good."""
    with psycopg.connect(databases.source.dsn) as conn:
        conn.execute("create table public.blocked_domains (domain text primary key)")
        conn.execute(
            "create function public.email_allowed(email text) returns boolean language sql as $$ "
            "select not exists (select from public.blocked_domains where domain = split_part(email, '@', 2)) $$"
        )
        conn.execute(
            "create table public.customers (id int primary key, email text not null, "
            "constraint customers_email_allowed check (public.email_allowed(email)))"
        )
        conn.execute("insert into public.customers values (1, 'ann@blocked.example')")
        conn.execute("insert into public.blocked_domains values ('blocked.example')")


async def test_deleting_a_migration_that_rolled_back_after_a_step_failed_warns_of_nothing_left(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, databases: Databases, temporal_client: Client,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    """Its run ends FAILED by design (MigrationRolledBack), every undo done and its status RolledBack: the deletion
    has nothing to warn of. A Warning beside that status would send a person looking for what is not there."""
    _a_row_the_restore_refuses(databases)
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket))

    async def rolled_back() -> bool:
        return await _phase(kubectl, namespace, ref.name) == "RolledBack"

    await eventually("the rollback after the snapshot failed", rolled_back, within=240)
    assert await _closed(temporal_client, ref) is WorkflowExecutionStatus.FAILED
    await asyncio.to_thread(kubectl, "delete", "migration", ref.name, "-n", namespace, "--wait=false")

    async def gone() -> bool:
        return await _migration(kubectl, namespace, ref.name) is None

    await eventually("the Migration to be gone", gone, within=60)
    reasons = await _reasons(kubectl, namespace, ref.name)
    assert "StepCompensated" in reasons, "the freeze and the snapshot were undone"
    assert "UndoIncomplete" not in reasons, reasons["UndoIncomplete"]
    assert _read_only_default(databases) is None


@workflow.defn(name="EndsFailed", sandboxed=False)
class _EndsFailed:
    """Stands in for a saga run that has ended FAILED with the error `type`, as workflows/migration.py raises it."""

    @workflow.run
    async def run(self, type: str) -> None:
        raise ApplicationError(f"the run ended with {type}", type=type, non_retryable=True)


@pytest.mark.parametrize(
    ("phase", "message", "ended_with", "warned"),
    [
        (
            "Failed",
            "rollback stopped after step snapshot failed: the undo of freeze kept failing (connection refused)",
            "RollbackIncomplete",
            True,
        ),
        ("RolledBack", "rolled back: step snapshot failed (psql exited with code 3)", "MigrationRolledBack", False),
    ],
)
async def test_a_deleted_migration_whose_run_failed_is_warned_of_only_when_its_status_says_something_is_left(
    phase: str, message: str, ended_with: str, warned: bool, kubectl: Kubectl, namespace: str, stack: StackInfo,
    bucket: str, kube_api: k8s.ApiClient, temporal_client: Client, task_queue: str,
) -> None:  # fmt: skip
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, bucket, name="orders-db-to-16")
    manifest["metadata"].update(namespace=namespace, finalizers=[FINALIZER])
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    ref = MigrationRef(namespace=namespace, name="orders-db-to-16", uid=created["metadata"]["uid"])
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, ref.name, {"status": {"phase": phase, "message": message}},
        field_manager="ferry-saga",
    )  # fmt: skip
    async with Worker(
        temporal_client, task_queue=task_queue, workflows=[_EndsFailed], workflow_runner=UnsandboxedWorkflowRunner()
    ):
        run = await temporal_client.start_workflow("EndsFailed", ended_with, id=workflow_id(ref), task_queue=task_queue)
        with pytest.raises(WorkflowFailureError):
            await run.result()
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, ref.name)
    kube = Kube(kube_api, "test")
    deleted = await kube.read_migration(ref)
    assert deleted is not None

    handler = pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace))
    await handler.handle(deleted, gone=False, run_closed=False, received=0.0)

    assert await kube.read_migration(ref) is None, "released"
    warnings = (await _reasons(kubectl, namespace, ref.name)).get("UndoIncomplete", [])
    if warned:
        [warning] = warnings
        assert "ended FAILED, so what it did may not all be undone" in warning
        assert message in warning
    else:
        assert warnings == []


async def test_a_migration_whose_run_temporal_no_longer_knows_is_undone_from_its_records_before_it_goes(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: None, databases: Databases,
    kube_api: k8s.ApiClient, temporal_client: Client, running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    """The run's history was deleted (`temporal workflow delete`; the namespace's retention does the same to a closed
    run) while the clients were on the target and the source frozen. The deletion took the missing run for one that
    never was and let the Migration go at once, leaving the source read-only and the Service on the target."""
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, soakSeconds=3600))

    async def soaking() -> bool:
        status = ((await _migration(kubectl, namespace, ref.name)) or {}).get("status") or {}
        return {step["name"]: step["state"] for step in status.get("steps", [])}.get("switch-traffic") == "Succeeded"

    await eventually("the soak after switch-traffic", soaking, within=240)
    await temporal_client.workflow_service.delete_workflow_execution(
        DeleteWorkflowExecutionRequest(
            namespace=temporal_client.namespace, workflow_execution=WorkflowExecution(workflow_id=workflow_id(ref))
        )
    )

    async def forgotten() -> bool:
        try:
            await temporal_client.get_workflow_handle(workflow_id(ref)).describe()
        except RPCError as error:
            return error.status is RPCStatusCode.NOT_FOUND
        return False

    await eventually("Temporal to forget the run", forgotten, within=60)
    await asyncio.to_thread(kubectl, "delete", "migration", ref.name, "-n", namespace, "--wait=false")

    async def gone() -> bool:
        return await _migration(kubectl, namespace, ref.name) is None

    await eventually("the undo and the Migration to be gone", gone, within=240)
    assert _stateful_sets(kube_api, namespace) == ["orders-db"]
    assert _selector(kube_api, namespace) == {"app": "orders-db"}
    assert _read_only_default(databases) is None
    assert stack.s3_client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    reasons = await _reasons(kubectl, namespace, ref.name)
    assert "UndoingBeforeDeletion" in reasons
    [undone] = reasons["UndoneBeforeDeletion"]
    assert f"Temporal had no record of its workflow {workflow_id(ref)}" in undone


@pytest.mark.parametrize(
    ("phase", "retention", "cleaned_up"),
    [
        pytest.param("RolledBack", "DeleteWithMigration", False, id="rolled-back-goes-at-once"),
        pytest.param("Succeeded", "DeleteWithMigration", True, id="succeeded-after-its-retention-cleanup"),
        pytest.param("Succeeded", "Keep", False, id="succeeded-keeping-its-snapshot-goes-at-once"),
        pytest.param("Failed", "DeleteWithMigration", False, id="failed-goes-with-a-warning"),
        pytest.param("Abandoned", "DeleteWithMigration", False, id="abandoned-goes-with-a-warning"),
    ],
)
async def test_a_finished_migration_whose_run_temporal_no_longer_knows_goes_as_its_status_says(
    phase: str, retention: str, cleaned_up: bool, kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str,
    kube_api: k8s.ApiClient, temporal_client: Client, task_queue: str,
) -> None:  # fmt: skip
    """The namespace's retention expires a closed run's history: its Migration, deleted later, is what its status
    says it is, and a success still gets the retention cleanup its snapshot asks for. A run that ended Failed or
    Abandoned is not undone now, as it is not with its history there: a later Migration may build on what it left
    (its target another's source); a Warning says what may be left."""
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, bucket, name="orders-db-to-16")
    manifest["spec"]["snapshot"]["retention"] = {"afterSuccess": retention}
    manifest["metadata"].update(namespace=namespace, finalizers=[FINALIZER])
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    ref = MigrationRef(namespace=namespace, name="orders-db-to-16", uid=created["metadata"]["uid"])
    snapshot = {"location": f"s3://{bucket}/{ref.uid}", "sha256": "ab" * 32, "sizeBytes": 1}
    status = {
        "phase": phase,
        "workflow": {"namespace": temporal_client.namespace, "id": workflow_id(ref), "runId": str(uuid.uuid4())},
        "snapshot": snapshot,
    }
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, ref.name, {"status": status}, field_manager="ferry-saga"
    )
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, ref.name)
    kube = Kube(kube_api, "test")
    deleted = await kube.read_migration(ref)
    assert deleted is not None

    await pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace)).handle(
        deleted, gone=False, run_closed=False, received=0.0
    )

    cleanup = await _started(temporal_client, cleanup_workflow_id(ref))
    if cleaned_up:
        assert await kube.read_migration(ref) is not None, "held while the cleanup runs"
        assert cleanup is not None, "the retention cleanup was started"
        await cleanup.terminate("the test is over")  # no worker here runs it
    else:
        assert await kube.read_migration(ref) is None, "released"
        assert cleanup is None
    assert await _started(temporal_client, undo_workflow_id(ref)) is None, "nothing undone"
    warned = phase in ("Failed", "Abandoned")
    assert ("UndoIncomplete" in await _reasons(kubectl, namespace, ref.name)) == warned


async def test_a_succeeded_migration_deleted_with_its_namespace_keeps_its_snapshot(
    stack: StackInfo, bucket: str, kube_api: k8s.ApiClient, temporal_client: Client, task_queue: str
) -> None:
    """Deleting the namespace (by mistake, in the wrong kube context) takes the target's and the source's volumes with
    it: the snapshot that afterSuccess: DeleteWithMigration deletes with the Migration may be the last copy of the
    database, and is kept."""
    core, custom = k8s.CoreV1Api(kube_api), k8s.CustomObjectsApi(kube_api)
    namespace = f"t-namespace-going-{uuid.uuid4().hex[:6]}"
    labels = {FINALIZER_AT_CREATE: "false"}
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace, labels=labels)))
    manifest = migration_manifest(stack, bucket, name="orders-db-to-16")
    manifest["metadata"].update(namespace=namespace, finalizers=[FINALIZER])
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    ref = MigrationRef(namespace=namespace, name="orders-db-to-16", uid=created["metadata"]["uid"])
    key = snapshot_key(ref, SnapshotSpec.model_validate(manifest["spec"]["snapshot"]))
    s3 = stack.s3_client()
    s3.put_object(Bucket=bucket, Key=key, Body=b"the only copy")
    status = {
        "phase": "Succeeded",
        "workflow": {"namespace": temporal_client.namespace, "id": workflow_id(ref), "runId": str(uuid.uuid4())},
        "snapshot": {"location": f"s3://{bucket}/{key}", "sha256": "ab" * 32, "sizeBytes": 13},
    }
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, ref.name, {"status": status}, field_manager="ferry-saga"
    )
    kube = Kube(kube_api, "test")
    core.delete_namespace(namespace)

    async def deleted_by_the_namespace_controller() -> bool:
        found = await kube.read_migration(ref)
        return found is not None and found.metadata.deletion_timestamp is not None

    await eventually("the namespace's deletion to reach the Migration", deleted_by_the_namespace_controller)
    deleting = await kube.read_migration(ref)
    assert deleting is not None
    await pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace)).handle(
        deleting, gone=False, run_closed=False, received=0.0
    )

    assert await kube.read_migration(ref) is None, "released: the namespace goes"
    assert await _started(temporal_client, cleanup_workflow_id(ref)) is None, "no retention cleanup"
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"the only copy"
    s3.delete_object(Bucket=bucket, Key=key)


async def _started(client: Client, id: str) -> WorkflowHandle[Any, Any] | None:
    """The workflow `id`, if Temporal knows it."""
    handle = client.get_workflow_handle(id)
    try:
        await handle.describe()
    except RPCError as error:
        if error.status is not RPCStatusCode.NOT_FOUND:
            raise
        return None
    return handle


@pytest.mark.parametrize(
    ("spec", "cleaned_up"),
    [
        pytest.param({"snapshot": {"retention": {"afterSuccess": "DeleteWithMigration"}}}, True, id="all-succeeded"),
        pytest.param({"dryRun": True}, False, id="dry-run"),
    ],
)
async def test_a_running_migration_whose_run_temporal_no_longer_knows_is_not_undone_when_there_is_nothing_to_undo(
    spec: dict[str, Any], cleaned_up: bool, kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str,
    kube_api: k8s.ApiClient, temporal_client: Client, task_queue: str,
) -> None:  # fmt: skip
    """Every step shown Succeeded (the last status write, saying Succeeded, did not land): it succeeded, and goes as a
    success does, after its retention cleanup. A dry run changed nothing."""
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, bucket, name="orders-db-to-16")
    for key, value in spec.items():
        manifest["spec"][key] = {**manifest["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    manifest["metadata"].update(namespace=namespace, finalizers=[FINALIZER])
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    ref = MigrationRef(namespace=namespace, name="orders-db-to-16", uid=created["metadata"]["uid"])
    steps = ["precheck", "provision", "freeze", "snapshot", "migrate", "verify", "switch-traffic", "scale-down-old"]
    status = {
        "phase": "Running",
        "workflow": {"namespace": temporal_client.namespace, "id": workflow_id(ref), "runId": str(uuid.uuid4())},
        "snapshot": {"location": f"s3://{bucket}/{ref.uid}", "sha256": "ab" * 32, "sizeBytes": 1},
        "steps": [{"name": name, "state": "Succeeded" if cleaned_up else "Pending"} for name in steps],
    }
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, ref.name, {"status": status}, field_manager="ferry-saga"
    )
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, ref.name)
    kube = Kube(kube_api, "test")
    deleted = await kube.read_migration(ref)
    assert deleted is not None

    await pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace)).handle(
        deleted, gone=False, run_closed=False, received=0.0
    )

    assert await _started(temporal_client, undo_workflow_id(ref)) is None, "nothing undone"
    cleanup = await _started(temporal_client, cleanup_workflow_id(ref))
    if cleaned_up:
        assert cleanup is not None, "the retention cleanup of a success"
        await cleanup.terminate("the test is over")
    else:
        assert cleanup is None
        assert await kube.read_migration(ref) is None, "released"


async def _forget(client: Client, ref: MigrationRef) -> None:
    """Deletes the Migration's run from Temporal, as `temporal workflow delete` does, and waits until it is gone."""
    await client.workflow_service.delete_workflow_execution(
        DeleteWorkflowExecutionRequest(
            namespace=client.namespace, workflow_execution=WorkflowExecution(workflow_id=workflow_id(ref))
        )
    )

    async def forgotten() -> bool:
        return await _started(client, workflow_id(ref)) is None

    await eventually("Temporal to forget the run", forgotten, within=60)


async def test_a_migration_whose_run_temporal_loses_while_it_waits_shows_abandoned_and_its_deletion_undoes_it(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: None, databases: Databases,
    kube_api: k8s.ApiClient, temporal_client: Client, running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    """The run waits for an approval, the target provisioned, and its history is deleted (`temporal workflow delete`;
    a Temporal rebuilt empty does the same): the Migration showed AwaitingApproval for ever. The resync finds no
    Running run for it, a describe confirms that Temporal has none, and the status says what is left and what
    deleting the Migration does; which is then what it does."""
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, approval={"required": True}))

    async def awaiting() -> bool:
        return await _phase(kubectl, namespace, ref.name) == "AwaitingApproval"

    await eventually("the approval gate", awaiting, within=180)
    assert _stateful_sets(kube_api, namespace) == ["orders-db", "orders-db-16"], "provision ran"

    await _forget(temporal_client, ref)

    async def abandoned() -> bool:
        return await _phase(kubectl, namespace, ref.name) == "Abandoned"

    await eventually("the Abandoned phase (the resync runs every 2s)", abandoned, within=60)
    status = ((await _migration(kubectl, namespace, ref.name)) or {})["status"]
    message = status["message"]
    assert f"Temporal has no record of workflow {workflow_id(ref)} any more" in message
    assert "nothing runs this Migration" in message
    assert "status.steps is what the run last recorded" in message
    assert "Deleting this Migration undoes, from those records, what the steps did" in message
    conditions = {condition["type"]: condition for condition in status["conditions"]}
    assert (conditions["Succeeded"]["status"], conditions["Succeeded"]["reason"]) == ("False", "HistoryGone")
    assert conditions["Progressing"]["status"] == "False"
    assert status["workflow"]["id"] == workflow_id(ref), "the run it names stays"
    assert (await _reasons(kubectl, namespace, ref.name))["Abandoned"] == [message]
    assert await _started(temporal_client, workflow_id(ref)) is None, "nothing started it again"
    await asyncio.sleep(4)  # two more resyncs: a finished Migration is not looked at again
    assert (await _reasons(kubectl, namespace, ref.name))["Abandoned"] == [message]

    await asyncio.to_thread(kubectl, "delete", "migration", ref.name, "-n", namespace, "--wait=false")

    async def gone() -> bool:
        return await _migration(kubectl, namespace, ref.name) is None

    await eventually("the undo and the Migration to be gone", gone, within=240)
    assert _stateful_sets(kube_api, namespace) == ["orders-db"], "provision was undone"
    assert _selector(kube_api, namespace) == {"app": "orders-db"}
    assert _read_only_default(databases) is None
    reasons = await _reasons(kubectl, namespace, ref.name)
    assert "UndoingBeforeDeletion" in reasons
    [undone] = reasons["UndoneBeforeDeletion"]
    assert f"Temporal had no record of its workflow {workflow_id(ref)}" in undone
    assert "UndoIncomplete" not in reasons


@workflow.defn(name="FinishesItsRetentionCleanup", sandboxed=False)
class _FinishesItsRetentionCleanup:
    """Stands in for a saga run whose every step is done and that deletes its snapshot for retention (afterSuccess:
    Delete) before it writes Succeeded: it ignores a cancel, as the saga does from then on (Stage.FINISHED), and
    completes Succeeded once told that the cleanup is done."""

    def __init__(self) -> None:
        self._cleaned = False

    @workflow.signal
    def cleaned(self) -> None:
        self._cleaned = True

    @workflow.run
    async def run(self) -> dict[str, str]:
        while True:
            try:
                await workflow.wait_condition(lambda: self._cleaned)
            except asyncio.CancelledError:
                continue  # "cancel ignored: every step was done"
            return {"phase": "Succeeded", "message": "migrated orders-db to orders-db-16"}


def _every_step_succeeded(by: datetime) -> list[dict[str, Any]]:
    names = ["precheck", "provision", "freeze", "snapshot", "migrate", "verify", "switch-traffic", "scale-down-old"]
    at = by.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return [{"name": name, "state": "Succeeded", "startedAt": at, "finishedAt": at} for name in names]


async def test_a_migration_deleted_while_its_run_deletes_the_snapshot_for_retention_is_not_undone(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, kube_api: k8s.ApiClient, temporal_client: Client,
    task_queue: str,
) -> None:  # fmt: skip
    """Every step is done, so the saga undoes nothing more and ignores a cancel; its retention cleanup and the write
    saying Succeeded come after. A deletion in between came after the success: the watcher cancelled the run (phase
    still Running), dated the success by the Succeeded write, after the deletion, and undid the migration."""
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, bucket, name="orders-db-to-16")
    manifest["spec"]["snapshot"]["retention"] = {"afterSuccess": "Delete"}
    manifest["metadata"].update(namespace=namespace, finalizers=[FINALIZER])
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    ref = MigrationRef(namespace=namespace, name="orders-db-to-16", uid=created["metadata"]["uid"])
    kube = Kube(kube_api, "test")
    handler = pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace))
    async with Worker(
        temporal_client, task_queue=task_queue, workflows=[_FinishesItsRetentionCleanup],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):  # fmt: skip
        run = await temporal_client.start_workflow(
            "FinishesItsRetentionCleanup", id=workflow_id(ref), task_queue=task_queue
        )
        last_step = datetime.now(UTC) - timedelta(seconds=2)
        running = {
            "phase": "Running",
            "workflow": {"namespace": temporal_client.namespace, "id": workflow_id(ref)},
            "steps": _every_step_succeeded(last_step),
            "transitionedAt": last_step.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        deleted = await _deleted_while_closing(custom, kube, handler, run, ref, running)

        async def a_second_later() -> bool:
            assert deleted.metadata.deletion_timestamp is not None
            return datetime.now(UTC) >= deleted.metadata.deletion_timestamp + timedelta(seconds=1.5)

        await eventually("the clock to pass the deletion's second", a_second_later)
        succeeded = {"phase": "Succeeded", "transitionedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, ref.name, {"status": succeeded}, field_manager="ferry-saga"
        )
        await run.signal("cleaned")
        assert (await run.result())["phase"] == "Succeeded"
        closed = await kube.read_migration(ref)
        assert closed is not None

        await handler.handle(closed, gone=False, run_closed=False, received=0.0)

    assert await kube.read_migration(ref) is None, "released"
    assert await _started(temporal_client, undo_workflow_id(ref)) is None, "nothing undone"
    assert "UndoingBeforeDeletion" not in await _reasons(kubectl, namespace, ref.name)


TEMPORAL_AHEAD = timedelta(minutes=10)
"""How far ahead of the API server's a skewed Temporal's clock runs: the saga dates every step, and its Succeeded
write, by it (workflow.now())."""


def _apply_as_the_saga(custom: k8s.CustomObjectsApi, ref: MigrationRef, status: dict[str, Any]) -> None:
    """Writes `status` as the saga's mirror does: a server-side apply of the status as ferry-saga."""
    read = custom.get_namespaced_custom_object(GROUP, VERSION, ref.namespace, PLURAL, ref.name)
    applied = migration_status_apply(ref, read["metadata"]["resourceVersion"], status)
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ref.namespace, PLURAL, ref.name, applied, field_manager=SAGA_FIELD_MANAGER, force=True,
        _content_type=APPLY_PATCH,
    )  # fmt: skip


@pytest.mark.parametrize("seen_closing", [False, True], ids=["one-pass-after-close", "a-pass-while-it-closes"])
async def test_a_success_shown_before_the_deletion_is_not_undone_however_far_ahead_temporals_clock_runs(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, kube_api: k8s.ApiClient, temporal_client: Client,
    task_queue: str, seen_closing: bool,
) -> None:  # fmt: skip
    """`kubectl wait --for=condition=Succeeded`, then `kubectl delete`, with Temporal's clock 10 minutes ahead of the
    API server's: the steps' finishedAt and transitionedAt say the success came 10 minutes after the deletion, and the
    run closed after it (its last workflow task late: a worker that died). The API server saw the saga write the
    success before the deletion (the saga's managedFields entry), so the migration stays; undoing it would empty and
    delete the live target. Seen while its run closes, the watcher records that fact, which the saga's last write,
    after the deletion, would hide."""
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, bucket, name="orders-db-to-16")
    manifest["metadata"].update(namespace=namespace, finalizers=[FINALIZER])
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    ref = MigrationRef(namespace=namespace, name="orders-db-to-16", uid=created["metadata"]["uid"])
    kube = Kube(kube_api, "test")
    handler = pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace))
    async with Worker(
        temporal_client, task_queue=task_queue, workflows=[_FinishesItsRetentionCleanup],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):  # fmt: skip
        run = await temporal_client.start_workflow(
            "FinishesItsRetentionCleanup", id=workflow_id(ref), task_queue=task_queue
        )
        by_temporal = (datetime.now(UTC) + TEMPORAL_AHEAD).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        shown = {
            "phase": "Running" if seen_closing else "Succeeded",
            "workflow": {"namespace": temporal_client.namespace, "id": workflow_id(ref)},
            "steps": _every_step_succeeded(datetime.now(UTC) + TEMPORAL_AHEAD),
            "transitionedAt": by_temporal,
        }
        _apply_as_the_saga(custom, ref, shown)
        before = await kube.read_migration(ref)
        assert before is not None
        await asyncio.sleep(1)  # the API server's clock has whole seconds: the deletion comes in a later one
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, ref.name)
        deleted = await _watched_deletion(kube, ref, before.metadata.resource_version)
        requested = deleted.metadata.deletion_timestamp
        assert requested is not None
        written = deleted.metadata.status_written_at(SAGA_FIELD_MANAGER)
        assert written is not None
        assert written < requested, "the fact, as the watcher reads it"
        dated = deleted.status.succeeded_at
        assert dated is not None
        assert dated > requested + TEMPORAL_AHEAD / 2, "by Temporal's clock, long after the deletion"
        if seen_closing:
            await handler.handle(deleted, gone=False, run_closed=False, received=0.0)
            closing = await kube.read_migration(ref)
            assert closing is not None
            assert closing.status.deletion is not None
            assert SUCCESS_SHOWN_FIRST in closing.status.deletion.message
            await asyncio.sleep(1)
            _apply_as_the_saga(custom, ref, {**shown, "phase": "Succeeded"})  # its last write, after the deletion

        async def a_second_later() -> bool:
            return datetime.now(UTC) >= requested + timedelta(seconds=1.5)

        await eventually("the clock to pass the deletion's second", a_second_later)
        await run.signal("cleaned")
        assert (await run.result())["phase"] == "Succeeded"
        closed = await kube.read_migration(ref)
        assert closed is not None

        await handler.handle(closed, gone=False, run_closed=False, received=0.0)

    assert await kube.read_migration(ref) is None, "released"
    assert await _started(temporal_client, undo_workflow_id(ref)) is None, "nothing undone"
    reasons = await _reasons(kubectl, namespace, ref.name)
    assert "UndoingBeforeDeletion" not in reasons
    assert "SuccessKept" not in reasons, "kept by the fact, not by the allowance for the clocks"


async def _watched_deletion(kube: Kube, ref: MigrationRef, since: str) -> Migration:
    """The Migration as the watcher's watch brings it once its deletion was asked for (managedFields included)."""
    async with asyncio.timeout(30), contextlib.aclosing(kube.watch_migrations(ref.namespace, since)) as events:
        async for event in events:
            found = event.migration
            if found is not None and found.metadata.uid == ref.uid and found.metadata.deletion_timestamp is not None:
                return found
    raise AssertionError(f"the watch ended without the deletion of Migration {ref}")


async def _deleted_while_closing(
    custom: k8s.CustomObjectsApi, kube: Kube, handler: MigrationHandler, run: WorkflowHandle[Any, Any],
    ref: MigrationRef, status: dict[str, Any],
) -> Migration:  # fmt: skip
    """Writes `status` as the saga would, deletes the Migration and hands the deletion to the watcher's handler: the
    run, closing after its success, is not asked to cancel, and the Migration is held until it has closed. Returns
    the Migration as the deletion left it, before the handler's pass."""
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ref.namespace, PLURAL, ref.name, {"status": status}, field_manager="ferry-saga"
    )
    custom.delete_namespaced_custom_object(GROUP, VERSION, ref.namespace, PLURAL, ref.name)
    deleted = await kube.read_migration(ref)
    assert deleted is not None
    assert deleted.metadata.deletion_timestamp is not None

    await handler.handle(deleted, gone=False, run_closed=False, received=0.0)

    asked = [event.event_type async for event in run.fetch_history_events()]
    assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED not in asked
    waiting = await kube.read_migration(ref)
    assert waiting is not None, "held until the run has closed"
    assert waiting.status.deletion is not None
    assert waiting.status.deletion.message.startswith("its run has succeeded and is closing")
    return deleted
