"""switch-traffic and its undo: the stable Service's selector, pointed at the target and back, recording who did it.

The stable Service is not ferry's: it changes only through writes conditional on the
resourceVersion they were computed from. The selector from before the switch is
recorded on the Service with the switching Migration's uid, in the same write that
changes the selector (records.py), so a retry and an undo without the step's result
both know what to restore, and an undo acts only on its own Migration's switch. The
Service is never left selecting nothing. Every write also carries the writing
activity's fence (fences.py), and the undo writes it even when it has nothing to put
back, so a late attempt of the switch, going on after the rollback, changes nothing.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import fences, kube_calls, records
from activities.api_refusals import explain_refusals
from activities.cluster_api import ClusterApi
from activities.ownership import belongs_to, labels_of, owner
from ferry.api.errors import InvalidSpec
from ferry.api.migration import MIGRATION_LABEL, MIGRATION_UID_LABEL, STATEFULSET_LABEL
from ferry.api.saga import (
    KubeActivity,
    MigrationRef,
    SwitchTrafficInput,
    SwitchTrafficResult,
    UndoSwitchTrafficInput,
)

SOURCE_SCALED_DOWN = "SourceScaledDown"
"""The undo of switch-traffic would send the clients to a source this Migration scaled to zero: tried again."""


class TrafficSwitching(ClusterApi):
    """switch_traffic and undo_switch_traffic."""

    @activity.defn(name=KubeActivity.SWITCH_TRAFFIC.value)
    @explain_refusals
    def switch_traffic(self, input: SwitchTrafficInput) -> SwitchTrafficResult:
        """Points the stable Service's selector at the target's Pods and waits until only they are its endpoints.

        Refuses (InvalidSpec, changing nothing) a target StatefulSet that is not this
        Migration's, a Service already switched by another Migration, and a Service that
        no longer selects the source's Pods (`_refuse_traffic_elsewhere`). The selector
        from before is recorded in the annotation ferry.dev/previous-selector as
        `{"migration": <uid>, "selector": {...}}`, in the same write that changes the
        selector. Idempotent: a retry finds the target's selector with this Migration's
        record and returns the recorded selector, never the target's. A record next to
        any other selector is left over from an earlier migration, and is overwritten.
        Refuses (Overtaken, changing nothing) a Service fenced by a later action of this
        Migration (fences.py): this is then a late attempt, and its undo has run.
        """
        ref, name, target = input.ref, input.service, input.target_stateful_set
        target_selector = {STATEFULSET_LABEL: target}
        self._require_own_target(ref, target)
        source_name = self._source_of(ref)

        def point_at_target() -> dict[str, str]:
            service = self._read_named_in_spec(self._core.read_namespaced_service, name, ref, "spec.source.service")
            fences.refuse_if_overtaken(service, ref, "point the Service at the target")
            record = records.selector_record(kube_calls.annotations_of(service))
            current: dict[str, str] = service["spec"].get("selector") or {}
            if current == target_selector:
                return self._already_switched(ref, name, record, current)
            if not current:
                raise InvalidSpec(
                    f"spec.source.service: Service {ref.namespace}/{name} has no selector, so switching it and back "
                    "would leave it selecting nothing; ferry changed nothing. Give it its selector back."
                )
            self._refuse_traffic_elsewhere(ref, name, source_name, current, record)
            operations = [
                kube_calls.set_value("/spec/selector", target_selector),
                fences.fenced_annotations(
                    service,
                    ref,
                    "point the Service at the target",
                    {records.PREVIOUS_SELECTOR_ANNOTATION: records.encode_selector(ref, current)},
                ),
            ]
            kube_calls.patch_if_unchanged(self._core.patch_namespaced_service, service, operations)
            return current

        previous, _ = kube_calls.retry_on_conflict(point_at_target)
        activity.logger.info("Service %s/%s now selects %s (was %s)", ref.namespace, name, target_selector, previous)
        switched = self._wait_for_endpoints(ref, name, target, require_ready=True)
        return SwitchTrafficResult(previous_selector=previous, endpoints=list(switched.names))

    @activity.defn(name=KubeActivity.UNDO_SWITCH_TRAFFIC.value)
    @explain_refusals
    def undo_switch_traffic(self, input: UndoSwitchTrafficInput) -> None:
        """Puts the stable Service's selector from before this Migration's switch back, and waits for the source's Pods.

        The wait ends once the EndpointSlices list the source's Pods (Ready) and, besides
        them, only Pods the restored selector matches that are not this Migration's (an
        exporter or a pooler labelled like the database, listed before the switch too).

        With previous_selector None, the selector comes from the Service's record, and
        only a record of this Migration's uid counts: with no record, or another
        Migration's, the switch never happened or is not this Migration's, and nothing
        changes. An explicit previous_selector (runs from before the record had a uid)
        is restored unless the record names another Migration. A selector that would
        select nothing is never set. Idempotent: the selector is set only when it
        differs, and the record is removed only after the endpoints are back, so a
        retry after a crash in between still finds it. Its fence goes on the Service
        even when nothing changes (unless another Migration's record is there), so a late
        switch of this Migration is refused; a late attempt of this undo is refused the same way.
        """
        ref, name = input.ref, input.service
        restored, _ = kube_calls.retry_on_conflict(lambda: self._point_back(input))
        if restored is None:
            return
        source = kube_calls.read_or_none(
            self._apps.read_namespaced_stateful_set, input.source_stateful_set, ref.namespace
        )
        # A source scaled to zero has no Pods to wait for: then it is enough that the target's are off the list.
        source_serves = source is not None and (source.spec.replicas is None or source.spec.replicas > 0)
        # Other Pods the restored selector matches (an exporter, a pooler) were listed before the switch too.
        self._wait_for_endpoints(ref, name, input.source_stateful_set, require_ready=source_serves, selector=restored)
        kube_calls.retry_on_conflict(lambda: self._forget_selector_record(ref, name))
        activity.logger.info("Service %s/%s selects %s again", ref.namespace, name, restored)

    # --- helpers -----------------------------------------------------------------------------

    def _require_own_target(self, ref: MigrationRef, target: str) -> None:
        """Clients are sent only to Pods of a StatefulSet that this Migration provisioned."""
        found = self._read_named_in_spec(
            self._apps.read_namespaced_stateful_set, target, ref, "spec.target.statefulSet"
        )
        if belongs_to(found, ref):
            return
        labels = labels_of(found)
        if MIGRATION_UID_LABEL not in labels and labels.get(MIGRATION_LABEL) == ref.name:
            activity.logger.warning(
                "StatefulSet %s/%s has only the name label of Migration %s: an older ferry provisioned it for this "
                "run; switching to it",
                ref.namespace, target, ref,
            )  # fmt: skip
            return
        raise InvalidSpec(
            f"spec.target.statefulSet: StatefulSet {ref.namespace}/{target} belongs to {owner(found)}, not to "
            f"Migration {ref} (uid {ref.uid}); ferry sends no traffic to it and changed nothing."
        )

    def _refuse_traffic_elsewhere(
        self,
        ref: MigrationRef,
        name: str,
        source_name: str | None,
        current: dict[str, str],
        record: records.Record[dict[str, str]] | None,
    ) -> None:
        """Refuses to switch a Service that no longer sends its traffic to the source.

        The precheck found the Service selecting the source's Pods; since then another
        Migration may have switched it to its own target, or a person pointed it elsewhere.
        Switching it now would move clients of another database to this Migration's copy
        (and overwrite the other Migration's record, leaving its undo nothing to restore).
        With the Migration gone (the gate refuses its activities anyway) or its source gone,
        there is nothing to compare with.
        """
        if source_name is None:
            return
        source = kube_calls.read_json_or_none(self._apps.read_namespaced_stateful_set, source_name, ref.namespace)
        if source is None or self._selects_source(ref.namespace, current, source):
            return
        switched_by = records.switched_by(record) if record is not None and record.is_of_another(ref) else ""
        raise InvalidSpec(
            f"spec.source.service: Service {ref.namespace}/{name} no longer sends its traffic to StatefulSet "
            f"{source_name}: its selector is {current}{switched_by}, which selects none of its Pods. ferry changed "
            "nothing: switching it would move the clients of whatever it selects now to this Migration's target."
        )

    def _already_switched(
        self, ref: MigrationRef, name: str, record: records.Record[dict[str, str]] | None, current: dict[str, str]
    ) -> dict[str, str]:
        """The selector from before, for a Service that already selects the target."""
        if record is not None and record.is_of_another(ref):
            raise InvalidSpec(
                f"spec.target.statefulSet: Service {ref.namespace}/{name} was switched to the target by the "
                f"Migration with uid {record.migration}, not by Migration {ref} (uid {ref.uid}); ferry changed nothing."
            )
        if record is not None:
            return record.value  # this Migration's switch (or an older ferry's for this run), retried
        activity.logger.warning(
            "Service %s/%s already selected the target, with no record of its selector before; "
            "undoing this switch will leave it on the target",
            ref.namespace, name,
        )  # fmt: skip
        return current

    def _point_back(self, input: UndoSwitchTrafficInput) -> dict[str, str] | None:
        """Sets the selector to restore; returns it, or None when there is nothing of this Migration's to undo."""
        ref, name = input.ref, input.service
        service = kube_calls.read_json_or_none(self._core.read_namespaced_service, name, ref.namespace)
        if service is None:
            activity.logger.warning("Service %s/%s is gone: there is no traffic to switch back", ref.namespace, name)
            return None
        record = records.selector_record(kube_calls.annotations_of(service))
        wanted = self._selector_to_restore(ref, name, input.previous_selector, record)
        changes = wanted is not None and (service["spec"].get("selector") or {}) != wanted
        if changes:
            self._refuse_scaled_down_source(ref, name, input.source_stateful_set)
        # The fence goes on even when nothing changes, for a late switch of this Migration to find; not on a Service
        # another Migration switched, which stays exactly as it is (and which this Migration's switch refuses).
        foreign = record is not None and record.is_of_another(ref)
        if changes or not (foreign or fences.is_fenced(service, ref)):
            operations = [fences.fenced_annotations(service, ref, "point the Service back")]
            if changes:
                operations.insert(0, kube_calls.set_value("/spec/selector", wanted))
            kube_calls.patch_if_unchanged(self._core.patch_namespaced_service, service, operations)
        return wanted

    def _refuse_scaled_down_source(self, ref: MigrationRef, name: str, source_name: str) -> None:
        """Fails (retryably) while the source is at zero replicas by this Migration's scale-down-old: its undo has not
        scaled it back (a run reset to before switch-traffic rolls back without knowing it scaled down; an undo of
        scale-down-old that failed may be gone past), and clients sent back would reach no Pod, while the target
        serves them. A source at zero by someone else's hand is left to them: the Service goes back as it was (in a
        rollback, only once the check before this undo, which reaches the source's database, has passed)."""
        source = kube_calls.read_json_or_none(self._apps.read_namespaced_stateful_set, source_name, ref.namespace)
        if source is None or source["spec"].get("replicas", 1) > 0:
            return
        record = records.replicas_record(kube_calls.annotations_of(source))
        if record is None or not record.is_of(ref):
            return
        raise ApplicationError(
            f"not pointing Service {ref.namespace}/{name} back at StatefulSet {source_name}: this Migration's "
            f"scale-down-old scaled it to 0 (from {record.value}, in its annotation "
            f"{records.PREVIOUS_REPLICAS_ANNOTATION}) and nothing scaled it back, so the clients would reach no Pod "
            f"while the target serves them. Scale it back first (kubectl scale statefulset -n {ref.namespace} "
            f"{source_name} --replicas={record.value}); this undo is retried.",
            type=SOURCE_SCALED_DOWN,
        )

    def _selector_to_restore(
        self,
        ref: MigrationRef,
        name: str,
        given: dict[str, str] | None,
        record: records.Record[dict[str, str]] | None,
    ) -> dict[str, str] | None:
        where = f"Service {ref.namespace}/{name}"
        if record is not None and record.is_of_another(ref):
            activity.logger.warning(
                "leaving %s as it is: the Migration with uid %s switched it, not %s", where, record.migration, ref
            )
            return None
        if given is None:
            if record is None or not record.is_of(ref):
                activity.logger.info("%s has no record of a switch by Migration %s: nothing to undo", where, ref)
                return None
            given = record.value
        if not given:
            activity.logger.warning("leaving %s as it is: restoring an empty selector would select nothing", where)
            return None
        return given

    def _forget_selector_record(self, ref: MigrationRef, name: str) -> None:
        service: Any = kube_calls.read_json_or_none(self._core.read_namespaced_service, name, ref.namespace)
        if service is None or records.PREVIOUS_SELECTOR_ANNOTATION not in kube_calls.annotations_of(service):
            return
        record = records.selector_record(kube_calls.annotations_of(service))
        if record is not None and record.is_of_another(ref):
            return
        doing = "remove the record of the Service's selector"
        operation = fences.fenced_annotations(service, ref, doing, {records.PREVIOUS_SELECTOR_ANNOTATION: None})
        kube_calls.patch_if_unchanged(self._core.patch_namespaced_service, service, [operation])
