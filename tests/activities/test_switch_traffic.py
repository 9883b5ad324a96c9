"""switch_traffic sends the stable Service's traffic to the target's Pods; undo_switch_traffic sends it back.

The undo may run with no result of the step (previous_selector None): it then restores
only what its own Migration's switch recorded on the Service, and changes nothing when
the switch never happened, or was another Migration's.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid

import pytest
from kubernetes import client as k8s
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import ActivityEnvironment

from activities import records
from activities.cluster import ClusterActivities
from ferry.api.errors import InvalidSpec
from ferry.api.migration import STATEFULSET_LABEL, MigrationSpec
from ferry.api.saga import (
    MigrationRef,
    ProvisionInput,
    ProvisionResult,
    ScaleDownOldInput,
    SwitchTrafficInput,
    UndoScaleDownOldInput,
    UndoSwitchTrafficInput,
)
from tests import samples
from tests.activities.cluster_state import stable_service
from tests.activities.conftest import TARGET, TARGET_PODS
from tests.cluster import SOURCE, SOURCE_PODS, endpoint_pods, eventually
from tests.conftest import Kubectl
from tests.end_to_end import apply_migration

ORIGINAL_SELECTOR = {"app": SOURCE}
EXPORTER = f"{SOURCE}-exporter"
UNDO_DEADLINE = 30.0
"""Seconds after which a test stops an undo that would otherwise wait for ever (it takes a few)."""
TARGET_SELECTOR = {STATEFULSET_LABEL: TARGET}
RECORD = "ferry.dev/previous-selector"
FENCE = "ferry.dev/fence"


def _switch(ref: MigrationRef) -> SwitchTrafficInput:
    return SwitchTrafficInput(ref=ref, service=SOURCE, target_stateful_set=TARGET)


def _undo(ref: MigrationRef, previous_selector: dict[str, str] | None = None) -> UndoSwitchTrafficInput:
    return UndoSwitchTrafficInput(
        ref=ref, service=SOURCE, previous_selector=previous_selector, source_stateful_set=SOURCE
    )


def _serves_the_source_again(kube_api: k8s.ApiClient, namespace: str) -> None:
    service = stable_service(kube_api, namespace)
    assert service.spec.selector == ORIGINAL_SELECTOR
    assert RECORD not in (service.metadata.annotations or {})
    eventually(
        "the stable Service to list the source's Pods",
        lambda: endpoint_pods(kube_api, namespace, SOURCE) == SOURCE_PODS,
    )


def _exporter_labelled_like_the_source(kube_api: k8s.ApiClient, namespace: str) -> list[str]:
    """A Deployment whose Pods the stable Service's selector matches too (a metrics exporter); its Pods' names."""
    labels = {**ORIGINAL_SELECTOR, "component": "exporter"}
    container = k8s.V1Container(
        name="exporter", image="postgres-exporter:0.15", ports=[k8s.V1ContainerPort(container_port=9187)]
    )
    deployment = k8s.V1Deployment(
        metadata=k8s.V1ObjectMeta(name=EXPORTER),
        spec=k8s.V1DeploymentSpec(
            replicas=1,
            selector=k8s.V1LabelSelector(match_labels=labels),
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels=labels), spec=k8s.V1PodSpec(containers=[container])
            ),
        ),
    )
    k8s.AppsV1Api(kube_api).create_namespaced_deployment(namespace, deployment)
    listed: list[str] = []

    def listed_beside_the_source() -> bool:
        listed[:] = [pod for pod in endpoint_pods(kube_api, namespace, SOURCE) if pod.startswith(f"{EXPORTER}-")]
        return len(listed) == 1

    eventually("the stable Service to list the exporter's Pod", listed_beside_the_source)
    return listed


def _serves_the_target(kube_api: k8s.ApiClient, namespace: str) -> None:
    assert stable_service(kube_api, namespace).spec.selector == TARGET_SELECTOR
    eventually(
        "the stable Service to list the target's Pods",
        lambda: endpoint_pods(kube_api, namespace, SOURCE) == TARGET_PODS,
    )


def test_switch_traffic_lists_only_target_pods_and_records_the_selector_before_with_its_migration(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    switched = activity_env.run(cluster.switch_traffic, _switch(ref))

    assert switched.previous_selector == ORIGINAL_SELECTOR
    assert switched.endpoints, "it waited for the target's Pods"
    assert set(switched.endpoints) <= set(TARGET_PODS), "and for no other Pods"
    _serves_the_target(kube_api, ref.namespace)
    record = json.loads(stable_service(kube_api, ref.namespace).metadata.annotations[RECORD])
    assert record == {"migration": ref.uid, "selector": ORIGINAL_SELECTOR}


def test_undo_switch_traffic_with_the_steps_result_lists_the_source_pods_again(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    switched = activity_env.run(cluster.switch_traffic, _switch(ref))

    activity_env.run(cluster.undo_switch_traffic, _undo(ref, switched.previous_selector))

    _serves_the_source_again(kube_api, ref.namespace)


def test_undo_switch_traffic_without_the_steps_result_restores_what_its_own_switch_recorded(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    activity_env.run(cluster.switch_traffic, _switch(ref))

    activity_env.run(cluster.undo_switch_traffic, _undo(ref))

    _serves_the_source_again(kube_api, ref.namespace)


def test_undo_switch_traffic_after_switch_traffic_was_cancelled_while_waiting_points_back(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    activity_env.cancel()
    # Cancelled before it starts, it switches, then stops at its first look at the endpoints, unless
    # they are already there: either way the selector was switched and its outcome is not to be trusted.
    with contextlib.suppress(CancelledError):
        activity_env.run(cluster.switch_traffic, _switch(ref))
    assert stable_service(kube_api, ref.namespace).spec.selector == TARGET_SELECTOR, "it switched, then was stopped"

    ActivityEnvironment().run(cluster.undo_switch_traffic, _undo(ref))

    _serves_the_source_again(kube_api, ref.namespace)


def test_undo_switch_traffic_when_switch_traffic_never_ran_changes_nothing_but_leaves_its_fence(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    before = stable_service(kube_api, ref.namespace)

    activity_env.run(cluster.undo_switch_traffic, _undo(ref))

    after = stable_service(kube_api, ref.namespace)
    assert after.spec.selector == before.spec.selector == ORIGINAL_SELECTOR
    annotations = dict(after.metadata.annotations)
    fence = json.loads(annotations.pop(FENCE))
    assert annotations == (before.metadata.annotations or {})
    assert fence == {ref.uid: activity_env.info.scheduled_time.isoformat()}, "for a late switch to find"
    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == SOURCE_PODS


def test_switch_traffic_and_its_undo_can_each_run_twice(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    first = activity_env.run(cluster.switch_traffic, _switch(ref))
    second = activity_env.run(cluster.switch_traffic, _switch(ref))

    assert first.previous_selector == second.previous_selector == ORIGINAL_SELECTOR
    assert second.endpoints
    assert set(second.endpoints) <= set(TARGET_PODS)

    activity_env.run(cluster.undo_switch_traffic, _undo(ref))
    version = stable_service(kube_api, ref.namespace).metadata.resource_version
    activity_env.run(cluster.undo_switch_traffic, _undo(ref))
    activity_env.run(cluster.undo_switch_traffic, _undo(ref, ORIGINAL_SELECTOR))

    _serves_the_source_again(kube_api, ref.namespace)
    assert stable_service(kube_api, ref.namespace).metadata.resource_version == version, "nothing left to change"


def test_undo_switch_traffic_of_another_migration_with_the_same_name_changes_nothing(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    activity_env.run(cluster.switch_traffic, _switch(ref))
    version = stable_service(kube_api, ref.namespace).metadata.resource_version
    applied_again = MigrationRef(namespace=ref.namespace, name=ref.name, uid=str(uuid.uuid4()))

    activity_env.run(cluster.undo_switch_traffic, _undo(applied_again))
    activity_env.run(cluster.undo_switch_traffic, _undo(applied_again, ORIGINAL_SELECTOR))

    assert stable_service(kube_api, ref.namespace).metadata.resource_version == version
    _serves_the_target(kube_api, ref.namespace)


def test_switch_traffic_refuses_a_target_its_migration_did_not_provision(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    applied_again = MigrationRef(namespace=ref.namespace, name=ref.name, uid=str(uuid.uuid4()))

    with pytest.raises(InvalidSpec, match=r"belongs to another Migration, 'orders-db-to-16'"):
        activity_env.run(cluster.switch_traffic, _switch(applied_again))

    assert stable_service(kube_api, ref.namespace).spec.selector == ORIGINAL_SELECTOR


def test_switch_traffic_refuses_a_service_another_migration_switched_to_its_own_target_since_the_precheck(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    namespace: str,
    spec: MigrationSpec,
    source: str,
    migration_crd: str,
    kubectl: Kubectl,
) -> None:
    """Its clients are another database's now: moving them to this Migration's copy would hide their writes."""
    ref = apply_migration(kubectl, namespace, samples.migration())
    activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))
    other = MigrationRef(namespace=namespace, name="billing-db-to-16", uid=str(uuid.uuid4()))
    theirs = {STATEFULSET_LABEL: "billing-db-16"}
    switched_by_the_other = {
        "metadata": {"annotations": {RECORD: records.encode_selector(other, {"app": "billing-db"})}},
        "spec": {"selector": {"app": None, **theirs}},
    }
    k8s.CoreV1Api(kube_api).patch_namespaced_service(SOURCE, namespace, switched_by_the_other)

    with pytest.raises(InvalidSpec) as refused:
        activity_env.run(cluster.switch_traffic, _switch(ref))

    assert f"Service {namespace}/{SOURCE} no longer sends its traffic to StatefulSet {SOURCE}" in str(refused.value)
    assert f"switched by the Migration with uid {other.uid}" in str(refused.value)
    service = stable_service(kube_api, namespace)
    assert service.spec.selector == theirs, "left as the other Migration switched it"
    assert json.loads(service.metadata.annotations[RECORD])["migration"] == other.uid, "its undo still finds it"


def test_the_precheck_refuses_a_stable_service_that_does_not_select_the_sources_pods(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    core = k8s.CoreV1Api(kube_api)
    core.patch_namespaced_service(SOURCE, ref.namespace, {"spec": {"selector": {"app": "billing-db"}}})

    with pytest.raises(InvalidSpec, match=r"spec\.source\.service: Service .* does not send its traffic to Stat"):
        activity_env.run(cluster.check_cluster, ProvisionInput(ref=ref, spec=spec))

    # One of the source's Pods by its name (its primary, say) is the source's traffic too.
    one_pod = {"spec": {"selector": {"app": None, "statefulset.kubernetes.io/pod-name": f"{SOURCE}-0"}}}
    core.patch_namespaced_service(SOURCE, ref.namespace, one_pod)
    activity_env.run(cluster.check_cluster, ProvisionInput(ref=ref, spec=spec))


def test_switch_traffic_and_its_undo_understand_the_record_of_an_older_ferry(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    # What an older ferry's switch wrote: the selector before, as bare JSON, with no uid.
    older = {
        "spec": {"selector": {"app": None, **TARGET_SELECTOR}},  # a merge patch: None removes a key
        "metadata": {"annotations": {RECORD: json.dumps(ORIGINAL_SELECTOR)}},
    }
    k8s.CoreV1Api(kube_api).patch_namespaced_service(SOURCE, ref.namespace, older)

    retried = activity_env.run(cluster.switch_traffic, _switch(ref))
    assert retried.previous_selector == ORIGINAL_SELECTOR, "a retry of that run returns the selector before"

    activity_env.run(cluster.undo_switch_traffic, _undo(ref))
    assert stable_service(kube_api, ref.namespace).spec.selector == TARGET_SELECTOR, "no uid: not provably its own"

    activity_env.run(cluster.undo_switch_traffic, _undo(ref, retried.previous_selector))
    _serves_the_source_again(kube_api, ref.namespace)


def test_undo_switch_traffic_never_leaves_the_service_selecting_nothing(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    activity_env.run(cluster.switch_traffic, _switch(ref))

    activity_env.run(cluster.undo_switch_traffic, _undo(ref, {}))

    _serves_the_target(kube_api, ref.namespace)


def test_undo_switch_traffic_to_a_source_scaled_to_zero_by_hand_only_waits_for_the_target_to_leave(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    activity_env.run(cluster.switch_traffic, _switch(ref))
    k8s.AppsV1Api(kube_api).patch_namespaced_stateful_set_scale(SOURCE, ref.namespace, {"spec": {"replicas": 0}})
    pods = k8s.CoreV1Api(kube_api).list_namespaced_pod
    eventually(
        "the source's Pods to go", lambda: not [p for p in pods(ref.namespace).items if p.metadata.name in SOURCE_PODS]
    )

    activity_env.run(cluster.undo_switch_traffic, _undo(ref))

    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == []
    assert stable_service(kube_api, ref.namespace).spec.selector == ORIGINAL_SELECTOR


def test_undo_switch_traffic_refuses_to_send_the_clients_to_a_source_this_migration_scaled_down_until_it_is_back(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    """Newest first, scale-down-old's undo scales the source back before this undo runs. A run reset to before
    switch-traffic (temporal workflow reset) rolls back without knowing it scaled down, and an undo of scale-down-old
    that failed may be gone past: the clients, served by the target, would be sent to no Pod at all."""
    activity_env.run(cluster.switch_traffic, _switch(ref))
    activity_env.run(cluster.scale_down_old, ScaleDownOldInput(ref=ref, stateful_set=SOURCE))

    with pytest.raises(ApplicationError, match=r"this Migration's scale-down-old scaled it to 0 \(from 2") as refused:
        activity_env.run(cluster.undo_switch_traffic, _undo(ref))

    assert refused.value.type == "SourceScaledDown"
    assert not refused.value.non_retryable, "once the source is scaled back, a retry goes on"
    assert f"kubectl scale statefulset -n {ref.namespace} {SOURCE} --replicas=2" in str(refused.value)
    assert stable_service(kube_api, ref.namespace).spec.selector == TARGET_SELECTOR, "still on the target"
    activity_env.run(cluster.undo_scale_down_old, UndoScaleDownOldInput(ref=ref, stateful_set=SOURCE))
    activity_env.run(cluster.undo_switch_traffic, _undo(ref))
    assert stable_service(kube_api, ref.namespace).spec.selector == ORIGINAL_SELECTOR


def test_switch_traffic_ignores_a_previous_selector_left_by_an_earlier_migration(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    left_over = {"metadata": {"annotations": {RECORD: '{"app": "orders-db-legacy"}'}}}
    k8s.CoreV1Api(kube_api).patch_namespaced_service(SOURCE, ref.namespace, left_over)

    switched = activity_env.run(cluster.switch_traffic, _switch(ref))

    assert switched.previous_selector == ORIGINAL_SELECTOR


def test_undo_switch_traffic_ends_when_the_restored_selector_also_matches_pods_other_than_the_sources(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    exporter = _exporter_labelled_like_the_source(kube_api, ref.namespace)
    switched = activity_env.run(cluster.switch_traffic, _switch(ref))
    assert set(switched.endpoints) <= set(TARGET_PODS), "ferry's selector matches the target's Pods alone"
    undo_env, deadline = ActivityEnvironment(), time.monotonic() + UNDO_DEADLINE
    undo_env.on_heartbeat = lambda *_: undo_env.cancel() if time.monotonic() > deadline else None

    try:
        undo_env.run(cluster.undo_switch_traffic, _undo(ref))
    except CancelledError as error:
        pytest.fail(f"the undo was still waiting after {UNDO_DEADLINE:.0f}s: {error}")

    service = stable_service(kube_api, ref.namespace)
    assert service.spec.selector == ORIGINAL_SELECTOR
    assert RECORD not in (service.metadata.annotations or {})
    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == sorted([*SOURCE_PODS, *exporter])


def test_the_precheck_names_the_pods_the_stable_service_selects_beside_the_sources_once(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    exporter = _exporter_labelled_like_the_source(kube_api, ref.namespace)

    activity_env.run(cluster.check_cluster, ProvisionInput(ref=ref, spec=spec))
    activity_env.run(cluster.check_cluster, ProvisionInput(ref=ref, spec=spec))

    events = k8s.CoreV1Api(kube_api).list_namespaced_event(ref.namespace).items
    warnings = [event for event in events if event.reason == "ServiceSelectsOtherPods"]
    assert len(warnings) == 1, "recorded once however often the precheck runs"
    assert warnings[0].type == "Warning"
    assert warnings[0].involved_object.uid == ref.uid
    assert f"also selects Pods that are not StatefulSet {SOURCE}'s: {exporter[0]}." in warnings[0].message


def _scale_down_behind(ref: MigrationRef) -> ScaleDownOldInput:
    """scale-down-old as the saga calls it: with the Service that must still send the clients to the target."""
    return ScaleDownOldInput(ref=ref, stateful_set=SOURCE, service=SOURCE, target_stateful_set=TARGET)


def test_scale_down_old_scales_the_source_away_while_the_service_sends_the_clients_to_the_target(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    activity_env.run(cluster.switch_traffic, _switch(ref))

    scaled = activity_env.run(cluster.scale_down_old, _scale_down_behind(ref))

    assert scaled.previous_replicas == 2
    assert k8s.AppsV1Api(kube_api).read_namespaced_stateful_set(SOURCE, ref.namespace).spec.replicas == 0
    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == TARGET_PODS


def test_scale_down_old_refuses_when_the_service_was_pointed_back_at_the_source_during_the_soak(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    """A GitOps controller heals the Service back to the selector in git after the switch: the clients are on the
    source again, and scaling it to zero would leave their Service selecting no Pod at all, the run Succeeded."""
    activity_env.run(cluster.switch_traffic, _switch(ref))
    healed = {"spec": {"selector": {STATEFULSET_LABEL: None, **ORIGINAL_SELECTOR}}}
    k8s.CoreV1Api(kube_api).patch_namespaced_service(SOURCE, ref.namespace, healed)
    eventually(
        "the Service to list the source's Pods again",
        lambda: endpoint_pods(kube_api, ref.namespace, SOURCE) == SOURCE_PODS,
    )

    with pytest.raises(ApplicationError) as refused:
        activity_env.run(cluster.scale_down_old, _scale_down_behind(ref))

    assert refused.value.type == "TrafficNotOnTarget"
    assert refused.value.non_retryable
    assert f"Service {ref.namespace}/{SOURCE} no longer sends the clients to the target {TARGET}" in str(refused.value)
    source = k8s.AppsV1Api(kube_api).read_namespaced_stateful_set(SOURCE, ref.namespace)
    assert source.spec.replicas == 2, "the source keeps serving its clients"
    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == SOURCE_PODS


def test_scale_down_old_fails_when_the_service_was_pointed_back_at_the_source_while_it_scaled_it_down(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    """The Service checked before the scale-down can be healed back to the source while the source's Pods go (their
    grace period), or before a retry that finds the source at zero already: the run then ended Succeeded with the
    clients' Service selecting no Pod. It fails instead, and the rollback scales the source back."""
    activity_env.run(cluster.switch_traffic, _switch(ref))
    activity_env.run(cluster.scale_down_old, _scale_down_behind(ref))
    healed = {"spec": {"selector": {STATEFULSET_LABEL: None, **ORIGINAL_SELECTOR}}}
    k8s.CoreV1Api(kube_api).patch_namespaced_service(SOURCE, ref.namespace, healed)

    with pytest.raises(ApplicationError) as refused:
        activity_env.run(cluster.scale_down_old, _scale_down_behind(ref))  # a retry, its first result lost

    assert refused.value.type == "TrafficNotOnTarget"
    assert "the source was scaled to zero meanwhile, so they reach no Pod now" in str(refused.value)
    activity_env.run(cluster.undo_scale_down_old, UndoScaleDownOldInput(ref=ref, stateful_set=SOURCE))
    assert k8s.AppsV1Api(kube_api).read_namespaced_stateful_set(SOURCE, ref.namespace).spec.replicas == 2


