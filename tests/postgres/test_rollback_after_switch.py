"""A rollback after traffic moved, through ferry's real worker and saga: writes the target took are never given up.

While the Migration soaks before scale-down-old, the clients already write to the
target. A rollback then would point them back at the source and empty the target:
instead, when the target took writes, the rollback stops before traffic goes back, the
Migration says why and what to do, and the target keeps serving with every row. With no
write to the target the same rollback goes all the way back.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.client import WorkflowFailureError, WorkflowHandle

from ferry.api.migration import STATEFULSET_LABEL
from ferry.api.saga import ControlOutcome, ControlRequest, MigrationRef, Signal
from tests.cluster import SOURCE_PODS, endpoint_pods
from tests.end_to_end import Databases, Ready, eventually
from tests.postgres.data import connect, contents, create_shop

SAGA_TIMEOUT = 240
SOURCE, TARGET = "orders-db", "orders-db-16"


async def _soaking_on_the_target(ready: Ready) -> tuple[MigrationRef, WorkflowHandle[Any, Any]]:
    """Starts a Migration with a long soak and returns once traffic moved and it soaks before scale-down-old."""
    manifest = ready.manifest(soakSeconds=3600)
    ref = ready.apply(manifest)
    handle = await ready.start(ref, manifest)

    async def soaking() -> bool:
        status = ready.status(ref.name)
        steps = {step["name"]: step["state"] for step in status.get("steps", [])}
        return (
            steps.get("switch-traffic") == "Succeeded"
            and status.get("phase") == "Running"
            and str(status.get("message", "")).startswith("soaking")
        )

    seen = lambda: str(ready.status(ref.name))  # noqa: E731
    await eventually("the Migration to soak with traffic on the target", soaking, SAGA_TIMEOUT, seen)
    return ref, handle


async def _roll_back(handle: WorkflowHandle[Any, Any]) -> None:
    request = ControlRequest(by="alice", reason="slow queries", request_id="rollback-1")
    outcome = await handle.execute_update(Signal.ROLLBACK.value, request, result_type=ControlOutcome)
    assert outcome.control == "rollback"


def _selector(kube_api: k8s.ApiClient, namespace: str) -> dict[str, str]:
    service = k8s.CoreV1Api(kube_api).read_namespaced_service(SOURCE, namespace)
    return dict(service.spec.selector or {})


def _stateful_sets(kube_api: k8s.ApiClient, namespace: str) -> list[str]:
    return sorted(item.metadata.name for item in k8s.AppsV1Api(kube_api).list_namespaced_stateful_set(namespace).items)


@pytest.fixture
def shop(databases: Databases) -> Databases:
    create_shop(databases.source, customers=100, orders=2_000)
    return databases


async def test_a_rollback_after_the_target_took_writes_stops_before_traffic_goes_back_and_keeps_them(
    shop: Databases, ready: Ready, kube_api: k8s.ApiClient, namespace: str
) -> None:
    ref, handle = await _soaking_on_the_target(ready)
    with connect(shop.target) as client:  # a client of the Service, which now reaches the target
        client.execute("insert into audit.log (order_id, note) values (3, 'written to the target')")
        client.execute("update shop.customers set email = 'new@example.com' where id = 1")
    written = contents(shop.target)

    await _roll_back(handle)

    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), SAGA_TIMEOUT)
    assert "RollbackIncomplete" in str(failure.value.cause)
    status = ready.status(ref.name)
    assert status["phase"] == "Failed"
    message = status["message"]
    assert message.startswith(
        "rollback stopped after rollback requested by alice: slow queries: the check before undoing switch-traffic "
        f"failed (WritesOnTarget: database '{shop.target.database}'"
    )
    assert "took writes since traffic moved to it: 2 rows were inserted, updated or deleted" in message
    assert "traffic stays on the target" in message
    assert message.endswith("not undone, as the check requires: switch-traffic, migrate, snapshot, freeze, provision")
    steps = {step["name"]: step for step in status["steps"]}
    assert steps["switch-traffic"]["state"] == "CompensationFailed"
    assert steps["switch-traffic"]["lastError"].startswith("check before undo: WritesOnTarget:")
    assert _selector(kube_api, namespace) == {STATEFULSET_LABEL: TARGET}, "the Service still sends clients there"
    assert endpoint_pods(kube_api, namespace, SOURCE) == [f"{TARGET}-0"]
    assert contents(shop.target) == written, "the target keeps every row, the client's too"
    with connect(shop.target) as conn:
        assert conn.execute("select count(*) from audit.log where note = 'written to the target'").fetchone() == (1,)
    assert TARGET in _stateful_sets(kube_api, namespace)


async def test_a_rollback_after_traffic_moved_to_a_target_nobody_wrote_to_goes_all_the_way_back(
    shop: Databases, ready: Ready, kube_api: k8s.ApiClient, namespace: str
) -> None:
    ref, handle = await _soaking_on_the_target(ready)
    with connect(shop.target) as reader:  # reads and statistics alone are no writes
        reader.execute("select count(*) from shop.orders")
        reader.execute("analyze")

    await _roll_back(handle)

    result = await asyncio.wait_for(handle.result(), SAGA_TIMEOUT)
    assert result["phase"] == "RolledBack"
    assert ready.status(ref.name)["phase"] == "RolledBack"
    assert _selector(kube_api, namespace) == {"app": SOURCE}
    assert endpoint_pods(kube_api, namespace, SOURCE) == SOURCE_PODS
    assert TARGET not in _stateful_sets(kube_api, namespace)
    with connect(shop.source) as conn:  # the source takes writes again
        conn.execute("insert into audit.log (order_id, note) values (3, 'after the rollback')")
