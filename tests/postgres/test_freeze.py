"""freeze stops every write on the source without losing an acknowledged one; undo_freeze puts things back exactly."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from kubernetes import client as k8s
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities.postgres import freezing
from activities.postgres.attempts import Attempt
from activities.postgres.connection import MARKERS
from activities.postgres.freezing import UNFREEZES_KEPT, PreparedTransactionsPending
from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.stack import StackInfo
from ferry.api.errors import BadCredentials, InvalidSpec, Overtaken
from tests.cluster import eventually
from tests.end_to_end import Databases
from tests.postgres.conftest import RUN, SCHEDULED, Steps, create_secret, scheduled_as
from tests.postgres.data import (
    Connection,
    application_role,
    connect,
    connect_privileges,
    connection_of,
    database_owner,
    database_settings,
    new_session_is_read_only,
    set_on_database,
)


@pytest.fixture
def source(databases: Databases) -> Databases:
    with connect(databases.source) as conn:
        conn.execute("create table public.orders (id int primary key)")
    return databases


def test_freeze_makes_new_transactions_read_only_and_ends_the_sessions_already_open(
    steps: Steps, source: Databases
) -> None:
    with connect(source.source) as open_before, connect(source.source) as idle_before:
        open_before.execute("insert into public.orders values (1)")

        result = steps.freeze()

        with pytest.raises(psycopg.OperationalError):
            open_before.execute("insert into public.orders values (2)")
        with pytest.raises(psycopg.OperationalError):
            idle_before.execute("select 1")
    assert result.previous_setting == "unset"
    assert result.sessions_ended == 2
    with connect(source.source) as after, pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        after.execute("insert into public.orders values (3)")
    assert "default_transaction_read_only=on" in database_settings(source.source)
    with connect(source.source) as conn:
        assert conn.execute("select id from public.orders").fetchall() == [(1,)]


@pytest.mark.parametrize("before", [None, "off", "on"])
def test_undo_freeze_puts_back_exactly_the_setting_there_was(
    steps: Steps, source: Databases, before: str | None
) -> None:
    if before is not None:
        with connect(source.source) as conn:
            conn.execute(f"alter database {source.source.database} set default_transaction_read_only = {before}")
    settings_before = database_settings(source.source)

    result = steps.freeze()
    steps.undo_freeze(result.previous_setting)

    assert result.previous_setting == (before or "unset")
    assert database_settings(source.source) == settings_before
    assert new_session_is_read_only(source.source) == (before == "on")

    steps.undo_freeze(result.previous_setting)  # a second run is harmless

    assert database_settings(source.source) == settings_before


def test_freeze_run_again_after_a_crash_records_the_setting_from_before_the_first_attempt(
    steps: Steps, source: Databases
) -> None:
    with connect(source.source) as conn:
        conn.execute(f"alter database {source.source.database} set default_transaction_read_only = off")

    first = steps.freeze()
    again = steps.freeze()  # the worker died before reporting the first attempt

    assert first.previous_setting == again.previous_setting == "off"
    steps.undo_freeze(again.previous_setting)
    assert database_settings(source.source) == ["default_transaction_read_only=off"]


def test_undo_freeze_ends_the_sessions_opened_during_the_freeze_so_they_come_back_writable(
    steps: Steps, source: Databases
) -> None:
    result = steps.freeze()
    with connect(source.source) as during:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            during.execute("insert into public.orders values (1)")

        steps.undo_freeze(result.previous_setting)

        with pytest.raises(psycopg.OperationalError):
            during.execute("select 1")
    with connect(source.source) as after:
        after.execute("insert into public.orders values (1)")
    assert not new_session_is_read_only(source.source)


def test_a_freeze_cancelled_midway_undoes_what_it_did(
    steps: Steps, source: Databases, heartbeats: list[dict[str, Any]]
) -> None:
    env = ActivityEnvironment()

    def cancel_once_frozen(*details: Any) -> None:
        heartbeats.append(details[0])
        if details[0].get("frozen"):
            env.cancel()

    env.on_heartbeat = cancel_once_frozen
    cancelled = dataclasses.replace(steps, env=env)

    with pytest.raises(CancelledError):
        cancelled.freeze()

    assert heartbeats[0]["frozen"], "the freeze had taken effect when it was cancelled"
    assert database_settings(source.source) == []
    with connect(source.source) as conn:
        conn.execute("insert into public.orders values (1)")


def test_freeze_refuses_a_database_another_migration_froze_and_leaves_that_freeze_alone(
    steps: Steps, source: Databases
) -> None:
    steps.freeze()
    other = dataclasses.replace(steps, ref=steps.ref.model_copy(update={"uid": str(uuid.uuid4())}))

    with pytest.raises(InvalidSpec, match=rf"is frozen by Migration {steps.ref.namespace}/orders-db-to-16/"):
        other.freeze()
    other.undo_freeze("unset")

    assert new_session_is_read_only(source.source)


def test_freeze_refuses_a_database_where_a_role_would_go_on_writing(
    steps: Steps, source: Databases, stack: StackInfo
) -> None:
    role = f"app_{uuid.uuid4().hex[:8]}"
    with connect(source.source) as conn:
        conn.execute(f"create role {role} login")
        conn.execute(f"alter role {role} in database {source.source.database} set default_transaction_read_only = off")
    try:
        with pytest.raises(InvalidSpec, match=rf"{role} \(default_transaction_read_only=off\)"):
            steps.freeze()
        assert database_settings(source.source) == []
    finally:
        with connect(stack.postgres["source"]) as conn:
            conn.execute(f"drop role {role}")


@pytest.mark.parametrize("acl", ["default", "explicit grants"])
def test_undo_freeze_gives_back_exactly_the_connect_privileges_there_were(
    steps: Steps, source: Databases, acl: str
) -> None:
    with application_role(source.source) as app, application_role(source.source) as admin:
        if acl == "explicit grants":
            with connect(source.source) as conn:
                database = source.source.database
                conn.execute(f"revoke connect on database {database} from public")
                conn.execute(f"grant connect on database {database} to {app.user}")
                conn.execute(f"grant connect on database {database} to {admin.user} with grant option")
        privileges_before = connect_privileges(source.source)
        settings_before = database_settings(source.source)

        frozen = steps.freeze()

        assert {grantee for _, grantee, _ in connect_privileges(source.source)} == {"postgres"}
        for role in (app, admin):
            with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
                connect(role)

        steps.undo_freeze()  # as the saga does when it has no result of the freeze: from the markers

        assert connect_privileges(source.source) == privileges_before
        assert database_settings(source.source) == settings_before
        for number, role in enumerate((app, admin)):
            with connect(role) as conn:
                conn.execute("insert into public.orders values (%s)", (number,))
    assert frozen.revoked_connect == (["PUBLIC"] if acl == "default" else sorted([app.user, admin.user]))


def test_a_freeze_retried_after_a_crash_still_gives_back_the_connect_privileges_from_before_the_first_attempt(
    steps: Steps, source: Databases
) -> None:
    privileges_before = connect_privileges(source.source)

    steps.freeze()
    again = steps.freeze()  # the worker died before reporting the first attempt
    steps.undo_freeze(again.previous_setting)

    assert connect_privileges(source.source) == privileges_before
    assert database_settings(source.source) == []


def test_a_database_owner_without_the_grant_to_set_ferrys_markers_is_told_how_to_get_it(
    steps: Steps, source: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    with database_owner(source.source, may_set_markers=False) as as_owner:
        create_secret(kube_api, namespace, "owner-db", connection_of(as_owner))
        by_owner = dataclasses.replace(steps, driver=steps.driver.model_copy(update={"source_secret": "owner-db"}))

        with pytest.raises(BadCredentials) as raised:
            by_owner.freeze()

    assert f"GRANT SET ON PARAMETER {', '.join(MARKERS)} TO {as_owner.user}" in str(raised.value)
    assert database_settings(source.source) == []


def test_the_databases_owner_without_superuser_can_freeze_check_and_undo(
    steps: Steps, source: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    with database_owner(source.source) as as_owner, application_role(source.source) as app:
        with connect(source.source) as conn:
            conn.execute(f"alter table public.orders owner to {as_owner.user}")
        create_secret(kube_api, namespace, "owner-db", connection_of(as_owner))
        by_owner = dataclasses.replace(steps, driver=steps.driver.model_copy(update={"source_secret": "owner-db"}))
        privileges_before = connect_privileges(source.source)

        frozen = by_owner.freeze()

        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            connect(app)
        assert frozen.can_still_connect == ["postgres"]  # a superuser: the fence cannot keep it out
        by_owner.check_frozen(frozen.fence)
        by_owner.undo_freeze()
        assert connect_privileges(source.source) == privileges_before
        with connect(app) as conn:
            conn.execute("insert into public.orders values (1)")


def test_an_undo_whose_secret_names_a_role_the_freeze_shut_out_says_so_and_works_once_it_names_one_that_may(
    steps: Steps, source: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """Credentials rotated to a new role while the source is frozen: the freeze took CONNECT from every role but the
    one it froze with, so the new one is refused, and "fix the username and password" would not help."""
    with database_owner(source.source) as as_owner, application_role(source.source) as rotated:
        with connect(source.source) as conn:
            conn.execute(f"alter table public.orders owner to {as_owner.user}")
        create_secret(kube_api, namespace, "owner-db", connection_of(as_owner))
        by_owner = dataclasses.replace(steps, driver=steps.driver.model_copy(update={"source_secret": "owner-db"}))
        privileges_before = connect_privileges(source.source)
        by_owner.freeze()
        k8s.CoreV1Api(kube_api).replace_namespaced_secret(
            "owner-db",
            namespace,
            k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="owner-db"), string_data=connection_of(rotated)),
        )

        with pytest.raises(BadCredentials, match=r"its freeze took CONNECT from every role but the one it froze with"):
            by_owner.undo_freeze()

        k8s.CoreV1Api(kube_api).replace_namespaced_secret(
            "owner-db",
            namespace,
            k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="owner-db"), string_data=connection_of(as_owner)),
        )
        by_owner.undo_freeze()
        assert connect_privileges(source.source) == privileges_before


def _prepare(conn: psycopg.Connection[Any], gid: str, statement: str) -> None:
    """Phase one of a two-phase commit, as an XA/JTA transaction manager runs it: the rows are neither committed nor
    rolled back until COMMIT PREPARED (or ROLLBACK PREPARED), from any session."""
    conn.execute("begin read write")
    conn.execute(statement)
    conn.execute(f"prepare transaction '{gid}'")


def _resolve_prepared(endpoint: Any, gid: str, how: str = "rollback") -> bool:
    """Ends the prepared transaction `gid` if it is still there (a test database with one cannot be dropped)."""
    with connect(endpoint) as conn:
        if conn.execute("select from pg_prepared_xacts where gid = %s", (gid,)).fetchone() is None:
            return False
        conn.execute(f"{how} prepared '{gid}'")
        return True


def test_a_transaction_prepared_before_the_freeze_makes_it_undo_itself_naming_the_transaction(
    steps: Steps, source: Databases
) -> None:
    """The coordinator has told its client "committed"; the freeze would keep its COMMIT PREPARED out, and neither
    pg_dump nor the statistics see the prepared rows: a freeze that went on would lose them."""
    gid = f"xa-{uuid.uuid4().hex[:8]}"
    with application_role(source.source) as app:
        try:
            with connect(app) as coordinator:
                _prepare(coordinator, gid, "insert into public.orders values (1)")

                with pytest.raises(PreparedTransactionsPending) as raised:
                    steps.freeze()

            message = str(raised.value)
            assert f"'{gid}' (owner {app.user}, prepared " in message
            assert "the freeze undid itself and the source takes writes again" in message
            assert "The step is retried" in message
            assert database_settings(source.source) == []
            with connect(app) as coordinator:  # the coordinator can connect again and finish phase two
                coordinator.execute(f"commit prepared '{gid}'")
                coordinator.execute("insert into public.orders values (2)")
        finally:
            _resolve_prepared(source.source, gid)
    with connect(source.source) as conn:
        assert conn.execute("select id from public.orders order by id").fetchall() == [(1,), (2,)]
    assert not new_session_is_read_only(source.source)


def test_a_walsender_session_open_before_the_freeze_is_ended_by_it(
    steps: Steps, source: Databases, stack: StackInfo
) -> None:
    """A role with REPLICATION connected with replication=database (a CDC tool) runs SQL in a walsender, not in a
    client backend: it must be ended like any other session, or it goes on writing with the old default."""
    role = f"cdc_{uuid.uuid4().hex[:8]}"
    with connect(source.source) as conn:
        conn.execute(f"create role {role} login replication password 'cdc-secret'")
        conn.execute(f"grant insert on public.orders to {role}")
    try:
        cdc = dataclasses.replace(source.source, user=role, password="cdc-secret")
        with psycopg.connect(cdc.dsn, autocommit=True, replication="database", connect_timeout=5) as walsender:
            row = walsender.execute("select backend_type from pg_stat_activity where pid = pg_backend_pid()")
            assert row.fetchone() == ("walsender",)

            frozen = steps.freeze()

            with pytest.raises(psycopg.OperationalError):
                walsender.execute("insert into public.orders values (1)")
        assert frozen.sessions_ended == 1
        steps.check_frozen(frozen.fence)
        with connect(source.source) as conn:
            assert conn.execute("select count(*) from public.orders").fetchone() == (0,)
    finally:
        steps.undo_freeze()
        with connect(stack.postgres["source"]) as conn:
            conn.execute("select pg_terminate_backend(pid, 10000) from pg_stat_activity where usename = %s", (role,))
        with connect(source.source) as conn:
            conn.execute(f"drop owned by {role}")
            conn.execute(f"drop role {role}")


@contextlib.contextmanager
def _subscribed(source: PostgresEndpoint, server: PostgresEndpoint) -> Iterator[tuple[str, PostgresEndpoint]]:
    """The source subscribes to public.orders of another database of its server, a real publisher; yields the
    subscription's name and the publisher. All of it is removed on the way out, the source frozen or not."""
    name = f"feed_{uuid.uuid4().hex[:8]}"
    with connect(server) as conn:
        conn.execute(f"create database {name}")
    publisher = dataclasses.replace(server, database=name)
    try:
        with connect(publisher) as conn:
            conn.execute("create table public.orders (id int primary key)")
            conn.execute(f"create publication {name} for table public.orders")
            # by hand: CREATE SUBSCRIPTION waits forever for a slot it makes on its own server
            conn.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
        reach = f"host={server.host} port={server.port} user={server.user} password={server.password} dbname={name}"
        with connect(source) as conn:
            conn.execute(
                f"create subscription {name} connection '{reach}' publication {name} "
                f"with (create_slot = false, slot_name = '{name}', copy_data = false)"
            )
        try:
            yield name, publisher
        finally:
            with connect(source, default_transaction_read_only="off") as conn:
                conn.execute(f"alter subscription {name} disable")
                conn.execute(f"alter subscription {name} set (slot_name = none)")
                conn.execute(f"drop subscription {name}")
    finally:
        with connect(publisher) as conn:
            eventually(
                "the subscription's walsender to end",
                lambda: (
                    conn.execute("select from pg_replication_slots where active and slot_name = %s", (name,)).fetchone()
                    is None
                ),
            )
            conn.execute(
                "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = %s", (name,)
            )
        with connect(server) as conn:
            conn.execute(f"drop database {name} with (force)")


