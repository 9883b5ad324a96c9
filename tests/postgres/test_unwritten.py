"""The check before traffic goes back: a target that took writes since traffic moved to it is not given up.

verify, once the target equals the source, marks where the target's writes stand and
keeps the mark in the target; check_unwritten, before switch-traffic's undo, compares
the target with it and fails with WritesOnTarget whatever way the target was written.
It must not cry wolf over what an unwritten target sees (the restore's and verify's own
statistics, ANALYZE, VACUUM, reads), and it must end no session: the target is live.

The undo that then empties the target compares it with the mark again, once the target's
other sessions are gone, and drops nothing when it took writes: changing the Service's
selector ends no connection, so a pooled one may still write to the target after the
check passed, while the source is still frozen.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s
from psycopg import sql

from activities.kube_objects import target_pod_labels
from activities.records import PREVIOUS_SELECTOR_ANNOTATION, encode_selector
from devstack.stack.readiness import LOOPBACK, free_port
from ferry.api.errors import DatabaseUnreachable, WritesOnTarget
from ferry.api.saga import CheckUnwrittenInput, VerifyResult
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps, create_secret
from tests.postgres.data import as_new, connect, contents, create_shop, database_settings, verified_mark


@pytest.fixture
def verified(steps: Steps, databases: Databases) -> VerifyResult:
    """A small shop migrated and verified for real: the target is as it is when traffic moves to it."""
    create_shop(databases.source, customers=100, orders=1_000)
    steps.freeze()
    steps.migrate(steps.snapshot())
    return steps.verify()


def test_verify_marks_the_target_and_keeps_the_mark_in_it(
    steps: Steps, databases: Databases, verified: VerifyResult
) -> None:
    assert verified.target_fence is not None
    assert verified.target_fence.writes >= 1_100, "the restore's rows are counted in the mark"
    info = steps.env.info
    assert verified_mark(databases.target) == {
        "migration": f"{steps.ref.namespace}/{steps.ref.name}/{steps.ref.uid}",
        "fence": verified.target_fence.model_dump(mode="json"),
        "attempt": {
            "run": info.workflow_run_id,
            "activity": info.activity_id,
            "scheduled": info.scheduled_time.isoformat(),
            "number": info.attempt,
        },
    }


def test_a_target_nobody_wrote_to_passes_after_analyze_vacuum_and_reads(
    steps: Steps, databases: Databases, verified: VerifyResult
) -> None:
    with connect(databases.target) as conn:
        conn.execute("analyze")
        conn.execute("vacuum (analyze) shop.orders")
        conn.execute("select count(*) from shop.orders join shop.customers on customers.id = customer_id")
        conn.execute("select * from audit.log where order_id = 3")

    by_result = steps.check_unwritten(verified.target_fence)
    by_marker = steps.check_unwritten(None)

    assert by_result.compared
    assert by_marker.compared
    assert by_result.fence == by_marker.fence == verified.target_fence


def test_the_check_ends_no_session_of_the_live_target(
    steps: Steps, databases: Databases, verified: VerifyResult
) -> None:
    with connect(databases.target) as client:
        client.execute("select count(*) from shop.orders")

        steps.check_unwritten(verified.target_fence)

        assert client.execute("select 1").fetchone() == (1,)


@pytest.mark.parametrize(
    ("write", "caught"),
    [
        pytest.param(
            "insert into audit.log (order_id, note) values (3, 'after the switch')",
            "1 row was inserted, updated or deleted",
            id="insert",
        ),
        pytest.param("select nextval('audit.ticket_seq')", "sequences moved", id="nextval"),
        pytest.param("truncate audit.log", "tables or the schema changed", id="truncate"),
    ],
)
@pytest.mark.parametrize("mark", ["verify's result", "the target's marker"])
def test_a_target_written_since_traffic_moved_fails_the_check_and_keeps_its_writes(
    steps: Steps, databases: Databases, verified: VerifyResult, write: str, caught: str, mark: str
) -> None:
    with connect(databases.target) as client:
        client.execute(write)
    written = contents(databases.target)

    with pytest.raises(WritesOnTarget) as raised:
        steps.check_unwritten(verified.target_fence if mark == "verify's result" else None)

    message = str(raised.value)
    assert f"database '{databases.target.database}'" in message
    assert f"took writes since traffic moved to it: {caught}" in message
    assert "Switching traffic back to the source would lose them" in message
    assert "the rollback stops here and traffic stays on the target" in message
    assert "keep the target" in message
    assert "copy those writes back to the source by hand" in message
    assert "after the switch" not in message, "no row values in messages"
    assert contents(databases.target) == written


def test_a_write_whose_session_is_still_open_and_has_not_flushed_its_statistics_is_caught(
    steps: Steps, databases: Databases, verified: VerifyResult
) -> None:
    """A backend that flushed less than a second ago keeps its counts for up to 10 s: the check waits for them."""
    with connect(databases.target) as client:
        client.execute("insert into audit.log (order_id, note) values (3, 'first')")
        client.execute("insert into audit.log (order_id, note) values (3, 'second')")  # within the second

        with pytest.raises(WritesOnTarget, match="2 rows were inserted, updated or deleted"):
            steps.check_unwritten(verified.target_fence)

        assert client.execute("select 1").fetchone() == (1,), "the client's session was not ended"


def test_a_target_verify_never_marked_passes_since_ferry_moved_no_traffic_to_it(
    steps: Steps, databases: Databases
) -> None:
    create_shop(databases.target, customers=10, orders=10)

    result = steps.check_unwritten(None)

    assert not result.compared


def test_a_mark_of_another_migration_is_not_this_ones(steps: Steps, databases: Databases) -> None:
    with connect(databases.target) as conn:
        other = json.dumps({"migration": "shop/orders-db-to-16/another-uid", "fence": {"writes": 0, "catalog": "x"}})
        database = sql.Identifier(databases.target.database)
        conn.execute(sql.SQL("alter database {} set ferry.verified_mark = {}").format(database, sql.Literal(other)))

    assert not steps.check_unwritten(None).compared


def test_undo_migrate_removes_the_mark_with_the_restore(
    steps: Steps, databases: Databases, verified: VerifyResult
) -> None:
    assert verified_mark(databases.target) is not None

    assert steps.undo_migrate().removed

    assert database_settings(databases.target) == []
    assert not steps.check_unwritten(None).compared


@pytest.mark.parametrize("undo", ["undo_migrate", "undo_snapshot"])
def test_a_write_over_a_connection_left_open_past_the_check_stops_the_undo_which_keeps_every_row(
    steps: Steps, databases: Databases, verified: VerifyResult, undo: str
) -> None:
    """The application's pool keeps its connection to the target when the Service goes back to the source."""
    with connect(databases.target) as pooled:
        pooled.execute("select count(*) from shop.orders")
        steps.check_unwritten(verified.target_fence)  # traffic may go back: the Service selects the source
        pooled.execute("insert into audit.log (order_id, note) values (3, 'late pooled write')")
        written = contents(databases.target)

        with pytest.raises(WritesOnTarget) as raised:
            steps.undo_migrate() if undo == "undo_migrate" else steps.undo_snapshot()

    message = str(raised.value)
    assert f"refused to empty database '{databases.target.database}'" in message
    assert "1 row was inserted, updated or deleted" in message
    assert "only the target has them" in message
    assert "Copy those writes into the source by hand" in message
    assert "late pooled write" not in message, "no row values in messages"
    assert contents(databases.target) == written, "nothing was dropped"
    with connect(databases.target) as conn:
        assert conn.execute("select count(*) from audit.log where note = 'late pooled write'").fetchone() == (1,)
    assert verified_mark(databases.target) is not None, "a later undo compares again"
    with pytest.raises(WritesOnTarget):
        steps.undo_migrate()
    assert contents(databases.target) == written


