"""Temporal is not a back door: a run started by hand, with an input no Migration asked for, acts on nothing.

Whoever reaches the Temporal frontend can start `MigrationV2` with an input of their
choosing. These runs are started the way such a person would, with the temporal CLI,
against ferry's real worker; the API server's audit log (which the local stack keeps for
Secrets) shows that no Secret was even read.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.client import Client, WorkflowFailureError

from devstack.stack.install import Binaries
from devstack.stack.kube import AUDIT_LOG
from devstack.stack.stack import StackInfo
from ferry.api.integrity import NOT_BACKED
from ferry.api.migration import MigrationSpec
from ferry.api.saga import (
    UNDO_WORKFLOW_NAME,
    WORKFLOW_NAME,
    MigrationInput,
    MigrationRef,
    UndoMigrationInput,
    undo_workflow_id,
    workflow_id,
)
from tests.cluster import SOURCE
from tests.conftest import Kubectl
from tests.end_to_end import apply_migration, eventually, migration_manifest
from tests.operator.conftest import migration_status
from worker.settings import WorkerSettings

pytestmark = pytest.mark.usefixtures("migration_crd", "source_workload", "migration_secrets")

CANARY = "audit-canary"


def _forge(ref: MigrationRef, manifest: dict[str, Any], case: str) -> tuple[MigrationRef, MigrationSpec, str]:
    """The ref, spec and workflow ID of a forged start, from a real Migration's."""
    spec = MigrationSpec.model_validate(manifest["spec"])
    if case == "another image":
        target = spec.target.model_copy(update={"image": "registry.example/attacker:latest"})
        return ref, spec.model_copy(update={"target": target}), workflow_id(ref)
    if case == "a Migration that does not exist":
        ghost = MigrationRef(namespace=ref.namespace, name="no-such-migration", uid=str(uuid.uuid4()))
        return ghost, spec, workflow_id(ghost)
    assert case == "a workflow ID of its own"
    return ref, spec, f"migration/{ref.namespace}/{ref.name}/{uuid.uuid4()}"


def _secret_reads(stack: StackInfo, namespace: str) -> list[str]:
    """Who read which Secret of `namespace`, per the API server's audit log (get, list, watch)."""
    reads = []
    for line in (stack.logs_dir / AUDIT_LOG).read_text().splitlines():
        entry = json.loads(line)
        target = entry.get("objectRef") or {}
        if target.get("namespace") == namespace and entry.get("verb") in ("get", "list", "watch"):
            reads.append(f"{entry['verb']} {target.get('name', '*')} by {entry['user']['username']}")
    return reads


@pytest.mark.parametrize("case", ["another image", "a Migration that does not exist", "a workflow ID of its own"])
async def test_a_run_started_by_hand_with_a_forged_input_fails_at_once_and_changes_nothing(
    case: str, kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, binaries: Binaries,
    kube_api: k8s.ApiClient, temporal_client: Client, task_queue: str, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    manifest = migration_manifest(stack, bucket)
    real = apply_migration(kubectl, namespace, manifest)  # no watcher runs: only the forged run exists
    ref, spec, forged_id = _forge(real, manifest, case)
    service_before = k8s.CoreV1Api(kube_api).read_namespaced_service(SOURCE, namespace).spec.selector

    forged = MigrationInput(ref=ref, generation=1, spec=spec).model_dump_json()
    await asyncio.to_thread(
        subprocess.run,
        [
            str(binaries.temporal), "workflow", "start", f"--address={stack.temporal_address}",
            f"--type={WORKFLOW_NAME}", f"--task-queue={task_queue}", f"--workflow-id={forged_id}", f"--input={forged}",
        ],
        check=True, capture_output=True,
    )  # fmt: skip

    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(temporal_client.get_workflow_handle(forged_id).result(), timeout=120)
    said = _causes(failed.value)
    assert NOT_BACKED in said, said
    assert "refused" in said, said

    stateful_sets = k8s.AppsV1Api(kube_api).list_namespaced_stateful_set(namespace).items
    assert [item.metadata.name for item in stateful_sets] == [SOURCE]
    assert k8s.CoreV1Api(kube_api).read_namespaced_service(SOURCE, namespace).spec.selector == service_before
    assert "phase" not in await migration_status(kubectl, namespace, real.name)
    # The audit log is written as requests finish: a read of our own, once logged, shows it is current.
    await asyncio.to_thread(kubectl, "create", "secret", "generic", CANARY, "-n", namespace)
    await asyncio.to_thread(kubectl, "get", "secret", CANARY, "-n", namespace)
    await eventually(
        "the audit log to show the canary read",
        lambda: asyncio.to_thread(lambda: any(CANARY in read for read in _secret_reads(stack, namespace))),
        30,
    )
    assert [read for read in _secret_reads(stack, namespace) if CANARY not in read] == []


async def test_an_undo_started_by_hand_for_a_migration_that_is_not_being_deleted_is_refused_and_changes_nothing(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, binaries: Binaries,
    kube_api: k8s.ApiClient, temporal_client: Client, task_queue: str, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    """The real input of the real Migration, under the undo's own workflow ID: the watcher starts that run only once
    the Migration is being deleted, so anyone else's would take back a migration that is done and serving."""
    manifest = migration_manifest(stack, bucket)
    real = apply_migration(kubectl, namespace, manifest)
    service_before = k8s.CoreV1Api(kube_api).read_namespaced_service(SOURCE, namespace).spec.selector
    undo = UndoMigrationInput(
        ref=real, generation=1, spec=MigrationSpec.model_validate(manifest["spec"]), reason="started by hand"
    ).model_dump_json()

    await asyncio.to_thread(
        subprocess.run,
        [
            str(binaries.temporal), "workflow", "start", f"--address={stack.temporal_address}",
            f"--type={UNDO_WORKFLOW_NAME}", f"--task-queue={task_queue}", f"--workflow-id={undo_workflow_id(real)}",
            f"--input={undo}",
        ],
        check=True, capture_output=True,
    )  # fmt: skip

    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(temporal_client.get_workflow_handle(undo_workflow_id(real)).result(), timeout=120)
    said = _causes(failed.value)
    assert NOT_BACKED in said, said
    assert "which ferry does only once the Migration is being deleted" in said, said
    assert k8s.CoreV1Api(kube_api).read_namespaced_service(SOURCE, namespace).spec.selector == service_before


def _causes(error: BaseException | None) -> str:
    said = []
    while error is not None:
        said.append(f"{type(error).__name__}: {error} ({getattr(error, 'type', '')})")
        error = error.__cause__
    return " <- ".join(said)
