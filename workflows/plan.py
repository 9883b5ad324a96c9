"""The saga's plan: each step beside its compensation, with the retry policies they run under.

This table is the one place to read which undo belongs to which step. Activity names
come from ferry.api.saga; data-driver steps resolve to `<driver>.<operation>` at run
time, so one workflow serves every driver.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from temporalio.common import RetryPolicy

from ferry.api.errors import NON_RETRYABLE_TYPES
from ferry.api.migration import StepName
from ferry.api.saga import DriverOperation, KubeActivity, SnapshotStoreActivity, driver_activity


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
