"""What an operator's tools see of one real migration: one trace, the right metrics, attributable logs."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import psycopg
import pytest

from devstack.stack.stack import StackInfo
from ferry.api.saga import WORKFLOW_NAME
from tests.conftest import Kubectl
from tests.end_to_end import Databases, apply_migration, eventually, migration_manifest
from tests.observability.conftest import Observed, scrape

pytestmark = pytest.mark.usefixtures("migration_crd", "source_workload", "migration_secrets")

STEPS = ("provision", "freeze", "snapshot", "migrate", "verify", "switch-traffic", "scale-down-old")


async def _migrate(kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, databases: Databases) -> str:
    with psycopg.connect(databases.source.dsn) as conn:
        conn.execute("create table orders as select n as id from generate_series(1, 200) as n")
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket))
    await asyncio.to_thread(
        kubectl, "wait", "--for=condition=Succeeded", f"migration/{ref.name}", "-n", namespace, "--timeout=180s"
    )
    return ref.uid


def _sample(metrics: str, name: str, **labels: str) -> float | None:
    """The sample of `name` whose labels include `labels` (summed when several match); None when there is none."""
    total, found = 0.0, False
    for line in metrics.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if not match:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(have.get(key) == value for key, value in labels.items()):
            total, found = total + float(match.group(2)), True
    return total if found else None


def _value(metrics: str, name: str, **labels: str) -> float:
    value = _sample(metrics, name, **labels)
    assert value is not None, f"no sample of {name} with {labels}"
    return value


def _trace(observed: Observed, namespace: str) -> list[dict[str, Any]]:
    """The spans exported so far of the trace the watcher's start of the namespace's Migration roots."""
    spans = [json.loads(line) for line in observed.trace_file.read_text().splitlines()]
    roots = [
        span for span in spans
        if span["name"] == "ferry.watcher.start_migration" and span["attributes"].get("ferry.namespace") == namespace
    ]  # fmt: skip
    assert len(roots) <= 1, json.dumps(roots, indent=1)
    if not roots:
        return []
    return [span for span in spans if span["context"]["trace_id"] == roots[0]["context"]["trace_id"]]


ACTIVITIES = ("provision", "postgresql.snapshot", "postgresql.verify", "switch_traffic", "scale_down_old")


async def test_one_trace_runs_from_the_watchers_event_to_the_last_activity(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, databases: Databases, observed_ferry: Observed
) -> None:
    uid = await _migrate(kubectl, namespace, stack, bucket, databases)

    async def whole() -> bool:  # the last spans end, and are exported, just after the status says Succeeded
        names = {span["name"] for span in _trace(observed_ferry, namespace)}
        return f"RunWorkflow:{WORKFLOW_NAME}" in names and f"RunActivity:{ACTIVITIES[-1]}" in names

    await eventually("the run's spans, exported", whole, within=30)
    tree = _trace(observed_ferry, namespace)
    ids = {span["context"]["span_id"] for span in tree}
    parentless = [span["name"] for span in tree if span.get("parent_id") not in ids]
    assert parentless == ["ferry.watcher.start_migration"]
    names = {span["name"] for span in tree}
    assert f"StartWorkflow:{WORKFLOW_NAME}" in names
    assert f"RunWorkflow:{WORKFLOW_NAME}" in names
    for activity in ACTIVITIES:
        assert f"RunActivity:{activity}" in names
    assert uid in json.dumps(tree)


async def test_metrics_after_a_migration_count_what_happened(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, databases: Databases, observed_ferry: Observed
) -> None:
    await _migrate(kubectl, namespace, stack, bucket, databases)

    async def counted() -> bool:  # the watcher's phase gauge follows at its next resync (every 2s)
        watcher = await asyncio.to_thread(scrape, observed_ferry.watcher_metrics)
        return _sample(watcher, "ferry_migrations", phase="Succeeded") == 1

    await eventually("the watcher's gauge to count the Migration Succeeded", counted, within=30)
    worker = await asyncio.to_thread(scrape, observed_ferry.worker_metrics)
    watcher = await asyncio.to_thread(scrape, observed_ferry.watcher_metrics)

    for step in STEPS:
        assert _value(worker, "ferry_steps_total", step=step, outcome="succeeded") == 1
        assert _value(worker, "ferry_step_duration_seconds_count", step=step, outcome="succeeded") == 1
    assert "ferry_compensations_total" not in worker
    # Transitions made while a write is under way share the next write, but every step's start is shown before the
    # step runs: at least one write per step.
    assert _value(worker, "ferry_status_patch_seconds_count") >= len(STEPS)
    assert _value(worker, "temporal_workflow_completed") >= 1  # the SDK's own metrics, same endpoint
    assert _value(watcher, "ferry_watcher_events_total", type="MODIFIED") >= len(STEPS)  # status updates
    assert _value(watcher, "ferry_watcher_events_total", type="LISTED") >= 1
    assert _value(watcher, "ferry_watcher_event_to_start_seconds_count") == 1
    assert _value(watcher, "ferry_migrations", phase="Succeeded") == 1
    assert _value(watcher, "ferry_migrations", phase="Running") == 0


async def test_every_log_line_about_the_migration_names_it(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, databases: Databases, observed_ferry: Observed
) -> None:
    await _migrate(kubectl, namespace, stack, bucket, databases)

    lines = [json.loads(line) for line in observed_ferry.logs.getvalue().splitlines()]
    about = [line for line in lines if line["namespace"] == namespace]
    loggers = {line["logger"] for line in about}

    assert {"ferry.watcher.patching", "temporalio.activity"} <= loggers
    for line in about:
        assert line["name"] == "orders-db-to-16"
        assert line["workflow_id"].startswith(f"migration/{namespace}/orders-db-to-16/")
    activity_lines = [line for line in about if line["logger"] == "temporalio.activity"]
    assert activity_lines
    assert {line["generation"] for line in activity_lines} == {1}
