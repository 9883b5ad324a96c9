"""`kubectl ferry plan -f FILE`: what a Migration would do and how long writes would stop, before anything changes.

The plan comes from ferry itself, not from a guess in the plugin: the plugin creates a
copy of the Migration with `spec.dryRun: true` under a generated name, waits for it to
end (phase Planned, or the precheck's list of problems), prints status.plan, and deletes
the copy, whatever happened (also on Ctrl-C). A dry run changes nothing: it runs only
the checks, which read, measure rates with a sample that is rolled back or deleted,
and dry-run the target's manifests.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from ferry.api.migration import FINISHED_PHASES, GROUP, KIND, PLURAL, VERSION, Phase
from ferry.kubectl.cluster import Cluster
from ferry.kubectl.errors import PluginError
from ferry.kubectl.output import Colours
from ferry.kubectl.progress import duration

PLAN_OF_LABEL = "ferry.dev/plan-of"
"""On the dry-run copy: the name of the Migration it plans."""
POLL_SECONDS = 0.5
FINISHED = {phase.value for phase in FINISHED_PHASES}


def read_manifest(path: str) -> dict[str, Any]:
    """The one Migration in a YAML or JSON file (`-` for stdin); a PluginError naming what is wrong otherwise."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as error:
        raise PluginError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        documents = [document for document in yaml.safe_load_all(text) if document]
    except yaml.YAMLError as error:
        raise PluginError(f"{path} is not YAML or JSON: {str(error).splitlines()[0]}") from None
    migrations = [d for d in documents if isinstance(d, dict) and d.get("kind") == KIND]
    if len(migrations) != 1:
        raise PluginError(f"{path} holds {len(migrations)} Migrations (kind: {KIND}): plan takes exactly one")
    migration = migrations[0]
    if str(migration.get("apiVersion", "")).split("/")[0] != GROUP:
        raise PluginError(f"{path}: apiVersion {migration.get('apiVersion')!r} is not {GROUP}/{VERSION}")
    if not isinstance(migration.get("metadata"), dict) or not migration["metadata"].get("name"):
        raise PluginError(f"{path}: the Migration has no metadata.name")
    if not isinstance(migration.get("spec"), dict):
        raise PluginError(f"{path}: the Migration has no spec")
    return migration


def dry_run_copy(migration: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The Migration as a dry run under a generated name: no approval to wait for, not paused."""
    name = migration["metadata"]["name"]
    spec = {**migration["spec"], "dryRun": True, "paused": False}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "generateName": f"{name[:40]}-plan-",
            "namespace": namespace,
            "labels": {PLAN_OF_LABEL: name[:63]},
        },
        "spec": spec,
    }


def run(cluster: Cluster, migration: dict[str, Any], namespace: str, timeout: float) -> dict[str, Any]:
    """Creates the dry-run copy, waits until it ends, deletes it; returns the copy as it ended."""
    custom = k8s.CustomObjectsApi(cluster.api)
    created: dict[str, Any] = cluster.call(
        f"a dry run of Migration {namespace}/{migration['metadata']['name']}",
        custom.create_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, dry_run_copy(migration, namespace),
    )  # fmt: skip
    name = created["metadata"]["name"]
    try:
        return _until_finished(cluster, namespace, name, timeout)
    finally:
        _delete(cluster, namespace, name, timeout)


def _until_finished(cluster: Cluster, namespace: str, name: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        obj = cluster.migration(namespace, name)
        if (obj.get("status") or {}).get("phase") in FINISHED:
            return obj
        if time.monotonic() > deadline:
            status = obj.get("status") or {}
            said = status.get("message") or "no status yet: is ferry's watcher running for this namespace?"
            raise PluginError(f"the dry run {namespace}/{name} did not end within {timeout:g}s ({said})")
        time.sleep(POLL_SECONDS)


def _delete(cluster: Cluster, namespace: str, name: str, timeout: float) -> None:
    """Deletes the copy and waits until ferry has let it go; a copy left behind is reported, not hidden."""
    custom = k8s.CustomObjectsApi(cluster.api)
    try:
        cluster.call(f"Migration {namespace}/{name}", custom.delete_namespaced_custom_object,
                     GROUP, VERSION, namespace, PLURAL, name)  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            listed = cluster.migrations(namespace)
            if not any(item["metadata"]["name"] == name for item in listed):
                return
            time.sleep(POLL_SECONDS)
    except PluginError as error:
        print(f"warning: could not delete the dry run {namespace}/{name}: {error}", file=sys.stderr)
        return
    print(f"warning: the dry run {namespace}/{name} was not gone within {timeout:g}s; delete it by hand",
          file=sys.stderr)  # fmt: skip


def _bytes(count: object) -> str:
    if not isinstance(count, int | float):
        return "?"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def lines(obj: dict[str, Any], planned_from: str, colours: Colours = Colours.NONE) -> list[str]:
    """The plan as a person reads it, or the problems the checks found."""
    status = obj.get("status") or {}
    metadata = obj["metadata"]
    checked = f"checked as {metadata['namespace']}/{metadata['name']}, now deleted"
    if status.get("phase") != Phase.PLANNED.value:
        return [
            colours.paint(f"No plan for Migration {metadata['namespace']}/{planned_from} ({checked}):", "red"),
            str(status.get("message") or f"the dry run ended {status.get('phase')}"),
        ]
    plan = status.get("plan") or {}
    out = [colours.paint(f"Plan for Migration {metadata['namespace']}/{planned_from} ({checked})", "bold")]
    storage = plan.get("targetStorageBytes")
    out.append(f"source   PostgreSQL {plan.get('sourceVersion')}, {_bytes(plan.get('sourceSizeBytes'))} of data")
    out.append(
        f"target   PostgreSQL {plan.get('targetVersion')}"
        + (f", volumes of {_bytes(storage)}" if storage else "")
        + f"; pg_dump/pg_restore {plan.get('toolsVersion')}"
    )
    rates = plan.get("throughput")
    if rates:
        out.append(
            f"measured read {_bytes(rates.get('sourceRead'))}/s, write {_bytes(rates.get('targetWrite'))}/s, "
            f"upload {_bytes(rates.get('upload'))}/s (a sample of {_bytes(rates.get('sampleBytes'))})"
        )
    out.append("steps    " + " → ".join(plan.get("steps") or []))
    estimates = plan.get("estimates")
    if estimates:
        out.append(
            f"expect   snapshot {duration(estimates.get('snapshotSeconds'))}, migrate "
            f"{duration(estimates.get('migrateSeconds'))}, verify {duration(estimates.get('verifySeconds'))}"
        )
        out.append(
            colours.paint(
                f"writes stop for about {duration(estimates.get('writeDowntimeSeconds'))} (freeze until traffic "
                "has moved)",
                "yellow",
            )
        )
        out.append(
            f"in all   about {duration(estimates.get('totalSeconds'))}, plus the target's start-up, approvals and soak"
        )
    else:
        out.append("expect   no estimate: the rates could not be measured")
    out.append(colours.paint("nothing was changed", "green"))
    return out


def as_data(obj: dict[str, Any], planned_from: str) -> dict[str, Any]:
    status = obj.get("status") or {}
    return {
        "migration": planned_from,
        "namespace": obj["metadata"]["namespace"],
        "phase": status.get("phase"),
        "message": status.get("message"),
        "plan": status.get("plan"),
    }
