"""`make up` as a newcomer runs it: from any checkout folder, and every failure explained on the terminal.

As root, with the state folder inside a folder the `postgres` user cannot enter (a clone
in root's home, mode 700), the stack comes up with no flag, keeps its data across a stop
and a start, and stops cleanly. When a component cannot start, or stops while the stack
runs, the terminal names it, shows the cause (the end of its log) and the path of its
full log, and the command exits non-zero with nothing left running.

Ports are no way to break a component on purpose: the stack keeps its ports across
starts only while they are free and takes others otherwise. These tests break a data
folder, a binary, and a running server instead.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from devstack.stack import postgres_home
from devstack.stack.processes import group_members, processes_under
from devstack.stack.stack import StackInfo
from tests.conftest import make_closed_folder, make_state_dir, remove_state_dir
from tests.terminal import Terminal

STACK_UP = 600.0
"""Seconds for the stack to come up: every component of it starting on a cold, busy machine."""
STOPPED = 300.0
"""Seconds for a signal or a failure to stop the worker, the watcher and every process of the stack."""
FAILED = 120.0
"""Seconds for a component that cannot start to end the command (it fails at once, before anything waits)."""


@pytest.fixture
def closed_state_dir() -> Iterator[Path]:
    """The default state folder of a checkout in root's home: inside a folder of mode 700."""
    closed = make_closed_folder("ferry-home-")
    state_dir = closed / "checkout" / ".ferry" / "stack"
    yield state_dir
    remove_state_dir(state_dir)
    shutil.rmtree(closed, ignore_errors=True)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    folder = make_state_dir("ferry-up-")
    yield folder
    remove_state_dir(folder)


def _up(state_dir: Path, *args: str, env: dict[str, str] | None = None) -> Terminal:
    return Terminal([sys.executable, "-m", "devstack", "up", f"--state-dir={state_dir}", *args], env=env)


def _recorded_groups(state_dir: Path) -> set[int]:
    return {int(entry["pid"]) for entry in json.loads((state_dir / "pids.json").read_text())}


def _left_running(state_dir: Path, groups: set[int], within: float = 60) -> list[object]:
    """What still runs of the stack once `within` seconds have passed (at once when nothing does)."""
    folders = (state_dir, postgres_home.outside_folder(state_dir))
    deadline = time.monotonic() + within
    while True:
        left = [*(p for folder in folders for p in processes_under(folder)), *group_members(groups)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.skipif(os.geteuid() != 0, reason="as root, PostgreSQL runs as the postgres user")
@pytest.mark.timeout(2 * (STACK_UP + STOPPED) + 120)
def test_ferry_up_as_root_in_a_folder_closed_to_postgres_migrates_its_sample_keeps_its_data_and_stops_cleanly(
    closed_state_dir: Path,
) -> None:
    closed = closed_state_dir.parents[2]
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700
    outside = postgres_home.outside_folder(closed_state_dir)
    marker = uuid.uuid4().hex

    first = _up(closed_state_dir, "--orders=2000", "--keep-running")
    try:
        first.wait_for("the stack to be up", r"The stack is up\.", STACK_UP)
        finished = first.wait_for("the sample to finish", r"Migration shop/orders-db-to-18: (\w+) —", STACK_UP)
        assert finished.group(1) == "Succeeded", first.shown()
        groups = _recorded_groups(closed_state_dir)
        with psycopg.connect(StackInfo.load(closed_state_dir).postgres["source"].dsn, connect_timeout=10) as conn:
            conn.execute("create table survivors (marker text)")
            conn.execute("insert into survivors values (%s)", (marker,))
        first.send(signal.SIGTERM)
        first_code = first.wait_exit(STOPPED)
    finally:
        first.close()

    assert first_code == 0, first.shown()
    assert f"PostgreSQL data:   {outside}" in first.output
    assert f"user 'postgres', which PostgreSQL runs as, cannot enter {closed} (drwx------)" in first.output
    assert "stopped; no process of the stack is left." in first.output
    assert _left_running(closed_state_dir, groups) == []

    again = _up(closed_state_dir, "--no-sample")
    try:
        again.wait_for("the stack to be up again", r"The stack is up\.", STACK_UP)
        groups = _recorded_groups(closed_state_dir)
        with psycopg.connect(StackInfo.load(closed_state_dir).postgres["source"].dsn, connect_timeout=10) as conn:
            row = conn.execute("select marker from survivors").fetchone()
        again.interrupt()
        again_code = again.wait_exit(STOPPED)
    finally:
        again.close()

    assert row == (marker,)
    assert again_code == 0, again.shown()
    assert "stopped; no process of the stack is left." in again.output
    assert _left_running(closed_state_dir, groups) == []


IGNORING_CTRL_C = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"
)
"""Runs argv[1:] with SIGINT ignored, as a script's background job or a CI runner may start `make up`: exec keeps it."""


