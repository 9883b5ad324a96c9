"""Mode Online's replicate and catch-up against the stack's real PostgreSQL: nothing lost, nothing left behind.

The source instance runs with wal_level=logical (devstack/stack/postgres.py); the target's
server subscribes to it over TCP. Each test looks where a person would: rows in both
databases, and the slots, publications and subscriptions left (tests/postgres/online.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from kubernetes import client as k8s
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities.postgres import replicating, replication, replication_ended, restoring, subscription
from activities.postgres.freezing import PreparedTransactionsPending
from activities.settings import DataActivitySettings
from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.stack import StackInfo
from ferry.api.errors import InvalidSpec, ReplicationBroken, VerificationMismatch
from ferry.api.saga import ReplicateInput, ReplicateResult, VerifyResult
from tests.cluster import eventually
from tests.end_to_end import Databases
from tests.postgres.conftest import create_secret
from tests.postgres.data import (
    connect,
    connection_of,
    contents,
    create_shop,
    database_owner,
    database_settings,
    tablespace,
    tablespaces_of,
)
from tests.postgres.online import NOTHING, OnlineSteps, leftovers, replica_identity, slots

MIB = 2**20


def _target_is_empty(databases: Databases) -> bool:
    with connect(databases.target) as conn:
        return not conn.execute(restoring.CONTENTS).fetchall() and database_settings(databases.target) == []


def _sequences(endpoint: PostgresEndpoint) -> dict[str, object]:
    """Each sequence's last value and is_called, which decide the next value handed out."""
    with connect(endpoint) as conn:
        names = [row[0] for row in conn.execute("select format('%I.%I', schemaname, sequencename) from pg_sequences")]
        return {name: conn.execute(f"select last_value, is_called from {name}").fetchone() for name in names}


def _walsender_of(endpoint: PostgresEndpoint, slot: str) -> int | None:
    """The pid of the walsender that serves the replication slot, if one does."""
    with connect(endpoint) as conn:
        row = conn.execute("select active_pid from pg_replication_slots where slot_name = %s", (slot,)).fetchone()
    return None if row is None else row[0]


def test_replicate_copies_the_schema_and_every_row_and_catch_up_brings_the_last_writes_and_the_sequences(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=200, orders=3_000)

    replicated = online.replicate()

    assert (replicated.tables, replicated.tables_synced) == (3, 3)
    assert replicated.lag_bytes <= 16 * MIB
    assert replicated.schema_copied
    assert contents(databases.target) == contents(databases.source), "the initial copy has every row"
    assert leftovers(databases) == {
        "slots": [online.name],
        "publications": [online.name],
        "subscriptions": [online.name],
    }
    with connect(databases.source) as conn:  # the source takes writes while it replicates
        conn.execute("insert into shop.customers (email, created_at) values ('late@example.com', now())")
        conn.execute("update shop.orders set total = total + 1 where id <= 100")
        conn.execute("delete from audit.log where order_id <= 300")
        conn.execute("select nextval('audit.ticket_seq')")
    serving = _walsender_of(databases.source, online.name)
    frozen = online.freeze()

    assert serving is not None
    assert _walsender_of(databases.source, online.name) == serving, "the freeze left the replication's walsender"
    caught_up = online.catch_up()

    assert caught_up.applied_lsn is not None
    assert caught_up.sequences == 3
    assert contents(databases.target) == contents(databases.source), "the writes made while replicating arrived"
    assert _sequences(databases.target) == _sequences(databases.source)
    assert leftovers(databases) == NOTHING, "catch-up ended the replication"
    online.verify()  # raises VerificationMismatch on any difference of rows, schema or sequences
    online.check_frozen(frozen)  # ending the replication on the frozen source is no write after the freeze
    online.undo_freeze()