def _ids(endpoint: PostgresEndpoint) -> list[int]:
    with connect(endpoint) as conn:
        return [id for (id,) in conn.execute("select id from public.orders order by id")]


def test_a_subscription_of_the_source_makes_the_freeze_undo_itself_naming_the_subscription(
    steps: Steps, source: Databases, stack: StackInfo
) -> None:
    """The source subscribes to a publication elsewhere: the subscription's apply worker is no session the freeze
    could end (its launcher starts it again), and it applies rows with no read-only check. A freeze that went on
    would leave rows arriving in the frozen source, which the target would miss."""
    with application_role(source.source) as app, _subscribed(source.source, stack.postgres["source"]) as feed:
        name, publisher = feed
        privileges_before = connect_privileges(source.source)
        with connect(publisher) as conn:
            conn.execute("insert into public.orders values (1)")
        eventually("the subscription to apply the first row", lambda: _ids(source.source) == [1])

        with pytest.raises(InvalidSpec) as raised:
            steps.freeze()

        with connect(app) as conn:  # the application can come back and write
            conn.execute("insert into public.orders values (2)")
        assert database_settings(source.source) == []
        assert connect_privileges(source.source) == privileges_before

    message = str(raised.value)
    assert f"subscribes to publications elsewhere, and these subscriptions are enabled: {name}." in message
    assert "the freeze undid itself and the source takes writes again" in message
    assert "ALTER SUBSCRIPTION ... DISABLE" in message


