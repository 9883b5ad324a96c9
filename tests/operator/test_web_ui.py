"""The Temporal Web UI, as a person sees it in a browser: find a migration's run by its name and phase.

Headless Chromium (Debian's package, installed by `make test`'s setup) renders the UI's
pages; the test reads the rendered DOM and saves a screenshot under artifacts/.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from ferry.api.saga import workflow_id
from ferry.stack.install import ensure_chromium
from ferry.stack.stack import StackInfo
from tests.conftest import Kubectl
from tests.end_to_end import Databases, apply_migration, migration_manifest
from watcher.settings import WatcherSettings
from worker.settings import WorkerSettings

ARTIFACTS = Path(__file__).resolve().parent.parent.parent / "artifacts"

pytestmark = pytest.mark.usefixtures("migration_crd", "source_workload", "migration_secrets")


def _chromium(url: str, *mode: str) -> str:
    profile = tempfile.mkdtemp(prefix="ferry-chromium-")
    try:
        rendered = subprocess.run(
            [
                str(ensure_chromium()), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", "--window-size=1400,900", "--virtual-time-budget=15000", *mode, url,
            ],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return rendered.stdout


def _list_url(stack: StackInfo, query: str) -> str:
    return f"{stack.temporal_ui_url}/namespaces/default/workflows?query={quote(query)}"


async def test_the_web_ui_finds_the_run_of_a_migration_by_its_name_and_phase(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, databases: Databases,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    with psycopg.connect(databases.source.dsn) as conn:
        conn.execute("create table orders as select n as id from generate_series(1, 100) as n")
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, name="ui-orders"))
    await asyncio.to_thread(
        kubectl, "wait", "--for=condition=Succeeded", f"migration/{ref.name}", "-n", namespace, "--timeout=180s"
    )
    by_name = f"FerryNamespace = '{namespace}' AND FerryMigration = '{ref.name}'"

    succeeded = await asyncio.to_thread(
        _chromium, _list_url(stack, f"{by_name} AND FerryPhase = 'Succeeded'"), "--dump-dom"
    )
    rolled_back = await asyncio.to_thread(
        _chromium, _list_url(stack, f"{by_name} AND FerryPhase = 'RolledBack'"), "--dump-dom"
    )
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "web-ui-migration-by-name-and-phase.png"
    await asyncio.to_thread(
        _chromium, _list_url(stack, f"{by_name} AND FerryPhase = 'Succeeded'"), f"--screenshot={screenshot}"
    )

    assert workflow_id(ref) in succeeded
    assert "COMPLETED" in succeeded.upper()
    assert workflow_id(ref) not in rolled_back
    assert screenshot.stat().st_size > 10_000
