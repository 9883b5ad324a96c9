"""Whether a source Secret's host is the stable Service's DNS name, which switch-traffic points at the target."""

from __future__ import annotations

import pytest

from activities.postgres.prechecks import _through_service


@pytest.mark.parametrize(
    "host", ["orders-db", "orders-db.shop", "orders-db.shop.svc", "orders-db.shop.svc.cluster.local", "ORDERS-DB."]
)
def test_the_stable_services_names_short_or_qualified_are_the_stable_service(host: str) -> None:
    assert _through_service(host, "orders-db", "shop")


@pytest.mark.parametrize(
    "host",
    [
        "orders-db-0.orders-db.shop.svc.cluster.local",  # the source's Pod, through the headless Service
        "orders-db-direct.shop.svc",
        "orders-db.billing.svc.cluster.local",  # another namespace's Service of that name
        "orders-db.shop.example.com",
        "10.0.0.12",
    ],
)
def test_a_pod_another_service_or_another_namespace_is_not(host: str) -> None:
    assert not _through_service(host, "orders-db", "shop")
