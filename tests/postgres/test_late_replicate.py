"""A late attempt of replicate makes no slot, publication or subscription once its replication was ended for good.

A worker paused (SIGSTOP, a frozen VM) or cut off from Temporal inside replicate is
written off; the saga rolls back (undo_replicate ends the replication and empties the
target) or goes on to catch-up, which ends it too. When the paused worker goes on, it
must not publish the source and make a slot again: nothing would ever drop that slot,
and it would keep the source's WAL until its disk is full. The pause itself is not made
here: the late attempt is called after the end, as the activity Temporal scheduled
before it (its ActivityEnvironment carries that activity's run, id and schedule time).
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from temporalio.testing import ActivityEnvironment

from activities.postgres import replication_ended, restoring
from ferry.api.errors import ReplicationEnded
from ferry.api.saga import EndReplicationResult, MigrationRef
from tests.cluster import eventually
from tests.end_to_end import Databases
from tests.postgres.data import connect, contents, create_shop, database_settings
from tests.postgres.online import NOTHING, OnlineSteps, leftovers, slots

SCHEDULED = datetime(2026, 1, 1, tzinfo=UTC)


def scheduled_as(online: OnlineSteps, activity_id: int, run: str = "run-1") -> OnlineSteps:
    """The steps as the activity `activity_id` of workflow run `run` (the run's sequence number) calls them."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        workflow_run_id=run,
        activity_id=str(activity_id),
        scheduled_time=SCHEDULED + timedelta(seconds=activity_id),
    )
    return dataclasses.replace(online, env=env)


def _target_is_empty(databases: Databases) -> bool:
    with connect(databases.target) as conn:
        return not conn.execute(restoring.CONTENTS).fetchall() and database_settings(databases.target) == []


