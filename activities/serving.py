"""Whether clients' traffic goes to a Migration's target: nothing deletes or empties a target a Service sends it to.

switch-traffic points the stable Service at the target's Pods by ferry's label
(STATEFULSET_LABEL = the target's name), and its undo points it back. On the way back
the undos run newest first, so by the time the target is emptied (the undos of
migrate, snapshot and replicate) or deleted (provision's), the Service has its old
selector again. That order is not the only way there: a run reset to a point before
switch-traffic (`temporal workflow reset`) rolls back without knowing it switched, a
person or a GitOps controller may point the Service at the target, and an undo of
switch-traffic that failed may be gone past. Each of these undos therefore looks for
itself, and refuses (retryably, TARGET_SERVES_TRAFFIC) while a Service other than the
target's own headless one selects the target: clients would be reading and writing a
database being emptied under them.
"""

from __future__ import annotations

from kubernetes import client as k8s
from temporalio.exceptions import ApplicationError

from activities import records
from activities.ownership import belongs_to, own_selector
from ferry.api.migration import STATEFULSET_LABEL
from ferry.api.saga import MigrationRef

TARGET_SERVES_TRAFFIC = "TargetServesTraffic"
"""A Service still sends its clients to the target that an undo would delete or empty: tried again."""


def services_sending_to(core: k8s.CoreV1Api, ref: MigrationRef, target: str) -> list[str]:
    """The Services of the namespace, but the target's own, whose selector picks the target's Pods by ferry's label."""
    services = core.list_namespaced_service(ref.namespace).items
    return sorted(
        service.metadata.name
        for service in services
        if (service.spec.selector or {}).get(STATEFULSET_LABEL) == target and not belongs_to(service, ref)
    )


def refuse_while_serving(core: k8s.CoreV1Api, ref: MigrationRef, target: str, doing: str) -> None:
    """Fails (retryably) while a Service sends its traffic to the target StatefulSet `target`; `doing` is the undo's
    act in words (e.g. "deleting StatefulSet shop/orders-db-18")."""
    serving = services_sending_to(core, ref, target)
    if serving:
        raise ApplicationError(
            f"not {doing}: Service {', '.join(serving)} still sends its traffic to StatefulSet "
            f"{ref.namespace}/{target}. Undo switch-traffic first (or point the Service back by hand: its previous "
            f"selector is in the annotation {records.PREVIOUS_SELECTOR_ANNOTATION}); this undo is retried.",
            type=TARGET_SERVES_TRAFFIC,
        )


class TargetTraffic:
    """The check for the data driver's undos, which know the target by its database only: they find its StatefulSet
    by this Migration's uid label. Without an API client (a benchmark's driver) there is nothing to check."""

    def __init__(self, api_client: k8s.ApiClient | None) -> None:
        self._clients = (k8s.AppsV1Api(api_client), k8s.CoreV1Api(api_client)) if api_client is not None else None

    def refuse_while_served(self, ref: MigrationRef, doing: str) -> None:
        """refuse_while_serving for each StatefulSet this Migration provisioned."""
        if self._clients is None:
            return
        apps, core = self._clients
        for stateful_set in apps.list_namespaced_stateful_set(ref.namespace, label_selector=own_selector(ref)).items:
            refuse_while_serving(core, ref, stateful_set.metadata.name, doing)
