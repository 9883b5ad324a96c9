"""What the watcher does with the latest state of one Migration. Level-triggered and idempotent.

For a live Migration: hold the finalizer, make sure its workflow exists, turn new
kubectl controls into signals, and (on a full list) notice a workflow terminated from
outside. A deleted Migration goes to the deletion handler. Nothing is remembered between
calls: everything needed is in the object, its status, and Temporal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from opentelemetry import trace
from pydantic import ValidationError
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from ferry.api.migration import FINALIZER, FINISHED_PHASES, EventType, MigrationSpec, Phase
from ferry.api.saga import ControlOutcome, MigrationRef, workflow_id
from ferry.observability.logs import migration_context
from watcher import controls
from watcher.deletion import DeletionHandler
from watcher.metrics import WatcherMetrics
from watcher.patching import MigrationWriter, ref_of
from watcher.settings import WatcherSettings
from watcher.starting import ensure_started

log = logging.getLogger("ferry.watcher.handling")
_tracer = trace.get_tracer("ferry.watcher")

_FINISHED = {phase.value for phase in FINISHED_PHASES}
STARTED_CACHE = 10_000
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
    ) -> None:
        self._client = client
        self._writer = writer
        self._settings = settings
        self._deletion = deletion
        self._metrics = metrics
        self._started: dict[str, None] = {}
        """Workflow IDs known to exist, until their status says so: saves a start call per event.
        Only a cache: losing it (a restart) costs one idempotent start call per Migration."""

    def _remember_started(self, workflow: str) -> None:
        self._started[workflow] = None
        if len(self._started) > STARTED_CACHE:
            del self._started[next(iter(self._started))]

    async def handle(self, obj: dict[str, Any], listed: bool, received: float) -> None:
        ref = ref_of(obj)
        generation = int(obj["metadata"].get("generation", 1))
        with migration_context(
            namespace=ref.namespace, name=ref.name, generation=generation, workflow_id=workflow_id(ref)
        ):
            await self._handle(obj, ref, listed, received)

    async def _handle(self, obj: dict[str, Any], ref: MigrationRef, listed: bool, received: float) -> None:
        if obj["metadata"].get("deletionTimestamp"):
            await self._deletion.handle(obj)
            return
        status = obj.get("status") or {}
        finished = status.get("phase") in _FINISHED
        if not finished:
            spec = await self._spec(obj, ref)
            if spec is None:
                return
            if FINALIZER not in (obj["metadata"].get("finalizers") or []):
                await asyncio.to_thread(self._writer.add_finalizer, obj)
            expected = workflow_id(ref)
            if (status.get("workflow") or {}).get("id") != expected and expected not in self._started:
                await self._start(ref, int(obj["metadata"].get("generation", 1)), spec, received)
        await self._apply_controls(obj, ref)
        if listed and not finished and status.get("workflow"):
            await self._notice_abandoned(obj, ref)

    async def _start(self, ref: MigrationRef, generation: int, spec: MigrationSpec, received: float) -> None:
        """Starts the workflow inside the span that roots the migration's trace."""
        attributes: dict[str, str | int] = {
            "ferry.namespace": ref.namespace,
            "ferry.migration": ref.name,
            "ferry.generation": generation,
        }
        with _tracer.start_as_current_span("ferry.watcher.start_migration", attributes=attributes):
            await ensure_started(self._client, ref, generation, spec, self._settings.task_queue)
        self._metrics.event_to_start.record(time.monotonic() - received)
        self._remember_started(workflow_id(ref))

    async def _spec(self, obj: dict[str, Any], ref: MigrationRef) -> MigrationSpec | None:
        try:
            return MigrationSpec.model_validate(obj.get("spec") or {})
        except ValidationError as error:
            # The CRD's schema should have refused it; an older CRD may not have.
            problems = "; ".join(f"spec.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
            message = f"ferry cannot run this Migration: {problems}. Fix the spec (or re-create the Migration)."
            generation = obj["metadata"].get("generation")
            await asyncio.to_thread(
                self._writer.event, ref, EventType.WARNING, "InvalidSpec", message, key=f"invalid-spec.{generation}"
            )
            await asyncio.to_thread(self._writer.patch_status, ref, {"phase": Phase.FAILED.value, "message": message})
            return None

    async def _apply_controls(self, obj: dict[str, Any], ref: MigrationRef) -> None:
        for item in controls.pending(obj):
            key = f"{item.key}={item.value}"
            if isinstance(item, controls.Rejection):
                await asyncio.to_thread(self._writer.event, ref, EventType.WARNING, "InvalidControl", item.why, key=key)
                await self._acknowledge(ref, item.key, item.value, item.why)
                continue
            accepted, message = await self._send(ref, item)
            kind, reason = (EventType.NORMAL, "ControlAccepted") if accepted else (EventType.WARNING, "ControlRefused")
            await asyncio.to_thread(self._writer.event, ref, kind, reason, f"{item.key}: {message}", key=key)
            await self._acknowledge(ref, item.key, item.value, message)
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

    async def _acknowledge(self, ref: MigrationRef, key: str, value: str, message: str) -> None:
        await asyncio.to_thread(
            self._writer.patch_status, ref, {"controls": {"acknowledged": {key: value}, "message": message}}
        )

    async def _notice_abandoned(self, obj: dict[str, Any], ref: MigrationRef) -> None:
        """A workflow terminated from outside cannot mirror that; the watcher records it as Abandoned."""
        handle = self._client.get_workflow_handle(workflow_id(ref))
        try:
            description = await handle.describe()
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return
            raise
        if description.status not in (WorkflowExecutionStatus.TERMINATED, WorkflowExecutionStatus.TIMED_OUT):
            return
        how = await _termination(handle) if description.status is WorkflowExecutionStatus.TERMINATED else "timed out"
        message = (
            f"abandoned: the workflow was {how}; ferry undid nothing, so the source and the target are as that "
            "run left them. Inspect them, clean up by hand, then delete this Migration."
        )
        await asyncio.to_thread(self._writer.mark_abandoned, obj, message)
        await asyncio.to_thread(self._writer.event, ref, EventType.WARNING, "Abandoned", message, key="abandoned")
        log.warning("Migration %s: %s", ref, message)


def _no_such_update(failed: WorkflowUpdateFailedError) -> bool:
    """A run without update handlers (the previous saga version) rejects updates by name."""
    cause = failed.cause
    return isinstance(cause, ApplicationError) and "not found" in cause.message and "handler" in cause.message.lower()


async def _termination(handle: WorkflowHandle[Any, Any]) -> str:
    """'terminated by <identity>: <reason>' from the run's last history event."""
    last = None
    async for event in handle.fetch_history_events():
        last = event
    if last is None or not last.HasField("workflow_execution_terminated_event_attributes"):
        return "terminated"
    attributes = last.workflow_execution_terminated_event_attributes
    who = f" by {attributes.identity}" if attributes.identity else ""
    why = f" ({attributes.reason})" if attributes.reason else ""
    return f"terminated from outside{who}{why}"
