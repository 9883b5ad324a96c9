"""precheck names what a migration of one database leaves behind or changes without failing: what the source server's
`postgres` and templates hold, the settings of the database and of its roles, the collation library's versions,
tablespaces, and privileges and owners. Each is a warning (a Warning Event on the Migration) saying what to do; a
collation the target's server lacks, which would stop the restore after the freeze, is a refusal."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from psycopg import sql

from activities.events import MAX_MESSAGE
from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.stack import StackInfo
from ferry.api.migration import DriverSpec
from ferry.api.saga import MigrationRef
from tests.end_to_end import SOURCE_SECRET, TARGET_SECRET, Databases
from tests.postgres.conftest import Steps, create_secret, precheck_problems
from tests.postgres.data import connect, connection_of, create_shop, database_owner, tablespace

OTHER = "other-db"
KEEPS_MORE = "keeps more than database"
SETTINGS = "pg_dump carries them only with --create"
SORTS = "text may sort differently on the target"
LEFT_OUT = "the restore leaves out owners and privileges"


@pytest.fixture
def ref(applied_ref: MigrationRef) -> MigrationRef:
    """A Migration that exists: the precheck reads it after marking its Secrets."""
    return applied_ref


def _with(steps: Steps, *, source: str = SOURCE_SECRET, target: str = TARGET_SECRET) -> Steps:
    return dataclasses.replace(steps, driver=DriverSpec(source_secret=source, target_secret=target))


def _events(kube_api: k8s.ApiClient, namespace: str) -> list[str]:
    return [
        event.message
        for event in k8s.CoreV1Api(kube_api).list_namespaced_event(namespace).items
        if event.reason == "PrecheckWarning"
    ]


@contextlib.contextmanager
def _database(server: PostgresEndpoint, options: str) -> Iterator[PostgresEndpoint]:
    """A database of `server` made with CREATE DATABASE ... `options`, dropped afterwards."""
    name = f"other_{uuid.uuid4().hex[:10]}"
    with connect(server) as conn:
        conn.execute(sql.SQL("create database {} " + options).format(sql.Identifier(name)))
    try:
        yield dataclasses.replace(server, database=name)
    finally:
        with connect(server) as conn:
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))


def test_precheck_names_the_tables_and_extensions_of_the_sources_postgres_and_template_databases_that_stay_behind(
    steps: Steps, stack: StackInfo, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """pg_dump copies one database: what an administrator made in `postgres` (pg_cron keeps its jobs there) or added
    to template1 stays on the source, and stops with it at scale-down-old. Five names of each kind at most, with how
    many more; not plpgsql, which every database has."""
    admin = stack.postgres["source"]
    assert admin.database == "postgres"
    template1 = dataclasses.replace(admin, database="template1")
    assert not [warning for warning in steps.precheck().warnings if KEEPS_MORE in warning], "as initdb made them"
    with connect(admin) as conn:
        for number in range(7):
            conn.execute(f"create table public.kept_{number} (id int)")
        conn.execute("create extension seg")
    with connect(template1) as conn:
        conn.execute("create extension cube")
    try:
        result = steps.precheck()
    finally:
        with connect(admin) as conn:
            for number in range(7):
                conn.execute(f"drop table public.kept_{number}")
            conn.execute("drop extension seg")
        with connect(template1) as conn:
            conn.execute("drop extension cube")

    (warning,) = [warning for warning in result.warnings if KEEPS_MORE in warning]
    assert (
        "the maintenance database 'postgres' holds the relations public.kept_0, public.kept_1, public.kept_2, "
        "public.kept_3, public.kept_4 and 2 more and the extensions seg; the template 'template1' holds the "
        "extensions cube." in warning
    )
    assert "pg_cron's jobs (kept in database 'postgres' by default) stop running" in warning
    assert "make them on the target's server" in warning
    assert warning in _events(kube_api, namespace)


def test_precheck_says_it_could_not_look_into_a_postgres_database_the_sources_user_may_not_connect_to(
    steps: Steps, databases: Databases, stack: StackInfo, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """A warning, not a failure: the database's owner need not be let into `postgres`."""
    admin = stack.postgres["source"]
    with database_owner(databases.source) as owner:
        create_secret(kube_api, namespace, OTHER, connection_of(owner))
        with connect(admin) as conn:
            conn.execute("revoke connect on database postgres from public")
        try:
            result = _with(steps, source=OTHER).precheck()
        finally:
            with connect(admin) as conn:
                conn.execute("grant connect on database postgres to public")

    (warning,) = [warning for warning in result.warnings if warning.startswith("ferry could not look into")]
    assert warning.startswith(
        f"ferry could not look into the maintenance database 'postgres' of the source's server (the user in Secret "
        f"{namespace}/{OTHER} may not connect to it: no CONNECT, or pg_hba.conf)"
    )
    assert f'GRANT CONNECT ON DATABASE "postgres" TO "{owner.user}"' in warning
    assert not [warning for warning in result.warnings if KEEPS_MORE in warning]


