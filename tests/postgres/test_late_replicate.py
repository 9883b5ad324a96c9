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
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from temporalio.testing import ActivityEnvironment

from activities.postgres import attempts, replicating, replication_ended, restoring
from ferry.api.errors import ReplicationEnded
from ferry.api.saga import EndReplicationResult, MigrationRef
from tests.cluster import eventually
from tests.end_to_end import Databases
from tests.postgres.data import connect, contents, create_shop, database_settings, set_on_database
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


def test_a_late_attempt_past_its_first_check_fails_before_it_publishes_the_source(
    online: OnlineSteps, databases: Databases
) -> None:
    """The attempt checked before the undo ran and copied the schema; the undo runs right then (at its heartbeat after
    the schema copy, its last before it publishes the source), and the attempt goes on after it. It held the
    Migration's lock on the source since its check, so the undo ended its session to take the lock: the attempt
    fails at its next query of the source, before it publishes it."""
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
    with pytest.raises(psycopg.errors.AdminShutdown):
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


def test_a_late_attempt_that_checked_before_catch_up_ended_the_replication_leaves_the_caught_up_target(
    online: OnlineSteps, databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 1 of replicate checked the source's record (nothing ended yet) and stood still; attempt 2 replicated, and
    catch-up ended the replication, leaving the caught-up target to verify. Attempt 1 then goes on: it finds no
    subscription, and must not empty the target (with the source frozen, the target is all the migration has). The
    stand-still is made by running catch-up from inside attempt 1's first look at the target, an interleaving a
    paused worker makes, injected here."""
    create_shop(databases.source, customers=100, orders=1_000)
    scheduled_as(online, 5).replicate()  # attempt 2, which the saga waited for
    late = scheduled_as(online, 5)  # attempt 1, written off
    caught_up: list[object] = []
    find = replicating.subscription.find

    def catch_up_meanwhile(conn: psycopg.Connection[Any], name: str) -> Any:
        if not caught_up and threading.current_thread() is threading.main_thread():
            done = threading.Thread(target=lambda: caught_up.append(scheduled_as(online, 11).catch_up()))
            done.start()
            done.join(120)
            assert caught_up, "catch-up ran while the attempt stood still"
        return find(conn, name)

    monkeypatch.setattr(replicating.subscription, "find", catch_up_meanwhile)
    copied = contents(databases.source)

    with pytest.raises((ReplicationEnded, psycopg.OperationalError)):
        late.replicate()

    assert caught_up, "catch-up ended the replication meanwhile"
    assert contents(databases.target) == copied, "the target keeps its copy: the late attempt did not empty it"
    assert leftovers(databases) == NOTHING, "no slot keeps the source's WAL"


def test_an_attempt_of_replicate_waits_for_an_activity_ending_the_replication_instead_of_ending_its_session(
    online: OnlineSteps, databases: Databases
) -> None:
    """A session holding the Migration's lock beside the lock only activities ending the replication hold (here taken
    by hand, as catch-up's or an undo's session holds them) is not ended by replicate: a late attempt must not cut
    short a catch-up that the frozen source waits for. replicate waits, and goes on once the lock is let go."""
    create_shop(databases.source, customers=100, orders=1_000)
    waited = threading.Event()
    online.env.on_heartbeat = lambda *details: (
        waited.set() if details and "waiting_for" in details[0] and "lock" in details[0]["waiting_for"] else None
    )
    done: list[object] = []
    failures: list[BaseException] = []

    def attempt() -> None:
        try:
            done.append(online.replicate())
        except BaseException as error:  # noqa: BLE001 - what the attempt met
            failures.append(error)

    with connect(databases.source) as ender:
        # Spelled out: the locks are a contract between the workers of every ferry version that may run at once.
        for prefix in ("ferry replication ending ", "ferry replication "):
            ender.execute("select pg_advisory_lock(hashtextextended(%s || %s, 0))", (prefix, online.ref.uid))
        running = threading.Thread(target=attempt)
        running.start()
        assert waited.wait(60), "replicate waits for the lock"
        for _ in range(3):  # three more tries of the lock, each of which would end a replicate attempt's session
            waited.clear()
            assert waited.wait(60)
        assert ender.execute("select 1").fetchone() == (1,), "the ending activity's session was not ended"
    running.join(120)
    assert not running.is_alive()
    assert failures == []
    assert len(done) == 1
    assert contents(databases.target) == contents(databases.source)
    online.undo_replicate()


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
    attempt = attempts.Attempt(run="r", activity="5", scheduled=at)
    assert attempt.before(dataclasses.replace(attempt, activity="9"))
    assert not attempt.before(dataclasses.replace(attempt, activity="3", scheduled=at - timedelta(seconds=1)))
    assert not attempt.before(attempt), "a retry of the activity that ended it is not late"
    # Another run (a reset): by Temporal's clock.
    assert attempt.before(attempts.Attempt(run="s", activity="2", scheduled=at + timedelta(seconds=1)))
    assert not attempt.before(attempts.Attempt(run="s", activity="20", scheduled=at - timedelta(seconds=1)))


@pytest.mark.parametrize(
    ("setting", "value"),
    # DateStyle SQL, month first: its now()::text (11/29/2026 ...) sorts below every ISO one whatever the day; day
    # first (29/11/2026 ...), above them from the 21st of the month on, when text order would keep it by chance.
    [("timezone", "America/New_York"), ("datestyle", "SQL, MDY")],
    ids=["new-york", "sql-mdy"],
)
def test_the_end_recorded_last_is_kept_whatever_the_time_zone_or_date_style_of_its_session(
    online: OnlineSteps, databases: Databases, setting: str, value: str
) -> None:
    """ferry.replication_ended keeps the entries of the 32 Migrations whose replication ended last. The ends of 32
    other Migrations of the source are recorded by sessions in UTC; then the source database's TimeZone or DateStyle
    changes (a role's or a database's own setting, which ferry's sessions follow), and the rollback of this Migration
    records its end. It is the newest entry, so it stays, and the late attempt of replicate is refused."""
    create_shop(databases.source, customers=100, orders=1_000)
    set_on_database(databases.source, "timezone", "UTC")
    for _ in range(replication_ended.KEPT):
        other = dataclasses.replace(online, ref=online.ref.model_copy(update={"uid": str(uuid.uuid4())}))
        scheduled_as(other, 9).undo_catch_up()
    set_on_database(databases.source, setting, value)
    late = scheduled_as(online, 5)
    scheduled_as(online, 9).undo_catch_up()  # the rollback, once the saga wrote attempt 5 off

    with pytest.raises(ReplicationEnded):
        late.replicate()

    assert leftovers(databases) == NOTHING, "no slot keeps the source's WAL"
    with connect(databases.source) as conn:
        recorded = replication_ended.read(conn)
    assert len(recorded) == replication_ended.KEPT
    assert online.ref.uid in recorded
