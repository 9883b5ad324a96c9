"""Shared fixtures: one real stack per test session, a fresh namespace and task queue per test.

The stack's state folder is removed after a green session and kept (with every
component's log) after a red one; its path is printed either way. Set
FERRY_TEST_STATE_DIR to choose the folder, e.g. to read logs while tests run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.client import Client

from devstack.stack import postgres_home
from devstack.stack.install import Binaries, ensure_binaries
from devstack.stack.stack import Stack, StackInfo
from ferry.clients import TemporalSettings, connect_temporal
from tests.cluster import FINALIZER_AT_CREATE, install_crd

Kubectl = Callable[..., subprocess.CompletedProcess[str]]

pytest_plugins = ["tests.end_to_end"]


def make_state_dir(prefix: str) -> Path:
    """A fresh state folder, opened to 0755 (mkdtemp makes it 0700).

    Opened so that, when the tests run as root, PostgreSQL's data stays inside it and goes
    with it; a closed one works too (the data then goes outside, see
    devstack/stack/postgres_home.py), which tests/operator/test_first_run.py checks.
    """
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("FERRY_TEST_TMP", "/tmp")))
    folder.chmod(0o755)
    return folder


def make_closed_folder(prefix: str) -> Path:
    """A fresh folder of mode 0700 owned by the test's user, like root's home: only that user may enter it."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("FERRY_TEST_TMP", "/tmp")))


def remove_state_dir(state_dir: Path) -> None:
    """Removes a state folder and the folder its PostgreSQL data went to when that was outside it."""
    shutil.rmtree(postgres_home.outside_folder(state_dir), ignore_errors=True)
    shutil.rmtree(state_dir, ignore_errors=True)


UNIT_FOLDER = Path(__file__).parent / "unit"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With `-m unit` alone, skips importing test modules that hold no unit test.

    Importing (and assertion-rewriting) every end-to-end module only to deselect it
    costs more than the unit tests themselves. A module holds unit tests when it lives in
    tests/unit or says `mark.unit`; FERRY_COLLECT_ALL=1 turns this shortcut off
    (tests/test_unit_layer.py checks that both ways select the same tests).
    """
    if config.option.markexpr != "unit" or os.environ.get("FERRY_COLLECT_ALL") == "1":
        return None
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if UNIT_FOLDER in collection_path.parents:
        return None
    return "mark.unit" not in collection_path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def binaries() -> Binaries:
    return ensure_binaries()


@pytest.fixture(scope="session")
def stack(request: pytest.FixtureRequest, binaries: Binaries) -> Iterator[StackInfo]:
    configured = os.environ.get("FERRY_TEST_STATE_DIR")
    state_dir = Path(configured) if configured else make_state_dir("ferry-tests-")
    with Stack(state_dir, binaries=binaries) as info:
        yield info
    failed = request.session.testsfailed
    if failed or configured:
        print(f"\nstack state and logs kept in {state_dir}")
    else:
        remove_state_dir(state_dir)


@pytest.fixture(scope="session")
def kube_api(stack: StackInfo) -> Iterator[k8s.ApiClient]:
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(stack.kubeconfig))
    yield api
    api.close()


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube_api: k8s.ApiClient) -> Iterator[str]:
    """A namespace of the test's own, deleted afterwards.

    Left out of deploy/admission/finalizer, as deploy/ installs ferry by default (the watcher adds the finalizer),
    unless the test is marked `finalizer_at_create`: then the API server sets the finalizer on each new Migration."""
    name = f"t-{request.node.name[:40].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:6]}"
    name = "".join(ch for ch in name if ch.isalnum() or ch == "-")
    labels = {} if request.node.get_closest_marker("finalizer_at_create") else {FINALIZER_AT_CREATE: "false"}
    core = k8s.CoreV1Api(kube_api)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels=labels)))
    yield name
    _release_migrations(kube_api, name)
    _release_secrets(kube_api, name)
    core.delete_namespace(name)


def _release_secrets(kube_api: k8s.ApiClient, namespace: str) -> None:
    """Drops the finalizers Migrations put on a test's Secrets (a run started without a watcher to release them)."""
    core = k8s.CoreV1Api(kube_api)
    for secret in core.list_namespaced_secret(namespace).items:
        held = [f for f in secret.metadata.finalizers or [] if f.startswith("ferry.dev/")]
        if held:
            with contextlib.suppress(ApiException):
                core.patch_namespaced_secret(
                    secret.metadata.name, namespace, {"metadata": {"$deleteFromPrimitiveList/finalizers": held}},
                    _content_type="application/strategic-merge-patch+json",
                )  # fmt: skip


