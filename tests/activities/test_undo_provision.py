"""undo_provision removes what provision made for its own Migration, whatever provision got to do, and nothing else."""

from __future__ import annotations

import itertools
import threading
import uuid

import pytest
from kubernetes import client as k8s
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import ActivityEnvironment

from activities import kube_calls, kube_objects
from activities.cluster import ClusterActivities
from devstack.stack.stack import StackInfo
from ferry.api.migration import MIGRATION_UID_LABEL, STATEFULSET_LABEL, MigrationSpec
from ferry.api.saga import MigrationRef, ProvisionInput, ProvisionResult, SwitchTrafficInput, UndoProvisionInput
from tests.activities.cluster_state import absent, claims_of, provision_as_an_older_ferry, target_objects
from tests.activities.conftest import TARGET, TARGET_PODS
from tests.cluster import SOURCE, SOURCE_PODS, endpoint_pods, eventually, ready_replicas, stack_process, stopped


def _nothing_of_the_target_left(kube_api: k8s.ApiClient, namespace: str) -> None:
    apps, core = k8s.AppsV1Api(kube_api), k8s.CoreV1Api(kube_api)
    assert absent(apps.read_namespaced_stateful_set, TARGET, namespace)
    assert absent(core.read_namespaced_service, TARGET, namespace)
    assert claims_of(kube_api, namespace, TARGET) == []
    assert core.list_namespaced_pod(namespace, label_selector=f"{STATEFULSET_LABEL}={TARGET}").items == []


def _source_untouched(kube_api: k8s.ApiClient, namespace: str) -> None:
    assert ready_replicas(kube_api, namespace, SOURCE) == 2
    assert [c.metadata.name for c in claims_of(kube_api, namespace, SOURCE)] == ["data-orders-db-0", "data-orders-db-1"]
    assert endpoint_pods(kube_api, namespace, SOURCE) == SOURCE_PODS


def test_undo_provision_after_provision_applied_only_the_headless_service_deletes_it(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    # provision's first write, as if its worker died right after it.
    core = k8s.CoreV1Api(kube_api)
    stable = kube_calls.read_json(core.read_namespaced_service, SOURCE, ref.namespace)
    kube_calls.apply(core.patch_namespaced_service, kube_objects.headless_service(stable, ref, spec.target), "ferry")

    activity_env.run(cluster.undo_provision, UndoProvisionInput(ref=ref, stateful_set=TARGET))

    _nothing_of_the_target_left(kube_api, ref.namespace)
    _source_untouched(kube_api, ref.namespace)


def test_undo_provision_after_provision_was_cancelled_while_waiting_removes_what_it_had_made(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    activity_env.cancel()
    with pytest.raises(CancelledError):
        activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))
    assert not absent(k8s.AppsV1Api(kube_api).read_namespaced_stateful_set, TARGET, ref.namespace)

    ActivityEnvironment().run(cluster.undo_provision, UndoProvisionInput(ref=ref, stateful_set=TARGET))

    _nothing_of_the_target_left(kube_api, ref.namespace)
    _source_untouched(kube_api, ref.namespace)


def test_undo_provision_deletes_nothing_before_the_statefulset_controller_has_stopped_making_claims(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
    stack: StackInfo,
) -> None:
    """The controller makes a Pod's claim from its cached copy of the StatefulSet, and a claim has no owner: one made
    after the undo's last look (the controller behind, here stopped by SIGSTOP) would stay, with its volume, under the
    target's names for good. The undo waits until the controller has seen the target scaled to 0, and only then
    deletes; with the controller stopped, it waits."""
    activity_env.cancel()
    with pytest.raises(CancelledError):
        activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))
    looks: list[dict[str, object]] = []
    undo = ActivityEnvironment()
    undo.on_heartbeat = lambda *details: looks.append(details[0] if details else {})
    ended: list[BaseException | None] = []

    def undoing() -> None:
        try:
            undo.run(cluster.undo_provision, UndoProvisionInput(ref=ref, stateful_set=TARGET))
            ended.append(None)
        except BaseException as error:  # noqa: BLE001 - what the undo met
            ended.append(error)

    apps = k8s.AppsV1Api(kube_api)
    with stopped(stack_process(stack, "kube-controller-manager")):
        running = threading.Thread(target=undoing)
        running.start()
        eventually(
            "the undo to wait for the controller, or to delete the StatefulSet",
            lambda: (
                sum("StatefulSet controller" in str(look.get("waiting_for")) for look in looks) >= 3
                or absent(apps.read_namespaced_stateful_set, TARGET, ref.namespace)
            ),
        )
        assert not absent(apps.read_namespaced_stateful_set, TARGET, ref.namespace), (
            "the undo deleted the StatefulSet while its controller could still make a claim from its cached copy"
        )
        assert not ended
    running.join(60)

    assert not running.is_alive(), "the undo ended once the controller went on"
    assert ended == [None]
    _nothing_of_the_target_left(kube_api, ref.namespace)
    _source_untouched(kube_api, ref.namespace)


