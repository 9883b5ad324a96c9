"""deploy/ rendered two ways: by kustomize (`kubectl kustomize`) and by Helm (`helm template` of the chart).

Both renderings are lists of the objects an apply would send, so the tests can compare them,
apply them and read what the Deployments run.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.files import DEPLOY

CHART = DEPLOY / "helm" / "ferry"


def run_tool(*argv: str | Path) -> str:
    result = subprocess.run([str(arg) for arg in argv], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{' '.join(map(str, argv))} failed:\n{result.stderr}"
    return result.stdout


def parse(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kustomized(kubectl: Path, folder: Path = DEPLOY) -> list[dict[str, Any]]:
    """What `kubectl apply -k folder` would send."""
    return parse(run_tool(kubectl, "kustomize", folder))


def helm_template(helm: Path, release: str, namespace: str, *values: str) -> str:
    """The chart rendered for a release, CRDs included; `values` are --set assignments."""
    sets = [arg for value in values for arg in ("--set", value)]
    return run_tool(helm, "template", release, CHART, "--namespace", namespace, "--include-crds", *sets)


def deployment(objects: list[dict[str, Any]], component: str) -> dict[str, Any]:
    """The Deployment of ferry's worker or watcher in a rendering."""
    (found,) = [
        obj for obj in objects
        if obj["kind"] == "Deployment" and obj["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]  # fmt: skip
    return found


def service_account(objects: list[dict[str, Any]], component: str) -> str:
    """The ServiceAccount a component's Deployment runs as."""
    name: str = deployment(objects, component)["spec"]["template"]["spec"]["serviceAccountName"]
    return name


def lease_name(objects: list[dict[str, Any]]) -> str:
    """The Lease the watcher's Deployment tells it to use (its --lease-name)."""
    (container,) = deployment(objects, "watcher")["spec"]["template"]["spec"]["containers"]
    (name,) = [match.group(1) for arg in container["args"] if (match := re.fullmatch(r"--lease-name=(.+)", arg))]
    return name
