"""What a saga step is: one typed object that knows everything about its step.

A `Step` names the activity it calls (its input and result models), builds that input
from the Migration's spec and earlier steps' results, names its undo and builds the
undo's input (with the step's result, or without one when the step was interrupted or
its outcome is unknown), and says how long an attempt may take, how often to try, what
must hold before it runs (a guard) and before its undo runs (the undo's guard), whether
a person or a soak time holds it, and what it adds to the status. The saga
(workflows/saga.py) is one loop over these; the plan (workflows/plan.py) lists them in
order.

Deterministic: nothing here does I/O, so workflow code imports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Generic, TypeVar

from temporalio.common import RetryPolicy

from ferry.api.errors import NON_RETRYABLE_TYPES
from ferry.api.migration import ApiModel, MigrationSpec
from ferry.api.saga import (
    HEARTBEAT_TIMEOUT_SECONDS,
    DriverOperation,
    KubeActivity,
    MigrationRef,
    SnapshotStoreActivity,
    driver_activity,
)
from workflows.status import SagaStatus

I = TypeVar("I", bound=ApiModel)  # noqa: E741 - the input, beside R for the result
R = TypeVar("R", bound=ApiModel)
U = TypeVar("U", bound=ApiModel)
UR = TypeVar("UR", bound=ApiModel)
G = TypeVar("G", bound=ApiModel)

HEARTBEAT_TIMEOUT = timedelta(seconds=HEARTBEAT_TIMEOUT_SECONDS)
"""Long activities heartbeat at least this often; a lost worker is noticed within it."""


@dataclasses.dataclass(frozen=True)
class ActivityName:
    """An activity, by fixed name or as an operation of the Migration's data driver (`<driver>.<operation>`)."""

    name: str | None = None
    operation: DriverOperation | None = None

    def resolve(self, spec: MigrationSpec) -> str:
        if self.operation is not None:
            return driver_activity(spec.driver.type.value, self.operation)
        assert self.name is not None
        return self.name


def kube(name: KubeActivity) -> ActivityName:
    return ActivityName(name=name.value)


def driver(operation: DriverOperation) -> ActivityName:
    return ActivityName(operation=operation)


def store(name: SnapshotStoreActivity) -> ActivityName:
    return ActivityName(name=name.value)


@dataclasses.dataclass(frozen=True)
class Retry:
    """How many attempts the saga gives a step (or an undo) before its failure counts, and the waits between.

    The saga counts attempts itself (each activity runs once per attempt), so the status
    shows every attempt and the error of the last one while it waits for the next.
    """

    attempts: int
    first_delay: timedelta = timedelta(seconds=1)
    backoff: float = 2.0
    max_delay: timedelta = timedelta(seconds=60)
    non_retryable: tuple[str, ...] = tuple(NON_RETRYABLE_TYPES)
    """Failure types that no further attempt can fix: the first one counts at once."""

    def as_policy(self) -> RetryPolicy:
        """The same attempts as a Temporal retry policy, for calls outside the saga's own counting."""
        return RetryPolicy(
            initial_interval=self.first_delay,
            backoff_coefficient=self.backoff,
            maximum_interval=self.max_delay,
            maximum_attempts=self.attempts,
            non_retryable_error_types=list(self.non_retryable),
        )

    def delay(self, failed_attempt: int) -> timedelta:
        """The wait after attempt number `failed_attempt` (1-based) failed."""
        seconds = self.first_delay.total_seconds() * self.backoff ** (failed_attempt - 1)
        return min(timedelta(seconds=seconds), self.max_delay)


STEP_RETRY = Retry(attempts=5)
"""A step gets a few attempts (about a minute in all); then the Migration's failure policy decides."""

UNDO_RETRY = Retry(attempts=12, first_delay=timedelta(seconds=2))
"""An undo tries harder (about ten minutes in all) before the Migration ends Failed."""

PERSISTING_DELAY = timedelta(minutes=10)
PERSISTING_ATTEMPTS = 144
"""An undo that `persists` is tried this many more times, PERSISTING_DELAY apart (a day), once its own attempts are
spent on failures a person can fix."""


class Results:
    """What the steps of this run returned, by step; typed by the step asked about."""

    def __init__(self) -> None:
        self._by_step: dict[str, ApiModel] = {}

    def get(self, step: Step[Any, R]) -> R | None:
        found = self._by_step.get(step.name)
        return found if isinstance(found, step.result) else None

    def require(self, step: Step[Any, R]) -> R:
        found = self.get(step)
        if found is None:
            raise LookupError(f"no result of step {step.name}, which the plan puts earlier")
        return found

    def put(self, step: Step[Any, R], result: R) -> None:
        self._by_step[step.name] = result


