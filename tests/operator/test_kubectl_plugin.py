"""`kubectl ferry`, run as an operator runs it: the installed console script, and through kubectl's plugin lookup.

ferry's real watcher and worker run in this process against the session stack, so every
control goes the whole way (annotation, watcher, update of the saga, status) and every
migration is a real one. The plugin runs as a separate program (in threads, so the
worker and the watcher keep running meanwhile). The API server authenticates the tests as
the stack's admin, `ferry-admin`: that is the user the controls must record.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.stack.install import Binaries
from devstack.stack.stack import StackInfo
from ferry.kubectl.errors import Exit
from tests.conftest import Kubectl
from tests.end_to_end import migration_manifest
from tests.operator.conftest import MIGRATION_DONE, at_approval_gate, migration_status
from tests.terminal import Terminal
from watcher.settings import WatcherSettings
from worker.settings import WorkerSettings

pytestmark = pytest.mark.usefixtures("migration_crd", "source_workload", "migration_secrets")

BIN = Path(sys.executable).parent
PLUGIN = BIN / "kubectl-ferry"
USER = "ferry-admin"
"""The stack's admin user, as the API server reports it (SelfSubjectReview)."""
STEPS = ["precheck", "provision", "freeze", "snapshot", "migrate", "verify", "switch-traffic", "scale-down-old"]


def _environment(stack: StackInfo) -> dict[str, str]:
    """The caller's environment with the stack's kubeconfig, and no Temporal address unless a test gives one."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("FERRY_TEMPORAL")}
    env["KUBECONFIG"] = str(stack.kubeconfig)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


async def _run(argv: list[str], env: dict[str, str], within: float) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, env=env, timeout=within, check=False
    )


@pytest.fixture
def plugin(stack: StackInfo):  # type: ignore[no-untyped-def]
    """Runs `kubectl-ferry ARGS` with the stack's kubeconfig (KUBECONFIG); returns the finished process."""

    async def run(*args: str, within: float = 120) -> subprocess.CompletedProcess[str]:
        return await _run([str(PLUGIN), *args], _environment(stack), within)

    return run


def _lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