@pytest.mark.parametrize("idle", ["idle", "idle in a transaction that read"])
def test_an_idle_pooled_session_does_not_keep_the_undo_from_emptying_a_target_nobody_wrote_to(
    steps: Steps, databases: Databases, verified: VerifyResult, idle: str
) -> None:
    with connect(databases.target) as pooled:
        pooled.execute("select count(*) from shop.orders")
        steps.check_unwritten(verified.target_fence)
        if idle != "idle":
            pooled.execute("begin")
            pooled.execute("select count(*) from audit.log")  # holds a lock on the table until it ends

        assert steps.undo_migrate().removed

    assert as_new(databases.target)


def test_the_check_before_the_undo_of_a_switch_this_run_never_ran_asks_the_service_not_the_silent_target(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """switch-traffic's check failed at every attempt (the target not answering to seal verify's mark): the stable
    Service says no traffic moved, so the target, still silent, is not asked. A record of a switch by this Migration
    (a reset's earlier run switched), or a selector that selects the target's Pods, and it is asked, as ever."""
    core = k8s.CoreV1Api(kube_api)
    service = k8s.V1Service(
        metadata=k8s.V1ObjectMeta(name="orders-db"),
        spec=k8s.V1ServiceSpec(selector={"app": "orders-db"}, ports=[k8s.V1ServicePort(port=5432)]),
    )
    core.create_namespaced_service(namespace, service)
    target = databases.target
    create_secret(
        kube_api, namespace, "silent-target",
        {"host": LOOPBACK, "port": str(free_port()), "username": target.user, "password": target.password,
         "database": target.database},
    )  # fmt: skip
    driver = steps.driver.model_copy(update={"target_secret": "silent-target"})
    check = CheckUnwrittenInput(ref=steps.ref, driver=driver, service="orders-db", target_stateful_set="orders-db-16")

    checked = steps.env.run(steps.postgres.check_unwritten, check)

    assert (checked.compared, checked.no_traffic_moved) == (False, True)
    switched = {PREVIOUS_SELECTOR_ANNOTATION: encode_selector(steps.ref, {"app": "orders-db"})}
    for selector, recorded in ((target_pod_labels(steps.ref, "orders-db-16"), {}), ({"app": "orders-db"}, switched)):
        changed = core.read_namespaced_service("orders-db", namespace)
        changed.spec.selector, changed.metadata.annotations = selector, recorded
        core.replace_namespaced_service("orders-db", namespace, changed)
        with pytest.raises(DatabaseUnreachable):
            steps.env.run(steps.postgres.check_unwritten, check)
    changed = core.read_namespaced_service("orders-db", namespace)
    changed.spec.selector, changed.metadata.annotations = {"app": "orders-db"}, {}
    core.replace_namespaced_service("orders-db", namespace, changed)
    steps.env.run(steps.postgres.check_unwritten, check)  # as at first
    listed = k8s.V1EndpointSlice(  # a target Pod among its endpoints, however it got there
        metadata=k8s.V1ObjectMeta(name="orders-db-by-hand", labels={"kubernetes.io/service-name": "orders-db"}),
        address_type="IPv4",
        endpoints=[
            k8s.V1Endpoint(addresses=["10.0.0.9"], target_ref=k8s.V1ObjectReference(kind="Pod", name="orders-db-16-0"))
        ],
    )
    k8s.DiscoveryV1Api(kube_api).create_namespaced_endpoint_slice(namespace, listed)
    with pytest.raises(DatabaseUnreachable):
        steps.env.run(steps.postgres.check_unwritten, check)
