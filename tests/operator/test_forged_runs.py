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
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.converter import default as default_converter
from temporalio.exceptions import ActivityError
from temporalio.worker import (
    Interceptor,
    StartActivityInput,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from devstack.stack.install import Binaries
from devstack.stack.kube import AUDIT_LOG
from devstack.stack.stack import StackInfo
from ferry.api.integrity import CLAIM_HEADER, NOT_BACKED, Claim, Scope, plan_digest
from ferry.api.migration import GROUP, PLURAL, VERSION, MigrationSpec
from ferry.api.saga import (
    UNDO_WORKFLOW_NAME,
    WORKFLOW_NAME,
    KubeActivity,
    MigrationInput,
    MigrationRef,
    ProvisionInput,
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
    said = await _started_by_hand(binaries, stack, temporal_client, WORKFLOW_NAME, task_queue, forged_id, forged)
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

    said = await _started_by_hand(
        binaries, stack, temporal_client, UNDO_WORKFLOW_NAME, task_queue, undo_workflow_id(real), undo
    )
    assert NOT_BACKED in said, said
    assert "which ferry does only once the Migration is being deleted" in said, said
    assert k8s.CoreV1Api(kube_api).read_namespaced_service(SOURCE, namespace).spec.selector == service_before


async def test_a_later_run_of_a_finished_migrations_workflow_acts_on_nothing_and_leaves_its_status(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, binaries: Binaries,
    kube_api: k8s.ApiClient, temporal_client: Client, task_queue: str, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    """The Migration finished (Succeeded) in one run of its workflow; another run under the same ID, with the real
    input, here started by hand as `temporal workflow start` would once the first closed (a reset's new run looks
    the same to the worker), replays nothing of a world that moved on: it acts on nothing, and the status stays."""
    manifest = migration_manifest(stack, bucket)
    real = apply_migration(kubectl, namespace, manifest)
    finished = {"phase": "Succeeded", "workflow": {"namespace": "default", "id": workflow_id(real), "runId": "run-0"}}
    k8s.CustomObjectsApi(kube_api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, real.name, {"status": finished}
    )
    service_before = k8s.CoreV1Api(kube_api).read_namespaced_service(SOURCE, namespace).spec.selector
    again = MigrationInput(ref=real, generation=1, spec=MigrationSpec.model_validate(manifest["spec"]))

    said = await _started_by_hand(
        binaries, stack, temporal_client, WORKFLOW_NAME, task_queue, workflow_id(real), again.model_dump_json()
    )

    assert NOT_BACKED in said, said
    assert "finished (Succeeded) in run run-0 of workflow" in said, said
    status = await migration_status(kubectl, namespace, real.name)
    assert (status["phase"], status["workflow"]["runId"]) == ("Succeeded", "run-0")
    assert k8s.CoreV1Api(kube_api).read_namespaced_service(SOURCE, namespace).spec.selector == service_before
    stateful_sets = k8s.AppsV1Api(kube_api).list_namespaced_stateful_set(namespace).items
    assert [item.metadata.name for item in stateful_sets] == [SOURCE]


async def _started_by_hand(
    binaries: Binaries, stack: StackInfo, client: Client, kind: str, task_queue: str, started_id: str, input: str
) -> str:
    """Starts a run as a person with the temporal CLI would, against ferry's worker; the causes of its failure."""
    await asyncio.to_thread(
        subprocess.run,
        [
            str(binaries.temporal), "workflow", "start", f"--address={stack.temporal_address}", f"--type={kind}",
            f"--task-queue={task_queue}", f"--workflow-id={started_id}", f"--input={input}",
        ],
        check=True, capture_output=True,
    )  # fmt: skip
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(client.get_workflow_handle(started_id).result(), timeout=120)
    return _causes(failed.value)


def _causes(error: BaseException | None) -> str:
    said = []
    while error is not None:
        said.append(f"{type(error).__name__}: {error} ({getattr(error, 'type', '')})")
        error = error.__cause__
    return " <- ".join(said)


class _ForgedClaims(Interceptor):
    """The attacker's own worker: every activity its workflows schedule carries a claim it made up, as ferry's saga
    would make it for the real Migration (the right ref, the live plan's digest, vouched)."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        claim = self.claim

        class Outbound(WorkflowOutboundInterceptor):
            def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
                payload = default_converter().payload_converter.to_payload(claim.model_dump(mode="json"))
                input.headers = {**input.headers, CLAIM_HEADER: payload}
                return self.next.start_activity(input)

        class Inbound(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(Outbound(outbound))

        return Inbound


@workflow.defn(name="Forger", sandboxed=False)
class _Forger:
    """Runs on the attacker's own task queue and schedules one of ferry's activities on ferry's."""

    @workflow.run
    async def run(self, queue: str, call: ProvisionInput) -> str:
        try:
            await workflow.execute_activity(
                KubeActivity.CHECK_CLUSTER.value, call, task_queue=queue,
                start_to_close_timeout=timedelta(seconds=60), retry_policy=RetryPolicy(maximum_attempts=1),
            )  # fmt: skip
        except ActivityError as error:
            return f"refused: {error.cause}"
        return "ran"


async def test_an_activity_scheduled_by_a_workflow_of_someone_elses_worker_with_a_claim_of_its_own_is_refused(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str,
    temporal_client: Client, task_queue: str, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    """Everything a claim says is public (the Migration, its spec): what the attacker's worker cannot make is the
    signature, under the claim key only ferry's workers hold."""
    manifest = migration_manifest(stack, bucket)
    real = apply_migration(kubectl, namespace, manifest)  # no watcher: the saga's own workflow ID is free
    spec = MigrationSpec.model_validate(manifest["spec"])
    claim = Claim(ref=real, scope=Scope.PLAN, digest=plan_digest(spec), vouched=True)
    attackers = f"attacker-{uuid.uuid4()}"

    async with Worker(
        temporal_client, task_queue=attackers, workflows=[_Forger], interceptors=[_ForgedClaims(claim)],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):  # fmt: skip
        outcome = await temporal_client.execute_workflow(
            "Forger", args=[task_queue, ProvisionInput(ref=real, spec=spec)], id=workflow_id(real),
            task_queue=attackers, result_type=str,
        )  # fmt: skip

    assert outcome.startswith("refused: "), outcome
    assert "not signed with the workers' claim key" in outcome, outcome