def test_undo_provision_deletes_a_claim_the_statefulset_controller_made_after_the_undo_listed_them(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    # provision cancelled right after its apply: the StatefulSet controller, working from its cache, can create a
    # claim after undo_provision listed them. The claim appears here at the undo's first poll, as it did in CI.
    activity_env.cancel()
    with pytest.raises(CancelledError):
        activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))
    apps, core = k8s.AppsV1Api(kube_api), k8s.CoreV1Api(kube_api)
    template = kube_calls.read_json(apps.read_namespaced_stateful_set, TARGET, ref.namespace)["spec"][
        "volumeClaimTemplates"
    ][0]
    late_claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"data-{TARGET}-7", "namespace": ref.namespace, "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }
    polls = itertools.count(1)  # next() is atomic: the step's thread and the heartbeat watchdog both call
    undo_env = ActivityEnvironment()

    def controller_creates_a_claim_late(*_: object) -> None:
        poll = next(polls)
        if poll == 1:
            core.create_namespaced_persistent_volume_claim(ref.namespace, late_claim)
        if poll > 100:  # the claim stayed for good: stop the undo rather than wait for the test timeout
            undo_env.cancel()

    undo_env.on_heartbeat = controller_creates_a_claim_late
    undo_env.run(cluster.undo_provision, UndoProvisionInput(ref=ref, stateful_set=TARGET))

    _nothing_of_the_target_left(kube_api, ref.namespace)
    assert absent(core.read_namespaced_persistent_volume_claim, f"data-{TARGET}-7", ref.namespace)
    _source_untouched(kube_api, ref.namespace)


def test_undo_provision_when_provision_never_ran_changes_nothing(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    source: str,
) -> None:
    stable_before = k8s.CoreV1Api(kube_api).read_namespaced_service(SOURCE, ref.namespace).metadata.resource_version

    activity_env.run(cluster.undo_provision, UndoProvisionInput(ref=ref, stateful_set=TARGET))

    _nothing_of_the_target_left(kube_api, ref.namespace)
    _source_untouched(kube_api, ref.namespace)
    assert k8s.CoreV1Api(kube_api).read_namespaced_service(SOURCE, ref.namespace).metadata.resource_version == (
        stable_before
    )


def test_undo_provision_of_another_migration_with_the_same_name_leaves_the_target(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    before = target_objects(kube_api, ref.namespace, TARGET)
    applied_again = MigrationRef(namespace=ref.namespace, name=ref.name, uid=str(uuid.uuid4()))

    activity_env.run(cluster.undo_provision, UndoProvisionInput(ref=applied_again, stateful_set=TARGET))

    assert target_objects(kube_api, ref.namespace, TARGET) == before
    assert ready_replicas(kube_api, ref.namespace, TARGET) == 2


def test_undo_provision_leaves_a_target_an_older_ferry_made_with_only_the_name_label(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    provision_as_an_older_ferry(kube_api, ref, spec)
    before = target_objects(kube_api, ref.namespace, TARGET)

    activity_env.run(cluster.undo_provision, UndoProvisionInput(ref=ref, stateful_set=TARGET))

    assert target_objects(kube_api, ref.namespace, TARGET) == before
    assert ready_replicas(kube_api, ref.namespace, TARGET) == 2


def test_undo_provision_keeps_a_target_that_the_stable_service_still_sends_traffic_to(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    activity_env.run(cluster.switch_traffic, SwitchTrafficInput(ref=ref, service=SOURCE, target_stateful_set=TARGET))
    before = target_objects(kube_api, ref.namespace, TARGET)

    with pytest.raises(ApplicationError, match=r"Service orders-db still sends its traffic to StatefulSet") as refused:
        activity_env.run(cluster.undo_provision, UndoProvisionInput(ref=ref, stateful_set=TARGET))

    assert refused.value.type == "TargetServesTraffic"
    assert not refused.value.non_retryable, "once switch-traffic is undone, a retry goes on"
    assert target_objects(kube_api, ref.namespace, TARGET) == before
    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == TARGET_PODS


def test_undo_provision_keeps_a_target_a_service_selects_by_another_label_its_pods_carry(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    """A Service made after provision (a read endpoint, say) selecting the target's Pods by a label they carry, not
    ferry's: its EndpointSlices list them, and that is what decides."""
    core = k8s.CoreV1Api(kube_api)
    reader = k8s.V1Service(
        metadata=k8s.V1ObjectMeta(name="orders-read"),
        spec=k8s.V1ServiceSpec(selector={MIGRATION_UID_LABEL: ref.uid}, ports=[k8s.V1ServicePort(port=5432)]),
    )
    core.create_namespaced_service(ref.namespace, reader)
    eventually(
        "the reader Service to list the target's Pods",
        lambda: endpoint_pods(kube_api, ref.namespace, "orders-read") == TARGET_PODS,
    )
    before = target_objects(kube_api, ref.namespace, TARGET)

    with pytest.raises(
        ApplicationError, match=r"Service orders-read still sends its traffic to StatefulSet"
    ) as refused:
        activity_env.run(cluster.undo_provision, UndoProvisionInput(ref=ref, stateful_set=TARGET))

    assert refused.value.type == "TargetServesTraffic"
    assert target_objects(kube_api, ref.namespace, TARGET) == before
    core.delete_namespaced_service("orders-read", ref.namespace)
    activity_env.run(cluster.undo_provision, UndoProvisionInput(ref=ref, stateful_set=TARGET))
