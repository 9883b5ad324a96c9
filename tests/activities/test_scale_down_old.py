"""scale_down_old takes the source's Pods away and records how many there were; its undo brings them back.

The undo may run with no result of the step (replicas None): it then restores only
what its own Migration's scale-down recorded on the StatefulSet, and changes nothing
when the scale-down never happened, or was another Migration's.
"""

from __future__ import annotations

import json
import uuid

import pytest
from kubernetes import client as k8s
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities.cluster import ClusterActivities
from ferry.api.saga import MigrationRef, ScaleDownOldInput, ScaleDownOldResult, UndoScaleDownOldInput
from tests.activities.cluster_state import source_stateful_set
from tests.cluster import SOURCE, SOURCE_PODS, endpoint_pods, eventually, ready_replicas

RECORD = "ferry.dev/previous-replicas"
FENCE = "ferry.dev/fence"


def _source_pods(kube_api: k8s.ApiClient, namespace: str) -> list[str]:
    pods = k8s.CoreV1Api(kube_api).list_namespaced_pod(namespace, label_selector=f"app={SOURCE}").items
    return sorted(pod.metadata.name for pod in pods)


def _scale_down(ref: MigrationRef) -> ScaleDownOldInput:
    return ScaleDownOldInput(ref=ref, stateful_set=SOURCE)


def _undo(ref: MigrationRef, replicas: int | None = None) -> UndoScaleDownOldInput:
    return UndoScaleDownOldInput(ref=ref, stateful_set=SOURCE, replicas=replicas)


def _back_at_two_ready_replicas(kube_api: k8s.ApiClient, namespace: str) -> None:
    assert ready_replicas(kube_api, namespace, SOURCE) == 2
    assert _source_pods(kube_api, namespace) == SOURCE_PODS
    assert RECORD not in (source_stateful_set(kube_api, namespace).metadata.annotations or {})
    eventually(
        "the stable Service to list the source again",
        lambda: endpoint_pods(kube_api, namespace, SOURCE) == SOURCE_PODS,
    )


def _scaled_away(kube_api: k8s.ApiClient, namespace: str) -> None:
    stateful_set = source_stateful_set(kube_api, namespace)
    assert (stateful_set.spec.replicas, stateful_set.status.replicas) == (0, 0)
    assert _source_pods(kube_api, namespace) == []


def test_scale_down_old_removes_the_source_pods_and_returns_their_count_also_when_run_again(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    first = activity_env.run(cluster.scale_down_old, _scale_down(ref))

    assert first == ScaleDownOldResult(previous_replicas=2)
    _scaled_away(kube_api, ref.namespace)
    record = json.loads(source_stateful_set(kube_api, ref.namespace).metadata.annotations[RECORD])
    assert record == {"migration": ref.uid, "replicas": 2}

    second = activity_env.run(cluster.scale_down_old, _scale_down(ref))

    assert second == ScaleDownOldResult(previous_replicas=2), "a retry returns the original count, not 0"


def test_undo_scale_down_old_brings_the_ready_replicas_back_and_can_run_twice(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    scaled = activity_env.run(cluster.scale_down_old, _scale_down(ref))

    activity_env.run(cluster.undo_scale_down_old, _undo(ref, scaled.previous_replicas))

    _back_at_two_ready_replicas(kube_api, ref.namespace)

    activity_env.run(cluster.undo_scale_down_old, _undo(ref, scaled.previous_replicas))
    activity_env.run(cluster.undo_scale_down_old, _undo(ref))

    _back_at_two_ready_replicas(kube_api, ref.namespace)


def test_undo_scale_down_old_without_the_steps_result_restores_what_its_own_scale_down_recorded(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    activity_env.run(cluster.scale_down_old, _scale_down(ref))

    activity_env.run(cluster.undo_scale_down_old, _undo(ref))

    _back_at_two_ready_replicas(kube_api, ref.namespace)


def test_undo_scale_down_old_after_scale_down_old_was_cancelled_while_waiting_scales_back(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    activity_env.cancel()
    with pytest.raises(CancelledError):
        activity_env.run(cluster.scale_down_old, _scale_down(ref))
    assert source_stateful_set(kube_api, ref.namespace).spec.replicas == 0, "it scaled down, then was stopped"

    ActivityEnvironment().run(cluster.undo_scale_down_old, _undo(ref))

    _back_at_two_ready_replicas(kube_api, ref.namespace)


def test_undo_scale_down_old_when_scale_down_old_never_ran_changes_nothing_but_leaves_its_fence(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    before = source_stateful_set(kube_api, ref.namespace).metadata

    activity_env.run(cluster.undo_scale_down_old, _undo(ref))

    after = source_stateful_set(kube_api, ref.namespace).metadata
    annotations = dict(after.annotations)
    fence = json.loads(annotations.pop(FENCE))
    assert (after.generation, annotations) == (before.generation, before.annotations or {})
    assert fence == {ref.uid: activity_env.info.scheduled_time.isoformat()}, "for a late scale-down to find"
    assert ready_replicas(kube_api, ref.namespace, SOURCE) == 2


def test_undo_scale_down_old_of_another_migration_with_the_same_name_changes_nothing(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    activity_env.run(cluster.scale_down_old, _scale_down(ref))
    version = source_stateful_set(kube_api, ref.namespace).metadata.resource_version
    applied_again = MigrationRef(namespace=ref.namespace, name=ref.name, uid=str(uuid.uuid4()))

    activity_env.run(cluster.undo_scale_down_old, _undo(applied_again))
    activity_env.run(cluster.undo_scale_down_old, _undo(applied_again, 2))

    assert source_stateful_set(kube_api, ref.namespace).metadata.resource_version == version
    _scaled_away(kube_api, ref.namespace)


def test_scale_down_old_and_its_undo_understand_the_record_of_an_older_ferry(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    # What an older ferry's scale-down wrote: the count before, bare, with no uid.
    older = {"spec": {"replicas": 0}, "metadata": {"annotations": {RECORD: "2"}}}
    k8s.AppsV1Api(kube_api).patch_namespaced_stateful_set(SOURCE, ref.namespace, older)

    retried = activity_env.run(cluster.scale_down_old, _scale_down(ref))
    assert retried == ScaleDownOldResult(previous_replicas=2), "a retry of that run returns the count before"

    activity_env.run(cluster.undo_scale_down_old, _undo(ref))
    assert source_stateful_set(kube_api, ref.namespace).spec.replicas == 0, "no uid: not provably its own"

    activity_env.run(cluster.undo_scale_down_old, _undo(ref, retried.previous_replicas))
    _back_at_two_ready_replicas(kube_api, ref.namespace)


def test_a_source_already_at_zero_is_left_at_zero_by_scale_down_old_and_its_undo(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    k8s.AppsV1Api(kube_api).patch_namespaced_stateful_set(SOURCE, ref.namespace, {"spec": {"replicas": 0}})

    scaled = activity_env.run(cluster.scale_down_old, _scale_down(ref))
    activity_env.run(cluster.undo_scale_down_old, _undo(ref))

    assert scaled == ScaleDownOldResult(previous_replicas=0)
    assert RECORD not in (source_stateful_set(kube_api, ref.namespace).metadata.annotations or {})
    _scaled_away(kube_api, ref.namespace)
