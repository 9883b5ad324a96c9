"""Two Migrations of mode Online with one source database: one replicates at a time, and no end breaks another's.

REPLICA IDENTITY FULL is what lets the source publish the updates and deletes of a table
without a key; taken away while a publication still publishes the table, every UPDATE
and DELETE of it on the live source fails. The end of a replication gives back only what
no other publication needs (a ferry Migration's record takes the duty over), and
replicate refuses a source another Migration replicates already, at the moment it
publishes: the precheck's refusal comes hours earlier, before provision and the recovery
snapshot, when the other Migration may not have published yet.

A is the `online` fixture's Migration; B (`second`) exists in the cluster (its precheck
reads it) and replicates the same source into another database of the target instance.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from kubernetes import client as k8s
from temporalio.testing import ActivityEnvironment

from activities.postgres import replication, schema_copy
from activities.postgres.connection import Session
from devstack.stack.postgres import PostgresEndpoint
from ferry.api.errors import InvalidSpec
from ferry.api.saga import MigrationRef
from tests.cluster import eventually
from tests.end_to_end import Databases
from tests.postgres.conftest import create_secret
from tests.postgres.data import connect, connection_of
from tests.postgres.online import NOTHING, OnlineSteps, leftovers, replica_identity

SECOND_TARGET = "second-target"
NOTES = "public.notes"


@pytest.fixture
def second_target(databases: Databases) -> Iterator[PostgresEndpoint]:
    """Another empty database in the target instance, dropped after (with any subscription left in it)."""
    admin = databases.target
    endpoint = dataclasses.replace(admin, database=f"{admin.database}_second")
    with connect(admin) as conn:
        conn.execute(f'create database "{endpoint.database}"')
    yield endpoint
    with connect(endpoint) as conn:
        for name in _subscriptions(endpoint):
            conn.execute(f'alter subscription "{name}" disable')
            conn.execute(f'alter subscription "{name}" set (slot_name = none)')
            conn.execute(f'drop subscription "{name}"')
    with connect(admin) as conn:
        conn.execute(f'drop database if exists "{endpoint.database}" with (force)')


@pytest.fixture
def second(
    online: OnlineSteps, applied_ref: MigrationRef, second_target: PostgresEndpoint, kube_api: k8s.ApiClient
) -> OnlineSteps:
    """Migration B: the same source as `online`, its own target database, both allowing REPLICA IDENTITY FULL."""
    create_secret(kube_api, applied_ref.namespace, SECOND_TARGET, connection_of(second_target))
    online.driver = online.driver.model_copy(update={"allow_replica_identity_full": True})
    driver = online.driver.model_copy(update={"target_secret": SECOND_TARGET})
    return dataclasses.replace(online, env=ActivityEnvironment(), ref=applied_ref, driver=driver)


def _subscriptions(endpoint: PostgresEndpoint) -> list[str]:
    """The subscriptions of the endpoint's database (pg_subscription holds those of every database)."""
    with connect(endpoint) as conn:
        rows = conn.execute(
            "select subname from pg_subscription where subdbid = (select oid from pg_database where datname = %s)",
            (endpoint.database,),
        ).fetchall()
    return [row[0] for row in rows]


def _only(online: OnlineSteps) -> dict[str, list[str]]:
    """What `leftovers` finds while only `online` replicates."""
    return {"slots": [online.name], "publications": [online.name], "subscriptions": [online.name]}


def _notes(source: PostgresEndpoint) -> None:
    """A table without a key: replicated, its updates need REPLICA IDENTITY FULL."""
    with connect(source) as conn:
        conn.execute(f"create table {NOTES} (body text not null)")
        conn.execute(f"insert into {NOTES} select 'note ' || i from generate_series(1, 50) as i")


def _edit_notes(source: PostgresEndpoint, like: str) -> None:
    with connect(source) as conn:
        conn.execute(f"update {NOTES} set body = body || ' (edited)' where body like %s", (like,))


def _edited(endpoint: PostgresEndpoint) -> int:
    with connect(endpoint) as conn:
        row = conn.execute(f"select count(*) from {NOTES} where body like '%(edited)'").fetchone()
    assert row is not None
    return int(row[0])


def _both_replicating(online: OnlineSteps, second: OnlineSteps, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replicates, then B, as two Migrations started by a ferry without replicate's refusal could (both running when
    ferry was upgraded): B's replicate is let past it, and finds the table FULL already, made so by A."""
    online.replicate()
    with monkeypatch.context() as patched:
        patched.setattr(replication, "other_replications", lambda conn, publication: [], raising=False)
        replicated = second.replicate()
    assert replicated.replica_identity_full == [], "B found the table FULL: it set nothing itself"


