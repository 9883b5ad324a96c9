"""What Temporal keeps of a migration is ciphertext: ferry's keys and the codec server read it back, nothing else does.

A real Migration runs under ferry's real watcher and worker, both encrypting with the
stack's codec key. Its source Secret is named with a string found nowhere else, so the
spec holds it, the activities' inputs hold it, and the precheck's failure message quotes
it. Read as Temporal stores it (a client without the key), the history must not show it
anywhere; through the key (the kubectl plugin), the stack's codec server (the temporal
CLI) or the Web UI pointed at that server, it must.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from devstack.stack.install import Binaries, ensure_chromium
from devstack.stack.stack import StackInfo
from ferry.api.saga import workflow_id
from ferry.clients import TemporalSettings, connect_temporal
from ferry.codec.encryption import ENCODING
from tests.browser import Browser
from tests.conftest import Kubectl
from tests.end_to_end import TARGET_SECRET, apply_migration, eventually, migration_manifest, start_migration
from watcher.settings import WatcherSettings
from worker.settings import WorkerSettings

pytestmark = pytest.mark.usefixtures("migration_crd", "source_workload", "migration_secrets")

PLUGIN = Path(sys.executable).parent / "kubectl-ferry"
RUN_ENDED = 300.0
"""Seconds for the run to end: the precheck fails at once, then the saga records it and ends."""
PAGE_SHOWN = 180.0
"""Seconds for the Web UI to show the run's input: the first load of the UI is slow on a cold machine."""
CLEAR_BY_DESIGN = {"search_attributes", "header"}
"""Payloads Temporal itself reads (to list and filter runs), and trace context: never a spec or a message."""
SDK_BOOKKEEPING = {"patch-data", "data"}
"""Marker details the SDK writes for itself: which patches a run took, and a local activity's sequence number,
type and times (its result is under `result`, and sealed)."""
SEALED = "YmluYXJ5L2VuY3J5cHRlZA=="
"""binary/encrypted in base64: how the Web UI shows the encoding of a payload it has not decoded."""


def _marker() -> str:
    return f"codec-marker-{uuid.uuid4().hex[:8]}"


def _messages(message: Message, path: str) -> Iterator[tuple[str, Message]]:
    """Every message inside `message` with where it is, skipping what is clear by design."""
    yield path, message
    for field, value in message.ListFields():
        kind = field.message_type
        if kind is None or field.name in CLEAR_BY_DESIGN:
            continue
        if kind.GetOptions().map_entry:
            if kind.fields_by_name["value"].message_type is None:
                continue
            bookkeeping = SDK_BOOKKEEPING if path.endswith("marker_recorded_event_attributes") else set()
            items: list[tuple[str, Any]] = [
                (f"{field.name}[{key}]", item) for key, item in value.items() if key not in bookkeeping
            ]
        elif field.is_repeated:
            items = [(f"{field.name}[{index}]", item) for index, item in enumerate(value)]
        else:
            items = [(field.name, value)]
        for name, item in items:
            yield from _messages(item, f"{path}.{name}")


async def _ended_run(raw: Client, run: str) -> None:
    seen: dict[str, Any] = {}

    async def ended() -> bool:
        try:
            seen["status"] = (await raw.get_workflow_handle(run).describe()).status
        except RPCError:  # the watcher has not started it yet
            return False
        return seen["status"] is not WorkflowExecutionStatus.RUNNING

    await eventually(f"run {run} to end", ended, within=RUN_ENDED, seen=lambda: str(seen.get("status")))


