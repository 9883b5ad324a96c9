"""ferry's access to Secrets, generated from one list of namespaces (`ferry rbac`).

Reading Secrets is the most sensitive thing ferry's worker may do: the database and S3
credentials of every Migration are Secrets, and so is everything else a cluster keeps
secret. By default the worker may read them only in the namespaces it is given, with one
Role and one RoleBinding in each; a grant in every namespace (a ClusterRole and its
ClusterRoleBinding) is there for those who ask for it by name. `ferry rbac` prints the
objects; deploy/rbac/worker_secrets.yaml is its output, and the Helm chart's
templates/worker_secrets.yaml renders the same objects from worker.secretNamespaces
and worker.secretAccess (tests/deploy checks both).

The same namespaces hold a second, smaller grant for the watcher: patch, and nothing
else. The worker's precheck puts a Migration's finalizer on the Secrets it names (a
patch, beside its get), so that a Secret deleted with its Migration stays until the
undo or the retention cleanup has read it; the watcher takes that finalizer off when it
releases the Migration (watcher/deletion.py), which it must be able to do even when no
worker runs.

RBAC cannot narrow `patch` to metadata.finalizers: alone, either grant would let its
account rewrite any Secret there (a source Secret's host, and the worker would send the
password to that server). The ValidatingAdmissionPolicy ferry-secrets
(deploy/admission/secrets.yaml, the chart's templates/admission_secrets.yaml) is what
limits them: for these two ServiceAccounts, an update may add or remove finalizers
ferry.dev/in-use-<uid> and change nothing else, and a create or a delete is refused. It
names the accounts of SYSTEM_NAMESPACE. What it cannot limit: a patch answers with the
object, so the watcher could see those Secrets; its code asks for metadata alone, and it
is given them only where the worker reads them anyway.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from typing import Any

import yaml

from ferry.api.migration import DNS_LABEL

NAME = "ferry-worker-secrets"
"""Name of every object of the worker's grant: it reads Secrets, and marks them in use."""
WATCHER_NAME = "ferry-watcher-secrets"
"""Name of every object of the watcher's grant: it takes a released Migration's finalizer off its Secrets."""
SERVICE_ACCOUNT = "ferry-worker"
WATCHER_SERVICE_ACCOUNT = "ferry-watcher"
SYSTEM_NAMESPACE = "ferry-system"
RBAC = "rbac.authorization.k8s.io"
LABELS = {"app.kubernetes.io/name": "ferry", "app.kubernetes.io/component": "worker"}
RULES = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "patch"]}]
"""activities/secrets.py reads the Secrets a Migration names, by name: get, never list or watch; the precheck adds
the Migration's finalizer to them (SecretProtection): patch, which the admission policy ferry-secrets limits to that
finalizer."""
WATCHER_RULES = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["patch"]}]
"""watcher/deletion.py removes a released Migration's finalizer from its Secrets: patch, never get, list or watch;
the admission policy ferry-secrets limits it to that finalizer."""


class SecretAccess(enum.StrEnum):
    NAMESPACES = "namespaces"
    """Only in the namespaces listed (the default)."""
    CLUSTER = "cluster"
    """In every namespace, present and future."""


def not_namespaces(names: Sequence[str]) -> list[str]:
    """The names that cannot be namespaces (DNS labels: lowercase letters, digits and '-', at most 63)."""
    return [name for name in names if not (len(name) <= 63 and re.fullmatch(DNS_LABEL, name))]


def objects(
    namespaces: Sequence[str],
    access: SecretAccess = SecretAccess.NAMESPACES,
    system_namespace: str = SYSTEM_NAMESPACE,
) -> list[dict[str, Any]]:
    """The Roles and RoleBindings (or the ClusterRole and ClusterRoleBinding) of the worker's ServiceAccount, then
    those of the watcher's."""
    grants = ((NAME, RULES, SERVICE_ACCOUNT), (WATCHER_NAME, WATCHER_RULES, WATCHER_SERVICE_ACCOUNT))
    if access is SecretAccess.CLUSTER:
        return [
            grant
            for name, rules, account in grants
            for grant in (
                _object("ClusterRole", None, name, rules=rules),
                _object(
                    "ClusterRoleBinding", None, name, roleRef=_role_ref("ClusterRole", name),
                    subjects=[_subject(account, system_namespace)],
                ),
            )
        ]  # fmt: skip
    return [
        grant
        for name, rules, account in grants
        for namespace in sorted(set(namespaces))
        for grant in (
            _object("Role", namespace, name, rules=rules),
            _object(
                "RoleBinding", namespace, name, roleRef=_role_ref("Role", name),
                subjects=[_subject(account, system_namespace)],
            ),
        )
    ]  # fmt: skip


def manifest_yaml(
    namespaces: Sequence[str],
    access: SecretAccess = SecretAccess.NAMESPACES,
    system_namespace: str = SYSTEM_NAMESPACE,
) -> str:
    """`objects` as YAML, under a header saying how they were made and how to make others."""
    where = "every namespace" if access is SecretAccess.CLUSTER else ", ".join(sorted(set(namespaces))) or "none"
    header = (
        f"# Generated by `ferry rbac{_arguments(namespaces, access, system_namespace)}`: do not edit, run it again.\n"
        "# Namespaces where ferry's worker may read the Secrets Migrations name (database\n"
        "# connections, S3 credentials), by name, and mark them in use (get, patch), and the\n"
        "# watcher may take that mark off (patch): "
        f"{where}.\n"
        "# Migrations in any other namespace fail their precheck until it is listed:\n"
        "#   ferry rbac --secret-namespaces shop,billing -o deploy/rbac/worker_secrets.yaml\n"
        "# (or make rbac SECRET_NAMESPACES=shop,billing), then apply deploy/ again. Every namespace\n"
        "# at once, present and future, is `ferry rbac --secret-access cluster`.\n"
        "# Both patches may change only that mark, the finalizer ferry.dev/in-use-<uid>: the\n"
        "# admission policy ferry-secrets (deploy/admission/secrets.yaml) refuses anything else."
        f"{_policy_note(system_namespace)}\n"
    )
    documents = objects(namespaces, access, system_namespace)
    return header + "".join(f"---\n{yaml.safe_dump(document, sort_keys=False)}" for document in documents)


def _policy_note(system_namespace: str) -> str:
    """A line more when the accounts live elsewhere than where deploy/admission/secrets.yaml names them."""
    if system_namespace == SYSTEM_NAMESPACE:
        return ""
    return f"\n# It names the accounts of {SYSTEM_NAMESPACE}: change that to {system_namespace} there too."


def _arguments(namespaces: Sequence[str], access: SecretAccess, system_namespace: str) -> str:
    words = []
    if access is SecretAccess.CLUSTER:
        words.append(f"--secret-access {access.value}")
    elif namespaces:
        words.append(f"--secret-namespaces {','.join(sorted(set(namespaces)))}")
    if system_namespace != SYSTEM_NAMESPACE:
        words.append(f"--namespace {system_namespace}")
    return "".join(f" {word}" for word in words)


def _object(kind: str, namespace: str | None, name: str, **fields: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    component = "worker" if name == NAME else "watcher"
    metadata["labels"] = {**LABELS, "app.kubernetes.io/component": component}
    return {"apiVersion": f"{RBAC}/v1", "kind": kind, "metadata": metadata, **fields}


def _role_ref(kind: str, name: str) -> dict[str, str]:
    return {"apiGroup": RBAC, "kind": kind, "name": name}


def _subject(account: str, system_namespace: str) -> dict[str, str]:
    return {"kind": "ServiceAccount", "name": account, "namespace": system_namespace}
