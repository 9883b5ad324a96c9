"""A database Secret edited mid-run to name another database: no step or undo acts on that one, and each goes on once
the Secret names the database the precheck checked again."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from psycopg import sql

from activities.postgres.connection import DatabaseReplaced
from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.stack import StackInfo
from ferry.api.migration import GROUP, PLURAL, VERSION, CheckedDatabases, MigrationStatus
from ferry.api.saga import CheckUnwrittenInput, MigrationRef
from tests.end_to_end import SOURCE_SECRET, TARGET_SECRET, Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import connect, create_shop, database_settings


@pytest.fixture
def ref(applied_ref: MigrationRef) -> MigrationRef:
    """A Migration that exists: the precheck records in its status which databases it checked."""
    return applied_ref


@pytest.fixture
def elsewhere(stack: StackInfo) -> Iterator[dict[str, PostgresEndpoint]]:
    """One more database on each server, beside the test's: what an edited Secret could name instead."""
    name = f"elsewhere_{uuid.uuid4().hex[:10]}"
    made = {}
    for side in ("source", "target"):
        admin = stack.postgres[side]
        with connect(admin) as conn:
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
        made[side] = dataclasses.replace(admin, database=name)
    yield made
    for side in made:
        with connect(stack.postgres[side]) as conn:
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))


def _name_in_secret(kube_api: k8s.ApiClient, namespace: str, secret: str, database: str) -> None:
    k8s.CoreV1Api(kube_api).patch_namespaced_secret(secret, namespace, {"stringData": {"database": database}})


