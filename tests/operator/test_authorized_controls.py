"""Controls are taken only from the users RBAC grants them, signed with their own names, all the way to the status.

The stack's API server enforces deploy/admission (as a cluster running ferry does); ferry's real watcher and worker
run in this process. People are impersonated with kubectl (`--as`), and `kubectl ferry`, which cannot impersonate,
runs with the token of a ServiceAccount: the name it signs with is the one the API server gives that account.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.stack.stack import StackInfo
from ferry.kubectl.controls import who_from_username
from ferry.kubectl.errors import Exit
from tests.cluster import token_kubeconfig
from tests.conftest import Kubectl, grant
from tests.operator.conftest import MIGRATION_DONE, at_approval_gate, migration_status, wait_phase
from watcher.settings import WatcherSettings
from worker.settings import WorkerSettings

pytestmark = pytest.mark.usefixtures("migration_crd", "control_roles", "source_workload", "migration_secrets")

PLUGIN = Path(sys.executable).parent / "kubectl-ferry"
GRANTS = "(the ClusterRole ferry-operator grants every control, ferry-approver approve)"


def _editor_role(kubectl: Kubectl, namespace: str, subject: str) -> None:
    """Lets `subject` (kubectl's --user=NAME or --serviceaccount=NS:NAME) read and patch Migrations, and list Events,
    with no control verb: what a namespace's editors may have."""
    kubectl("create", "role", "migration-editor", "--verb=get,list,watch,patch", "--resource=migrations.ferry.dev",
            "-n", namespace)  # fmt: skip
    kubectl("create", "role", "event-reader", "--verb=list", "--resource=events", "-n", namespace)
    for role in ("migration-editor", "event-reader"):
        kubectl("create", "rolebinding", role, f"--role={role}", subject, "-n", namespace)


async def test_an_approval_is_taken_from_a_user_granted_approve_and_the_status_names_that_user(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: int,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = await at_approval_gate(kubectl, namespace, stack, bucket)
    grant(kubectl, namespace, "ferry-approver", user="alice")
    _editor_role(kubectl, namespace, "--user=bob")

    def annotate(user: str, value: str) -> subprocess.CompletedProcess[str]:
        return kubectl(f"--as={user}", "annotate", "migration", ref.name, "-n", namespace, f"ferry.dev/approve={value}",
                       check=False)  # fmt: skip

    refused = await asyncio.to_thread(annotate, "bob", "bob: looks fine")
    forged = await asyncio.to_thread(annotate, "alice", "carol: she said so")

    assert refused.returncode == 1
    assert refused.stderr.strip().endswith(
        f'denied request: user "bob" may not approve Migration {namespace}/{ref.name}: '
        f'ferry.dev/approve="bob: looks fine" needs the RBAC verb "approve" on migrations.ferry.dev {GRANTS}'
    ), refused.stderr
    assert forged.returncode == 1
    assert 'user "alice" may not sign ferry.dev/approve="carol: she said so" with another name' in forged.stderr
    status = await migration_status(kubectl, namespace, ref.name)
    assert status["phase"] == "AwaitingApproval"
    assert "approvedBy" not in status

    approved = await asyncio.to_thread(annotate, "alice", "alice: change 4711")
    assert approved.returncode == 0, approved.stderr

    status = await wait_phase(kubectl, ref, "Succeeded")
    assert status["approvedBy"] == "alice"
    # The watcher acted on the annotation and recorded it; its own writes met no control rule.
    assert status["controls"]["acknowledged"] == {"ferry.dev/approve": "alice: change 4711"}


def _plugin_as(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("FERRY_TEMPORAL")}
    env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run([str(PLUGIN), *args], capture_output=True, text=True, env=env, timeout=120, check=False)


async def test_kubectl_ferry_signs_as_the_service_account_it_runs_as_and_says_why_a_control_is_refused(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: int, tmp_path: Path,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = await at_approval_gate(kubectl, namespace, stack, bucket)
    assert stack.kubeconfig is not None
    kubeconfigs = {}
    for account in ("deployer", "intern"):
        kubectl("create", "serviceaccount", account, "-n", namespace)
        token = kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
        kubeconfigs[account] = token_kubeconfig(stack.kubeconfig, account, token, tmp_path / f"{account}.yaml")
    grant(kubectl, namespace, "ferry-approver", service_account="deployer")
    _editor_role(kubectl, namespace, f"--serviceaccount={namespace}:intern")
    # As kubectl ferry signs for system:serviceaccount:NS:NAME: system.serviceaccount.NS.NAME, cut to 63 characters.
    deployer = who_from_username(f"system:serviceaccount:{namespace}:deployer")
    intern = who_from_username(f"system:serviceaccount:{namespace}:intern")

    refused = await asyncio.to_thread(_plugin_as, kubeconfigs["intern"], "approve", ref.name, "-n", namespace)

    assert refused.returncode == Exit.ERROR
    assert refused.stderr == (
        f"error: the API server at {stack.kube_server} refused to change Migration {namespace}/{ref.name}: "
        f'user "system:serviceaccount:{namespace}:intern" may not approve Migration {namespace}/{ref.name}: '
        f'ferry.dev/approve="{intern}" needs the RBAC verb "approve" on '
        f"migrations.ferry.dev {GRANTS}\n"
    )

    approved = await asyncio.to_thread(
        _plugin_as, kubeconfigs["deployer"], "approve", ref.name, "-n", namespace, "--reason", "change 4711"
    )

    assert approved.returncode == Exit.OK, approved.stderr
    assert approved.stdout.startswith(f"approve accepted (ferry.dev/approve={deployer}: change 4711): ")
    status = await wait_phase(kubectl, ref, "Succeeded", within=MIGRATION_DONE)
    assert status["approvedBy"] == deployer
