"""Fixtures of the deployment tests: deploy/rbac applied for real, and kubeconfigs of its ServiceAccounts.

The kubeconfigs carry real ServiceAccount tokens (TokenRequest, as `kubectl create token`
makes them), so ferry's components authenticate as those accounts exactly as they do in
a Pod, and the API server authorizes every call with the roles of deploy/rbac. Tokens,
rather than impersonation: the Kubernetes Python client (37) ignores a kubeconfig's `as`
field, and ferry's own client setup (ferry/clients.py) has no way to add the
Impersonate-User header, whereas a token needs nothing from ferry's code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from devstack.stack.stack import StackInfo
from tests.conftest import Kubectl
from tests.deploy.files import DEPLOY, SYSTEM_NAMESPACE

ServiceAccountKubeconfig = Callable[[str], Path]


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
    admin = yaml.safe_load(stack.kubeconfig.read_text())

    def make(account: str) -> Path:
        token = kubectl("create", "token", account, "-n", ferry_system, "--duration=1h").stdout.strip()
        assert token, f"no token for ServiceAccount {ferry_system}/{account}"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": admin["clusters"],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": account, "context": {"cluster": admin["clusters"][0]["name"], "user": account}}],
            "current-context": account,
        }
        path = tmp_path / f"{account}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    return make
