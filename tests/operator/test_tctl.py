"""Every row of the README's control table, typed into tctl: each control does what the table says.

tctl (v1.18) sends signals only, so these are the saga's signal handlers at work, as an
operator with the older client reaches them. tctl is not part of ferry: it is found
through the TCTL variable, then PATH, then ../shared/tools/tctl/tctl beside the project,
and these tests skip, saying so, where none is found.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from kubernetes import client as k8s

from devstack.stack.stack import StackInfo
from ferry.api.saga import workflow_id
from tests.conftest import Kubectl
from tests.end_to_end import TARGET_SECRET, apply_migration, eventually, migration_manifest
from tests.operator.conftest import at_approval_gate, wait_phase
from watcher.settings import WatcherSettings
from worker.settings import WorkerSettings

BESIDE_THE_PROJECT = Path(__file__).resolve().parents[3] / "shared" / "tools" / "tctl" / "tctl"


def _find_tctl() -> str | None:
    configured = os.environ.get("TCTL")
    if configured:
        return configured
    return shutil.which("tctl") or (str(BESIDE_THE_PROJECT) if BESIDE_THE_PROJECT.is_file() else None)


TCTL = _find_tctl()

pytestmark = [
    pytest.mark.usefixtures("migration_crd", "source_workload", "migration_secrets", "orders"),
    pytest.mark.skipif(
        TCTL is None,
        reason=f"no tctl: set TCTL to its path, put it on PATH, or place it at {BESIDE_THE_PROJECT} "
        "(the Go module proxy refuses github.com/temporalio/tctl, so ferry cannot build it)",
    ),
]


async def _tctl(stack: StackInfo, *args: str) -> str:
    """Runs tctl against the session's Temporal as an operator types it; its standard output."""
    assert TCTL is not None
    command = [TCTL, f"--address={stack.temporal_address}", f"--namespace={stack.temporal_namespace}", *args]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()}"
    return done.stdout


async def _listed(stack: StackInfo, query: str) -> list[str]:
    """Workflow IDs `tctl workflow list --query` prints (as JSON) for a visibility query."""
    printed = await _tctl(stack, "workflow", "list", "--print_json", "--query", query)
    ids = []
    for line in printed.splitlines():
        line = line.strip().rstrip(",")
        if line.startswith("{"):
            ids.append(json.loads(line)["execution"]["workflowId"])
    return ids


async def _listed_eventually(stack: StackInfo, query: str, workflow: str) -> None:
    """Visibility is eventually consistent: waits until the query lists `workflow`."""
    seen: list[str] = []

    async def listed() -> bool:
        seen[:] = await _listed(stack, query)
        return workflow in seen

    await eventually(f"tctl to list {workflow} for {query!r}", listed, within=60, seen=lambda: str(seen))


async def test_tctl_finds_the_run_reads_its_progress_and_pauses_approves_and_resumes_it(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = await at_approval_gate(kubectl, namespace, stack, bucket)
    run = workflow_id(ref)

    await _listed_eventually(stack, f"FerryNamespace = '{namespace}' AND FerryMigration = '{ref.name}'", run)
    progress = await _tctl(stack, "workflow", "query", "-w", run, "--query_type", "progress")
    assert '"phase":"AwaitingApproval"' in progress.replace(" ", "")

    await _tctl(stack, "workflow", "signal", "-w", run, "-n", "pause")
    await _tctl(stack, "workflow", "signal", "-w", run, "-n", "approve", "-i", '{"by":"alice"}')
    paused = await wait_phase(kubectl, ref, "Paused")
    assert paused["approvedBy"] == "alice"
    assert paused["message"] == "paused before freeze; send resume to go on"  # given while awaiting approval

    await _tctl(stack, "workflow", "signal", "-w", run, "-n", "resume")
    await wait_phase(kubectl, ref, "Succeeded")
    await _listed_eventually(stack, f"FerryNamespace = '{namespace}' AND FerryPhase = 'Succeeded'", run)


async def test_tctl_retry_reruns_the_step_that_failed_under_the_pause_policy(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, kube_api: k8s.ApiClient,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    core = k8s.CoreV1Api(kube_api)
    good = core.read_namespaced_secret(TARGET_SECRET, namespace).data["password"]
    core.patch_namespaced_secret(TARGET_SECRET, namespace, {"stringData": {"password": "wrong"}})
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, failurePolicy="Pause"))
    paused = await wait_phase(kubectl, ref, "Paused")
    assert paused["currentStep"] == "precheck"

    core.patch_namespaced_secret(TARGET_SECRET, namespace, {"data": {"password": good}})
    await _tctl(stack, "workflow", "signal", "-w", workflow_id(ref), "-n", "retry", "-i", '{"by":"frank"}')

    status = await wait_phase(kubectl, ref, "Succeeded")
    precheck = next(step for step in status["steps"] if step["name"] == "precheck")
    assert precheck["attempts"] == 2


async def test_tctl_rollback_undoes_the_steps_with_the_reason_given(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, kube_api: k8s.ApiClient,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = await at_approval_gate(kubectl, namespace, stack, bucket)

    rollback = '{"by":"erin","reason":"not today"}'
    await _tctl(stack, "workflow", "signal", "-w", workflow_id(ref), "-n", "rollback", "-i", rollback)

    status = await wait_phase(kubectl, ref, "RolledBack")
    assert status["message"] == "rolled back: rollback requested by erin: not today"
    assert _stateful_sets(kube_api, namespace) == ["orders-db"]


async def test_tctl_cancel_rolls_the_migration_back(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, kube_api: k8s.ApiClient,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = await at_approval_gate(kubectl, namespace, stack, bucket)

    await _tctl(stack, "workflow", "cancel", "-w", workflow_id(ref))

    status = await wait_phase(kubectl, ref, "RolledBack")
    assert status["message"] == "rolled back: the workflow was cancelled"
    assert _stateful_sets(kube_api, namespace) == ["orders-db"]


async def test_tctl_terminate_abandons_the_run_and_the_readme_query_finds_it(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, kube_api: k8s.ApiClient,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = await at_approval_gate(kubectl, namespace, stack, bucket)
    run = workflow_id(ref)

    await _tctl(stack, "workflow", "terminate", "-w", run, "--reason", "abandoned by grace: done by hand")

    status = await wait_phase(kubectl, ref, "Abandoned")
    assert "abandoned by grace: done by hand" in status["message"]
    # Nothing is undone: what the run did stays for a person to finish or undo.
    assert _stateful_sets(kube_api, namespace) == ["orders-db", "orders-db-16"]
    await _listed_eventually(stack, f"ExecutionStatus = 'Terminated' AND FerryNamespace = '{namespace}'", run)


def _stateful_sets(kube_api: k8s.ApiClient, namespace: str) -> list[str]:
    return sorted(item.metadata.name for item in k8s.AppsV1Api(kube_api).list_namespaced_stateful_set(namespace).items)
