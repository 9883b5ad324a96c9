"""scale_down_old takes the source's Pods away and remembers how many there were; its undo brings them back."""

from __future__ import annotations

from kubernetes import client as k8s
from temporalio.testing import ActivityEnvironment

from activities.cluster import ClusterActivities
from ferry.api.saga import MigrationRef, ScaleDownOldInput, ScaleDownOldResult, UndoScaleDownOldInput
from tests.cluster import SOURCE, SOURCE_PODS, endpoint_pods, eventually, ready_replicas


def _source(kube_api: k8s.ApiClient, namespace: str) -> k8s.V1StatefulSet:
    return k8s.AppsV1Api(kube_api).read_namespaced_stateful_set(SOURCE, namespace)


def _source_pods(kube_api: k8s.ApiClient, namespace: str) -> list[str]:
    pods = k8s.CoreV1Api(kube_api).list_namespaced_pod(namespace, label_selector=f"app={SOURCE}").items
    return sorted(pod.metadata.name for pod in pods)


def test_scale_down_old_removes_the_source_pods_and_returns_their_count_also_when_run_again(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    scale_down = ScaleDownOldInput(ref=ref, stateful_set=SOURCE)

    first = activity_env.run(cluster.scale_down_old, scale_down)

    assert first == ScaleDownOldResult(previous_replicas=2)
    stateful_set = _source(kube_api, ref.namespace)
    assert (stateful_set.spec.replicas, stateful_set.status.replicas) == (0, 0)
    assert _source_pods(kube_api, ref.namespace) == []

    second = activity_env.run(cluster.scale_down_old, scale_down)

    assert second == ScaleDownOldResult(previous_replicas=2), "a retry returns the original count, not 0"


def test_undo_scale_down_old_brings_the_ready_replicas_back_and_can_run_twice(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    scaled = activity_env.run(cluster.scale_down_old, ScaleDownOldInput(ref=ref, stateful_set=SOURCE))
    undo = UndoScaleDownOldInput(ref=ref, stateful_set=SOURCE, replicas=scaled.previous_replicas)

    activity_env.run(cluster.undo_scale_down_old, undo)

    assert ready_replicas(kube_api, ref.namespace, SOURCE) == 2
    assert _source_pods(kube_api, ref.namespace) == SOURCE_PODS
    assert "ferry.dev/previous-replicas" not in (_source(kube_api, ref.namespace).metadata.annotations or {})

    activity_env.run(cluster.undo_scale_down_old, undo)

    assert ready_replicas(kube_api, ref.namespace, SOURCE) == 2
    eventually(
        "the stable Service to list the source again",
        lambda: endpoint_pods(kube_api, ref.namespace, SOURCE) == SOURCE_PODS,
    )
