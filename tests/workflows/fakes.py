"""Stand-ins for the saga's activities, derived from the plan and registered under the real activity names.

The workflow tests check orchestration only: which activity runs when, which undo
follows which failure, what the status says. The real activities are tested against
the real API server, PostgreSQL and S3 in tests/activities and tests/postgres; here a
fake lets a test fail, block or hold any step on demand, which the real components
cannot do. The names come from the plan itself, so a step added to the plan is faked
without touching this file (give it a sample result in `SAMPLE_RESULTS`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from ferry.api.migration import ApiModel, MigrationSpec, MigrationStatus, StepName, Throughput
from ferry.api.saga import (
    CatchUpResult,
    CheckFrozenResult,
    CheckUnwrittenResult,
    DriverOperation,
    EndReplicationResult,
    EventRecord,
    FenceMark,
    FreezeResult,
    KubeActivity,
    MigrateResult,
    MirrorStatusInput,
    MirrorStatusResult,
    PrecheckResult,
    ProvisionResult,
    ReplicateResult,
    ScaleDownOldResult,
    SnapshotResult,
    SnapshotStoreActivity,
    SwitchTrafficResult,
    TableCheck,
    UndoSnapshotResult,
    VerifyResult,
)
from tests import samples
from workflows import plan
from workflows.steps import ActivityName, Step, driver

SPEC = MigrationSpec.model_validate(samples.migration("orders-db-to-16")["spec"])


def name_of(activity_name: ActivityName) -> str:
    return activity_name.resolve(SPEC)


PROVISION = name_of(plan.PROVISION.activity)
PRECHECK = name_of(plan.PRECHECK.activity)
FREEZE = name_of(plan.FREEZE.activity)
SNAPSHOT = name_of(plan.SNAPSHOT.activity)
MIGRATE = name_of(plan.MIGRATE.activity)
VERIFY = name_of(plan.VERIFY.activity)
SWITCH_TRAFFIC = name_of(plan.SWITCH_TRAFFIC.activity)
SCALE_DOWN_OLD = name_of(plan.SCALE_DOWN_OLD.activity)
CHECK_FROZEN = name_of(plan.NO_WRITES_SINCE_FREEZE.activity)
CHECK_UNWRITTEN = name_of(plan.NO_WRITES_ON_TARGET.activity)
CHECK_CLUSTER = name_of(plan.CLUSTER_READY.activity)
REPLICATE = name_of(plan.REPLICATE.activity)
CATCH_UP = name_of(plan.CATCH_UP.activity)
UNDO_REPLICATE = name_of(driver(DriverOperation.UNDO_REPLICATE))
UNDO_CATCH_UP = name_of(driver(DriverOperation.UNDO_CATCH_UP))
UNDO_SNAPSHOT_AND_RESTORE = name_of(driver(DriverOperation.UNDO_SNAPSHOT))
WATCH_REPLICATION = name_of(driver(DriverOperation.WATCH_REPLICATION))
DELETE_SNAPSHOT = SnapshotStoreActivity.DELETE_SNAPSHOT.value
MIRROR = KubeActivity.MIRROR_STATUS.value

SAMPLE_RESULTS: dict[StepName, ApiModel] = {
    StepName.PRECHECK: PrecheckResult(
        source_version="15.18",
        target_version="18.1",
        tools_version="18.1",
        source_size_bytes=8192,
        target_storage_bytes=2**30,
        throughput=Throughput(source_read=4096, target_write=2048, upload=8192, sample_bytes=1024),
    ),
    StepName.PROVISION: ProvisionResult(stateful_set="orders-db-16", service="orders-db-16", ready_replicas=1),
    StepName.FREEZE: FreezeResult(previous_setting="off", fence=FenceMark(writes=42, catalog="c0ffee")),
    StepName.SNAPSHOT: SnapshotResult(
        bucket="ferry-snapshots", key="ns/orders/uid/snapshot.dump", sha256="ab" * 32, size_bytes=4096
    ),
    StepName.MIGRATE: MigrateResult(tables=3, bytes_restored=4096),
    StepName.VERIFY: VerifyResult(
        tables=[
            TableCheck(table="public.orders", source_rows=3, target_rows=3, source_checksum="c", target_checksum="c")
        ],
        target_fence=FenceMark(writes=3, catalog="7a2c3e", sequences="5eq"),
    ),
    StepName.SWITCH_TRAFFIC: SwitchTrafficResult(previous_selector={"app": "orders-db"}, endpoints=["orders-db-16-0"]),
    StepName.SCALE_DOWN_OLD: ScaleDownOldResult(previous_replicas=2),
    StepName.REPLICATE: ReplicateResult(
        publication="ferry_0f1e", subscription="ferry_0f1e", tables=3, tables_synced=3, lag_bytes=4096
    ),
    StepName.CATCH_UP: CatchUpResult(frozen_lsn="0/3000060", applied_lsn="0/3000060", sequences=2, waited_seconds=0.4),
}
"""A plausible result of each step, of the type its plan entry declares."""

OTHER_RESULTS: dict[str, ApiModel] = {
    CHECK_FROZEN: CheckFrozenResult(),
    CHECK_UNWRITTEN: CheckUnwrittenResult(compared=True),
    SnapshotStoreActivity.UNDO_SNAPSHOT.value: UndoSnapshotResult(deleted=True),
    UNDO_SNAPSHOT_AND_RESTORE: UndoSnapshotResult(deleted=True),
    UNDO_REPLICATE: EndReplicationResult(ended=True, emptied=True),
    UNDO_CATCH_UP: EndReplicationResult(ended=True),
}


def step_activities(steps: Sequence[Step[Any, Any]] = plan.PLAN) -> list[str]:
    return [name_of(step.activity) for step in steps]


def guard_of(steps: Sequence[Step[Any, Any]] = plan.PLAN) -> dict[str, str]:
    """The guard activity that runs before each step activity that has one, in every run: the check after provision
    (plan.TARGET_CHECKED) runs only where the precheck let the target wait, which the sample precheck does not."""
    return {
        name_of(step.activity): name_of(step.guard.activity)
        for step in steps
        if step.guard is not None and step.guard is not plan.TARGET_CHECKED
    }


def undo_of(steps: Sequence[Step[Any, Any]] = plan.PLAN) -> dict[str, str]:
    """The undo activity of each step activity that has one."""
    return {name_of(step.activity): name_of(step.undo.activity) for step in steps if step.undo is not None}


def undo_guard_of(steps: Sequence[Step[Any, Any]] = plan.PLAN) -> dict[str, str]:
    """The guard activity that runs before each undo activity that has one."""
    return {
        name_of(step.undo.activity): name_of(step.undo.guard.activity)
        for step in steps
        if step.undo is not None and step.undo.guard is not None
    }


STEP_ACTIVITIES = step_activities()
UNDO = undo_of()
GUARD = guard_of()
UNDO_GUARD = undo_guard_of()


def default_results(steps: Sequence[Step[Any, Any]]) -> dict[str, ApiModel]:
    results = {name_of(step.activity): SAMPLE_RESULTS[step.name] for step in steps if step.name in SAMPLE_RESULTS}
    return {**results, **OTHER_RESULTS}


@dataclasses.dataclass
class FakeSaga:
    """Every activity of the plan, recording calls; configure failures and holds per activity name."""

    fail: dict[str, BaseException] = dataclasses.field(default_factory=dict)
    """Raise this from the named activity..."""
    fail_times: dict[str, int] = dataclasses.field(default_factory=dict)
    """...only this many times (default: every time)..."""
    fail_from: dict[str, int] = dataclasses.field(default_factory=dict)
    """...from this call on, counting from 1 (default: the first): the precheck passes, its check after provision
    (the same activity) fails."""
    fail_when: dict[str, Callable[[Any], bool]] = dataclasses.field(default_factory=dict)
    """...and only for the inputs (the JSON received) this says yes to (default: every input). Status writes (MIRROR)
    fail this way too, each at once as a write whose attempts ran out looks to the run; their input is the
    MirrorStatusInput."""
    hold: set[str] = dataclasses.field(default_factory=set)
    """These activities wait, heartbeating, until `release()` or cancellation."""
    finish_when_cancelled: set[str] = dataclasses.field(default_factory=set)
    """Held activities that, asked to stop, finish their work and return their result anyway."""
    gone_after: int | None = None
    """The Migration disappears after this many status mirrors: later mirrors find it gone."""
    steps: Sequence[Step[Any, Any]] = plan.PLAN
    extra_results: dict[str, ApiModel] = dataclasses.field(default_factory=dict)
    calls: list[str] = dataclasses.field(default_factory=list)
    inputs: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    """What each activity was called with, as the JSON it received (camelCase keys)."""
    cancelled: list[str] = dataclasses.field(default_factory=list)
    statuses: list[MigrationStatus] = dataclasses.field(default_factory=list)
    events: list[EventRecord] = dataclasses.field(default_factory=list)
    final_mirrors_failing: int = 0
    """The first this many status writes of a finished phase fail for good (the Kubernetes API refusing them for a
    while: each fails at once, as a write whose attempts ran out looks to the run, without their real-time waits)."""
    mirror_failure: str = "ApiException"
    """The type of those failures (ferry.api.integrity.NOT_BACKED: the worker's gate refusing the run's writes)."""
    mirrors_failing_from: tuple[int, int] = (0, 0)
    """(n, count): from the n-th status write on (counting from 1), this many fail for good."""
    _mirror_calls: int = 0
    mirrors_name_their_run: bool = True
    """Status writes answer with the run they wrote for, as workers do since they did (False: as older ones)."""
    mirrors_held: bool = False
    """Status writes wait until `release_mirrors()`: the workflow task that started one stays open meanwhile (a local
    activity's), so what reaches the run in that time comes to it in one later activation, as under load."""
    mirrors_waiting: int = 0
    failed_mirrors: list[MirrorStatusInput] = dataclasses.field(default_factory=list)
    """The status writes that `fail` made fail, as asked."""
    _released: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    _mirrors_released: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def release(self) -> None:
        self._released.set()

    def release_mirrors(self) -> None:
        self._mirrors_released.set()

    @property
    def results(self) -> dict[str, ApiModel]:
        return {**default_results(self.steps), **self.extra_results}

    @property
    def step_calls(self) -> list[str]:
        """Calls other than status mirroring."""
        return [name for name in self.calls if name != MIRROR]

    @property
    def undo_calls(self) -> list[str]:
        undos = set(undo_of(self.steps).values())
        return [name for name in self.step_calls if name in undos]

    def started(self, name: str) -> bool:
        return name in self.calls

    def activities(self) -> list[Callable[..., Any]]:
        """Every activity, the watches too: a run without the patch watch-on-its-own-queue schedules its watch on its
        own task queue, as ferry's worker still serves it there."""
        names: list[str] = []
        for step in self.steps:
            names.append(name_of(step.activity))
            if step.undo is not None:
                names.append(name_of(step.undo.activity))
                if step.undo.guard is not None:
                    names.append(name_of(step.undo.guard.activity))
            if step.guard is not None:
                names.append(name_of(step.guard.activity))
        names.append(DELETE_SNAPSHOT)
        fakes = [self._fake(name) for name in dict.fromkeys(names)]
        return fakes + self.watches() + [self._mirror()]

    def watches(self) -> list[Callable[..., Any]]:
        """The watches alone, for the worker of the watches' task queue (ferry.api.saga.watches_task_queue)."""
        names = [name_of(step.watch.activity) for step in self.steps if step.watch is not None]
        return [self._watch(name) for name in dict.fromkeys(names)]

    def _fake(self, name: str) -> Callable[..., Any]:
        @activity.defn(name=name)
        async def fake(argument: Any) -> Any:
            self.calls.append(name)
            self.inputs.setdefault(name, []).append(argument)
            failing = len(self.inputs[name]) >= self.fail_from.get(name, 1)
            failing = failing and self.fail_when.get(name, lambda _: True)(argument)
            if name in self.fail and failing and self.fail_times.get(name, 1_000_000) > 0:
                self.fail_times[name] = self.fail_times.get(name, 1_000_000) - 1
                raise self.fail[name]
            if name in self.hold:
                try:
                    while not self._released.is_set():
                        activity.heartbeat()
                        await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    self.cancelled.append(name)
                    if name not in self.finish_when_cancelled:
                        raise
            return self.results.get(name)

        return fake

    def _watch(self, name: str) -> Callable[..., Any]:
        """A watch: fails as `fail` says, else heartbeats until cancelled (what a healthy replication's watch does)."""

        @activity.defn(name=name)
        async def watch(argument: Any) -> None:
            self.calls.append(name)
            self.inputs.setdefault(name, []).append(argument)
            if name in self.fail and self.fail_times.get(name, 1_000_000) > 0:
                self.fail_times[name] = self.fail_times.get(name, 1_000_000) - 1
                raise self.fail[name]
            try:
                while True:
                    activity.heartbeat()
                    await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                self.cancelled.append(name)
                raise

        return watch

    def _mirror(self) -> Callable[..., Any]:
        @activity.defn(name=MIRROR)
        async def mirror_status(request: MirrorStatusInput) -> MirrorStatusResult:
            if self.mirrors_held:
                self.mirrors_waiting += 1
                await self._mirrors_released.wait()
            if request.status.phase is not None and request.status.phase.finished and self.final_mirrors_failing > 0:
                self.final_mirrors_failing -= 1
                raise _failed_for_good("the API server answered 429 Too Many Requests", self.mirror_failure)
            failing = MIRROR in self.fail and self.fail_when.get(MIRROR, lambda _: True)(request)
            if failing and self.fail_times.get(MIRROR, 1_000_000) > 0:
                self.fail_times[MIRROR] = self.fail_times.get(MIRROR, 1_000_000) - 1
                self.failed_mirrors.append(request)
                raise self.fail[MIRROR]
            self._mirror_calls += 1
            first, count = self.mirrors_failing_from
            if first and first <= self._mirror_calls < first + count:
                raise _failed_for_good("the API server answered 503 Service Unavailable", self.mirror_failure)
            self.calls.append(MIRROR)
            self.statuses.append(request.status)
            self.events.extend(request.earlier_events)
            if request.event is not None:
                self.events.append(request.event)
            mirrors = len(self.statuses)
            found = self.gone_after is None or mirrors <= self.gone_after
            named = found and self.mirrors_name_their_run
            return MirrorStatusResult(found=found, run_id=activity.info().workflow_run_id if named else None)

        return mirror_status


def _failed_for_good(message: str, type: str) -> ApplicationError:
    return ApplicationError(message, type=type, non_retryable=True)
