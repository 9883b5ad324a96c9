"""Workflows of one step, for tests that break things under it: postgresql.snapshot (or .replicate, .catch_up),
retried as the saga retries it.

Each runs its activity with the attempts the saga gives a step (workflows.steps.STEP_RETRY,
here as a Temporal retry policy), but notices a dead worker within a few seconds rather than the
saga's thirty.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TypeVar

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

Result = TypeVar("Result")


async def _run_step(operation: DriverOperation, input: object, result_type: type[Result]) -> Result:
    """The driver's activity for `operation`, with the saga's attempts and a short heartbeat timeout."""
    result: Result = await workflow.execute_activity(
        driver_activity("postgresql", operation),
        input,
        result_type=result_type,
        start_to_close_timeout=timedelta(minutes=5),
        heartbeat_timeout=HEARTBEAT_TIMEOUT,
        retry_policy=STEP_RETRY.as_policy(),
    )
    return result


@workflow.defn(name="SnapshotStep")
class SnapshotStep:
    @workflow.run
    async def run(self, input: SnapshotInput) -> SnapshotResult:
        return await _run_step(DriverOperation.SNAPSHOT, input, SnapshotResult)


@workflow.defn(name="ReplicateStep")
class ReplicateStep:
    @workflow.run
    async def run(self, input: ReplicateInput) -> ReplicateResult:
        return await _run_step(DriverOperation.REPLICATE, input, ReplicateResult)


@workflow.defn(name="CatchUpStep")
class CatchUpStep:
    @workflow.run
    async def run(self, input: CatchUpInput) -> CatchUpResult:
        return await _run_step(DriverOperation.CATCH_UP, input, CatchUpResult)
