"""Helpers that build and watch real objects in the session stack's cluster, shared by test packages."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from devstack.demo.sample import SOURCE, source_objects
from devstack.stack.admission import wait_migrations_admitted
from devstack.stack.stack import StackInfo
from ferry.api.migration import FINALIZER

SOURCE_PODS = ["orders-db-0", "orders-db-1"]


def stack_process(stack: StackInfo, program: str) -> int:
    """The process ID of the stack's `program` (e.g. kube-controller-manager): its arguments name the stack's state
    folder (a kubeconfig, a data folder in it)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(program.encode()) and str(stack.state_dir).encode() in b" ".join(argv):
                return int(entry.name)
    raise AssertionError(f"no {program} of the stack in {stack.state_dir} runs")


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """Stops a process (SIGSTOP) for the block, and lets it go on (SIGCONT) whatever happens. Keep it short: the
    stack's components run with leader election off, but every test after this one needs them."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def eventually(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    """Waits for something the cluster does in the background; fails naming it."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


MIGRATION_CRD = Path(__file__).resolve().parent.parent / "deploy" / "crd" / "migrations.ferry.dev.yaml"


def install_crd(kubectl: Sequence[str], crd: Path = MIGRATION_CRD, name: str = "migrations.ferry.dev") -> None:
    """Applies a CRD with `kubectl` (the binary and its connection flags) and waits until it is Established (and,
    for Migrations, until the API server's mutating admission policies see them)."""
    subprocess.run([*kubectl, "apply", "--server-side", "-f", str(crd)], check=True, capture_output=True)
    crd_established(
        lambda: (
            subprocess.run(
                [*kubectl, "get", f"crd/{name}", "-o", "json"], check=True, capture_output=True, text=True
            ).stdout
        ),
        name,
    )
    if name == "migrations.ferry.dev":
        wait_migrations_admitted(kubectl)


def crd_established(read: Callable[[], str], name: str, timeout: float = 300.0) -> None:
    """Waits until the CRD `read` returns (as JSON, from `kubectl get crd/NAME -o json`) is Established.

    Not `kubectl wait --for=condition=Established`: until the API server writes the CRD's
    first condition, kubectl finds no condition and fails at once instead of waiting.
    """
    deadline = time.monotonic() + timeout
    while True:
        conditions = (json.loads(read()).get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the CRD {name} was not Established within {timeout:.0f}s: {conditions}")
        time.sleep(0.2)


def endpoint_pods(kube_api: k8s.ApiClient, namespace: str, service: str) -> list[str]:
    """The Pods a Service's EndpointSlices list: where its traffic goes."""
    slices = k8s.DiscoveryV1Api(kube_api).list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={service}"
    )
    return sorted(
        endpoint.target_ref.name for piece in slices.items for endpoint in piece.endpoints or [] if endpoint.target_ref
    )


def ready_replicas(kube_api: k8s.ApiClient, namespace: str, name: str) -> int:
    status = k8s.AppsV1Api(kube_api).read_namespaced_stateful_set(name, namespace).status
    return int(status.ready_replicas or 0)


def create_source(kube_api: k8s.ApiClient, namespace: str) -> str:
    """orders-db: two Ready postgres:15 replicas on 1Gi "standard" volumes, behind the stable Service orders-db."""
    service, stateful_set = source_objects(replicas=2)
    k8s.CoreV1Api(kube_api).create_namespaced_service(namespace, service)
    k8s.AppsV1Api(kube_api).create_namespaced_stateful_set(namespace, stateful_set)
    eventually("the source to be Ready", lambda: ready_replicas(kube_api, namespace, SOURCE) == 2)
    eventually("the source's endpoints", lambda: endpoint_pods(kube_api, namespace, SOURCE) == SOURCE_PODS)
    return SOURCE


def token_kubeconfig(admin: Path, user: str, token: str, path: Path) -> Path:
    """Writes a kubeconfig for the cluster of `admin` (a kubeconfig) that authenticates with a bearer token.

    Not impersonation: the Kubernetes Python client ignores a kubeconfig's `as` field, so programs that use it
    (ferry, kubectl ferry) can act as another identity only with its own credentials.
    """
    cluster = yaml.safe_load(admin.read_text())["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": cluster["name"], "user": user}}],
        "current-context": user,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


FINALIZER_AT_CREATE = "ferry.dev/finalizer-at-create"
"""The namespace label that leaves a namespace out of deploy/admission/finalizer (value "false")."""


def created_finalizers(kube_api: k8s.ApiClient, namespace: str, manifest: dict[str, Any]) -> list[str]:
    """The finalizers this Migration would be created with (a server-side dry run: nothing is kept)."""
    dry = k8s.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        "ferry.dev", "v1alpha1", namespace, "migrations", manifest, dry_run="All"
    )
    found: list[str] = dry["metadata"].get("finalizers") or []
    return found


def without_finalizer_at_create(kube_api: k8s.ApiClient, namespace: str, manifest: dict[str, Any]) -> None:
    """Labels the namespace out of deploy/admission/finalizer, as a cluster without the policy has it: the watcher
    adds ferry's finalizer itself. Returns once the API server acts on the label (its policy reads namespaces from
    an informer), as a dry run of `manifest` shows."""
    k8s.CoreV1Api(kube_api).patch_namespace(namespace, {"metadata": {"labels": {FINALIZER_AT_CREATE: "false"}}})
    eventually(
        f"the API server to leave namespace {namespace} out of the finalizer policy",
        lambda: FINALIZER not in created_finalizers(kube_api, namespace, manifest),
    )
