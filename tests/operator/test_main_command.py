"""The README's main command, run as a person runs it: in a terminal, then Ctrl-C."""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.stack.processes import processes_under
from tests.conftest import make_state_dir


@pytest.fixture
def state_dir() -> Iterator[Path]:
    folder = make_state_dir("ferry-up-")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _read_until(fd: int, pattern: str, within: float, seen: list[str]) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536).decode(errors="replace")
            except OSError:  # the terminal closed: the program ended
                return re.search(pattern, "".join(seen)) is not None
            seen.append(chunk)
            if re.search(pattern, "".join(seen)):
                return True
    return False


def test_ferry_up_migrates_the_sample_in_a_terminal_and_stops_cleanly_on_ctrl_c(state_dir: Path) -> None:
    controller, terminal = pty.openpty()
    up = subprocess.Popen(
        [sys.executable, "-m", "ferry.cli", "up", f"--state-dir={state_dir}", "--orders=5000", "--keep-running"],
        stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True,
    )  # fmt: skip
    os.close(terminal)
    seen: list[str] = []
    try:
        succeeded = _read_until(controller, r"Migration shop/orders-db-to-16: Succeeded", 240, seen)
        assert succeeded, "".join(seen)[-3000:]
        assert _read_until(controller, r"Press Ctrl-C to stop", 30, seen)

        os.killpg(up.pid, signal.SIGINT)  # what Ctrl-C sends to the terminal's foreground process group
        up.wait(90)
        _read_until(controller, r"no process of the stack is left", 5, seen)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
        os.close(controller)

    output = "".join(seen)
    assert up.returncode == 0, output[-3000:]
    assert "stopped; no process of the stack is left." in output
    assert "kubectl" in output
    assert "describe migration orders-db-to-16 -n shop" in output
    assert "Temporal Web UI: http://127.0.0.1:" in output
    deadline = time.monotonic() + 15
    while processes_under(state_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_under(state_dir) == []
