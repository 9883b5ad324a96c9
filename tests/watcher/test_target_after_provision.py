"""A target Secret that names the Pods provision has yet to create: the Migration waits for them instead of failing
its precheck, and checks the target once they are there.

On a cluster, the target Secret names the target StatefulSet's first Pod
(`orders-db-16-0.orders-db-16`), which does not exist before provision: the precheck
refused it as unreachable, so ferry could not migrate onto the target it creates. Here
the target's Pods are kwok's, with no server in them, so the Secret first names a port
nothing listens on, and is pointed at the real target server once provision is done,
as the Pod's name starts to resolve on a cluster.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.client import Client

from devstack.stack.readiness import free_port
from devstack.stack.stack import StackInfo
from ferry.api.saga import ControlRequest, Signal, workflow_id
from tests.conftest import Kubectl
from tests.end_to_end import TARGET_SECRET, Databases, apply_migration, eventually, migration_manifest
from watcher.settings import WatcherSettings
from worker.settings import WorkerSettings

pytestmark = pytest.mark.usefixtures("migration_crd", "source_workload", "migration_secrets")


def _status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    found = kubectl("get", "migration", name, "-n", namespace, "-o", "json", check=False)
    return dict(json.loads(found.stdout).get("status") or {}) if found.returncode == 0 else {}


def _target_port(kube_api: k8s.ApiClient, namespace: str, port: int) -> None:
    k8s.CoreV1Api(kube_api).patch_namespaced_secret(TARGET_SECRET, namespace, {"stringData": {"port": str(port)}})


def _stateful_sets(kube_api: k8s.ApiClient, namespace: str) -> list[str]:
    return sorted(item.metadata.name for item in k8s.AppsV1Api(kube_api).list_namespaced_stateful_set(namespace).items)


@pytest.mark.parametrize("answers_after_provision", [True, False], ids=["answers", "still-silent"])
async def test_a_target_that_answers_only_once_provision_made_it_is_checked_then_and_migrated_onto(
    answers_after_provision: bool, kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str,
    databases: Databases, kube_api: k8s.ApiClient, temporal_client: Client, running_watcher: WatcherSettings,
    ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    _target_port(kube_api, namespace, free_port())  # nothing answers there: the Pod is yet to be made
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, approval={"required": True}))

    async def awaiting_approval() -> bool:
        return (await asyncio.to_thread(_status, kubectl, namespace, ref.name)).get("phase") == "AwaitingApproval"

    await eventually("the approval gate, provision done", awaiting_approval, within=180)
    status = await asyncio.to_thread(_status, kubectl, namespace, ref.name)
    assert "targetVersion" not in status["plan"], "the precheck let the target wait"
    assert "target" not in (status.get("databases") or {}), "nothing of it pinned yet"
    if answers_after_provision:
        _target_port(kube_api, namespace, databases.target.port)

    run = temporal_client.get_workflow_handle(workflow_id(ref))
    await run.signal(Signal.APPROVE.value, ControlRequest(by="alice"))

    async def finished() -> bool:
        phase = (await asyncio.to_thread(_status, kubectl, namespace, ref.name)).get("phase")
        return phase in ("Succeeded", "RolledBack", "Failed")

    await eventually("the run to finish", finished, within=240)
    status = await asyncio.to_thread(_status, kubectl, namespace, ref.name)
    if answers_after_provision:
        assert status["phase"] == "Succeeded", status.get("message")
        assert status["databases"]["target"], "pinned by the check after provision"
    else:
        assert status["phase"] == "RolledBack", status.get("message")
        assert "could not connect to database" in status["message"]
        assert _stateful_sets(kube_api, namespace) == ["orders-db"], "the target provision made is gone"
        freeze = next(step for step in status["steps"] if step["name"] == "freeze")
        assert "could not connect" in freeze["lastError"]
