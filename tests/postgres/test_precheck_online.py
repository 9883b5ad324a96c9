"""The precheck of mode Online refuses, before anything changes, what logical replication cannot do, saying what to do.

Each refusal is listed with every other problem of the precheck (one round of fixing is
enough). The stack's source instance runs with wal_level=logical; its target instance
does not, so a "source" Secret pointing into the target instance shows that refusal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from kubernetes import client as k8s

from devstack.stack.postgres import PostgresEndpoint
from ferry.api.migration import DriverMode
from ferry.api.saga import MigrationRef
from tests.end_to_end import Databases
from tests.postgres.conftest import create_secret, precheck_problems
from tests.postgres.data import connect, connection_of, create_shop, database_owner, database_settings
from tests.postgres.online import NOTHING, OnlineSteps, leftovers

OTHER = "other-db"


@pytest.fixture
def ref(applied_ref: MigrationRef) -> MigrationRef:
    """A Migration that exists: the precheck reads it after marking its Secrets."""
    return applied_ref


def _problems(online: OnlineSteps, **changes: Any) -> list[str]:
    """The numbered problems of the PrecheckFailed that the precheck raises."""
    return precheck_problems(online.precheck, **changes)


def _with(online: OnlineSteps, **driver: Any) -> OnlineSteps:
    online.driver = online.driver.model_copy(update=driver)
    return online


@contextlib.contextmanager
def _free_slots_taken(source: PostgresEndpoint, leave: int) -> Iterator[None]:
    """Physical slots (they count against max_replication_slots too) until only `leave` are free; dropped after."""
    with connect(source) as conn:
        row = conn.execute(
            "select current_setting('max_replication_slots')::int - (select count(*) from pg_replication_slots)"
        ).fetchone()
        assert row is not None
        taken = [f"t_taken_{number}" for number in range(max(0, row[0] - leave))]
        for slot in taken:
            conn.execute("select pg_create_physical_replication_slot(%s)", (slot,))
    try:
        yield
    finally:
        with connect(source) as conn:
            for slot in taken:
                conn.execute("select pg_drop_replication_slot(%s)", (slot,))


@contextlib.contextmanager
def _free_senders_taken(source: PostgresEndpoint, leave: int) -> Iterator[None]:
    """Idle replication connections, each a WAL sender, until only `leave` senders are free."""
    with connect(source) as conn:
        row = conn.execute(
            "select current_setting('max_wal_senders')::int "
            "- (select count(*) from pg_stat_activity where backend_type = 'walsender')"
        ).fetchone()
    assert row is not None
    senders = [
        psycopg.connect(source.dsn, replication="database", autocommit=True) for _ in range(max(0, row[0] - leave))
    ]
    try:
        yield
    finally:
        for sender in senders:
            sender.close()


def test_the_precheck_of_a_sound_online_migration_passes_and_changes_nothing(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)

    result = online.precheck()

    assert result.source_version.startswith("15.")
    assert leftovers(databases) == NOTHING
    assert database_settings(databases.source) == []


def test_a_source_without_wal_level_logical_is_refused_naming_the_setting_and_the_restart(
    online: OnlineSteps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """The stack's target instance keeps wal_level=replica: a source Secret pointing there meets the refusal."""
    create_shop(databases.target, customers=10, orders=10)
    empty = _empty_database(databases.target)
    with empty as other:
        create_secret(kube_api, namespace, OTHER, connection_of(databases.target))
        create_secret(kube_api, namespace, "empty-target", connection_of(other))
        online.driver = online.driver.model_copy(update={"source_secret": OTHER, "target_secret": "empty-target"})

        (problem,) = _problems(online)

    assert "has wal_level=replica; mode Online needs wal_level=logical" in problem
    assert "ALTER SYSTEM SET wal_level = logical" in problem
    assert "and restart that server: wal_level only changes with a restart. Or use mode Snapshot." in problem


def test_too_few_free_replication_slots_and_wal_senders_are_refused_with_how_many_are_needed(
    online: OnlineSteps, databases: Databases
) -> None:
    create_shop(databases.source, customers=10, orders=10)
    # The subscription's slot and sender, and one per table the target copies at once (2 by default): 3 of each.
    with _free_slots_taken(databases.source, leave=2), _free_senders_taken(databases.source, leave=2):
        (problem,) = _problems(online)

    assert "has 2 free replication slots and 2 free WAL senders; mode Online needs 3 of each" in problem
    assert "Raise max_replication_slots (now 10) and max_wal_senders (now 10) and restart that server" in problem


