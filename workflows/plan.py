"""The saga's plan: its steps in order, each with its activity, its undo, its guard and its report.

This table is the one place to read what the saga does. A new step is a new entry here
(and its activities, registered by the worker); the loop in workflows/saga.py needs no
change. Data-driver activities resolve to `<driver>.<operation>` from the spec, so one
plan serves every driver. There is one plan per mode (spec.driver.mode): PLAN copies
while the source is frozen, ONLINE_PLAN replicates before the freeze and only catches
up after it; `plan_for` picks one from the spec. SEQUENTIAL_PLAN is mode Snapshot as
runs started before the RESTORED_WHILE_DUMPING patch run it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ferry.api.migration import (
    DriverMode,
    Estimates,
    MigrationSpec,
    PlanStatus,
    ReplicationStatus,
    SnapshotStatus,
    StepName,
)
from ferry.api.quantity import quantity_bytes
from ferry.api.saga import (
    CatchUpInput,
    CatchUpResult,
    CheckFrozenInput,
    CheckFrozenResult,
    CheckUnwrittenInput,
    CheckUnwrittenResult,
    DriverOperation,
    EndReplicationInput,
    EndReplicationResult,
    FreezeInput,
    FreezeResult,
    KubeActivity,
    MigrateInput,
    MigrateResult,
    PrecheckInput,
    PrecheckResult,
    ProvisionInput,
    ProvisionResult,
    ReplicateInput,
    ReplicateResult,
    ScaleDownOldInput,
    ScaleDownOldResult,
    SnapshotInput,
    SnapshotResult,
    SnapshotStoreActivity,
    SwitchTrafficInput,
    SwitchTrafficResult,
    UndoFreezeInput,
    UndoMigrateInput,
    UndoProvisionInput,
    UndoScaleDownOldInput,
    UndoSnapshotInput,
    UndoSnapshotResult,
    UndoSwitchTrafficInput,
    VerifyInput,
    VerifyResult,
    WatchReplicationInput,
    keep_after_rollback,
    snapshot_key,
)
from workflows.status import SagaStatus
from workflows.steps import Context, Guard, Step, Undo, Watch, driver, kube, store

# --- what steps add to the status, and when a result still fails its step ------------------


def record_snapshot(result: SnapshotResult, status: SagaStatus) -> None:
    status.snapshot = SnapshotStatus(
        location=result.location,
        bucket=result.bucket,
        key=result.key,
        sha256=result.sha256,
        size_bytes=result.total_bytes,  # with the objects of its streams, if any (a property: replays unchanged)
    )


def record_snapshot_deleted(result: UndoSnapshotResult, status: SagaStatus) -> None:
    if result.deleted and status.snapshot is not None:
        status.snapshot = status.snapshot.model_copy(update={"deleted": True})


def differences(result: VerifyResult) -> str | None:
    """Drivers raise VerificationMismatch themselves; this guards against one that reports a difference quietly."""
    different = [check.table for check in result.tables if not check.equal]
    return f"VerificationMismatch: source and target differ in {', '.join(different)}" if different else None


FIXED_SECONDS = 10.0
"""What the plan adds for the steps whose time does not grow with the data (freeze, switch-traffic, scale-down-old)."""


def estimate(result: PrecheckResult) -> Estimates | None:
    """The size-dependent steps' times at the rates the precheck measured; None when a rate is unknown."""
    rates = result.throughput
    if rates is None or min(rates.source_read, rates.target_write, rates.upload) <= 0:
        return None
    size = result.source_size_bytes
    # The snapshot step reads, uploads and restores at once (SNAPSHOT_AND_RESTORE): the slowest of the three sets its
    # pace, and migrate finds the target restored.
    snapshot = size / min(rates.source_read, rates.upload, rates.target_write)
    verify = size / rates.source_read  # both sides are read at once
    downtime = snapshot + verify + FIXED_SECONDS / 2
    return Estimates(
        snapshot_seconds=round(snapshot, 1),
        migrate_seconds=0.0,
        verify_seconds=round(verify, 1),
        write_downtime_seconds=round(downtime, 1),
        total_seconds=round(downtime + FIXED_SECONDS / 2, 1),
    )


def record_plan(result: PrecheckResult, status: SagaStatus) -> None:
    status.plan = PlanStatus(
        steps=list(status.order),
        source_version=result.source_version,
        target_version=result.target_version,
        tools_version=result.tools_version,
        source_size_bytes=result.source_size_bytes,
        target_storage_bytes=result.target_storage_bytes,
        throughput=result.throughput,
        estimates=estimate(result),
    )