def _release_migrations(kube_api: k8s.ApiClient, namespace: str) -> None:
    """Drops ferry's finalizer from a test's leftover Migrations, so its namespace can go."""
    custom = k8s.CustomObjectsApi(kube_api)
    try:
        migrations = custom.list_namespaced_custom_object("ferry.dev", "v1alpha1", namespace, "migrations")
    except ApiException as error:
        if error.status == 404:  # no Migration CRD in this session
            return
        raise
    for item in migrations["items"]:
        if item["metadata"].get("finalizers"):
            with contextlib.suppress(ApiException):
                custom.patch_namespaced_custom_object(
                    "ferry.dev", "v1alpha1", namespace, "migrations", item["metadata"]["name"],
                    {"metadata": {"finalizers": None}}, _content_type="application/merge-patch+json",
                )  # fmt: skip


@pytest.fixture
def task_queue() -> str:
    return f"ferry-test-{uuid.uuid4()}"


@pytest.fixture(scope="session")
async def temporal_client(stack: StackInfo) -> Client:
    assert stack.temporal_address
    assert stack.temporal_namespace
    return await connect_temporal(TemporalSettings(address=stack.temporal_address, namespace=stack.temporal_namespace))


@pytest.fixture(scope="session")
def kubectl(stack: StackInfo, binaries: Binaries) -> Kubectl:
    """Runs the stack's kubectl; `check=False` returns failures instead of raising.

    `timeout` bounds the call itself: give `kubectl wait` a longer one than its own --timeout.
    """

    def run(
        *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(binaries.kubectl), f"--kubeconfig={stack.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    return run


CRD_MANIFEST = Path(__file__).parent.parent / "deploy" / "crd" / "migrations.ferry.dev.yaml"


@pytest.fixture(scope="session")
def migration_crd(stack: StackInfo, binaries: Binaries) -> str:
    """Installs the committed Migration CRD once per session; returns its name."""
    install_crd([str(binaries.kubectl), f"--kubeconfig={stack.kubeconfig}"], CRD_MANIFEST)
    return "migrations.ferry.dev"


CONTROL_ROLES = CRD_MANIFEST.parent.parent / "rbac" / "control_roles.yaml"


@pytest.fixture(scope="session")
def control_roles(kubectl: Kubectl) -> Iterator[None]:
    """The ClusterRoles ferry-approver and ferry-operator of deploy/rbac, to bind to the users a test impersonates.

    The policies they go with (deploy/admission) are always in force: the stack applies them.
    """
    kubectl("apply", "--server-side", "-f", str(CONTROL_ROLES))
    yield
    kubectl("delete", "-f", str(CONTROL_ROLES), "--ignore-not-found")


def grant(kubectl: Kubectl, namespace: str, cluster_role: str, *, user: str = "", service_account: str = "") -> None:
    """Binds a ClusterRole in one namespace to a user, or to a ServiceAccount of that namespace, as an admin would."""
    subject = f"--user={user}" if user else f"--serviceaccount={namespace}:{service_account}"
    name = f"{cluster_role}-{user or service_account}".lower()[:63].strip("-.")
    kubectl("create", "rolebinding", name, f"--clusterrole={cluster_role}", subject, "-n", namespace)
