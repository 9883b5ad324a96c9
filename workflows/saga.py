"""The saga's loop: run the plan's steps in order, undo every started step in reverse on the way out.

Deterministic workflow code only; both the migration workflow and the post-success undo
workflow drive a `Saga`. Everything about a step comes from its plan entry (see
workflows/steps.py), so this loop never names a step.

The rule on the way back: **every step that was started is undone**, whether it
succeeded, failed, was stopped by a rollback or a cancellation, or lost its worker. A
step whose activity reports success even after it was asked to stop counts as done,
and its result goes to its undo; a step whose outcome is unknown has its undo run
without a result. This is safe because every undo is idempotent and finds what its step
did where the step recorded it (labels with the Migration's uid, annotations, markers
in the database, a deterministic S3 key), so an undo of a step that did nothing, or
half of it, does exactly what is needed and nothing else. An undo whose guard refuses
(e.g. switch-traffic's, when the target took writes that going back would lose), or
that keeps failing, stops the rollback there: the older undos would act on what
depends on it. The Migration then ends Failed, saying what was not undone. An undo that
only empties the target or the bucket is gone past when it keeps failing, unless it
left a target that traffic may have reached: it refused (WritesOnTarget) or could not
compare it, and provision's undo would delete the rows only that target holds
(TARGET_KEPT). Traffic may have reached the target while the step that moves it is
started, or once its undo sent traffic back, until an undo that empties the target
(comparing it first) succeeded (TRAFFIC_SINCE_EMPTIED).

Attempts are the saga's own: each activity runs once per attempt, and the saga waits
between attempts, so the status shows every attempt, the last error while it waits,
and an Event per failed attempt. Status is mirrored into the Migration at every
transition, one mirror at a time, always the newest status; transitions made while a
mirror is under way go into the next one together, each with its Event (see `record`).
A write that failed for good is tried again, with its Events, until one lands.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, FailureError, is_cancelled_exception
from temporalio.exceptions import TimeoutError as TimeoutFailure
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from ferry.api import search_attributes
    from ferry.api.integrity import NOT_BACKED
    from ferry.api.migration import (
        ApiModel,
        DeadlinePolicy,
        EventType,
        FailurePolicy,
        MigrationSpec,
        Phase,
        StepName,
        StepState,
        WriteDowntimeStatus,
    )
    from ferry.api.saga import (
        CheckUnwrittenResult,
        ControlRequest,
        DeleteSnapshotInput,
        EventRecord,
        KubeActivity,
        MigrationRef,
        MigrationResult,
        MirrorStatusInput,
        MirrorStatusResult,
        SnapshotStoreActivity,
        keep_after_success,
        watches_task_queue,
    )
    from ferry.api.scrubbing import scrub
    from ferry.observability import metrics
    from workflows import plan
    from workflows.controls import Controls, Stage
    from workflows.status import SagaStatus
    from workflows.steps import (
        PERSISTING_ATTEMPTS,
        PERSISTING_DELAY,
        UNDO_RETRY,
        WATCH_RETRY,
        Call,
        Context,
        Results,
        Retry,
        Step,
    )

T = TypeVar("T")

ONE_ATTEMPT = RetryPolicy(maximum_attempts=1)
"""Activities of steps and undos run once per attempt: the saga counts and spaces the attempts itself."""

MIRROR_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10), maximum_attempts=10
)
"""Status mirroring is best effort: each write carries the whole status, so the next one catches up."""
STATUS_WRITES_NEVER_END_THE_RUN = "status-writes-never-end-the-run"
"""Patch: a status write that failed for good (the Kubernetes API refusing it for the few minutes MIRROR_RETRY spans)
no longer ends the run: a local activity's failure reaches the workflow as its ApplicationError, not an ActivityError,
so it escaped the handler, and the run closed Failed wherever it stood, a frozen source and all, with nothing undone.
The write that says the run finished (Succeeded, RolledBack, Failed, Planned) is tried again at FINAL_STATUS_RETRY
intervals until it lands: once the run closes nothing writes the status again, and the Migration would show Running
for good, every `kubectl wait` hanging."""
FINAL_STATUS_RETRY = (timedelta(seconds=30), timedelta(minutes=5))
"""The first wait between tries of the final status write, and the longest (it doubles)."""
STATUS_WRITTEN_AGAIN = "failed-status-writes-written-again"
"""Patch: a status write that failed for good and is not the run's last is no longer dropped. Its Events go back in
front of those not yet written, so the next write records them (they are keyed: recording one twice records it once),
and when no newer write is queued the newest status is tried again, STATUS_RETRY apart, until a write lands. It was
dropped with its Events, and when the saga then waited for a person (AwaitingApproval, Paused) nothing wrote the
status until that person acted: the Migration said Running, `kubectl wait --for=condition=AwaitingApproval` hung, and
nobody learnt that an approval was wanted."""
STATUS_RETRY = (timedelta(seconds=30), timedelta(minutes=10))
"""The first wait before a failed status write (not the final one) is tried again, and the longest (it doubles). Each
try is one attempt, so it costs the history a timer, a workflow task and a marker, about six events: a run waiting
while the API server refuses its writes for a week adds about 6,000 (Temporal ends a run at 51,200), and once the API
server answers again its status is written within ten minutes."""
MIRROR_TIMEOUT = timedelta(seconds=30)
RETENTION_TIMEOUT = timedelta(minutes=5)
COALESCED_MIRRORS = "coalesced-status-mirrors"
"""Patch: status writes are local activities beside the saga, one at a time, each carrying every transition made
since the last."""
WRITES_FLOW_WHILE_WAITING = "writes-flow-while-waiting"
"""Patch: the source is never frozen while the saga waits for a person. Approval is asked before the step that stops
writes; a pause asked for while writes are stopped takes effect once they flow again; a failure under failurePolicy
Pause while they are stopped undoes the saga back to before that step, then waits (retry starts again from it)."""
ROLLBACK_AFTER_THE_LAST_STEP = "rollback-after-the-last-step"
"""Patch: a rollback accepted as the last step ended (its result and the request in one workflow task) is carried
out, not dropped; once every step is done the run has finished, and controls are refused from then on (while the
snapshot is deleted for retention, the last thing before Succeeded)."""
UNDOS_FINISH_WHEN_CANCELLED = "undos-finish-when-cancelled"
"""Patch: the undos failurePolicy Pause runs so that writes flow while a person decides are shielded like a rollback:
a cancellation of the workflow meanwhile lets them finish, then rolls back the rest; it was taken for a failed undo
attempt, and lost."""
ROLLBACK_PAST_LEFTOVERS = "rollback-past-leftovers"
"""Patch: an undo that only empties the target's database or the snapshot's bucket (Undo.blocks_older false) no
longer stops the rollback when it keeps failing: the older undos run, the freeze's among them, and the run ends
Failed naming what is left. The target or the S3 endpoint being unreachable, often the reason for the rollback,
left the source frozen until a person came."""
PAUSE_AFTER_WAITS = "pause-after-approval-and-soak"
"""Patch: a pause given while the saga awaits approval or soaks holds it once the wait ends, before the step; it was
forgotten, and the step (the freeze, or scale-down-old) ran against it."""
FINISHED_IGNORES_CANCEL = "finished-ignores-cancel"
"""Patch: once every step is done, a cancellation of the workflow is ignored: the retention's deletion, the status
write that says Succeeded and the handlers' last writes run to their end, and the run completes Succeeded. A cancel
then (after `kubectl wait` saw Succeeded) rolled the finished migration back, or closed the run Canceled."""
TARGET_KEPT = "rollback-keeps-a-written-target"
"""Patch: a rollback after traffic moved to the target never goes past an undo that left the target unemptied (see
Undo.empties_target): the undo refused (WritesOnTarget: the target took writes since verify's mark, over a
connection that stayed open past the check before traffic went back), or kept failing, so nobody compared it. It
stops there like a refusal of the check before an undo; it went on, and provision's undo deleted the target's
volumes with rows only they held."""
TRAFFIC_SINCE_EMPTIED = "traffic-since-the-target-was-emptied"
"""Patch: traffic counts as having reached the target (TARGET_KEPT) once a step that moves it was started, until an
undo that empties the target succeeds: that undo compared the target with verify's mark before it emptied it, so
nothing only the target had is left. It counted whenever that step was started or its status said it had run, which
stays so after the target was emptied: within a rollback (an undo of snapshot failing after migrate's had emptied the
target), and across failurePolicy Pause's cycles (an emptying undo failing in a later cycle, after the target had been
emptied and no traffic had reached it again). The way back then stopped before the freeze's undo and left the source
frozen."""
NO_TRAFFIC_MOVED = "no-traffic-moved"
"""Patch: when the check before switch-traffic's undo finds that this Migration never moved the traffic (its check
before the step failed at every attempt, the target not answering to seal verify's mark, say, and the stable Service
carries no record of a switch by it), traffic counts as not having reached the target (TARGET_KEPT): an undo that
empties the target failing then (the same silent target) is gone past, and the source is unfrozen. It stopped the way
back there, the source frozen, with no traffic ever having moved."""
UNDOS_RETRY_UNREACHABLE = "undos-retry-an-unreachable-database"
"""Patch: an undo whose database did not answer, or refused the credentials, is tried again like any other failure
of an undo, up to its attempts. Both counted as permanent at once, as they do for a step: a source Pod rescheduled
or a password rotated while the Secret lagged ended the rollback at its first attempt, the source frozen."""
UNDOS_THAT_LET_WRITES_IN_PERSIST = "undos-that-let-writes-in-persist"
"""Patch: an undo that `persists` (the freeze's: Undo.persists) goes on being tried once its attempts are spent on
failures a person can fix, PERSISTING_ATTEMPTS more times PERSISTING_DELAY apart. It ended the rollback after about
ten minutes, the source frozen, every client refused, until someone ran the undo's SQL by hand: credentials rotated to
a new role (which the freeze shuts out) or a password changed before its Secret, a source Pod down for longer."""
RETRIED_BY_UNDOS = frozenset({"DatabaseUnreachable", "BadCredentials"})
"""Failure types permanent for a step (the failure policy decides sooner) that an undo tries again (see above)."""
KEEPS_THE_TARGET = frozenset({"WritesOnTarget"})
"""Failure types of an undo that refused to destroy what it could not vouch for."""
SERVED = "TargetServesTraffic"
"""Failure type of an undo that would empty the target while a Service sends the clients there (activities/serving.py):
it keeps the target like KEEPS_THE_TARGET, and nothing older is undone (the freeze's undo would let the source take
writes that the clients, on the target, never see). Raised by the emptying undos only since this was added, so no
history has it from one, and no recorded run takes another way on replay."""
WATCH_WHILE_WAITING = "watch-while-waiting"
"""Patch: while the saga waits (approval, a pause, a soak) after a step with a watch succeeded (Online's replicate) and
before the step that stops writes, the watch's activity runs beside the wait and is cancelled when the wait ends. Its
failure (the replication broke) counts as that step's: the failure policy decides. Before, a replication that broke
then kept the source's WAL, unseen, until the wait ended or the source's disk filled."""
WATCHES_QUEUE = "watch-on-its-own-queue"
"""Patch: the watch runs on the task queue of the run's watches (ferry.api.saga.watches_task_queue), which workers
serve with slots of their own (--max-concurrent-watches). On the run's own task queue each Migration waiting with its
watch held one of a worker's activity slots for the whole wait: twenty of them (the default) left every other step
and undo (an undo_freeze, the source read-only meanwhile) waiting in the queue until an approval freed a slot."""
LONGEST_WAIT = timedelta(days=30)
"""No timer of the saga is longer, whatever a spec says: a longer one would overflow Temporal's durations."""


class RollbackRequested(Exception):
    """Leaves the forward path because someone (or a deadline policy) asked to roll back."""


class StepFailed(Exception):
    """Leaves the forward path because a step failed for good under the RollBack policy."""

    def __init__(self, step: str, error: str) -> None:
        super().__init__(f"step {step} failed: {error}")
        self.step = step


def _refused_by_the_gate(error: BaseException) -> bool:
    """Whether an activity's failure is the worker's gate refusing the run (worker/gate.py), not the work failing."""
    while error.__cause__ is not None and isinstance(error, ActivityError):
        error = error.__cause__
    return isinstance(error, ApplicationError) and error.type == NOT_BACKED


def error_text(error: BaseException) -> str:
    """The innermost message of an activity failure, which is what a person can act on.

    Scrubbed (ferry.api.scrubbing) although the worker's failure converter scrubbed it on
    its way into the history: a failure recorded by a worker from before that converter
    must not carry row values into the status either.
    """
    while error.__cause__ is not None and isinstance(error, ActivityError):
        error = error.__cause__
    if isinstance(error, ApplicationError) and error.type:
        return scrub(f"{error.type}: {error.message}")
    return scrub((str(error) or type(error).__name__) + _last_seen(error))


def _last_seen(error: BaseException) -> str:
    """What an activity that timed out last said it waited for (activities/waiting.py heartbeats it): a step timing
    out says "StatefulSet shop/orders-db-18 Ready: Pod orders-db-18-0 is not scheduled (...)", not the timeout alone."""
    details = error.last_heartbeat_details if isinstance(error, TimeoutFailure) else ()
    last = details[-1] if details else None
    if not isinstance(last, dict) or not last.get("waiting_for"):
        return ""
    counts = ", ".join(f"{key} {value}" for key, value in last.items() if key != "waiting_for")
    return f"; it was waiting for {last['waiting_for']}" + (f" ({counts})" if counts else "")


def is_permanent(error: BaseException, retry: Retry) -> bool:
    """Whether no further attempt can fix `error`: a non-retryable failure type, or one raised as such."""
    cause = error.__cause__ if isinstance(error, ActivityError) else error
    if isinstance(cause, ApplicationError):
        return cause.non_retryable or (cause.type or "") in retry.non_retryable
    return False


def bounded(seconds: int) -> timedelta:
    return min(timedelta(seconds=max(seconds, 0)), LONGEST_WAIT)


@dataclasses.dataclass
class Outcome:
    """How one activity call ended: a result, an error, and whether the saga was interrupted meanwhile."""

    result: ApiModel | None = None
    error: BaseException | None = None
    interruption: BaseException | None = None
    """RollbackRequested or the workflow's cancellation, raised once the call has stopped."""


@dataclasses.dataclass(frozen=True)
class UndoFailure:
    """Why an undo's attempts ended without undoing its step."""

    error: str
    """The last error, as a person reads it."""
    refused: bool
    """The undo's guard refused (its check failed), so the undo itself did not act."""
    kept: bool = False
    """The undo left a target that traffic may have reached as it is (TARGET_KEPT): it refused to empty it, or kept
    failing before it could compare it; nothing older may remove it."""


class Saga:
    """One run of a plan for one Migration: the steps started so far, their results, and the status."""

    def __init__(
        self,
        ref: MigrationRef,
        spec: MigrationSpec,
        steps: Sequence[Step[Any, Any]],
        status: SagaStatus,
        controls: Controls,
    ) -> None:
        self.context = Context(ref=ref, spec=spec, results=Results())
        self.steps = tuple(steps)
        self.status = status
        self.controls = controls
        self.started: list[Step[Any, Any]] = []
        self.checked_once: set[str] = set()
        """Steps whose guard of Guard.once has passed in this run: it is not run again before their later attempts."""
        self.leftovers: dict[str, str] = {}
        """Steps whose undo kept failing and that the way back went past (ROLLBACK_PAST_LEFTOVERS), with the undo's
        last error: what is left of them, until the step runs again or a later undo of it succeeds."""
        self.traffic_since_emptied = False
        """Whether a step that moves traffic to the target was started since an undo last emptied the target (set as
        it starts, or by `start_all`; its own undo leaves it set, and so does the way back to writes flowing, which
        drops the steps it undoes): the target may hold writes made while it had the traffic. See
        `_traffic_may_have_moved`."""
        self.writes_flow_while_waiting = False
        """Set by the patch WRITES_FLOW_WHILE_WAITING at the start of the run; runs from before keep the old waits."""
        self.backed_by_migration = False
        """Whether a status write has found this run's Migration alive: from then on the worker's gate lets the run's
        undos through even if the Migration goes away (worker/gate.py)."""
        self._mirroring = asyncio.Lock()
        self._events = 0
        self._coalescing: bool | None = None
        """Whether this run coalesces its status writes (decided at its first mirror; runs from before keep one
        write per transition)."""
        self._unmirrored: list[EventRecord] = []
        self._mirror_task: asyncio.Task[None] | None = None
        self._writing_again: asyncio.Task[None] | None = None
        """Tries again, from time to time, what failed writes left unwritten (STATUS_WRITTEN_AGAIN)."""
        self._indexed: tuple[str, str] | None = None
        meter = workflow.metric_meter()
        self._step_duration = meter.create_histogram_float(
            metrics.STEP_DURATION, "How long a saga step took, retries included", "s"
        )
        self._step_outcomes = meter.create_counter(metrics.STEPS, "Saga steps finished, by outcome")
        self._compensations = meter.create_counter(metrics.COMPENSATIONS, "Undos run, by outcome")
        self._write_downtime = meter.create_histogram_float(
            metrics.WRITE_DOWNTIME, "From the freeze's start until writes flowed again, by how", "s"
        )

    @property
    def ref(self) -> MigrationRef:
        return self.context.ref

    @property
    def spec(self) -> MigrationSpec:
        return self.context.spec

    # --- the forward path -------------------------------------------------------------------

    async def forward(self) -> bool:
        """Runs every step; raises RollbackRequested, StepFailed or the workflow's cancellation to leave early.

        Returns False when a dry run (spec.dryRun) stopped before the first step that changes something."""
        self.writes_flow_while_waiting = workflow.patched(WRITES_FLOW_WHILE_WAITING)
        self.controls.approval_gate = next((s.name for s in self.steps if self._asks_approval(s)), None)
        await self.transition(Phase.RUNNING, "migration started", "Started")
        index = 0
        while index < len(self.steps):
            step = self.steps[index]
            if self.spec.dry_run and not step.changes_nothing:
                return False
            self.controls.next_step = step.name
            self.controls.writes_stopped = self._writes_stopped_before(step)
            again = await self._hold_before(step)
            if again is None:
                again = await self._run_step(step)
            index = self.steps.index(again) if again is not None else index + 1
        self.controls.next_step = None
        if workflow.patched(ROLLBACK_AFTER_THE_LAST_STEP):
            # A rollback that came with the last step's result was accepted (and its sender told so): it is carried
            # out like any other. From here on the run has finished: nothing is left to pause, approve or roll back.
            self._raise_if_rollback_requested()
            self.controls.stage = Stage.FINISHED
        return True

    def _asks_approval(self, step: Step[Any, Any]) -> bool:
        if self.writes_flow_while_waiting:
            return step.needs_approval
        return step.name == StepName.SWITCH_TRAFFIC  # where runs from before the patch ask for it

    def _writes_stopped_before(self, step: Step[Any, Any]) -> bool:
        """Whether the source refuses writes while the saga stands before `step` (after the step that stops writes,
        up to the step that resumes them: the write-downtime window)."""
        names = [s.name for s in self.steps]
        stops = [i for i, s in enumerate(self.steps) if s.stops_writes]
        resumes = [i for i, s in enumerate(self.steps) if s.resumes_writes]
        if not stops or not resumes:
            return False
        return stops[0] < names.index(step.name) <= resumes[0]

    async def planned(self) -> MigrationResult:
        """Ends a dry run after its checks: nothing was changed, so nothing is undone."""
        self.controls.stage = Stage.FINISHED
        self.controls.next_step = None
        self.status.current_step = None
        await self.transition(
            Phase.PLANNED,
            "planned: every check passed and nothing was changed (spec.dryRun); status.plan says what a run would do",
            "Planned",
        )
        return MigrationResult(phase=Phase.PLANNED, message=self.status.message)

    async def succeed(self) -> MigrationResult:
        await self._apply_retention_after_success()
        self.controls.stage = Stage.FINISHED
        self.status.current_step = None
        await self.transition(Phase.SUCCEEDED, self._succeeded_message(), "Succeeded")
        return self.succeeded()

    def succeeds_at_once(self) -> bool:
        """Whether nothing is left to do before Succeeded (no snapshot to delete for retention), and the transition can
        be queued without waiting (status writes run beside the saga)."""
        deletes = self.status.snapshot is not None and not keep_after_success(
            self.spec.snapshot.retention.after_success
        )
        return not deletes and self._coalesces()

    def mark_succeeded(self) -> None:
        """What `succeed` does when `succeeds_at_once`, without waiting: the Succeeded transition goes into the same
        status write as the last step's end. `mirrored()` then waits for that write."""
        self.controls.stage = Stage.FINISHED
        self.status.current_step = None
        self.status.set_phase(Phase.SUCCEEDED, self._succeeded_message(), workflow.now())
        self._index()
        self._queue(self._event(self.status.message, "Succeeded", EventType.NORMAL, ""))

    def succeeded(self) -> MigrationResult:
        return MigrationResult(phase=Phase.SUCCEEDED, message=self.status.message, snapshot=self.status.snapshot)

    def _succeeded_message(self) -> str:
        target = self.spec.target.stateful_set
        return f"migrated {self.spec.source.stateful_set} to {target}; traffic goes to {target}"

    async def _hold_before(self, step: Step[Any, Any]) -> Step[Any, Any] | None:
        """Stops before `step` while paused, awaiting approval or soaking; leaves on a rollback request.

        Beside those waits runs the watch of the step they come after, if it has one (WATCH_WHILE_WAITING). Returns
        the step to go on from when the watch failed under failurePolicy Pause (see `_watch_failed`)."""
        watched = self._watched_before(step)
        if watched is None:
            await self._hold(step)
            return None
        return await self._hold_watched(step, watched)

    def _watched_before(self, step: Step[Any, Any]) -> Step[Any, Any] | None:
        """The succeeded step whose watch runs beside the waits before `step`: only if the saga is about to wait, and
        writes flow (`step` is at most the one that stops them)."""
        stops = next((s for s in self.steps if s.stops_writes), None)
        if stops is None or self.steps.index(step) > self.steps.index(stops) or not self._waits_before(step):
            return None
        watched: Step[Any, Any] | None = next(
            (
                s
                for s in reversed(self.started)
                if s.watch is not None
                and self.steps.index(s) < self.steps.index(step)
                and self.status.steps[s.name].state is StepState.SUCCEEDED
            ),
            None,
        )
        if watched is None or not workflow.patched(WATCH_WHILE_WAITING):
            return None
        return watched

    def _waits_before(self, step: Step[Any, Any]) -> bool:
        """Whether `_hold` will wait before `step` (a pause given during a wait is held within it)."""
        controls = self.controls
        return (
            (controls.pause_requested and not (self.writes_flow_while_waiting and controls.writes_stopped))
            or (self._asks_approval(step) and self.spec.approval.required and controls.approved_by is None)
            or bool(step.soaks_before and self.spec.soak_seconds)
        )

    async def _hold_watched(self, step: Step[Any, Any], watched: Step[Any, Any]) -> Step[Any, Any] | None:
        """`_hold` with `watched`'s watch beside it: one activity, heartbeating, however long the wait (the history
        does not grow with it), on the task queue of the run's watches (WATCHES_QUEUE); cancelled when the wait ends,
        which it ends itself by failing."""
        assert watched.watch is not None
        call = watched.watch.call(self.context, watched.name)
        # None: the run's own task queue, where runs without the patch scheduled (and retry) their watch.
        queue = watches_task_queue(workflow.info().task_queue) if workflow.patched(WATCHES_QUEUE) else None
        handle = workflow.start_activity(
            call.activity,
            call.argument,
            task_queue=queue,
            start_to_close_timeout=call.timeout,
            heartbeat_timeout=call.heartbeat,
            retry_policy=WATCH_RETRY,
            cancellation_type=ActivityCancellationType.TRY_CANCEL,
            summary=call.summary,
        )
        handle.add_done_callback(lambda done: done.cancelled() or done.exception())  # read here, or below
        hold = asyncio.ensure_future(self._hold(step))

        def watch_failed() -> bool:
            return handle.done() and not handle.cancelled() and handle.exception() is not None

        try:
            await workflow.wait_condition(lambda: hold.done() or watch_failed())
        finally:
            broke = not hold.done()  # else the wait ended first, or at the same time: the step goes on
            if broke:
                hold.cancel()  # the watch failed, or the workflow is being cancelled
            if not handle.done():
                handle.cancel()
        if not broke:
            await hold  # its end: done, or RollbackRequested
            return None
        await asyncio.wait([hold])
        failure = handle.exception()
        assert failure is not None
        return await self._watch_failed(step, watched, failure)

    async def _watch_failed(
        self, step: Step[Any, Any], watched: Step[Any, Any], failure: BaseException
    ) -> Step[Any, Any] | None:
        """The watch of `watched` failed while the saga waited before `step`: as if `watched` had failed for good.
        Under failurePolicy Pause, undoes back to it (its undo ends what broke) and waits for a person, then returns
        it, where a retry starts again; otherwise raises StepFailed, and the run rolls back."""
        name = watched.name
        error = f"broke while the saga waited before {step.name}: {error_text(failure)}"
        attempts = self.status.steps[name].attempts
        self.status.update_step(name, workflow.now(), state=StepState.FAILED, last_error=error)
        if self.spec.failure_policy is FailurePolicy.PAUSE:
            return await self._unstop_writes(watched, error, attempts, "so that nothing it left keeps running broken")
        await self.record(
            f"{name} {error}; rolling back", "BrokeWhileWaiting", EventType.WARNING, key=f"{name}.{attempts}.watch"
        )
        raise StepFailed(name, error) from failure

    async def _hold(self, step: Step[Any, Any]) -> None:
        """Waits before `step` while paused, awaiting approval or soaking; leaves on a rollback request."""
        self._raise_if_rollback_requested()
        await self._pause_if_asked(step)
        waited = False
        if self._asks_approval(step) and self.spec.approval.required:
            waited = self.controls.approved_by is None
            await self._await_approval(step.name)
        if step.soaks_before and self.spec.soak_seconds:
            waited = True
            self.status.current_step = step.name
            await self.transition(Phase.RUNNING, f"soaking for {self.spec.soak_seconds}s before {step.name}", "Soaking")
            await self._wait_or_rollback(bounded(self.spec.soak_seconds))
        if waited and self.controls.pause_requested and workflow.patched(PAUSE_AFTER_WAITS):
            await self._pause_if_asked(step)  # given during the wait: it holds now, before the step

    async def _pause_if_asked(self, step: Step[Any, Any]) -> None:
        """Waits before `step` while a pause is asked for, unless the source refuses writes (then it is held off)."""
        if self.controls.pause_requested and self.writes_flow_while_waiting and self.controls.writes_stopped:
            if not self.controls.pause_held_off:
                self.controls.pause_held_off = True
                await self.record(
                    "pause held off: the source refuses writes until switch-traffic has moved the traffic, and a "
                    "pause now would keep it so; the saga pauses once writes flow again (roll back to stop sooner)",
                    "PauseHeldOff",
                )
        elif self.controls.pause_requested:
            self.controls.pause_held_off = False
            self.status.current_step = step.name
            await self.transition(Phase.PAUSED, f"paused before {step.name}; send resume to go on", "Paused")
            await workflow.wait_condition(
                lambda: not self.controls.pause_requested or self.controls.rollback is not None
            )
            self._raise_if_rollback_requested()
            await self.transition(Phase.RUNNING, f"resumed before {step.name}", "Resumed")

    async def _await_approval(self, step: str) -> None:
        controls = self.controls
        if controls.approved_by is None:
            deadline = self.spec.approval.deadline_seconds
            waiting = f"waiting for approval before {step}{f' (deadline {deadline}s)' if deadline else ''}"
            self.status.current_step = step
            await self.transition(Phase.AWAITING_APPROVAL, waiting, "AwaitingApproval")
            answered = await self._wait_until(
                lambda: controls.approved_by is not None or controls.rollback is not None,
                bounded(deadline) if deadline else None,
            )
            self._raise_if_rollback_requested()
            if not answered:
                controls.approval_settled = True
                if self.spec.approval.on_deadline is DeadlinePolicy.ROLL_BACK:
                    raise RollbackRequested(f"no approval within {deadline}s (onDeadline: RollBack)")
                controls.approved_by = f"nobody: the {deadline}s deadline passed (onDeadline: Proceed)"
        controls.approval_settled = True
        self.status.approved_by = controls.approved_by
        await self.transition(Phase.RUNNING, f"approved by {controls.approved_by}", "Approved")

    async def _run_step(self, step: Step[Any, Any]) -> Step[Any, Any] | None:
        """Runs `step` until it succeeds, or its failure counts (then the failure policy decides).

        Returns the step to go on from when it is not the next one (failurePolicy Pause undid the saga back to
        before the step that stops writes; see `_unstop_writes`)."""
        name = step.name
        if not self._coalesces():
            self._start(step)
        attempt = 0
        while True:
            attempt += 1
            previous = self.status.steps[name]
            retrying = previous.state is StepState.RETRYING
            entry = self.status.update_step(
                name,
                workflow.now(),
                state=StepState.RUNNING,
                last_error=previous.last_error if retrying else None,
                started_at=previous.started_at if retrying else workflow.now(),
            )
            self.status.current_step = name
            if step.stops_writes:
                self._writes_stop()
            await self.transition(
                Phase.RUNNING,
                f"{name}: running (attempt {entry.attempts})",
                "StepStarted",
                key=f"{name}.{entry.attempts}",
            )
            if self._coalesces():
                await self._shown_starting()
                if step not in self.started:
                    self._start(step)
            error, failure = await self._attempt(step)
            if error is None:
                self.leftovers.pop(name, None)  # it ran again over what its failed undo left
                self._count(name, entry.started_at, "succeeded")
                self.status.update_step(name, workflow.now(), state=StepState.SUCCEEDED, last_error=None)
                if step.resumes_writes:
                    self._writes_flow("traffic moved")
                await self.transition(
                    Phase.RUNNING, f"{name}: succeeded", "StepSucceeded", key=f"{name}.{entry.attempts}"
                )
                return None
            permanent = failure is None or is_permanent(failure, step.retry)
            if not permanent and attempt < step.retry.attempts:
                delay = step.retry.delay(attempt)
                self.status.update_step(name, workflow.now(), state=StepState.RETRYING, last_error=error)
                await self.transition(
                    Phase.RUNNING,
                    f"{name}: attempt {entry.attempts} failed: {error}; "
                    f"attempt {attempt + 1} of {step.retry.attempts} in {delay.total_seconds():g}s",
                    "StepRetrying",
                    EventType.WARNING,
                    key=f"{name}.{entry.attempts}",
                )
                await self._wait_or_rollback(delay)
                continue
            self._count(name, entry.started_at, "failed")
            tries = f" (after {attempt} attempts)" if attempt > 1 else ""
            self.status.update_step(name, workflow.now(), state=StepState.FAILED, last_error=error)
            if self.spec.failure_policy is FailurePolicy.PAUSE and self._stops_writes_at(step):
                return await self._unstop_writes(step, f"{error}{tries}", entry.attempts)
            if self.spec.failure_policy is FailurePolicy.PAUSE:
                await self._await_decision(name, f"{error}{tries}", entry.attempts)
                attempt = 0
                continue
            await self.record(
                f"{name} failed{tries}: {error}; rolling back",
                "StepFailed",
                EventType.WARNING,
                key=f"{name}.{entry.attempts}",
            )
            raise StepFailed(name, f"{error}{tries}") from failure

    async def _attempt(self, step: Step[Any, Any]) -> tuple[str | None, BaseException | None]:
        """One attempt: the guard, then the activity. Returns (why it failed, the failure), (None, None) if not."""
        guard = step.guard_call(self.context)
        once = step.guard is not None and step.guard.once
        if guard is not None and not (once and step.name in self.checked_once):
            checked = await self._call(guard)
            if checked.interruption is not None:
                await self._interrupted(step.name, None)
                raise checked.interruption
            if checked.error is not None:
                return error_text(checked.error), checked.error
            if once:
                self.checked_once.add(step.name)
        self.context.called.add(step.name)
        outcome = await self._call(step.call(self.context))
        reason = None
        if outcome.error is None and outcome.result is not None:
            reason = step.accept(self.context, outcome.result, self.status)
        if outcome.interruption is not None:
            await self._interrupted(step.name, outcome if outcome.error is None and reason is None else None)
            raise outcome.interruption
        if outcome.error is not None:
            return error_text(outcome.error), outcome.error
        return reason, None

    async def _interrupted(self, step: str, completed: Outcome | None) -> None:
        """Records how a step that a rollback or cancellation stopped ended: done anyway, or not."""
        why = self.controls.rollback_reason() or "the workflow was cancelled"
        if completed is not None:
            self.status.update_step(step, workflow.now(), state=StepState.SUCCEEDED, last_error=None)
            workflow.logger.info("%s completed while being stopped (%s); its undo will run", step, why)
        else:
            self.status.update_step(step, workflow.now(), state=StepState.FAILED, last_error=f"interrupted: {why}")

    async def _call(self, call: Call) -> Outcome:
        """Runs one activity once; a rollback request or the workflow's cancellation stops it and waits until it has."""
        handle = workflow.start_activity(
            call.activity,
            call.argument,
            result_type=call.result_type,
            start_to_close_timeout=call.timeout,
            heartbeat_timeout=call.heartbeat,
            retry_policy=ONE_ATTEMPT,
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=call.summary,
        )
        interruption: BaseException | None = None
        try:
            await workflow.wait_condition(lambda: handle.done() or self.controls.rollback is not None)
        except BaseException as cancelled:  # the workflow itself is being cancelled
            if not is_cancelled_exception(cancelled):
                raise
            interruption = cancelled
        if interruption is None and not handle.done():
            interruption = RollbackRequested(self.controls.rollback_reason())
        if interruption is not None and not handle.done():
            handle.cancel()
        try:
            result = await handle
        except BaseException as error:
            if interruption is None and not isinstance(error, ActivityError):
                raise
            return Outcome(error=error, interruption=interruption)
        return Outcome(result=result, interruption=interruption)

    def _writes_stop(self) -> None:
        """Opens the write-downtime window (once: a retry of the freeze is part of the same window)."""
        window = self.status.write_downtime
        if window is None or window.ended_at is not None:
            self.status.write_downtime = WriteDowntimeStatus(started_at=workflow.now())

    def _writes_flow(self, how: str) -> None:
        """Closes the write-downtime window, in the status and in the metric."""
        window = self.status.write_downtime
        if window is None or window.ended_at is not None:
            return
        now = workflow.now()
        seconds = max(0.0, (now - window.started_at).total_seconds())
        self.status.write_downtime = window.model_copy(update={"ended_at": now, "seconds": seconds, "ended_by": how})
        self._write_downtime.record(seconds, {"outcome": "moved" if how == "traffic moved" else "undone"})

    def _stops_writes_at(self, step: Step[Any, Any]) -> bool:
        """Whether writes may be stopped once `step` has failed: it stops them, or runs while they are stopped."""
        stops = next((s for s in self.steps if s.stops_writes), None)
        return self.writes_flow_while_waiting and (step is stops or self._writes_stopped_before(step))

    async def _unstop_writes(
        self,
        failed: Step[Any, Any],
        error: str,
        attempt: int,
        why: str = "so the source takes writes while this waits",
    ) -> Step[Any, Any]:
        """failurePolicy Pause while the source refuses writes: undoes every started step back to (and with) the one
        that stopped them, newest first, so writes flow while a person decides; returns that step, where a retry
        starts again (a copy taken before the pause would miss the writes made during it). A plan whose copy starts
        before that step (Step.starts_the_copy) is undone back to the copy's start instead, and retried from there."""
        restart = next((s for s in self.steps if s.starts_the_copy), None) or next(
            s for s in self.steps if s.stops_writes
        )
        first = self.steps.index(restart)
        back = [s for s in reversed(self.started) if self.steps.index(s) >= first]
        reason = f"{failed.name} failed: {error}"
        await self.record(
            f"{reason}; undoing back to before {restart.name}, {why}",
            "StepFailed",
            EventType.WARNING,
            key=f"{failed.name}.{attempt}",
        )
        if workflow.patched(UNDOS_FINISH_WHEN_CANCELLED):
            _, cancelled = await self._shielded(self._undo_back(back, first, reason), "undo back to writes flowing")
            if cancelled:
                # What is left of the run (the steps before `restart`) is rolled back by the workflow's handler of
                # its cancellation, as from any other point.
                raise asyncio.CancelledError(f"the workflow was cancelled while {failed.name}'s failure was undone")
        else:
            await self._undo_back(back, first, reason)
        left = f"; not undone: {self._leftovers()}, and a retry may fail on what is left" if self.leftovers else ""
        await self._await_decision(
            failed.name,
            f"{error}; the source takes writes again (undone back to before {restart.name}), so retry runs again from "
            f"{restart.name}{left}",
            attempt,
        )
        return restart

    async def _undo_back(self, back: list[Step[Any, Any]], first: int, reason: str) -> None:
        """Undoes `back` (started steps, newest first) so that writes flow; a failed undo stops the run there."""
        for index, step in enumerate(back):
            call = step.undo_call(self.context)
            failure = await self._undo(step, call) if call is not None else None
            if failure is not None and self._goes_past(step, failure):
                # What it left (the target's data, the object) is emptied or overwritten when the step runs again;
                # a rollback instead reports it.
                failure = None
            if failure is not None:
                self.controls.stage = Stage.ROLLING_BACK
                left = [s.name for s in back[index + 1 :]] + [
                    s.name for s in reversed(self.started) if self.steps.index(s) < first and s.undo is not None
                ]
                await self._stop_rollback(reason, step.name, failure, left)
            self.started.remove(step)

    async def _await_decision(self, step: str, error: str, attempt: int) -> None:
        """failurePolicy Pause: hold until a person sends retry (returns) or rollback (raises)."""
        self.controls.awaiting_decision = step
        self.controls.retry_requested = False
        self.status.current_step = step
        await self.transition(
            Phase.PAUSED,
            f"{step} failed: {error}; send retry to run it again, or rollback to undo the started steps",
            "StepFailed",
            EventType.WARNING,
            key=f"{step}.{attempt}",
        )
        await workflow.wait_condition(lambda: self.controls.retry_requested or self.controls.rollback is not None)
        self.controls.awaiting_decision = None
        self._raise_if_rollback_requested()

    async def _wait_until(self, condition: Callable[[], bool], limit: timedelta | None) -> bool:
        """True when `condition` held before `limit` passed (None: wait as long as it takes)."""
        try:
            await workflow.wait_condition(condition, timeout=limit)
        except TimeoutError:
            return False
        return True

    async def _wait_or_rollback(self, delay: timedelta) -> None:
        if await self._wait_until(lambda: self.controls.rollback is not None, delay):
            self._raise_if_rollback_requested()

    def _raise_if_rollback_requested(self) -> None:
        reason = self.controls.rollback_reason()
        if reason is not None:
            raise RollbackRequested(reason)

    def _count(self, step: str, started: datetime | None, outcome: str) -> None:
        labels = {"step": step, "outcome": outcome}
        self._step_outcomes.add(1, labels)
        if started is not None:
            self._step_duration.record((workflow.now() - started).total_seconds(), labels)

    async def _apply_retention_after_success(self) -> None:
        snapshot = self.status.snapshot
        if snapshot is None or keep_after_success(self.spec.snapshot.retention.after_success):
            return
        artifact = self.context.results.require(plan.SNAPSHOT)
        try:
            await workflow.execute_activity(
                SnapshotStoreActivity.DELETE_SNAPSHOT.value,
                DeleteSnapshotInput(ref=self.ref, snapshot=self.spec.snapshot, artifact=artifact),
                start_to_close_timeout=RETENTION_TIMEOUT,
                retry_policy=UNDO_RETRY.as_policy(),
                summary=f"{self.ref}: delete snapshot (retention)",
            )
        except ActivityError as error:
            if is_cancelled_exception(error):
                raise
            # The migration itself succeeded; a leftover object is reported, not rolled back.
            await self.record(
                f"could not delete the snapshot: {error_text(error)}", "RetentionFailed", EventType.WARNING
            )
            return
        self.status.snapshot = snapshot.model_copy(update={"deleted": True})

    # --- the way back -------------------------------------------------------------------------

    async def shielded(self, work: Coroutine[Any, Any, T], what: str) -> tuple[T, bool]:
        """Runs `work` to its end even if the workflow is cancelled meanwhile: its result, and whether it was.

        Unlike `_shielded` (kept as it is for the histories of the paths that use it), a cancellation that comes in
        the same activation as `work`'s end is ignored too: `work` has done what it was for.
        """
        task = asyncio.ensure_future(work)
        cancelled = False
        while True:
            try:
                return await asyncio.shield(task), cancelled
            except asyncio.CancelledError:
                if task.done() and task.cancelled():
                    raise
                cancelled = True
                workflow.logger.info("cancellation requested during the %s of %s; it goes on", what, self.ref)
                if task.done():
                    return task.result(), cancelled

    async def shielded_roll_back(self, reason: str) -> MigrationResult:
        """Runs the rollback to its end even if the workflow is cancelled meanwhile."""
        result, _ = await self._shielded(self._roll_back(reason), "rollback")
        return result

    async def _shielded(self, work: Coroutine[Any, Any, T], what: str) -> tuple[T, bool]:
        """Runs `work` to its end even if the workflow is cancelled meanwhile: its result, and whether it was."""
        task = asyncio.ensure_future(work)
        cancelled = False
        while True:
            try:
                return await asyncio.shield(task), cancelled
            except asyncio.CancelledError:
                if task.done():
                    raise
                cancelled = True
                workflow.logger.info("cancellation requested during the %s of %s; it goes on", what, self.ref)

    async def _roll_back(self, reason: str) -> MigrationResult:
        self.controls.stage = Stage.ROLLING_BACK
        self.status.current_step = None
        for name, entry in self.status.steps.items():
            if entry.state in (StepState.RUNNING, StepState.RETRYING):
                self.status.update_step(
                    name, workflow.now(), state=StepState.FAILED, last_error=f"interrupted: {reason}"
                )
        await self.transition(Phase.ROLLING_BACK, f"rolling back: {reason}", "RollingBack", EventType.WARNING)
        pending = [step for step in reversed(self.started) if step.undo is not None]
        while pending:
            step = pending.pop(0)
            call = step.undo_call(self.context)
            failure = await self._undo(step, call) if call is not None else None
            if failure is None or self._goes_past(step, failure):
                continue
            # Older steps' undos would pull the ground from under this one (e.g. remove the
            # target while the Service still sends it traffic): the rollback stops here.
            await self._stop_rollback(reason, step.name, failure, [left.name for left in pending])
        self.status.current_step = None
        self.controls.stage = Stage.FINISHED
        if self.leftovers:
            message = (
                f"rolled back after {reason}, but not undone: {self._leftovers()}. The source takes writes again "
                "and its clients' traffic goes to it; remove what is left by hand (see the README's recovery section)"
            )
            await self.transition(Phase.FAILED, message, "RollbackIncomplete", EventType.WARNING)
            raise ApplicationError(message, type="RollbackIncomplete", non_retryable=True)
        await self.transition(Phase.ROLLED_BACK, f"rolled back: {reason}", "RolledBack")
        return MigrationResult(phase=Phase.ROLLED_BACK, message=self.status.message, snapshot=self.status.snapshot)

    def _goes_past(self, step: Step[Any, Any], failure: UndoFailure) -> bool:
        """Whether the way back goes on past `step`, whose undo failed: nothing older depends on it, and neither its
        own check nor the undo refused (a refusal stops everything, as the check requires), nor did it leave a target
        that may hold writes only it has."""
        if failure.refused or failure.kept or step.undo is None or step.undo.blocks_older:
            return False
        if not workflow.patched(ROLLBACK_PAST_LEFTOVERS):
            return False
        self.leftovers[step.name] = failure.error
        return True

    def _leftovers(self) -> str:
        return ", ".join(f"{step} ({error})" for step, error in self.leftovers.items())

    def _keeps_the_target(self, step: Step[Any, Any], failure: ActivityError) -> bool:
        """Whether `step`'s undo, failed for good, left a target traffic may have reached that nothing older may remove
        (TARGET_KEPT): it refused to destroy writes (KEEPS_THE_TARGET), or to empty a target a Service sends the
        clients to (SERVED), or it empties the target and traffic may have reached it since it was last emptied, so the
        target may hold writes nobody compared."""
        cause = failure.__cause__
        kind = (cause.type or "") if isinstance(cause, ApplicationError) else ""
        empties = step.undo is not None and step.undo.empties_target
        refused = kind in KEEPS_THE_TARGET or (kind == SERVED and empties)
        unchecked = empties and self._traffic_may_have_moved()
        return (refused or unchecked) and workflow.patched(TARGET_KEPT)

    def start_all(self, steps: Sequence[Step[Any, Any]]) -> None:
        """Counts every step as started, as the undo of a finished run does: each one's undo runs on the way back."""
        for step in steps:
            self._start(step)
            self.context.called.add(step.name)

    def _start(self, step: Step[Any, Any]) -> None:
        self.started.append(step)  # from now on its undo runs on the way back, whatever happens
        if step.resumes_writes:
            self.traffic_since_emptied = True

    def _traffic_may_have_moved(self) -> bool:
        """Whether traffic may have reached the target since an undo last emptied it (`traffic_since_emptied`): a step
        that moves it was started since (every step is, in the undo after success), whether or not that step's own
        undo has sent the traffic back (a pooled connection may write to the target after the check before it).

        Runs without the marker of TRAFFIC_SINCE_EMPTIED keep the old answer: such a step is started, or its status
        says it ran, which stays so after a later undo emptied the target (within a rollback, and across
        failurePolicy Pause's cycles). The old answer is true whenever the new one is, so the patch is asked only
        where they differ."""
        steps = self.status.steps
        old = any(
            s.resumes_writes
            and (s in self.started or (s.name in steps and steps[s.name].state is not StepState.PENDING))
            for s in self.steps
        )
        if old == self.traffic_since_emptied:
            return old
        return self.traffic_since_emptied if workflow.patched(TRAFFIC_SINCE_EMPTIED) else old

    async def _stop_rollback(self, reason: str, step: str, failure: UndoFailure, left: list[str]) -> None:
        self.status.current_step = None
        self.controls.stage = Stage.FINISHED
        if failure.kept:
            message = (
                f"rollback stopped after {reason}: the undo of {step} left the target as it is ({failure.error}). "
                "Traffic moved to the target, and what it took since may be there alone, so nothing older is undone "
                f"(which would remove the target): {', '.join([step, *left])}. Stop the clients' writes to the "
                "target, copy what it took since the switch into the source, then empty the target and finish the "
                "rollback by hand, newest step first (see the README's recovery section)"
            )
        elif failure.refused:
            message = (
                f"rollback stopped after {reason}: the check before undoing {step} failed ({failure.error}); "
                f"not undone, as the check requires: {', '.join([step, *left])}"
            )
        else:
            not_undone = f"; not undone, so as not to act on what depends on it: {', '.join(left)}" if left else ""
            message = (
                f"rollback stopped after {reason}: the undo of {step} kept failing ({failure.error}){not_undone}. "
                "Fix the cause and finish the undo by hand, newest step first (see the README's recovery section)"
            )
        if self.leftovers:
            message += f"; also not undone: {self._leftovers()}"
        await self.transition(Phase.FAILED, message, "RollbackIncomplete", EventType.WARNING)
        raise ApplicationError(message, type="RollbackIncomplete", non_retryable=True)

    @staticmethod
    def _undo_gives_up(failure: ActivityError, retry: Retry) -> bool:
        """Whether a failed attempt of an undo (or of its check) is its last: a permanent failure, but for those
        RETRIED_BY_UNDOS under the patch UNDOS_RETRY_UNREACHABLE."""
        if not is_permanent(failure, retry):
            return False
        cause = failure.__cause__
        retried = isinstance(cause, ApplicationError) and cause.type in RETRIED_BY_UNDOS
        return not (retried and workflow.patched(UNDOS_RETRY_UNREACHABLE))

    async def _undo(self, step: Step[Any, Any], call: Call) -> UndoFailure | None:
        """Runs a step's undo (its guard first, at every attempt) until it succeeds or its attempts are spent.

        Returns why it did not succeed, if its attempts were spent or a failure was permanent.
        """
        assert step.undo is not None
        retry, name = step.undo.retry, step.name
        last, attempt = retry.attempts, 0
        while True:
            attempt += 1
            entry = self.status.update_step(
                name,
                workflow.now(),
                state=StepState.COMPENSATING,
                undo_attempts=self.status.steps[name].undo_attempts + 1,
            )
            self.status.current_step = name
            tries = f" (attempt {attempt})" if attempt > 1 else ""
            await self.transition(
                Phase.ROLLING_BACK, f"undoing {name}{tries}", "CompensationStarted", key=f"{name}.{entry.undo_attempts}"
            )
            guard = step.undo_guard_call(self.context)
            patch = step.undo.guard.patch if step.undo is not None and step.undo.guard is not None else None
            if guard is not None and patch is not None and not workflow.patched(patch):
                guard = None
            checking = guard is not None
            try:
                if guard is not None:
                    checked = await self._call_once(guard)
                    if step.resumes_writes and isinstance(checked, CheckUnwrittenResult) and checked.no_traffic_moved:
                        self._no_traffic_moved(step)
                checking = False
                result = await self._call_once(call)
            except ActivityError as failure:
                error = error_text(failure)
                what = f"the check before undoing {name}" if checking else f"undo of {name}"
                self.status.update_step(
                    name, workflow.now(), last_error=f"{'check before undo' if checking else 'undo'}: {error}"
                )
                gives_up = self._undo_gives_up(failure, retry)
                if not gives_up and attempt == retry.attempts and self._persists(step):
                    last += PERSISTING_ATTEMPTS
                if gives_up or attempt >= last:
                    self._compensations.add(1, {"step": name, "outcome": "failed"})
                    self.status.update_step(name, workflow.now(), state=StepState.COMPENSATION_FAILED)
                    await self.record(f"{what} failed: {error}", "CompensationFailed", EventType.WARNING, key=str(name))
                    kept = not checking and self._keeps_the_target(step, failure)
                    return UndoFailure(error=error, refused=checking, kept=kept)
                delay = retry.delay(attempt) if attempt < retry.attempts else PERSISTING_DELAY
                waiting = "; writes to the source stay stopped until it succeeds" if attempt >= retry.attempts else ""
                await self.record(
                    f"{what}: attempt {attempt} failed: {error}; "
                    f"attempt {attempt + 1} of {last} in {delay.total_seconds():g}s{waiting}",
                    "CompensationRetrying",
                    EventType.WARNING,
                    key=f"{name}.{entry.undo_attempts}",
                )
                await workflow.sleep(delay)
                continue
            step.undone(result, self.status)
            self.leftovers.pop(name, None)
            if step.undo.empties_target:
                self.traffic_since_emptied = False  # it compared the target with verify's mark before emptying it
            if step.stops_writes:
                self._writes_flow("freeze undone")
            self._compensations.add(1, {"step": name, "outcome": "succeeded"})
            self.status.update_step(name, workflow.now(), state=StepState.COMPENSATED)
            await self.record(f"undid {name}", "StepCompensated", key=str(name))
            return None

    def _no_traffic_moved(self, step: Step[Any, Any]) -> None:
        """The check before `step`'s undo found that this Migration never moved the traffic: it did not reach the
        target (NO_TRAFFIC_MOVED). Older workers never said so, so no recorded run asks the patch."""
        if self.traffic_since_emptied and workflow.patched(NO_TRAFFIC_MOVED):
            workflow.logger.info("%s moved no traffic: the target took none of the clients' writes", step.name)
            self.traffic_since_emptied = False

    @staticmethod
    def _persists(step: Step[Any, Any]) -> bool:
        """Whether `step`'s undo, its own attempts spent, goes on being tried (UNDOS_THAT_LET_WRITES_IN_PERSIST)."""
        return step.undo is not None and step.undo.persists and workflow.patched(UNDOS_THAT_LET_WRITES_IN_PERSIST)

    async def _call_once(self, call: Call) -> Any:
        """Runs one activity of the way back once; the rollback is shielded, so nothing interrupts it."""
        return await workflow.execute_activity(
            call.activity,
            call.argument,
            result_type=call.result_type,
            start_to_close_timeout=call.timeout,
            heartbeat_timeout=call.heartbeat,
            retry_policy=ONE_ATTEMPT,
            summary=call.summary,
        )

    # --- mirroring ----------------------------------------------------------------------------

    async def transition(
        self, phase: Phase, message: str, reason: str, kind: EventType = EventType.NORMAL, key: str = ""
    ) -> None:
        """Moves to `phase` and mirrors the new status into the resource, with one Event."""
        self.status.set_phase(phase, message, workflow.now())
        self._index()
        await self.record(message, reason, kind, key)

    async def record(self, message: str, reason: str, kind: EventType = EventType.NORMAL, key: str = "") -> None:
        """Mirrors the newest status with an Event. Mirrors run one at a time, so none overtakes a newer one.

        Since COALESCED_MIRRORS the saga does not wait for the write here: one write at a time
        runs beside the saga, and every transition made while a write was under way goes
        into the next one (the newest status, and each of their Events, oldest first). A
        step's end and the next step's start are one write, which the saga waits for before
        that step's activity runs (`_shown_starting`); a final phase's write is waited for,
        so a run ends with its status mirrored. A write that failed for good is written again
        (STATUS_WRITTEN_AGAIN): with the next transition's, or after a while if none comes, as
        while the saga waits for a person.
        """
        if not self._coalesces():
            async with self._mirroring:
                await self._mirror(self._event(message, reason, kind, key), [])
            return
        self._queue(self._event(message, reason, kind, key))
        if self.status.phase.finished:
            await self.mirrored()

    def _queue(self, event: EventRecord) -> None:
        """Puts `event` with the newest status into the next write, and starts one unless one is under way."""
        self._unmirrored.append(event)
        if self._mirror_task is None or self._mirror_task.done():
            self._mirror_task = asyncio.create_task(self._mirror_unmirrored())

    def _event(self, message: str, reason: str, kind: EventType, key: str) -> EventRecord:
        """The Event of one transition, keyed by the run and its place in the run: a retried write records it once,
        and a later run's is never taken for an earlier run's (activities/events.py names an Event after its key, and
        records nothing where one has that name). A run reset (`temporal workflow reset`) counts its transitions
        again from the reset point, and the undo workflow's from one, so the place alone would repeat keys the run
        before them recorded, and their Events would be lost. Only the Event's name depends on the run, no command,
        so a reset run replays its copied history (tests/workflows/test_versions.py)."""
        self._events += 1
        run = workflow.info().run_id
        return EventRecord(type=kind, reason=reason, message=message, key=f"{run}.{self._events}.{reason}.{key}")

    def _coalesces(self) -> bool:
        if self._coalescing is None:
            self._coalescing = workflow.patched(COALESCED_MIRRORS)
        return self._coalescing

    async def _shown_starting(self) -> None:
        """Waits for the write that shows a step starting (with the previous step's end, in one write), then leaves
        if a rollback came meanwhile or that write found the Migration gone: no step starts for nobody."""
        await self.mirrored()
        self._raise_if_rollback_requested()

    async def mirrored(self) -> None:
        """Returns once every transition so far is mirrored (at once for runs that mirror as they go), or its write
        failed for good: then what it carried is written later (`_write_again`), unless the run is finishing, whose
        last write is tried until it lands (`_mirror`)."""
        while self._mirror_task is not None and not self._mirror_task.done():
            await asyncio.shield(self._mirror_task)

    async def _mirror_unmirrored(self, retry: RetryPolicy = MIRROR_RETRY) -> None:
        """Writes the newest status with every Event not yet recorded, until none is left.

        A write that failed for good (STATUS_WRITTEN_AGAIN) puts its Events back in front: a transition made while it
        was under way is written at once with them; otherwise they wait for `_write_again`. `retry` is the first
        write's (a try of `_write_again` is one attempt: the loop that started it spaces its tries)."""
        while self._unmirrored:
            *earlier, newest = self._unmirrored
            self._unmirrored = []
            failed = await self._mirror(newest, earlier, retry)
            retry = MIRROR_RETRY
            if not failed or not workflow.patched(STATUS_WRITTEN_AGAIN):
                continue
            newer = bool(self._unmirrored)
            self._unmirrored = [*earlier, newest, *self._unmirrored]
            if not newer:
                if self._writing_again is None or self._writing_again.done():
                    self._writing_again = asyncio.create_task(self._write_again())
                return

    async def _write_again(self) -> None:
        """Tries the newest status again, with what failed writes left, after STATUS_RETRY's waits (doubling to its
        cap), until a write lands, its own or a newer transition's. A durable timer between tries, never a poll:
        while the saga waits for a person, this is what makes the Migration say so."""
        wait = STATUS_RETRY[0]
        while self._unmirrored:
            await workflow.sleep(wait)
            await self.mirrored()  # a newer transition's write, which carries them too
            if not self._unmirrored:
                return
            self._mirror_task = asyncio.create_task(self._mirror_unmirrored(ONE_ATTEMPT))
            await self.mirrored()
            wait = min(wait * 2, STATUS_RETRY[1])

    async def _mirror(self, event: EventRecord, earlier: list[EventRecord], retry: RetryPolicy = MIRROR_RETRY) -> bool:
        """Writes the newest status with `earlier` and `event`; True when the write failed for good and trying it again
        may help (not the run's last write, which is tried here until it lands; nor a write the worker's gate
        refused, as it refuses every write of this run alike)."""
        # Coalescing runs write as a local activity: run by the worker that runs this workflow task, with slots of
        # its own, so a status write never queues behind snapshots and restores for an activity slot, and costs the
        # history one marker instead of an activity's three events and a workflow task's three.
        execute = workflow.execute_local_activity if self._coalesces() else workflow.execute_activity
        wait = FINAL_STATUS_RETRY[0]
        while True:
            try:
                mirrored = await execute(
                    KubeActivity.MIRROR_STATUS.value,
                    MirrorStatusInput(ref=self.ref, status=self.status.to_model(), event=event, earlier_events=earlier),
                    result_type=MirrorStatusResult,
                    start_to_close_timeout=MIRROR_TIMEOUT,
                    retry_policy=retry,
                    summary=f"{self.ref}: status {self.status.phase}, {event.reason}",
                )
                break
            except FailureError as error:
                if is_cancelled_exception(error):
                    raise
                # A local activity's failure is its ApplicationError itself; runs from before the patch failed on it.
                caught = isinstance(error, ActivityError) or workflow.patched(STATUS_WRITES_NEVER_END_THE_RUN)
                if not caught:
                    raise
                workflow.logger.warning("could not mirror the status of %s: %s", self.ref, error_text(error))
                final = self.status.phase is not None and self.status.phase.finished
                refused = _refused_by_the_gate(error)  # every write of this run alike: trying again changes nothing
                if not final:
                    return not refused
                if refused or not workflow.patched(STATUS_WRITES_NEVER_END_THE_RUN):
                    return False
                await workflow.sleep(wait)  # the run's last word: nothing writes the status after it
                wait = min(wait * 2, FINAL_STATUS_RETRY[1])
        if mirrored.found:
            # A reset run replays its earlier run's writes: they found the Migration for that run, not for this one,
            # whose own first write must find it (a closed run reset after its Migration was deleted finds none, and
            # its undos stay refused by the gate). Only the gate reads this, in the activities' headers: no command
            # depends on it, so a reset run replays its copied history the same.
            info = workflow.info()
            written_for = mirrored.run_id or info.first_execution_run_id  # an older worker's: the run it began as
            if written_for == info.run_id:
                self.backed_by_migration = True
        else:
            self._orphaned()
        return False

    def _orphaned(self) -> None:
        """The Migration this run works for is gone, or is another object now: nobody asked for this run any more.

        That happens when a start whose outcome its sender did not learn lands after the
        Migration was deleted (the watcher then found no run and let the Migration go), or
        when someone removed the finalizer by hand. The run undoes what it started, as if
        asked to roll back; it does not go on migrating for nobody.
        """
        if self.controls.stage is Stage.FORWARD and self.controls.rollback is None:
            workflow.logger.warning("Migration %s is gone: undoing what this run started", self.ref)
            self.controls.rollback = ControlRequest(
                by="ferry", reason="the Migration is gone (deleted, or created again under the same name)"
            )

    def _index(self) -> None:
        """Keeps the run's search attributes in step with its phase, so the UI and CLI can filter on them."""
        step = self.status.current_step or ""
        indexed = (self.status.phase.value, step)
        if indexed == self._indexed:
            return
        updates: list[SearchAttributeUpdate[Any]] = [
            search_attributes.PHASE.value_set(indexed[0]),
            search_attributes.STEP.value_set(indexed[1]),
        ]
        if self._indexed is None:
            updates += [
                search_attributes.MIGRATION_NAMESPACE.value_set(self.ref.namespace),
                search_attributes.MIGRATION_NAME.value_set(self.ref.name),
            ]
        workflow.upsert_search_attributes(updates)
        self._indexed = indexed
