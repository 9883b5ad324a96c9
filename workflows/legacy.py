"""The saga as version 1 of ferry ran it (workflow type "Migration"), kept so that its runs still finish.

Runs started by ferry 0.1 are histories of this code: a worker must replay them with
exactly the commands they recorded, so this module is frozen. New Migrations run
MigrationWorkflow (workflows/migration.py, workflow type "MigrationV2"), which differs
in ways a replay would reject: a precheck step, undos of every started step, write
checks before traffic moves, retries the saga itself counts. Delete this module, and
its registration in the worker, once no run of type "Migration" is open:
`temporal workflow list --query 'WorkflowType="Migration" AND ExecutionStatus="Running"'`.

Only its names changed (the class, the constants it kept from the old plan module);
tests replay the histories recorded from it (tests/workflows/histories/v1-*.json).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from temporalio.common import RetryPolicy

    from ferry.api import search_attributes
    from ferry.api.errors import NON_RETRYABLE_TYPES
    from ferry.api.migration import (
        DeadlinePolicy,
        EventType,
        FailurePolicy,
        MigrationStatus,
        Phase,
        SnapshotStatus,
        StepName,
        StepState,
        WorkflowRef,
    )
    from ferry.api.saga import (
        PROGRESS_QUERY,
        WORKFLOW_NAME_V1,
        ControlRequest,
        DeleteSnapshotInput,
        DriverOperation,
        EventRecord,
        FreezeInput,
        FreezeResult,
        KubeActivity,
        MigrateInput,
        MigrateResult,
        MigrationInput,
        MigrationResult,
        MirrorStatusInput,
        MirrorStatusResult,
        ProvisionInput,
        ProvisionResult,
        ScaleDownOldInput,
        ScaleDownOldResult,
        Signal,
        SnapshotInput,
        SnapshotResult,
        SnapshotStoreActivity,
        SwitchTrafficInput,
        SwitchTrafficResult,
        UndoFreezeInput,
        UndoProvisionInput,
        UndoScaleDownOldInput,
        UndoSnapshotInput,
        UndoSwitchTrafficInput,
        VerifyInput,
        VerifyResult,
        driver_activity,
        keep_after_rollback,
        keep_after_success,
        snapshot_key,
    )
    from ferry.observability import metrics
    from workflows.status import SagaStatus


@dataclasses.dataclass(frozen=True)
class Activity:
    """An activity, either by fixed name or as an operation of the Migration's data driver."""

    name: str | None = None
    driver_operation: DriverOperation | None = None

    def resolve(self, driver: str) -> str:
        if self.driver_operation is not None:
            return driver_activity(driver, self.driver_operation)
        assert self.name is not None
        return self.name


def kube(name: KubeActivity) -> Activity:
    return Activity(name=name.value)


def driver(operation: DriverOperation) -> Activity:
    return Activity(driver_operation=operation)


@dataclasses.dataclass(frozen=True)
class StepPlan:
    step: StepName
    do: Activity
    undo: Activity | None
    """None where nothing needs undoing: see `why_no_undo`."""
    why_no_undo: str = ""


PLAN: tuple[StepPlan, ...] = (
    StepPlan(StepName.PROVISION, kube(KubeActivity.PROVISION), kube(KubeActivity.UNDO_PROVISION)),
    StepPlan(StepName.FREEZE, driver(DriverOperation.FREEZE), driver(DriverOperation.UNDO_FREEZE)),
    StepPlan(
        StepName.SNAPSHOT,
        driver(DriverOperation.SNAPSHOT),
        Activity(name=SnapshotStoreActivity.UNDO_SNAPSHOT.value),
    ),
    StepPlan(
        StepName.MIGRATE,
        driver(DriverOperation.MIGRATE),
        None,
        why_no_undo="the restored data lives in the target, which provision's undo deletes",
    ),
    StepPlan(StepName.VERIFY, driver(DriverOperation.VERIFY), None, why_no_undo="verify only reads"),
    StepPlan(StepName.SWITCH_TRAFFIC, kube(KubeActivity.SWITCH_TRAFFIC), kube(KubeActivity.UNDO_SWITCH_TRAFFIC)),
    StepPlan(StepName.SCALE_DOWN_OLD, kube(KubeActivity.SCALE_DOWN_OLD), kube(KubeActivity.UNDO_SCALE_DOWN_OLD)),
)

