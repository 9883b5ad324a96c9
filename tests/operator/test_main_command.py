"""The README's main command, run as a person runs it: in a terminal, then Ctrl-C.

A first `ferry up` on a cold machine is slow (the page cache, initdb, Temporal's schema,
every Python import compiled once), so each stage gets a generous deadline and is waited
for by what the terminal shows; a stage that does not come fails with the terminal's
output so far, and the program exiting early fails at once.
"""

from __future__ import annotations

import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.stack.processes import processes_under
from tests.conftest import make_state_dir

STACK_UP = 600.0
"""Seconds for the stack to come up: every component of it starting for the first time on a cold machine."""
SAMPLE_DONE = 600.0
"""Seconds to seed the sample and migrate it once the stack is up."""
STOPPED = 300.0
"""Seconds for Ctrl-C to stop the worker, the watcher and every process of the stack."""


class Terminal:
    """A program in a pseudo-terminal; everything it writes is read as it comes and kept."""

    def __init__(self, argv: list[str]) -> None:
        controller, terminal = pty.openpty()
        self.process = subprocess.Popen(argv, stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True)
        os.close(terminal)
        self._controller = controller
        self._chunks: list[str] = []
        self._reader = threading.Thread(target=self._read, name="terminal", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        # Reading all along keeps the program from blocking on a full terminal while the test waits.
        while True:
            try:
                chunk = os.read(self._controller, 65536)
            except OSError:  # the terminal closed: the program ended
                return
            if not chunk:
                return
            self._chunks.append(chunk.decode(errors="replace"))

    @property
    def output(self) -> str:
        return "".join(self._chunks)

    def shown(self, lines: int = 60) -> str:
        """The end of what the terminal showed, for a failure message."""
        return "\n".join(self.output.splitlines()[-lines:])

    def wait_for(self, what: str, pattern: str, within: float) -> re.Match[str]:
        """Waits until the output matches `pattern`; fails early if the program exits first."""
        deadline = time.monotonic() + within
        while True:
            found = re.search(pattern, self.output)
            if found:
                return found
            code = self.process.poll()
            if code is not None:
                self._reader.join(5)  # whatever it wrote last
                found = re.search(pattern, self.output)
                if found:
                    return found
                raise AssertionError(f"ferry up exited ({code}) waiting for {what}; its terminal:\n{self.shown()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {within:.0f}s waiting for {what}; its terminal:\n{self.shown()}")
            time.sleep(0.2)

    def interrupt(self) -> None:
        """What Ctrl-C does: SIGINT to the terminal's foreground process group."""
        os.killpg(self.process.pid, signal.SIGINT)

    def wait_exit(self, within: float) -> int:
        try:
            code = self.process.wait(within)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"ferry up still runs {within:.0f}s after Ctrl-C:\n{self.shown()}") from None
        self._reader.join(10)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        self._reader.join(10)
        os.close(self._controller)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    folder = make_state_dir("ferry-up-")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(STACK_UP + SAMPLE_DONE + STOPPED + 300)
def test_ferry_up_migrates_the_sample_in_a_terminal_and_stops_cleanly_on_ctrl_c(state_dir: Path) -> None:
    up = Terminal(
        [sys.executable, "-m", "devstack", "up", f"--state-dir={state_dir}", "--orders=5000", "--keep-running"]
    )
    try:
        up.wait_for("the stack to be up", r"The stack is up\.", STACK_UP)
        finished = up.wait_for("the sample Migration to finish", r"Migration shop/orders-db-to-16: (\w+)", SAMPLE_DONE)
        assert finished.group(1) == "Succeeded", up.shown()
        up.wait_for("the invitation to stop", r"Press Ctrl-C to stop", 60)

        up.interrupt()
        code = up.wait_exit(STOPPED)
    finally:
        up.close()

    assert code == 0, up.shown()
    assert "stopped; no process of the stack is left." in up.output
    assert "kubectl" in up.output
    assert "describe migration orders-db-to-16 -n shop" in up.output
    assert "Temporal Web UI: http://127.0.0.1:" in up.output
    deadline = time.monotonic() + 60
    while processes_under(state_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_under(state_dir) == []
