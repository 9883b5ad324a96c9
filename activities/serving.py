"""Whether clients' traffic goes to a Migration's target: nothing deletes or empties a target a Service sends it to.

switch-traffic points the stable Service at the target's Pods by ferry's label
(STATEFULSET_LABEL = the target's name), and its undo points it back. On the way back
the undos run newest first, so by the time the target is emptied (the undos of
migrate, snapshot and replicate) or deleted (provision's), the Service has its old
selector again. That order is not the only way there: a run reset to a point before
switch-traffic (`temporal workflow reset`) rolls back without knowing it switched, a
person or a GitOps controller may point the Service at the target, and an undo of
switch-traffic that failed may be gone past. So these undos look for themselves, and
refuse (retryably, TARGET_SERVES_TRAFFIC): provision's while any Service but the
target's own headless one selects the target by ferry's label (`refuse_while_serving`),
the emptying ones while a Service this Migration switched still does (`TargetTraffic`).
Provision's also counts a Service whose EndpointSlices list a target Pod, whatever its
selector.
Clients would otherwise read and write a database being emptied or deleted under them.
"""

from __future__ import annotations

from kubernetes import client as k8s
from temporalio.exceptions import ApplicationError

from activities import records
from activities.kube_objects import is_pod_of
from activities.ownership import belongs_to
from ferry.api.migration import STATEFULSET_LABEL
from ferry.api.saga import MigrationRef

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
"""The label that names the Service of an EndpointSlice."""
TARGET_SERVES_TRAFFIC = "TargetServesTraffic"
"""A Service still sends its clients to the target that an undo would delete or empty: tried again."""


def services_sending_to(
    core: k8s.CoreV1Api, discovery: k8s.DiscoveryV1Api, ref: MigrationRef, target: str
) -> list[str]:
    """The Services of the namespace, but the target's own headless one, that send traffic to the target: those
    whose selector picks its Pods by ferry's label, and those whose EndpointSlices list one of its Pods (a Service
    that selects them by another label they carry)."""
    by_label = {
        service.metadata.name
        for service in core.list_namespaced_service(ref.namespace).items
        if (service.spec.selector or {}).get(STATEFULSET_LABEL) == target and not belongs_to(service, ref)
    }
    by_endpoints = set()
    for endpoint_slice in discovery.list_namespaced_endpoint_slice(ref.namespace).items:
        service = (endpoint_slice.metadata.labels or {}).get(SERVICE_NAME_LABEL)
        if service is not None and any(
            endpoint.target_ref is not None
            and endpoint.target_ref.kind == "Pod"
            and is_pod_of(target, endpoint.target_ref.name)
            for endpoint in endpoint_slice.endpoints or []
        ):
            by_endpoints.add(service)
    return sorted((by_label | by_endpoints) - {target})


def refuse_while_serving(
    core: k8s.CoreV1Api, discovery: k8s.DiscoveryV1Api, ref: MigrationRef, target: str, doing: str
) -> None:
    """Fails (retryably) while a Service sends its traffic to the target StatefulSet `target`; `doing` is the undo's
    act in words (e.g. "deleting StatefulSet shop/orders-db-18")."""
    serving = services_sending_to(core, discovery, ref, target)
    if serving:
        raise ApplicationError(
            f"not {doing}: Service {', '.join(serving)} still sends its traffic to StatefulSet "
            f"{ref.namespace}/{target}. Undo switch-traffic first, or point the Service back by hand (if ferry "
            f"switched it, its previous selector is in the annotation {records.PREVIOUS_SELECTOR_ANNOTATION}); this "
            "undo is retried.",
            type=TARGET_SERVES_TRAFFIC,
        )


class TargetTraffic:
    """The check for the undos that empty the target (migrate's, snapshot's, replicate's), which know the target by
    its database only: they refuse while a Service carries this Migration's record of a switch (switch-traffic's,
    records.py) and still selects a target by ferry's label, that is while traffic this Migration moved to the
    target has not been moved back. A Service a person pointed at the target without ferry is left to provision's
    undo, which refuses to delete a target any Service selects; emptying the database under it is what rolling back
    before any switch means. Reads Services only (the worker may list those, not StatefulSets). Without an API
    client (a benchmark's driver) there is nothing to check."""

    def __init__(self, api_client: k8s.ApiClient | None) -> None:
        self._core = k8s.CoreV1Api(api_client) if api_client is not None else None

    def refuse_while_served(self, ref: MigrationRef, doing: str) -> None:
        """Fails (retryably, TARGET_SERVES_TRAFFIC) while a Service this Migration switched still selects its target."""
        if self._core is None:
            return
        switched = sorted(
            (service.metadata.name, (service.spec.selector or {})[STATEFULSET_LABEL])
            for service in self._core.list_namespaced_service(ref.namespace).items
            if STATEFULSET_LABEL in (service.spec.selector or {}) and _switched_by(service, ref)
        )
        if switched:
            name, target = switched[0]
            raise ApplicationError(
                f"not {doing}: Service {ref.namespace}/{name} still sends its traffic to StatefulSet "
                f"{ref.namespace}/{target}, where this Migration's switch-traffic pointed it. Undo switch-traffic "
                f"first (or point the Service back by hand: its previous selector is in the annotation "
                f"{records.PREVIOUS_SELECTOR_ANNOTATION}); this undo is retried.",
                type=TARGET_SERVES_TRAFFIC,
            )


def _switched_by(service: k8s.V1Service, ref: MigrationRef) -> bool:
    """Whether the Service carries this Migration's record of a switch."""
    record = records.selector_record(dict(service.metadata.annotations or {}))
    return record is not None and record.is_of(ref)
