"""The migration workflow: the saga of one Migration, and the controls people give it.

Deterministic workflow code only. The steps are the plan's (workflows/plan.py), run by
the loop in workflows/saga.py. Ways out of the forward path, all of which undo every
started step in reverse:
- a step fails for good under failurePolicy RollBack (or Pause, then `rollback`);
- `rollback`, or an approval deadline whose policy is RollBack;
- cancelling the workflow (`temporal workflow cancel`). Terminating it skips all of
  this: the watcher then records the Migration as Abandoned.

Controls arrive as updates (the watcher sends those: a validator refuses what cannot
apply, with the reason, and the result says what the saga did) or as signals of the
same names (tctl and the temporal CLI send those: what cannot apply is ignored, and
either way an Event says what happened).
"""

from __future__ import annotations

from typing import Any, ClassVar

from temporalio import workflow
from temporalio.exceptions import ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from ferry.api.migration import DriverMode, EventType, MigrationStatus, WorkflowRef
    from ferry.api.saga import (
        PROGRESS_QUERY,
        WORKFLOW_NAME,
        ControlOutcome,
        ControlRequest,
        MigrationInput,
        MigrationResult,
        Signal,
    )
    from workflows import plan
    from workflows.controls import REFUSED_SIGNALS_FORGOTTEN, Controls
    from workflows.saga import FINISHED_IGNORES_CANCEL, RollbackRequested, Saga, StepFailed
    from workflows.status import SagaStatus
    from workflows.steps import Step


CANCEL_IGNORED = (
    "cancel ignored: every step was done and the migration had finished, so nothing was undone; the run completes "
    "Succeeded. Deleting the Migration does not undo a finished migration (only the snapshot's retention cleanup "
    "runs), unless the deletion was asked for before the migration finished: the watcher then undoes it before the "
    "Migration goes (Event UndoingBeforeDeletion). To go back by hand, see the README's Recovery section, "
    '"Going back after a migration succeeded"'
)
"""The Event of a cancel that came once every step was done (FINISHED_IGNORES_CANCEL). Only an activity's input
carries it, which replay does not compare: its words may change."""


