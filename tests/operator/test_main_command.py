"""The README's main command, run as a person runs it: in a terminal, then Ctrl-C.

A first `ferry up` on a cold machine is slow (the page cache, initdb, Temporal's schema,
every Python import compiled once), so each stage gets a generous deadline and is waited
for by what the terminal shows; a stage that does not come fails with the terminal's
output so far, and the program exiting early fails at once.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.stack.processes import processes_under
from tests.conftest import make_state_dir
from tests.terminal import Terminal

STACK_UP = 600.0
"""Seconds for the stack to come up: every component of it starting for the first time on a cold machine."""
SAMPLE_DONE = 600.0
"""Seconds to seed the sample and migrate it once the stack is up."""
STOPPED = 300.0
"""Seconds for Ctrl-C to stop the worker, the watcher and every process of the stack."""


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
        finished = up.wait_for("the sample Migration to finish", r"Migration shop/orders-db-to-18: (\w+)", SAMPLE_DONE)
        assert finished.group(1) == "Succeeded", up.shown()
        up.wait_for("the invitation to stop", r"Press Ctrl-C to stop", 60)

        up.interrupt()
        code = up.wait_exit(STOPPED)
    finally:
        up.close()

    assert code == 0, up.shown()
    assert "stopped; no process of the stack is left." in up.output
    assert "kubectl" in up.output
    assert "describe migration orders-db-to-18 -n shop" in up.output
    assert "Temporal Web UI: http://127.0.0.1:" in up.output
    assert "workflow show --address 127.0.0.1:" in up.output
    assert "--codec-endpoint http://127.0.0.1:" in up.output, "the sample's payloads are encrypted"
    deadline = time.monotonic() + 60
    while processes_under(state_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_under(state_dir) == []
