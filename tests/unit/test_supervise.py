"""`make up` under Ctrl-C: a stop always reaches the run, even when a cancellation is lost on the way."""

from __future__ import annotations

import asyncio
import os
import signal

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


def test_a_stop_asked_for_before_the_handlers_were_in_place_stops_the_run_at_once() -> None:
    async def forever(stopping: asyncio.Event) -> int:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopping.set()
            raise
        return 0

    with pytest.raises(KeyboardInterrupt):
        demo.supervise(forever, stop_asked_before=lambda: True)
