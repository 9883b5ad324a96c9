"""What an activity's Heartbeats does with the stops registered with it once the activity is cancelled.

A stop may wait seconds for a server (a cancel request it does not take; see
activities/postgres/connection.py), so one stop that waits must not keep the others from
running: an activity with sessions on both servers stops both in the time of one.
"""

from __future__ import annotations

import threading

import pytest
from temporalio import activity
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities import heartbeats
from activities.heartbeats import Heartbeats
from tests.cluster import eventually

pytestmark = pytest.mark.unit


def test_a_stop_that_waits_does_not_keep_the_others_from_running() -> None:
    env = ActivityEnvironment()
    let_go = threading.Event()
    ran: list[str] = []

    def waiting() -> None:
        ran.append("waiting")
        let_go.wait(60)

    @activity.defn(no_thread_cancel_exception=True)  # as ferry's: only the stops reach the work
    def work() -> None:
        with Heartbeats(0.2) as beats:
            beats.on_cancel(waiting)
            beats.on_cancel(lambda: ran.append("second"))
            threading.Thread(target=env.cancel, daemon=True).start()
            eventually("the second stop to run", lambda: "second" in ran, timeout=30)
            beats.raise_if_cancelled("waiting for the stops")

    try:
        with pytest.raises(CancelledError):
            env.run(work)
    finally:
        let_go.set()
    assert sorted(ran) == ["second", "waiting"]


def test_the_heartbeats_an_activity_entered_are_current_in_it_and_a_forgotten_stop_is_not_called() -> None:
    env = ActivityEnvironment()
    called: list[str] = []

    @activity.defn(no_thread_cancel_exception=True)
    def work() -> None:
        assert heartbeats.current() is None
        with Heartbeats(0.2) as beats:
            assert heartbeats.current() is beats
            kept, forgotten = (lambda: called.append("kept")), (lambda: called.append("forgotten"))
            beats.on_cancel(kept)
            beats.on_cancel(forgotten)
            beats.forget(forgotten)
            threading.Thread(target=env.cancel, daemon=True).start()
            eventually("the kept stop to run", lambda: called == ["kept"], timeout=30)
        assert heartbeats.current() is None

    env.run(work)
    assert called == ["kept"]
