"""`make up` under Ctrl-C: a stop always reaches the run, even when a cancellation is lost on the way."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.demo import run as demo


@pytest.fixture(autouse=True)
def quick_insisting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "INSIST_INTERVAL", 0.1)


def test_ctrl_c_stops_a_run_that_lost_the_first_cancellation() -> None:
    cancellations: list[str] = []

    async def losing_one(stopping: asyncio.Event) -> int:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, once the handlers are in place
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancellations.append("lost")  # as asyncio.wait_for in Python 3.11 may lose one
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancellations.append("stopping")
            stopping.set()
            raise
        return 0

    with pytest.raises(KeyboardInterrupt):
        demo.supervise(losing_one)

    assert cancellations == ["lost", "stopping"]


def test_a_run_that_has_begun_to_stop_is_not_cancelled_again() -> None:
    cancellations: list[str] = []

    async def stopping_slowly(stopping: asyncio.Event) -> int:
        os.kill(os.getpid(), signal.SIGINT)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancellations.append("stop")
            stopping.set()
            await asyncio.sleep(0.5)  # its cleanup, longer than the interval: left to finish
            raise
        return 0

    with pytest.raises(KeyboardInterrupt):
        demo.supervise(stopping_slowly)

    assert cancellations == ["stop"]


def test_a_run_that_ends_on_its_own_gives_its_exit_code() -> None:
    async def quick(stopping: asyncio.Event) -> int:
        return 3

    assert demo.supervise(quick) == 3


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