def test_a_late_attempt_of_the_freeze_after_its_undo_leaves_the_source_writable(
    steps: Steps, source: Databases
) -> None:
    """The freeze's worker stands still (SIGSTOP, a frozen VM) before its transaction commits; the saga writes it off
    and rolls back, and the undo finds nothing to undo. The attempt, going on, must not freeze the source then: nothing
    would ever undo it, and the Migration would say RolledBack over a database closed to its clients."""
    late = scheduled_as(steps, 20)
    scheduled_as(steps, 25).undo_freeze()  # the rollback's: nothing is frozen yet

    with pytest.raises(Overtaken, match="late attempt"):
        late.freeze()

    assert database_settings(source.source) == []
    assert not new_session_is_read_only(source.source)
    unfrozen = [entry for entry in database_settings(source.source, records=True) if entry.startswith("ferry.")]
    assert [entry.partition("=")[0] for entry in unfrozen] == ["ferry.unfrozen_by"]

    # A later cycle (failurePolicy Pause, then retry) freezes, and its own undo takes it back.
    frozen = scheduled_as(steps, 30).freeze()
    assert new_session_is_read_only(source.source)
    scheduled_as(steps, 31).undo_freeze(frozen.previous_setting)
    assert database_settings(source.source) == []


def test_a_freeze_that_committed_before_its_undo_is_taken_back_by_it(steps: Steps, source: Databases) -> None:
    """The other order: the late attempt's freeze commits first; the undo, scheduled after it, finds and undoes it."""
    frozen = scheduled_as(steps, 20).freeze()
    scheduled_as(steps, 25).undo_freeze(frozen.previous_setting)

    assert database_settings(source.source) == []
    assert not new_session_is_read_only(source.source)


