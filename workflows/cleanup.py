"""Retention cleanup when a finished Migration is deleted: a workflow of its own, so it is durable.

The watcher starts it (one per Migration, by ID) when a Migration whose snapshot is
kept "until the Migration is deleted" goes away, and releases the finalizer once it
has finished.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from ferry.api.saga import CLEANUP_WORKFLOW_NAME, DeleteSnapshotInput, SnapshotStoreActivity
    from workflows.saga import RETENTION_TIMEOUT
    from workflows.steps import UNDO_RETRY


@workflow.defn(name=CLEANUP_WORKFLOW_NAME)
class RetentionCleanupWorkflow:
    @workflow.run
    async def run(self, input: DeleteSnapshotInput) -> None:
        await workflow.execute_activity(
            SnapshotStoreActivity.DELETE_SNAPSHOT.value,
            input,
            start_to_close_timeout=RETENTION_TIMEOUT,
            retry_policy=UNDO_RETRY.as_policy(),
            summary=f"{input.ref}: delete snapshot {input.artifact.location} (retention)",
        )
