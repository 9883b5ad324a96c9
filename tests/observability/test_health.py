"""Kubernetes can probe the worker and the watcher: /healthz while alive, /readyz once working."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from devstack.stack.readiness import free_port
from devstack.stack.stack import StackInfo
from ferry.observability.settings import ObservabilitySettings
from tests.end_to_end import eventually, watcher_settings, worker_settings
from watcher import runner as watcher_runner
from worker import runner as worker_runner


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.parametrize("component", ["worker", "watcher"])
async def test_the_component_answers_its_probes(
    component: str, stack: StackInfo, task_queue: str, namespace: str
) -> None:
    address = f"127.0.0.1:{free_port()}"
    observability = ObservabilitySettings(health_address=address)
    run: Callable[..., object]
    if component == "worker":
        settings: object = dataclasses.replace(worker_settings(stack, task_queue), observability=observability)
        run = worker_runner.run
    else:
        settings = dataclasses.replace(watcher_settings(stack, task_queue, namespace), observability=observability)
        run = watcher_runner.run
    stop = asyncio.Event()
    task = asyncio.create_task(run(settings, stop=stop))  # type: ignore[arg-type]
    try:

        async def ready() -> bool:
            with contextlib.suppress(OSError):
                return (await asyncio.to_thread(_get, f"http://{address}/readyz")) == (200, "ready")
            return False

        await eventually(f"the {component} to be ready", ready, within=60)

        assert await asyncio.to_thread(_get, f"http://{address}/healthz") == (200, "ok")
        assert (await asyncio.to_thread(_get, f"http://{address}/metrics"))[0] == 404
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)

    with pytest.raises(urllib.error.URLError, match="Connection refused"):
        await asyncio.to_thread(_get, f"http://{address}/healthz")