def _frozen_attempt(endpoint: PostgresEndpoint) -> dict[str, dict[str, Any]] | None:
    """The source's setting ferry.frozen_attempt (which attempt froze it, by Migration); None when it has none."""
    for entry in database_settings(endpoint):
        name, _, value = entry.partition("=")
        if name == "ferry.frozen_attempt":
            found: dict[str, dict[str, Any]] = json.loads(value)
            return found
    return None


def _owner(steps: Steps) -> str:
    return f"{steps.ref.namespace}/{steps.ref.name}/{steps.ref.uid}"


def test_a_late_undo_of_an_earlier_cycle_leaves_the_later_freeze_in_place(steps: Steps, source: Databases) -> None:
    """failurePolicy Pause: the undo of the first cycle's freeze stands still (SIGSTOP, a frozen VM) past its heartbeat
    timeout; the saga writes it off, and its retry unfreezes. A person sends retry, and the second cycle freezes the
    source again and goes on. The first undo, going on, must not unfreeze the source under the running saga: writes
    would reach it after its snapshot."""
    first = scheduled_as(steps, 10).freeze()
    late = scheduled_as(steps, 20)
    scheduled_as(steps, 21).undo_freeze(first.previous_setting)  # the saga's retry of the undo
    scheduled_as(steps, 30).freeze()  # the second cycle
    frozen = database_settings(source.source)
    undone = _unfrozen_by(source.source)
    privileges = connect_privileges(source.source)

    with pytest.raises(Overtaken, match="late attempt"):
        late.undo_freeze(first.previous_setting)

    assert database_settings(source.source) == frozen, "the second cycle's freeze and its markers as they were"
    assert connect_privileges(source.source) == privileges, "CONNECT still revoked"
    assert _unfrozen_by(source.source) == undone
    assert new_session_is_read_only(source.source)
    with connect(source.source) as conn, pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        conn.execute("insert into public.orders values (1)")