async def test_an_approval_through_the_plugin_is_signed_by_the_api_servers_user_and_the_run_can_be_followed(
    plugin, kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: int, binaries: Binaries,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = await at_approval_gate(kubectl, namespace, stack, bucket)

    # kubectl finds the plugin on PATH: `kubectl ferry get` lists the Migration.
    listed = await _run([str(binaries.kubectl), "ferry", "get", "-n", namespace], _environment(stack), 120)
    assert listed.returncode == 0, listed.stderr
    header, row = _lines(listed.stdout)
    assert header == ["NAME", "PHASE", "STEP", "STEPS", "AGE", "MESSAGE"]
    assert row[:4] == [ref.name, "AwaitingApproval", "freeze", "2/8"]

    everywhere = await plugin("get", "-A", "-o", "json")
    assert (ref.namespace, ref.name) in {
        (item["metadata"]["namespace"], item["metadata"]["name"]) for item in json.loads(everywhere.stdout)["items"]
    }

    waiting = await plugin("status", ref.name, "-n", namespace)
    assert waiting.returncode == Exit.OK, waiting.stderr
    shown = _lines(waiting.stdout)
    assert shown[0][:2] == ["Migration", f"{namespace}/{ref.name}"]
    assert shown[1][:2] == ["phase:", "AwaitingApproval"]
    assert [line[1] for line in shown[2:4]] == ["precheck", "provision"]
    assert shown[3][:3] == ["✓", "provision", "Succeeded"]
    assert shown[4][:2] == ["freeze", "Pending"]

    # Nothing failed, so the saga refuses a retry, and says why.
    retried = await plugin("retry", ref.name, "-n", namespace)
    assert retried.returncode == Exit.ERROR
    assert retried.stderr.startswith(f"retry refused (ferry.dev/retry={USER}): ")
    assert "no failed step" in retried.stderr

    approved = await plugin("approve", ref.name, "-n", namespace, "--reason", "change 4711")
    assert approved.returncode == Exit.OK, approved.stderr
    assert approved.stdout.startswith(f"approve accepted (ferry.dev/approve={USER}: change 4711): ")

    followed = await plugin("status", ref.name, "-n", namespace, "-w", within=MIGRATION_DONE)
    assert followed.returncode == Exit.OK, followed.stdout + followed.stderr
    assert re.search(r"^\d\d:\d\d:\d\d phase: Succeeded", followed.stdout, re.MULTILINE), followed.stdout
    status = await migration_status(kubectl, namespace, ref.name)
    assert status["phase"] == "Succeeded"
    assert status["approvedBy"] == USER

    finished = await plugin("status", ref.name, "-n", namespace, "-o", "json")
    assert finished.returncode == Exit.OK
    assert json.loads(finished.stdout)["status"]["phase"] == "Succeeded"

    # The history, from Temporal: every step once, in order, each completed; and the approval, by whom.
    assert stack.temporal_address is not None
    runs = await plugin(
        "history", ref.name, "-n", namespace, "--temporal-address", stack.temporal_address, "-o", "json"
    )
    assert runs.returncode == Exit.OK, runs.stderr
    rows = json.loads(runs.stdout)["items"]
    steps = [row for row in rows if row["kind"] == "step"]
    assert [row["step"] for row in steps] == STEPS
    assert all(row["outcome"] == "Completed" and row["started"] <= row["closed"] for row in steps)
    approvals = [row for row in rows if row["kind"] == "control" and row["name"] == "approve"]
    assert [(row["outcome"], row["detail"]) for row in approvals] == [("Accepted", f"by {USER}: change 4711")]
    table = await plugin("history", ref.name, "-n", namespace, f"--temporal-address={stack.temporal_address}")
    assert table.returncode == Exit.OK
    assert _lines(table.stdout)[1] == ["KIND", "NAME", "STEP", "SCHEDULED", "STARTED", "CLOSED", "TOOK", "OUTCOME"]
    assert any(line[:3] == ["step", "switch_traffic", "switch-traffic"] for line in _lines(table.stdout))


async def test_a_rollback_through_the_plugin_carries_its_reason_and_status_exits_with_rolled_backs_code(
    plugin, kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: int,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = await at_approval_gate(kubectl, namespace, stack, bucket)

    rolled = await plugin("rollback", ref.name, "-n", namespace, "--reason", "not today")
    assert rolled.returncode == Exit.OK, rolled.stderr

    # Followed in a terminal: redrawn in place, in colour, until it ends; then RolledBack's exit code.
    terminal = Terminal([str(PLUGIN), "status", ref.name, "-n", namespace, "-w"], env=_environment(stack))
    try:
        await asyncio.to_thread(terminal.wait_for, "the rollback to end", r"phase: \S*RolledBack", MIGRATION_DONE)
        code = await asyncio.to_thread(terminal.wait_exit, 60)
    finally:
        terminal.close()
    assert code == Exit.ROLLED_BACK, terminal.shown()
    assert "\x1b[32m✓\x1b[0m" in terminal.output or "\x1b[33m↩\x1b[0m" in terminal.output
    assert f"rolled back: rollback requested by {USER}: not today" in terminal.output

    again = await plugin("status", ref.name, "-n", namespace)
    assert again.returncode == Exit.ROLLED_BACK
    assert ["↩", "provision", "Compensated"] in [line[:3] for line in _lines(again.stdout)]

    # A second rollback of a finished run: the same control needs a new value, and the saga refuses it.
    second = await plugin("rollback", ref.name, "-n", namespace, "--reason", "not today")
    assert second.returncode == Exit.ERROR
    assert f"ferry.dev/rollback={USER}: not today (again at " in second.stderr


async def test_the_plugins_errors_are_one_line_naming_what_to_do(
    plugin, kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str,
) -> None:  # fmt: skip
    missing = await plugin("status", "no-such-migration", "-n", namespace)
    assert missing.returncode == Exit.ERROR
    assert missing.stderr == (
        f"error: Migration {namespace}/no-such-migration not found: check the name and the namespace (-n), "
        "or list them with `kubectl ferry get -A`\n"
    )

    # A Migration no watcher handles: nothing answers its control, and history has no Temporal to ask.
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(_unwatched(stack, bucket)))
    unanswered = await plugin("pause", "unwatched", "-n", namespace, "--timeout", "2")
    assert unanswered.returncode == Exit.NO_ANSWER
    assert "the watcher did not answer ferry.dev/pause=" in unanswered.stderr
    annotations = json.loads(kubectl("get", "migration", "unwatched", "-n", namespace, "-o", "json").stdout)
    assert annotations["metadata"]["annotations"]["ferry.dev/pause"] == USER

    no_temporal = await plugin("history", "unwatched", "-n", namespace)
    assert no_temporal.returncode == Exit.ERROR
    assert no_temporal.stderr.startswith("error: no Temporal address: pass --temporal-address")

    no_worker = await plugin("logs", "unwatched", "-n", namespace, "--worker-namespace", namespace)
    assert no_worker.returncode == Exit.ERROR
    assert no_worker.stderr.startswith("error: no ferry worker Pod (app.kubernetes.io/name=ferry,")
    assert "ferry worker" in no_worker.stderr
    assert no_worker.stderr.count("\n") == 1


def _unwatched(stack: StackInfo, bucket: str) -> dict[str, object]:
    from tests.end_to_end import migration_manifest

    return migration_manifest(stack, bucket, name="unwatched")


async def test_plan_prints_what_a_migration_would_do_and_leaves_nothing_behind(
    plugin, kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: int, tmp_path: Path,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    manifest = tmp_path / "migration.yaml"
    manifest.write_text(json.dumps(migration_manifest(stack, bucket)))

    planned = await plugin("plan", "-f", str(manifest), "-n", namespace, within=MIGRATION_DONE)

    assert planned.returncode == Exit.OK, planned.stdout + planned.stderr
    shown = planned.stdout.splitlines()
    assert shown[0].startswith(f"Plan for Migration {namespace}/orders-db-to-16 (checked as {namespace}/")
    assert shown[-1] == "nothing was changed"
    assert "steps    " + " → ".join(STEPS) in shown
    assert any(
        re.fullmatch(r"writes stop for about ([0-9.]+s|\d+m\d\ds|\d+h\d\dm) \(freeze until traffic has moved\)", line)
        for line in shown
    )
    assert any(line.startswith("measured read ") for line in shown)
    assert json.loads(kubectl("get", "migrations", "-n", namespace, "-o", "json").stdout)["items"] == []
    stateful_sets = json.loads(kubectl("get", "statefulsets", "-n", namespace, "-o", "json").stdout)["items"]
    assert [item["metadata"]["name"] for item in stateful_sets] == ["orders-db"]
    assert stack.s3_client().list_objects_v2(Bucket=bucket).get("KeyCount") == 0

    as_json = await plugin("plan", "-f", str(manifest), "-n", namespace, "-o", "json", within=MIGRATION_DONE)
    assert as_json.returncode == Exit.OK, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["phase"] == "Planned"
    assert data["plan"]["steps"] == STEPS
    assert data["plan"]["sourceSizeBytes"] > 0
    assert data["plan"]["estimates"]["writeDowntimeSeconds"] > 0


async def test_plan_of_a_migration_that_cannot_work_lists_every_problem_and_exits_7(
    plugin, kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, orders: int, tmp_path: Path,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    driver = {"type": "postgresql", "sourceSecret": "no-such-secret", "targetSecret": "no-such-target"}
    manifest = tmp_path / "migration.yaml"
    manifest.write_text(json.dumps(migration_manifest(stack, bucket, driver=driver)))

    refused = await plugin("plan", "-f", str(manifest), "-n", namespace, within=MIGRATION_DONE)

    assert refused.returncode == Exit.NOT_PLANNED, refused.stdout + refused.stderr
    assert refused.stdout.startswith(f"No plan for Migration {namespace}/orders-db-to-16")
    assert "no-such-secret" in refused.stdout
    assert "no-such-target" in refused.stdout
    assert json.loads(kubectl("get", "migrations", "-n", namespace, "-o", "json").stdout)["items"] == []


async def test_plan_refuses_a_file_without_exactly_one_migration(plugin, namespace: str, tmp_path: Path) -> None:
    manifest = tmp_path / "two.yaml"
    manifest.write_text("kind: ConfigMap\napiVersion: v1\nmetadata: {name: x}\n")

    refused = await plugin("plan", "-f", str(manifest), "-n", namespace)

    assert refused.returncode == Exit.ERROR
    assert refused.stderr == f"error: {manifest} holds 0 Migrations (kind: Migration): plan takes exactly one\n"
