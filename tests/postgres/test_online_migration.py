"""Whole migrations of mode Online through ferry's real worker and saga, with writers on the source all along.

The invariants a person relies on: every write the source acknowledged is in the target,
the target has no row the source lacks, the source acknowledges nothing once the freeze
is in place, and whatever the outcome no replication slot, publication or subscription
is left (a slot left behind keeps the source's WAL forever).
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any

import pytest
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import WorkflowFailureError

from ferry.api.migration import DriverType, MigrationStatus, Phase
from ferry.api.saga import PROGRESS_QUERY, ControlRequest, DriverOperation, Signal, driver_activity
from tests.end_to_end import (
    SOURCE_SECRET,
    TARGET_SECRET,
    Databases,
    Ready,
    eventually,
    readable_history,
)
from tests.postgres.data import application_role, connect, create_shop, database_settings
from tests.postgres.online import NOTHING, leftovers
from tests.postgres.test_writers_whole_migration import Writer

SAGA_TIMEOUT = 300
WATCH = driver_activity(DriverType.POSTGRESQL.value, DriverOperation.WATCH_REPLICATION)


def _online(ready: Ready, **spec: Any) -> dict[str, Any]:
    driver = {"type": "postgresql", "sourceSecret": SOURCE_SECRET, "targetSecret": TARGET_SECRET, "mode": "Online"}
    return ready.manifest(driver=driver, **spec)


def _step(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(step for step in status["steps"] if step["name"] == name)


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _ids(databases: Databases, side: str) -> set[int]:
    with connect(getattr(databases, side)) as conn:
        return {row[0] for row in conn.execute("select id from shop.events")}


def _target_is_empty(databases: Databases) -> bool:
    with connect(databases.target) as conn:
        return conn.execute("select from pg_namespace where nspname = 'shop'").fetchone() is None


@pytest.fixture
def events_table(databases: Databases) -> Databases:
    create_shop(databases.source, customers=200, orders=20_000)
    with connect(databases.source) as conn:
        conn.execute("create table shop.events (id int primary key, at timestamptz not null default now())")
    return databases


async def test_an_online_migration_with_writers_throughout_loses_no_acknowledged_write_and_leaves_nothing_behind(
    events_table: Databases, ready: Ready
) -> None:
    databases = events_table
    manifest = _online(ready)
    ref = ready.apply(manifest)
    with application_role(databases.source) as app:
        writers = [Writer(app, "begin-read-write", first=0), Writer(app, "read-only-off", first=1_000_000)]
        for writer in writers:
            writer.thread.start()
        try:
            handle = await ready.start(ref, manifest)
            result = await asyncio.wait_for(handle.result(), SAGA_TIMEOUT)
        finally:
            for writer in writers:
                writer.stop.set()
                writer.thread.join(30)

    assert result["phase"] == "Succeeded"
    acknowledged = {number for writer in writers for number in writer.acknowledged}
    in_target, in_source = _ids(databases, "target"), _ids(databases, "source")
    assert acknowledged <= in_target, f"{len(acknowledged - in_target)} acknowledged writes are not in the target"
    assert in_target <= in_source, "the target has no row the source lacks"
    status = ready.status(ref.name)
    frozen_at = _at(_step(status, "freeze")["finishedAt"])
    times = [at for writer in writers for at in writer.acknowledged_at]
    assert not [at for at in times if at > frozen_at], "the source acknowledged nothing once frozen"
    replicating = (_at(_step(status, "replicate")["startedAt"]), _at(_step(status, "freeze")["startedAt"]))
    assert len([at for at in times if replicating[0] < at < replicating[1]]) > 10, "writes flowed while replicating"
    assert [step["name"] for step in status["steps"]] == [
        "precheck", "provision", "snapshot", "replicate", "freeze", "catch-up", "verify", "switch-traffic",
        "scale-down-old",
    ]  # fmt: skip
    replication = status["replication"]
    assert replication["tablesSynced"] == replication["tables"] == 4
    assert replication["ended"] is True
    assert replication["frozenLsn"]
    window = status["writeDowntime"]
    assert window["endedBy"] == "traffic moved"
    assert window["seconds"] > 0
    assert leftovers(databases) == NOTHING
    records = {
        "workflow history": readable_history((await handle.fetch_history()).to_json()),
        "Migration": json.dumps(status),
        "Events": ready.events(),
    }
    for record, text in records.items():  # the subscription's connection held the source's password
        assert databases.source.password not in text, f"the source's password is in the {record}"


async def test_ddl_on_the_source_while_it_replicates_fails_verify_and_the_rollback_leaves_nothing(
    databases: Databases, ready: Ready
) -> None:
    """The approval before the freeze holds the saga while the replication runs: the moment to change the schema."""
    create_shop(databases.source, customers=100, orders=2_000)
    manifest = _online(ready, approval={"required": True})
    ref = ready.apply(manifest)
    handle = await ready.start(ref, manifest)

    async def awaiting_approval() -> bool:
        progress = await handle.query(PROGRESS_QUERY, result_type=MigrationStatus)
        return progress.phase is Phase.AWAITING_APPROVAL

    await eventually("the approval before the freeze", awaiting_approval, within=SAGA_TIMEOUT)

    async def watched() -> bool:
        pending = (await handle.describe()).raw_description.pending_activities
        return any(
            activity.activity_type.name == WATCH
            and activity.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            for activity in pending
        )

    # On the task queue of the run's watches, which ferry's worker polls beside its own.
    await eventually("the replication's watch running beside the approval", watched, within=60)
    with connect(databases.source) as conn:
        conn.execute("create index orders_by_total on shop.orders (total)")
    await handle.signal(Signal.APPROVE.value, ControlRequest(by="alice"))

    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), SAGA_TIMEOUT)

    status = ready.status(ref.name)
    assert status["phase"] == "RolledBack"
    verify = _step(status, "verify")
    assert verify["lastError"].startswith("VerificationMismatch: ")
    assert "index shop.orders_by_total (missing in the target)" in verify["lastError"]
    assert leftovers(databases) == NOTHING
    assert _target_is_empty(databases)
    kept = database_settings(databases.source)
    ended = [setting for setting in kept if setting.startswith("ferry.replication_ended=")]
    assert [setting for setting in kept if setting not in ended] == [], "the source is unfrozen"
    assert len(ended) == 1, "and records that the replication has ended, for a late attempt of replicate"
    assert f'"{ref.uid}"' in ended[0]
    with connect(databases.source) as conn:
        conn.execute("insert into shop.customers (email, created_at) values ('after@example.com', now())")


async def test_a_rollback_asked_for_during_replicate_leaves_no_slot_publication_or_subscription(
    databases: Databases, ready: Ready
) -> None:
    create_shop(databases.source, customers=2_000, orders=300_000)
    manifest = _online(ready)
    ref = ready.apply(manifest)
    handle = await ready.start(ref, manifest)

    async def subscribed() -> bool:
        return bool(leftovers(databases)["subscriptions"])

    await eventually("the subscription of replicate", subscribed, within=SAGA_TIMEOUT)
    await handle.signal(Signal.ROLLBACK.value, ControlRequest(by="alice", reason="changed my mind"))
    result = await asyncio.wait_for(handle.result(), SAGA_TIMEOUT)

    assert result["phase"] == "RolledBack"
    status = ready.status(ref.name)
    assert _step(status, "replicate")["state"] == "Compensated"
    assert leftovers(databases) == NOTHING
    assert _target_is_empty(databases)
