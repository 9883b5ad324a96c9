"""Whether a Service's EndpointSlices list only a StatefulSet's Pods, Ready: what switch-traffic and scale-down-old
wait for and check."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from activities.checks import endpoints_only_of

pytestmark = pytest.mark.unit


def _slice(*endpoints: tuple[str, bool | None, bool | None]) -> k8s.V1EndpointSlice:
    return k8s.V1EndpointSlice(
        address_type="IPv4",
        endpoints=[
            k8s.V1Endpoint(
                addresses=["10.0.0.1"],
                target_ref=k8s.V1ObjectReference(kind="Pod", name=name),
                conditions=k8s.V1EndpointConditions(ready=ready, serving=serving),
            )
            for name, ready, serving in endpoints
        ],
    )


def test_a_pod_that_is_not_serving_is_not_ready_even_where_the_service_publishes_not_ready_addresses() -> None:
    """With publishNotReadyAddresses the EndpointSlice controller marks every endpoint `ready`; only `serving` says
    whether the Pod is Ready. Read as ready, scale-down-old stopped the source while no target Pod served."""
    published = _slice(("orders-db-18-0", True, False))

    assert not endpoints_only_of([published], "orders-db-18", service="orders-db", require_ready=True).done


@pytest.mark.parametrize(("ready", "serving"), [(True, True), (True, None), (None, None)])
def test_a_ready_pod_or_one_of_unknown_readiness_counts_as_ready(ready: bool | None, serving: bool | None) -> None:
    listed = _slice(("orders-db-18-0", ready, serving))

    assert endpoints_only_of([listed], "orders-db-18", service="orders-db", require_ready=True).done