# A decoding error of the input fails the run at once (instead of every workflow task, forever):
# the watcher validates specs before starting, so only a run started by hand gets here.
@workflow.defn(name=WORKFLOW_NAME, failure_exception_types=[ValidationError])
class MigrationWorkflow:
    steps: ClassVar[tuple[Step[Any, Any], ...]] = plan.PLAN
    """The plan this workflow runs in mode Snapshot; a subclass may run another (a test adds a step this way)."""
    online_steps: ClassVar[tuple[Step[Any, Any], ...]] = plan.ONLINE_PLAN
    """The plan this workflow runs in mode Online (spec.driver.mode)."""
    sequential_steps: ClassVar[tuple[Step[Any, Any], ...]] = plan.SEQUENTIAL_PLAN
    """The plan of runs in mode Snapshot started before plan.RESTORED_WHILE_DUMPING, replayed as they ran."""

    @workflow.init
    def __init__(self, input: MigrationInput) -> None:
        info = workflow.info()
        self._controls = Controls(approval_required=input.spec.approval.required)
        self._controls.pause_requested = input.spec.paused
        # The input never changes, so the choice is the same at every replay; runs started before the snapshot step
        # restored while dumping replay the plan they started with.
        if input.spec.driver.mode is DriverMode.ONLINE:
            steps = self.online_steps
        elif workflow.patched(plan.RESTORED_WHILE_DUMPING):
            steps = self.steps
        else:
            steps = self.sequential_steps
        status = SagaStatus(
            workflow=WorkflowRef(namespace=info.namespace, id=info.workflow_id, run_id=info.run_id),
            generation=input.generation,
            order=tuple(step.name for step in steps),
        )
        self._saga = Saga(input.ref, input.spec, steps, status, self._controls)

    @property
    def backed_by_migration(self) -> bool:
        """Read by the worker's gate when it stamps each activity's claim (worker/gate.py)."""
        return self._saga.backed_by_migration

    # --- controls as updates (validated) and as signals ---------------------------------------

    @workflow.update(name=Signal.APPROVE.value)
    async def approve_update(self, request: ControlRequest) -> ControlOutcome:
        return self._accept(Signal.APPROVE, request)

    @approve_update.validator
    def _validate_approve(self, request: ControlRequest) -> None:
        self._validate(Signal.APPROVE, request)

    @workflow.update(name=Signal.PAUSE.value)
    async def pause_update(self, request: ControlRequest) -> ControlOutcome:
        return self._accept(Signal.PAUSE, request)

    @pause_update.validator
    def _validate_pause(self, request: ControlRequest) -> None:
        self._validate(Signal.PAUSE, request)

    @workflow.update(name=Signal.RESUME.value)
    async def resume_update(self, request: ControlRequest) -> ControlOutcome:
        return self._accept(Signal.RESUME, request)

    @resume_update.validator
    def _validate_resume(self, request: ControlRequest) -> None:
        self._validate(Signal.RESUME, request)

    @workflow.update(name=Signal.RETRY.value)
    async def retry_update(self, request: ControlRequest) -> ControlOutcome:
        return self._accept(Signal.RETRY, request)

    @retry_update.validator
    def _validate_retry(self, request: ControlRequest) -> None:
        self._validate(Signal.RETRY, request)

    @workflow.update(name=Signal.ROLLBACK.value)
    async def rollback_update(self, request: ControlRequest) -> ControlOutcome:
        return self._accept(Signal.ROLLBACK, request)

    @rollback_update.validator
    def _validate_rollback(self, request: ControlRequest) -> None:
        self._validate(Signal.ROLLBACK, request)

    @workflow.signal(name=Signal.APPROVE.value)
    async def approve(self, request: ControlRequest | None = None) -> None:
        await self._signalled(Signal.APPROVE, request)

    @workflow.signal(name=Signal.PAUSE.value)
    async def pause(self, request: ControlRequest | None = None) -> None:
        await self._signalled(Signal.PAUSE, request)

    @workflow.signal(name=Signal.RESUME.value)
    async def resume(self, request: ControlRequest | None = None) -> None:
        await self._signalled(Signal.RESUME, request)

    @workflow.signal(name=Signal.RETRY.value)
    async def retry(self, request: ControlRequest | None = None) -> None:
        await self._signalled(Signal.RETRY, request)

    @workflow.signal(name=Signal.ROLLBACK.value)
    async def rollback(self, request: ControlRequest | None = None) -> None:
        await self._signalled(Signal.ROLLBACK, request)

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> MigrationStatus:
        return self._saga.status.to_model()

    def _validate(self, control: Signal, request: ControlRequest) -> None:
        if request.request_id and request.request_id in self._controls.seen:
            return  # a repeat: accepted again, and acted on once
        refusal = self._update_refusal(control)
        if refusal is not None and not request.of_spec:
            raise ApplicationError(refusal, type="ControlRefused", non_retryable=True)

    def _update_refusal(self, control: Signal) -> str | None:
        """Why an update cannot apply now: the rules of `Controls.refusal`, and one more. Accepted once a rollback was
        asked for, a control would be answered as if the saga went on, while it stops its step to roll back. (Here,
        not in `refusal`: the signal handlers, which replay, keep the rules their histories were recorded with; the
        update handlers apply this only to spec.paused, whose updates came with it.)"""
        refusal = self._controls.refusal(control)
        if refusal is None and control is not Signal.ROLLBACK and self._controls.rollback is not None:
            refusal = (
                f"{control} refused: a rollback was asked for; the running step is stopped and the started steps undone"
            )
        return refusal

    def _accept(self, control: Signal, request: ControlRequest) -> ControlOutcome:
        if self._controls.is_repeat(request):
            return ControlOutcome(control=control.value, message=f"{control} was already acted on")
        self._observe(request)
        refusal = self._update_refusal(control) if request.of_spec else None
        if refusal is not None:
            # The spec's state, taken in although it cannot apply: the generation is seen, nothing else changes.
            return ControlOutcome(control=control.value, message=f"{refusal}; nothing to do for this spec")
        return ControlOutcome(control=control.value, message=self._controls.apply(control, request))

    async def _signalled(self, control: Signal, request: ControlRequest | None) -> None:
        """A control sent as a signal: act on it if it applies, and leave an Event saying what happened."""
        request = request or ControlRequest()
        if self._controls.was_seen(request):
            return
        # A signal's generation is not taken in: the watcher sends this saga updates, and a generation sent by hand
        # (tctl, temporal CLI) above the Migration's would make the watcher ignore every later spec.paused.
        refusal = self._controls.refusal(control)
        sender = f"{control} (signal{f' from {request.by}' if request.by else ''})"
        if refusal is not None:
            if not workflow.patched(REFUSED_SIGNALS_FORGOTTEN):
                self._controls.remember(request)
            workflow.logger.info("ignored %s for %s: %s", sender, self._saga.ref, refusal)
            await self._saga.record(f"{sender} ignored: {refusal}", "ControlIgnored", EventType.WARNING)
            return
        self._controls.remember(request)
        done = self._controls.apply(control, request)
        await self._saga.record(f"{sender}: {done}", "ControlReceived")

    def _observe(self, request: ControlRequest) -> None:
        if request.generation is not None:
            status = self._saga.status
            status.generation = max(status.generation, request.generation)

    # --- the run ------------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: MigrationInput) -> MigrationResult:
        saga = self._saga
        try:
            finished = await saga.forward()
            if finished and workflow.patched(FINISHED_IGNORES_CANCEL):
                return await self._finish()
            result = await saga.succeed() if finished else await saga.planned()
        except RollbackRequested as requested:
            result = await saga.shielded_roll_back(str(requested))
        except StepFailed as failed:
            rolled_back = await saga.shielded_roll_back(str(failed))
            await workflow.wait_condition(workflow.all_handlers_finished)
            await saga.mirrored()
            raise ApplicationError(
                f"{failed}; {rolled_back.message}", type="MigrationRolledBack", non_retryable=True
            ) from failed
        except BaseException as error:
            if not is_cancelled_exception(error):
                raise
            await saga.shielded_roll_back("the workflow was cancelled")
            raise
        await workflow.wait_condition(workflow.all_handlers_finished)
        await saga.mirrored()  # what the handlers recorded
        return result

    async def _finish(self) -> MigrationResult:
        """Ends a run whose every step is done: Succeeded, whatever comes meanwhile.

        A cancellation of the workflow now finds nothing to stop: the migration is done and
        serving, and its status may already say so. So it is not taken as a rollback; the
        run completes Succeeded, and an Event says the cancel came too late.
        """
        saga = self._saga
        if saga.succeeds_at_once():
            # Queued before anything else runs, so that it shares the last step's status write, as in `succeed`.
            saga.mark_succeeded()
            work = self._closed(saga.succeeded())
        else:
            work = self._succeed()
        result, cancelled = await saga.shielded(work, "end of a finished run")
        if cancelled:
            await self._saga.shielded(self._recorded(CANCEL_IGNORED), "end of a finished run")
        return result

    async def _succeed(self) -> MigrationResult:
        return await self._closed(await self._saga.succeed())

    async def _closed(self, result: MigrationResult) -> MigrationResult:
        await self._saga.mirrored()
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._saga.mirrored()  # what the handlers recorded
        return result

    async def _recorded(self, message: str) -> None:
        await self._saga.record(message, "CancelIgnored", EventType.WARNING)
        await self._saga.mirrored()