def estimate_online(result: PrecheckResult) -> Estimates | None:
    """Online: the snapshot, the initial copy and the comparison of the tables run while the source takes writes;
    only catch-up and verify of the tables written since do not (their share cannot be known in advance)."""
    rates = result.throughput
    if rates is None or min(rates.source_read, rates.target_write, rates.upload) <= 0:
        return None
    size = result.source_size_bytes
    snapshot = size / min(rates.source_read, rates.upload)
    verify = size / rates.source_read
    replicate = size / min(rates.source_read, rates.target_write) + verify
    downtime = FIXED_SECONDS / 2
    return Estimates(
        snapshot_seconds=round(snapshot, 1),
        migrate_seconds=0.0,
        verify_seconds=round(verify, 1),
        replicate_seconds=round(replicate, 1),
        write_downtime_seconds=round(downtime, 1),
        total_seconds=round(snapshot + replicate + downtime + FIXED_SECONDS / 2, 1),
    )


def record_online_plan(result: PrecheckResult, status: SagaStatus) -> None:
    record_plan(result, status)
    assert status.plan is not None
    status.plan = status.plan.model_copy(update={"estimates": estimate_online(result)})


def record_replication(result: ReplicateResult, status: SagaStatus) -> None:
    status.replication = ReplicationStatus(
        publication=result.publication,
        subscription=result.subscription,
        tables=result.tables,
        tables_synced=result.tables_synced,
        lag_bytes=result.lag_bytes,
        replica_identity_full=result.replica_identity_full,
    )


def record_caught_up(result: CatchUpResult, status: SagaStatus) -> None:
    if status.replication is not None:
        status.replication = status.replication.model_copy(
            update={
                "frozen_lsn": result.frozen_lsn,
                "applied_lsn": result.applied_lsn,
                "sequences": result.sequences,
                "ended": True,
            }
        )


def record_replication_ended(result: EndReplicationResult, status: SagaStatus) -> None:
    if status.replication is not None:
        status.replication = status.replication.model_copy(update={"ended": True})


def precheck_seconds(spec: MigrationSpec) -> int:
    return spec.timeouts.precheck


# --- the steps -----------------------------------------------------------------------------

CLUSTER_READY = Guard(
    kube(KubeActivity.CHECK_CLUSTER),
    lambda c, _: ProvisionInput(ref=c.ref, spec=c.spec),
    timeout=precheck_seconds,
)
"""Guards the precheck: what provision would refuse (a live or foreign target, a missing source, StorageClass)."""


def precheck_input(c: Context, *, first: bool) -> PrecheckInput:
    """The precheck's input: the first, which measures the rates for the plan and lets a target that does not answer
    yet wait for provision; or the check after provision, of everything again, the target included."""
    return PrecheckInput(
        ref=c.ref,
        driver=c.spec.driver,
        snapshot=c.spec.snapshot,
        target_storage_bytes=quantity_bytes(c.spec.target.storage_size),
        measure=first,
        stable_service=c.spec.source.service,
        target_may_wait=first,
        target_replicas=c.spec.target.replicas,
        after_provision=not first,
    )


PRECHECK = Step(
    StepName.PRECHECK,
    driver(DriverOperation.PRECHECK),
    PrecheckResult,
    build=lambda c: precheck_input(c, first=True),
    guard=CLUSTER_READY,
    changes_nothing=True,
    report=record_plan,
    undo=None,
    why_no_undo="it only reads (the object it writes to test the bucket is deleted at once)",
    timeout=precheck_seconds,
)


def target_to_check(c: Context, _: str) -> PrecheckInput | None:
    """The check after provision, when the precheck found the target database not answering yet (its server may be
    the target StatefulSet provision made); None once the precheck checked it (every run before this guard)."""
    checked = c.results.get(PRECHECK)
    if checked is None or not checked.target_deferred:
        return None
    return precheck_input(c, first=False)


TARGET_CHECKED = Guard(driver(DriverOperation.PRECHECK), target_to_check, timeout=precheck_seconds, once=True)
"""Guards the first step that touches the target (mode Snapshot: the freeze; Online: replicate): the precheck again,
all of it, when it let the target wait for provision, until it has passed once (a later attempt of the step would
find what an earlier one began, such as replicate's table-sync slots, counted against it). Its failure fails that
step, and the rollback removes the target: a target that still does not answer, or fails a check, gets nothing
copied to it."""