def test_the_end_of_one_replication_leaves_replica_identity_full_to_another_that_publishes_the_table(
    online: OnlineSteps, second: OnlineSteps, databases: Databases, second_target: PostgresEndpoint,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    _notes(databases.source)
    _both_replicating(online, second, monkeypatch)

    online.undo_replicate()  # A rolls back while B still replicates

    _edit_notes(databases.source, "note 1%")  # the application's update: refused before the fix
    assert replica_identity(databases.source, NOTES) == "f", "B's publication still publishes the table"
    eventually("B's target to receive the update", lambda: _edited(second_target) == 11)
    assert leftovers(databases)["publications"] == [second.name]

    second.undo_replicate()

    assert replica_identity(databases.source, NOTES) == "d", "the last end gave back the identity from before either"
    assert leftovers(databases) == NOTHING


def test_the_end_of_a_replication_leaves_replica_identity_full_to_a_publication_made_by_hand(
    online: OnlineSteps, databases: Databases, caplog: pytest.LogCaptureFixture
) -> None:
    """Someone's own logical replication, publishing every table of schema public, relies on the FULL ferry set."""
    _notes(databases.source)
    online.driver = online.driver.model_copy(update={"allow_replica_identity_full": True})
    online.replicate()
    with connect(databases.source) as conn:
        conn.execute("create publication by_hand for tables in schema public")

    online.undo_replicate()

    _edit_notes(databases.source, "note 2%")  # refused before the fix
    assert replica_identity(databases.source, NOTES) == "f"
    (warning,) = [record.getMessage() for record in caplog.records if "REPLICA IDENTITY FULL" in record.getMessage()]
    assert f"left {NOTES} of database '{databases.source.database}'" in warning
    assert "publication by_hand, not ferry's" in warning
    assert f"give it back: ALTER TABLE {NOTES} REPLICA IDENTITY DEFAULT (" in warning
    with connect(databases.source) as conn:
        assert conn.execute("select pubname from pg_publication").fetchall() == [("by_hand",)]
        conn.execute("drop publication by_hand")
    assert leftovers(databases) == NOTHING


def test_a_partition_stays_full_while_a_publication_made_by_hand_publishes_it_through_its_root(
    online: OnlineSteps, databases: Databases
) -> None:
    """publish_via_partition_root lists only the root in pg_publication_tables; the partition's updates are published
    all the same, and need its identity."""
    with connect(databases.source) as conn:
        conn.execute("create table public.events (at date not null, body text) partition by range (at)")
        conn.execute(
            "create table public.events_2026 partition of public.events for values from ('2026-01-01') to (maxvalue)"
        )
        conn.execute("insert into public.events select date '2026-01-01' + i, 'event' from generate_series(1, 20) as i")
    online.driver = online.driver.model_copy(update={"allow_replica_identity_full": True})
    assert online.replicate().replica_identity_full == ["public.events_2026"]
    with connect(databases.source) as conn:
        conn.execute("create publication by_hand for table public.events with (publish_via_partition_root = true)")

    online.undo_replicate()

    with connect(databases.source) as conn:
        conn.execute("update public.events set body = 'edited' where at < date '2026-01-05'")  # refused before the fix
        conn.execute("drop publication by_hand")
    assert replica_identity(databases.source, "public.events_2026") == "f"


def test_a_replicate_whose_precheck_passed_before_another_migration_published_the_source_is_refused(
    online: OnlineSteps, second: OnlineSteps, databases: Databases, second_target: PostgresEndpoint
) -> None:
    _notes(databases.source)
    second.precheck()  # A has not published yet: B passes

    online.replicate()
    with pytest.raises(InvalidSpec) as refused:
        second.replicate()

    message = str(refused.value)
    assert f"is being replicated by another Migration already: publication {online.name} (Migration " in message
    assert f"/{online.ref.uid})" in message
    assert "Wait until that Migration has finished or rolled back" in message
    assert leftovers(databases) == _only(online), "nothing of B's replication on the source"
    assert _subscriptions(second_target) == [], "B subscribed nothing"
    second.undo_replicate()
    assert replica_identity(databases.source, NOTES) == "f", "B's undo leaves A's replication as it was"
    _edit_notes(databases.source, "note 3%")
    online.undo_replicate()
    assert replica_identity(databases.source, NOTES) == "d"
    assert leftovers(databases) == NOTHING


def test_a_replicate_is_refused_where_it_publishes_when_another_migration_published_the_source_after_its_start(
    online: OnlineSteps, second: OnlineSteps, databases: Databases, second_target: PostgresEndpoint,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """B has passed its first look and copies the schema into its target when A publishes: two replicates racing."""
    _notes(databases.source)
    copying, go_on = threading.Event(), threading.Event()
    copy = schema_copy.copy

    def held_copy(source: object, target: object, *args: object) -> int:
        if getattr(target, "database", None) == second_target.database:
            copying.set()
            assert go_on.wait(120)
        return copy(source, target, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(schema_copy, "copy", held_copy)
    failures: list[BaseException] = []

    def replicate() -> None:
        try:
            second.replicate()
        except BaseException as error:  # noqa: BLE001 - the test reports it
            failures.append(error)

    running = threading.Thread(target=replicate)
    running.start()
    try:
        assert copying.wait(120), "B did not get to copying the schema"
        online.replicate()
    finally:
        go_on.set()
        running.join(120)

    assert [type(failure) for failure in failures] == [InvalidSpec]
    assert f"publication {online.name} (Migration " in str(failures[0])
    assert leftovers(databases) == _only(online), "nothing of B's replication on the source"
    second.undo_replicate()
    online.undo_replicate()
    assert replica_identity(databases.source, NOTES) == "d"
    assert leftovers(databases) == NOTHING
    with pytest.raises(psycopg.errors.UndefinedTable), connect(second_target) as conn:
        conn.execute(f"select from {NOTES}")


def test_a_replication_begun_beside_another_starts_again_after_losing_its_slot(
    online: OnlineSteps, second: OnlineSteps, databases: Databases, second_target: PostgresEndpoint,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """B's replication, begun beside A's before replicate refused that, loses its slot; the retry of B's replicate
    ends what is left of it and starts again. It goes on: the refusal is for a Migration that has not published the
    source yet, and it comes before the target is touched, never after B's target was emptied and copied again."""
    _notes(databases.source)
    _both_replicating(online, second, monkeypatch)
    with connect(second_target) as conn:
        conn.execute(f"alter subscription {second.name} disable")
    with connect(databases.source) as conn:
        replication.drop_slots(conn, [second.name], lambda: None)

    again = second.replicate()  # refused before the fix (InvalidSpec), once it had emptied and copied B's target

    assert again.schema_copied
    assert leftovers(databases)["publications"] == sorted([online.name, second.name])
    _edit_notes(databases.source, "note 4%")
    eventually("B's target to receive the update", lambda: _edited(second_target) == 11)
    second.undo_replicate()
    online.undo_replicate()
    assert replica_identity(databases.source, NOTES) == "d"
    assert leftovers(databases) == NOTHING


def test_the_end_reads_which_publications_publish_its_tables_before_it_gives_any_back(
    online: OnlineSteps, databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Giving a table its identity back takes its exclusive lock until the end's transaction commits: every query of
    the tables already given back waits meanwhile, so the end asks which publications publish its tables once, for
    all of them, before the first ALTER TABLE, rather than once per table in between."""
    with connect(databases.source) as conn:
        for table in ("public.kept", "public.notes", "public.notes_2"):
            conn.execute(f"create table {table} (body text not null)")
    online.driver = online.driver.model_copy(update={"allow_replica_identity_full": True})
    assert online.replicate().replica_identity_full == ["public.kept", "public.notes", "public.notes_2"]
    with connect(databases.source) as conn:
        conn.execute("create publication by_hand for table public.kept")
    statements: list[str] = []
    execute = Session.execute

    def traced(self: Session, query: Any, *args: Any, **kwargs: Any) -> Any:
        statements.append(query if isinstance(query, str) else query.as_string(self))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(Session, "execute", traced)

    online.undo_replicate()

    monkeypatch.undo()
    dropped = next(i for i, statement in enumerate(statements) if statement.lower().startswith("drop publication"))
    altered = [i for i, statement in enumerate(statements[:dropped]) if statement.lower().startswith("alter table")]
    assert len(altered) == 2, statements
    between = statements[altered[0] : dropped]
    assert [s for s in between if "pg_publication_tables" in s or "pg_class" in s] == [], between
    assert [replica_identity(databases.source, t) for t in ("public.kept", "public.notes", "public.notes_2")] == [
        "f", "d", "d"
    ]  # fmt: skip
    with connect(databases.source) as conn:
        conn.execute("drop publication by_hand")
    assert leftovers(databases) == NOTHING


def test_the_end_hands_several_tables_over_to_another_migrations_record_and_that_end_gives_every_one_back(
    online: OnlineSteps, second: OnlineSteps, databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's end hands both tables over to B's record in one transaction; the second hand-over must keep the first."""
    _notes(databases.source)
    with connect(databases.source) as conn:
        conn.execute("create table public.notes_2 (body text not null)")
    _both_replicating(online, second, monkeypatch)

    online.undo_replicate()

    with connect(databases.source) as conn:
        record = replication.read_record(conn, second.name)
    assert record is not None
    assert record.replica_identity == {NOTES: "d", "public.notes_2": "d"}
    second.undo_replicate()
    assert [replica_identity(databases.source, t) for t in (NOTES, "public.notes_2")] == ["d", "d"]
    assert leftovers(databases) == NOTHING
