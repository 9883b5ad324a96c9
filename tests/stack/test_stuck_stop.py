"""`make up` when its stop does not end: bounded all the same, and it shows where it is stuck.

Each case runs supervise in a Python process of its own, since a stuck stop ends its process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

STUCK_RUN = """
import asyncio, os, signal, sys, time
from devstack.demo import run as demo
demo.STOP_GRACE = 0.5

async def stuck(stopping):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, once the handlers are in place
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        stopping.set()
        {stuck}

def stop_the_stack():
    print("stopping the stack from outside the run", flush=True)

demo.supervise(stuck, when_stuck=stop_the_stack)
print("supervise returned", flush=True)
"""


@pytest.mark.parametrize(
    "stuck",
    [
        "await asyncio.Event().wait()  # waits for what never comes, past every cancellation",
        "time.sleep(3600)  # blocks its event loop",
    ],
    ids=["waiting forever", "blocking the event loop"],
)
def test_a_stop_that_does_not_end_within_the_grace_shows_each_thread_then_stops_the_stack_and_exits_1(
    stuck: str,
) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", STUCK_RUN.format(stuck=stuck)],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert ran.returncode == 1, ran.stderr
    assert ran.stdout.splitlines() == ["stopping the stack from outside the run"]
    assert "the run has not stopped 0.5s after it was asked to; where each thread waits:" in ran.stderr
    assert 'File "<string>"' in ran.stderr  # the stuck run's own frame is in the dump
