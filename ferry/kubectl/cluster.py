"""Reaching the cluster as kubectl does: --kubeconfig, KUBECONFIG, --context, -n; and reading Migrations.

The namespace is the one given, else the context's, else `default` (in a Pod: the
Pod's own). Every failure to reach or read becomes a PluginError whose one line names
the cluster and what to check, because a traceback tells a person nothing here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from ferry.api.migration import GROUP, PLURAL, VERSION
from ferry.kube_requests import BoundedApiClient, RequestTimeouts
from ferry.kubectl.errors import PluginError

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
TIMEOUTS = RequestTimeouts(connect=5.0, read=30.0)
"""A person waits for the answer: a cluster that does not answer fails the command in seconds."""
ADMISSION_DENIED = " denied request: "
"""What follows the policy's and binding's names in the API server's message when a ValidatingAdmissionPolicy
refuses a request; after it comes the policy's own message."""

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Target:
    """Which cluster and namespace a command talks to, as the flags chose them."""

    kubeconfig: str | None = None
    """--kubeconfig; else KUBECONFIG; else ~/.kube/config; else the in-cluster configuration."""
    context: str | None = None
    """--context: a context of the kubeconfig other than its current one."""
    namespace: str | None = None
    """-n: else the context's namespace, else `default`."""


@dataclasses.dataclass
class Cluster:
    """An API client for the chosen context, and the namespace commands default to."""

    api: k8s.ApiClient
    namespace: str
    server: str

    def close(self) -> None:
        self.api.close()

    def call(self, what: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Calls the API; turns not-found, refusals and unreachable servers into one-line PluginErrors."""
        try:
            return call(*args, **kwargs)
        except ApiException as error:
            raise PluginError(_refusal(what, error, self.server)) from None
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise PluginError(
                f"cannot reach the Kubernetes API server at {self.server} ({_short(error)}): "
                "check --context, --kubeconfig or KUBECONFIG, and that the cluster is up"
            ) from None

    def migration(self, namespace: str, name: str) -> dict[str, Any]:
        """The Migration as the API server has it, or a PluginError saying it is not there."""
        custom = k8s.CustomObjectsApi(self.api)
        found: dict[str, Any] = self.call(
            f"Migration {namespace}/{name}", custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
            name,
        )  # fmt: skip
        return found

    def migrations(self, namespace: str | None) -> list[dict[str, Any]]:
        """The Migrations of a namespace, or of every namespace when it is None."""
        custom = k8s.CustomObjectsApi(self.api)
        if namespace is None:
            listed = self.call("Migrations", custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)
        else:
            listed = self.call(
                f"Migrations in namespace {namespace}", custom.list_namespaced_custom_object, GROUP, VERSION,
                namespace, PLURAL,
            )  # fmt: skip
        items: list[dict[str, Any]] = listed.get("items") or []
        return items


def _short(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 160 else text[:157] + "..."


def _refusal(what: str, error: ApiException, server: str) -> str:
    if error.status == 404:
        if "migrations" in str(error.body or "") and "the server could not find the requested resource" in str(
            error.body or ""
        ):
            return f"the cluster at {server} has no Migration resource type: install ferry's CRD (deploy/crd/)"
        return f"{what} not found: check the name and the namespace (-n), or list them with `kubectl ferry get -A`"
    if error.status in (401, 403):
        policy = _admission_refusal(error)
        if policy:
            return f"the API server at {server} refused to change {what}: {policy}"
        refused = f"{error.status} {error.reason}"
        return f"the API server at {server} refused access to {what} ({refused}): check your credentials and RBAC"
    return f"the API server at {server} could not serve {what}: {error.status} {error.reason}"


def _admission_refusal(error: ApiException) -> str | None:
    """Why an admission policy refused the request (deploy/admission says who may give a control), if one did."""
    try:
        status = json.loads(error.body or "")
    except ValueError:
        return None
    message = str(status.get("message") or "") if isinstance(status, dict) else ""
    policy, _, why = message.partition(ADMISSION_DENIED)
    return why if why and "ValidatingAdmissionPolicy" in policy else None


def _kubeconfig_file(target: Target) -> str | None:
    """The kubeconfig to load (several joined by ':' as in KUBECONFIG), or None when there is none."""
    if target.kubeconfig:
        return target.kubeconfig
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    default = Path("~/.kube/config").expanduser()
    return str(default) if default.exists() else None


def connect(target: Target) -> Cluster:
    """The cluster of `target`, or a PluginError naming what is missing (no request is made yet)."""
    configuration = k8s.Configuration()
    configuration.retries = 0  # a person waits: an unreachable server fails at once, not after urllib3's retries
    config_file = _kubeconfig_file(target)
    if config_file is None:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except ConfigException:
            raise PluginError("no kubeconfig: pass --kubeconfig, set KUBECONFIG, or create ~/.kube/config") from None
        namespace = target.namespace or _in_cluster_namespace()
    else:
        try:
            k8s_config.load_kube_config(
                config_file=config_file, context=target.context, client_configuration=configuration
            )
            namespace = target.namespace or _context_namespace(config_file, target.context)
        except (ConfigException, OSError, ValueError) as error:
            raise PluginError(f"cannot use the kubeconfig {config_file}: {_short(error)}") from None
    configuration.connection_pool_maxsize = 4
    api = BoundedApiClient(configuration, TIMEOUTS)
    return Cluster(api=api, namespace=namespace, server=configuration.host)


def _context_namespace(config_file: str, context: str | None) -> str:
    contexts, current = k8s_config.list_kube_config_contexts(config_file)
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    namespace = ((chosen or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else "default"


def _in_cluster_namespace() -> str:
    with contextlib.suppress(OSError):
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    return "default"


@contextlib.contextmanager
def connected(target: Target) -> Iterator[Cluster]:
    cluster = connect(target)
    try:
        yield cluster
    finally:
        cluster.close()
