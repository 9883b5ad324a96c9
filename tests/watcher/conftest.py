"""Fixtures of the watcher tests: `ferry watcher` as processes of its own, one pass at a time, visibility helpers.

The in-process watcher fixture (`running_watcher`) and `eventually` live in tests/end_to_end.py."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.common import MetricMeter

from devstack.stack.stack import StackInfo
from ferry.api.saga import WORKFLOW_NAME, MigrationRef, workflow_id
from watcher.deletion import DeletionHandler, Resubmit
from watcher.handling import MigrationHandler
from watcher.kube import Kube
from watcher.metrics import WatcherMetrics
from watcher.patching import MigrationWriter
from watcher.settings import WatcherSettings


async def workflows_in(client: Client, namespace: str) -> list[str]:
    """IDs of the migration workflows of one Kubernetes namespace, as Temporal's visibility lists them."""
    return [
        execution.id
        async for execution in client.list_workflows(
            f"FerryNamespace = '{namespace}' AND WorkflowType = '{WORKFLOW_NAME}'"
        )
    ]


async def has_workflow(client: Client, ref: MigrationRef) -> bool:
    try:
        await client.get_workflow_handle(workflow_id(ref)).describe()
    except Exception:  # noqa: BLE001 - not found (yet)
        return False
    return True


def pass_handler(
    client: Client, kube: Kube, settings: WatcherSettings, resubmit: Resubmit = lambda _: None
) -> MigrationHandler:
    """The watcher's handler of one pass, alone: the test hands it each state the watch would. `resubmit` gets the
    Migrations the handler asks to look at again (the watcher would read and hand them over)."""
    writer = MigrationWriter(kube)
    deletion = DeletionHandler(client, writer, settings, resubmit)
    return MigrationHandler(client, writer, settings, deletion, WatcherMetrics(MetricMeter.noop), resubmit)


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
            "--record-start-after=1",
            f"--identity={identity}",
            *extra,
        ]  # fmt: skip
        process = WatcherProcess(argv, tmp_path / f"watcher-{identity}.log")
        made.append(process)
        return process

    yield make
    for process in made:
        process.kill()
