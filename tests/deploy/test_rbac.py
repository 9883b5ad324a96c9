"""deploy/rbac is enough for ferry and no more: a whole Migration under its roles, and what they refuse.

The worker and the watcher run as `ferry worker` and `ferry watcher` processes whose
kubeconfigs carry tokens of the ServiceAccounts ferry-system/ferry-worker and
ferry-system/ferry-watcher (see conftest.py), with the roles of deploy/rbac applied for
real: every call they make is authorized as it would be in their Pods. The whole Migration
runs a second time under the identities the Helm chart (deploy/helm/ferry) makes. The
worker reads Secrets only in the namespaces it is given: each test that needs it lists
its own namespace, as an operator would (`ferry rbac`, or the chart's worker.secretNamespaces).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from devstack.stack.install import Binaries
from devstack.stack.stack import StackInfo
from ferry.clients import kubernetes_client
from tests.cluster import endpoint_pods
from tests.conftest import Kubectl
from tests.deploy.conftest import GrantSecrets, Installation, ServiceAccountKubeconfig
from tests.deploy.files import DEPLOY
from tests.end_to_end import S3_SECRET, Databases, apply_migration, migration_manifest
from tests.postgres.data import contents, create_shop
from tests.processes import FerryProcess, start_ferry, wait_until

SAGA_TIMEOUT = 240.0
RBAC_DENIAL = re.compile(r'serviceaccount:[a-z0-9-]+:ferry-[a-z-]+[\\"]* cannot [a-z]+ resource [\\"]*[\w./]+')
"""How the API server words a refusal by RBAC, in a logged failure (its quotes escaped once per JSON layer)."""
LEASE = "ferry-watcher"
"""The Lease the watcher's Role names (deploy/rbac/watcher_role.yaml) and its Deployment uses."""


RunFerry = Callable[..., FerryProcess]


@pytest.fixture
def run_ferry(stack: StackInfo, task_queue: str, tmp_path: Path) -> Iterator[RunFerry]:
    """Starts `ferry <command>` on the test's task queue, configured as deploy/manager does: by FERRY_ variables."""
    started: list[FerryProcess] = []

    def run(command: str, kubeconfig: Path, **variables: str) -> FerryProcess:
        environment = {
            "FERRY_KUBECONFIG": str(kubeconfig),
            "FERRY_TEMPORAL_ADDRESS": stack.temporal_address or "",
            "FERRY_TEMPORAL_NAMESPACE": stack.temporal_namespace or "default",
            "FERRY_TEMPORAL_UI_URL": stack.temporal_ui_url or "",
            "FERRY_TASK_QUEUE": task_queue,
            **variables,
        }
        process = start_ferry(command, log_path=tmp_path / f"{command}.log", **environment)
        started.append(process)
        return process

    yield run
    for process in started:
        process.stop()


