"""Deleting a Migration: ferry holds its finalizer until the undo or the retention cleanup is done.

- Workflow still running: cancel it (which rolls back), and release the finalizer when
  the rollback has finished.
- Workflow finished: run the retention cleanup its snapshot asks for (a workflow of its
  own), then release the finalizer.
- No workflow: release at once.
The wait is bounded by --deletion-timeout; the deadline and the reason for waiting are
in status.deletion, so the bound survives a restart of the watcher. Past the deadline
the finalizer is released anyway, with a Warning Event saying what may be left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from ferry.api.migration import FINALIZER, AfterSuccess, EventType, MigrationSpec, Phase, SnapshotStatus
from ferry.api.saga import (
    CLEANUP_WORKFLOW_NAME,
    DeleteSnapshotInput,
    MigrationRef,
    SnapshotResult,
    cleanup_workflow_id,
    workflow_id,
)
from watcher.patching import MigrationWriter, ref_of
from watcher.settings import WatcherSettings

log = logging.getLogger("ferry.watcher.deletion")

Resubmit = Callable[[MigrationRef], None]


class DeletionHandler:
    def __init__(self, client: Client, writer: MigrationWriter, settings: WatcherSettings, resubmit: Resubmit) -> None:
        self._client = client
        self._writer = writer
        self._settings = settings
        self._resubmit = resubmit
        self._waiting: dict[str, asyncio.Task[None]] = {}

    async def handle(self, obj: dict[str, Any]) -> None:
        if FINALIZER not in (obj["metadata"].get("finalizers") or []):
            return
        ref = ref_of(obj)
        status = obj.get("status") or {}
        deadline = _deadline(status) or datetime.now(UTC) + timedelta(seconds=self._settings.deletion_timeout)
        handle = self._client.get_workflow_handle(workflow_id(ref))
        try:
            described = await handle.describe()
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
            await self._release(obj, "no workflow ever ran for it")
            return
        if datetime.now(UTC) >= deadline:
            message = (
                f"gave up waiting at the deadline ({deadline:%Y-%m-%dT%H:%M:%SZ}); workflow {handle.id} is "
                f"{described.status.name if described.status else 'unknown'}: check the source, the target and "
                "the snapshot by hand"
            )
            await asyncio.to_thread(self._writer.event, ref, EventType.WARNING, "FinalizerReleased", message, "give-up")
            await self._release(obj, message)
            return
        if described.status is WorkflowExecutionStatus.RUNNING:
            await handle.cancel()
            await self._wait_for(ref, handle, deadline, "rolling back before deletion: the workflow was cancelled")
            return
        cleanup = _retention_cleanup(obj, ref)
        if cleanup is not None:
            cleanup_handle = await self._start_cleanup(cleanup)
            if cleanup_handle is not None:
                await self._wait_for(ref, cleanup_handle, deadline, "deleting the snapshot (retention) before deletion")
                return
        await self._release(obj, f"its workflow has finished ({described.status.name if described.status else '?'})")

    async def _wait_for(
        self, ref: MigrationRef, handle: WorkflowHandle[Any, Any], deadline: datetime, why: str
    ) -> None:
        """Records why the Migration waits, then looks at it again when `handle` finishes or at the deadline."""
        now = datetime.now(UTC)
        message = f"{why}; the finalizer {FINALIZER} is released when it finishes, or at {deadline:%H:%M:%SZ}"
        await asyncio.to_thread(
            self._writer.patch_status,
            ref,
            {"deletion": {"message": message, "waitingSince": now.isoformat(), "deadline": deadline.isoformat()}},
        )
        await asyncio.to_thread(self._writer.event, ref, EventType.NORMAL, "WaitingBeforeDeletion", message, why)
        key = f"{ref.uid}/{handle.id}"
        if key in self._waiting and not self._waiting[key].done():
            return
        self._waiting[key] = asyncio.create_task(self._look_again_after(ref, handle, deadline))

    async def _look_again_after(self, ref: MigrationRef, handle: WorkflowHandle[Any, Any], deadline: datetime) -> None:
        remaining = max(0.0, (deadline - datetime.now(UTC)).total_seconds()) + 1
        try:
            await asyncio.wait_for(handle.result(), timeout=remaining)
        except TimeoutError:
            log.warning("Migration %s: %s still running at the deletion deadline", ref, handle.id)
        except Exception as error:  # noqa: BLE001 - a failed or cancelled run has finished too
            log.info("Migration %s: %s ended: %s", ref, handle.id, error)
        self._resubmit(ref)

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

    async def _release(self, obj: dict[str, Any], why: str) -> None:
        await asyncio.to_thread(self._writer.remove_finalizer, obj)
        log.info("Migration %s released for deletion: %s", ref_of(obj), why)


def _deadline(status: dict[str, Any]) -> datetime | None:
    raw = (status.get("deletion") or {}).get("deadline")
    return datetime.fromisoformat(raw.replace("Z", "+00:00")) if raw else None


def _retention_cleanup(obj: dict[str, Any], ref: MigrationRef) -> DeleteSnapshotInput | None:
    """The cleanup a finished Migration's retention asks for on deletion, if any."""
    status = obj.get("status") or {}
    if status.get("phase") != Phase.SUCCEEDED.value or not status.get("snapshot"):
        return None
    spec = MigrationSpec.model_validate(obj["spec"])
    snapshot = SnapshotStatus.model_validate(status["snapshot"])
    if spec.snapshot.retention.after_success is not AfterSuccess.DELETE_WITH_MIGRATION or snapshot.deleted:
        return None
    bucket, _, key = snapshot.location.removeprefix("s3://").partition("/")
    artifact = SnapshotResult(bucket=bucket, key=key, sha256=snapshot.sha256, size_bytes=snapshot.size_bytes)
    return DeleteSnapshotInput(ref=ref, snapshot=spec.snapshot, artifact=artifact)