@dataclasses.dataclass(frozen=True)
class Context:
    """What step and undo inputs are built from."""

    ref: MigrationRef
    spec: MigrationSpec
    results: Results
    called: set[str] = dataclasses.field(default_factory=set)
    """Steps whose activity this run called at least once (all of them in the undo of a finished run): a step whose
    guard failed at every attempt never acted."""


@dataclasses.dataclass(frozen=True)
class Call:
    """One activity call, ready for the saga to run."""

    activity: str
    argument: ApiModel
    result_type: type[ApiModel] | None
    timeout: timedelta
    summary: str
    heartbeat: timedelta | None = HEARTBEAT_TIMEOUT


@dataclasses.dataclass(frozen=True)
class Guard(Generic[G]):
    """A check run before every attempt of a step (or of an undo): an activity whose failure fails the attempt."""

    activity: ActivityName
    build: Callable[[Context, str], G | None]
    """The check's input for the step it guards; None when there is nothing to check."""
    timeout: Callable[[MigrationSpec], int]
    result: type[ApiModel] | None = None
    once: bool = False
    """Whether it runs only until it has passed once in the run, not before each later attempt of its step."""
    patch: str | None = None
    """The guard runs only in runs that have this patch (workflow.patched): one added to an undo that already ran
    without it, so that histories from before replay as they ran."""

    def call(self, context: Context, step: str, summary: str) -> Call | None:
        argument = self.build(context, step)
        if argument is None:
            return None
        return Call(
            activity=self.activity.resolve(context.spec),
            argument=argument,
            result_type=self.result,
            timeout=timedelta(seconds=self.timeout(context.spec)),
            summary=f"{context.ref}: {summary}",
        )


WATCH_ATTEMPT = timedelta(days=1)
"""How long one attempt of a watch may run; the next attempt (Temporal's, without a history event) goes on watching."""
WATCH_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=5),
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=0,
    non_retryable_error_types=list(NON_RETRYABLE_TYPES),
)
"""A watch is retried by Temporal until the wait ends (a lost worker, an attempt's end), never counted by the saga:
only a permanent failure (what it watches broke) reaches the run."""


@dataclasses.dataclass(frozen=True)
class Watch:
    """An activity that keeps an eye on what its step left running while the saga waits after it (approval, a pause,
    a soak), before the step that stops writes: Online's replicate leaves the replication, whose slot keeps the
    source's WAL. It runs until cancelled, heartbeating, and fails (permanently) once what it watches has broken; the
    saga then handles the failure as its step's."""

    activity: ActivityName
    build: Callable[[Context], ApiModel]

    def call(self, context: Context, step: str) -> Call:
        return Call(
            activity=self.activity.resolve(context.spec),
            argument=self.build(context),
            result_type=None,
            timeout=WATCH_ATTEMPT,
            summary=f"{context.ref}: watch {step} while waiting",
        )


@dataclasses.dataclass(frozen=True)
class Undo(Generic[R, U, UR]):
    """A step's compensation: its activity, how its input is built, and what its result adds to the status."""

    activity: ActivityName
    build: Callable[[Context, R | None], U]
    """The undo's input, from the step's result when there is one, else from the spec alone:
    an undo without a result finds what its step did where the step recorded it."""
    result: type[UR] | None = None
    report: Callable[[UR, SagaStatus], None] | None = None
    retry: Retry = UNDO_RETRY
    guard: Guard[Any] | None = None
    """A check run before every attempt of the undo: its failure fails the attempt, and a
    permanent one stops the rollback here, before this undo or any older one acts."""
    blocks_older: bool = True
    """Whether older steps' undos wait for this one: when it keeps failing, the rollback stops here, so nothing is
    undone under what depends on it (the target is not removed while the Service still sends it traffic). False for
    an undo that only empties the target's database or the snapshot's bucket: nothing older depends on that (the
    source is unfrozen and the target removed all the same), so its failure is reported and the rollback goes on."""
    persists: bool = False
    """Whether writes stay stopped until it succeeds (the freeze's): once its attempts are spent on failures a person
    can fix (the database not answering, credentials refused, anything not permanent), it goes on being tried,
    PERSISTING_ATTEMPTS more times PERSISTING_DELAY apart, the status saying why
    (saga.UNDOS_THAT_LET_WRITES_IN_PERSIST): a Secret fixed an hour later lets the source take writes again with no SQL
    by hand."""
    empties_target: bool = False
    """Whether it empties the target's database, which may hold writes only it has once traffic moved there: then its
    refusal or its failure stops the rollback whatever blocks_older says (saga.TARGET_KEPT). It compares the target
    with verify's mark before it empties it, so once it succeeded traffic counts as having reached the target only if
    it moves there again (saga.TRAFFIC_SINCE_EMPTIED)."""


