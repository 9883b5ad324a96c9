"""A status write that failed for good is written again, so the Migration says what its run waits for.

The saga mirrors its status into the Migration at every transition (workflows/saga.py,
`record`); a write whose attempts ran out (the API server down for a minute during a
control-plane upgrade) used to be dropped unless it was the run's last, with its Events.
While the run goes on, the next transition's write carries the whole status; but when the
saga then waits for a person (AwaitingApproval, Paused), no transition comes until that
person acts, and the Migration kept saying Running: `kubectl wait
--for=condition=AwaitingApproval` hung, and nobody learnt that an approval was wanted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from ferry.api.errors import InvalidSpec
from ferry.api.migration import Phase
from ferry.api.saga import ControlRequest, MirrorStatusInput, Signal
from tests.workflows.conftest import migration_input, record_history
from tests.workflows.fakes import FREEZE, MIRROR, PRECHECK, PROVISION, FakeSaga

Run = Any
pytestmark = pytest.mark.timeout(90)

REFUSED = ApplicationError("the API server answered 503 Service Unavailable", type="ApiException", non_retryable=True)
"""A status write whose attempts ran out, as the run sees it."""


@dataclass(frozen=True)
class Wait:
    """A wait for a person, and how a test gets the saga into it and out of it."""

    spec: dict[str, Any]
    fail: dict[str, BaseException]
    phase: Phase
    condition: str
    reason: str
    """The Event of the transition into the wait."""
    control: Signal
    """What the person sends to end it."""


WAITS = {
    "awaiting-approval": Wait(
        {"approval": {"required": True}}, {}, Phase.AWAITING_APPROVAL, "AwaitingApproval", "AwaitingApproval",
        Signal.APPROVE,
    ),
    "paused": Wait({"paused": True}, {}, Phase.PAUSED, "Paused", "Paused", Signal.RESUME),
    "paused-after-a-failed-step": Wait(
        {"failurePolicy": "Pause"}, {PROVISION: InvalidSpec("storage class 'fast' does not exist")}, Phase.PAUSED,
        "Paused", "StepFailed", Signal.RETRY,
    ),
}  # fmt: skip


def writes_of(phase: Phase) -> Callable[[MirrorStatusInput], bool]:
    return lambda request: request.status.phase is phase


def condition_of(saga: Any, kind: str) -> str:
    return next(c.status.value for c in saga.fakes.statuses[-1].conditions if c.type == kind)


@pytest.mark.parametrize("wait", WAITS.values(), ids=list(WAITS))
async def test_a_failed_status_write_is_written_again_while_the_run_waits_for_a_person(
    run_saga: Run, time_skipping: WorkflowEnvironment, wait: Wait
) -> None:
    """The write that says the run waits fails twice, then the API server answers again: the Migration says it waits,
    with the Events of the writes that failed, while the run still waits; then its history holds still."""
    fakes = FakeSaga(
        fail={**wait.fail, MIRROR: REFUSED},
        fail_times={**dict.fromkeys(wait.fail, 1), MIRROR: 2},
        fail_when={MIRROR: writes_of(wait.phase)},
    )
    saga = await run_saga(fakes, migration_input(**wait.spec))
    await saga.wait_for("the status write of the wait to fail", lambda: len(fakes.failed_mirrors) == 1)
    lost = [event.key for request in fakes.failed_mirrors for event in [*request.earlier_events, request.event]]
    assert all(status.phase is not wait.phase for status in fakes.statuses)

    await time_skipping.sleep(timedelta(minutes=10))

    await saga.wait_for("the wait in the Migration's status", lambda: fakes.statuses[-1].phase is wait.phase)
    assert len(fakes.failed_mirrors) == 2, "tried again after a while, and again after a longer while"
    assert condition_of(saga, wait.condition) == "True"
    recorded = [event.key for event in fakes.events]
    assert set(lost) <= set(recorded), "the Events of the failed writes are recorded"
    assert len(recorded) == len(set(recorded))
    assert wait.reason in [event.reason for event in fakes.events]
    assert (await saga.handle.describe()).status is WorkflowExecutionStatus.RUNNING
    assert (await saga.progress()).phase == wait.phase
    assert FREEZE not in fakes.calls
    before = await saga.settled_length()
    await time_skipping.sleep(timedelta(days=7))
    assert await saga.settled_length() == before, "the tries stop once a write lands"

    await saga.handle.signal(wait.control.value, ControlRequest(by="carol"))
    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    assert fakes.statuses[-1].phase is Phase.SUCCEEDED
    if wait.phase is Phase.AWAITING_APPROVAL:
        await record_history(saga, "status-written-again-while-awaiting-approval")


async def test_status_writes_refused_for_a_day_while_the_run_waits_are_tried_at_most_every_ten_minutes(
    run_saga: Run, time_skipping: WorkflowEnvironment
) -> None:
    """No busy polling: the tries back off to one every ten minutes, each costs the history a handful of events, and
    the first after the API server answers again lands."""
    fakes = FakeSaga(fail={MIRROR: REFUSED}, fail_when={MIRROR: writes_of(Phase.AWAITING_APPROVAL)})
    saga = await run_saga(fakes, migration_input(approval={"required": True}))
    await saga.wait_for("the status write of the wait to fail", lambda: len(fakes.failed_mirrors) == 1)
    before = await saga.settled_length()

    await time_skipping.sleep(timedelta(days=1))

    tries = len(fakes.failed_mirrors) - 1
    assert 24 * 6 - 6 <= tries <= 24 * 6 + 6
    assert await saga.settled_length() - before <= 8 * tries  # six today: a timer, a workflow task, a marker
    assert all(status.phase is not Phase.AWAITING_APPROVAL for status in fakes.statuses)
    fakes.fail_times[MIRROR] = 0  # the API server answers again
    await time_skipping.sleep(timedelta(minutes=10))
    await saga.wait_for("the wait in the status", lambda: fakes.statuses[-1].phase is Phase.AWAITING_APPROVAL)
    assert PRECHECK in fakes.calls
    assert FREEZE not in fakes.calls