def test_an_undo_scheduled_after_the_freeze_unfreezes_it(steps: Steps, source: Databases) -> None:
    """The freeze records its attempt, the latest of those that froze; an undo scheduled after it unfreezes: one of
    the same run, or of a reset's new run, whose activity ids start again but which Temporal schedules later."""
    privileges_before = connect_privileges(source.source)
    scheduled_as(steps, 30).freeze()
    frozen = scheduled_as(steps, 30, attempt=2).freeze()  # Temporal's retry of the same activity (saga version 1)
    assert _frozen_attempt(source.source) == {
        _owner(steps): {"attempt": Attempt(RUN, "30", SCHEDULED + timedelta(seconds=30), 2).as_json()}
    }

    scheduled_as(steps, 31).undo_freeze(frozen.previous_setting)

    assert database_settings(source.source) == []
    assert connect_privileges(source.source) == privileges_before
    assert not new_session_is_read_only(source.source)

    scheduled_as(steps, 40).freeze()
    scheduled_as(steps, 5, run="run-2", scheduled=SCHEDULED + timedelta(minutes=5)).undo_freeze()

    assert database_settings(source.source) == []
    assert not new_session_is_read_only(source.source)


def test_a_freeze_that_recorded_no_attempt_is_undone_as_before(
    steps: Steps, source: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """A freeze by an older ferry records no attempt (nor does one whose user was granted SET on an older ferry's
    markers only, as its README asked): its undo cannot tell whether it is late, and unfreezes as it always did,
    though scheduled before that freeze."""
    with database_owner(source.source, may_set_markers=False) as as_owner, application_role(source.source) as app:
        older = [marker for marker in MARKERS if marker != "ferry.frozen_attempt"]
        with connect(source.source) as conn:
            conn.execute(f"grant set on parameter {', '.join(older)} to {as_owner.user}")
        create_secret(kube_api, namespace, "owner-db", connection_of(as_owner))
        by_owner = dataclasses.replace(steps, driver=steps.driver.model_copy(update={"source_secret": "owner-db"}))
        privileges_before = connect_privileges(source.source)
        undo = scheduled_as(by_owner, 20)

        frozen = scheduled_as(by_owner, 30).freeze()

        assert new_session_is_read_only(source.source)
        assert _frozen_attempt(source.source) is None
        undo.undo_freeze(frozen.previous_setting)
        assert database_settings(source.source) == []
        assert connect_privileges(source.source) == privileges_before
        with connect(app) as conn:
            conn.execute("insert into public.orders values (1)")


def test_a_late_undo_leaves_a_later_undos_record_so_a_freeze_scheduled_between_them_is_refused(
    steps: Steps, source: Databases
) -> None:
    """The first cycle's undo stands still; the second cycle's freeze stands still too, before it commits, and the
    saga rolls back again (nothing is frozen). The first undo goes on, then the freeze: the record of the second
    undo must still be there to refuse that freeze, which nothing would ever undo."""
    late_undo, late_freeze = scheduled_as(steps, 20), scheduled_as(steps, 30)
    scheduled_as(steps, 35).undo_freeze()  # the second cycle's rollback

    late_undo.undo_freeze()
    with pytest.raises(Overtaken, match="late attempt"):
        late_freeze.freeze()

    assert _unfrozen_by(source.source)[_owner(steps)]["attempt"]["activity"] == "35"
    assert not new_session_is_read_only(source.source)


def test_a_late_freeze_failing_after_a_later_cycle_froze_leaves_that_freeze_in_place(
    steps: Steps, source: Databases
) -> None:
    """The first cycle's freeze commits, then stands still; the saga writes it off and undoes it, and a second cycle
    freezes again. The first attempt, going on, fails (the undo and the second freeze ended its session): its cleanup
    of itself must not unfreeze the second cycle's freeze."""
    late = scheduled_as(steps, 10)
    later: list[str] = []
    once = threading.Lock()  # the watchdog's heartbeats come from a thread of their own

    def meanwhile(*details: Any) -> None:
        if details[0].get("frozen") and once.acquire(blocking=False):
            # In a thread of its own, as other workers run them: the late attempt's activity context stays its own.
            def saga() -> None:
                scheduled_as(steps, 12).undo_freeze()
                scheduled_as(steps, 20).freeze()

            thread = threading.Thread(target=saga)
            thread.start()
            thread.join()
            later.extend(database_settings(source.source))

    late.env.on_heartbeat = meanwhile

    with pytest.raises(psycopg.OperationalError):
        late.freeze()

    assert later, "the second cycle froze while the late attempt stood still"
    assert database_settings(source.source) == later
    assert new_session_is_read_only(source.source)


def _unfrozen_by(endpoint: PostgresEndpoint) -> dict[str, dict[str, Any]]:
    """The entries of the source's setting ferry.unfrozen_by, by Migration."""
    for entry in database_settings(endpoint, records=True):
        name, _, value = entry.partition("=")
        if name == "ferry.unfrozen_by":
            found: dict[str, dict[str, Any]] = json.loads(value)
            return found
    return {}


def _stamped_by_an_older_ferry(endpoint: PostgresEndpoint, ago: str, **session: str) -> str:
    """The stamp an older ferry wrote (now()::text) `ago` (an interval), in a session with these settings."""
    with connect(endpoint, **session) as conn:
        row = conn.execute("select (now() - %s::interval)::text", (ago,)).fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize(
    ("setting", "value"),
    # DateStyle SQL, month first: its now()::text (11/29/2026 ...) sorts below every ISO one whatever the day; day
    # first (29/11/2026 ...), above them from the 21st of the month on, when text order would keep it by chance.
    [("timezone", "America/New_York"), ("datestyle", "SQL, MDY")],
    ids=["new-york", "sql-mdy"],
)
def test_the_undo_recorded_last_is_kept_whatever_the_time_zone_or_date_style_of_its_session(
    steps: Steps, source: Databases, setting: str, value: str
) -> None:
    """ferry.unfrozen_by keeps the entries of the 32 Migrations whose freeze was undone last. Undos of 32 other
    Migrations are recorded by sessions in UTC; then the database's TimeZone or DateStyle changes (a role's or a
    database's own setting, which ferry's sessions follow), and the rollback of this Migration records its undo. It
    is the newest entry, so it stays, and the late attempt of the freeze it is there to refuse is refused."""
    set_on_database(source.source, "timezone", "UTC")
    for _ in range(UNFREEZES_KEPT):
        other = dataclasses.replace(steps, ref=steps.ref.model_copy(update={"uid": str(uuid.uuid4())}))
        scheduled_as(other, 25).undo_freeze()
    set_on_database(source.source, setting, value)
    late = scheduled_as(steps, 20)
    scheduled_as(steps, 25).undo_freeze()  # the rollback's: nothing is frozen yet

    with pytest.raises(Overtaken, match="late attempt"):
        late.freeze()

    assert not new_session_is_read_only(source.source)
    unfrozen = _unfrozen_by(source.source)
    assert len(unfrozen) == UNFREEZES_KEPT
    assert f"{steps.ref.namespace}/{steps.ref.name}/{steps.ref.uid}" in unfrozen


def test_entries_an_older_ferry_stamped_in_its_sessions_own_form_are_kept_by_when_they_were_written(
    steps: Steps, source: Databases
) -> None:
    """An older ferry stamped each entry of ferry.unfrozen_by with now()::text, in its session's TimeZone and
    DateStyle, and kept the entries whose text sorted largest. The setting here holds 32 entries as it left them: 30
    of other Migrations, written in UTC two hours ago; this Migration's undo, written a minute ago in America/New_York
    (its text sorts below all of those); and one written in DateStyle SQL, whose zone is an abbreviation, which ferry
    cannot read and takes for the oldest. The undos of two more Migrations come: the unreadable entry goes first, then
    the oldest of UTC. This Migration's undo, the newest of the older ferry's, stays, and refuses its late freeze."""
    this = f"{steps.ref.namespace}/{steps.ref.name}/{steps.ref.uid}"
    undone = Attempt(run=RUN, activity="25", scheduled=SCHEDULED + timedelta(seconds=25), number=1)
    entries: dict[str, dict[str, Any]] = {}
    for number in range(30):
        at = _stamped_by_an_older_ferry(source.source, f"2 hours -{number} seconds", timezone="UTC")
        entries[f"{steps.ref.namespace}/utc-{number:02}/{uuid.uuid4()}"] = {"attempt": undone.as_json(), "at": at}
    at = _stamped_by_an_older_ferry(source.source, "1 minute", timezone="America/New_York")
    entries[this] = {"attempt": undone.as_json(), "at": at}
    at = _stamped_by_an_older_ferry(source.source, "30 seconds", timezone="America/New_York", datestyle="SQL,DMY")
    unreadable = f"{steps.ref.namespace}/sql-style/{uuid.uuid4()}"
    entries[unreadable] = {"attempt": undone.as_json(), "at": at}
    oldest = min(key for key in entries if "/utc-" in key)
    set_on_database(source.source, "ferry.unfrozen_by", json.dumps(entries, sort_keys=True))

    for _ in range(2):
        other = dataclasses.replace(steps, ref=steps.ref.model_copy(update={"uid": str(uuid.uuid4())}))
        scheduled_as(other, 25).undo_freeze()

    unfrozen = _unfrozen_by(source.source)
    assert len(unfrozen) == UNFREEZES_KEPT
    assert unreadable not in unfrozen
    assert oldest not in unfrozen
    assert unfrozen[this] == entries[this], "kept as the older ferry wrote it"
    with pytest.raises(Overtaken, match="late attempt"):
        scheduled_as(steps, 20).freeze()
    assert not new_session_is_read_only(source.source)


def test_a_source_whose_database_sets_date_style_sql_is_frozen_checked_and_unfrozen(
    steps: Steps, source: Databases
) -> None:
    """ferry's sessions follow the DateStyle a role or a database sets (here SQL, DMY: 29/11/2026 15:41:41 UTC), in
    which psycopg cannot read a timestamptz: ending the sessions reads none (the server's clock, and when each session
    began, come as ISO text)."""
    set_on_database(source.source, "datestyle", "SQL, DMY")
    with connect(source.source) as open_before:
        result = steps.freeze()

        with pytest.raises(psycopg.OperationalError):
            open_before.execute("select 1")
    steps.check_frozen(result.fence)
    steps.undo_freeze(result.previous_setting)
    assert not new_session_is_read_only(source.source)


STEPPED_BACK = freezing.NOW.replace("clock_timestamp()", "(clock_timestamp() - interval '1 hour')")
"""The server's clock as `end_sessions` reads it when it has stepped back an hour since the sessions there began."""


def test_a_session_open_before_the_freeze_is_ended_by_it_though_the_servers_clock_stepped_back_since(
    steps: Steps, source: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the database server's clock steps back (NTP correcting a clock that ran fast), the sessions opened before
    the step began "in the future": by the clock alone, the freeze would leave them open and writable. A server's clock
    cannot be stepped back on demand, and the machine's must not be, so this test fakes the one reading of it the
    freeze's ending of sessions takes (freezing.NOW, an hour earlier): a fake the house rules allow, to inject what the
    real component cannot produce on demand. The session, pg_stat_activity and the ending are real."""
    monkeypatch.setattr(freezing, "NOW", STEPPED_BACK)
    with connect(source.source) as open_before:
        open_before.execute("insert into public.orders values (1)")

        result = steps.freeze()

        with pytest.raises(psycopg.OperationalError):
            open_before.execute("insert into public.orders values (2)")
    assert result.sessions_ended == 1
    with connect(source.source) as conn:
        assert conn.execute("select count(*) from public.orders").fetchone() == (1,)


def test_ending_sessions_ends_those_there_at_the_call_whatever_the_clock_and_none_that_connect_after(
    source: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `end_sessions` selects, with the server's clock stepped back an hour since the sessions there began (faked
    as in the test above, for the same reason): the session there at the call is ended; one that connects while the
    sessions are being ended (after the call: it has the new setting) is left alone, whatever the clock says."""
    monkeypatch.setattr(freezing, "NOW", STEPPED_BACK)
    later: list[Connection] = []
    with contextlib.ExitStack() as closing, connect(source.source) as there, connect(source.source) as ender:

        def between_rounds(ended: int) -> None:
            if not later:
                later.append(closing.enter_context(connect(source.source)))

        ended = freezing.end_sessions(ender, 5.0, between_rounds)

        assert ended == 1
        with pytest.raises(psycopg.OperationalError):
            there.execute("select 1")
        assert later, "a round ended a session, then looked again"
        assert later[0].execute("select 1").fetchone() == (1,)
