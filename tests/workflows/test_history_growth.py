"""What a run's history costs: nothing while it waits, and one status write per step boundary.

A Migration may stay paused, or wait for its approval, for days: the saga waits on a
condition, never on a timer that wakes it to look again, so its history holds still. In
mode Online one activity watches the replication beside that wait: its heartbeats, and
Temporal's retries of it (after a lost worker, or a day's attempt), add nothing to the
history either.
scripts/bench_fleet.py --histories measures real runs' histories.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from ferry.api.migration import Phase
from ferry.api.saga import ControlRequest, Signal
from tests.workflows.conftest import migration_input, record_history
from tests.workflows.fakes import MIRROR, WATCH_REPLICATION, FakeSaga
from workflows import plan

Run = Any
pytestmark = pytest.mark.timeout(90)


async def test_a_migration_paused_for_a_week_adds_nothing_to_its_history(
    run_saga: Run, time_skipping: WorkflowEnvironment
) -> None:
    saga = await run_saga(FakeSaga(), migration_input(paused=True))
    await saga.wait_for(
        "the pause in the status", lambda: bool(saga.fakes.statuses) and saga.fakes.statuses[-1].phase is Phase.PAUSED
    )
    before = await saga.settled_length()

    await time_skipping.sleep(timedelta(days=7))

    assert await saga.settled_length() == before
    await saga.handle.signal(Signal.RESUME.value, ControlRequest(by="carol"))
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    await record_history(saga, "coalesced-paused-a-week")


@pytest.mark.own_time_server  # its replication's watch runs beside a wait
async def test_an_online_migration_awaiting_approval_adds_nothing_to_its_history_while_its_replication_is_watched(
    run_saga: Run,
) -> None:
    """The watch is one activity whatever the wait's length: its heartbeats (every 50 ms here) are no history events.
    (The time-skipping server does not skip time while an activity runs, so the wait here is seconds of real time.)"""
    driver = {"type": "postgresql", "sourceSecret": "s", "targetSecret": "t", "mode": "Online"}
    saga = await run_saga(FakeSaga(steps=plan.ONLINE_PLAN), migration_input(driver=driver, approval={"required": True}))
    await saga.wait_for("the watch beside the approval", lambda: saga.fakes.started(WATCH_REPLICATION))
    before = await saga.settled_length(pending=1)

    await asyncio.sleep(3)

    assert await saga.settled_length(pending=1) == before
    await saga.handle.signal(Signal.APPROVE.value, ControlRequest(by="carol"))
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED


async def test_a_steps_end_and_the_next_steps_start_are_one_status_write_and_every_event_is_recorded(
    run_saga: Run,
) -> None:
    saga = await run_saga(FakeSaga())

    await saga.handle.result()

    reasons = [event.reason for event in saga.fakes.events]
    assert reasons.count("StepStarted") == reasons.count("StepSucceeded") == len(plan.PLAN)
    assert [reasons[0], reasons[-1]] == ["Started", "Succeeded"]
    assert len({event.key for event in saga.fakes.events}) == len(reasons)
    # Started with the first step's start, each step's end with the next one's start, the last end with Succeeded.
    assert saga.fakes.calls.count(MIRROR) == len(plan.PLAN) + 1
    await record_history(saga, "coalesced-happy-path")
