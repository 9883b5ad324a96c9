"""switch_traffic sends the stable Service's traffic to the target's Pods; undo_switch_traffic sends it back."""

from __future__ import annotations

from kubernetes import client as k8s
from temporalio.testing import ActivityEnvironment

from activities.cluster import ClusterActivities
from ferry.api.migration import STATEFULSET_LABEL
from ferry.api.saga import (
    MigrationRef,
    ProvisionResult,
    ScaleDownOldInput,
    SwitchTrafficInput,
    SwitchTrafficResult,
    UndoSwitchTrafficInput,
)
from tests.activities.conftest import TARGET, TARGET_PODS
from tests.cluster import SOURCE, SOURCE_PODS, endpoint_pods

ORIGINAL_SELECTOR = {"app": SOURCE}


def _stable_service(kube_api: k8s.ApiClient, namespace: str) -> k8s.V1Service:
    return k8s.CoreV1Api(kube_api).read_namespaced_service(SOURCE, namespace)


def test_switch_traffic_lists_only_target_pods_and_its_undo_lists_the_source_pods_again(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    switched = activity_env.run(
        cluster.switch_traffic, SwitchTrafficInput(ref=ref, service=SOURCE, target_stateful_set=TARGET)
    )

    assert switched == SwitchTrafficResult(previous_selector=ORIGINAL_SELECTOR, endpoints=TARGET_PODS)
    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == TARGET_PODS
    assert _stable_service(kube_api, ref.namespace).spec.selector == {STATEFULSET_LABEL: TARGET}

    undo = UndoSwitchTrafficInput(
        ref=ref, service=SOURCE, previous_selector=switched.previous_selector, source_stateful_set=SOURCE
    )
    activity_env.run(cluster.undo_switch_traffic, undo)

    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == SOURCE_PODS
    service = _stable_service(kube_api, ref.namespace)
    assert service.spec.selector == ORIGINAL_SELECTOR
    assert "ferry.dev/previous-selector" not in (service.metadata.annotations or {})


def test_switch_traffic_and_its_undo_can_each_run_twice(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    switch = SwitchTrafficInput(ref=ref, service=SOURCE, target_stateful_set=TARGET)

    first = activity_env.run(cluster.switch_traffic, switch)
    second = activity_env.run(cluster.switch_traffic, switch)

    assert first.previous_selector == second.previous_selector == ORIGINAL_SELECTOR
    assert second.endpoints == TARGET_PODS

    undo = UndoSwitchTrafficInput(
        ref=ref, service=SOURCE, previous_selector=ORIGINAL_SELECTOR, source_stateful_set=SOURCE
    )
    activity_env.run(cluster.undo_switch_traffic, undo)
    version = _stable_service(kube_api, ref.namespace).metadata.resource_version
    activity_env.run(cluster.undo_switch_traffic, undo)

    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == SOURCE_PODS
    assert _stable_service(kube_api, ref.namespace).metadata.resource_version == version, "nothing left to change"


def test_undo_switch_traffic_to_a_source_scaled_to_zero_only_waits_for_the_target_to_leave(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    switched = activity_env.run(
        cluster.switch_traffic, SwitchTrafficInput(ref=ref, service=SOURCE, target_stateful_set=TARGET)
    )
    activity_env.run(cluster.scale_down_old, ScaleDownOldInput(ref=ref, stateful_set=SOURCE))

    undo = UndoSwitchTrafficInput(
        ref=ref, service=SOURCE, previous_selector=switched.previous_selector, source_stateful_set=SOURCE
    )
    activity_env.run(cluster.undo_switch_traffic, undo)

    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == []
    assert _stable_service(kube_api, ref.namespace).spec.selector == ORIGINAL_SELECTOR


def test_switch_traffic_ignores_a_previous_selector_left_by_an_earlier_migration(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    left_over = {"metadata": {"annotations": {"ferry.dev/previous-selector": '{"app": "orders-db-legacy"}'}}}
    k8s.CoreV1Api(kube_api).patch_namespaced_service(SOURCE, ref.namespace, left_over)

    switched = activity_env.run(
        cluster.switch_traffic, SwitchTrafficInput(ref=ref, service=SOURCE, target_stateful_set=TARGET)
    )

    assert switched.previous_selector == ORIGINAL_SELECTOR
