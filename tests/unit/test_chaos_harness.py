"""The chaos harness (and the fleet benchmark built on it) leaves no process of ferry's behind, however a run ends."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from tests.chaos.harness import ChaosPlan, ChaosRun, Component, Report, keep_only_logs

pytestmark = pytest.mark.unit


class _RunWhoseApplyFails(ChaosRun):
    """A run without a stack: its one component is a real process; the apply fails as a vanished stack makes it."""

    def __init__(self, workdir: Path) -> None:  # no stack to take: ChaosRun's own __init__ needs one
        self.plan = ChaosPlan(migrations=1)
        self.run_id = "unit"
        self.workdir = workdir
        self.components = {}
        self.report = Report(self.plan)
        self._stop = threading.Event()

    def _prepare(self) -> None:
        pass

    def _start_components(self) -> None:
        worker = Component("worker-a", [sys.executable, "-c", "import time; time.sleep(600)"], self.workdir / "a.log")
        self.components[worker.name] = worker
        worker.start()

    def _apply_migrations(self) -> None:
        raise RuntimeError("ferry's workers and watcher were not all running after 120 s")


def test_a_run_that_fails_before_its_first_apply_stops_the_processes_it_started(tmp_path: Path) -> None:
    run = _RunWhoseApplyFails(tmp_path)

    with pytest.raises(RuntimeError, match="not all running"):
        run.run()

    worker = run.components["worker-a"]
    assert worker.popen is not None
    assert not worker.running, "the worker outlived its run"


def test_a_finished_run_keeps_its_logs_and_nothing_else(tmp_path: Path) -> None:
    for data in ("stack/kubernetes/etcd/member/wal/0.wal", "stack/postgres/source/data/PG_VERSION", "temporal/db"):
        (tmp_path / data).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / data).write_text("data")
    (tmp_path / "stack/logs").mkdir()
    (tmp_path / "stack/logs/kube-apiserver-audit.log").write_text("{}")
    (tmp_path / "2-workers").mkdir()
    (tmp_path / "2-workers/worker-a.log").write_text("polling")
    (tmp_path / "stack/postgres/source/data/current").symlink_to(tmp_path / "2-workers/worker-a.log")

    keep_only_logs(tmp_path)

    left = sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*"))
    assert left == ["2-workers", "2-workers/worker-a.log", "stack", "stack/logs", "stack/logs/kube-apiserver-audit.log"]
    assert (tmp_path / "2-workers/worker-a.log").read_text() == "polling", "a link to a log removes the link only"