def _migration(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    found = kubectl("get", "migration", name, "-n", namespace, "-o", "json", check=False)
    if found.returncode != 0:
        assert "NotFound" in found.stderr, found.stderr
        return None
    migration: dict[str, Any] = json.loads(found.stdout)
    return migration


@dataclasses.dataclass
class Ferry:
    """ferry's worker and watcher, running as their ServiceAccounts."""

    worker: FerryProcess
    watcher: FerryProcess
    watcher_identity: str

    def assert_never_refused(self) -> None:
        """Neither component met an RBAC denial, not even one that a retry got past."""
        for process in (self.worker, self.watcher):
            process.stop()
            denial = RBAC_DENIAL.search(process.log())
            assert denial is None, f"{process.log_path.stem} was refused {denial.group(0)!r}:\n{process.log()}"


@pytest.fixture
def ferry_as_service_accounts(
    binaries: Binaries,
    installation: Installation,
    service_account_kubeconfig: ServiceAccountKubeconfig,
    grant_secrets: GrantSecrets,
    run_ferry: RunFerry,
    namespace: str,
) -> Ferry:
    """The worker and the watcher as the ServiceAccounts their Deployments name, with the Lease the watcher's names.

    The test's namespace is one the worker is given Secrets in.
    """
    grant_secrets(namespace)
    worker = run_ferry(
        "worker",
        service_account_kubeconfig(installation.service_account("worker"), installation.namespace),
        FERRY_POSTGRES_BINDIR=str(binaries.postgres_bindir),
        FERRY_POLL_INTERVAL="0.2",
    )
    # All namespaces, as deployed: the ClusterRole must allow listing and watching them all.
    identity = f"watcher-{namespace}"
    watcher = run_ferry(
        "watcher",
        service_account_kubeconfig(installation.service_account("watcher"), installation.namespace),
        FERRY_LEASE_NAMESPACE=installation.namespace,
        FERRY_LEASE_NAME=installation.lease,
        FERRY_IDENTITY=identity,
    )
    return Ferry(worker, watcher, identity)


def _status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = (_migration(kubectl, namespace, name) or {}).get("status") or {}
    return status


def _wait_for_phase(kubectl: Kubectl, namespace: str, name: str, ferry: Ferry) -> dict[str, Any]:
    finished = {"Succeeded", "RolledBack", "Failed", "Abandoned"}
    wait_until(
        "the Migration to finish",
        lambda: _status(kubectl, namespace, name).get("phase") in finished,
        SAGA_TIMEOUT,
        ferry.worker,
        ferry.watcher,
    )
    return _status(kubectl, namespace, name)


def _explain(status: dict[str, Any], ferry: Ferry) -> str:
    return f"{json.dumps(status, indent=1)}\n--- worker\n{ferry.worker.log()}\n--- watcher\n{ferry.watcher.log()}"


@pytest.mark.parametrize("installation", ["kustomize", "helm"], indirect=True)
def test_a_whole_migration_and_its_deletion_succeed_under_the_service_accounts_that_deploy_and_the_chart_make(
    stack: StackInfo,
    databases: Databases,
    bucket: str,
    migration_secrets: None,
    source_workload: str,
    migration_crd: str,
    installation: Installation,
    ferry_as_service_accounts: Ferry,
    kube_api: k8s.ApiClient,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    ferry = ferry_as_service_accounts
    create_shop(databases.source, customers=50, orders=500)

    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket))
    status = _wait_for_phase(kubectl, namespace, ref.name, ferry)

    assert status["phase"] == "Succeeded", _explain(status, ferry)
    assert contents(databases.target) == contents(databases.source)
    assert endpoint_pods(kube_api, namespace, "orders-db") == ["orders-db-16-0"]
    lease = k8s.CoordinationV1Api(kube_api).read_namespaced_lease(installation.lease, installation.namespace)
    assert lease.spec.holder_identity == ferry.watcher_identity

    # Deleting it: the watcher holds its finalizer until the worker's retention cleanup has
    # deleted the snapshot with the credentials of the Migration's Secret.
    assert stack.s3_client().list_objects_v2(Bucket=bucket).get("KeyCount") == 1
    kubectl("delete", "migration", ref.name, "-n", namespace, "--wait=false")
    wait_until("the Migration to be gone", lambda: _migration(kubectl, namespace, ref.name) is None, 120, ferry.worker)

    assert stack.s3_client().list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    ferry.assert_never_refused()


