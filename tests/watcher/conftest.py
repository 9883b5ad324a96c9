"""Fixtures of the watcher tests: the real watcher, in this process or as `ferry watcher` processes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from ferry.api.saga import MigrationRef, workflow_id
from ferry.clients import TemporalSettings
from ferry.stack.stack import StackInfo
from watcher import runner
from watcher.settings import LeaseSettings, WatcherSettings


def watcher_settings(stack: StackInfo, task_queue: str, namespace: str, **changes: Any) -> WatcherSettings:
    assert stack.temporal_address is not None
    settings = WatcherSettings(
        temporal=TemporalSettings(address=stack.temporal_address),
        task_queue=task_queue,
        kubeconfig=stack.kubeconfig,
        namespaces=(namespace,),
        lease=LeaseSettings(name="ferry-watcher", namespace=namespace, duration=4, renew_deadline=3, retry_period=0.5),
        resync_interval=2,
        deletion_timeout=120,
    )
    return dataclasses.replace(settings, **changes)


@pytest.fixture
async def running_watcher(stack: StackInfo, task_queue: str, namespace: str) -> AsyncIterator[WatcherSettings]:
    """ferry's watcher in this process, watching the test's namespace, starting workflows on its task queue."""
    settings = watcher_settings(stack, task_queue, namespace)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(settings, stop=stop))
    yield settings
    stop.set()
    await asyncio.wait_for(task, timeout=30)


async def eventually(what: str, check: Callable[[], Awaitable[bool]], within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)


async def workflows_in(client: Client, namespace: str) -> list[str]:
    """IDs of the migration workflows of one Kubernetes namespace, as Temporal's visibility lists them."""
    return [
        execution.id
        async for execution in client.list_workflows(f"FerryNamespace = '{namespace}' AND WorkflowType = 'Migration'")
    ]


async def has_workflow(client: Client, ref: MigrationRef) -> bool:
    try:
        await client.get_workflow_handle(workflow_id(ref)).describe()
    except Exception:  # noqa: BLE001 - not found (yet)
        return False
    return True


@dataclasses.dataclass
class WatcherProcess:
    """`ferry watcher` as its own process, to be killed like a crashing pod."""

    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def signal(self, signum: int) -> None:
        assert self.popen is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def watcher_process(
    stack: StackInfo, task_queue: str, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., WatcherProcess]]:
    """Makes `ferry watcher` processes for the test's namespace; all are killed afterwards."""
    made: list[WatcherProcess] = []

    def make(identity: str, kubeconfig: Path | None = None, *extra: str) -> WatcherProcess:
        argv = [
            sys.executable, "-m", "ferry.cli", "watcher",
            f"--kubeconfig={kubeconfig or stack.kubeconfig}",
            f"--temporal-address={stack.temporal_address}",
            f"--task-queue={task_queue}",
            f"--namespaces={namespace}",
            f"--lease-namespace={namespace}",
            "--lease-duration=4", "--lease-renew-deadline=3", "--lease-retry-period=0.5",
            "--resync-interval=5",
            f"--identity={identity}",
            *extra,
        ]  # fmt: skip
        process = WatcherProcess(argv, tmp_path / f"watcher-{identity}.log")
        made.append(process)
        return process

    yield make
    for process in made:
        process.kill()