def _run(*argv: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """A program as an operator runs it: the test run's environment without its FERRY_ variables, plus these."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("FERRY_")}
    return subprocess.run(
        argv, env={**environment, **variables}, capture_output=True, text=True, timeout=120, check=False
    )


async def test_the_stored_history_of_a_failed_migration_holds_nothing_readable_but_the_keys_read_it_back(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, binaries: Binaries, temporal_client: Client,
    encrypting_watcher: WatcherSettings, encrypting_worker: WorkerSettings,
) -> None:  # fmt: skip
    marker = _marker()
    driver = {"type": "postgresql", "sourceSecret": marker, "targetSecret": TARGET_SECRET}
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, driver=driver))
    run = workflow_id(ref)
    await _ended_run(temporal_client, run)

    # As Temporal stores it, read by a client without the key.
    stored = await temporal_client.get_workflow_handle(run).fetch_history()
    found = [(path, item) for event in stored.events for path, item in _messages(event, f"event {event.event_id}")]
    clear = [path for path, item in found if isinstance(item, Payload) and item.metadata["encoding"] != ENCODING]
    failures = [item for _, item in found if isinstance(item, Failure)]
    sealed = [item for _, item in found if isinstance(item, Payload) and item.metadata["encoding"] == ENCODING]

    assert marker not in stored.to_json()
    assert clear == [], "every input, result, heartbeat and failure detail is sealed"
    assert len(sealed) > 10, "the run's inputs and results are there, sealed"
    assert failures, "the precheck's failure is there"
    assert {failure.message for failure in failures} == {"Encoded failure"}

    # Through the stack's codec server: the temporal CLI shows the spec and the precheck's message.
    show = [str(binaries.temporal), "workflow", "show", f"--address={stack.temporal_address}", f"--workflow-id={run}",
            "--detailed"]  # fmt: skip
    raw_shown = await asyncio.to_thread(_run, *show)
    decoded_shown = await asyncio.to_thread(_run, *show, f"--codec-endpoint={stack.codec_endpoint}")
    assert raw_shown.returncode == 0, raw_shown.stderr
    assert decoded_shown.returncode == 0, decoded_shown.stderr
    assert marker not in raw_shown.stdout
    assert marker in decoded_shown.stdout
    assert f"Secret {namespace}/{marker} does not exist" in decoded_shown.stdout

    # Through the key: `kubectl ferry history` names the missing Secret; without the key it says what it lacks.
    history = [str(PLUGIN), "history", ref.name, "-n", namespace, f"--temporal-address={stack.temporal_address}"]
    kubeconfig = {"KUBECONFIG": str(stack.kubeconfig)}
    keyless = await asyncio.to_thread(_run, *history, **kubeconfig)
    keyed = await asyncio.to_thread(_run, *history, **kubeconfig, FERRY_CODEC_KEYS=str(stack.codec_keys))
    assert keyless.returncode == 0, keyless.stderr
    assert keyed.returncode == 0, keyed.stderr
    precheck = [line for line in keyed.stdout.splitlines() if "precheck" in line and "Failed" in line]
    assert precheck, keyed.stdout
    assert f"Secret {namespace}/{marker} does not exist" in precheck[0]
    assert marker not in keyless.stdout
    assert "the history is encrypted: pass --codec-keys" in keyless.stderr


def _browse(url: str, marker: str, screenshot: Path) -> str:
    """The text of the run's page once it shows the marker and no payload left undecoded; a screenshot of it."""
    with Browser(ensure_chromium()) as browser:
        browser.open(url)
        shown = browser.wait_for(
            f"the input decoded (with {marker})", lambda text: marker in text and SEALED not in text, PAGE_SHOWN
        )
        browser.screenshot(screenshot)
    return shown


async def test_the_web_ui_shows_the_decoded_input_of_a_run_through_the_stacks_codec_server(
    kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str, task_queue: str, temporal_client: Client,
    encrypted: TemporalSettings, tmp_path: Path,
) -> None:  # fmt: skip
    marker = _marker()
    driver = {"type": "postgresql", "sourceSecret": marker, "targetSecret": TARGET_SECRET}
    manifest = migration_manifest(stack, bucket, driver=driver)
    ref = apply_migration(kubectl, namespace, manifest)
    # Started as the watcher starts it, through ferry's client with the stack's key; no worker needs to run.
    client = await connect_temporal(encrypted)
    handle = await start_migration(client, ref, manifest, task_queue)
    try:
        stored = await temporal_client.get_workflow_handle(handle.id).fetch_history()
        run = quote(handle.id, safe="")
        url = f"{stack.temporal_ui_url}/namespaces/default/workflows/{run}/{handle.result_run_id}/history"
        screenshot = tmp_path / "web-ui-decoded-input.png"

        shown = await asyncio.to_thread(_browse, url, marker, screenshot)
    finally:
        await handle.terminate("the test has seen its page")

    assert marker not in stored.to_json()
    assert marker in shown
    assert f'"sourceSecret": "{marker}"' in shown
    assert screenshot.stat().st_size > 10_000
