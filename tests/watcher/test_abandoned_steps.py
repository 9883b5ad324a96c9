"""A run that stopped without a word (terminated from outside, or lost by Temporal) leaves no step that `kubectl
describe` shows under way on its Abandoned Migration: each step it left Running, Retrying or Compensating is
Interrupted, on the real API server."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.client import Client

from devstack.stack.stack import StackInfo
from ferry.api.migration import FINALIZER, Migration, StepState
from ferry.api.saga import WORKFLOW_NAME, MigrationRef, UndoMigrationInput, undo_workflow_id, workflow_id
from tests.end_to_end import migration_manifest, watcher_settings
from tests.watcher.conftest import pass_handler
from watcher.kube import Kube
from workflows import plan
from workflows.undo import may_have_run

pytestmark = pytest.mark.usefixtures("migration_crd")

GROUP, VERSION, PLURAL = "ferry.dev", "v1alpha1", "migrations"
T0 = datetime.now(UTC).replace(microsecond=250_000) - timedelta(minutes=10)
"""Whole seconds would be written back without a fraction: every time here keeps its form."""


def _at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _steps(under_way: str, state: str) -> list[dict[str, Any]]:
    """What the saga last wrote: the steps before `under_way` done, it in `state`, the rest to come. A step being
    undone (Compensating) had succeeded first, so it keeps that finish."""
    names = ["precheck", "provision", "freeze", "snapshot", "migrate", "verify", "switch-traffic", "scale-down-old"]
    steps: list[dict[str, Any]] = []
    for index, name in enumerate(names):
        if name == under_way:
            step = {"name": name, "state": state, "attempts": 2, "startedAt": _at(index)}
            if state == "Retrying":
                step["lastError"] = "connection refused"
            if state == "Compensating":
                step.update(undoAttempts=1, finishedAt=_at(index + 0.5))
            steps.append(step)
        elif names.index(under_way) > index:
            steps.append(
                {
                    "name": name,
                    "state": "Succeeded",
                    "attempts": 1,
                    "startedAt": _at(index),
                    "finishedAt": _at(index + 0.5),
                }
            )
        else:
            steps.append({"name": name, "state": "Pending"})
    return steps


async def _ended(client: Client, ref: MigrationRef, how: str, task_queue: str) -> str | None:
    """Ends the Migration's run from outside as `how` says; returns its run ID (None: Temporal never had it)."""
    if how == "lost":
        return None
    handle = await client.start_workflow(WORKFLOW_NAME, id=workflow_id(ref), task_queue=task_queue)  # no worker
    await handle.terminate(reason="operator gave up")
    return handle.result_run_id


@pytest.mark.parametrize(
    ("how", "under_way", "state"),
    [
        pytest.param("terminated", "migrate", "Running", id="terminated-while-a-step-runs"),
        pytest.param("lost", "verify", "Retrying", id="lost-while-a-step-waits-to-retry"),
        pytest.param("terminated", "provision", "Compensating", id="terminated-while-a-step-is-undone"),
    ],
)
async def test_a_step_the_run_left_under_way_shows_interrupted_once_the_migration_is_abandoned(
    how: str, under_way: str, state: str, namespace: str, stack: StackInfo, kube_api: k8s.ApiClient,
    temporal_client: Client, task_queue: str,
) -> None:  # fmt: skip
    """Its finish stays unset (nobody knows when its work stopped, or whether it did) and its last error stays; every
    other step stays as the run wrote it. The message says which step was under way and what that means."""
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, "snapshots", name="orders-db-to-16")
    manifest["metadata"].update(namespace=namespace, finalizers=[FINALIZER])
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    ref = MigrationRef(namespace=namespace, name="orders-db-to-16", uid=created["metadata"]["uid"])
    run_id = await _ended(temporal_client, ref, how, task_queue)
    written = _steps(under_way, state)
    saga = {
        "phase": "RollingBack" if state == "Compensating" else "Running",
        "currentStep": under_way,
        "message": f"{under_way}: running (attempt 2)",
        "workflow": {
            "namespace": temporal_client.namespace,
            "id": workflow_id(ref),
            "runId": run_id or str(uuid.uuid4()),
        },
        "steps": written,
    }
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, ref.name, {"status": saga}, field_manager="ferry-saga"
    )
    kube = Kube(kube_api, "test")
    seen = await kube.read_migration(ref)
    assert seen is not None

    await pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace)).handle(
        seen, gone=False, run_closed=True, received=0.0
    )

    status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, ref.name)["status"]
    assert status["phase"] == "Abandoned"
    assert "currentStep" not in status
    shown = {step["name"]: step for step in status["steps"]}
    assert {name: step["state"] for name, step in shown.items() if step["state"] not in ("Succeeded", "Pending")} == {
        under_way: "Interrupted"
    }
    as_written = {step["name"]: {"attempts": 0, "undoAttempts": 0, **step} for step in written}  # with the defaults
    assert shown == {**as_written, under_way: {**as_written[under_way], "state": "Interrupted"}}, "only its state"
    assert (
        f"{under_way} was under way when the run stopped, and nobody recorded how that ended: status.steps shows it "
        "Interrupted, and what it did may be done in part, in full or not at all." in status["message"]
    )