STEP_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=5,
    non_retryable_error_types=NON_RETRYABLE_TYPES,
)
"""A step gets a few automatic attempts; then the Migration's failure policy decides."""

UNDO_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=12,
    non_retryable_error_types=NON_RETRYABLE_TYPES,
)
"""An undo tries harder (about ten minutes in all) before the Migration ends Failed."""

MIRROR_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=10,
)
"""Status mirroring is best effort: each write carries the whole status, so the next one catches up."""

HEARTBEAT_TIMEOUT = timedelta(seconds=30)
"""Long activities heartbeat at least this often; a dead worker is noticed within it."""

MIRROR_TIMEOUT = timedelta(seconds=30)
CLEANUP_TIMEOUT = timedelta(minutes=5)


V1_STEPS = tuple(step.step for step in PLAN)


class RollbackRequested(Exception):
    """Leaves the forward path because someone (or a deadline policy) asked to roll back."""


class StepFailed(Exception):
    """Leaves the forward path because a step failed for good under the RollBack policy."""

    def __init__(self, step: StepName, error: str) -> None:
        super().__init__(f"step {step} failed: {error}")
        self.step = step


def _error_text(error: BaseException) -> str:
    """The innermost message of an activity failure, which is what a person can act on."""
    while error.__cause__ is not None and isinstance(error, ActivityError):
        error = error.__cause__
    if isinstance(error, ApplicationError) and error.type:
        return f"{error.type}: {error.message}"
    return str(error) or type(error).__name__


