"""Which StatefulSet's Pod a database Secret's host names by its stable DNS name, if any."""

from __future__ import annotations

import pytest

from activities.kube_objects import pod_named_by


@pytest.mark.parametrize(
    ("host", "named"),
    [
        ("orders-db-0.orders-db", ("orders-db", "orders-db")),
        ("orders-db-18-2.orders-db-18.shop", ("orders-db-18", "orders-db-18")),
        ("Orders-DB-0.headless.shop.svc.cluster.local.", ("orders-db", "headless")),
        ("orders-db-0.orders-db.billing.svc", None),  # another namespace: not this Migration's
        ("db-1.example.com", None),  # outside the cluster
        ("orders-db.shop.svc", None),  # a Service
        ("orders-db-primary.orders-db", None),  # no ordinal
        ("-0.orders-db", None),
        ("10.0.0.7", None),
        ("orders-db-0", None),  # a bare name resolves only through a search path
    ],
)
def test_a_host_names_a_pod_only_by_its_stable_dns_name_in_the_namespace(
    host: str, named: tuple[str, str] | None
) -> None:
    assert pod_named_by(host, "shop") == named
