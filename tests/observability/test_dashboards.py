"""The Grafana dashboard and the alerts query only metrics that ferry's worker and watcher really serve.

A migration's usual life does not make every series appear (an undo, a deletion waiting,
a failed activity), so the test gives the running worker and watcher one of each before it
scrapes them: a Migration refused by its precheck, and one deleted while it soaks after the
traffic moved, which the watcher cancels and the saga undoes.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from devstack.stack.stack import StackInfo
from tests.conftest import Kubectl
from tests.end_to_end import TARGET_SECRET, Databases, apply_migration, eventually, migration_manifest
from tests.observability.conftest import Observed, scrape
from tests.observability.promql import exposed_names, metric_names

pytestmark = pytest.mark.usefixtures("migration_crd", "source_workload", "migration_secrets")

DEPLOY = Path(__file__).parent.parent.parent / "deploy"
DASHBOARD = DEPLOY / "grafana" / "ferry.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
FINISHED = {"Succeeded", "RolledBack", "Failed", "Abandoned"}


def dashboard_queries() -> dict[str, str]:
    """Every PromQL expression of the dashboard, by the title of its panel (or variable)."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = {}
    for panel in dashboard["panels"]:
        for panel_or_child in [panel, *panel.get("panels", [])]:
            for target in panel_or_child.get("targets", []):
                queries[f"panel {panel_or_child['title']!r} {target['refId']}"] = target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable["type"] == "query":
            query = variable["query"]
            queries[f"variable {variable['name']}"] = query if isinstance(query, str) else query["query"]
    return queries


def alert_queries() -> dict[str, str]:
    (rule,) = [doc for doc in yaml.safe_load_all(ALERTS.read_text()) if doc]
    return {
        f"alert {item.get('alert') or item.get('record')}": str(item["expr"])
        for group in rule["spec"]["groups"]
        for item in group["rules"]
    }


def test_the_dashboard_has_a_panel_for_each_thing_operators_watch() -> None:
    queried = set().union(*(metric_names(expression) for expression in dashboard_queries().values()))

    assert {
        "ferry_migrations",  # Migrations by phase
        "ferry_step_duration_seconds_bucket",  # step durations
        "ferry_write_downtime_seconds_bucket",  # the write-downtime window
        "ferry_compensations_total",
        "ferry_status_patch_seconds_bucket",
        "ferry_watcher_event_to_start_seconds_bucket",
        "temporal_worker_task_slots_available",
        "temporal_worker_task_slots_used",
        "temporal_activity_execution_failed",
    } <= queried


def _migration(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    found = kubectl("get", "migration", name, "-n", namespace, "-o", "json", check=False)
    if found.returncode != 0:
        assert "NotFound" in found.stderr, found.stderr
        return None
    migration: dict[str, Any] = json.loads(found.stdout)
    return migration


def _status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = (_migration(kubectl, namespace, name) or {}).get("status") or {}
    return status


async def test_every_metric_the_dashboard_and_the_alerts_query_is_served_by_the_worker_or_the_watcher(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, databases: Databases, observed_ferry: Observed
) -> None:
    with psycopg.connect(databases.source.dsn) as conn:
        conn.execute("create table orders as select n as id from generate_series(1, 200) as n")

    driver = {"type": "postgresql", "sourceSecret": "no-such-secret", "targetSecret": TARGET_SECRET}
    refused = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, name="refused", driver=driver))
    await eventually(
        "the refused Migration to finish",
        lambda: asyncio.to_thread(lambda: _status(kubectl, namespace, refused.name).get("phase") in FINISHED),
        120,
    )
    deleted = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, soakSeconds=600))

    def soaking() -> bool:
        steps = {step["name"]: step["state"] for step in _status(kubectl, namespace, deleted.name).get("steps", [])}
        return steps.get("switch-traffic") == "Succeeded"

    await eventually("the traffic to move", lambda: asyncio.to_thread(soaking), 240)
    await asyncio.to_thread(kubectl, "delete", "migration", deleted.name, "-n", namespace, "--wait=false")
    await eventually(
        "the deleted Migration to be undone and gone",
        lambda: asyncio.to_thread(lambda: _migration(kubectl, namespace, deleted.name) is None),
        240,
    )
    queries = {**dashboard_queries(), **alert_queries()}
    assert all(metric_names(expression) for expression in queries.values()), "an expression reads no metric"
    served: set[str] = set()
    missing: dict[str, list[str]] = {}

    async def all_served() -> bool:
        # The watcher may still be reading the deletion's last events: wait for its gauges, not a resync's time.
        served.clear()
        for url in (observed_ferry.worker_metrics, observed_ferry.watcher_metrics):
            served.update(exposed_names(await asyncio.to_thread(scrape, url)))
        missing.clear()
        missing.update(
            (where, sorted(metric_names(expression) - served))
            for where, expression in queries.items()
            if metric_names(expression) - served
        )
        return not missing

    await eventually(
        "every metric the dashboard and the alerts query to be served",
        all_served,
        60,
        seen=lambda: f"not served: {missing}; served: {sorted(served)}",
    )
