"""What the Kubernetes-side steps share: the API clients, reads of what the Migration names, and waits.

The steps (provisioning.py, traffic.py, scaling.py) are mixins of this base, put
together in cluster.py as the one class the worker binds. Every method is synchronous:
the worker runs them in a thread pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s

from activities import checks, kube_calls, kube_objects
from activities.ownership import belongs_to
from activities.settings import KubeActivitySettings
from activities.waiting import Progress, wait_for
from ferry.api.errors import InvalidSpec
from ferry.api.saga import MigrationRef


class ClusterApi:
    """The clients of the Kubernetes-side steps and the helpers they share."""

    def __init__(self, api_client: k8s.ApiClient, settings: KubeActivitySettings) -> None:
        self._apps = k8s.AppsV1Api(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._discovery = k8s.DiscoveryV1Api(api_client)
        self._storage = k8s.StorageV1Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)
        self._settings = settings

    def _wait(self, check: Callable[[], Progress]) -> Progress:
        return wait_for(check, self._settings.poll_interval)

    def _selects_source(self, namespace: str, selector: dict[str, str], source: dict[str, Any]) -> bool:
        """Whether a Service with `selector` sends its traffic to the StatefulSet `source` (read as raw JSON).

        By the labels of the source's Pod template, or, for a selector by the controller's
        per-Pod labels (one Pod by its name, say), by the Pods it selects now.
        """
        if not selector:
            return False
        labels = ((source["spec"]["template"].get("metadata") or {}).get("labels")) or {}
        if kube_objects.services_selecting(labels, {"stable": selector}):
            return True
        pods = self._core.list_namespaced_pod(namespace, label_selector=kube_objects.label_selector(selector)).items
        name = source["metadata"]["name"]
        return any(kube_objects.is_pod_of(name, pod.metadata.name) for pod in pods)

    def _read_migration(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Migration of that name as raw JSON; None when there is none."""
        return kube_calls.read_migration(self._custom, namespace, name)

    def _source_of(self, ref: MigrationRef) -> str | None:
        """The spec.source.statefulSet of the Migration `ref`; None when it is gone (or created again: another uid)."""
        migration = self._read_migration(ref.namespace, ref.name)
        if migration is None or migration["metadata"].get("uid") != ref.uid:
            return None
        source: str = migration["spec"]["source"]["statefulSet"]
        return source

    def _read_named_in_spec(self, read: Callable[..., Any], name: str, ref: MigrationRef, field: str) -> dict[str, Any]:
        """Reads an object the Migration names; its absence is a spec error that retrying cannot fix."""
        found = kube_calls.read_json_or_none(read, name, ref.namespace)
        if found is None:
            raise InvalidSpec(
                f"{field}: {name!r} does not exist in namespace {ref.namespace}. Create it, or delete Migration {ref} "
                f"and create it again with the right {field} (the plan cannot change after creation)."
            )
        return found

    def _pods_of(self, stateful_set: Any) -> list[Any]:
        """The Pods a StatefulSet controls, terminating ones included."""
        selector = kube_objects.label_selector(stateful_set.spec.selector.match_labels or {})
        pods = self._core.list_namespaced_pod(stateful_set.metadata.namespace, label_selector=selector).items
        uid = stateful_set.metadata.uid
        return [pod for pod in pods if any(owner.uid == uid for owner in pod.metadata.owner_references or [])]

    def _wait_for_endpoints(
        self,
        ref: MigrationRef,
        service: str,
        stateful_set: str,
        *,
        require_ready: bool,
        selector: dict[str, str] | None = None,
    ) -> Progress:
        """Waits until the Service's EndpointSlices list the Pods of `stateful_set` (see checks.endpoints_only_of).

        With `selector` (the Service's own, put back by an undo), the other Pods it matches are
        tolerated: they were listed before the switch too (an exporter, a pooler, a backup Job's
        Pod labelled like the database). This Migration's Pods never are, whatever their labels.
        """

        def listed() -> Progress:
            slices = self._discovery.list_namespaced_endpoint_slice(
                ref.namespace, label_selector=f"kubernetes.io/service-name={service}"
            ).items
            tolerated = frozenset(self._also_selected(ref, selector)) if selector else frozenset[str]()
            return checks.endpoints_only_of(
                slices, stateful_set, service=service, require_ready=require_ready, tolerated=tolerated
            )

        return self._wait(listed)

    def _also_selected(self, ref: MigrationRef, selector: dict[str, str]) -> list[str]:
        """The Pods `selector` matches that are not this Migration's."""
        label_selector = kube_objects.label_selector(selector)
        pods = self._core.list_namespaced_pod(ref.namespace, label_selector=label_selector).items
        return [pod.metadata.name for pod in pods if not belongs_to(pod, ref)]