def test_precheck_gives_the_statements_for_the_database_and_role_settings_the_target_lacks(
    steps: Steps, databases: Databases, stack: StackInfo, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """pg_dump without --create carries no ALTER DATABASE/ROLE ... SET: the target's sessions would silently run with
    other defaults. The warning gives each statement, quoted to run as it is (a list setting's elements, a role's
    name); the values of custom settings stay out of it (they may be secrets), and so do ferry's own settings, also
    on a source this Migration froze; a setting the target's major no longer knows is named, with no statement."""
    source, target = sql.Identifier(databases.source.database), sql.Identifier(databases.target.database)
    role = f'App "{uuid.uuid4().hex[:6]}"'
    name = sql.Identifier(role)
    with connect(stack.postgres["source"]) as conn:
        conn.execute(sql.SQL("create role {} login").format(name))
        for setting in (
            "default_transaction_isolation = 'serializable'",
            'search_path = "$user", public, "Odd ""Schema"""',
            "lock_timeout = '5s'",
            "force_parallel_mode = off",  # renamed debug_parallel_query in PostgreSQL 16
            "app.jwt_secret = 'hush-hush'",
        ):
            conn.execute(sql.SQL("alter database {} set " + setting).format(source))
        conn.execute(sql.SQL("alter role {} in database {} set timezone = 'Europe/Berlin'").format(name, source))
        conn.execute(sql.SQL("alter role {} set work_mem = '64MB'").format(name))
    with connect(stack.postgres["target"]) as conn:
        conn.execute(sql.SQL("create role {} login").format(name))
        conn.execute(sql.SQL("alter database {} set lock_timeout = '5s'").format(target))
        conn.execute(sql.SQL("alter database {} set default_transaction_isolation = 'read committed'").format(target))
    try:
        result = steps.precheck()

        database_warning, role_warning = [warning for warning in result.warnings if SETTINGS in warning]
        assert database_warning.startswith(
            f"database {databases.source.database!r} has settings of its own on the source (ALTER DATABASE ... SET) "
            f"that the target's database {databases.target.database!r} lacks or sets otherwise."
        )
        quoted = f'"{databases.target.database}"'
        statements = [
            f"ALTER DATABASE {quoted} SET app.jwt_secret = <its value on the source>",
            f"ALTER DATABASE {quoted} SET default_transaction_isolation = 'serializable'",
            f"ALTER DATABASE {quoted} SET search_path = '$user', 'public', 'Odd \"Schema\"'",
        ]
        assert f"run there as the database's owner or a superuser: {'; '.join(statements)}." in database_warning
        assert "The target has default_transaction_isolation = read committed." in database_warning
        assert "does not know force_parallel_mode = off" in database_warning
        assert "lock_timeout" not in database_warning, "the same on both sides"
        assert "hush-hush" not in database_warning
        escaped = '"' + role.replace('"', '""') + '"'
        role_statements = [
            f"ALTER ROLE {escaped} IN DATABASE {quoted} SET timezone = 'Europe/Berlin'",
            f"ALTER ROLE {escaped} SET work_mem = '64MB'",
        ]
        assert f"as a superuser (or a role with CREATEROLE): {'; '.join(role_statements)}." in role_warning
        assert {database_warning, role_warning} <= set(_events(kube_api, namespace))

        frozen = steps.freeze()
        try:
            while_frozen = steps.precheck().warnings
        finally:
            steps.undo_freeze(frozen.previous_setting)
        assert database_warning in while_frozen, "not ferry's settings, nor the read-only default of its freeze"

        with connect(stack.postgres["target"]) as conn:
            for statement in [*statements[1:], *role_statements]:
                conn.execute(statement)
            conn.execute(sql.SQL("alter database {} set app.jwt_secret = 'hush-hush'").format(target))
        (left,) = [warning for warning in steps.precheck().warnings if SETTINGS in warning]
        assert "does not know force_parallel_mode = off" in left
        assert "Before traffic moves" not in left, "every other setting is on the target now"
    finally:
        for server in ("source", "target"):
            with connect(stack.postgres[server]) as conn:
                conn.execute(sql.SQL("drop role {}").format(name))


def test_precheck_warns_when_the_collation_librarys_versions_differ(
    steps: Steps, stack: StackInfo, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """Text may sort otherwise under another library version, whatever the locale's name; the restore builds the
    indexes by the target's rules, so what a person must check is the order queries return and text range
    partitions. One side without a version (a C locale) and the other with one counts as different."""
    assert not [warning for warning in steps.precheck().warnings if SORTS in warning], "C.UTF-8 has none either side"
    with _database(stack.postgres["source"], "locale_provider icu icu_locale 'und' template template0") as icu:
        with connect(icu) as conn:
            row = conn.execute("select datcollversion from pg_database where datname = current_database()").fetchone()
        assert row is not None
        assert row[0], "ICU records its version"
        create_secret(kube_api, namespace, OTHER, connection_of(icu))

        result = _with(steps, source=OTHER).precheck()

    (warning,) = [warning for warning in result.warnings if SORTS in warning]
    assert (
        f"the default collation of database {icu.database!r} was made with version {row[0]} of its library on the "
        "source, that of"
    ) in warning
    assert "on the target with none (no version recorded)" in warning
    assert "the indexes need no REINDEX" in warning
    assert "the order of the application's ORDER BY on text" in warning
    assert "which range partition a text key falls in" in warning
    assert warning in _events(kube_api, namespace)


def test_precheck_refuses_columns_in_a_collation_the_targets_server_lacks_which_would_stop_the_restore(
    steps: Steps, databases: Databases
) -> None:
    """The local stack's PostgreSQL 18 is built without ICU: the restore would stop at the first column of an ICU
    collation, after the freeze. Built-in ones are named by the dump, others created; a libc one both servers have
    (C.utf8) is fine."""
    with connect(databases.source) as conn:
        conn.execute("create collation public.german (provider = icu, locale = 'de-DE')")
        conn.execute(
            'create table public.people (id int primary key, name text collate "und-x-icu", '
            'surname text collate public.german, code text collate "C.utf8")'
        )

    (problem,) = precheck_problems(steps.precheck)

    assert problem.startswith("the source's columns use collations that the server of database")
    assert 'pg_catalog."und-x-icu" (icu locale und; public.people.name)' in problem
    assert 'public."german" (icu locale de-DE; public.people.surname)' in problem
    assert "C.utf8" not in problem
    assert "would stop at the first, after the freeze" in problem


def test_precheck_names_the_tablespaces_whose_relations_land_in_the_targets_default_one(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """The target's server need not have the source's tablespaces, and a restore naming one it lacks would fail after
    the freeze: the restore leaves them out, and the precheck says what that moves."""
    assert not [warning for warning in steps.precheck().warnings if "tablespaces of their own" in warning]
    with tablespace(databases.source) as fast:
        with connect(databases.source) as conn:
            conn.execute(
                f"create table public.hot (id int primary key using index tablespace {fast}) tablespace {fast}"
            )
            conn.execute(f"create index hot_id on public.hot (id) tablespace {fast}")

        result = steps.precheck()

    (warning,) = [warning for warning in result.warnings if "tablespaces of their own" in warning]
    assert f"tablespaces of their own: {fast} (public.hot, public.hot_id, public.hot_pkey)." in warning
    assert "pg_restore --no-tablespaces" in warning
    assert f"on the target, database {databases.target.database!r}, they land in its default tablespace" in warning
    assert warning in _events(kube_api, namespace)


def test_precheck_names_the_privileges_and_owners_the_restore_leaves_out_public_execute_first(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """The restore runs with --no-owner --no-privileges: a function the source keeps from PUBLIC may be run by anyone
    on the target, a SECURITY DEFINER one runs as the target's user, grants to other roles are gone. The warning says
    so, with the REVOKE that PUBLIC's case needs; a source with none of these gets no such warning."""
    create_shop(databases.source, customers=10, orders=20)
    assert databases.source.user == databases.target.user, "objects of the Secrets' user keep their owner's name"
    assert not [warning for warning in steps.precheck().warnings if LEFT_OUT in warning], "nothing but defaults"
    role = f"reporting_{uuid.uuid4().hex[:8]}"
    with connect(databases.source) as conn:
        conn.execute(sql.SQL("create role {}").format(sql.Identifier(role)))
    try:
        with connect(databases.source) as conn:
            conn.execute(sql.SQL("grant select on shop.orders to {}").format(sql.Identifier(role)))
            conn.execute("revoke execute on function shop.order_count(bigint) from public")
            conn.execute(
                "create function shop.refund(id bigint) returns void language sql security definer "
                "as 'update shop.orders set total = 0 where id = refund.id'"
            )
            conn.execute("revoke execute on function shop.refund(bigint) from public")
            conn.execute(sql.SQL("alter function shop.refund(bigint) owner to {}").format(sql.Identifier(role)))

            result = steps.precheck()
    finally:
        with connect(databases.source) as conn:
            conn.execute(sql.SQL("drop owned by {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))

    (warning,) = [warning for warning in result.warnings if LEFT_OUT in warning]
    user = databases.target.user
    assert warning.startswith(
        f"the restore leaves out owners and privileges (--no-owner --no-privileges): on the target (Secret "
        f"{namespace}/{TARGET_SECRET}) every object of database {databases.source.database!r} belongs to {user!r}, "
        "with default privileges: (1) 2 routines whose EXECUTE the source revoked from PUBLIC (1 SECURITY "
        "DEFINER) may be run by any role that connects; "
    )
    assert (
        f"(2) 1 SECURITY DEFINER routine runs as {user!r}, not as its owner ({role}) (shop.refund(bigint))" in warning
    )
    assert f"(3) 1 grant to {role} is missing (SELECT on table shop.orders)" in warning
    assert f"(4) 1 object of {role} changes owner (function shop.refund(bigint))" in warning
    assert "ferry re-applies none of it." in warning
    assert (
        f"run there as {user!r}: REVOKE EXECUTE ON ROUTINE shop.refund(bigint), shop.order_count(bigint) FROM PUBLIC."
        in warning
    ), "the SECURITY DEFINER routine first"
    assert (
        "GRANT, REVOKE, ALTER DEFAULT PRIVILEGES and OWNER TO lines of the source's `pg_dump --schema-only`" in warning
    )
    assert len(warning) <= MAX_MESSAGE
    assert warning in _events(kube_api, namespace)