PROVISION = Step(
    StepName.PROVISION,
    kube(KubeActivity.PROVISION),
    ProvisionResult,
    build=lambda c: ProvisionInput(ref=c.ref, spec=c.spec),
    undo=Undo(
        kube(KubeActivity.UNDO_PROVISION),
        lambda c, _: UndoProvisionInput(ref=c.ref, stateful_set=c.spec.target.stateful_set),
    ),
)

FREEZE = Step(
    StepName.FREEZE,
    driver(DriverOperation.FREEZE),
    FreezeResult,
    build=lambda c: FreezeInput(ref=c.ref, driver=c.spec.driver),
    guard=TARGET_CHECKED,
    needs_approval=True,
    stops_writes=True,
    undo=Undo(
        driver(DriverOperation.UNDO_FREEZE),
        lambda c, done: UndoFreezeInput(
            ref=c.ref, driver=c.spec.driver, previous_setting=done.previous_setting if done else None
        ),
        persists=True,
    ),
)


SOURCE_CHECKED_BEFORE_EMPTYING = "source-checked-before-the-target-is-emptied"
"""Patch: the undos that empty the target (migrate's, and the snapshot's that restored) are guarded by the check
before traffic goes back (SOURCE_STILL_THERE), which first reaches the source, the database the precheck pinned."""

SOURCE_STILL_THERE = Guard(
    driver(DriverOperation.CHECK_UNWRITTEN),
    lambda c, _: CheckUnwrittenInput(ref=c.ref, driver=c.spec.driver, source_only=True),
    timeout=lambda spec: spec.timeouts.switch_traffic,
    result=CheckUnwrittenResult,
    patch=SOURCE_CHECKED_BEFORE_EMPTYING,
)
"""Guards the undos that empty the target: the source must still answer as the database the precheck pinned. A source
whose volume was lost or replaced, or whose database was dropped, while the saga copied it leaves the target's restore
and the snapshot the only copies: the check fails, and the rollback stops there (a guard's failure stops it), before
they are emptied or deleted. Only the source (source_only): the undo compares the target with verify's mark itself,
and a target that does not answer, often why the rollback runs, must not keep the source frozen."""


def snapshot_input(c: Context, *, restore: bool) -> SnapshotInput:
    key = snapshot_key(c.ref, c.spec.snapshot)
    return SnapshotInput(ref=c.ref, driver=c.spec.driver, snapshot=c.spec.snapshot, key=key, restore=restore)


def undo_snapshot_input(c: Context, done: SnapshotResult | None, *, restored: bool) -> UndoSnapshotInput:
    """The snapshot's undo; with `restored`, the driver's, which is given the driver's spec to empty the target."""
    return UndoSnapshotInput(
        ref=c.ref,
        snapshot=c.spec.snapshot,
        artifact=done,
        key=snapshot_key(c.ref, c.spec.snapshot),
        keep=keep_after_rollback(c.spec.snapshot.retention.after_rollback),
        driver=c.spec.driver if restored else None,
    )


SNAPSHOT = Step(
    StepName.SNAPSHOT,
    driver(DriverOperation.SNAPSHOT),
    SnapshotResult,
    build=lambda c: snapshot_input(c, restore=False),
    report=record_snapshot,
    undo=Undo(
        store(SnapshotStoreActivity.UNDO_SNAPSHOT),
        lambda c, done: undo_snapshot_input(c, done, restored=False),
        result=UndoSnapshotResult,
        report=record_snapshot_deleted,
        blocks_older=False,
    ),
)
"""Dumps the source into S3 only: mode Online's recovery snapshot, and mode Snapshot in runs started before
SNAPSHOT_AND_RESTORE (SEQUENTIAL_PLAN)."""

SNAPSHOT_AND_RESTORE = dataclasses.replace(
    SNAPSHOT,
    build=lambda c: snapshot_input(c, restore=True),
    undo=Undo(
        driver(DriverOperation.UNDO_SNAPSHOT),
        lambda c, done: undo_snapshot_input(c, done, restored=True),
        result=UndoSnapshotResult,
        report=record_snapshot_deleted,
        guard=SOURCE_STILL_THERE,
        blocks_older=False,
        empties_target=True,
    ),
)
"""Mode Snapshot: the dump goes to S3 and into the target's restore at once, and the restore commits once the
whole object is stored (the data crosses once; migrate then finds it restored). Its undo empties the target, then
deletes the object, since the snapshot step may have restored even when migrate never started."""

