"""The plan is the only place that knows the steps: a new step is one entry and its activities."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowFailureError

# The workflow below runs in the worker's sandbox, which re-imports this module: what it
# shares with the worker (the API models, the plan) must be passed through, not copied.
with workflow.unsafe.imports_passed_through():
    from ferry.api.errors import InvalidSpec
    from ferry.api.migration import ApiModel, Phase, StepState
    from ferry.api.saga import MigrationInput, MigrationRef, MigrationResult
    from tests.workflows.fakes import STEP_ACTIVITIES, UNDO, FakeSaga
    from workflows import plan
    from workflows.migration import MigrationWorkflow
    from workflows.steps import ActivityName, Step, Undo

Run = Any
pytestmark = pytest.mark.timeout(90)


class NotifyInput(ApiModel):
    ref: MigrationRef
    channel: str


class NotifyResult(ApiModel):
    message_id: str


NOTIFY = Step(
    "notify",
    ActivityName(name="notify"),
    NotifyResult,
    build=lambda c: NotifyInput(ref=c.ref, channel=f"#{c.ref.namespace}"),
    undo=Undo(ActivityName(name="undo_notify"), lambda c, done: NotifyInput(ref=c.ref, channel="#retracted")),
    timeout=lambda spec: 60,
)
"""A made-up eighth (ninth, with precheck) step: tell a channel that traffic moved, and retract it on undo."""

WITH_NOTIFY = (*plan.PLAN, NOTIFY)


@workflow.defn(name="MigrationWithNotify")
class MigrationWithNotify(MigrationWorkflow):
    steps = WITH_NOTIFY

    @workflow.run
    async def run(self, input: MigrationInput) -> MigrationResult:
        return await super().run(input)


def test_the_plan_lists_every_step_in_the_order_of_the_api() -> None:
    from ferry.api.migration import STEP_ORDER

    assert tuple(step.name for step in plan.PLAN) == STEP_ORDER


def test_a_step_without_an_undo_must_say_why() -> None:
    with pytest.raises(ValueError, match="say why"):
        Step("forgetful", ActivityName(name="forgetful"), NotifyResult, build=lambda c: c.spec, undo=None)


async def test_an_added_step_runs_after_the_others_without_changing_the_loop(run_saga: Run) -> None:
    fakes = FakeSaga(steps=WITH_NOTIFY, extra_results={"notify": NotifyResult(message_id="m-1")})
    saga = await run_saga(fakes, workflow_class=MigrationWithNotify)

    result = await saga.handle.result()

    assert result.phase is Phase.SUCCEEDED
    assert fakes.step_calls[-1] == "notify"
    assert fakes.inputs["notify"][0]["channel"] == "#shop"
    final = saga.final_status
    assert final.steps[-1].name == "notify"
    assert final.steps[-1].state is StepState.SUCCEEDED


async def test_an_added_step_is_undone_first_when_it_fails(run_saga: Run) -> None:
    fakes = FakeSaga(steps=WITH_NOTIFY, fail={"notify": InvalidSpec("no such channel")})
    saga = await run_saga(fakes, workflow_class=MigrationWithNotify)

    with pytest.raises(WorkflowFailureError):
        await saga.handle.result()

    assert fakes.undo_calls == ["undo_notify", *[UNDO[name] for name in reversed(STEP_ACTIVITIES) if name in UNDO]]
    assert fakes.inputs["undo_notify"][0]["channel"] == "#retracted"