def test_a_user_without_replication_who_does_not_own_the_tables_is_refused(
    online: OnlineSteps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    create_shop(databases.source, customers=10, orders=10)  # the tables belong to postgres
    with database_owner(databases.source) as owner:
        create_secret(kube_api, namespace, OTHER, connection_of(owner))
        online.driver = online.driver.model_copy(update={"source_secret": OTHER})

        problems = _problems(online)

    assert len(problems) == 2
    assert problems[0].startswith(f"the user in Secret {namespace}/{OTHER} has no REPLICATION attribute")
    assert problems[0].endswith(f"ALTER ROLE {owner.user} REPLICATION, or use a superuser.")
    assert "it does not own audit.log, shop.customers, shop.orders." in problems[1]


def test_a_target_user_that_may_not_create_a_subscription_is_refused(
    online: OnlineSteps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    with database_owner(databases.target) as owner:
        create_secret(kube_api, namespace, OTHER, connection_of(owner))
        online.driver = online.driver.model_copy(update={"target_secret": OTHER})

        (problem,) = _problems(online)

    assert problem.startswith(f"the user in Secret {namespace}/{OTHER} may not create a subscription in database")
    assert "GRANT pg_create_subscription TO that user" in problem


def test_tables_without_a_key_are_refused_by_name_unless_replica_identity_full_is_allowed(
    online: OnlineSteps, databases: Databases
) -> None:
    with connect(databases.source) as conn:
        conn.execute("create table public.notes (body text)")
        conn.execute("create table public.tags (tag text primary key)")
        conn.execute("create table public.visits (at timestamptz)")
        conn.execute("alter table public.tags replica identity nothing")

    (problem,) = _problems(online)

    assert "have no primary key and no replica identity" in problem
    assert ": public.notes, public.tags, public.visits." in problem
    assert "set spec.driver.allowReplicaIdentityFull: true" in problem
    _with(online, allow_replica_identity_full=True).precheck()


def test_a_keyless_table_whose_column_cannot_be_compared_is_refused_even_with_replica_identity_full_allowed(
    online: OnlineSteps, databases: Databases
) -> None:
    """With REPLICA IDENTITY FULL the target finds an updated or deleted row by comparing every column; json, point and
    xml have no equality operator, and the replication would stop at the first UPDATE of such a table."""
    with connect(databases.source) as conn:
        conn.execute("create domain public.payload as json")
        conn.execute(
            "create table public.events (kind varchar(20), body json, spots point[], wrapped public.payload, "
            "doc jsonb, tags text[], during tstzrange, size bigint generated always as (length(kind)) stored)"
        )
        conn.execute("create table public.comparable (kind varchar(20), doc jsonb, tags text[], during tstzrange)")

    (problem,) = _problems(_with(online, allow_replica_identity_full=True))

    assert (
        "their types have no equality operator: public.events.body (json), public.events.spots (point), "
        "public.events.wrapped (json). "
    ) in problem
    assert "comparable" not in problem
    assert "Give those tables a primary key" in problem

    with connect(databases.source) as conn:
        conn.execute("alter table public.events add column id bigint generated always as identity primary key")
    _with(online, allow_replica_identity_full=True).precheck()


def test_a_deferrable_primary_key_counts_as_no_key_since_postgresql_does_not_take_it_as_the_replica_identity(
    online: OnlineSteps, databases: Databases
) -> None:
    """Published with it, the table's every UPDATE and DELETE on the source would fail for the whole replicate."""
    with connect(databases.source) as conn:
        conn.execute("create table public.ledger (id int primary key deferrable initially deferred, amount int)")

    (problem,) = _problems(online)

    assert ": public.ledger." in problem
    _with(online, allow_replica_identity_full=True).precheck()


def test_unlogged_tables_and_large_objects_are_refused_with_the_other_problems(
    online: OnlineSteps, databases: Databases
) -> None:
    with connect(databases.source) as conn:
        conn.execute("create unlogged table public.cache (key text primary key, value text)")
        conn.execute("select lo_from_bytea(0, 'a large object')")
        conn.execute("create table public.notes (body text)")

    problems = _problems(online)

    assert len(problems) == 3, "every problem at once"
    assert "public.notes" in problems[0]
    assert "are unlogged, and logical replication only carries what the WAL holds: public.cache." in problems[1]
    assert "ALTER TABLE ... SET LOGGED, or use mode Snapshot." in problems[1]
    assert "has large objects, which logical replication does not carry. Use mode Snapshot" in problems[2]


def test_a_table_hash_partitioned_on_an_enum_is_refused_since_its_rows_would_go_to_other_partitions(
    online: OnlineSteps, databases: Databases
) -> None:
    with connect(databases.source) as conn:
        conn.execute("create type public.tier as enum ('bronze', 'silver')")
        conn.execute("create domain public.level as public.tier")
        for name, key in (("by_tier", "public.tier"), ("by_level", "public.level"), ("by_number", "int")):
            conn.execute(
                f"create table public.{name} (key {key}, id int, primary key (key, id)) partition by hash (key)"
            )
            conn.execute(
                f"create table public.{name}_0 partition of public.{name} for values with (modulus 1, remainder 0)"
            )

    problems = _problems(online)

    assert len(problems) == 1
    assert problems[0].endswith(
        "are hash-partitioned on an enum, whose hash is its oid, which differs in the target: replicated by "
        "partition, their rows would be refused by the target's partitions: public.by_level, public.by_tier. Use "
        "mode Snapshot, which loads them through their root."
    )


def test_triggers_enabled_always_or_replica_are_refused_since_they_would_fire_again_for_every_replicated_change(
    online: OnlineSteps, databases: Databases
) -> None:
    """The target's subscription copies and applies as a replica, which fires a trigger enabled ALWAYS or REPLICA
    (the schema copy carries that state): the audit row the source's trigger wrote, replicated, would be written a
    second time by the target's. Ordinary and disabled triggers never fire there."""
    with connect(databases.source) as conn:
        conn.execute("create table public.notes_audit (id bigint generated always as identity primary key, note int)")
        conn.execute(
            "create function public.audited() returns trigger language plpgsql as "
            "$$ begin insert into public.notes_audit (note) values (new.id); return new; end $$"
        )
        conn.execute("create table public.notes (id int primary key, body text)")
        conn.execute("create table public.ledger (id int primary key, amount int)")
        conn.execute(
            "create table public.events (at date, id int, primary key (at, id)) partition by range (at); "
            "create table public.events_2025 partition of public.events for values from ('2025-01-01') to "
            "('2026-01-01'); create table public.events_2026 partition of public.events for values from "
            "('2026-01-01') to ('2027-01-01')"
        )
        for table, trigger, state in (
            ("notes", "noted", "enable always"),
            ("ledger", "stamped", "enable replica"),
            ("ledger", "counted", "enable"),
            ("ledger", "paused", "disable"),
            ("events", "noted", "enable always"),
        ):
            conn.execute(
                f"create trigger {trigger} after insert or update on public.{table} for each row "
                "execute function public.audited()"
            )
            conn.execute(f"alter table public.{table} {state} trigger {trigger}")
        # The partitions' clones follow the parent's state (named once, by the parent) but for one changed alone.
        conn.execute("alter table public.events_2026 enable replica trigger noted")

    (problem,) = _problems(online)

    assert problem.startswith(f"these triggers of database '{databases.source.database}' on ")
    assert (
        " are enabled ALWAYS or REPLICA: public.events.noted (ALWAYS), public.events_2026.noted (REPLICA), "
        "public.ledger.stamped (REPLICA), public.notes.noted (ALWAYS). The target's subscription copies and applies "
        "every change as a replica, so they would fire on the target for each one"
    ) in problem
    assert "so its effect would happen twice" in problem
    assert (
        "ALTER TABLE ... ENABLE TRIGGER name each ALWAYS one (plain ENABLE fires on the source's own writes only, as "
        "before) and ALTER TABLE ... DISABLE TRIGGER name each REPLICA one"
    ) in problem
    assert problem.endswith("Or use spec.driver.mode Snapshot.")
    assert "counted" not in problem
    assert "paused" not in problem
    _with(online, mode=DriverMode.SNAPSHOT).precheck()

    with connect(databases.source) as conn:
        conn.execute("alter table public.notes enable trigger noted")
        conn.execute("alter table public.events enable trigger noted")
        conn.execute("alter table public.ledger disable trigger stamped")
    _with(online, mode=DriverMode.ONLINE).precheck()


def test_a_source_that_keeps_wal_for_a_slot_without_bound_passes_with_a_warning_event_suggesting_a_bound(
    online: OnlineSteps, databases: Databases, kube_api: k8s.ApiClient
) -> None:
    """The stack's source has PostgreSQL's default, max_slot_wal_keep_size -1: a replication that broke would keep
    its WAL until its disk filled. Not a refusal: ferry watches the replication, but a bound protects the source."""
    with connect(databases.source) as conn:
        row = conn.execute("select current_setting('max_slot_wal_keep_size')").fetchone()
    assert row is not None
    assert row[0] == "-1"

    result = online.precheck()

    [unbounded] = [warning for warning in result.warnings if "max_slot_wal_keep_size" in warning]
    assert "max_slot_wal_keep_size = -1" in unbounded
    assert "until its disk fills" in unbounded
    assert "ALTER SYSTEM SET max_slot_wal_keep_size" in unbounded
    events = k8s.CoreV1Api(kube_api).list_namespaced_event(online.ref.namespace).items
    warned = [event for event in events if event.reason == "PrecheckWarning" and "max_slot_wal" in event.message]
    assert [(event.type, event.involved_object.uid) for event in warned] == [("Warning", online.ref.uid)]
    assert "max_slot_wal_keep_size = -1" in warned[0].message
    in_snapshot = _with(online, mode=DriverMode.SNAPSHOT).precheck().warnings
    assert not [w for w in in_snapshot if "max_slot_wal_keep_size" in w], "mode Snapshot keeps no slot"


def test_mode_snapshot_asks_none_of_this(online: OnlineSteps, databases: Databases) -> None:
    with connect(databases.source) as conn:
        conn.execute("create unlogged table public.cache (key text primary key, value text)")
        conn.execute("create table public.notes (body text)")

    _with(online, mode=DriverMode.SNAPSHOT).precheck()


@contextlib.contextmanager
def _empty_database(admin: PostgresEndpoint) -> Iterator[PostgresEndpoint]:
    """Another empty database in the same instance, dropped after."""
    name = f"{admin.database}_empty"
    with connect(admin) as conn:
        conn.execute(f'create database "{name}"')
    try:
        yield PostgresEndpoint(admin.host, admin.port, admin.user, admin.password, name)
    finally:
        with connect(admin) as conn:
            conn.execute(f'drop database if exists "{name}" with (force)')


def test_a_source_another_migration_replicates_is_refused_naming_that_migration(
    online: OnlineSteps, databases: Databases
) -> None:
    """The freeze of either Migration would end the other's replication connections; replicate asks again where it
    publishes (tests/postgres/test_replicate_one_source_twice.py)."""
    create_shop(databases.source, customers=10, orders=10)
    with connect(databases.source) as conn:
        conn.execute("create publication ferry_0ther for all tables")
        conn.execute("""comment on publication ferry_0ther is '{"owner": "shop/orders-db-to-17/0ther"}'""")

    (problem,) = _problems(online)

    assert problem.startswith(f"database '{databases.source.database}' on ")
    assert (
        "is being replicated by another Migration already: publication ferry_0ther (Migration "
        "shop/orders-db-to-17/0ther). Online Migrations of one source run one at a time"
    ) in problem
    assert "Wait until that Migration has finished or rolled back, or use mode Snapshot." in problem


def test_the_refusal_says_to_give_back_the_identities_a_leftover_publications_record_keeps_before_dropping_it(
    online: OnlineSteps, databases: Databases
) -> None:
    """A ferry publication's record may keep the identity of tables its own replicate never touched: another
    Migration's end handed them over. Dropped first, the publication takes the record along, and the tables stay
    REPLICA IDENTITY FULL for good."""
    with connect(databases.source) as conn:
        conn.execute("create table public.notes (body text not null)")
        conn.execute("alter table public.notes replica identity full")
        conn.execute("create publication ferry_0ther for all tables")
        conn.execute(
            """comment on publication ferry_0ther is """
            """'{"owner": "shop/orders-db-to-17/0ther", "replica_identity": {"public.notes": "d"}}'"""
        )

    (problem,) = _problems(online)

    restore = problem.index("ALTER TABLE public.notes REPLICA IDENTITY DEFAULT")
    assert restore < problem.index("DROP PUBLICATION ferry_0ther"), problem
    assert "pg_drop_replication_slot('ferry_0ther')" in problem
    with connect(databases.source) as conn:
        conn.execute("drop publication ferry_0ther")