def test_a_rollback_after_the_traffic_moved_undoes_every_step_under_the_service_accounts_of_deploy_rbac(
    stack: StackInfo,
    databases: Databases,
    bucket: str,
    migration_secrets: None,
    source_workload: str,
    migration_crd: str,
    ferry_as_service_accounts: Ferry,
    kube_api: k8s.ApiClient,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    ferry = ferry_as_service_accounts
    create_shop(databases.source, customers=50, orders=500)
    source_before = contents(databases.source)
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, soakSeconds=600))

    def soaking() -> bool:
        steps = {step["name"]: step["state"] for step in _status(kubectl, namespace, ref.name).get("steps", [])}
        return steps.get("switch-traffic") == "Succeeded"

    wait_until("the traffic to move to the target", soaking, SAGA_TIMEOUT, ferry.worker, ferry.watcher)
    assert endpoint_pods(kube_api, namespace, "orders-db") == ["orders-db-16-0"]
    # Given by tester, a cluster admin: deploy/admission takes a control only from the user it names.
    kubectl("--as=tester", "--as-group=system:masters", "annotate", "migration", ref.name, "-n", namespace,
            "ferry.dev/rollback=tester: changed my mind")  # fmt: skip
    status = _wait_for_phase(kubectl, namespace, ref.name, ferry)

    assert status["phase"] == "RolledBack", _explain(status, ferry)
    # The watcher records the control it acted on in the status; the saga may finish first.
    wait_until(
        "the watcher to acknowledge the rollback",
        lambda: (
            (_status(kubectl, namespace, ref.name).get("controls") or {}).get("acknowledged")
            == {"ferry.dev/rollback": "tester: changed my mind"}
        ),
        30,
        ferry.watcher,
    )
    assert endpoint_pods(kube_api, namespace, "orders-db") == ["orders-db-0", "orders-db-1"]
    apps, core = k8s.AppsV1Api(kube_api), k8s.CoreV1Api(kube_api)
    assert [s.metadata.name for s in apps.list_namespaced_stateful_set(namespace).items] == ["orders-db"]
    claims = core.list_namespaced_persistent_volume_claim(namespace).items
    assert not [claim.metadata.name for claim in claims if "orders-db-16" in claim.metadata.name]
    assert stack.s3_client().list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert contents(databases.source) == source_before
    ferry.assert_never_refused()


def _forbidden(call: Callable[[], object]) -> bool:
    try:
        call()
    except ApiException as error:
        if error.status == 403:
            return True
        raise
    return False


def test_the_worker_reads_a_secret_it_is_named_but_may_not_list_secrets_or_delete_a_namespace(
    service_account_kubeconfig: ServiceAccountKubeconfig,
    grant_secrets: GrantSecrets,
    kube_api: k8s.ApiClient,
    namespace: str,
) -> None:
    secret = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=S3_SECRET), string_data={"accessKeyId": "a"})
    k8s.CoreV1Api(kube_api).create_namespaced_secret(namespace, secret)
    grant_secrets(namespace)
    with contextlib.closing(kubernetes_client(service_account_kubeconfig("ferry-worker"))) as api:
        core = k8s.CoreV1Api(api)

        # What the role allows works, so the refusals below are the role's, not a broken login.
        assert core.read_namespaced_secret(S3_SECRET, namespace).data["accessKeyId"]
        assert _forbidden(lambda: core.list_namespaced_secret(namespace))
        assert _forbidden(lambda: core.list_secret_for_all_namespaces())
        assert _forbidden(lambda: core.delete_namespace(namespace))


@pytest.fixture
def unlisted_namespace(kube_api: k8s.ApiClient, namespace: str) -> Iterator[str]:
    """A second namespace of the test's own, which nobody lists for the worker's Secrets."""
    core = k8s.CoreV1Api(kube_api)
    name = f"{namespace[:56]}-other"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


@pytest.mark.parametrize("installation", ["kustomize", "helm"], indirect=True)
def test_the_worker_may_not_read_a_secret_in_a_namespace_it_is_not_given(
    installation: Installation,
    grant_secrets: GrantSecrets,
    service_account_kubeconfig: ServiceAccountKubeconfig,
    kubectl: Kubectl,
    kube_api: k8s.ApiClient,
    namespace: str,
    unlisted_namespace: str,
) -> None:
    secret = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=S3_SECRET), string_data={"accessKeyId": "a"})
    for where in (namespace, unlisted_namespace):
        k8s.CoreV1Api(kube_api).create_namespaced_secret(where, secret)
    account = installation.service_account("worker")
    grant_secrets(namespace)

    def can_i(*request: str) -> str:
        identity = f"--as=system:serviceaccount:{installation.namespace}:{account}"
        return kubectl("auth", "can-i", *request, identity, check=False).stdout.strip()

    assert can_i("get", "secrets", "-n", namespace) == "yes"
    assert can_i("patch", "secrets", "-n", namespace) == "yes"  # the precheck marks the Migration's Secrets in use
    assert can_i("get", "secrets", "-n", unlisted_namespace) == "no"
    assert can_i("patch", "secrets", "-n", unlisted_namespace) == "no"
    assert can_i("get", "secrets", "-A") == "no"
    assert can_i("list", "secrets", "-n", namespace) == "no"
    watcher = f"--as=system:serviceaccount:{installation.namespace}:{installation.service_account('watcher')}"
    watcher_may = {
        (verb, where): kubectl("auth", "can-i", verb, "secrets", "-n", where, watcher, check=False).stdout.strip()
        for verb in ("patch", "get", "list")
        for where in (namespace, unlisted_namespace)
    }
    # The watcher takes a released Migration's mark off its Secrets where the worker may set it, and reads none.
    assert watcher_may == {
        ("patch", namespace): "yes", ("patch", unlisted_namespace): "no", ("get", namespace): "no",
        ("get", unlisted_namespace): "no", ("list", namespace): "no", ("list", unlisted_namespace): "no",
    }  # fmt: skip
    with contextlib.closing(kubernetes_client(service_account_kubeconfig(account, installation.namespace))) as api:
        core = k8s.CoreV1Api(api)
        assert core.read_namespaced_secret(S3_SECRET, namespace).data["accessKeyId"]
        assert _forbidden(lambda: core.read_namespaced_secret(S3_SECRET, unlisted_namespace))


