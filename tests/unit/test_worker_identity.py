"""How a worker process names itself to Temporal: in histories, `tctl taskqueue describe` and the Web UI."""

from __future__ import annotations

import os
import socket

import pytest

from worker.runner import identity
from worker.settings import WorkerSettings

pytestmark = pytest.mark.unit


def test_two_worker_processes_on_one_host_have_two_identities(monkeypatch: pytest.MonkeyPatch) -> None:
    """Temporal counts pollers by identity: two workers on one host that named themselves alike would be one."""
    settings = WorkerSettings(task_queue="ferry")
    names = []
    for pid in (4101, 4102):
        monkeypatch.setattr(os, "getpid", lambda pid=pid: pid)
        names.append(identity(settings))

    assert names == [f"ferry-worker.4101@{socket.gethostname()}", f"ferry-worker.4102@{socket.gethostname()}"]


@pytest.mark.parametrize("runs", ["workflows", "activities"])
def test_a_split_process_says_what_it_runs(runs: str) -> None:
    settings = WorkerSettings(task_queue="ferry", runs=runs)

    assert identity(settings).startswith(f"ferry-worker-{runs}.{os.getpid()}@")
