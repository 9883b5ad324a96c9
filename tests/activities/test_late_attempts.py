"""A late attempt of a Kubernetes step, going on after its undo, changes nothing: the undo's fence refuses it.

Each attempt of a step or undo is an activity of its own, scheduled by the saga after the
one before; its worker can stand still past its timeout (a paused VM, a SIGSTOP) and go on
after the saga rolled back. Here such an attempt is run again with the activity info of
the step's attempt (`scheduled_time` earlier than the undo's), as its worker would carry
it. The objects are the stack's real ones; only the times are chosen.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.testing import ActivityEnvironment

from activities.cluster import ClusterActivities
from ferry.api.errors import Overtaken
from ferry.api.migration import STATEFULSET_LABEL, MigrationSpec
from ferry.api.saga import (
    MigrationRef,
    ProvisionInput,
    ProvisionResult,
    ScaleDownOldInput,
    SwitchTrafficInput,
    UndoProvisionInput,
    UndoScaleDownOldInput,
    UndoSwitchTrafficInput,
)
from tests import samples
from tests.activities.cluster_state import absent, claims_of, source_stateful_set, stable_service
from tests.activities.conftest import MIGRATION, TARGET
from tests.cluster import SOURCE, SOURCE_PODS, endpoint_pods, eventually, ready_replicas
from tests.conftest import Kubectl

STEP = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
"""When the saga scheduled the step's attempt that goes on late."""
UNDO = STEP + timedelta(minutes=5)
"""When it scheduled the undo, after that attempt timed out."""
RETRY = UNDO + timedelta(minutes=5)
"""When it scheduled the step again (failurePolicy Pause, then retry)."""
FENCE = "ferry.dev/fence"
ORIGINAL_SELECTOR = {"app": SOURCE}
TARGET_SELECTOR = {STATEFULSET_LABEL: TARGET}


def _scheduled(env: ActivityEnvironment, at: datetime) -> ActivityEnvironment:
    """`env`, running its next activities as if Temporal had scheduled them at `at`."""
    env.info = dataclasses.replace(env.info, scheduled_time=at, current_attempt_scheduled_time=at)
    return env


def _switch(ref: MigrationRef) -> SwitchTrafficInput:
    return SwitchTrafficInput(ref=ref, service=SOURCE, target_stateful_set=TARGET)


def _undo_switch(ref: MigrationRef) -> UndoSwitchTrafficInput:
    return UndoSwitchTrafficInput(ref=ref, service=SOURCE, previous_selector=None, source_stateful_set=SOURCE)


def _serves_the_source(kube_api: k8s.ApiClient, namespace: str) -> None:
    assert stable_service(kube_api, namespace).spec.selector == ORIGINAL_SELECTOR
    eventually("the source's Pods listed", lambda: endpoint_pods(kube_api, namespace, SOURCE) == SOURCE_PODS)


def _fences(annotations: dict[str, str] | None) -> dict[str, str]:
    fences: dict[str, str] = json.loads((annotations or {})[FENCE])
    return fences


