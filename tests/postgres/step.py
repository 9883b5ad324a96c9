"""Workflows of one step, for tests that break things under it: postgresql.snapshot (or .replicate, .catch_up),
retried as the saga retries it.

Each runs its activity with the attempts the saga gives a step (workflows.steps.STEP_RETRY,
here as a Temporal retry policy), but notices a dead worker within a few seconds rather than the
saga's thirty.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from ferry.api.saga import (
        CatchUpInput,
        CatchUpResult,
        DriverOperation,
        ReplicateInput,
        ReplicateResult,
        SnapshotInput,
        SnapshotResult,
        driver_activity,
    )
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


@workflow.defn(name="ReplicateStep")
class ReplicateStep:
    @workflow.run
    async def run(self, input: ReplicateInput) -> ReplicateResult:
        return await workflow.execute_activity(
            driver_activity("postgresql", DriverOperation.REPLICATE),
            input,
            result_type=ReplicateResult,
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=STEP_RETRY.as_policy(),
        )


@workflow.defn(name="CatchUpStep")
class CatchUpStep:
    @workflow.run
    async def run(self, input: CatchUpInput) -> CatchUpResult:
        return await workflow.execute_activity(
            driver_activity("postgresql", DriverOperation.CATCH_UP),
            input,
            result_type=CatchUpResult,
            start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=STEP_RETRY.as_policy(),
        )
