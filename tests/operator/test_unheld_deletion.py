"""A run whose Migration is being deleted without ferry's finalizer takes back what it did, and does nothing more.

Without deploy/admission/finalizer, the watcher starts a Migration's workflow before it adds
the finalizer (one write with the annotation naming the run). A deletion landing between the two, while another
controller's finalizer keeps the object, leaves a run that ferry's finalizer does not
hold. The watcher cancels it when it sees the deletion; here no watcher runs at all (it
died right after the start), and the worker's gate alone must keep the run from going
on: its next step is refused, and its undos run.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from kubernetes import client as k8s
from temporalio.client import Client, WorkflowFailureError

from devstack.stack.stack import StackInfo
from ferry.api.saga import ControlRequest, Signal
from tests.cluster import SOURCE, without_finalizer_at_create
from tests.conftest import Kubectl
from tests.end_to_end import apply_migration, migration_manifest, start_migration
from tests.operator.conftest import MIGRATION_DONE, migration_status, wait_phase
from worker.settings import WorkerSettings

pytestmark = pytest.mark.usefixtures("migration_crd", "source_workload", "migration_secrets")

HOLD = "example.com/hold"
"""Another controller's finalizer, which keeps the deleted Migration in place."""


async def test_a_run_whose_migration_is_deleted_without_ferrys_finalizer_runs_no_further_step_and_undoes_the_rest(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, kube_api: k8s.ApiClient,
    temporal_client: Client, task_queue: str, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    manifest = migration_manifest(stack, bucket, approval={"required": True})
    manifest["metadata"]["finalizers"] = [HOLD]
    # A cluster without deploy/admission/finalizer: there the watcher adds ferry's finalizer after the start.
    await asyncio.to_thread(without_finalizer_at_create, kube_api, namespace, manifest)
    ref = apply_migration(kubectl, namespace, manifest)
    handle = await start_migration(temporal_client, ref, manifest, task_queue)  # and the watcher died here
    await wait_phase(kubectl, ref, "AwaitingApproval")  # provisioned: the target exists
    try:
        await asyncio.to_thread(kubectl, "delete", "migration", ref.name, "-n", namespace, "--wait=false")

        await handle.signal(Signal.APPROVE.value, ControlRequest(by="carol"))  # sent before the deletion, say
        with contextlib.suppress(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), MIGRATION_DONE)

        status = await migration_status(kubectl, namespace, ref.name)
        steps = {step["name"]: step for step in status["steps"]}
        assert status["phase"] == "RolledBack", status
        assert "ferry's finalizer does not hold it" in steps["freeze"]["lastError"]
        assert steps["provision"]["state"] == "Compensated"
        stateful_sets = k8s.AppsV1Api(kube_api).list_namespaced_stateful_set(namespace).items
        assert [item.metadata.name for item in stateful_sets] == [SOURCE], "the target was taken back"
        finalizers = await asyncio.to_thread(
            kubectl, "get", "migration", ref.name, "-n", namespace, "-o", "jsonpath={.metadata.finalizers}"
        )
        assert finalizers.stdout == f'["{HOLD}"]'
    finally:
        await asyncio.to_thread(
            kubectl,
            "patch",
            "migration",
            ref.name,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":[]}}',
        )