def test_the_watcher_lists_migrations_everywhere_but_may_not_read_a_secret(
    migration_crd: str,
    service_account_kubeconfig: ServiceAccountKubeconfig,
    kube_api: k8s.ApiClient,
    namespace: str,
) -> None:
    secret = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=S3_SECRET), string_data={"accessKeyId": "a"})
    k8s.CoreV1Api(kube_api).create_namespaced_secret(namespace, secret)
    with contextlib.closing(kubernetes_client(service_account_kubeconfig("ferry-watcher"))) as api:
        listed = k8s.CustomObjectsApi(api).list_cluster_custom_object("ferry.dev", "v1alpha1", "migrations")

        assert listed["items"] is not None
        assert _forbidden(lambda: k8s.CoreV1Api(api).read_namespaced_secret(S3_SECRET, namespace))
        assert _forbidden(lambda: k8s.AppsV1Api(api).list_namespaced_stateful_set(namespace))


CAN_I: dict[str, list[tuple[str, bool]]] = {
    "ferry-worker": [
        ("get statefulsets.apps", True),
        ("create statefulsets.apps", True),
        ("patch statefulsets.apps", True),
        ("delete statefulsets.apps", True),
        ("update statefulsets.apps", False),
        ("list statefulsets.apps", False),
        ("patch statefulsets.apps --subresource=scale", False),
        ("create services", True),
        ("list services", True),
        ("patch services", True),
        ("update services", False),
        ("get persistentvolumeclaims", True),
        ("list persistentvolumeclaims", True),
        ("delete persistentvolumeclaims", True),
        ("create persistentvolumeclaims", False),
        ("get storageclasses.storage.k8s.io", True),
        ("list storageclasses.storage.k8s.io", True),
        ("create storageclasses.storage.k8s.io", False),
        ("list pods", True),
        ("delete pods", False),
        ("create pods", False),
        ("list endpointslices.discovery.k8s.io", True),
        ("get secrets", False),  # in a namespace nobody listed (see the test of the unlisted namespace)
        ("patch secrets", False),
        ("list secrets", False),
        ("watch secrets", False),
        ("create events", True),
        ("get migrations.ferry.dev", True),
        ("patch migrations.ferry.dev --subresource=status", True),
        ("update migrations.ferry.dev --subresource=status", False),
        ("patch migrations.ferry.dev", False),
        ("delete migrations.ferry.dev", False),
        ("list migrations.ferry.dev", True),  # the Migrations of a source, selected by the field
        ("watch migrations.ferry.dev", False),
        ("create leases.coordination.k8s.io -n ferry-system", False),
        ("delete namespaces", False),
    ],
    "ferry-watcher": [
        ("list migrations.ferry.dev -A", True),
        ("watch migrations.ferry.dev -A", True),
        ("get migrations.ferry.dev", True),
        ("patch migrations.ferry.dev", True),
        ("update migrations.ferry.dev", False),
        ("delete migrations.ferry.dev", False),
        ("create migrations.ferry.dev", False),
        ("patch migrations.ferry.dev --subresource=status", True),
        ("update migrations.ferry.dev --subresource=status", False),
        ("create events", True),
        ("create leases.coordination.k8s.io -n ferry-system", True),
        (f"get leases.coordination.k8s.io/{LEASE} -n ferry-system", True),
        (f"update leases.coordination.k8s.io/{LEASE} -n ferry-system", True),
        ("update leases.coordination.k8s.io/another-lease -n ferry-system", False),
        (f"delete leases.coordination.k8s.io/{LEASE} -n ferry-system", False),
        (f"get leases.coordination.k8s.io/{LEASE} -n default", False),
        ("get secrets", False),
        ("patch secrets", False),  # in a namespace nobody listed
        ("get statefulsets.apps", False),
        ("patch services", False),
    ],
}
"""What each ServiceAccount may and may not do; without -n, in an arbitrary workload namespace."""