@dataclasses.dataclass(frozen=True)
class Step(Generic[I, R]):
    """One step of the saga, with everything the loop needs to run it, retry it and undo it."""

    name: str
    activity: ActivityName
    result: type[R]
    build: Callable[[Context], I]
    undo: Undo[R, Any, Any] | None
    why_no_undo: str = ""
    """Where `undo` is None: why nothing needs undoing."""
    timeout: Callable[[MigrationSpec], int] | None = None
    """Seconds one attempt may take (default: the spec's timeouts for this step)."""
    retry: Retry = STEP_RETRY
    guard: Guard[Any] | None = None
    """A check run before every attempt, if any."""
    check: Callable[[R], str | None] | None = None
    """A reason to fail the step although its activity returned, e.g. a difference a driver reported."""
    report: Callable[[R, SagaStatus], None] | None = None
    """What the step's result adds to the status."""
    needs_approval: bool = False
    """A person approves before this step, when the Migration asks for approval."""
    soaks_before: bool = False
    """The Migration's soak time passes before this step."""
    changes_nothing: bool = False
    """The step only reads (and checks): a dry run (spec.dryRun) runs it, and stops before the first that is not."""
    stops_writes: bool = False
    """The source refuses writes from this step on (the write-downtime window opens): nobody is waited for after it."""
    resumes_writes: bool = False
    """Once this step has succeeded, writes flow again (to the target): the write-downtime window closes."""
    starts_the_copy: bool = False
    """The copy that the write-downtime window finishes starts here, before the step that stops writes (Online's
    replicate). A failure under failurePolicy Pause while writes are stopped then undoes back to this step, not only
    to the one that stops writes, and a retry runs again from here: what the steps in between did ends with their
    undos (the replication, with catch-up's), so it cannot be picked up again from the freeze."""
    watch: Watch | None = None
    """What runs beside the saga's waits after this step succeeded and before the step that stops writes (see Watch)."""

    def __post_init__(self) -> None:
        if self.undo is None and not self.why_no_undo:
            raise ValueError(f"step {self.name} has no undo: say why in why_no_undo")

    def seconds(self, spec: MigrationSpec) -> int:
        return self.timeout(spec) if self.timeout is not None else spec.timeouts.for_step(self.name)

    def call(self, context: Context) -> Call:
        return Call(
            activity=self.activity.resolve(context.spec),
            argument=self.build(context),
            result_type=self.result,
            timeout=timedelta(seconds=self.seconds(context.spec)),
            summary=f"{context.ref}: {self.name}",
        )

    def guard_call(self, context: Context) -> Call | None:
        if self.guard is None:
            return None
        return self.guard.call(context, self.name, f"check before {self.name}")

    def undo_guard_call(self, context: Context) -> Call | None:
        if self.undo is None or self.undo.guard is None:
            return None
        return self.undo.guard.call(context, self.name, f"check before undoing {self.name}")

    def accept(self, context: Context, result: object, status: SagaStatus) -> str | None:
        """Keeps the step's result and reports it; returns why the step fails anyway, if it does."""
        if not isinstance(result, self.result):
            raise TypeError(f"step {self.name} returned {type(result).__name__}, not {self.result.__name__}")
        context.results.put(self, result)
        if self.report is not None:
            self.report(result, status)
        return self.check(result) if self.check is not None else None

    def undo_call(self, context: Context) -> Call | None:
        if self.undo is None:
            return None
        return Call(
            activity=self.undo.activity.resolve(context.spec),
            argument=self.undo.build(context, context.results.get(self)),
            result_type=self.undo.result,
            timeout=timedelta(seconds=self.seconds(context.spec)),
            summary=f"{context.ref}: undo {self.name}",
        )

    def undone(self, result: object, status: SagaStatus) -> None:
        """Reports what the undo returned."""
        undo = self.undo
        if undo is not None and undo.result is not None and undo.report is not None and isinstance(result, undo.result):
            undo.report(result, status)