def _tables(endpoint: PostgresEndpoint) -> int:
    with connect(endpoint) as conn:
        row = conn.execute(
            "select count(*) from pg_tables where schemaname not in ('pg_catalog', 'information_schema')"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_precheck_records_which_databases_the_secrets_named(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, ref: MigrationRef
) -> None:
    result = steps.precheck()

    raw = k8s.CustomObjectsApi(kube_api).get_namespaced_custom_object(GROUP, VERSION, ref.namespace, PLURAL, ref.name)
    recorded = MigrationStatus.model_validate(raw["status"]).databases
    assert recorded is not None
    assert recorded == result.databases
    assert recorded.source is not None
    assert recorded.target is not None
    assert recorded.source.database == databases.source.database
    assert recorded.target.database == databases.target.database
    assert recorded.source.system_identifier != recorded.target.system_identifier, "two servers"


def test_a_source_secret_pointed_at_another_database_after_the_freeze_holds_the_undo_until_it_is_pointed_back(
    steps: Steps,
    databases: Databases,
    elsewhere: dict[str, PostgresEndpoint],
    kube_api: k8s.ApiClient,
    namespace: str,
) -> None:
    """Before, the undo found no freeze of its own in the other database and counted as done: the source stayed frozen
    under a Migration that said RolledBack. And a freeze, run then, froze a database nobody planned to move."""
    create_shop(databases.source, customers=10, orders=100)
    steps.precheck()
    steps.freeze()
    frozen = database_settings(databases.source)
    assert "default_transaction_read_only=on" in frozen

    _name_in_secret(kube_api, namespace, SOURCE_SECRET, elsewhere["source"].database)
    with pytest.raises(DatabaseReplaced, match=f"Secret {namespace}/{SOURCE_SECRET} no longer names the database"):
        steps.undo_freeze()
    with pytest.raises(DatabaseReplaced):
        steps.freeze()

    assert database_settings(databases.source) == frozen, "still frozen: its undo has not run"
    assert database_settings(elsewhere["source"]) == [], "neither frozen nor unfrozen"
    _name_in_secret(kube_api, namespace, SOURCE_SECRET, databases.source.database)
    steps.undo_freeze()
    assert database_settings(databases.source) == []


def test_a_target_secret_pointed_at_another_database_holds_the_undo_of_the_restore_until_it_is_pointed_back(
    steps: Steps,
    databases: Databases,
    elsewhere: dict[str, PostgresEndpoint],
    kube_api: k8s.ApiClient,
    namespace: str,
) -> None:
    """Before, the undo found no marker of its own in the other database and counted as done, leaving the restored
    target as it was; verify compared the source with whatever the other database held."""
    create_shop(databases.source, customers=10, orders=100)
    steps.precheck()
    steps.freeze()
    steps.migrate(steps.snapshot())
    restored = _tables(databases.target)
    assert restored > 0

    _name_in_secret(kube_api, namespace, TARGET_SECRET, elsewhere["target"].database)
    with pytest.raises(DatabaseReplaced, match=f"Secret {namespace}/{TARGET_SECRET} no longer names the database"):
        steps.verify()
    with pytest.raises(DatabaseReplaced):
        steps.undo_migrate()

    assert _tables(databases.target) == restored
    assert database_settings(elsewhere["target"]) == []
    _name_in_secret(kube_api, namespace, TARGET_SECRET, databases.target.database)
    assert steps.undo_migrate().removed
    assert _tables(databases.target) == 0


def test_a_source_that_is_another_database_when_traffic_would_go_back_holds_the_rollback_before_the_target_is_emptied(
    steps: Steps,
    databases: Databases,
    elsewhere: dict[str, PostgresEndpoint],
    kube_api: k8s.ApiClient,
    namespace: str,
) -> None:
    """A source that came back from scale-down-old's undo with new volumes (its claims deleted, its disk replaced: a new
    initdb) is another database. Before, the check before traffic went back looked at the target alone: the Service
    went back to the empty source, and the undos after it emptied the target, the only copy left."""
    create_shop(databases.source, customers=10, orders=100)
    steps.precheck()
    steps.freeze()
    steps.migrate(steps.snapshot())
    verified = steps.verify()
    restored = _tables(databases.target)

    _name_in_secret(kube_api, namespace, SOURCE_SECRET, elsewhere["source"].database)  # as a new initdb would be
    with pytest.raises(DatabaseReplaced, match=f"Secret {namespace}/{SOURCE_SECRET} no longer names the database"):
        steps.check_unwritten(verified.target_fence)

    assert _tables(databases.target) == restored
    _name_in_secret(kube_api, namespace, SOURCE_SECRET, databases.source.database)
    assert steps.check_unwritten(verified.target_fence).compared
    steps.undo_freeze()


def test_the_check_before_an_undo_that_empties_the_target_reaches_the_source_alone(
    steps: Steps,
    databases: Databases,
    elsewhere: dict[str, PostgresEndpoint],
    kube_api: k8s.ApiClient,
    namespace: str,
) -> None:
    """A source replaced while it was copied fails it, so the rollback stops before the target's restore, the only
    copy left, is emptied; a target that does not answer (often why the rollback runs) does not."""
    create_shop(databases.source, customers=10, orders=100)
    steps.precheck()
    steps.freeze()
    steps.migrate(steps.snapshot())
    source_only = CheckUnwrittenInput(ref=steps.ref, driver=steps.driver, source_only=True)

    _name_in_secret(kube_api, namespace, SOURCE_SECRET, elsewhere["source"].database)
    with pytest.raises(DatabaseReplaced, match=f"Secret {namespace}/{SOURCE_SECRET} no longer names the database"):
        steps.env.run(steps.postgres.check_unwritten, source_only)

    _name_in_secret(kube_api, namespace, SOURCE_SECRET, databases.source.database)
    k8s.CoreV1Api(kube_api).patch_namespaced_secret(TARGET_SECRET, namespace, {"stringData": {"port": "1"}})
    assert not steps.env.run(steps.postgres.check_unwritten, source_only).compared, "the target is not reached"
    steps.undo_freeze()


def test_the_check_after_provision_keeps_the_source_the_first_precheck_recorded_and_adds_the_target(
    steps: Steps,
    databases: Databases,
    elsewhere: dict[str, PostgresEndpoint],
    kube_api: k8s.ApiClient,
    namespace: str,
    ref: MigrationRef,
) -> None:
    """The precheck let the target wait (it did not answer), and steps acted on the source since (mode Online: the
    recovery snapshot). Run again after provision, it must not record whatever the source Secret names now as the
    source: the freeze would then act on, and its undo look at, a database nothing checked the run against."""
    create_shop(databases.source, customers=10, orders=100)
    steps.precheck()
    custom = k8s.CustomObjectsApi(kube_api)
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ref.namespace, PLURAL, ref.name, {"status": {"databases": {"target": None}}},
        field_manager="ferry-precheck",
    )  # fmt: skip
    first = _recorded(kube_api, ref)
    assert first.source is not None
    assert first.target is None, "as the first precheck leaves it when the target waits"

    _name_in_secret(kube_api, namespace, SOURCE_SECRET, elsewhere["source"].database)
    with pytest.raises(DatabaseReplaced, match=f"Secret {namespace}/{SOURCE_SECRET} no longer names the database"):
        steps.precheck(after_provision=True)
    assert _recorded(kube_api, ref) == first, "nothing recorded"

    _name_in_secret(kube_api, namespace, SOURCE_SECRET, databases.source.database)
    steps.precheck(after_provision=True)
    after = _recorded(kube_api, ref)
    assert after.source == first.source
    assert after.target is not None
    assert after.target.database == databases.target.database


def _recorded(kube_api: k8s.ApiClient, ref: MigrationRef) -> CheckedDatabases:
    raw = k8s.CustomObjectsApi(kube_api).get_namespaced_custom_object(GROUP, VERSION, ref.namespace, PLURAL, ref.name)
    recorded = MigrationStatus.model_validate(raw["status"]).databases
    assert recorded is not None
    return recorded