def test_replicate_run_again_goes_on_with_its_own_slot_and_subscription_and_its_undo_leaves_nothing(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    online.replicate()

    again = online.replicate()

    assert not again.schema_copied, "the retry found its subscription"
    assert leftovers(databases) == {
        "slots": [online.name],
        "publications": [online.name],
        "subscriptions": [online.name],
    }
    undone = online.undo_replicate()
    assert (undone.ended, undone.emptied) == (True, True)
    assert leftovers(databases) == NOTHING
    assert _target_is_empty(databases)
    assert online.undo_replicate().ended is False, "an undo run again finds nothing to do"


def test_a_replicate_that_finds_its_slot_gone_starts_again_with_one_slot_and_one_subscription(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    online.replicate()
    with connect(databases.target) as conn:
        conn.execute(f"alter subscription {online.name} disable")
    with connect(databases.source) as conn:
        replication.drop_slots(conn, [online.name], lambda: None)

    again = online.replicate()

    assert again.schema_copied
    assert leftovers(databases) == {
        "slots": [online.name],
        "publications": [online.name],
        "subscriptions": [online.name],
    }
    assert contents(databases.target) == contents(databases.source)
    online.undo_replicate()
    assert leftovers(databases) == NOTHING


def test_undoing_replicate_in_the_middle_of_the_initial_copy_leaves_no_slot_behind(
    online: OnlineSteps, databases: Databases, data_settings: DataActivitySettings
) -> None:
    with connect(databases.source) as conn:
        conn.execute("create table public.big (id int primary key, note text not null)")
        conn.execute("insert into public.big select i, md5(i::text) from generate_series(1, 1500000) as i")
    failures: list[BaseException] = []
    cancelling = ActivityEnvironment()

    def replicate() -> None:
        try:
            cancelling.run(online.replication.replicate, ReplicateInput(ref=online.ref, driver=online.driver))
        except BaseException as error:  # noqa: BLE001 - cancelled, as the saga would cancel it
            failures.append(error)

    running = threading.Thread(target=replicate)
    running.start()
    deadline = time.monotonic() + 60
    while not any("_sync_" in slot for slot in slots(databases.source)):
        assert time.monotonic() < deadline, f"no table synchronization slot appeared: {slots(databases.source)}"
        time.sleep(0.02)
    cancelling.cancel()
    running.join(60)

    assert [type(failure) for failure in failures] == [CancelledError], "replicate stopped in the middle of the copy"
    online.undo_replicate()
    assert leftovers(databases) == NOTHING
    assert _target_is_empty(databases)


def test_the_undo_drops_a_table_synchronization_slot_that_a_dropped_subscription_left_on_the_source(
    online: OnlineSteps, databases: Databases
) -> None:
    """What DROP SUBSCRIPTION leaves when it cannot reach the source during a copy: a sync slot, named after it."""
    create_shop(databases.source, customers=100, orders=1_000)
    online.replicate()
    with connect(databases.target) as conn:
        found = subscription.find(conn, online.name)
        system = subscription.system_identifier(conn)
        assert found is not None
        relid = conn.execute("select 'shop.orders'::regclass::oid").fetchone()
    assert relid is not None
    orphan = f"pg_{found.oid}_sync_{relid[0]}_{system}"
    with connect(databases.source) as conn:
        conn.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (orphan,))
    with connect(databases.target) as conn:  # someone dropped the subscription half way, as its undo would
        conn.execute(f"alter subscription {online.name} disable")
        conn.execute(f"alter subscription {online.name} set (slot_name = none)")
        conn.execute(f"drop subscription {online.name}")
    assert sorted(slots(databases.source)) == sorted([online.name, orphan])

    online.undo_replicate()

    assert leftovers(databases) == NOTHING


def test_catch_up_run_again_after_it_ended_the_replication_sets_the_sequences_and_finds_nothing_to_end(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    online.replicate()
    online.freeze()
    online.catch_up()

    again = online.catch_up()

    assert again.applied_lsn is None
    assert again.sequences == 3
    assert leftovers(databases) == NOTHING
    online.verify()
    online.undo_freeze()


def test_a_table_without_a_key_is_refused_unless_the_spec_allows_replica_identity_full(
    online: OnlineSteps, databases: Databases
) -> None:
    with connect(databases.source) as conn:
        conn.execute("create table public.notes (body text not null)")
        conn.execute("insert into public.notes select 'note ' || i from generate_series(1, 50) as i")

    with pytest.raises(InvalidSpec, match=r"public\.notes"):
        online.replicate()
    assert leftovers(databases) == NOTHING, "refused before anything was made"
    assert _target_is_empty(databases)
    assert replica_identity(databases.source, "public.notes") == "d"


def test_replica_identity_full_carries_updates_and_deletes_of_a_table_without_a_key_and_is_given_back(
    online: OnlineSteps, databases: Databases
) -> None:
    with connect(databases.source) as conn:
        conn.execute("create table public.notes (body text not null)")
        conn.execute("insert into public.notes select 'note ' || i from generate_series(1, 50) as i")
    online.driver = online.driver.model_copy(update={"allow_replica_identity_full": True})

    replicated = online.replicate()

    assert replicated.replica_identity_full == ["public.notes"]
    assert replica_identity(databases.source, "public.notes") == "f"
    with connect(databases.source) as conn:
        conn.execute("update public.notes set body = body || ' (edited)' where body like 'note 1%'")
        conn.execute("delete from public.notes where body = 'note 2'")
    frozen = online.freeze()
    online.catch_up()
    assert contents(databases.target) == contents(databases.source)
    assert replica_identity(databases.source, "public.notes") == "d", "given back once the replication ended"
    online.verify()
    online.check_frozen(frozen)  # giving the identity back on the frozen source is no write after the freeze
    online.undo_freeze()


def test_replicate_never_holds_the_applications_queries_behind_its_change_of_a_tables_identity(
    online: OnlineSteps, databases: Databases
) -> None:
    """A long transaction reads public.notes. REPLICA IDENTITY FULL needs the table's exclusive lock, and a statement
    waiting for it makes every later query of the table wait behind it: the application would stop until that
    transaction ends. replicate lets go of the lock after replication.LOCK_WAIT and tries again, so the application's
    queries go through meanwhile; it finishes once the long transaction has ended."""
    with connect(databases.source) as conn:
        conn.execute("create table public.notes (body text not null)")
        conn.execute("insert into public.notes select 'note ' || i from generate_series(1, 50) as i")
    online.driver = online.driver.model_copy(update={"allow_replica_identity_full": True})
    results: list[object] = []
    with connect(databases.source) as reading:
        reading.execute("begin")
        reading.execute("select count(*) from public.notes")  # holds the table's lock until it ends

        def replicate() -> None:
            try:
                results.append(online.replicate())
            except BaseException as error:  # noqa: BLE001 - the test reports it
                results.append(error)

        running = threading.Thread(target=replicate)
        running.start()
        eventually("replicate to ask for the table's lock", lambda: _waiting_to_alter(databases.source), timeout=60)
        with connect(databases.source) as application:
            application.execute("set statement_timeout = '15s'")
            assert application.execute("select count(*) from public.notes").fetchone() == (50,)
        reading.execute("commit")
    running.join(120)

    assert [type(result).__name__ for result in results] == ["ReplicateResult"]
    assert replica_identity(databases.source, "public.notes") == "f"
    online.undo_replicate()
    assert replica_identity(databases.source, "public.notes") == "d"
    assert leftovers(databases) == NOTHING


@pytest.mark.parametrize("superuser", [True, False], ids=["for-all-tables", "by-name-as-the-tables-owner"])
def test_no_table_is_published_without_the_replica_identity_its_updates_need_while_replicate_waits_for_a_lock(
    online: OnlineSteps, databases: Databases, heartbeats: list[dict[str, Any]], superuser: bool,
    kube_api: k8s.ApiClient, namespace: str,
) -> None:  # fmt: skip
    """A long transaction reads public.held, a table without a key, so replicate cannot give it REPLICA IDENTITY FULL
    yet (it waits LOCK_WAIT, lets go, tries again). Meanwhile the application updates public.notes, another table
    without a key: the source refuses the update of a table that is published without the identity it needs, so
    neither table may be published before both are FULL. A session looking all along never sees one that is. As a
    superuser ferry publishes FOR ALL TABLES; as the tables' owner with REPLICATION, every table by name."""
    with contextlib.ExitStack() as cleanup:
        publisher = databases.source
        if not superuser:
            publisher = cleanup.enter_context(database_owner(databases.source))
            with connect(databases.source) as conn:
                conn.execute(f'alter role "{publisher.user}" replication')
            create_secret(kube_api, namespace, TABLES_OWNER, connection_of(publisher))
            online.driver = online.driver.model_copy(update={"source_secret": TABLES_OWNER})
        with connect(publisher) as conn:
            for table in ("public.held", "public.notes"):
                conn.execute(f"create table {table} (body text not null)")
                conn.execute(f"insert into {table} select 'note ' || i from generate_series(1, 50) as i")
        online.driver = online.driver.model_copy(update={"allow_replica_identity_full": True})
        replicated, seen = _replicate_while_a_table_is_held(online, databases, heartbeats)

        assert seen == [], "a table was published without the replica identity its updates need"
        assert replicated.replica_identity_full == ["public.held", "public.notes"]
        with connect(databases.source) as conn:
            every_table = conn.execute("select puballtables from pg_publication").fetchall()
        assert every_table == [(superuser,)]
        eventually("the target to have the update", lambda: contents(databases.target) == contents(databases.source))
        online.undo_replicate()
        assert [replica_identity(databases.source, t) for t in ("public.held", "public.notes")] == ["d", "d"]
        assert leftovers(databases) == NOTHING


TABLES_OWNER = "tables-owner"


def _replicate_while_a_table_is_held(
    online: OnlineSteps, databases: Databases, heartbeats: list[dict[str, Any]]
) -> tuple[ReplicateResult, list[tuple[str, str]]]:
    """replicate, while a transaction holds public.held until replicate has let go of a lock it waited for and the
    application has updated public.notes; returns its result, and every table a session looking all along saw
    published without the replica identity its updates need."""
    results: list[object] = []
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def look() -> None:
        with connect(databases.source) as conn:
            while not done.is_set():
                seen.extend(conn.execute(PUBLISHED_WITHOUT_IDENTITY).fetchall())
                time.sleep(0.02)

    def replicate() -> None:
        try:
            results.append(online.replicate())
        except BaseException as error:  # noqa: BLE001 - the test reports it
            results.append(error)
        finally:
            done.set()

    looking = threading.Thread(target=look)
    looking.start()
    with connect(databases.source) as reading:
        reading.execute("begin")
        reading.execute("select count(*) from public.held")  # holds the table's lock until it ends
        running = threading.Thread(target=replicate)
        running.start()
        try:
            eventually("replicate to let go of a lock it waited for", lambda: _let_go_of_a_lock(heartbeats))
            with connect(databases.source) as application:
                application.execute("set statement_timeout = '15s'")
                # refused before the fix: "cannot update table "notes" because it does not have a replica identity
                # and publishes updates"
                application.execute("update public.notes set body = body || ' (edited)' where body like 'note 1%'")
        finally:
            reading.execute("commit")
            running.join(120)
            done.set()
            looking.join(30)
    assert [type(result).__name__ for result in results] == ["ReplicateResult"], results
    assert isinstance(results[0], ReplicateResult)
    return results[0], seen


PUBLISHED_WITHOUT_IDENTITY = """
select t.pubname, format('%I.%I', t.schemaname, t.tablename) from pg_publication_tables t
join pg_namespace n on n.nspname = t.schemaname
join pg_class c on c.relnamespace = n.oid and c.relname = t.tablename
where c.relreplident = 'n'
or (c.relreplident = 'd' and not exists (select from pg_index i where i.indrelid = c.oid and i.indisprimary))
"""
"""Tables published whose updates and deletes the source refuses: no replica identity."""


def _let_go_of_a_lock(heartbeats: list[dict[str, Any]]) -> bool:
    return any("waiting_for_lock" in details for details in list(heartbeats))


def _waits_then_goes_on(
    what: str, step: Callable[[], object], holder: psycopg.Connection[Any], heartbeats: list[dict[str, Any]]
) -> object:
    """Runs `step` in a thread while `holder` holds an advisory lock it needs (taken before it, or while it runs): it
    must say it waits for a lock and not end while the lock is held, then end once `holder` lets go; what it returned.
    """
    results: list[object] = []

    def run() -> None:
        try:
            results.append(step())
        except BaseException as error:  # noqa: BLE001 - the test reports it
            results.append(error)

    running = threading.Thread(target=run)
    running.start()
    try:
        eventually(f"{what} to say it waits for a lock", lambda: _let_go_of_a_lock(heartbeats), timeout=30)
        assert results == [], "it waits while the lock is held"
    finally:
        holder.execute("select pg_advisory_unlock_all()")
        running.join(120)
    assert len(results) == 1, f"{what} has not ended"
    return results[0]


def test_replicate_says_it_waits_for_the_lock_of_ferrys_records_and_goes_on_once_it_is_let_go(
    online: OnlineSteps, databases: Databases, heartbeats: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another Migration's replicate or end holds PUBLICATIONS_LOCK, its worker stopped in the middle of its
    transaction, just as this replicate records its subscription: it waits LOCK_WAIT at a time, heartbeating that
    it waits, rather than for as long as the other stands still, without a word, holding this Migration's lock."""
    create_shop(databases.source, customers=10, orders=10)
    create = subscription.create
    with connect(databases.source) as holder:

        def create_then_hold(*args: Any, **kwargs: Any) -> subscription.Subscription:
            made = create(*args, **kwargs)
            holder.execute("select pg_advisory_lock(%s)", (replication.PUBLICATIONS_LOCK,))
            return made

        monkeypatch.setattr(subscription, "create", create_then_hold)
        replicated = _waits_then_goes_on("replicate", online.replicate, holder, heartbeats)

    assert isinstance(replicated, ReplicateResult), replicated
    with connect(databases.source) as conn:
        record = replication.read_record(conn, online.name)
    assert record is not None
    assert record.subscription_oid is not None, "the subscription is recorded"
    online.undo_replicate()
    assert leftovers(databases) == NOTHING


def _waiting_to_alter(source: PostgresEndpoint) -> bool:
    with connect(source) as conn:
        row = conn.execute(
            "select count(*) from pg_stat_activity where wait_event_type = 'Lock' and query ilike 'alter table%'"
        ).fetchone()
    return bool(row and row[0])


def test_the_undo_gives_back_the_replica_identity_it_set(online: OnlineSteps, databases: Databases) -> None:
    with connect(databases.source) as conn:
        conn.execute("create table public.notes (body text not null)")
        conn.execute("alter table public.notes replica identity nothing")
    online.driver = online.driver.model_copy(update={"allow_replica_identity_full": True})
    online.replicate()
    assert replica_identity(databases.source, "public.notes") == "f"

    online.undo_replicate()

    assert replica_identity(databases.source, "public.notes") == "n"
    assert leftovers(databases) == NOTHING


def test_ddl_on_the_source_while_replicating_is_not_replicated_and_verify_names_it(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    online.replicate()
    with connect(databases.source) as conn:
        conn.execute("create index orders_by_total on shop.orders (total)")
    online.freeze()
    online.catch_up()

    with pytest.raises(VerificationMismatch) as mismatch:
        online.verify()

    assert "index shop.orders_by_total (missing in the target)" in str(mismatch.value)
    online.undo_catch_up()
    online.undo_freeze()
    online.undo_replicate()
    assert leftovers(databases) == NOTHING
    assert _target_is_empty(databases)
    with connect(databases.source) as conn:
        conn.execute("insert into shop.customers (email, created_at) values ('after@example.com', now())")


def test_a_column_added_on_the_source_and_written_stops_catch_up_with_replication_broken(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    online.replicate()
    with connect(databases.source) as conn:
        conn.execute("alter table shop.customers add column nickname text")
        conn.execute("insert into shop.customers (email, created_at, nickname) values ('x@example.com', now(), 'x')")
    online.freeze()

    with pytest.raises(ReplicationBroken) as broken:
        online.catch_up()

    assert "schema change on the source" in str(broken.value)
    assert "Roll back" in str(broken.value)
    online.undo_catch_up()
    online.undo_freeze()
    online.undo_replicate()
    assert leftovers(databases) == NOTHING
    assert _target_is_empty(databases)


def test_catch_up_fails_with_replication_broken_when_the_target_cannot_reach_the_source_though_no_error_is_counted(
    online: OnlineSteps, databases: Databases
) -> None:
    """The apply worker that cannot connect fails before pg_stat_subscription_stats counts anything, and tries again
    forever. Pointing the subscription at a port nothing listens on stands in for a network or pg_hba.conf outage."""
    create_shop(databases.source, customers=100, orders=1_000)
    online.replicate()
    with connect(databases.target) as conn:
        source = databases.source
        conn.execute(
            f"alter subscription {online.name} connection "
            f"'host=127.0.0.1 port=1 user={source.user} password={source.password} dbname={source.database}'"
        )
    with connect(databases.source) as conn:
        conn.execute("insert into shop.customers (email, created_at) values ('late@example.com', now())")
    online.freeze()

    bound = threading.Timer(120, online.env.cancel)  # only a wait that never counts the stall gets there
    bound.start()
    try:
        with pytest.raises(ReplicationBroken) as broken:
            online.catch_up()
    except CancelledError:
        pytest.fail("catch-up still waited for a subscription that does not stream")
    finally:
        bound.cancel()

    assert "is not streaming from the source" in str(broken.value)
    online.undo_catch_up()
    online.undo_freeze()
    online.undo_replicate()
    assert leftovers(databases) == NOTHING


def test_the_subscription_connects_where_the_secret_says_the_target_reaches_the_source(
    online: OnlineSteps, databases: Databases, stack: StackInfo
) -> None:
    """replicationHost and replicationPort: here a port nothing listens on, so subscribing fails, saying where."""
    from activities.secrets import DatabaseConnection

    create_shop(databases.source, customers=10, orders=10)
    source = databases.source
    unreachable = DatabaseConnection(
        source.host, source.port, source.user, source.password, source.database, "t/source",
        replication_host="127.0.0.1", replication_port=1,
    )  # fmt: skip
    with connect(databases.target) as conn, pytest.raises(InvalidSpec) as refused:
        subscription.create(conn, online.name, unreachable, DataActivitySettings(connect_timeout=2))

    assert "could not connect to the source at 127.0.0.1:1" in str(refused.value)
    assert "replicationHost" in str(refused.value)
    assert source.password not in str(refused.value)
    with connect(databases.target) as conn:
        assert subscription.find(conn, online.name) is None
    # A failed statement is logged with its text (log_min_error_statement): not this one, which holds the password.
    target_log = (stack.logs_dir / "postgres-target.log").read_text(errors="replace")
    assert online.name in target_log, "the failure is logged"
    assert source.password not in target_log


def test_a_slot_cannot_outlive_the_undo_even_when_the_subscription_is_still_enabled(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    online.replicate()
    with connect(databases.source) as conn:  # the walsender is busy: the undo must end it before dropping the slot
        row = conn.execute("select active from pg_replication_slots where slot_name = %s", (online.name,)).fetchone()
    assert row == (True,)

    online.undo_replicate()

    assert leftovers(databases) == NOTHING
    with pytest.raises(psycopg.errors.UndefinedObject), connect(databases.source) as conn:
        conn.execute("select pg_drop_replication_slot(%s)", (online.name,))


def _compared_ahead(verified: VerifyResult) -> dict[str, bool]:
    return {check.table: check.ahead for check in verified.tables}


def test_replicate_compares_the_tables_ahead_and_verify_reads_again_only_those_written_since(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=200, orders=3_000)
    replicated = online.replicate()
    assert replicated.ahead is not None
    assert sorted(table.table for table in replicated.ahead.tables) == ["audit.log", "shop.customers", "shop.orders"]
    writer = connect(databases.source)  # still open at the freeze: its counts may not be flushed until it ends
    writer.execute("insert into shop.customers (email, created_at) values ('late@example.com', now())")
    online.freeze()
    writer.close()
    online.catch_up()

    verified = online.verify(replicated.ahead)

    assert _compared_ahead(verified) == {"audit.log": True, "shop.customers": False, "shop.orders": True}
    assert all(check.equal for check in verified.tables)
    assert contents(databases.target) == contents(databases.source)
    online.undo_freeze()


def test_a_row_changed_on_the_target_after_the_comparison_ahead_is_found_by_verify(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=200, orders=3_000)
    replicated = online.replicate()
    with connect(databases.target) as conn:  # behind the replication's back: the source never wrote this
        conn.execute("update shop.orders set total = total + 1 where id = 7")
    online.freeze()
    online.catch_up()

    with pytest.raises(VerificationMismatch) as mismatch:
        online.verify(replicated.ahead)

    assert "shop.orders (same 3000 rows, different contents)" in str(mismatch.value)
    online.undo_freeze()


def test_a_column_added_with_a_fast_default_on_both_sides_after_the_comparison_ahead_is_found_by_verify(
    online: OnlineSteps, databases: Databases
) -> None:
    """DEFAULT now() is evaluated once per server and kept in the catalog: no row is written, no file changes, both
    schemas say `default now()`, yet every row of the table reads another value on each side."""
    create_shop(databases.source, customers=200, orders=3_000)
    replicated = online.replicate()
    assert replicated.ahead is not None
    assert "shop.orders" in {table.table for table in replicated.ahead.tables}
    for side in (databases.target, databases.source):  # the subscriber first, the usual order for DDL
        with connect(side) as conn:
            conn.execute("alter table shop.orders add column checked_at timestamptz default now()")
        time.sleep(0.05)
    online.freeze()
    online.catch_up()

    with pytest.raises(VerificationMismatch) as mismatch:
        online.verify(replicated.ahead)

    assert "shop.orders (same 3000 rows, different contents)" in str(mismatch.value)
    online.undo_freeze()


def test_statistics_reset_since_the_comparison_ahead_make_verify_read_every_table_again(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=200, orders=3_000)
    replicated = online.replicate()
    with connect(databases.target) as conn:
        conn.execute("select pg_stat_reset_single_table_counters('shop.orders'::regclass)")
    online.freeze()
    online.catch_up()

    verified = online.verify(replicated.ahead)

    assert not any(_compared_ahead(verified).values()), "the counts can no longer vouch for anything"
    assert all(check.equal for check in verified.tables)
    online.undo_freeze()


def test_replicate_names_a_prepared_transaction_that_would_hold_its_replication_slot_instead_of_waiting(
    online: OnlineSteps, databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot is ready only once every transaction running on the server has ended, prepared ones included: one
    its coordinator never ends held replicate until its timeout, saying nothing. The wait is lowered to 1 s here; a
    timer ends the transaction after 20 s, so the code before the fix (which waited) returned instead of raising."""
    monkeypatch.setattr(replicating, "PREPARED_WAIT", 1.0)
    create_shop(databases.source, customers=10, orders=10)
    gid = f"xa-{uuid.uuid4().hex[:8]}"
    with connect(databases.source) as conn:
        conn.execute("begin")
        conn.execute("insert into audit.log (order_id, note) values (1, 'prepared')")
        conn.execute(f"prepare transaction '{gid}'")

    def resolve() -> None:
        with connect(databases.source) as conn:
            if conn.execute("select from pg_prepared_xacts where gid = %s", (gid,)).fetchone() is not None:
                conn.execute(f"rollback prepared '{gid}'")

    timer = threading.Timer(20, resolve)
    timer.start()
    try:
        with pytest.raises(PreparedTransactionsPending) as raised:
            online.replicate()
    finally:
        timer.cancel()
        resolve()
        online.undo_replicate()

    message = str(raised.value)
    assert f"'{gid}' (owner postgres, prepared " in message
    assert f"in database {databases.source.database}" in message
    assert "the step is retried" in message


def _matview_rows(endpoint: PostgresEndpoint) -> dict[str, object]:
    """Each materialized view of schema shop: whether it is populated, and its rows when it is."""
    with connect(endpoint) as conn:
        views = conn.execute(
            "select format('%I.%I', schemaname, matviewname), ispopulated from pg_matviews "
            "where schemaname = 'shop' order by 1"
        ).fetchall()
        return {
            name: sorted(conn.execute(f"select * from {name}").fetchall()) if populated else "not populated"
            for name, populated in views
        }


def test_catch_up_fills_the_materialized_views_the_source_has_populated_in_dependency_order(
    online: OnlineSteps, databases: Databases
) -> None:
    """pg_dump --schema-only creates them WITH NO DATA, and logical replication does not fill them."""
    create_shop(databases.source, customers=50, orders=500)
    with connect(databases.source) as conn:
        # Named so that the alphabetical order is the wrong one: each reads one named after it.
        conn.execute(
            "create materialized view shop.z_customer_totals as "
            "select customer_id, count(*) as orders, sum(total) as spent from shop.orders group by customer_id"
        )
        conn.execute("create view shop.m_big_spenders as select * from shop.z_customer_totals where spent > 5000")
        conn.execute("create materialized view shop.b_big_spender_count as select count(*) from shop.m_big_spenders")
        conn.execute(
            "create materialized view shop.a_top_customers as "
            "select customer_id from shop.z_customer_totals order by spent desc limit 5"
        )
        conn.execute("create materialized view shop.c_never_filled as select id from shop.orders with no data")
    online.replicate()
    with connect(databases.source) as conn:  # written while replicating, refreshed on the source before the freeze
        conn.execute("update shop.orders set total = total + 1 where customer_id = 7")
        for view in ("z_customer_totals", "a_top_customers", "b_big_spender_count"):
            conn.execute(f"refresh materialized view shop.{view}")
    online.freeze()

    online.catch_up()

    filled = _matview_rows(databases.target)
    assert filled == _matview_rows(databases.source)
    assert filled["shop.c_never_filled"] == "not populated", "what the source never filled stays unpopulated"
    assert len(filled["shop.a_top_customers"]) == 5  # type: ignore[arg-type]
    online.verify()  # compares the populated materialized views' rows and every one's populated flag
    online.undo_freeze()


def test_an_end_says_it_waits_for_the_lock_of_the_ended_record_and_goes_on_once_it_is_let_go(
    online: OnlineSteps, databases: Databases, heartbeats: list[dict[str, Any]]
) -> None:
    """The end of another Migration's replication of the same source, its worker stopped in the middle of its
    transaction, holds the lock under which ends record themselves on the source (replication_ended.SETTING_LOCK): this
    end waits LOCK_WAIT at a time, heartbeating that it waits and cancellable, rather than silently for as long."""
    create_shop(databases.source, customers=10, orders=10)
    online.replicate()

    with connect(databases.source) as holder:
        holder.execute("select pg_advisory_lock(%s)", (replication_ended.SETTING_LOCK,))
        ended = _waits_then_goes_on("the end", online.undo_replicate, holder, heartbeats)

    assert type(ended).__name__ == "EndReplicationResult", ended
    assert leftovers(databases) == NOTHING
    with connect(databases.source) as conn:
        assert online.ref.uid in replication_ended.read(conn), "the end is recorded"


def test_replicate_copies_relations_in_a_tablespace_the_target_lacks_into_its_default_one(
    online: OnlineSteps, databases: Databases
) -> None:
    """The schema copy's restore leaves tablespaces out, as migrate's does: it would stop at the first one the target's
    server lacks."""
    create_shop(databases.source, customers=100, orders=1_000)
    with tablespace(databases.source) as fast:
        with connect(databases.source) as conn:
            conn.execute(f"alter table shop.orders set tablespace {fast}")
            conn.execute(f"alter index shop.orders_by_customer set tablespace {fast}")

        replicated = online.replicate()
        online.freeze()
        online.catch_up()
        online.verify()
        online.undo_freeze()

    assert replicated.schema_copied
    assert contents(databases.target) == contents(databases.source)
    assert set(tablespaces_of(databases.target).values()) == {"pg_default"}