DELETE_WHEN_SCALED = {
    "spec": {"persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete", "whenDeleted": "Retain"}}
}
"""A StatefulSet whose controller deletes the claims of the Pods a scale-down removes."""


def test_neither_the_precheck_nor_scale_down_old_accepts_a_source_whose_claims_go_when_it_is_scaled_down(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    provisioned: ProvisionResult,
) -> None:
    """With whenScaled: Delete, scale-down-old would have the source's volumes deleted with its Pods; a rollback after
    it would scale back a source with empty volumes, send the clients there, and empty the target, the only copy
    left. The precheck refuses it, and scale-down-old again, since the policy may have changed since."""
    apps = k8s.AppsV1Api(kube_api)
    activity_env.run(cluster.switch_traffic, _switch(ref))
    apps.patch_namespaced_stateful_set(SOURCE, ref.namespace, DELETE_WHEN_SCALED)
    refusal = r"deletes its volumes' claims when scaled down \(spec.persistentVolumeClaimRetentionPolicy.whenScaled"

    with pytest.raises(InvalidSpec, match=refusal):
        activity_env.run(cluster.check_cluster, ProvisionInput(ref=ref, spec=spec))
    with pytest.raises(InvalidSpec, match=refusal) as refused:
        activity_env.run(cluster.scale_down_old, _scale_down_behind(ref))

    assert "ferry changed nothing" in str(refused.value)
    assert apps.read_namespaced_stateful_set(SOURCE, ref.namespace).spec.replicas == 2
    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == TARGET_PODS
    retain = {"spec": {"persistentVolumeClaimRetentionPolicy": {"whenScaled": "Retain", "whenDeleted": "Retain"}}}
    apps.patch_namespaced_stateful_set(SOURCE, ref.namespace, retain)
    assert activity_env.run(cluster.scale_down_old, _scale_down_behind(ref)).previous_replicas == 2
