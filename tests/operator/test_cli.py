"""What an operator does from a shell: kubectl wait and describe, and signals from the temporal CLI.

Every migration here is real: ferry's watcher and worker run against the session stack,
moving a real database between the two PostgreSQL instances through the real S3 server.
The same controls through tctl are in test_tctl.py.
"""

from __future__ import annotations

import asyncio
import subprocess

import psycopg
import pytest
from kubernetes import client as k8s

from devstack.stack.install import Binaries
from devstack.stack.stack import StackInfo
from ferry.api.saga import MigrationRef, workflow_id
from tests.conftest import Kubectl
from tests.end_to_end import TARGET_SECRET, Databases, apply_migration, migration_manifest
from tests.operator.conftest import MIGRATION_DONE, at_approval_gate, wait_phase
from watcher.settings import WatcherSettings
from worker.settings import WorkerSettings

pytestmark = pytest.mark.usefixtures("migration_crd", "source_workload", "migration_secrets")


def _temporal(binaries: Binaries, stack: StackInfo, *args: str) -> None:
    subprocess.run(
        [str(binaries.temporal), *args, f"--address={stack.temporal_address}"], check=True, capture_output=True
    )


async def _signal(binaries: Binaries, stack: StackInfo, ref: MigrationRef, name: str, payload: str = "") -> None:
    """`temporal workflow signal` as an operator types it, with an optional JSON input."""
    extra = [f"--input={payload}"] if payload else []
    await asyncio.to_thread(
        _temporal, binaries, stack, "workflow", "signal", f"--workflow-id={workflow_id(ref)}", f"--name={name}", *extra
    )


async def test_kubectl_wait_returns_when_the_migration_succeeds_and_describe_lists_the_step_events(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: int, databases: Databases,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket))

    waited = await asyncio.to_thread(
        kubectl, "wait", "--for=condition=Succeeded", f"migration/{ref.name}", "-n", namespace,
        f"--timeout={MIGRATION_DONE}s", timeout=MIGRATION_DONE + 60,
    )  # fmt: skip

    assert "condition met" in waited.stdout
    described = (await asyncio.to_thread(kubectl, "describe", "migration", ref.name, "-n", namespace)).stdout
    for step in ("provision", "freeze", "snapshot", "migrate", "verify", "switch-traffic", "scale-down-old"):
        assert f"{step}: running (attempt 1)" in described
        assert f"{step}: succeeded" in described
    assert "StepStarted" in described
    assert "Succeeded" in described
    listed = (await asyncio.to_thread(kubectl, "get", "migrations", "-n", namespace)).stdout.splitlines()
    assert listed[0].split() == ["NAME", "PHASE", "STEP", "PROGRESS", "AGE", "MESSAGE"]
    assert listed[1].split()[:2] == [ref.name, "Succeeded"]
    with psycopg.connect(databases.target.dsn) as conn:
        assert conn.execute("select count(*) from orders").fetchone() == (orders,)


async def test_approve_with_the_temporal_cli_lets_the_migration_finish(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: int, binaries: Binaries,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = await at_approval_gate(kubectl, namespace, stack, bucket)

    await _signal(binaries, stack, ref, "approve", '{"by": "carol"}')

    status = await wait_phase(kubectl, ref, "Succeeded")
    assert status["approvedBy"] == "carol"


async def test_pause_and_resume_with_the_temporal_cli_hold_the_migration_before_its_next_step(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: int, binaries: Binaries,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = await at_approval_gate(kubectl, namespace, stack, bucket)
    await _signal(binaries, stack, ref, "pause")
    await _signal(binaries, stack, ref, "approve", '{"by": "dave"}')

    paused = await wait_phase(kubectl, ref, "Paused")
    assert paused["message"] == "paused before freeze; send resume to go on"  # given while awaiting approval
    await _signal(binaries, stack, ref, "resume")
    await wait_phase(kubectl, ref, "Succeeded")


async def test_rollback_with_the_temporal_cli_undoes_the_completed_steps(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: int, binaries: Binaries,
    kube_api: k8s.ApiClient, running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = await at_approval_gate(kubectl, namespace, stack, bucket)

    await _signal(binaries, stack, ref, "rollback", '{"by": "erin", "reason": "not today"}')

    status = await wait_phase(kubectl, ref, "RolledBack")
    assert status["message"] == "rolled back: rollback requested by erin: not today"
    states = {step["name"]: step["state"] for step in status["steps"]}
    assert states["provision"] == "Compensated"
    assert states["freeze"] == "Pending"  # approval is asked before the source stops taking writes
    assert states["switch-traffic"] == "Pending"
    names = [item.metadata.name for item in k8s.AppsV1Api(kube_api).list_namespaced_stateful_set(namespace).items]
    assert names == ["orders-db"]


async def test_cancel_with_the_temporal_cli_rolls_back(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: int, binaries: Binaries,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = await at_approval_gate(kubectl, namespace, stack, bucket)

    await asyncio.to_thread(_temporal, binaries, stack, "workflow", "cancel", f"--workflow-id={workflow_id(ref)}")

    status = await wait_phase(kubectl, ref, "RolledBack")
    assert status["message"] == "rolled back: the workflow was cancelled"


async def test_retry_with_the_temporal_cli_reruns_a_failed_step_under_the_pause_policy(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: int, binaries: Binaries,
    kube_api: k8s.ApiClient, running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    core = k8s.CoreV1Api(kube_api)
    good = core.read_namespaced_secret(TARGET_SECRET, namespace).data["password"]
    core.patch_namespaced_secret(TARGET_SECRET, namespace, {"stringData": {"password": "wrong"}})
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, failurePolicy="Pause"))
    paused = await wait_phase(kubectl, ref, "Paused")
    # The precheck finds the refused credentials before anything changes.
    assert paused["currentStep"] == "precheck"
    assert "PrecheckFailed" in paused["message"]
    assert "credentials" in paused["message"]

    core.patch_namespaced_secret(TARGET_SECRET, namespace, {"data": {"password": good}})
    await _signal(binaries, stack, ref, "retry", '{"by": "frank"}')

    status = await wait_phase(kubectl, ref, "Succeeded")
    precheck = next(step for step in status["steps"] if step["name"] == "precheck")
    assert precheck["attempts"] == 2