async def test_a_step_the_run_finished_after_the_pass_read_the_migration_keeps_its_finish(
    namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, temporal_client: Client, task_queue: str
) -> None:
    """The pass decides from the state the watch brought; the saga's last write may land after it (migrate done,
    verify started) and before the run is terminated. The watcher's write replaces the list of steps whole, so it is
    built from the read it is conditional on: migrate keeps Succeeded, and verify, not migrate, is Interrupted."""
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, "snapshots", name="orders-db-to-16")
    manifest["metadata"].update(namespace=namespace, finalizers=[FINALIZER])
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    ref = MigrationRef(namespace=namespace, name="orders-db-to-16", uid=created["metadata"]["uid"])
    run_id = await _ended(temporal_client, ref, "terminated", task_queue)
    workflow = {"namespace": temporal_client.namespace, "id": workflow_id(ref), "runId": run_id}
    running = {
        "phase": "Running",
        "currentStep": "migrate",
        "workflow": workflow,
        "steps": _steps("migrate", "Running"),
    }
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, ref.name, {"status": running}, field_manager="ferry-saga"
    )
    seen = Migration.parse(custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, ref.name))
    later = _steps("verify", "Running")
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, ref.name, {"status": {"currentStep": "verify", "steps": later}},
        field_manager="ferry-saga",
    )  # fmt: skip

    await pass_handler(temporal_client, Kube(kube_api, "test"), watcher_settings(stack, task_queue, namespace)).handle(
        seen, gone=False, run_closed=True, received=0.0
    )

    status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, ref.name)["status"]
    assert status["phase"] == "Abandoned"
    states = {step["name"]: step["state"] for step in status["steps"]}
    assert (states["migrate"], states["verify"]) == ("Succeeded", "Interrupted")
    migrate = next(step for step in status["steps"] if step["name"] == "migrate")
    assert migrate["finishedAt"] == next(step for step in later if step["name"] == "migrate")["finishedAt"]


async def test_under_a_crd_from_before_interrupted_the_migration_is_still_marked_abandoned(
    namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, temporal_client: Client, task_queue: str
) -> None:
    """Helm never upgrades a CRD: one installed by an older ferry refuses the state (422, an unsupported value of an
    enum). The phase is what matters most, so it is written without the steps, which stay as the run left them."""
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, "snapshots", name="orders-db-to-16")
    manifest["metadata"].update(namespace=namespace, finalizers=[FINALIZER])
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    ref = MigrationRef(namespace=namespace, name="orders-db-to-16", uid=created["metadata"]["uid"])
    run_id = await _ended(temporal_client, ref, "terminated", task_queue)
    workflow = {"namespace": temporal_client.namespace, "id": workflow_id(ref), "runId": run_id}
    running = {
        "phase": "Running",
        "currentStep": "migrate",
        "workflow": workflow,
        "steps": _steps("migrate", "Running"),
    }
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, ref.name, {"status": running}, field_manager="ferry-saga"
    )

    class OlderCrd(Kube):
        def _patch_status(self, ref: MigrationRef, status: Any, resource_version: str) -> Migration | None:
            if any(step.get("state") == "Interrupted" for step in status.get("steps", [])):
                raise ApiException(status=422, reason='status.steps[4].state: Unsupported value: "Interrupted"')
            return super()._patch_status(ref, status, resource_version)

    kube = OlderCrd(kube_api, "test")
    seen = await kube.read_migration(ref)
    assert seen is not None

    await pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace)).handle(
        seen, gone=False, run_closed=True, received=0.0
    )

    status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, ref.name)["status"]
    assert status["phase"] == "Abandoned"
    assert {step["name"]: step["state"] for step in status["steps"]}["migrate"] == "Running"


async def test_deleting_a_migration_abandoned_by_a_lost_run_undoes_its_interrupted_step_as_the_running_one_it_was(
    namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, temporal_client: Client, task_queue: str
) -> None:
    """Temporal lost the run while it froze the source, and the watcher marked the Migration Abandoned (HistoryGone),
    the freeze Interrupted. Its deletion starts the undo with the steps as the run left them, freeze Running: the undo
    takes back the freeze and what came before it, and the step after it, which may have begun, exactly as before
    the mark; and a worker older than the state reads that input too."""
    custom = k8s.CustomObjectsApi(kube_api)
    manifest = migration_manifest(stack, "snapshots", name="orders-db-to-16")
    manifest["metadata"].update(namespace=namespace, finalizers=[FINALIZER])
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    ref = MigrationRef(namespace=namespace, name="orders-db-to-16", uid=created["metadata"]["uid"])
    workflow = {"namespace": temporal_client.namespace, "id": workflow_id(ref), "runId": str(uuid.uuid4())}
    running = {"phase": "Running", "currentStep": "freeze", "workflow": workflow, "steps": _steps("freeze", "Running")}
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, ref.name, {"status": running}, field_manager="ferry-saga"
    )
    kube = Kube(kube_api, "test")
    handler = pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace))
    seen = await kube.read_migration(ref)
    assert seen is not None
    await handler.handle(seen, gone=False, run_closed=True, received=0.0)
    abandoned = await kube.read_migration(ref)
    assert abandoned is not None
    assert abandoned.status.history_gone
    assert {step.name: step.state for step in abandoned.status.steps}["freeze"] is StepState.INTERRUPTED

    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, ref.name)
    deleted = await kube.read_migration(ref)
    assert deleted is not None
    await handler.handle(deleted, gone=False, run_closed=False, received=0.0)

    undo = temporal_client.get_workflow_handle(undo_workflow_id(ref))
    started = (await undo.fetch_history()).events[0].workflow_execution_started_event_attributes
    [given] = await temporal_client.data_converter.decode(started.input.payloads, [UndoMigrationInput])
    await undo.terminate("the test is over")  # no worker here runs it
    assert given.status is not None
    assert {step.name: step.state for step in given.status.steps}["freeze"] is StepState.RUNNING
    order = tuple(step.name for step in plan.PLAN)
    assert order[: may_have_run(order, given.status)] == ("precheck", "provision", "freeze", "snapshot")
