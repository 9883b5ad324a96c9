"""ferry's admission policies on the local stack's API server, as a cluster running ferry has them.

deploy/admission/ makes the API server itself refuse a control its user may not give, or
one signed with another name, a Migration whose image or S3 endpoint is not allowed, and
any change to a Secret by ferry-system's ferry-worker or ferry-watcher but ferry's finalizer.
The stack applies it as it stands, with empty allowlists (anything allowed), so `make up`
and every test work under the same rules as a real installation: a control is given by a
user whom RBAC grants its verb, signed with that user's name (the stack's admin is
`ferry-admin`, in system:masters). deploy/admission/finalizer, optional on a real cluster
(it needs MutatingAdmissionPolicy, beta in Kubernetes 1.34), is applied too: the API server
sets ferry's finalizer on every new Migration, except in namespaces labelled
ferry.dev/finalizer-at-create=false, where the watcher adds it as it does without the policy.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from devstack.stack.errors import StartError
from devstack.stack.logtail import meaningful

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAMESPACE = DEPLOY / "manager" / "namespace.yaml"
"""ferry-system, where the allowlists' ConfigMap lives."""
POLICIES = DEPLOY / "admission"
FINALIZER_POLICY = POLICIES / "finalizer"
"""ferry's finalizer on every new Migration (a MutatingAdmissionPolicy, which the stack's API server enables)."""
APPLY_TIMEOUT = 120.0


def install(kubectl: Path, kubeconfig: Path) -> None:
    """Applies namespace ferry-system, deploy/admission and deploy/admission/finalizer (server-side, so applying
    again changes nothing)."""
    for source in (("-f", NAMESPACE), ("-k", POLICIES), ("-k", FINALIZER_POLICY)):
        applied = subprocess.run(
            [str(kubectl), f"--kubeconfig={kubeconfig}", "apply", "--server-side", source[0], str(source[1])],
            capture_output=True,
            text=True,
            timeout=APPLY_TIMEOUT,
        )
        if applied.returncode != 0:
            raise StartError(
                f"kubectl could not apply {source[1].relative_to(DEPLOY.parent)} (exit code {applied.returncode})",
                component="kubectl",
                cause=meaningful(applied.stderr),
            )


MIGRATIONS_ADMITTED = 120.0
"""Seconds the API server may take to apply its mutating policies to Migrations once their CRD is served."""
PROBE = (
    '{"apiVersion": "ferry.dev/v1alpha1", "kind": "Migration",'
    ' "metadata": {"name": "ferry-admission-probe", "namespace": "default"}}'
)
"""A create of it, dry run: the mutating policies run before the schema refuses its missing spec."""


def wait_migrations_admitted(kubectl: Sequence[str], timeout: float = MIGRATIONS_ADMITTED) -> None:
    """Waits until the API server's MutatingAdmissionPolicy plugin knows the Migration kind (`kubectl` is the binary
    and its connection flags).

    That plugin learns a kind's schema from the OpenAPI the API server serves, read again
    every 5 seconds: after the CRD is applied, and after each start of the API server,
    it answers a Migration's create with 503 ServiceUnavailable until then. A server-side
    dry run of a create says when that has passed; any other answer, the schema's refusal
    of the probe included, means it has.
    """
    deadline = time.monotonic() + timeout
    while True:
        probe = subprocess.run(
            [*kubectl, "create", "--dry-run=server", "-f", "-"],
            input=PROBE,
            capture_output=True,
            text=True,
            timeout=APPLY_TIMEOUT,
        )
        if "(ServiceUnavailable)" not in probe.stderr:
            return
        if time.monotonic() > deadline:
            raise StartError(
                f"the API server's mutating admission policies did not see Migrations within {timeout:.0f}s",
                component="kube-apiserver",
                cause=meaningful(probe.stderr),
            )
        time.sleep(0.5)
