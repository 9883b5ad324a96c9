"""ferry's worker and watcher running in the test's process with their metrics endpoints, a trace file and JSON logs."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import logging
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from devstack.stack.readiness import free_port
from devstack.stack.stack import StackInfo
from ferry.observability.logs import JsonFormatter
from ferry.observability.settings import ObservabilitySettings
from ferry.observability.tracing import TracingSettings
from tests.end_to_end import watcher_settings, worker_settings
from watcher import runner as watcher_runner
from worker import runner as worker_runner


@dataclasses.dataclass
class Observed:
    trace_file: Path
    worker_metrics: str
    watcher_metrics: str
    logs: io.StringIO


@pytest.fixture
async def observed_ferry(stack: StackInfo, task_queue: str, namespace: str, tmp_path: Path) -> AsyncIterator[Observed]:
    """ferry's worker and watcher with metrics endpoints, a trace file, and JSON logs captured."""
    trace_file = tmp_path / "spans.jsonl"
    worker_address, watcher_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    tracing = TracingSettings(file=trace_file)
    worker = dataclasses.replace(
        worker_settings(stack, task_queue),
        observability=ObservabilitySettings(metrics_address=worker_address, tracing=tracing),
    )
    watcher = dataclasses.replace(
        watcher_settings(stack, task_queue, namespace),
        observability=ObservabilitySettings(metrics_address=watcher_address, tracing=tracing),
    )
    logs = io.StringIO()
    handler = logging.StreamHandler(logs)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    previous_level = root.level
    root.setLevel(logging.INFO)
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(worker_runner.run(worker, stop=stop)),
        asyncio.create_task(watcher_runner.run(watcher, stop=stop)),
    ]
    try:
        yield Observed(trace_file, f"http://{worker_address}/metrics", f"http://{watcher_address}/metrics", logs)
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, timeout=30)
        root.removeHandler(handler)
        root.setLevel(previous_level)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
    return text
