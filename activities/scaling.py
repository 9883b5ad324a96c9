"""scale-down-old and its undo: the source's replicas, to zero and back, with a record of who scaled it down.

The source StatefulSet is not ferry's: it changes only through writes conditional on
the resourceVersion they were computed from. Its replicas from before the scale-down
are recorded on it with the Migration's uid, in the same write that sets zero
(records.py), so a retry and an undo without the step's result both know the count,
and an undo acts only on its own Migration's scale-down. Every write also carries the
writing activity's fence (fences.py), and the undo writes it even when it has nothing
to scale back, so a late attempt of the scale-down, going on after the rollback, changes
nothing.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import checks, fences, kube_calls, records
from activities.api_refusals import explain_refusals
from activities.cluster_api import ClusterApi
from activities.waiting import Progress
from ferry.api.errors import InvalidSpec
from ferry.api.migration import STATEFULSET_LABEL
from ferry.api.saga import (
    KubeActivity,
    MigrationRef,
    ScaleDownOldInput,
    ScaleDownOldResult,
    UndoScaleDownOldInput,
)

TRAFFIC_NOT_ON_TARGET = "TrafficNotOnTarget"
"""The stable Service no longer sends the clients to the target: scaling the source away would leave them nothing."""
TARGET_NOT_SERVING = "TargetNotServing"
"""The stable Service lists no Ready Pod of the target at the moment: tried again."""


def refuse_claims_deleted_when_scaled(source: dict[str, Any], ref: MigrationRef) -> None:
    """Refuses (InvalidSpec) a source StatefulSet whose controller deletes its claims when it is scaled down
    (spec.persistentVolumeClaimRetentionPolicy.whenScaled: Delete): scale-down-old would have the source's volumes
    deleted with its Pods, and a rollback after it would scale back a source with empty volumes, send the clients to
    it, and empty the target, the only copy left. The precheck refuses it, and scale-down-old again before it
    writes, since the policy may change meanwhile."""
    policy = source["spec"].get("persistentVolumeClaimRetentionPolicy") or {}
    if policy.get("whenScaled") != "Delete":
        return
    name = source["metadata"]["name"]
    raise InvalidSpec(
        f"spec.source.statefulSet: StatefulSet {ref.namespace}/{name} deletes its volumes' claims when scaled down "
        "(spec.persistentVolumeClaimRetentionPolicy.whenScaled: Delete), so scale-down-old would delete the "
        "source's data, and a rollback after it would bring the source back empty. ferry changed nothing. Keep them "
        f"while you migrate: kubectl patch statefulset -n {ref.namespace} {name} --type=merge -p "
        '\'{"spec":{"persistentVolumeClaimRetentionPolicy":{"whenScaled":"Retain"}}}\''
    )


class Scaling(ClusterApi):
    """scale_down_old and undo_scale_down_old."""

    @activity.defn(name=KubeActivity.SCALE_DOWN_OLD.value)
    @explain_refusals
    def scale_down_old(self, input: ScaleDownOldInput) -> ScaleDownOldResult:
        """Scales the source StatefulSet to zero and waits until its Pods are gone.

        The replica count before is recorded in the annotation ferry.dev/previous-replicas
        as `{"migration": <uid>, "replicas": N}`, in the same write that sets replicas to
        0. Idempotent: a retry finds 0 replicas with this Migration's record and returns
        the recorded count, not 0. A source already at 0 without such a record was not
        scaled down by this Migration: nothing is recorded and the result is 0, so the
        undo leaves it at 0. A record next to other replicas is left over from before,
        and is overwritten. Refuses (Overtaken, changing nothing) a source fenced by a
        later action of this Migration (fences.py): this is then a late attempt, and its
        undo has run.
        """
        ref, name = input.ref, input.stateful_set

        def scale_to_zero() -> int:
            source = self._read_named_in_spec(
                self._apps.read_namespaced_stateful_set, name, ref, "spec.source.statefulSet"
            )
            fences.refuse_if_overtaken(source, ref, "scale the source to zero")
            record = records.replicas_record(kube_calls.annotations_of(source))
            current: int = source["spec"].get("replicas", 1)
            if current == 0:
                if record is not None and not record.is_of_another(ref):
                    return record.value  # this Migration's scale-down (or an older ferry's for this run), retried
                activity.logger.warning(
                    "StatefulSet %s/%s was already at 0 replicas, not scaled down by Migration %s: "
                    "its undo will leave it at 0",
                    ref.namespace, name, ref,
                )  # fmt: skip
                return 0
            self._refuse_unless_traffic_on_target(input)
            refuse_claims_deleted_when_scaled(source, ref)
            operations = [
                fences.fenced_annotations(
                    source,
                    ref,
                    "scale the source to zero",
                    {records.PREVIOUS_REPLICAS_ANNOTATION: records.encode_replicas(ref, current)},
                ),
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
        # Again once the source's Pods are gone (a wait as long as their grace period), and on a retry that found the
        # source at zero already: a Service healed back to the source meanwhile selects no Pod, and the run would end
        # Succeeded. Failing instead rolls back, and the undo scales the source back, its volumes kept.
        self._refuse_unless_traffic_on_target(input, scaled=True)
        return ScaleDownOldResult(previous_replicas=previous)

    def _refuse_unless_traffic_on_target(self, input: ScaleDownOldInput, *, scaled: bool = False) -> None:
        """Refuses to scale the source away unless the stable Service still sends the clients to the target.

        Nothing else holds the Service where switch-traffic put it: a GitOps controller healing
        it back to the selector in git, or a person, may have pointed it at the source again
        during the soak. Scaling the source to zero then leaves the clients' Service selecting
        no Pod at all, and the run would end Succeeded. So the selector must be the target's,
        switched by this Migration (its record), and the EndpointSlices must list the target's
        Pods, Ready, and no other: a selector not this Migration's fails the step for good
        (TrafficNotOnTarget: a person decides), Pods not Ready yet fail this attempt only.
        """
        ref, name, target = input.ref, input.service, input.target_stateful_set
        if name is None or target is None:
            return  # scheduled by a saga from before the check
        service = self._read_named_in_spec(self._core.read_namespaced_service, name, ref, "spec.source.service")
        selector = service["spec"].get("selector") or {}
        record = records.selector_record(kube_calls.annotations_of(service))
        if selector != {STATEFULSET_LABEL: target} or record is None or record.is_of_another(ref):
            by = ", switched by another Migration" if record is not None and record.is_of_another(ref) else ""
            refused = "scaled" if scaled else "refused to scale"
            raise ApplicationError(
                f"{refused} StatefulSet {ref.namespace}/{input.stateful_set} to zero: Service "
                f"{ref.namespace}/{name} no longer sends the clients to the target {target} as switch-traffic left it "
                f"(its selector is {selector}{by}). Something changed it back (a GitOps controller healing it to the "
                "selector in git, a person); "
                + (
                    "the source was scaled to zero meanwhile, so they reach no Pod now. Roll back (the undo scales "
                    "the source back), or point the Service at the target again and retry"
                    if scaled
                    else "the source still serves them, and ferry changed nothing. Point the Service at the target "
                    "again and retry, or roll back"
                ),
                type=TRAFFIC_NOT_ON_TARGET,
                non_retryable=True,
            )
        slices = self._discovery.list_namespaced_endpoint_slice(
            ref.namespace, label_selector=f"kubernetes.io/service-name={name}"
        ).items
        serving = checks.endpoints_only_of(slices, target, service=name, require_ready=True)
        if not serving.done:
            doing = "scaled" if scaled else "not scaling"
            kept = "" if scaled else "; the source keeps its replicas"
            raise ApplicationError(
                f"{doing} StatefulSet {ref.namespace}/{input.stateful_set} to zero{'' if scaled else ' yet'}: Service "
                f"{ref.namespace}/{name} lists no Ready Pod of the target {target} (it is waiting for "
                f"{serving.waiting_for}){kept}, and the step is tried again",
                type=TARGET_NOT_SERVING,
            )

    @activity.defn(name=KubeActivity.UNDO_SCALE_DOWN_OLD.value)
    @explain_refusals
    def undo_scale_down_old(self, input: UndoScaleDownOldInput) -> None:
        """Scales the source StatefulSet back to its replicas from before this Migration's scale-down, until Ready.

        With replicas None, the count comes from the StatefulSet's record, and only a
        record of this Migration's uid counts: with no record, or another Migration's,
        the scale-down never happened or is not this Migration's, and nothing changes.
        An explicit count (runs from before the record had a uid) is restored unless
        the record names another Migration. Idempotent: replicas are set only when they
        differ, and the record is removed only after the source is Ready again, so a
        retry after a crash in between still finds it. Its fence goes on the source even
        when nothing changes (unless another Migration's record is there), so a late
        scale-down of this Migration is refused; a late attempt of this undo is refused the same way.
        """
        ref, name = input.ref, input.stateful_set
        wanted, _ = kube_calls.retry_on_conflict(lambda: self._scale_back(input))
        if wanted is None:
            return
        self._wait(
            lambda: checks.stateful_set_ready(
                self._apps.read_namespaced_stateful_set(name, ref.namespace), all_updated=False
            )
        )
        kube_calls.retry_on_conflict(lambda: self._forget_replicas_record(ref, name))
        activity.logger.info("StatefulSet %s/%s is back at %d Ready replicas", ref.namespace, name, wanted)

    def _scale_back(self, input: UndoScaleDownOldInput) -> int | None:
        """Sets the replicas to restore; returns them, or None when there is nothing of this Migration's to undo."""
        ref, name = input.ref, input.stateful_set
        if input.replicas is None:
            source = kube_calls.read_json_or_none(self._apps.read_namespaced_stateful_set, name, ref.namespace)
            if source is None:
                activity.logger.warning("StatefulSet %s/%s is gone: nothing to scale back", ref.namespace, name)
                return None
        else:
            source = self._read_named_in_spec(
                self._apps.read_namespaced_stateful_set, name, ref, "spec.source.statefulSet"
            )
        record = records.replicas_record(kube_calls.annotations_of(source))
        wanted = self._replicas_to_restore(ref, name, input.replicas, record)
        changes = wanted is not None and source["spec"].get("replicas") != wanted
        # The fence goes on even when nothing changes, for a late scale-down of this Migration to find; not on a
        # source another Migration scaled down, which stays exactly as it is (and which this Migration's scale-down
        # leaves at zero).
        foreign = record is not None and record.is_of_another(ref)
        if changes or not (foreign or fences.is_fenced(source, ref)):
            operations = [fences.fenced_annotations(source, ref, "scale the source back")]
            if changes:
                operations.append(kube_calls.set_value("/spec/replicas", wanted))
            kube_calls.patch_if_unchanged(self._apps.patch_namespaced_stateful_set, source, operations)
        return wanted

    def _replicas_to_restore(
        self, ref: MigrationRef, name: str, given: int | None, record: records.Record[int] | None
    ) -> int | None:
        where = f"StatefulSet {ref.namespace}/{name}"
        if record is not None and record.is_of_another(ref):
            activity.logger.warning(
                "leaving %s as it is: the Migration with uid %s scaled it down, not %s", where, record.migration, ref
            )
            return None
        if given is not None:
            return given
        if record is None or not record.is_of(ref):
            activity.logger.info("%s has no record of a scale-down by Migration %s: nothing to undo", where, ref)
            return None
        return record.value

    def _forget_replicas_record(self, ref: MigrationRef, name: str) -> None:
        source = kube_calls.read_json_or_none(self._apps.read_namespaced_stateful_set, name, ref.namespace)
        if source is None or records.PREVIOUS_REPLICAS_ANNOTATION not in kube_calls.annotations_of(source):
            return
        record = records.replicas_record(kube_calls.annotations_of(source))
        if record is not None and record.is_of_another(ref):
            return
        doing = "remove the record of the source's replicas"
        operation = fences.fenced_annotations(source, ref, doing, {records.PREVIOUS_REPLICAS_ANNOTATION: None})
        kube_calls.patch_if_unchanged(self._apps.patch_namespaced_stateful_set, source, [operation])
