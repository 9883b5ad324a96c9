"""Undoing a Migration whose run succeeded after someone had already asked for its deletion, or whose run's history is
gone (watcher/deletion.py).

The person who deleted a running Migration asked for a rollback; if the run finished
first, the watcher starts this workflow (one per Migration, by ID) before it releases
the finalizer. It runs every step's undo in reverse, without the steps' results: each
undo finds what its step did where the step recorded it, so traffic goes back to the
source, the source is scaled up and unfrozen, and the target is removed. Given the
status of a run that did not get that far, it undoes only the steps that may have run.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from ferry.api.migration import MigrationStatus, StepState, WorkflowRef
    from ferry.api.saga import UNDO_WORKFLOW_NAME, MigrationResult, UndoMigrationInput
    from workflows import plan
    from workflows.controls import Controls
    from workflows.saga import Saga
    from workflows.status import SagaStatus


UNDO_WHAT_MAY_HAVE_RUN = "undo-what-may-have-run"
"""Patch: given the Migration's status, the undo counts as started only the steps it shows past Pending, and the one
after them (it may have begun before the status said so): the undo of a run whose history is gone while it ran
(watcher/deletion.py) need not pass the checks of steps that never ran, such as the one before switch-traffic's undo,
which must reach a target that may never have answered."""


def may_have_run(order: tuple[str, ...], status: MigrationStatus) -> int:
    """How many of the steps in `order` may have run, by `status.steps`: all of them when it shows none."""
    shown = {step.name: step.state for step in status.steps}
    begun = [index for index, name in enumerate(order) if shown.get(name, StepState.PENDING) is not StepState.PENDING]
    return min(len(order), begun[-1] + 2) if begun else len(order)


@workflow.defn(name=UNDO_WORKFLOW_NAME, failure_exception_types=[ValidationError])
class MigrationUndoWorkflow:
    _saga: Saga | None = None

    @property
    def backed_by_migration(self) -> bool:
        """Read by the worker's gate when it stamps each activity's claim (worker/gate.py)."""
        return self._saga is not None and self._saga.backed_by_migration

    @workflow.run
    async def run(self, input: UndoMigrationInput) -> MigrationResult:
        info = workflow.info()
        here = WorkflowRef(namespace=info.namespace, id=info.workflow_id, run_id=info.run_id)
        steps = plan.plan_for(input.spec, restores_while_dumping=workflow.patched(plan.RESTORED_WHILE_DUMPING))
        order = tuple(step.name for step in steps)
        status = (
            SagaStatus.resumed_from(input.status, here, input.generation, order)
            if input.status is not None
            else SagaStatus(workflow=here, generation=input.generation, order=order)
        )
        saga = Saga(input.ref, input.spec, steps, status, Controls(approval_required=False))
        if input.status is not None and input.status.steps and workflow.patched(UNDO_WHAT_MAY_HAVE_RUN):
            saga.start_all(steps[: may_have_run(order, input.status)])
        else:
            saga.start_all(steps)
        self._saga = saga
        return await saga.shielded_roll_back(input.reason)
