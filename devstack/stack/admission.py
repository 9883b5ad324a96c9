"""ferry's admission policies on the local stack's API server, as a cluster running ferry has them.

deploy/admission/ makes the API server itself refuse a control its user may not give, or
one signed with another name, and a Migration whose image or S3 endpoint is not allowed.
The stack applies it as it stands, with empty allowlists (anything allowed), so `make up`
and every test work under the same rules as a real installation: a control is given by a
user whom RBAC grants its verb, signed with that user's name (the stack's admin is
`ferry-admin`, in system:masters).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from devstack.stack.errors import StartError
from devstack.stack.logtail import meaningful

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAMESPACE = DEPLOY / "manager" / "namespace.yaml"
"""ferry-system, where the allowlists' ConfigMap lives."""
POLICIES = DEPLOY / "admission"
APPLY_TIMEOUT = 120.0


def install(kubectl: Path, kubeconfig: Path) -> None:
    """Applies namespace ferry-system and deploy/admission (server-side, so applying again changes nothing)."""
    for source in (("-f", NAMESPACE), ("-k", POLICIES)):
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
