"""The Temporal Web UI, as a person sees it in a browser: find a migration's run by its name and phase.

Headless Chromium (Debian's package, installed by `make test`'s setup) renders the UI's
pages; the test reads each page's text once it shows the list (the first Chromium start
and the first page load are slow on a cold machine) and saves a screenshot under artifacts/.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from kubernetes import client as k8s
from temporalio.client import Client, WorkflowExecutionStatus

from devstack.stack.install import ensure_chromium
from devstack.stack.stack import StackInfo
from ferry.api.migration import GROUP, PLURAL, VERSION
from ferry.api.saga import workflow_id
from tests.browser import Browser
from tests.conftest import Kubectl
from tests.end_to_end import Databases, apply_migration, eventually, migration_manifest
from watcher.settings import WatcherSettings
from worker.settings import WorkerSettings

ARTIFACTS = Path(__file__).resolve().parent.parent.parent / "artifacts"
MIGRATION_DONE = 600.0
"""Seconds for the Migration to succeed: a whole real migration, on a machine that may be cold and busy."""
PAGE_SHOWN = 180.0
"""Seconds for a page of the UI to show its list: the first load compiles the UI's scripts."""
NO_RUNS = "No Workflows Found"
"""What the UI's list says when no run matches its query."""

pytestmark = pytest.mark.usefixtures("migration_crd", "source_workload", "migration_secrets")


def _list_url(stack: StackInfo, query: str) -> str:
    return f"{stack.temporal_ui_url}/namespaces/default/workflows?query={quote(query)}"


def _browse(stack: StackInfo, by_name: str, run: str, screenshot: Path) -> tuple[str, str]:
    """The text of the list of runs in phase Succeeded, then of those in phase RolledBack; a screenshot of the first."""
    listed = re.compile(rf"COMPLETED\s+{re.escape(run)}")
    with Browser(ensure_chromium()) as browser:
        browser.open(_list_url(stack, f"{by_name} AND FerryPhase = 'Succeeded'"))
        succeeded = browser.wait_for(f"the run {run} as COMPLETED", lambda text: bool(listed.search(text)), PAGE_SHOWN)
        browser.screenshot(screenshot)
        browser.open(_list_url(stack, f"{by_name} AND FerryPhase = 'RolledBack'"))
        rolled_back = browser.wait_for(f"the list ({NO_RUNS!r})", lambda text: NO_RUNS in text, PAGE_SHOWN)
    return succeeded, rolled_back


async def test_the_web_ui_finds_the_run_of_a_migration_by_its_name_and_phase(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, databases: Databases,
    temporal_client: Client, kube_api: k8s.ApiClient, running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    with psycopg.connect(databases.source.dsn) as conn:
        conn.execute("create table orders as select n as id from generate_series(1, 100) as n")
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, name="ui-orders"))
    migrations = k8s.CustomObjectsApi(kube_api)
    status: dict[str, Any] = {}

    async def succeeded() -> bool:
        found = await asyncio.to_thread(
            migrations.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, ref.name
        )
        status.clear()
        status.update(found.get("status") or {})
        assert status.get("phase") not in {"RolledBack", "Failed", "Abandoned"}, json.dumps(status, indent=1)
        return status.get("phase") == "Succeeded"

    await eventually(
        f"Migration {ref.name} to succeed", succeeded, within=MIGRATION_DONE, seen=lambda: json.dumps(status)
    )
    # The phase is mirrored before the run ends; the UI lists what Temporal's visibility has, so wait for
    # the run to be listed as completed under the query the page will send.
    by_name = f"FerryNamespace = '{namespace}' AND FerryMigration = '{ref.name}'"
    run = workflow_id(ref)

    async def listed_as_completed() -> bool:
        query = f"{by_name} AND FerryPhase = 'Succeeded'"
        runs = [item async for item in temporal_client.list_workflows(query)]
        return any(item.id == run and item.status == WorkflowExecutionStatus.COMPLETED for item in runs)

    await eventually(f"run {run} to be listed as completed", listed_as_completed, within=120)
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "web-ui-migration-by-name-and-phase.png"

    shown_succeeded, shown_rolled_back = await asyncio.to_thread(_browse, stack, by_name, run, screenshot)

    assert re.search(rf"COMPLETED\s+{re.escape(run)}", shown_succeeded)
    assert run not in shown_rolled_back
    assert NO_RUNS in shown_rolled_back
    assert screenshot.stat().st_size > 10_000