@pytest.mark.parametrize("account", sorted(CAN_I))
def test_each_service_account_may_do_exactly_what_its_component_needs(
    kubectl: Kubectl, ferry_system: str, migration_crd: str, account: str
) -> None:
    wrong = []
    for request, expected in CAN_I[account]:
        words = request.split()
        if "-n" not in words and "-A" not in words:
            words += ["-n", "shop"]
        answer = kubectl(
            "auth", "can-i", *words, f"--as=system:serviceaccount:{ferry_system}:{account}", check=False
        ).stdout.strip()
        if answer != ("yes" if expected else "no"):
            wrong.append(f"{request}: {answer}")
    assert not wrong, f"{account}: " + "; ".join(wrong)


@pytest.fixture
def worker_without_statefulset_create(kubectl: Kubectl, ferry_system: str) -> Iterator[str]:
    """A ServiceAccount with deploy/rbac's worker role minus `create` on StatefulSets: provision's first need."""
    account = "ferry-worker-short"
    rules = yaml.safe_load((DEPLOY / "rbac" / "worker_role.yaml").read_text().split("\n---\n")[0])["rules"]
    for rule in rules:
        if "statefulsets" in rule.get("resources", []):
            rule["verbs"] = [verb for verb in rule["verbs"] if verb != "create"]
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": ferry_system}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": account},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": account},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": account},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ferry_system}]},
    ]  # fmt: skip
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    yield account
    kubectl("delete", "clusterrolebinding,clusterrole", account, "--ignore-not-found")


def test_a_missing_permission_ends_the_step_with_what_to_grant_not_an_http_dump(
    stack: StackInfo, databases: Databases, bucket: str, migration_secrets: None, source_workload: str,
    migration_crd: str, ferry_system: str, service_account_kubeconfig: ServiceAccountKubeconfig,
    worker_without_statefulset_create: str, run_ferry: RunFerry, kubectl: Kubectl, namespace: str,
    binaries: Binaries,
) -> None:  # fmt: skip
    worker = run_ferry("worker", service_account_kubeconfig(worker_without_statefulset_create))
    watcher = run_ferry(
        "watcher", service_account_kubeconfig("ferry-watcher"), FERRY_LEASE_NAMESPACE=ferry_system,
        FERRY_LEASE_NAME=LEASE, FERRY_NAMESPACES=namespace,
    )  # fmt: skip
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket))

    status = _wait_for_phase(kubectl, namespace, ref.name, Ferry(worker, watcher, "watcher"))

    assert status["phase"] == "RolledBack"
    # The precheck runs provision's server-side dry run, so the missing permission shows before anything changes.
    precheck = next(step for step in status["steps"] if step["name"] == "precheck")
    assert precheck["attempts"] == 1
    assert precheck["lastError"].startswith("PermissionDenied: the Kubernetes API server refused: ")
    assert "cannot create resource" in precheck["lastError"]
    assert "Grant that permission to ferry's worker" in precheck["lastError"]
    provision = next(step for step in status["steps"] if step["name"] == "provision")
    assert provision["state"] == "Pending", "nothing was created"
    assert "HTTP response headers" not in status["message"]