def test_a_late_replicate_after_the_rollback_ended_the_replication_makes_nothing_and_is_refused(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    late = scheduled_as(online, 5)
    late.replicate()
    scheduled_as(online, 9).undo_replicate()  # the rollback, once the saga wrote attempt 5 off
    assert leftovers(databases) == NOTHING

    with pytest.raises(ReplicationEnded) as refused:
        late.replicate()  # the paused worker goes on

    assert leftovers(databases) == NOTHING, "no slot keeps the source's WAL"
    assert _target_is_empty(databases), "nor is the target filled again"
    message = str(refused.value)
    assert f"for Migration {online.ref.namespace}/{online.ref.name}/{online.ref.uid}" in message, message
    assert "ended by the rollback (undo_replicate)" in message, message


def test_a_late_attempt_past_its_first_check_is_refused_where_it_publishes_the_source(
    online: OnlineSteps, databases: Databases
) -> None:
    """The attempt checked before the undo ran and copied the schema; the undo runs right then (at its heartbeat after
    the schema copy, its last before it publishes the source), and the attempt goes on after it."""
    create_shop(databases.source, customers=100, orders=1_000)
    late = scheduled_as(online, 5)
    undone: list[EndReplicationResult] = []

    def the_rollback_meanwhile(*details: Any) -> None:
        if undone or threading.current_thread() is not threading.main_thread():
            return  # the watchdog's heartbeats
        if details and "schema_bytes" in details[0]:
            undo = threading.Thread(target=lambda: undone.append(scheduled_as(online, 9).undo_replicate()))
            undo.start()
            undo.join(60)
            assert undone, "the undo ran while the attempt stood still"

    late.env.on_heartbeat = the_rollback_meanwhile
    with pytest.raises(ReplicationEnded, match="refused to publish the source and make a replication slot"):
        late.replicate()

    assert [result.emptied for result in undone] == [True], "the undo ran after the schema copy"
    assert leftovers(databases) == NOTHING, "no slot keeps the source's WAL"


def test_the_undo_ends_an_attempt_making_its_slot_and_the_slot_is_never_made(
    online: OnlineSteps, databases: Databases
) -> None:
    """An attempt that checked before the undo, copied the schema and stood still while making its slot (here: the slot
    waits for a transaction running on the source) holds the Migration's lock; the undo ends its session instead of
    waiting for it, records the end, and drops what is there. The slot is never made, nor the subscription."""
    create_shop(databases.source, customers=100, orders=1_000)
    failures: list[BaseException] = []

    def late_attempt() -> None:
        try:
            scheduled_as(online, 5).replicate()
        except BaseException as error:  # noqa: BLE001 - what the late attempt met
            failures.append(error)

    with connect(databases.source) as running:
        running.execute("begin")
        running.execute("select pg_current_xact_id()")  # a transaction the slot's creation waits for
        attempt = threading.Thread(target=late_attempt)
        attempt.start()
        eventually("the late attempt to wait for its slot", lambda: _making_a_slot(databases))

        undone = scheduled_as(online, 9).undo_replicate()

        running.execute("commit")
    attempt.join(60)
    assert not attempt.is_alive()
    assert undone.ended, "the undo dropped the publication the late attempt had made"
    assert [type(failure) for failure in failures] == [psycopg.errors.AdminShutdown], failures
    assert leftovers(databases) == NOTHING
    assert slots(databases.source) == []
    assert _target_is_empty(databases)


def _making_a_slot(databases: Databases) -> bool:
    with connect(databases.source) as conn:
        row = conn.execute(
            "select count(*) from pg_stat_activity where query like 'select pg_create_logical_replication_slot%%' "
            "and state = 'active'"
        ).fetchone()
    return row is not None and row[0] > 0


def test_a_late_replicate_after_catch_up_ended_the_replication_is_refused_and_leaves_the_target_as_it_is(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    late = scheduled_as(online, 5)
    late.replicate()
    scheduled_as(online, 11).catch_up()
    copied = contents(databases.target)

    with pytest.raises(ReplicationEnded, match="ended by catch-up"):
        late.replicate()

    assert leftovers(databases) == NOTHING
    assert contents(databases.target) == copied, "the target keeps its copy: the late attempt did not empty it"


def test_replicate_scheduled_after_the_undo_replicates_again(online: OnlineSteps, databases: Databases) -> None:
    """failurePolicy Pause undoes back to replicate so that writes flow, and retry schedules replicate again."""
    create_shop(databases.source, customers=100, orders=1_000)
    scheduled_as(online, 5).replicate()
    scheduled_as(online, 9).undo_replicate()

    again = scheduled_as(online, 14).replicate()

    assert again.schema_copied
    assert contents(databases.target) == contents(databases.source)
    assert leftovers(databases) == {
        "slots": [online.name],
        "publications": [online.name],
        "subscriptions": [online.name],
    }
    scheduled_as(online, 20).undo_replicate()
    assert leftovers(databases) == NOTHING


def test_a_new_migration_of_the_same_source_is_not_refused_by_the_end_of_an_earlier_one(
    online: OnlineSteps, databases: Databases, ref: MigrationRef
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    scheduled_as(online, 5).replicate()
    scheduled_as(online, 9).undo_replicate()
    newer = dataclasses.replace(online, ref=MigrationRef(namespace=ref.namespace, name=ref.name, uid=_another(ref)))

    scheduled_as(newer, 5, run="run-of-the-new-migration").replicate()

    assert leftovers(databases) == {"slots": [newer.name], "publications": [newer.name], "subscriptions": [newer.name]}
    newer.undo_replicate()
    assert leftovers(databases) == NOTHING


def _another(ref: MigrationRef) -> str:
    return ref.uid[:-1] + ("0" if ref.uid[-1] != "0" else "1")


@pytest.mark.unit
def test_an_attempt_is_late_when_the_end_was_scheduled_after_it() -> None:
    at = SCHEDULED
    attempt = replication_ended.Attempt(run="r", activity="5", scheduled=at)
    assert attempt.before(dataclasses.replace(attempt, activity="9"))
    assert not attempt.before(dataclasses.replace(attempt, activity="3", scheduled=at - timedelta(seconds=1)))
    assert not attempt.before(attempt), "a retry of the activity that ended it is not late"
    # Another run (a reset): by Temporal's clock.
    assert attempt.before(replication_ended.Attempt(run="s", activity="2", scheduled=at + timedelta(seconds=1)))
    assert not attempt.before(replication_ended.Attempt(run="s", activity="20", scheduled=at - timedelta(seconds=1)))