MIGRATE = Step(
    StepName.MIGRATE,
    driver(DriverOperation.MIGRATE),
    MigrateResult,
    build=lambda c: MigrateInput(
        ref=c.ref, driver=c.spec.driver, snapshot=c.spec.snapshot, artifact=c.results.require(SNAPSHOT)
    ),
    undo=Undo(
        driver(DriverOperation.UNDO_MIGRATE),
        lambda c, _: UndoMigrateInput(ref=c.ref, driver=c.spec.driver),
        guard=SOURCE_STILL_THERE,
        blocks_older=False,
        empties_target=True,
    ),
)

VERIFY = Step(
    StepName.VERIFY,
    driver(DriverOperation.VERIFY),
    VerifyResult,
    build=lambda c: VerifyInput(ref=c.ref, driver=c.spec.driver),
    check=differences,
    undo=None,
    why_no_undo="it only reads",
)


def fence_of_the_freeze(c: Context, before: str) -> CheckFrozenInput | None:
    """Nothing may have been written to the source since the freeze (runs whose freeze left no mark skip it)."""
    frozen = c.results.get(FREEZE)
    if frozen is None or frozen.fence is None:
        return None
    return CheckFrozenInput(ref=c.ref, driver=c.spec.driver, fence=frozen.fence, before=before)


NO_WRITES_SINCE_FREEZE = Guard(
    driver(DriverOperation.CHECK_FROZEN),
    fence_of_the_freeze,
    timeout=lambda spec: spec.timeouts.freeze,
    result=CheckFrozenResult,
)
"""Guards the steps after which the source stops counting: switch-traffic and scale-down-old."""


def mark_of_verify(c: Context, step: str) -> CheckUnwrittenInput:
    """Nothing may have been written to the target since verify marked it (no result of verify: its recorded mark).

    When this run never called the activity of `step` (switch-traffic: its check failed at every attempt), the check
    first asks the stable Service: with no record of a switch by this Migration (a reset's earlier run would have left
    one), no traffic moved, and the target, which may not answer, is not asked."""
    verified = c.results.get(VERIFY)
    unrun = step not in c.called
    return CheckUnwrittenInput(
        ref=c.ref,
        driver=c.spec.driver,
        fence=verified.target_fence if verified else None,
        service=c.spec.source.service if unrun else None,
        target_stateful_set=c.spec.target.stateful_set if unrun else None,
    )


NO_WRITES_ON_TARGET = Guard(
    driver(DriverOperation.CHECK_UNWRITTEN),
    mark_of_verify,
    timeout=lambda spec: spec.timeouts.switch_traffic,
    result=CheckUnwrittenResult,
)
"""Guards the undo of switch-traffic: traffic goes back only if the target took no writes that going back would lose."""

SWITCH_TRAFFIC = Step(
    StepName.SWITCH_TRAFFIC,
    kube(KubeActivity.SWITCH_TRAFFIC),
    SwitchTrafficResult,
    build=lambda c: SwitchTrafficInput(
        ref=c.ref, service=c.spec.source.service, target_stateful_set=c.spec.target.stateful_set
    ),
    guard=NO_WRITES_SINCE_FREEZE,
    resumes_writes=True,
    undo=Undo(
        kube(KubeActivity.UNDO_SWITCH_TRAFFIC),
        lambda c, done: UndoSwitchTrafficInput(
            ref=c.ref,
            service=c.spec.source.service,
            previous_selector=done.previous_selector if done else None,
            source_stateful_set=c.spec.source.stateful_set,
        ),
        guard=NO_WRITES_ON_TARGET,
    ),
)

SCALE_DOWN_OLD = Step(
    StepName.SCALE_DOWN_OLD,
    kube(KubeActivity.SCALE_DOWN_OLD),
    ScaleDownOldResult,
    build=lambda c: ScaleDownOldInput(
        ref=c.ref,
        stateful_set=c.spec.source.stateful_set,
        service=c.spec.source.service,
        target_stateful_set=c.spec.target.stateful_set,
    ),
    guard=NO_WRITES_SINCE_FREEZE,
    soaks_before=True,
    undo=Undo(
        kube(KubeActivity.UNDO_SCALE_DOWN_OLD),
        lambda c, done: UndoScaleDownOldInput(
            ref=c.ref, stateful_set=c.spec.source.stateful_set, replicas=done.previous_replicas if done else None
        ),
    ),
)

PLAN: tuple[Step[Any, Any], ...] = (
    PRECHECK,
    PROVISION,
    FREEZE,
    SNAPSHOT_AND_RESTORE,
    MIGRATE,
    VERIFY,
    SWITCH_TRAFFIC,
    SCALE_DOWN_OLD,
)
"""Mode Snapshot (the default): the steps in the order they run; undone in reverse."""