@pytest.mark.timeout(STACK_UP + STOPPED + 60)
def test_ferry_up_started_with_ctrl_c_ignored_still_stops_on_a_ctrl_c_while_the_stack_starts(state_dir: Path) -> None:
    up = Terminal(
        [sys.executable, "-c", IGNORING_CTRL_C, sys.executable, "-m", "devstack", "up", f"--state-dir={state_dir}",
         "--no-sample"]
    )  # fmt: skip
    try:
        etcd_log = state_dir / "logs" / "etcd.log"
        up.wait_until("the stack to start (its first component's log)", etcd_log.exists, STACK_UP)
        up.interrupt()
        code = up.wait_exit(STOPPED)
    finally:
        up.close()

    assert code == 0, up.shown()
    assert "interrupted" in up.output
    assert "stopped; no process of the stack is left." in up.output
    assert _left_running(state_dir, set()) == []


def _etcd_data_folder_is_a_file(state_dir: Path, tmp_path: Path) -> dict[str, str]:
    (state_dir / "kubernetes").mkdir(parents=True)
    (state_dir / "kubernetes" / "etcd").write_text("not a folder\n")
    return dict(os.environ)


def _etcd_binary_cannot_run(state_dir: Path, tmp_path: Path) -> dict[str, str]:
    # KUBEBUILDER_ASSETS binaries are used as they are: here an etcd built for no machine at all.
    (tmp_path / "etcd").write_bytes(b"\x00\x01 not a program for this machine\n")
    (tmp_path / "etcd").chmod(0o755)
    return dict(os.environ, KUBEBUILDER_ASSETS=str(tmp_path))


@pytest.mark.parametrize(
    ("breakage", "headline", "cause"),
    [
        (
            _etcd_data_folder_is_a_file,
            "ferry up: etcd exited with code 1 while starting:",
            "fatal: failed to list data directory: readdirent {state}/kubernetes/etcd: not a directory",
        ),
        (
            _etcd_binary_cannot_run,
            "ferry up: etcd could not be started:",
            "Exec format error: {tmp}/etcd",
        ),
    ],
    ids=["its data folder is a file", "its binary cannot run"],
)
@pytest.mark.timeout(FAILED + STOPPED + 60)
def test_ferry_up_names_a_component_that_cannot_start_its_cause_and_its_log_then_exits_non_zero(
    breakage: Callable[[Path, Path], dict[str, str]], headline: str, cause: str, state_dir: Path, tmp_path: Path
) -> None:
    env = breakage(state_dir, tmp_path)

    up = _up(state_dir, "--no-sample", env=env)
    try:
        code = up.wait_exit(FAILED + STOPPED)
    finally:
        up.close()

    lines = [line.rstrip() for line in up.output.splitlines()]
    assert code == 1, up.shown()
    assert headline in lines, up.shown()
    shown_cause = lines[lines.index(headline) + 1 :]
    assert cause.format(state=state_dir, tmp=tmp_path) in " ".join(shown_cause[:3]), up.shown()
    assert f"  full log: {state_dir}/logs/etcd.log" in lines, up.shown()
    assert lines.index(headline) < lines.index("stopping the stack...")
    assert "Traceback" not in up.output
    assert _left_running(state_dir, set()) == []


@pytest.mark.timeout(STACK_UP + STOPPED + 120)
def test_ferry_up_names_a_component_that_stops_while_the_stack_runs_then_stops_everything_and_exits_non_zero(
    state_dir: Path,
) -> None:
    up = _up(state_dir, "--no-sample")
    try:
        up.wait_for("the stack, the worker and the watcher to run", r"Press Ctrl-C to stop", STACK_UP)
        groups = _recorded_groups(state_dir)
        recorded = json.loads((state_dir / "pids.json").read_text())
        os.kill(next(entry["pid"] for entry in recorded if entry["name"] == "postgres-target"), signal.SIGKILL)
        code = up.wait_exit(STOPPED)
    finally:
        up.close()

    lines = [line.rstrip() for line in up.output.splitlines()]
    headline = "ferry up: postgres-target was killed by SIGKILL while the stack was running:"
    assert code == 1, up.shown()
    assert headline in lines, up.shown()
    cause = lines[lines.index(headline) + 1 : lines.index(f"  full log: {state_dir}/logs/postgres-target.log")]
    assert 1 <= len(cause) <= 3, up.shown()
    assert all(line.startswith("    ") and "LOG:" in line for line in cause), up.shown()
    assert "stopped; no process of the stack is left." in lines
    assert _left_running(state_dir, groups) == []
