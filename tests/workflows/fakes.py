"""Stand-ins for the saga's activities, registered under the real activity names.

The workflow tests check orchestration only: which activity runs when, which undo
follows which failure, what the status says. The real activities are tested against
the real API server, PostgreSQL and S3 in tests/activities; here a fake lets a test
fail, block or hold any step on demand, which the real components cannot do.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from temporalio import activity

from ferry.api.migration import MigrationStatus
from ferry.api.saga import (
    DriverOperation,
    EventRecord,
    FreezeResult,
    KubeActivity,
    MigrateResult,
    MirrorStatusInput,
    MirrorStatusResult,
    ProvisionResult,
    ScaleDownOldResult,
    SnapshotResult,
    SnapshotStoreActivity,
    SwitchTrafficResult,
    TableCheck,
    VerifyResult,
    driver_activity,
)

DRIVER = "postgresql"
PROVISION = KubeActivity.PROVISION.value
FREEZE = driver_activity(DRIVER, DriverOperation.FREEZE)
SNAPSHOT = driver_activity(DRIVER, DriverOperation.SNAPSHOT)
MIGRATE = driver_activity(DRIVER, DriverOperation.MIGRATE)
VERIFY = driver_activity(DRIVER, DriverOperation.VERIFY)
SWITCH_TRAFFIC = KubeActivity.SWITCH_TRAFFIC.value
SCALE_DOWN_OLD = KubeActivity.SCALE_DOWN_OLD.value
STEP_ACTIVITIES = [PROVISION, FREEZE, SNAPSHOT, MIGRATE, VERIFY, SWITCH_TRAFFIC, SCALE_DOWN_OLD]

UNDO = {
    PROVISION: KubeActivity.UNDO_PROVISION.value,
    FREEZE: driver_activity(DRIVER, DriverOperation.UNDO_FREEZE),
    SNAPSHOT: SnapshotStoreActivity.UNDO_SNAPSHOT.value,
    SWITCH_TRAFFIC: KubeActivity.UNDO_SWITCH_TRAFFIC.value,
    SCALE_DOWN_OLD: KubeActivity.UNDO_SCALE_DOWN_OLD.value,
}
"""The undo of each step that has one (migrate and verify have none)."""

RESULTS: dict[str, Any] = {
    PROVISION: ProvisionResult(stateful_set="orders-db-16", service="orders-db-16", ready_replicas=1),
    FREEZE: FreezeResult(previous_setting="off"),
    SNAPSHOT: SnapshotResult(
        bucket="ferry-snapshots", key="ns/orders/uid/snapshot.dump", sha256="ab" * 32, size_bytes=4096
    ),
    MIGRATE: MigrateResult(tables=3, bytes_restored=4096),
    VERIFY: VerifyResult(
        tables=[
            TableCheck(table="public.orders", source_rows=3, target_rows=3, source_checksum="c", target_checksum="c")
        ]
    ),
    SWITCH_TRAFFIC: SwitchTrafficResult(previous_selector={"app": "orders-db"}, endpoints=["orders-db-16-0"]),
    SCALE_DOWN_OLD: ScaleDownOldResult(previous_replicas=2),
}


@dataclasses.dataclass
class FakeSaga:
    """Every activity of the saga, recording calls; configure failures and holds per activity name."""

    fail: dict[str, BaseException] = dataclasses.field(default_factory=dict)
    """Raise this from the named activity..."""
    fail_times: dict[str, int] = dataclasses.field(default_factory=dict)
    """...only this many times (default: every time)."""
    hold: set[str] = dataclasses.field(default_factory=set)
    """These activities wait, heartbeating, until `release()` or cancellation."""
    results: dict[str, Any] = dataclasses.field(default_factory=lambda: dict(RESULTS))
    calls: list[str] = dataclasses.field(default_factory=list)
    cancelled: list[str] = dataclasses.field(default_factory=list)
    statuses: list[MigrationStatus] = dataclasses.field(default_factory=list)
    events: list[EventRecord] = dataclasses.field(default_factory=list)
    _released: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def release(self) -> None:
        self._released.set()

    @property
    def step_calls(self) -> list[str]:
        """Calls other than status mirroring."""
        return [name for name in self.calls if name != KubeActivity.MIRROR_STATUS.value]

    @property
    def undo_calls(self) -> list[str]:
        return [name for name in self.step_calls if name in UNDO.values()]

    def started(self, name: str) -> bool:
        return name in self.calls

    def activities(self) -> list[Callable[..., Any]]:
        names = [*STEP_ACTIVITIES, *UNDO.values(), SnapshotStoreActivity.DELETE_SNAPSHOT.value]
        return [self._fake(name) for name in names] + [self._mirror()]

    def _fake(self, name: str) -> Callable[..., Any]:
        @activity.defn(name=name)
        async def fake(argument: Any) -> Any:
            self.calls.append(name)
            if name in self.fail and self.fail_times.get(name, 1_000_000) > 0:
                self.fail_times[name] = self.fail_times.get(name, 1_000_000) - 1
                raise self.fail[name]
            if name in self.hold:
                try:
                    while not self._released.is_set():
                        activity.heartbeat()
                        await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    self.cancelled.append(name)
                    raise
            return self.results.get(name)

        return fake

    def _mirror(self) -> Callable[..., Any]:
        @activity.defn(name=KubeActivity.MIRROR_STATUS.value)
        async def mirror_status(request: MirrorStatusInput) -> MirrorStatusResult:
            self.calls.append(KubeActivity.MIRROR_STATUS.value)
            self.statuses.append(request.status)
            if request.event is not None:
                self.events.append(request.event)
            return MirrorStatusResult(found=True)

        return mirror_status