SEQUENTIAL_PLAN: tuple[Step[Any, Any], ...] = tuple(SNAPSHOT if step is SNAPSHOT_AND_RESTORE else step for step in PLAN)
"""Mode Snapshot as runs started before RESTORED_WHILE_DUMPING run it: migrate reads the snapshot back from S3.
Replaying them must schedule the same activities, so they keep this plan to their end."""

RESTORED_WHILE_DUMPING = "snapshot-restores-while-dumping"
"""The patch that moved mode Snapshot from SEQUENTIAL_PLAN to PLAN (workflow.patched at the start of a run)."""

# --- mode Online ---------------------------------------------------------------------------

ONLINE_PRECHECK = dataclasses.replace(PRECHECK, report=record_online_plan)
"""The same checks, and those of logical replication (spec.driver.mode reaches the driver); the plan's estimates
count only catch-up and verify in the write-downtime window."""


REPLICATE = Step(
    StepName.REPLICATE,
    driver(DriverOperation.REPLICATE),
    ReplicateResult,
    build=lambda c: ReplicateInput(ref=c.ref, driver=c.spec.driver),
    guard=TARGET_CHECKED,
    report=record_replication,
    starts_the_copy=True,
    undo=Undo(
        driver(DriverOperation.UNDO_REPLICATE),
        lambda c, _: EndReplicationInput(ref=c.ref, driver=c.spec.driver),
        result=EndReplicationResult,
        report=record_replication_ended,
        empties_target=True,
    ),
    watch=Watch(
        driver(DriverOperation.WATCH_REPLICATION), lambda c: WatchReplicationInput(ref=c.ref, driver=c.spec.driver)
    ),
)
"""Copies the schema, publishes the source, subscribes the target, and waits until the target is nearly caught up.
While the saga then waits before the freeze (approval, a pause), its watch fails the run once the replication breaks:
the slot would keep the source's WAL until its disk fills."""

CATCH_UP = Step(
    StepName.CATCH_UP,
    driver(DriverOperation.CATCH_UP),
    CatchUpResult,
    build=lambda c: CatchUpInput(ref=c.ref, driver=c.spec.driver),
    report=record_caught_up,
    undo=Undo(
        driver(DriverOperation.UNDO_CATCH_UP),
        lambda c, _: EndReplicationInput(ref=c.ref, driver=c.spec.driver),
        result=EndReplicationResult,
        report=record_replication_ended,
        blocks_older=False,  # replicate's undo ends the replication too, after the freeze's
    ),
)
"""Waits, writes stopped, until the target has applied everything up to the freeze; copies the sequences; ends the
replication. Its undo ends the replication too, whatever catch-up got to (replicate's undo then empties the target)."""


def compared_ahead(c: Context) -> VerifyInput:
    """Online: verify reads again only the tables written since replicate compared them (see activities ahead)."""
    replicated = c.results.get(REPLICATE)
    return VerifyInput(ref=c.ref, driver=c.spec.driver, ahead=replicated.ahead if replicated else None)


ONLINE_VERIFY = dataclasses.replace(VERIFY, build=compared_ahead)
"""As in mode Snapshot, but the tables replicate found equal and nothing wrote since are not read again."""

ONLINE_FREEZE = dataclasses.replace(FREEZE, guard=None)
"""Mode Online's freeze: replicate, before it, had the target checked after provision where the precheck could not."""

ONLINE_PLAN: tuple[Step[Any, Any], ...] = (
    ONLINE_PRECHECK,
    PROVISION,
    SNAPSHOT,
    REPLICATE,
    ONLINE_FREEZE,
    CATCH_UP,
    ONLINE_VERIFY,
    SWITCH_TRAFFIC,
    SCALE_DOWN_OLD,
)
"""Mode Online: the recovery snapshot and the replication run while the source takes writes; the freeze (and the
approval before it) comes once the target is nearly caught up. Undone in reverse, as PLAN."""


def plan_for(spec: MigrationSpec, *, restores_while_dumping: bool = True) -> tuple[Step[Any, Any], ...]:
    """The plan of the Migration's mode; mode Snapshot's as it was before RESTORED_WHILE_DUMPING when asked."""
    if spec.driver.mode is DriverMode.ONLINE:
        return ONLINE_PLAN
    return PLAN if restores_while_dumping else SEQUENTIAL_PLAN
