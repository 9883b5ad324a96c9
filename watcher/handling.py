"""What the watcher does with the latest state of one Migration. Level-triggered and idempotent.

watcher/decisions.py decides, from the object alone, what a pass does; this module does
it: the deletion handler for a deleted Migration (or, when it lacks ferry's finalizer,
the cancel of its run); for a live one, the Failed status of an invalid spec, the
workflow's start and then, in one write, the finalizer and the annotation that records
the start, kubectl controls as updates, and the Abandoned phase of a run ended from
outside or gone from Temporal (watcher/abandoned.py). Nothing is remembered between
passes: everything needed is in the object, its status, and Temporal.

A Migration that holds ferry's finalizer from its creation (deploy/admission/finalizer has
the API server set it) costs no write at all when its workflow starts: the saga's first
status names the run. If none does within --record-start-after seconds (no worker polls,
say), the Migration is looked at again (watcher/runner.py reads it only if the watch has
brought no status of it); that pass's start is refused, as the run exists, and then the
annotation records it, so no later pass or restarted watcher asks Temporal again.
A timer lost with a restart costs the same: one refused start, then the annotation.

Why the start comes first: the finalizer's write would otherwise be a write of its own,
and the API server's writes are what a burst of creates waits on. A Migration deleted
between the start and that write cannot take the finalizer any more, and its run stops
all the same. Gone, it leaves a run that acts on nothing: the worker's gate refuses every
activity of a run whose Migration does not exist (worker/gate.py), and a status write
that passed the gate before finds it gone and rolls the run back before its first step
(workflows/saga.py, `_orphaned`). Held by another finalizer, it lingers, and the state
its deletion brings has no finalizer of ferry's: that pass cancels the run.

Whichever way a Migration went, the pass its DELETED event brings takes its finalizer off
the Secrets it names (watcher/deletion.py, `release_secrets`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from opentelemetry import trace
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from ferry.api.migration import EventType, Migration
from ferry.api.saga import ControlOutcome, MigrationRef, workflow_id
from ferry.observability.logs import migration_context
from watcher import controls
from watcher.abandoned import why_abandoned
from watcher.decisions import Action, decide, ref_of
from watcher.deletion import DeletionHandler, Resubmit
from watcher.metrics import WatcherMetrics
from watcher.patching import MigrationWriter
from watcher.settings import WatcherSettings
from watcher.starting import ensure_started

log = logging.getLogger("ferry.watcher.handling")
_tracer = trace.get_tracer("ferry.watcher")

CONTROL_TIMEOUT = 30.0
"""Seconds a control waits for the saga to take it; past that it stays unacknowledged and is sent again later
(with the same update id, so the saga acts on it once)."""


class MigrationHandler:
    def __init__(
        self,
        client: Client,
        writer: MigrationWriter,
        settings: WatcherSettings,
        deletion: DeletionHandler,
        metrics: WatcherMetrics,
        resubmit: Resubmit,
    ) -> None:
        self._client = client
        self._writer = writer
        self._settings = settings
        self._deletion = deletion
        self._metrics = metrics
        self._resubmit = resubmit
        self._look_again: dict[str, asyncio.TimerHandle] = {}
        """Per Migration (uid), the timer of the pass that records a start no status names yet."""

    def close(self) -> None:
        """Drops the timers of passes still to come (a watcher that leads next lists every Migration anew)."""
        for timer in self._look_again.values():
            timer.cancel()
        self._look_again.clear()

    async def handle(self, migration: Migration, *, gone: bool, run_closed: bool, received: float) -> list[str]:
        """One pass; returns the resourceVersions its own writes produced, in order.

        `received` is when the watcher first got this pending state (for the start latency).
        """
        action = decide(migration, gone=gone, run_closed=run_closed)
        self._metrics.passes.add(1, {"action": action.summary})
        if action.nothing:
            return []
        ref = ref_of(migration)
        try:
            with migration_context(
                namespace=ref.namespace, name=ref.name, generation=migration.metadata.generation,
                workflow_id=workflow_id(ref),
            ):  # fmt: skip
                await self._carry_out(migration, ref, action, received)
        finally:
            written = self._writer.take_written(ref)
        return written

    async def _carry_out(self, migration: Migration, ref: MigrationRef, action: Action, received: float) -> None:
        if action.release_secrets:  # gone: nothing but its Secrets is left to act on
            await self._deletion.release_secrets(migration)
            return
        if migration.status_problem:
            log.warning(
                "Migration %s: its status does not parse; read without the fields at fault: %s",
                ref,
                migration.status_problem,
            )
        if action.deletion:
            for item in action.controls:  # refusals only (watcher/decisions.py): no call to the run
                await self._apply_control(ref, item)
            await self._deletion.handle(migration)
            return
        if action.cancel:
            await self._deletion.cancel_unheld(migration)
            return
        if action.invalid_spec is not None:
            await self._reject(migration, ref, action.invalid_spec)
            return
        created = action.start and await self._start(migration, ref, received)
        if action.add_finalizer or (action.start and not created):
            # The run exists now: the finalizer where missing, and the annotation recording the start, in one write.
            recorded = workflow_id(ref) if action.start else None
            if not await self._writer.hold(migration, recorded):
                return  # gone, or being deleted meanwhile: the watch brings that state
        elif created:
            self._record_later(ref)  # held since its creation: no write unless no status names the run in time
        if action.taken_off:
            await self._writer.take_off(ref, action.taken_off)
        for item in action.controls:
            await self._apply_control(ref, item)
        if action.check_run:
            await self._notice_abandoned(migration, ref)

    def _record_later(self, ref: MigrationRef) -> None:
        """Looks at the Migration again after --record-start-after seconds; that pass records the start if no
        status names the run by then (and does nothing if one does)."""

        def again() -> None:
            self._look_again.pop(ref.uid, None)
            self._resubmit(ref)

        # Once per uid: only the pass whose start created the run gets here.
        self._look_again[ref.uid] = asyncio.get_running_loop().call_later(self._settings.record_start_after, again)

    async def _start(self, migration: Migration, ref: MigrationRef, received: float) -> bool:
        """Starts the workflow inside the span that roots the migration's trace (once: a second start is refused).

        True when this call started it, False when it existed already."""
        if migration.spec is None:  # decide() starts only Migrations whose spec validates
            return False
        generation = migration.metadata.generation
        attributes: dict[str, str | int] = {
            "ferry.namespace": ref.namespace,
            "ferry.migration": ref.name,
            "ferry.generation": generation,
        }
        with _tracer.start_as_current_span("ferry.watcher.start_migration", attributes=attributes):
            created = await ensure_started(self._client, ref, generation, migration.spec, self._settings.task_queue)
        if created:
            self._metrics.event_to_start.record(time.monotonic() - received)
        return created

    async def _reject(self, migration: Migration, ref: MigrationRef, problems: str) -> None:
        """A spec the CRD's schema should have refused (an older CRD may not have): Failed, saying why."""
        message = f"ferry cannot run this Migration: {problems}. Fix the spec (or re-create the Migration)."
        key = f"invalid-spec.{migration.metadata.generation}"
        await self._writer.event(ref, EventType.WARNING, "InvalidSpec", message, key=key)
        await self._writer.mark_failed(migration, message)

    async def _apply_control(self, ref: MigrationRef, item: controls.Control | controls.Rejection) -> None:
        key = item.event_key
        if isinstance(item, controls.Rejection):
            await self._writer.event(ref, EventType.WARNING, "InvalidControl", item.why, key=key)
            await self._writer.acknowledge(ref, item.key, item.value, item.why)
            return
        accepted, message = await self._send(ref, item)
        kind, reason = (EventType.NORMAL, "ControlAccepted") if accepted else (EventType.WARNING, "ControlRefused")
        await self._writer.event(ref, kind, reason, f"{item.key}: {message}", key=key)
        await self._writer.acknowledge(ref, item.key, item.value, message)
        log.info("Migration %s: %s: %s", ref, item.key, message)

    async def _send(self, ref: MigrationRef, item: controls.Control) -> tuple[bool, str]:
        """Sends a control as an update and returns whether the saga took it and what it did (or why not).

        A run of the previous saga version has no updates: it gets the signal, as before.
        """
        handle = self._client.get_workflow_handle(workflow_id(ref))
        try:
            outcome = await asyncio.wait_for(
                handle.execute_update(
                    item.signal.value, item.request, id=item.request.request_id or None, result_type=ControlOutcome
                ),
                timeout=CONTROL_TIMEOUT,
            )
        except WorkflowUpdateFailedError as failed:
            cause = failed.cause
            if isinstance(cause, ApplicationError) and cause.type == "ControlRefused":
                return False, cause.message
            if not _no_such_update(failed):
                raise
        except RPCError as error:
            if error.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
                raise
            return False, f"{item.signal.value} ignored: the migration's workflow has finished"
        else:
            return True, outcome.message
        await handle.signal(item.signal.value, item.request)
        by = f" from {item.request.by}" if item.request.by else ""
        return True, f"sent {item.signal.value}{by} to the saga"

    async def _notice_abandoned(self, migration: Migration, ref: MigrationRef) -> None:
        """A workflow terminated from outside, or whose history is gone, cannot mirror that; the watcher records it as
        Abandoned."""
        verdict = await why_abandoned(
            self._client.get_workflow_handle(workflow_id(ref)), migration, self._client.namespace
        )
        if verdict is None:
            return
        if not await self._writer.mark_abandoned(migration, verdict.message, verdict.reason):
            return  # gone, or being deleted meanwhile: the deletion handler has it
        await self._writer.event(ref, EventType.WARNING, "Abandoned", verdict.message, key="abandoned")
        log.warning("Migration %s: %s", ref, verdict.message)


def _no_such_update(failed: WorkflowUpdateFailedError) -> bool:
    """A run without update handlers (the previous saga version) rejects updates by name."""
    cause = failed.cause
    return isinstance(cause, ApplicationError) and "not found" in cause.message and "handler" in cause.message.lower()
