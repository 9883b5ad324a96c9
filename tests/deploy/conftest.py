"""Fixtures of the deployment tests: deploy/rbac applied for real, and kubeconfigs of its ServiceAccounts.

The kubeconfigs carry real ServiceAccount tokens (TokenRequest, as `kubectl create token`
makes them), so ferry's components authenticate as those accounts exactly as they do in
a Pod, and the API server authorizes every call with the roles of deploy/rbac. Tokens,
rather than impersonation: the Kubernetes Python client (37) ignores a kubeconfig's `as`
field, and ferry's own client setup (ferry/clients.py) has no way to add the
Impersonate-User header, whereas a token needs nothing from ferry's code.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.stack.install import Binaries, ensure_tool
from devstack.stack.stack import StackInfo
from tests.cluster import token_kubeconfig
from tests.conftest import Kubectl
from tests.deploy import rendering
from tests.deploy.files import DEPLOY, SYSTEM_NAMESPACE

ServiceAccountKubeconfig = Callable[..., Path]
"""(account, namespace=ferry-system) -> a kubeconfig authenticating as that ServiceAccount."""

HELM_RELEASE = "ferry-helm"
"""The release the chart's identities are installed as, in a namespace of the same name: apart from
deploy/'s, whose cluster-wide roles are named after the release "ferry"."""

IDENTITY_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

GrantSecrets = Callable[[str], None]
"""(namespace) -> the installation's worker may read Secrets there, granted the way that installation grants it."""


@pytest.fixture(scope="session")
def ferry_system(kubectl: Kubectl) -> Iterator[str]:
    """Namespace ferry-system with everything in deploy/rbac, applied for real; removed at the end."""
    kubectl("apply", "--server-side", "-f", str(DEPLOY / "manager" / "namespace.yaml"))
    kubectl("apply", "--server-side", "-k", str(DEPLOY / "rbac"))
    yield SYSTEM_NAMESPACE
    kubectl("delete", "-k", str(DEPLOY / "rbac"), "--ignore-not-found", "--wait=false")
    kubectl("delete", "namespace", SYSTEM_NAMESPACE, "--ignore-not-found", "--wait=false")


@pytest.fixture
def service_account_kubeconfig(
    kubectl: Kubectl, stack: StackInfo, ferry_system: str, tmp_path: Path
) -> ServiceAccountKubeconfig:
    """Makes a kubeconfig that authenticates as a ServiceAccount of ferry-system, with a fresh token."""
    assert stack.kubeconfig is not None
    admin = stack.kubeconfig

    def make(account: str, namespace: str = ferry_system) -> Path:
        token = kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
        assert token, f"no token for ServiceAccount {namespace}/{account}"
        return token_kubeconfig(admin, account, token, tmp_path / f"{account}.kubeconfig")

    return make


@pytest.fixture(scope="session")
def helm() -> Path:
    """helm, built from its Go module on first use (devstack/stack/versions.py pins it)."""
    return ensure_tool("helm")


@dataclasses.dataclass(frozen=True)
class Installation:
    """ferry's identities (ServiceAccounts and roles) as one way of installing it put them on the stack."""

    how: str
    """kustomize (deploy/) or helm (deploy/helm/ferry)."""
    namespace: str
    objects: list[dict[str, Any]]
    """Everything that way renders; only the identities are applied (the stack runs no image)."""

    def service_account(self, component: str) -> str:
        return rendering.service_account(self.objects, component)

    @property
    def lease(self) -> str:
        return rendering.lease_name(self.objects)


@pytest.fixture(scope="session")
def kustomize_installation(binaries: Binaries, ferry_system: str) -> Installation:
    return Installation("kustomize", ferry_system, rendering.kustomized(binaries.kubectl))


@pytest.fixture(scope="session")
def helm_installation(kubectl: Kubectl, helm: Path) -> Iterator[Installation]:
    """The chart's identities, applied for real as release ferry-helm in namespace ferry-helm."""
    objects = rendering.parse(rendering.helm_template(helm, HELM_RELEASE, HELM_RELEASE))
    identities = [obj for obj in objects if obj["kind"] in IDENTITY_KINDS]
    kubectl("create", "namespace", HELM_RELEASE)
    kubectl(
        "apply", "--server-side", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": identities})
    )
    yield Installation("helm", HELM_RELEASE, objects)
    kubectl(
        "delete",
        "-f",
        "-",
        "--ignore-not-found",
        "--wait=false",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": identities}),
    )
    kubectl("delete", "namespace", HELM_RELEASE, "--ignore-not-found", "--wait=false")


@pytest.fixture
def installation(request: pytest.FixtureRequest) -> Installation:
    """deploy/'s identities, or the chart's when a test is parametrized with installation="helm" (indirect)."""
    how = getattr(request, "param", "kustomize")
    found: Installation = request.getfixturevalue(f"{how}_installation")
    return found


@pytest.fixture
def grant_secrets(request: pytest.FixtureRequest, installation: Installation, kubectl: Kubectl) -> GrantSecrets:
    """Lists a namespace for the worker's Secrets: `ferry rbac` for deploy/, worker.secretNamespaces for the chart.

    The grants live in that namespace, and go with it.
    """

    def grant(namespace: str) -> None:
        if installation.how == "helm":
            helm: Path = request.getfixturevalue("helm")
            listed = f"worker.secretNamespaces={{{namespace}}}"
            rendered = rendering.parse(rendering.helm_template(helm, HELM_RELEASE, installation.namespace, listed))
            grants = [obj for obj in rendered if obj["metadata"].get("namespace") == namespace]
            text = json.dumps({"apiVersion": "v1", "kind": "List", "items": grants})
        else:
            text = rendering.run_tool(
                sys.executable, "-m", "ferry.cli", "rbac", f"--secret-namespaces={namespace}",
                f"--namespace={installation.namespace}",
            )  # fmt: skip
        kubectl("apply", "--server-side", "-f", "-", stdin=text)

    return grant
