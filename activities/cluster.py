"""The saga's steps on Kubernetes objects, each next to its undo: provision, switch-traffic, scale-down-old.

Every activity can run again after a crash at any point and reach the same end: what
it must remember across attempts lives in the cluster (annotations on the objects it
changes, labels on the objects it creates), never in the worker. Writes to objects
ferry does not own are conditional on the resourceVersion they were computed from
(see kube_calls), so a concurrent change is re-read, never overwritten. Every method
is synchronous: the worker runs them in a thread pool.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from temporalio import activity

from activities import checks, kube_calls, kube_objects
from activities.kube_objects import PREVIOUS_REPLICAS_ANNOTATION, PREVIOUS_SELECTOR_ANNOTATION
from activities.settings import KubeActivitySettings
from activities.waiting import Progress, wait_for
from ferry.api.errors import InvalidSpec
from ferry.api.migration import MIGRATION_LABEL, STATEFULSET_LABEL
from ferry.api.saga import (
    KubeActivity,
    MigrationRef,
    ProvisionInput,
    ProvisionResult,
    ScaleDownOldInput,
    ScaleDownOldResult,
    SwitchTrafficInput,
    SwitchTrafficResult,
    UndoProvisionInput,
    UndoScaleDownOldInput,
    UndoSwitchTrafficInput,
)


class ClusterActivities:
    """Kubernetes-side activities, sharing one API client."""

    def __init__(self, api_client: k8s.ApiClient, settings: KubeActivitySettings) -> None:
        self._apps = k8s.AppsV1Api(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._discovery = k8s.DiscoveryV1Api(api_client)
        self._settings = settings

    # --- provision ---------------------------------------------------------------------------

    @activity.defn(name=KubeActivity.PROVISION.value)
    def provision(self, input: ProvisionInput) -> ProvisionResult:
        """Creates the target StatefulSet and its headless Service from the source, and waits until it is Ready.

        Idempotent: both objects are server-side applied from the same source and spec,
        so a retry applies the same manifests again. Objects with the target's names that
        ferry did not create for this Migration are refused, never taken over.
        """
        ref, spec = input.ref, input.spec
        target = spec.target.stateful_set
        source = self._read_named_in_spec(
            self._apps.read_namespaced_stateful_set, spec.source.stateful_set, ref, "spec.source.statefulSet"
        )
        service = self._read_named_in_spec(
            self._core.read_namespaced_service, spec.source.service, ref, "spec.source.service"
        )
        if not service["spec"].get("selector"):
            raise InvalidSpec(
                f"spec.source.service: Service {ref.namespace}/{spec.source.service} has no selector, and ferry "
                "moves traffic by changing it. Migrate only StatefulSets whose clients use a Service with a selector."
            )
        stateful_set = kube_objects.target_stateful_set(source, service, ref, spec.target)
        headless = kube_objects.headless_service(service, ref, spec.target)
        self._refuse_foreign(ref, "StatefulSet", self._apps.read_namespaced_stateful_set, target)
        self._refuse_foreign(ref, "Service", self._core.read_namespaced_service, target)
        # The StatefulSet controller would adopt claims with its Pods' claim names: someone else's data.
        for claim in stateful_set["spec"]["volumeClaimTemplates"]:
            for ordinal in range(spec.target.replicas):
                claim_name = f"{claim['metadata']['name']}-{target}-{ordinal}"
                read_claim = self._core.read_namespaced_persistent_volume_claim
                self._refuse_foreign(ref, "PersistentVolumeClaim", read_claim, claim_name)

        kube_calls.apply(self._core.patch_namespaced_service, headless, self._settings.field_manager)
        kube_calls.apply(self._apps.patch_namespaced_stateful_set, stateful_set, self._settings.field_manager)
        activity.logger.info("applied StatefulSet and Service %s/%s for Migration %s", ref.namespace, target, ref)

        ready = self._wait(
            lambda: checks.stateful_set_ready(
                self._apps.read_namespaced_stateful_set(target, ref.namespace), all_updated=True
            )
        )
        return ProvisionResult(stateful_set=target, service=target, ready_replicas=ready.counts["ready"])

    @activity.defn(name=KubeActivity.UNDO_PROVISION.value)
    def undo_provision(self, input: UndoProvisionInput) -> None:
        """Deletes the target StatefulSet, its headless Service and its claims, and waits until its Pods are gone.

        Idempotent: NotFound counts as deleted, and only objects labelled as ferry's for
        this Migration are deleted, so a second run finds nothing left to do. Anything
        else with the target's names is logged and left alone.
        """
        ref, target = input.ref, input.stateful_set
        reads = (
            ("StatefulSet", self._apps.read_namespaced_stateful_set, self._apps.delete_namespaced_stateful_set),
            ("Service", self._core.read_namespaced_service, self._core.delete_namespaced_service),
        )
        for kind, read, delete in reads:
            found = kube_calls.read_json_or_none(read, target, ref.namespace)
            if found is None:
                continue
            if kube_objects.belongs_to(found, ref.name):
                kube_calls.delete_if_present(delete, target, ref.namespace)
            else:
                activity.logger.warning(
                    "leaving %s %s/%s: ferry did not create it for %s", kind, ref.namespace, target, ref
                )

        claims = self._core.list_namespaced_persistent_volume_claim(
            ref.namespace, label_selector=f"{STATEFULSET_LABEL}={target}"
        ).items
        for claim in claims:
            name = claim.metadata.name
            if (claim.metadata.labels or {}).get(MIGRATION_LABEL) == ref.name:
                kube_calls.delete_if_present(self._core.delete_namespaced_persistent_volume_claim, name, ref.namespace)
            else:
                activity.logger.warning("leaving claim %s/%s: ferry did not create it for %s", ref.namespace, name, ref)

        def pods_and_claims_gone() -> Progress:
            selector = f"{STATEFULSET_LABEL}={target}"
            pods = self._core.list_namespaced_pod(ref.namespace, label_selector=selector).items
            claims = self._core.list_namespaced_persistent_volume_claim(ref.namespace, label_selector=selector).items
            ours = [item for item in [*pods, *claims] if (item.metadata.labels or {}).get(MIGRATION_LABEL) == ref.name]
            return checks.gone(f"Pods and claims of StatefulSet {ref.namespace}/{target}", ours)

        self._wait(pods_and_claims_gone)
        activity.logger.info("deleted StatefulSet %s/%s of Migration %s", ref.namespace, target, ref)

    # --- switch-traffic ----------------------------------------------------------------------

    @activity.defn(name=KubeActivity.SWITCH_TRAFFIC.value)
    def switch_traffic(self, input: SwitchTrafficInput) -> SwitchTrafficResult:
        """Points the stable Service's selector at the target's Pods and waits until only they are its endpoints.

        Idempotent: the first switch stores the original selector in the Service's
        annotation ferry.dev/previous-selector, in the same write that changes the
        selector; a retry finds the target's selector with that annotation and returns
        the stored one, never the target's. An annotation next to any other selector is
        left over from an earlier migration of this Service, and is overwritten.
        """
        ref, name = input.ref, input.service
        target_selector = {STATEFULSET_LABEL: input.target_stateful_set}

        def point_at_target() -> dict[str, str]:
            service = self._read_named_in_spec(self._core.read_namespaced_service, name, ref, "spec.source.service")
            recorded = kube_calls.annotations_of(service).get(PREVIOUS_SELECTOR_ANNOTATION)
            current: dict[str, str] = service["spec"].get("selector") or {}
            if current == target_selector and recorded is not None:
                stored: dict[str, str] = json.loads(recorded)
                return stored
            if current == target_selector:
                activity.logger.warning(
                    "Service %s/%s already selected the target, with no record of its selector before; "
                    "undoing this switch will leave it on the target",
                    ref.namespace,
                    name,
                )
            operations = [
                kube_calls.set_value("/spec/selector", target_selector),
                kube_calls.set_annotation(service, PREVIOUS_SELECTOR_ANNOTATION, json.dumps(current)),
            ]
            kube_calls.patch_if_unchanged(self._core.patch_namespaced_service, service, operations)
            return current

        previous, _ = kube_calls.retry_on_conflict(point_at_target)
        activity.logger.info("Service %s/%s now selects %s (was %s)", ref.namespace, name, target_selector, previous)
        switched = self._wait_for_endpoints(ref, name, input.target_stateful_set, require_ready=True)
        return SwitchTrafficResult(previous_selector=previous, endpoints=list(switched.names))

    @activity.defn(name=KubeActivity.UNDO_SWITCH_TRAFFIC.value)
    def undo_switch_traffic(self, input: UndoSwitchTrafficInput) -> None:
        """Puts the stable Service's previous selector back and waits until its endpoints are the source's Pods.

        Idempotent: the selector is set to the recorded value (a no-op the second time)
        and the annotation is removed only while present.
        """
        ref, name = input.ref, input.service

        def point_at_source() -> None:
            service = kube_calls.read_json_or_none(self._core.read_namespaced_service, name, ref.namespace)
            if service is None:
                activity.logger.warning(
                    "Service %s/%s is gone: there is no traffic to switch back", ref.namespace, name
                )
                return
            operations = []
            if (service["spec"].get("selector") or {}) != input.previous_selector:
                operations.append(kube_calls.set_value("/spec/selector", input.previous_selector))
            if PREVIOUS_SELECTOR_ANNOTATION in kube_calls.annotations_of(service):
                operations.append(kube_calls.remove_annotation(PREVIOUS_SELECTOR_ANNOTATION))
            if operations:
                kube_calls.patch_if_unchanged(self._core.patch_namespaced_service, service, operations)

        kube_calls.retry_on_conflict(point_at_source)
        source = kube_calls.read_or_none(
            self._apps.read_namespaced_stateful_set, input.source_stateful_set, ref.namespace
        )
        # A source scaled to zero has no Pods to wait for: then it is enough that the target's are off the list.
        source_serves = source is not None and (source.spec.replicas is None or source.spec.replicas > 0)
        self._wait_for_endpoints(ref, name, input.source_stateful_set, require_ready=source_serves)
        activity.logger.info("Service %s/%s selects %s again", ref.namespace, name, input.previous_selector)

    # --- scale-down-old ----------------------------------------------------------------------

    @activity.defn(name=KubeActivity.SCALE_DOWN_OLD.value)
    def scale_down_old(self, input: ScaleDownOldInput) -> ScaleDownOldResult:
        """Scales the source StatefulSet to zero and waits until its Pods are gone.

        Idempotent: the replica count before the first scale-down is stored in the
        annotation ferry.dev/previous-replicas, in the same write that sets replicas to 0;
        a retry finds 0 replicas with that annotation and returns the stored count, not 0.
        An annotation next to other replicas is left over from before, and is overwritten.
        """
        ref, name = input.ref, input.stateful_set

        def scale_to_zero() -> int:
            source = self._read_named_in_spec(
                self._apps.read_namespaced_stateful_set, name, ref, "spec.source.statefulSet"
            )
            recorded = kube_calls.annotations_of(source).get(PREVIOUS_REPLICAS_ANNOTATION)
            current: int = source["spec"].get("replicas", 1)
            if current == 0 and recorded is not None:
                return int(recorded)
            operations = [
                kube_calls.set_annotation(source, PREVIOUS_REPLICAS_ANNOTATION, str(current)),
                kube_calls.set_value("/spec/replicas", 0),
            ]
            kube_calls.patch_if_unchanged(self._apps.patch_namespaced_stateful_set, source, operations)
            return current

        previous, _ = kube_calls.retry_on_conflict(scale_to_zero)
        activity.logger.info("scaling StatefulSet %s/%s from %d to 0", ref.namespace, name, previous)

        def scaled_away() -> Progress:
            stateful_set = self._apps.read_namespaced_stateful_set(name, ref.namespace)
            return checks.stateful_set_scaled_away(stateful_set, self._pods_of(stateful_set))

        self._wait(scaled_away)
        return ScaleDownOldResult(previous_replicas=previous)

    @activity.defn(name=KubeActivity.UNDO_SCALE_DOWN_OLD.value)
    def undo_scale_down_old(self, input: UndoScaleDownOldInput) -> None:
        """Scales the source StatefulSet back to its previous replicas and waits until they are Ready.

        Idempotent: replicas are set to the given count (a no-op the second time), and the
        ferry.dev/previous-replicas annotation is removed only after the source is Ready
        again, so a retry after a crash in between still finds the original count.
        """
        ref, name = input.ref, input.stateful_set

        def scale_back() -> None:
            source = self._read_named_in_spec(
                self._apps.read_namespaced_stateful_set, name, ref, "spec.source.statefulSet"
            )
            if source["spec"].get("replicas") != input.replicas:
                operation = kube_calls.set_value("/spec/replicas", input.replicas)
                kube_calls.patch_if_unchanged(self._apps.patch_namespaced_stateful_set, source, [operation])

        kube_calls.retry_on_conflict(scale_back)
        self._wait(
            lambda: checks.stateful_set_ready(
                self._apps.read_namespaced_stateful_set(name, ref.namespace), all_updated=False
            )
        )

        def forget_previous_replicas() -> None:
            source = kube_calls.read_json(self._apps.read_namespaced_stateful_set, name, ref.namespace)
            if PREVIOUS_REPLICAS_ANNOTATION in kube_calls.annotations_of(source):
                operation = kube_calls.remove_annotation(PREVIOUS_REPLICAS_ANNOTATION)
                kube_calls.patch_if_unchanged(self._apps.patch_namespaced_stateful_set, source, [operation])

        kube_calls.retry_on_conflict(forget_previous_replicas)
        activity.logger.info("StatefulSet %s/%s is back at %d Ready replicas", ref.namespace, name, input.replicas)

    # --- helpers -----------------------------------------------------------------------------

    def _wait(self, check: Callable[[], Progress]) -> Progress:
        return wait_for(check, self._settings.poll_interval)

    def _read_named_in_spec(self, read: Callable[..., Any], name: str, ref: MigrationRef, field: str) -> dict[str, Any]:
        """Reads an object the Migration names; its absence is a spec error that retrying cannot fix."""
        found = kube_calls.read_json_or_none(read, name, ref.namespace)
        if found is None:
            raise InvalidSpec(
                f"{field}: {name!r} does not exist in namespace {ref.namespace}. Create it, or delete Migration {ref} "
                f"and create it again with the right {field} (the plan cannot change after creation)."
            )
        return found

    def _refuse_foreign(self, ref: MigrationRef, kind: str, read: Callable[..., Any], name: str) -> None:
        existing = kube_calls.read_json_or_none(read, name, ref.namespace)
        if existing is not None and not kube_objects.belongs_to(existing, ref.name):
            owner = (existing["metadata"].get("labels") or {}).get(MIGRATION_LABEL)
            made_by = f"for Migration {owner!r}" if owner else "by someone else"
            raise InvalidSpec(
                f"spec.target.statefulSet: {kind} {ref.namespace}/{name} already exists and was created {made_by}, "
                f"not by ferry for Migration {ref.name!r}; ferry does not take over objects. Delete Migration {ref} "
                "and create it again with another spec.target.statefulSet, or remove that object if it is left over."
            )

    def _pods_of(self, stateful_set: Any) -> list[Any]:
        """The Pods a StatefulSet controls, terminating ones included."""
        selector = kube_objects.label_selector(stateful_set.spec.selector.match_labels or {})
        pods = self._core.list_namespaced_pod(stateful_set.metadata.namespace, label_selector=selector).items
        uid = stateful_set.metadata.uid
        return [pod for pod in pods if any(owner.uid == uid for owner in pod.metadata.owner_references or [])]

    def _wait_for_endpoints(
        self, ref: MigrationRef, service: str, stateful_set: str, *, require_ready: bool
    ) -> Progress:
        def listed() -> Progress:
            slices = self._discovery.list_namespaced_endpoint_slice(
                ref.namespace, label_selector=f"kubernetes.io/service-name={service}"
            ).items
            return checks.endpoints_only_of(slices, stateful_set, service=service, require_ready=require_ready)

        return self._wait(listed)