@workflow.defn(name=WORKFLOW_NAME_V1)
class MigrationWorkflowV1:
    @workflow.init
    def __init__(self, input: MigrationInput) -> None:
        info = workflow.info()
        self._input = input
        self._ref = input.ref
        self._spec = input.spec
        self._status = SagaStatus(
            workflow=WorkflowRef(namespace=info.namespace, id=info.workflow_id, run_id=info.run_id),
            generation=input.generation,
            order=V1_STEPS,
        )
        self._results: dict[StepName, Any] = {}
        self._completed: list[StepPlan] = []
        self._pause_requested = input.spec.paused
        self._rollback: ControlRequest | None = None
        self._retry_requested = False
        self._awaiting_decision = False
        self._events = 0
        self._indexed: tuple[str, str] | None = None
        self._requests: set[str] = set()
        meter = workflow.metric_meter()
        self._step_duration = meter.create_histogram_float(
            metrics.STEP_DURATION, "How long a saga step took, retries included", "s"
        )
        self._steps = meter.create_counter(metrics.STEPS, "Saga steps finished, by outcome")
        self._compensations = meter.create_counter(metrics.COMPENSATIONS, "Undos run, by outcome")

    # --- signals and query ------------------------------------------------------------------

    @workflow.signal(name=Signal.APPROVE.value)
    def approve(self, request: ControlRequest | None = None) -> None:
        if self._seen(request):
            return
        if self._status.approved_by is None:
            self._status.approved_by = (request and request.by) or "unknown"
            self._observe(request)

    @workflow.signal(name=Signal.PAUSE.value)
    def pause(self, request: ControlRequest | None = None) -> None:
        if self._seen(request):
            return
        self._pause_requested = True
        self._observe(request)

    @workflow.signal(name=Signal.RESUME.value)
    def resume(self, request: ControlRequest | None = None) -> None:
        if self._seen(request):
            return
        self._pause_requested = False
        self._observe(request)

    @workflow.signal(name=Signal.RETRY.value)
    def retry(self, request: ControlRequest | None = None) -> None:
        if self._seen(request):
            return
        if self._awaiting_decision:
            self._retry_requested = True
        else:
            workflow.logger.info("ignored retry for %s: no failed step is waiting for a decision", self._ref)
        self._observe(request)

    @workflow.signal(name=Signal.ROLLBACK.value)
    def rollback(self, request: ControlRequest | None = None) -> None:
        if self._seen(request):
            return
        if self._rollback is None:
            self._rollback = request or ControlRequest()
        self._observe(request)

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> MigrationStatus:
        return self._status.to_model()

    def _seen(self, request: ControlRequest | None) -> bool:
        """True for a request already acted on: the watcher may deliver a control twice after a crash."""
        if request is None or not request.request_id:
            return False
        if request.request_id in self._requests:
            workflow.logger.info("ignored repeated request %s for %s", request.request_id, self._ref)
            return True
        self._requests.add(request.request_id)
        return False

    def _observe(self, request: ControlRequest | None) -> None:
        if request is not None and request.generation is not None:
            self._status.generation = max(self._status.generation, request.generation)

    # --- the forward path -------------------------------------------------------------------

    @workflow.run
    async def run(self, input: MigrationInput) -> MigrationResult:
        try:
            await self._transition(Phase.RUNNING, "migration started", "Started")
            for step in PLAN:
                await self._hold_before(step.step)
                await self._run_step(step)
            await self._apply_retention_after_success()
        except RollbackRequested as requested:
            return await self._shielded_roll_back(str(requested))
        except StepFailed as failed:
            result = await self._shielded_roll_back(str(failed))
            raise ApplicationError(
                f"{failed}; {result.message}", type="MigrationRolledBack", non_retryable=True
            ) from failed
        except BaseException as error:
            if not is_cancelled_exception(error):
                raise
            await self._shielded_roll_back("the workflow was cancelled")
            raise
        self._status.current_step = None
        target = self._spec.target.stateful_set
        await self._transition(
            Phase.SUCCEEDED,
            f"migrated {self._spec.source.stateful_set} to {target}; traffic goes to {target}",
            "Succeeded",
        )
        return MigrationResult(phase=Phase.SUCCEEDED, message=self._status.message, snapshot=self._status.snapshot)

    async def _hold_before(self, step: StepName) -> None:
        """Stops before `step` while paused, awaiting approval or soaking; leaves on a rollback request."""
        self._raise_if_rollback_requested()
        if self._pause_requested:
            await self._transition(Phase.PAUSED, f"paused before {step}; send resume to go on", "Paused")
            await workflow.wait_condition(lambda: not self._pause_requested or self._rollback is not None)
            self._raise_if_rollback_requested()
            await self._transition(Phase.RUNNING, f"resumed before {step}", "Resumed")
        if step is StepName.SWITCH_TRAFFIC and self._spec.approval.required:
            await self._await_approval()
        if step is StepName.SCALE_DOWN_OLD and self._spec.soak_seconds:
            await self._transition(
                Phase.RUNNING, f"soaking for {self._spec.soak_seconds}s before scale-down-old", "Soaking"
            )
            if await self._wait_or_timeout(lambda: self._rollback is not None, self._spec.soak_seconds):
                self._raise_if_rollback_requested()

    async def _await_approval(self) -> None:
        if self._status.approved_by is None:
            deadline = self._spec.approval.deadline_seconds
            waiting = f"waiting for approval before switch-traffic{f' (deadline {deadline}s)' if deadline else ''}"
            await self._transition(Phase.AWAITING_APPROVAL, waiting, "AwaitingApproval")
            answered = await self._wait_or_timeout(
                lambda: self._status.approved_by is not None or self._rollback is not None, deadline
            )
            self._raise_if_rollback_requested()
            if not answered:
                if self._spec.approval.on_deadline is DeadlinePolicy.ROLL_BACK:
                    raise RollbackRequested(f"no approval within {deadline}s (onDeadline: RollBack)")
                self._status.approved_by = f"nobody: the {deadline}s deadline passed (onDeadline: Proceed)"
        await self._transition(Phase.RUNNING, f"approved by {self._status.approved_by}", "Approved")

    async def _wait_or_timeout(self, condition: Callable[[], bool], seconds: int | None) -> bool:
        """True when `condition` held before `seconds` passed (None: wait as long as it takes)."""
        try:
            await workflow.wait_condition(condition, timeout=timedelta(seconds=seconds) if seconds else None)
        except TimeoutError:
            return False
        return True

    def _raise_if_rollback_requested(self) -> None:
        if self._rollback is not None:
            who = f" by {self._rollback.by}" if self._rollback.by else ""
            why = f": {self._rollback.reason}" if self._rollback.reason else ""
            raise RollbackRequested(f"rollback requested{who}{why}")

    async def _run_step(self, step: StepPlan) -> None:
        name = step.step
        while True:
            self._status.current_step = name
            entry = self._status.update_step(name, workflow.now(), state=StepState.RUNNING)
            await self._transition(
                Phase.RUNNING,
                f"{name}: running (attempt {entry.attempts})",
                "StepStarted",
                key=f"{name}.{entry.attempts}",
            )
            failure: BaseException | None = None
            try:
                result = await self._execute_step(step)
                error = self._check(name, result)
            except RollbackRequested:
                self._status.update_step(
                    name, workflow.now(), state=StepState.FAILED, last_error="interrupted by rollback"
                )
                raise
            except ActivityError as activity_failure:
                if is_cancelled_exception(activity_failure):
                    raise
                failure, error = activity_failure, _error_text(activity_failure)
            self._count_step(name, entry.started_at, "failed" if error is not None else "succeeded")
            if error is not None:
                self._status.update_step(name, workflow.now(), state=StepState.FAILED, last_error=error)
                if self._spec.failure_policy is FailurePolicy.PAUSE:
                    await self._await_decision(name, error, entry.attempts)
                    continue
                await self._record(
                    f"{name} failed: {error}", "StepFailed", EventType.WARNING, key=f"{name}.{entry.attempts}"
                )
                raise StepFailed(name, error) from failure
            self._keep_result(step, result)
            self._status.update_step(name, workflow.now(), state=StepState.SUCCEEDED)
            await self._transition(Phase.RUNNING, f"{name}: succeeded", "StepSucceeded", key=f"{name}.{entry.attempts}")
            return

    def _count_step(self, step: StepName, started: datetime | None, outcome: str) -> None:
        labels = {"step": step.value, "outcome": outcome}
        self._steps.add(1, labels)
        if started is not None:
            self._step_duration.record((workflow.now() - started).total_seconds(), labels)

    async def _await_decision(self, step: StepName, error: str, attempt: int) -> None:
        """failurePolicy Pause: hold until a person sends retry (returns) or rollback (raises)."""
        self._awaiting_decision = True
        self._retry_requested = False
        await self._transition(
            Phase.PAUSED,
            f"{step} failed: {error}; send retry to run it again, or rollback to undo the completed steps",
            "StepFailed",
            EventType.WARNING,
            key=f"{step}.{attempt}",
        )
        await workflow.wait_condition(lambda: self._retry_requested or self._rollback is not None)
        self._awaiting_decision = False
        self._raise_if_rollback_requested()

    async def _execute_step(self, step: StepPlan) -> Any:
        """Runs a step's activity; a rollback request cancels it and waits until it stopped."""
        argument, result_type = self._step_call(step.step)
        handle = workflow.start_activity(
            step.do.resolve(self._spec.driver.type.value),
            argument,
            result_type=result_type,
            start_to_close_timeout=timedelta(seconds=self._spec.timeouts.for_step(step.step)),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=STEP_RETRY,
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"{self._ref}: {step.step}",
        )
        try:
            await workflow.wait_condition(lambda: handle.done() or self._rollback is not None)
        except BaseException:
            await self._stop(handle)  # the workflow itself is being cancelled
            raise
        if not handle.done():
            await self._stop(handle)
            self._raise_if_rollback_requested()
        return handle.result()

    @staticmethod
    async def _stop(handle: asyncio.Task[Any]) -> None:
        handle.cancel()
        try:
            await handle
        except BaseException as error:  # noqa: BLE001 - whatever the activity ended with, it has stopped
            if not is_cancelled_exception(error):
                workflow.logger.warning("activity failed while being cancelled: %s", error)

    # --- step inputs and results ------------------------------------------------------------

    def _step_call(self, step: StepName) -> tuple[Any, type]:
        ref, spec = self._ref, self._spec
        match step:
            case StepName.PROVISION:
                return ProvisionInput(ref=ref, spec=spec), ProvisionResult
            case StepName.FREEZE:
                return FreezeInput(ref=ref, driver=spec.driver), FreezeResult
            case StepName.SNAPSHOT:
                key = snapshot_key(ref, spec.snapshot)
                return SnapshotInput(ref=ref, driver=spec.driver, snapshot=spec.snapshot, key=key), SnapshotResult
            case StepName.MIGRATE:
                artifact = self._results[StepName.SNAPSHOT]
                return MigrateInput(
                    ref=ref, driver=spec.driver, snapshot=spec.snapshot, artifact=artifact
                ), MigrateResult
            case StepName.VERIFY:
                return VerifyInput(ref=ref, driver=spec.driver), VerifyResult
            case StepName.SWITCH_TRAFFIC:
                target = spec.target.stateful_set
                return SwitchTrafficInput(ref=ref, service=spec.source.service, target_stateful_set=target), (
                    SwitchTrafficResult
                )
            case StepName.SCALE_DOWN_OLD:
                return ScaleDownOldInput(ref=ref, stateful_set=spec.source.stateful_set), ScaleDownOldResult
        raise ValueError(f"no call for step {step}")

    def _undo_call(self, step: StepName) -> Any:
        ref, spec, result = self._ref, self._spec, self._results[step]
        match step:
            case StepName.PROVISION:
                return UndoProvisionInput(ref=ref, stateful_set=spec.target.stateful_set)
            case StepName.FREEZE:
                return UndoFreezeInput(ref=ref, driver=spec.driver, previous_setting=result.previous_setting)
            case StepName.SNAPSHOT:
                keep = keep_after_rollback(spec.snapshot.retention.after_rollback)
                return UndoSnapshotInput(ref=ref, snapshot=spec.snapshot, artifact=result, keep=keep)
            case StepName.SWITCH_TRAFFIC:
                return UndoSwitchTrafficInput(
                    ref=ref,
                    service=spec.source.service,
                    previous_selector=result.previous_selector,
                    source_stateful_set=spec.source.stateful_set,
                )
            case StepName.SCALE_DOWN_OLD:
                return UndoScaleDownOldInput(
                    ref=ref, stateful_set=spec.source.stateful_set, replicas=result.previous_replicas
                )
        raise ValueError(f"step {step} has no undo")

    @staticmethod
    def _check(step: StepName, result: Any) -> str | None:
        """A reason to fail a step whose activity returned; drivers raise VerificationMismatch
        themselves, and this guards against one that reports a difference without raising."""
        if step is StepName.VERIFY:
            different = [check.table for check in result.tables if not check.equal]
            if different:
                return f"VerificationMismatch: source and target differ in {', '.join(different)}"
        return None

    def _keep_result(self, step: StepPlan, result: Any) -> None:
        if step.step is StepName.SNAPSHOT:
            self._status.snapshot = SnapshotStatus(
                location=result.location, sha256=result.sha256, size_bytes=result.size_bytes
            )
        self._results[step.step] = result
        if step.undo is not None:
            self._completed.append(step)  # registered only now that the step succeeded

    async def _apply_retention_after_success(self) -> None:
        retention = self._spec.snapshot.retention.after_success
        artifact = self._results.get(StepName.SNAPSHOT)
        if artifact is None or keep_after_success(retention):
            return
        try:
            await workflow.execute_activity(
                SnapshotStoreActivity.DELETE_SNAPSHOT.value,
                DeleteSnapshotInput(ref=self._ref, snapshot=self._spec.snapshot, artifact=artifact),
                start_to_close_timeout=CLEANUP_TIMEOUT,
                retry_policy=UNDO_RETRY,
                summary=f"{self._ref}: delete snapshot (retention)",
            )
        except ActivityError as error:
            if is_cancelled_exception(error):
                raise
            # The migration itself succeeded; a leftover object is reported, not rolled back.
            await self._record(
                f"could not delete the snapshot: {_error_text(error)}", "RetentionFailed", EventType.WARNING
            )
            return
        if self._status.snapshot is not None:
            self._status.snapshot = self._status.snapshot.model_copy(update={"deleted": True})

    # --- the way back -------------------------------------------------------------------------

    async def _shielded_roll_back(self, reason: str) -> MigrationResult:
        """Runs the rollback to its end even if the workflow is cancelled meanwhile."""
        task = asyncio.ensure_future(self._roll_back(reason))
        while True:
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.done():
                    raise
                workflow.logger.info("cancellation requested during rollback of %s; the rollback goes on", self._ref)

    async def _roll_back(self, reason: str) -> MigrationResult:
        self._status.current_step = None
        await self._transition(Phase.ROLLING_BACK, f"rolling back: {reason}", "RollingBack", EventType.WARNING)
        failed: list[str] = []
        for step in reversed(self._completed):
            assert step.undo is not None
            name = step.step
            self._status.current_step = name
            self._status.update_step(name, workflow.now(), state=StepState.COMPENSATING)
            await self._transition(Phase.ROLLING_BACK, f"undoing {name}", "CompensationStarted", key=str(name))
            try:
                await workflow.execute_activity(
                    step.undo.resolve(self._spec.driver.type.value),
                    self._undo_call(name),
                    start_to_close_timeout=timedelta(seconds=self._spec.timeouts.for_step(name)),
                    heartbeat_timeout=HEARTBEAT_TIMEOUT,
                    retry_policy=UNDO_RETRY,
                    summary=f"{self._ref}: undo {name}",
                )
            except ActivityError as error:
                self._compensations.add(1, {"step": name.value, "outcome": "failed"})
                failed.append(f"{name} ({_error_text(error)})")
                self._status.update_step(
                    name, workflow.now(), state=StepState.COMPENSATION_FAILED, last_error=_error_text(error)
                )
                await self._record(
                    f"undo of {name} failed: {_error_text(error)}",
                    "CompensationFailed",
                    EventType.WARNING,
                    key=str(name),
                )
                continue
            self._compensations.add(1, {"step": name.value, "outcome": "succeeded"})
            self._status.update_step(name, workflow.now(), state=StepState.COMPENSATED)
            await self._record(f"undid {name}", "StepCompensated", key=str(name))
        self._status.current_step = None
        if failed:
            message = (
                f"rollback incomplete after {reason}: undo of {'; '.join(failed)} kept failing. "
                "Fix the cause and undo those steps by hand (see the README's recovery section)"
            )
            await self._transition(Phase.FAILED, message, "RollbackIncomplete", EventType.WARNING)
            raise ApplicationError(message, type="RollbackIncomplete", non_retryable=True)
        await self._transition(Phase.ROLLED_BACK, f"rolled back: {reason}", "RolledBack")
        return MigrationResult(phase=Phase.ROLLED_BACK, message=self._status.message, snapshot=self._status.snapshot)

    # --- mirroring ----------------------------------------------------------------------------

    async def _transition(
        self, phase: Phase, message: str, reason: str, kind: EventType = EventType.NORMAL, key: str = ""
    ) -> None:
        """Moves to `phase` and mirrors the new status into the resource, with one Event."""
        self._status.set_phase(phase, message, workflow.now())
        self._index()
        await self._record(message, reason, kind, key)

    async def _record(self, message: str, reason: str, kind: EventType = EventType.NORMAL, key: str = "") -> None:
        self._events += 1
        event = EventRecord(type=kind, reason=reason, message=message, key=f"{self._events}.{reason}.{key}")
        try:
            await workflow.execute_activity(
                KubeActivity.MIRROR_STATUS.value,
                MirrorStatusInput(ref=self._ref, status=self._status.to_model(), event=event),
                result_type=MirrorStatusResult,
                start_to_close_timeout=MIRROR_TIMEOUT,
                retry_policy=MIRROR_RETRY,
                summary=f"{self._ref}: status {self._status.phase}, {reason}",
            )
        except ActivityError as error:
            if is_cancelled_exception(error):
                raise
            workflow.logger.warning("could not mirror the status of %s: %s", self._ref, _error_text(error))

    def _index(self) -> None:
        """Keeps the run's search attributes in step with its phase, so the UI and CLI can filter on them."""
        step = str(self._status.current_step) if self._status.current_step else ""
        indexed = (self._status.phase.value, step)
        if indexed == self._indexed:
            return
        updates: list[SearchAttributeUpdate[Any]] = [
            search_attributes.PHASE.value_set(indexed[0]),
            search_attributes.STEP.value_set(indexed[1]),
        ]
        if self._indexed is None:
            updates += [
                search_attributes.MIGRATION_NAMESPACE.value_set(self._ref.namespace),
                search_attributes.MIGRATION_NAME.value_set(self._ref.name),
            ]
        workflow.upsert_search_attributes(updates)
        self._indexed = indexed
