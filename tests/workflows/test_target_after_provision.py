"""A target database that does not answer at the precheck is checked, all of it, once provision has created the
target, before anything touches it; the run rolls back (the target removed) if it still does not answer.

On a cluster, the target Secret names the Pods of the target StatefulSet, which provision
creates after the precheck: the precheck lets such a target wait (target_deferred), and
the first step that touches it (the freeze; mode Online: replicate) runs the precheck
again first, with nothing let wait.
"""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from ferry.api.errors import DatabaseUnreachable
from ferry.api.migration import Phase, StepName
from tests.workflows.conftest import migration_input, record_history
from tests.workflows.fakes import (
    CHECK_CLUSTER,
    FREEZE,
    PRECHECK,
    PROVISION,
    REPLICATE,
    SAMPLE_RESULTS,
    SNAPSHOT,
    UNDO,
    FakeSaga,
)
from tests.workflows.test_online import fakes as online_fakes
from tests.workflows.test_online import online

Run = Any
pytestmark = pytest.mark.timeout(90)

WAITING = SAMPLE_RESULTS[StepName.PRECHECK].model_copy(update={"target_version": None, "target_deferred": True})
"""The precheck's result when the target database did not answer, and the input let it wait."""


def _prechecks(fakes: FakeSaga) -> list[tuple[bool, bool]]:
    """Each precheck's (targetMayWait, measure), in the order they ran."""
    return [(call["targetMayWait"], call["measure"]) for call in fakes.inputs[PRECHECK]]


async def test_a_target_the_precheck_let_wait_is_checked_again_after_provision_before_the_freeze(
    run_saga: Run,
) -> None:
    saga = await run_saga(FakeSaga(extra_results={PRECHECK: WAITING}))

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    calls = saga.fakes.step_calls
    assert calls[: calls.index(FREEZE) + 1] == [CHECK_CLUSTER, PRECHECK, PROVISION, PRECHECK, FREEZE]
    assert _prechecks(saga.fakes) == [(True, True), (False, False)], "the second lets nothing wait"
    assert saga.final_status.plan is not None
    assert saga.final_status.plan.target_version is None
    await record_history(saga, "target-checked-after-provision")


async def test_a_target_that_still_does_not_answer_after_provision_gets_nothing_and_is_removed(run_saga: Run) -> None:
    unreachable = DatabaseUnreachable("could not connect to database 'orders' on orders-db-16-0.orders-db-16")
    fakes = FakeSaga(extra_results={PRECHECK: WAITING}, fail={PRECHECK: unreachable}, fail_from={PRECHECK: 2})
    saga = await run_saga(fakes)

    with pytest.raises(WorkflowFailureError) as failure:
        await saga.handle.result()

    assert isinstance(failure.value.cause, ApplicationError)
    assert failure.value.cause.type == "MigrationRolledBack"
    assert saga.final_status.phase is Phase.ROLLED_BACK
    assert FREEZE not in saga.fakes.calls, "nothing touched the source or the target"
    assert saga.fakes.undo_calls == [UNDO[FREEZE], UNDO[PROVISION]], "the freeze's attempt began with the check"
    freeze = next(step for step in saga.final_status.steps if step.name == "freeze")
    assert "could not connect to database 'orders'" in (freeze.last_error or "")


async def test_a_precheck_that_checked_the_target_is_not_run_again(run_saga: Run) -> None:
    saga = await run_saga(FakeSaga(), migration_input())

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    assert saga.fakes.step_calls.count(PRECHECK) == 1


async def test_mode_online_checks_a_waiting_target_before_replicate_and_not_again_before_the_freeze(
    run_saga: Run,
) -> None:
    saga = await run_saga(online_fakes(extra_results={PRECHECK: WAITING}), online())

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    calls = saga.fakes.step_calls
    assert calls[: calls.index(REPLICATE) + 1] == [CHECK_CLUSTER, PRECHECK, PROVISION, SNAPSHOT, PRECHECK, REPLICATE]
    assert calls.count(PRECHECK) == 2


async def test_the_check_after_provision_runs_once_and_not_again_before_a_later_attempt_of_the_freeze(
    run_saga: Run,
) -> None:
    """A later attempt would find what an earlier one began (mode Online: replicate's table-sync slots) counted
    against it."""
    fakes = FakeSaga(
        extra_results={PRECHECK: WAITING}, fail={FREEZE: RuntimeError("lock timeout")}, fail_times={FREEZE: 1}
    )
    saga = await run_saga(fakes)

    assert (await saga.handle.result()).phase is Phase.SUCCEEDED
    calls = saga.fakes.step_calls
    assert calls[: calls.index(FREEZE, calls.index(FREEZE) + 1) + 1] == [
        CHECK_CLUSTER, PRECHECK, PROVISION, PRECHECK, FREEZE, FREEZE
    ]  # fmt: skip
