"""A spec ferry cannot run (an older CRD let it through) ends Failed in a way `kubectl wait` sees."""

from __future__ import annotations

import asyncio
import json

import pytest
from kubernetes import client as k8s
from temporalio.client import Client

from devstack.stack.stack import StackInfo
from ferry.api.saga import MigrationRef
from tests.conftest import Kubectl
from tests.end_to_end import migration_manifest, watcher_settings
from tests.watcher.conftest import has_workflow, pass_handler
from watcher.kube import Kube

pytestmark = pytest.mark.usefixtures("migration_crd")

GROUP, VERSION, PLURAL = "ferry.dev", "v1alpha1", "migrations"


async def test_a_migration_whose_spec_does_not_validate_fails_with_conditions_kubectl_wait_reads(
    kubectl: Kubectl, namespace: str, stack: StackInfo, kube_api: k8s.ApiClient, temporal_client: Client,
    task_queue: str,
) -> None:  # fmt: skip
    """`kubectl wait --for=condition=Succeeded=false` waited for ever: the Failed status had no conditions."""
    custom = k8s.CustomObjectsApi(kube_api)
    created = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, migration_manifest(stack, "snapshots", name="orders-db-to-16")
    )
    ref = MigrationRef(namespace=namespace, name="orders-db-to-16", uid=created["metadata"]["uid"])
    kube = Kube(kube_api, "test")
    seen = await kube.read_migration(ref)
    assert seen is not None
    # The CRD installed here refuses such a spec; one installed by an older ferry took it, and the watcher read:
    problem = "spec.target.storageSize: a positive quantity, e.g. 10Gi"
    invalid = seen.model_copy(update={"spec": None, "spec_problem": problem})

    await pass_handler(temporal_client, kube, watcher_settings(stack, task_queue, namespace)).handle(
        invalid, gone=False, run_closed=False, received=0.0
    )

    waited = await asyncio.to_thread(
        kubectl, "wait", "migration", ref.name, "-n", namespace, "--for=condition=Succeeded=false", "--timeout=20s",
        check=False, timeout=60,
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr
    status = json.loads(
        (await asyncio.to_thread(kubectl, "get", "migration", ref.name, "-n", namespace, "-o", "json")).stdout
    )["status"]
    assert status["phase"] == "Failed"
    assert status["message"].startswith(f"ferry cannot run this Migration: {problem}")
    assert status["observedGeneration"] == created["metadata"]["generation"]
    conditions = {condition["type"]: condition for condition in status["conditions"]}
    assert {kind: condition["status"] for kind, condition in conditions.items()} == {
        "Succeeded": "False", "Progressing": "False", "AwaitingApproval": "False", "Paused": "False",
        "RolledBack": "False", "Planned": "False",
    }  # fmt: skip
    assert {condition["reason"] for condition in conditions.values()} == {"Failed"}
    assert {condition["observedGeneration"] for condition in conditions.values()} == {status["observedGeneration"]}
    assert not await has_workflow(temporal_client, ref), "nothing was started"
