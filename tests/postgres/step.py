"""A workflow of one step, for tests that break things under it: postgresql.snapshot, retried as the saga retries it.

It runs the snapshot activity with the attempts the saga gives a step (workflows.steps.STEP_RETRY,
here as a Temporal retry policy), but notices a dead worker within a few seconds rather than the
saga's thirty.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from ferry.api.saga import DriverOperation, SnapshotInput, SnapshotResult, driver_activity
    from workflows.steps import STEP_RETRY

HEARTBEAT_TIMEOUT = timedelta(seconds=4)


@workflow.defn(name="SnapshotStep")
class SnapshotStep:
    @workflow.run
    async def run(self, input: SnapshotInput) -> SnapshotResult:
        return await workflow.execute_activity(
            driver_activity("postgresql", DriverOperation.SNAPSHOT),
            input,
            result_type=SnapshotResult,
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=STEP_RETRY.as_policy(),
        )