def test_a_late_switch_traffic_after_its_undo_is_refused_and_the_service_stays_on_the_source(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    _scheduled(activity_env, STEP).run(cluster.switch_traffic, _switch(ref))
    _scheduled(activity_env, UNDO).run(cluster.undo_switch_traffic, _undo_switch(ref))
    version = stable_service(kube_api, ref.namespace).metadata.resource_version

    with pytest.raises(Overtaken, match="overtaken by a later action of the same Migration"):
        _scheduled(activity_env, STEP).run(cluster.switch_traffic, _switch(ref))

    assert stable_service(kube_api, ref.namespace).metadata.resource_version == version, "it wrote nothing"
    _serves_the_source(kube_api, ref.namespace)


def test_a_late_switch_traffic_is_refused_also_when_its_undo_found_nothing_to_restore(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    # The attempt stood still before its write: the undo finds no record of a switch, and fences the Service anyway.
    _scheduled(activity_env, UNDO).run(cluster.undo_switch_traffic, _undo_switch(ref))
    assert _fences(stable_service(kube_api, ref.namespace).metadata.annotations) == {ref.uid: UNDO.isoformat()}

    with pytest.raises(Overtaken):
        _scheduled(activity_env, STEP).run(cluster.switch_traffic, _switch(ref))

    _serves_the_source(kube_api, ref.namespace)


def test_switch_traffic_scheduled_after_the_undo_switches_and_another_migrations_fence_is_ignored(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    _scheduled(activity_env, STEP).run(cluster.switch_traffic, _switch(ref))
    _scheduled(activity_env, UNDO).run(cluster.undo_switch_traffic, _undo_switch(ref))
    # A Migration of the same name deleted and applied again (another uid) fenced the Service later still.
    applied_again = MigrationRef(namespace=ref.namespace, name=ref.name, uid=str(uuid.uuid4()))
    _scheduled(activity_env, RETRY + timedelta(hours=1)).run(cluster.undo_switch_traffic, _undo_switch(applied_again))

    switched = _scheduled(activity_env, RETRY).run(cluster.switch_traffic, _switch(ref))

    assert switched.previous_selector == ORIGINAL_SELECTOR
    service = stable_service(kube_api, ref.namespace)
    assert service.spec.selector == TARGET_SELECTOR
    assert _fences(service.metadata.annotations) == {
        ref.uid: RETRY.isoformat(),
        applied_again.uid: (RETRY + timedelta(hours=1)).isoformat(),
    }, "each Migration's fence is kept for its own late attempts"


def test_a_late_scale_down_old_after_its_undo_is_refused_and_the_replicas_stay_restored(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    _scheduled(activity_env, STEP).run(cluster.scale_down_old, ScaleDownOldInput(ref=ref, stateful_set=SOURCE))
    undo = UndoScaleDownOldInput(ref=ref, stateful_set=SOURCE, replicas=None)
    _scheduled(activity_env, UNDO).run(cluster.undo_scale_down_old, undo)
    version = source_stateful_set(kube_api, ref.namespace).metadata.resource_version

    with pytest.raises(Overtaken, match="changed nothing"):
        _scheduled(activity_env, STEP).run(cluster.scale_down_old, ScaleDownOldInput(ref=ref, stateful_set=SOURCE))

    source_now = source_stateful_set(kube_api, ref.namespace)
    assert source_now.metadata.resource_version == version, "it wrote nothing"
    assert source_now.spec.replicas == 2
    assert ready_replicas(kube_api, ref.namespace, SOURCE) == 2


def test_a_late_scale_down_old_is_refused_also_when_its_undo_found_nothing_to_restore(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    undo = UndoScaleDownOldInput(ref=ref, stateful_set=SOURCE, replicas=None)
    _scheduled(activity_env, UNDO).run(cluster.undo_scale_down_old, undo)

    with pytest.raises(Overtaken):
        _scheduled(activity_env, STEP).run(cluster.scale_down_old, ScaleDownOldInput(ref=ref, stateful_set=SOURCE))

    assert source_stateful_set(kube_api, ref.namespace).spec.replicas == 2

    # The step scheduled again after the undo scales down.
    scaled = _scheduled(activity_env, RETRY).run(
        cluster.scale_down_old, ScaleDownOldInput(ref=ref, stateful_set=SOURCE)
    )
    assert scaled.previous_replicas == 2
    assert source_stateful_set(kube_api, ref.namespace).spec.replicas == 0


@pytest.fixture
def migration(kubectl: Kubectl, migration_crd: str, namespace: str, spec: MigrationSpec) -> MigrationRef:
    """The Migration object of the provision tests (undo_provision reads its source from it), as kubectl applies it."""
    manifest = samples.migration(
        MIGRATION, target=spec.target.model_dump(mode="json", by_alias=True, exclude_none=True)
    )
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
    uid = kubectl("get", "migration", MIGRATION, "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout
    return MigrationRef(namespace=namespace, name=MIGRATION, uid=uid)


def _nothing_of_the_target(kube_api: k8s.ApiClient, namespace: str) -> None:
    apps, core = k8s.AppsV1Api(kube_api), k8s.CoreV1Api(kube_api)
    assert absent(apps.read_namespaced_stateful_set, TARGET, namespace)
    assert absent(core.read_namespaced_service, TARGET, namespace)
    assert claims_of(kube_api, namespace, TARGET) == []


def test_a_late_provision_after_its_undo_is_refused_and_creates_nothing(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    migration: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    # The attempt stood still after its checks, before its applies; the undo found nothing of the target.
    _scheduled(activity_env, UNDO).run(cluster.undo_provision, UndoProvisionInput(ref=migration, stateful_set=TARGET))
    assert _fences(source_stateful_set(kube_api, migration.namespace).metadata.annotations) == {
        migration.uid: UNDO.isoformat()
    }

    with pytest.raises(Overtaken, match="changed nothing"):
        _scheduled(activity_env, STEP).run(cluster.provision, ProvisionInput(ref=migration, spec=spec))

    _nothing_of_the_target(kube_api, migration.namespace)

    # provision scheduled again after the undo creates the target.
    provisioned = _scheduled(activity_env, RETRY).run(cluster.provision, ProvisionInput(ref=migration, spec=spec))
    assert provisioned.ready_replicas == 2


def test_a_late_provision_after_its_undo_removed_the_target_is_refused(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    migration: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    _scheduled(activity_env, STEP).run(cluster.provision, ProvisionInput(ref=migration, spec=spec))
    _scheduled(activity_env, UNDO).run(cluster.undo_provision, UndoProvisionInput(ref=migration, stateful_set=TARGET))
    _nothing_of_the_target(kube_api, migration.namespace)

    with pytest.raises(Overtaken):
        _scheduled(activity_env, STEP).run(cluster.provision, ProvisionInput(ref=migration, spec=spec))

    _nothing_of_the_target(kube_api, migration.namespace)
    assert ready_replicas(kube_api, migration.namespace, SOURCE) == 2


def test_a_scale_down_old_that_stood_still_between_its_read_and_its_write_is_refused_after_the_409(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    # A fake, to stand the attempt still between its read and its write, which the real worker cannot be made to do
    # on demand: its first patch waits for the saga's undo to run, then goes to the real API server.
    patch, undone = cluster._apps.patch_namespaced_stateful_set, []

    def after_the_undo(*args: Any, **kwargs: Any) -> Any:
        if not undone:
            undone.append(True)
            undo = UndoScaleDownOldInput(ref=ref, stateful_set=SOURCE, replicas=None)
            _scheduled(ActivityEnvironment(), UNDO).run(cluster.undo_scale_down_old, undo)
        return patch(*args, **kwargs)

    cluster._apps.patch_namespaced_stateful_set = after_the_undo  # type: ignore[method-assign]

    with pytest.raises(Overtaken, match="overtaken by a later action of the same Migration"):
        _scheduled(activity_env, STEP).run(cluster.scale_down_old, ScaleDownOldInput(ref=ref, stateful_set=SOURCE))

    assert undone, "the undo ran while the attempt stood still"
    assert source_stateful_set(kube_api, ref.namespace).spec.replicas == 2, "its 409 and read again wrote nothing"
    assert ready_replicas(kube_api, ref.namespace, SOURCE) == 2
