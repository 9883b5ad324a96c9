"""A Migration that succeeded, was deleted and is applied again (GitOps does this) never touches the live database.

The second Migration has the same name and a new uid. Its provision refuses the live
target at once, changing nothing; its rollback then runs every undo with no step
result, and none of them deletes or changes anything the first Migration made.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.testing import ActivityEnvironment

from activities.cluster import ClusterActivities
from ferry.api.errors import InvalidSpec
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
from tests.activities.cluster_state import source_stateful_set, stable_service, target_objects
from tests.activities.conftest import TARGET, TARGET_PODS
from tests.cluster import SOURCE, endpoint_pods, ready_replicas


def _live(kube_api: k8s.ApiClient, namespace: str) -> dict[str, Any]:
    """Everything the first Migration left: the target's objects, the stable Service, the scaled-down source."""
    service, source = stable_service(kube_api, namespace), source_stateful_set(kube_api, namespace)
    return {
        **target_objects(kube_api, namespace, TARGET),
        "stable service": (service.metadata.resource_version, service.spec.selector, service.metadata.annotations),
        "source": (source.metadata.resource_version, source.spec.replicas, source.metadata.annotations),
    }


def test_a_migration_applied_again_after_success_refuses_the_live_target_and_its_undos_change_nothing(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    provisioned: ProvisionResult,
) -> None:
    # The first Migration succeeds: the target is provisioned, serves the traffic, and the source is scaled down.
    activity_env.run(cluster.switch_traffic, SwitchTrafficInput(ref=ref, service=SOURCE, target_stateful_set=TARGET))
    activity_env.run(cluster.scale_down_old, ScaleDownOldInput(ref=ref, stateful_set=SOURCE))
    live = _live(kube_api, ref.namespace)
    again = MigrationRef(namespace=ref.namespace, name=ref.name, uid=str(uuid.uuid4()))

    with pytest.raises(InvalidSpec) as refused:
        activity_env.run(cluster.provision, ProvisionInput(ref=again, spec=spec))

    message = str(refused.value)
    assert message.startswith(f"spec.target.statefulSet: the target {ref.namespace}/{TARGET} already serves traffic")
    assert f"switched by the Migration with uid {ref.uid}" in message
    assert "ferry changed nothing" in message

    # Its rollback: every undo, newest first, without any step result.
    activity_env.run(cluster.undo_scale_down_old, UndoScaleDownOldInput(ref=again, stateful_set=SOURCE))
    undo_switch = UndoSwitchTrafficInput(ref=again, service=SOURCE, source_stateful_set=SOURCE)
    activity_env.run(cluster.undo_switch_traffic, undo_switch)
    activity_env.run(cluster.undo_provision, UndoProvisionInput(ref=again, stateful_set=TARGET))

    assert _live(kube_api, ref.namespace) == live
    assert ready_replicas(kube_api, ref.namespace, TARGET) == 2
    assert stable_service(kube_api, ref.namespace).spec.selector == {STATEFULSET_LABEL: TARGET}
    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == TARGET_PODS, "the clients still reach the database"
