"""Deleting a Migration: ferry holds its finalizer until the undo or the retention cleanup is done.

Every decision comes from durable facts — the Migration's deletionTimestamp and
managedFields, and the state and close time of its run in Temporal — so whichever watcher
leads, before or after a crash, decides the same:
- Run still going: cancel it (which rolls back), and release the finalizer when the
  rollback has finished. Unless its status already says Succeeded, or shows every step
  Succeeded: the saga has done every step, ignores a cancel from then on and undoes
  nothing, and only its retention cleanup (afterSuccess: Delete), the write saying
  Succeeded and its last workflow task are left (seconds, longer if its worker died
  then). It is left to close, and counts as finished when its last step did (below);
  if the status showing that success was written before the deletion, status.deletion
  records so (SUCCESS_SHOWN_FIRST), as the run's last writes will hide it.
- Run finished *after* the deletion was asked for, and Succeeded (the watcher that
  should have cancelled it died first). The person asked for a rollback, so the
  Migration is undone by the undo workflow (traffic back, source scaled up and
  unfrozen, target removed), and only then released, with the reason in status and an
  Event. Which came first is `Migration.success_timing`, the rule `may_still_undo`
  follows too. First a fact no other machine's clock enters: the status shows the
  success, and the saga's entry in managedFields (the API server's clock, as is
  deletionTimestamp) was last changed no later than the deletion, the same second
  included: the success came first, whatever Temporal's clock says. Otherwise the
  success is dated by the saga's clock (Temporal's): when its last step finished
  (status.steps, when it decided that nothing would be undone), else by the Succeeded
  status's time, or the run's close time if earlier, and it counts as after only when
  more than CLOCK_SKEW_ALLOWANCE (2 minutes) after deletionTimestamp, by the API server's
  clock. The two clocks are of different machines: not undoing a success is always safe,
  undoing one that came first destroys the migrated database. A success kept only by
  that allowance gets a Warning Event (SuccessKept) saying how to go back by hand.
- Run finished before the deletion: run the retention cleanup its snapshot asks for (a
  workflow of its own), then release.
- No run ever started (the object names none): release at once.
- A run the object names, of which Temporal has no record (its history was deleted or
  expired): the status says what is left. RolledBack or Planned: release; Succeeded (or
  every step Succeeded): the retention cleanup, then release; Failed or Abandoned: a
  Warning, then release, as with the history there; otherwise the undo workflow takes back
  what the records say was done, then release. Releasing at once, as for no run, left a
  source frozen and the clients on the target with nothing said. A Migration the resync
  marked Abandoned because its unfinished run went from Temporal (conditions' reason
  HistoryGone, watcher/abandoned.py) is undone so too, as its message says; a step that
  mark shows Interrupted goes to the undo as the Running step it was (`as_the_run_left_it`).
The wait is bounded by --deletion-timeout; the deadline and the reason for waiting are
in status.deletion, so the bound survives a restart of the watcher. Past the deadline
the finalizer is released anyway, with a Warning Event saying what may be left; never
before a running run was asked to roll back (the cancel goes first). The deadline is by
the clock of the replica that wrote it: another replica (a failover, a restart) gives it
CLOCK_SKEW_ALLOWANCE more, counted on its own monotonic clock (`_past_deadline`).

A deleted Migration without ferry's finalizer that another finalizer keeps, unfinished,
may have a run going on: its deletion landed between the workflow's start and the write
that adds the finalizer (watcher/handling.py). Its run is cancelled, and rolls back;
nothing waits for that, as nothing holds the object for ferry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.events import Recorded
from ferry.api.migration import (
    CLOCK_SKEW_ALLOWANCE,
    FINALIZER,
    SUCCESS_SHOWN_FIRST,
    DeletionStatus,
    EventType,
    Migration,
    MigrationStatus,
    Phase,
    StepState,
    SuccessTiming,
    secret_finalizer,
)
from ferry.api.saga import (
    CLEANUP_WORKFLOW_NAME,
    UNDO_WORKFLOW_NAME,
    DeleteSnapshotInput,
    MigrationRef,
    MigrationResult,
    SnapshotResult,
    UndoMigrationInput,
    cleanup_workflow_id,
    snapshot_key,
    undo_workflow_id,
    workflow_id,
)
from watcher.abandoned import no_such_run
from watcher.decisions import deleting_it_has_work, every_step_succeeded, ref_of, started
from watcher.patching import MigrationWriter
from watcher.settings import WatcherSettings

log = logging.getLogger("ferry.watcher.deletion")

_ENDED_WELL = (
    WorkflowExecutionStatus.COMPLETED,
    WorkflowExecutionStatus.CANCELED,
    WorkflowExecutionStatus.CONTINUED_AS_NEW,
)
"""How a run ends when it went as asked: done, or cancelled (which rolls back). A run that rolls back completely after
a step failed (its precheck's included) ends FAILED all the same (MigrationRolledBack): its status says RolledBack."""

_ALL_UNDONE = frozenset({Phase.ROLLED_BACK, Phase.PLANNED})
"""Phases the saga writes only when nothing it did is left: RolledBack once every undo has succeeded
(workflows/saga.py, `_roll_back`; a rollback that stopped or left something writes Failed, RollbackIncomplete), and
Planned, the end of a dry run, which changes nothing."""

Resubmit = Callable[[MigrationRef], None]


class DeletionHandler:
    def __init__(self, client: Client, writer: MigrationWriter, settings: WatcherSettings, resubmit: Resubmit) -> None:
        self._client = client
        self._writer = writer
        self._settings = settings
        self._resubmit = resubmit
        self._waiting: dict[str, asyncio.Task[None]] = {}
        self._gives_up_at: dict[str, float] = {}
        """Per Migration (uid), when this replica stops waiting, on its monotonic clock (`_past_deadline`)."""

    async def handle(self, migration: Migration) -> None:
        """One pass over a Migration whose deletion was asked for and that still holds ferry's finalizer."""
        requested = migration.metadata.deletion_timestamp
        if requested is None or FINALIZER not in migration.metadata.finalizers:
            return
        ref = ref_of(migration)
        waiting = migration.status.deletion
        deadline = (
            waiting.deadline if waiting else datetime.now(UTC) + timedelta(seconds=self._settings.deletion_timeout)
        )
        handle = self._client.get_workflow_handle(workflow_id(ref), result_type=MigrationResult)
        described = await _describe(handle)
        if described is None and not started(migration):
            await self._release(migration, "no workflow ever ran for it")
            return
        running = described is not None and described.status is WorkflowExecutionStatus.RUNNING
        rolling_back = running and not closing_after_success(migration)
        cancelled = "rolling back before deletion: the workflow was cancelled"
        if rolling_back and not _recorded(migration, cancelled):  # recorded only after the cancel was sent
            # Before the deadline is looked at: a run is never let go of without having been asked to roll back.
            await handle.cancel()
        if self._past_deadline(migration, deadline):
            message = (
                f"gave up waiting at the deadline ({deadline:%Y-%m-%dT%H:%M:%SZ}); workflow {handle.id} is "
                f"{_state(described)}: check the source, the target and the snapshot by hand"
            )
            await self._writer.event(ref, EventType.WARNING, "FinalizerReleased", message, "give-up")
            await self._release(migration, message)
            return
        if described is None:
            await self._history_gone(migration, handle.id, deadline)
            return
        if rolling_back:
            await self._wait_for(migration, handle, deadline, cancelled)
            return
        if running:  # closing after its success
            why = "its run has succeeded and is closing"
            if migration.success_timing() is SuccessTiming.SHOWN_FIRST:
                why = f"{why}, and {SUCCESS_SHOWN_FIRST}"  # its later writes will hide that: recorded for its close
            await self._wait_for(migration, handle, deadline, why)
            return
        timing = await _success_timing(handle, described, migration)
        succeeded = migration.success_time(described.close_time)
        if timing is SuccessTiming.AFTER:
            assert succeeded is not None
            why = (
                f"its run succeeded at {succeeded:%H:%M:%SZ} (Temporal's clock), more than "
                f"{_minutes(CLOCK_SKEW_ALLOWANCE)} after the deletion was asked for at {requested:%H:%M:%SZ} (the API "
                "server's), which means: roll back; undoing the migration before it goes"
            )
            done = (
                f"undone before deletion: its run succeeded at {succeeded:%H:%M:%SZ}, after the deletion was asked for"
            )
            await self._undo(migration, why, done, deadline)
            return
        if timing is SuccessTiming.WITHIN_ALLOWANCE:
            assert succeeded is not None
            await self._kept_within_allowance(migration, succeeded, requested)
        if await self._cleaned_up(migration, deadline):
            return
        if described.status not in _ENDED_WELL and migration.status.phase not in _ALL_UNDONE:
            await self._undo_incomplete(migration, f"its workflow {handle.id} ended {_state(described)}")
        await self._release(migration, f"its workflow has finished ({_state(described)})")

    async def cancel_unheld(self, migration: Migration) -> None:
        """Cancels the run of a deleted Migration that ferry's finalizer does not hold, if one runs.

        Asked again at each pass until the status is finished: Temporal takes a second cancel of a run as the first,
        and answers NOT_FOUND for a run that has closed or never was, which leaves nothing to do.
        """
        ref = ref_of(migration)
        try:
            await self._client.get_workflow_handle(workflow_id(ref)).cancel()
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
            return
        log.info("Migration %s is being deleted without ferry's finalizer: its run is cancelled (it rolls back)", ref)

    async def _cleaned_up(self, migration: Migration, deadline: datetime) -> bool:
        """Runs the retention cleanup a finished Migration's snapshot asks for, if any: True while it waits for it,
        False once there is nothing (more) to wait for (a cleanup that failed leaves a Warning Event)."""
        cleanup = _retention_cleanup(migration)
        if cleanup is None or await self._namespace_going(migration, cleanup):
            return False
        cleanup_handle = await self._start_cleanup(cleanup)
        if cleanup_handle is not None:
            why = "deleting the snapshot (retention) before deletion"
            await self._wait_for(migration, cleanup_handle, deadline, why)
            return True
        await self._check_cleanup(migration, cleanup)
        return False

    async def _history_gone(self, migration: Migration, saga: str, deadline: datetime) -> None:
        """The Migration's run is known to have started, and Temporal has no record of it: its history went (the
        namespace's retention, `temporal workflow delete`, a Temporal rebuilt empty). What is left is read from the
        status. Finished and nothing left, it goes; Succeeded, after its retention cleanup; Failed or Abandoned, with
        a Warning that what it did may not all be undone, as when its history is there (nothing is undone: a later
        Migration may build on what it left); otherwise (the run went while it ran) the undo workflow takes back what
        the records say it did, as for a run that succeeded after its deletion was asked for: each undo finds its
        step's work where the step recorded it. Abandoned because of just that (HISTORY_GONE: the watcher's resync
        noticed the run gone before the deletion, watcher/abandoned.py) counts as the run going while it ran, as its
        message says: the mark changes nothing of what deleting it does."""
        phase = migration.status.phase
        if migration.status.history_gone:
            phase = None  # unfinished when its run went; precheck's refusals count it as such too (may_still_undo)
        if phase is not Phase.SUCCEEDED and every_step_succeeded(migration):
            phase = Phase.SUCCEEDED  # its last status write, the one that says so, did not land
        undoing = await _describe(self._client.get_workflow_handle(undo_workflow_id(ref_of(migration)))) is not None
        if migration.spec is not None and migration.spec.dry_run and not undoing:
            await self._release(migration, f"its workflow {saga} is gone from Temporal; a dry run changes nothing")
            return
        if phase in _ALL_UNDONE and not undoing:
            await self._release(migration, f"its workflow {saga} is gone from Temporal, and its status says {phase}")
            return
        if phase is Phase.SUCCEEDED and not undoing:
            shown = migration.status.model_copy(update={"phase": phase})
            if not await self._cleaned_up(migration.model_copy(update={"status": shown}), deadline):
                await self._release(migration, f"its workflow {saga} is gone from Temporal, after it succeeded")
            return
        if phase is not None and phase.finished and not undoing:
            # Failed (a rollback that stopped, or left something) or Abandoned (terminated): as with its history there.
            # What it left may be what a later Migration now builds on (its target another's source).
            gone = f"its workflow {saga} is gone from Temporal, and its status says {phase}"
            await self._undo_incomplete(migration, gone)
            await self._release(migration, gone)
            return
        why = (
            f"Temporal has no record of its workflow {saga} (its history was deleted or expired), and its status does "
            "not say all was undone: undoing what the run may have done, from what each step recorded, before it goes"
        )
        done = f"undone before deletion: Temporal had no record of its workflow {saga}"
        await self._undo(migration, why, done, deadline)

    async def _undo(self, migration: Migration, why: str, done: str, deadline: datetime) -> None:
        """Undoes, with the undo workflow, what the Migration's run did, for `why`; releases the Migration once that
        is done, saying `done`."""
        ref = ref_of(migration)
        handle = self._client.get_workflow_handle(undo_workflow_id(ref), result_type=MigrationResult)
        undone = await _describe(handle)
        if undone is None and migration.spec is not None:
            input = UndoMigrationInput(
                ref=ref, generation=migration.metadata.generation, spec=migration.spec, reason=why,
                status=as_the_run_left_it(migration.status),
            )  # fmt: skip
            try:
                handle = await self._client.start_workflow(
                    UNDO_WORKFLOW_NAME,
                    input,
                    id=undo_workflow_id(ref),
                    task_queue=self._settings.task_queue,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                    result_type=MigrationResult,
                    static_summary=f"Undo of Migration {ref}, deleted while it ran",
                )
            except WorkflowAlreadyStartedError:
                undone = await _describe(handle)
            else:
                await self._writer.event(ref, EventType.WARNING, "UndoingBeforeDeletion", why, "undo")
                await self._wait_for(migration, handle, deadline, why)
                return
        if undone is not None and undone.status is WorkflowExecutionStatus.RUNNING:
            await self._wait_for(migration, handle, deadline, why)
            return
        if undone is not None and undone.status is WorkflowExecutionStatus.COMPLETED:
            await self._writer.event(ref, EventType.NORMAL, "UndoneBeforeDeletion", done, "undone")
            await self._release(migration, done)
            return
        message = (
            f"the undo before deletion ({why.split(':')[0]}) ended {_state(undone)}: check the source, the target and "
            f"the Service by hand (workflow {handle.id} says what was undone)"
        )
        await self._writer.event(ref, EventType.WARNING, "UndoIncomplete", message, "UndoIncomplete")
        await self._release(migration, message)

    async def _wait_for(
        self, migration: Migration, handle: WorkflowHandle[Any, Any], deadline: datetime, why: str
    ) -> None:
        """Records why the Migration waits (once, and keeping what was shown: `keeping_what_was_shown`), then looks at
        it again when `handle` finishes or at the deadline."""
        ref = ref_of(migration)
        why = keeping_what_was_shown(migration, why)
        waiting = migration.status.deletion
        if not _recorded(migration, why):
            deletion = DeletionStatus(
                message=_message(why, deadline),
                waiting_since=waiting.waiting_since if waiting else datetime.now(UTC),
                deadline=deadline,
            )
            await self._writer.waiting_for_deletion(ref, deletion)
            await self._writer.event(ref, EventType.NORMAL, "WaitingBeforeDeletion", deletion.message, why)
        key = f"{ref.uid}/{handle.id}"
        if key in self._waiting and not self._waiting[key].done():
            return
        gives_up_at = self._gives_up_at.get(ref.uid, time.monotonic())
        self._waiting[key] = asyncio.create_task(self._look_again_after(ref, handle, gives_up_at))

    async def _look_again_after(self, ref: MigrationRef, handle: WorkflowHandle[Any, Any], gives_up_at: float) -> None:
        remaining = max(0.0, gives_up_at - time.monotonic()) + 1
        try:
            await asyncio.wait_for(handle.result(), timeout=remaining)
        except TimeoutError:
            log.warning("Migration %s: %s still running at the deletion deadline", ref, handle.id)
        except Exception as error:  # noqa: BLE001 - a failed or cancelled run has finished too
            log.info("Migration %s: %s ended: %s", ref, handle.id, error)
        self._resubmit(ref)

    def _past_deadline(self, migration: Migration, deadline: datetime) -> bool:
        """Whether this replica stops waiting for the Migration: at `deadline`, counted on its monotonic clock from the
        pass that first saw it (a step of the wall clock changes nothing after that).

        The deadline is a moment by the clock of the replica that wrote it into status.deletion, maybe another one
        (a failover), whose clock may run ahead of or behind this one's. One that runs behind would make this replica
        let go early, with a rollback unfinished: a deadline this replica did not compute in this pass gets
        CLOCK_SKEW_ALLOWANCE more. Erring the other way costs a wait of at most that much."""
        uid = migration.metadata.uid
        now = time.monotonic()
        if uid not in self._gives_up_at:
            left = (deadline - datetime.now(UTC)).total_seconds()
            if migration.status.deletion is not None:  # written by an earlier pass: maybe by another clock
                left += CLOCK_SKEW_ALLOWANCE.total_seconds()
            self._gives_up_at[uid] = now + max(0.0, left)
        return now >= self._gives_up_at[uid]

    async def _kept_within_allowance(self, migration: Migration, succeeded: datetime, requested: datetime) -> None:
        """Says (once) why a run that succeeded after the deletion was asked for, by the two clocks, is not undone."""
        after = (succeeded - requested).total_seconds()
        message = (
            f"its run succeeded at {succeeded:%H:%M:%SZ} by Temporal's clock, {after:.0f}s after the deletion was "
            f"asked for at {requested:%H:%M:%SZ} by the API server's: within {_minutes(CLOCK_SKEW_ALLOWANCE)}, which "
            "two clocks may disagree by, ferry counts a success as before the deletion, and never undoes one that may "
            'have come first. The migration is kept (nothing undone). To go back, undo it by hand: README, "Going '
            'back after a migration succeeded"'
        )
        await self._writer.event(ref_of(migration), EventType.WARNING, "SuccessKept", message, "success-kept")
        log.warning("Migration %s: %s", ref_of(migration), message)

    async def _undo_incomplete(self, migration: Migration, ended: str) -> None:
        """The Warning Event of a Migration that goes with its run ended otherwise than with everything undone."""
        message = (
            f"{ended}, so what it did may not all be undone: {migration.status.message or 'its status says no more'}. "
            "Check the source, the target and the Service by hand"
        )
        await self._writer.event(ref_of(migration), EventType.WARNING, "UndoIncomplete", message, "UndoIncomplete")

    async def _namespace_going(self, migration: Migration, cleanup: DeleteSnapshotInput) -> bool:
        """Whether the retention cleanup, not started yet, is to be left out because the Migration's namespace is
        being deleted: that takes the target's claims and the source's with it, and the snapshot may be the last copy
        of the database (a namespace deleted by mistake, the wrong kube context). The Event that says the cleanup
        starts is what finds out: the API server refuses new objects in such a namespace, and the watcher needs no
        access to namespaces."""
        ref = ref_of(migration)
        if await _describe(self._client.get_workflow_handle(cleanup_workflow_id(ref))) is not None:
            return False  # started before the namespace went: it finishes
        location = cleanup.artifact.location
        message = f"deleting the snapshot {location} before the Migration goes (afterSuccess: DeleteWithMigration)"
        recorded = await self._writer.event(ref, EventType.NORMAL, "RetentionCleanup", message, "retention-cleanup")
        if recorded is not Recorded.NAMESPACE_GOING:
            return False
        log.warning(
            "Migration %s goes with its namespace, which is being deleted, and with it the target's and the source's "
            "volumes: its snapshot %s is kept, though its retention (afterSuccess: DeleteWithMigration) deletes it "
            "with the Migration, as it may be the last copy of the database. Delete it by hand once not needed.",
            ref,
            location,
        )
        return True

    async def _start_cleanup(self, cleanup: DeleteSnapshotInput) -> WorkflowHandle[Any, Any] | None:
        """Starts (once) the retention cleanup; None when it has run already."""
        try:
            return await self._client.start_workflow(
                CLEANUP_WORKFLOW_NAME,
                cleanup,
                id=cleanup_workflow_id(cleanup.ref),
                task_queue=self._settings.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                static_summary=f"Retention cleanup of Migration {cleanup.ref}: delete {cleanup.artifact.location}",
            )
        except WorkflowAlreadyStartedError:
            return None

    async def _check_cleanup(self, migration: Migration, cleanup: DeleteSnapshotInput) -> None:
        """Records a Warning Event when the retention cleanup (which has closed) did not delete the snapshot."""
        ref = ref_of(migration)
        handle = self._client.get_workflow_handle(cleanup_workflow_id(ref))
        ran = await _describe(handle)
        if ran is not None and ran.status is WorkflowExecutionStatus.COMPLETED:
            return
        message = (
            f"the retention cleanup (workflow {handle.id}) ended {_state(ran)}: the snapshot "
            f"{cleanup.artifact.location} and the objects beside it (.tables-N.dump) are left in S3. Delete them by "
            "hand (the workflow's history says why it failed)"
        )
        await self._writer.event(ref, EventType.WARNING, "RetentionCleanupFailed", message, "cleanup-failed")
        log.warning("Migration %s: %s", ref, message)

    async def close(self) -> None:
        """Stops waiting for runs (the next leader looks at these Migrations again)."""
        for task in self._waiting.values():
            task.cancel()
        for task in self._waiting.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _release(self, migration: Migration, why: str) -> None:
        """Lets the Secrets the Migration names go, then the Migration: in this order, so that a watcher that stops
        in between finds the Migration still held and does it all again (each removal is idempotent)."""
        await self.release_secrets(migration)
        await self._writer.remove_finalizer(migration)
        log.info("Migration %s released for deletion: %s", ref_of(migration), why)

    async def release_secrets(self, migration: Migration) -> None:
        """Takes the Migration's finalizer (secret_finalizer) off the Secrets its spec names, where the precheck put
        it; another Migration's stays. A Secret being deleted goes once no finalizer is left.

        Called by `_release`, and again by the pass the Migration's DELETED event brings (watcher/decisions.py), for
        a Migration that went without `_release`: its finalizer removed by hand, a deletion ferry's finalizer never
        held (`cancel_unheld`), a precheck attempt that marked the Secrets after the release. Needs nothing but the
        object's last state."""
        self._gives_up_at.pop(migration.metadata.uid, None)
        if migration.spec is None:
            return  # a spec that does not parse never ran, so never had its Secrets marked
        ref = ref_of(migration)
        finalizer = secret_finalizer(ref.uid)
        refused: list[str] = []
        for name in migration.spec.secrets():
            try:
                await self._writer.remove_secret_finalizer(ref.namespace, name, finalizer)
            except ApiException as error:
                if error.status != 403:
                    raise
                refused.append(name)
        if refused:
            message = (
                f"ferry's watcher may not patch Secrets {', '.join(refused)} (`ferry rbac` or the chart grants it), "
                f"which keep the finalizer {finalizer}: remove it by hand, e.g. kubectl patch secret {refused[0]} -n "
                f'{ref.namespace} -p \'{{"metadata":{{"$deleteFromPrimitiveList/finalizers":["{finalizer}"]}}}}\''
            )
            await self._writer.event(ref, EventType.WARNING, "SecretsNotReleased", message, "secrets-not-released")
            log.warning("Migration %s: %s", ref, message)


def as_the_run_left_it(status: MigrationStatus) -> MigrationStatus:
    """The status the undo workflow is given: each step the watcher marked Interrupted shown Running, under way as the
    run left it (doing it, or undoing it). The undo treats both alike (every state but Pending counts as begun,
    `may_have_run` in workflows/undo.py: the step may have had effects), and a worker older than the state would not
    read the input at all, and fail the undo at once (its input does not validate), so the Migration would go
    undone."""
    if not any(step.state is StepState.INTERRUPTED for step in status.steps):
        return status
    steps = [
        step.model_copy(update={"state": StepState.RUNNING}) if step.state is StepState.INTERRUPTED else step
        for step in status.steps
    ]
    return status.model_copy(update={"steps": steps})


def keeping_what_was_shown(migration: Migration, why: str) -> str:
    """`why`, the reason the deletion waits now, with the record that the success was shown before the deletion
    (SUCCESS_SHOWN_FIRST) when status.deletion holds it. Once the run's last writes land it is the only fact left of
    that, and a reason written without it (the retention cleanup's wait, which comes next) would let the pass after
    the cleanup date the success by the clocks alone, and undo it."""
    waiting = migration.status.deletion
    if waiting is not None and waiting.success_shown_first and SUCCESS_SHOWN_FIRST not in why:
        return f"{why}, and {SUCCESS_SHOWN_FIRST}"
    return why


def _message(why: str, deadline: datetime) -> str:
    return f"{why}; the finalizer {FINALIZER} is released when it finishes, or at {deadline:%H:%M:%SZ}"


def _recorded(migration: Migration, why: str) -> bool:
    """Whether status.deletion already says the Migration waits for this reason (with its deadline)."""
    waiting = migration.status.deletion
    return waiting is not None and waiting.message == _message(why, waiting.deadline)


async def _describe(handle: WorkflowHandle[Any, Any]) -> WorkflowExecutionDescription | None:
    """The run under this workflow ID; None when Temporal has none (an unknown namespace raises: it is no answer)."""
    try:
        return await handle.describe()
    except RPCError as error:
        if not no_such_run(error):
            raise
        return None


def _state(described: WorkflowExecutionDescription | None) -> str:
    return described.status.name if described is not None and described.status else "unknown"


async def _success_timing(
    handle: WorkflowHandle[Any, MigrationResult], run: WorkflowExecutionDescription, migration: Migration
) -> SuccessTiming:
    """Where the closed run's success stands to the deletion (`Migration.success_timing`, with the run's close time
    for a status that does not show it); UNKNOWN for a run that did not succeed. Its result is asked for only when
    that decides (it costs a request): when the deletion would undo it, or say why it does not."""
    if run.status is not WorkflowExecutionStatus.COMPLETED or run.close_time is None:
        return SuccessTiming.UNKNOWN
    timing = migration.success_timing(closed=run.close_time)
    if timing in (SuccessTiming.SHOWN_FIRST, SuccessTiming.BEFORE, SuccessTiming.UNKNOWN):
        return timing
    result = await handle.result()
    return timing if result.phase is Phase.SUCCEEDED else SuccessTiming.UNKNOWN


def closing_after_success(migration: Migration) -> bool:
    """Whether the run of a Migration being deleted, still running, is only finishing a success: its status says
    Succeeded (the run's last workflow task is left), or shows every step Succeeded (its retention cleanup and the
    write saying Succeeded are left). The saga undoes nothing from then on, and ignores a cancel: the deletion waits
    for it to close, and then goes as after a success (`Migration.success_timing` says whether that was before the
    deletion)."""
    return migration.status.shows_success


def _minutes(allowance: timedelta) -> str:
    return f"{allowance.total_seconds() / 60:g} minutes"


def _retention_cleanup(migration: Migration) -> DeleteSnapshotInput | None:
    """The cleanup a finished Migration's retention asks for on deletion, if any."""
    status, spec = migration.status, migration.spec
    snapshot = status.snapshot
    if not deleting_it_has_work(migration) or snapshot is None or spec is None:
        return None
    ref = ref_of(migration)
    # Where the object is comes from the spec, never from the status: anyone who may write the status could name
    # another object (the activity refuses one that is not this Migration's, too).
    artifact = SnapshotResult(
        bucket=spec.snapshot.bucket,
        key=snapshot_key(ref, spec.snapshot),
        sha256=snapshot.sha256,
        size_bytes=snapshot.size_bytes,
    )
    return DeleteSnapshotInput(ref=ref, snapshot=spec.snapshot, artifact=artifact)
