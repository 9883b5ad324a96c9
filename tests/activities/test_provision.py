"""provision builds the target from the source and waits until it is Ready; undo_provision removes it again."""

from __future__ import annotations

import datetime
import threading
import uuid
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities import provisioning
from activities.cluster import ClusterActivities
from devstack.demo.sample import source_objects
from ferry.api.errors import InvalidSpec
from ferry.api.migration import (
    GROUP,
    MANAGED_BY_LABEL,
    MIGRATION_LABEL,
    MIGRATION_UID_LABEL,
    PLURAL,
    STATEFULSET_LABEL,
    VERSION,
    MigrationSpec,
)
from ferry.api.saga import MigrationRef, ProvisionInput, ProvisionResult, SwitchTrafficInput, UndoProvisionInput
from tests import samples
from tests.activities.cluster_state import absent, claims_of, provision_as_an_older_ferry, target_objects
from tests.activities.conftest import MIGRATION, TARGET, TARGET_PODS
from tests.cluster import SOURCE, SOURCE_PODS, endpoint_pods, eventually, ready_replicas
from tests.conftest import Kubectl
from tests.end_to_end import apply_migration

SOURCE_LABELS = {"app": SOURCE}
READ_ONLY = f"{SOURCE}-ro"
FIRST_REPLICA = f"{SOURCE}-replica-0"
OTHER_SERVICES = {
    READ_ONLY: {"tier": "database"},
    FIRST_REPLICA: {"team": "payments", "apps.kubernetes.io/pod-index": "0"},
    "billing-db": {"owner": "dba", "app": "billing-db"},
}
"""Services beside the stable one: two select the source's Pods (one by the controller's per-Pod label too), one not."""


def test_provision_creates_a_ready_target_with_the_new_image_and_storage_that_the_stable_service_does_not_select(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    heartbeats: list[tuple[Any, ...]],
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    result = activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))

    assert result == ProvisionResult(stateful_set=TARGET, service=TARGET, ready_replicas=2)
    apps, core = k8s.AppsV1Api(kube_api), k8s.CoreV1Api(kube_api)
    target = apps.read_namespaced_stateful_set(TARGET, ref.namespace)
    assert [c.image for c in target.spec.template.spec.containers] == ["postgres:16"]
    assert target.status.ready_replicas == 2
    assert not target.metadata.owner_references, "the target must outlive the Migration"
    assert target.metadata.labels == {
        MANAGED_BY_LABEL: "ferry",
        MIGRATION_LABEL: MIGRATION,
        MIGRATION_UID_LABEL: ref.uid,
    }, "the Migration's name for people, its uid for ferry"
    assert "app" not in target.spec.template.metadata.labels, "the stable Service selects app"
    claims = claims_of(kube_api, ref.namespace, TARGET)
    assert [c.metadata.name for c in claims] == ["data-orders-db-16-0", "data-orders-db-16-1"]
    assert {(c.spec.storage_class_name, c.spec.resources.requests["storage"]) for c in claims} == {("fast", "2Gi")}
    assert all(c.metadata.labels[MIGRATION_UID_LABEL] == ref.uid for c in claims)
    # The claims' phase, and the headless Service's endpoints, are written by controllers
    # of their own, possibly after the StatefulSet reported Ready: wait for them, do not assume.
    eventually(
        "the target's claims to be Bound",
        lambda: [c.status.phase for c in claims_of(kube_api, ref.namespace, TARGET)] == ["Bound", "Bound"],
    )
    headless = core.read_namespaced_service(TARGET, ref.namespace)
    assert headless.spec.cluster_ip == "None"
    assert headless.spec.selector == {STATEFULSET_LABEL: TARGET}
    eventually(
        "the headless Service to list the target's Pods",
        lambda: endpoint_pods(kube_api, ref.namespace, TARGET) == TARGET_PODS,
    )
    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == SOURCE_PODS, "no traffic reaches the target yet"
    assert heartbeats, "provision heartbeats while it waits"
    assert heartbeats[-1][0]["ready"] == heartbeats[-1][0]["desired"] == 2


def _labelled_source_and_other_services(kube_api: k8s.ApiClient, namespace: str) -> None:
    """orders-db with Pod labels beyond the stable Service's `app`, and Services selecting its Pods by them."""
    service, stateful_set = source_objects(replicas=2)
    stateful_set.spec.template.metadata.labels = {
        **SOURCE_LABELS,
        "tier": "database",
        "team": "payments",
        "owner": "dba",
    }
    core = k8s.CoreV1Api(kube_api)
    core.create_namespaced_service(namespace, service)
    k8s.AppsV1Api(kube_api).create_namespaced_stateful_set(namespace, stateful_set)
    for name, selector in OTHER_SERVICES.items():
        port = k8s.V1ServicePort(name="postgres", port=5432)
        other = k8s.V1Service(
            metadata=k8s.V1ObjectMeta(name=name), spec=k8s.V1ServiceSpec(selector=selector, ports=[port])
        )
        core.create_namespaced_service(namespace, other)
    eventually("the source to be Ready", lambda: ready_replicas(kube_api, namespace, SOURCE) == 2)
    for service, pods in ((READ_ONLY, SOURCE_PODS), (SOURCE, SOURCE_PODS), (FIRST_REPLICA, ["orders-db-0"])):
        eventually(
            f"{service} to list the source's Pods {pods}",
            lambda service=service, pods=pods: endpoint_pods(kube_api, namespace, service) == pods,
        )


def test_provision_gives_the_target_no_label_another_service_selects_the_sources_pods_by(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
) -> None:
    _labelled_source_and_other_services(kube_api, ref.namespace)

    activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))

    labels = k8s.AppsV1Api(kube_api).read_namespaced_stateful_set(TARGET, ref.namespace).spec.template.metadata.labels
    own = {STATEFULSET_LABEL: TARGET, MIGRATION_LABEL: MIGRATION, MIGRATION_UID_LABEL: ref.uid}
    assert labels == {**own, "owner": "dba"}, "app, tier and team select the source's Pods; billing-db selects others"
    eventually(
        "the target's Pods to be listed by their headless Service",
        lambda: endpoint_pods(kube_api, ref.namespace, TARGET) == TARGET_PODS,
    )
    assert endpoint_pods(kube_api, ref.namespace, READ_ONLY) == SOURCE_PODS, "no read-only traffic reaches the target"
    assert endpoint_pods(kube_api, ref.namespace, FIRST_REPLICA) == ["orders-db-0"], "nor the first replica's"
    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == SOURCE_PODS


def test_provision_run_again_changes_nothing(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    provisioned: ProvisionResult,
) -> None:
    apps = k8s.AppsV1Api(kube_api)
    before = apps.read_namespaced_stateful_set(TARGET, ref.namespace).metadata

    again = activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))

    assert again == provisioned
    after = apps.read_namespaced_stateful_set(TARGET, ref.namespace).metadata
    assert (after.uid, after.generation) == (before.uid, before.generation)


def test_provision_of_a_missing_source_fails_naming_spec_source_stateful_set(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
) -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.source\.statefulSet: 'orders-db' does not exist"):
        activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))

    assert absent(k8s.AppsV1Api(kube_api).read_namespaced_stateful_set, TARGET, ref.namespace)


def test_provision_refuses_to_take_over_a_stateful_set_it_did_not_create(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    apps = k8s.AppsV1Api(kube_api)
    theirs = apps.read_namespaced_stateful_set(SOURCE, ref.namespace)
    theirs.metadata = k8s.V1ObjectMeta(name=TARGET, labels={"team": "payments"})
    theirs.spec.replicas = 0
    theirs.status = None
    apps.create_namespaced_stateful_set(ref.namespace, theirs)

    with pytest.raises(InvalidSpec, match=r"spec\.target\.statefulSet: StatefulSet .* already exists"):
        activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))

    untouched = apps.read_namespaced_stateful_set(TARGET, ref.namespace)
    assert untouched.metadata.labels == {"team": "payments"}
    assert [c.image for c in untouched.spec.template.spec.containers] == ["postgres:15"]
    assert untouched.metadata.generation == 1


def test_provision_stops_waiting_when_the_activity_is_cancelled(
    activity_env: ActivityEnvironment,
    heartbeats: list[tuple[Any, ...]],
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    activity_env.cancel()

    with pytest.raises(CancelledError, match=r"StatefulSet .*/orders-db-16 Ready"):
        activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))

    assert len(heartbeats) == 1, "it stops at the first poll after the cancellation"


def test_provision_whose_pods_the_namespace_refuses_fails_saying_why_instead_of_waiting_out_its_timeout(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ResourceQuota the target's Pods exceed: the StatefulSet controller's creates are refused, which showed as a
    step running for its whole timeout, five times, then "activity StartToClose timeout"."""
    monkeypatch.setattr(provisioning, "LOOK_WHY_AFTER", 0.2)
    monkeypatch.setattr(provisioning, "REFUSAL_GRACE", 1.0)
    core = k8s.CoreV1Api(kube_api)
    pods = len(core.list_namespaced_pod(ref.namespace).items)
    quota = k8s.V1ResourceQuota(
        metadata=k8s.V1ObjectMeta(name="no-more-pods"), spec=k8s.V1ResourceQuotaSpec(hard={"pods": str(pods)})
    )
    core.create_namespaced_resource_quota(ref.namespace, quota)
    bound = threading.Timer(60, activity_env.cancel)  # waiting for ever fails the test (CancelledError), not hangs it
    bound.start()

    with pytest.raises(provisioning.TargetRefused) as refused:
        activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))
    bound.cancel()

    message = str(refused.value)
    assert f"the cluster refuses what StatefulSet {ref.namespace}/{TARGET} needs: create Pod {TARGET}-0" in message
    assert "no-more-pods" in message, "the quota is named"
    assert "ResourceQuota" in message


@pytest.mark.parametrize(
    ("secret", "host", "refused"),
    [
        pytest.param("orders-db-target", f"{SOURCE}-0.{SOURCE}", True, id="target-secret-names-the-source"),
        pytest.param(
            "orders-db-target", "billing-db-1.billing-db.{namespace}.svc", True, id="target-secret-names-another"
        ),
        pytest.param("orders-db-source", "billing-db-0.billing-db", True, id="source-secret-names-another"),
        pytest.param("orders-db-target", f"{TARGET}-0.{TARGET}", False, id="target-secret-names-the-target"),
        pytest.param("orders-db-source", f"{SOURCE}-0.{SOURCE}.{{namespace}}.svc.cluster.local", False, id="source"),
        pytest.param("orders-db-target", "billing-db-0.other-service", False, id="no-statefulset-under-that-service"),
        pytest.param("orders-db-target", "10.0.0.7", False, id="an-address-is-not-known-to-be-wrong"),
    ],
)
def test_the_check_of_the_cluster_refuses_a_database_secret_naming_a_pod_of_another_stateful_set(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
    secret: str,
    host: str,
    refused: bool,
) -> None:
    """A Secret copied from another Migration: ferry would restore into (or copy from) that StatefulSet's database,
    verify it, and send the clients to the target's own Pods, which hold none of it."""
    core, apps = k8s.CoreV1Api(kube_api), k8s.AppsV1Api(kube_api)
    other = k8s.V1StatefulSet(
        metadata=k8s.V1ObjectMeta(name="billing-db"),
        spec=k8s.V1StatefulSetSpec(
            service_name="billing-db", replicas=0, selector=k8s.V1LabelSelector(match_labels={"app": "billing-db"}),
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels={"app": "billing-db"}),
                spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="postgres", image="postgres:15")]),
            ),
        ),
    )  # fmt: skip
    apps.create_namespaced_stateful_set(ref.namespace, other)
    data = {"host": host.format(namespace=ref.namespace), "port": "5432", "username": "u", "password": "p",
            "database": "orders"}  # fmt: skip
    core.create_namespaced_secret(ref.namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=secret), string_data=data))

    if refused:
        with pytest.raises(InvalidSpec, match=r"a Pod of StatefulSet .*, not of .*Nothing changed"):
            activity_env.run(cluster.check_cluster, ProvisionInput(ref=ref, spec=spec))
    else:
        activity_env.run(cluster.check_cluster, ProvisionInput(ref=ref, spec=spec))


def test_undo_provision_removes_the_target_its_service_and_claims_and_leaves_the_source(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    provisioned: ProvisionResult,
) -> None:
    apps, core = k8s.AppsV1Api(kube_api), k8s.CoreV1Api(kube_api)
    someone_elses = k8s.V1PersistentVolumeClaim(
        metadata=k8s.V1ObjectMeta(name="keep-me", labels={STATEFULSET_LABEL: TARGET, MIGRATION_LABEL: "another"}),
        spec=k8s.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteOnce"], resources=k8s.V1VolumeResourceRequirements(requests={"storage": "1Gi"})
        ),
    )
    core.create_namespaced_persistent_volume_claim(ref.namespace, someone_elses)

    undo = UndoProvisionInput(ref=ref, stateful_set=TARGET)
    activity_env.run(cluster.undo_provision, undo)

    assert absent(apps.read_namespaced_stateful_set, TARGET, ref.namespace)
    assert absent(core.read_namespaced_service, TARGET, ref.namespace)
    assert claims_of(kube_api, ref.namespace, TARGET) == []
    assert core.list_namespaced_pod(ref.namespace, label_selector=f"{STATEFULSET_LABEL}={TARGET}").items == []
    assert core.read_namespaced_persistent_volume_claim("keep-me", ref.namespace).metadata.deletion_timestamp is None
    assert ready_replicas(kube_api, ref.namespace, SOURCE) == 2
    assert [c.metadata.name for c in claims_of(kube_api, ref.namespace, SOURCE)] == [
        "data-orders-db-0",
        "data-orders-db-1",
    ]
    assert endpoint_pods(kube_api, ref.namespace, SOURCE) == SOURCE_PODS

    activity_env.run(cluster.undo_provision, undo)  # a second run is harmless

    assert absent(apps.read_namespaced_stateful_set, TARGET, ref.namespace)
    assert ready_replicas(kube_api, ref.namespace, SOURCE) == 2


def test_provision_refuses_a_storage_class_that_does_not_exist_before_creating_anything(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    gold = spec.model_copy(update={"target": spec.target.model_copy(update={"storage_class_name": "gold"})})

    with pytest.raises(InvalidSpec) as refused:
        activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=gold))

    assert str(refused.value).startswith("spec.target.storageClassName: StorageClass 'gold' does not exist")
    assert "the cluster has fast, standard" in str(refused.value)
    assert absent(k8s.AppsV1Api(kube_api).read_namespaced_stateful_set, TARGET, ref.namespace)
    assert absent(k8s.CoreV1Api(kube_api).read_namespaced_service, TARGET, ref.namespace)
    assert claims_of(kube_api, ref.namespace, TARGET) == []


def test_provision_refuses_the_target_of_another_migration_with_the_same_name_and_changes_nothing(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    provisioned: ProvisionResult,
) -> None:
    before = target_objects(kube_api, ref.namespace, TARGET)
    applied_again = MigrationRef(namespace=ref.namespace, name=ref.name, uid=str(uuid.uuid4()))

    with pytest.raises(InvalidSpec) as refused:
        activity_env.run(cluster.provision, ProvisionInput(ref=applied_again, spec=spec))

    assert f"StatefulSet {ref.namespace}/{TARGET} already exists and belongs to another Migration" in str(refused.value)
    assert f"(uid {ref.uid})" in str(refused.value)
    assert "changed nothing" in str(refused.value)
    assert target_objects(kube_api, ref.namespace, TARGET) == before


def test_two_migrations_naming_one_target_at_the_same_moment_leave_it_to_the_first_that_creates_it(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    """Both pass their checks while the target does not exist yet; the second one's writes then find it made.

    The interleaving is injected: the second Migration's provision runs the first one's, whole,
    right after its own checks and before its first write (the moment two workers can meet).
    """
    other = MigrationRef(namespace=ref.namespace, name="orders-db-to-16-too", uid=str(uuid.uuid4()))
    checked = cluster._refuse_if_overtaken

    def first_migration_provisions_meanwhile(*args: Any) -> None:
        checked(*args)
        cluster._refuse_if_overtaken = checked  # type: ignore[method-assign]
        activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))

    cluster._refuse_if_overtaken = first_migration_provisions_meanwhile  # type: ignore[method-assign]

    with pytest.raises(InvalidSpec) as refused:
        activity_env.run(cluster.provision, ProvisionInput(ref=other, spec=spec))

    assert f"Service {ref.namespace}/{TARGET} already exists and belongs to another Migration" in str(refused.value)
    apps, core = k8s.AppsV1Api(kube_api), k8s.CoreV1Api(kube_api)
    for made in (
        apps.read_namespaced_stateful_set(TARGET, ref.namespace),
        core.read_namespaced_service(TARGET, ref.namespace),
    ):
        assert made.metadata.labels[MIGRATION_UID_LABEL] == ref.uid, "the first Migration's, untouched by the second"
    assert all(c.metadata.labels[MIGRATION_UID_LABEL] == ref.uid for c in claims_of(kube_api, ref.namespace, TARGET))


def test_a_migration_whose_source_is_the_target_of_one_that_may_still_roll_back_is_refused(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    spec: MigrationSpec,
    namespace: str,
    source: str,
    migration_crd: str,
    kubectl: Kubectl,
) -> None:
    """Until it has finished, or while its deletion may still roll it back, the first one's rollback can delete its
    target: the second one's source. Refused with nothing changed; accepted once the first is Succeeded for good."""
    custom = k8s.CustomObjectsApi(kube_api)
    first_ref = apply_migration(kubectl, namespace, samples.migration())
    activity_env.run(cluster.provision, ProvisionInput(ref=first_ref, spec=spec))
    activity_env.run(
        cluster.switch_traffic, SwitchTrafficInput(ref=first_ref, service=SOURCE, target_stateful_set=TARGET)
    )
    chained = MigrationSpec.model_validate(
        samples.migration(
            source={"statefulSet": TARGET, "service": SOURCE},
            target={"statefulSet": "orders-db-17", "image": "postgres:17", "storageSize": "2Gi"},
        )["spec"]
    )
    second = MigrationRef(namespace=namespace, name="orders-db-to-17", uid=str(uuid.uuid4()))

    for phase in (None, "Running", "AwaitingApproval", "RollingBack"):
        if phase is not None:
            set_phase(custom, namespace, first_ref.name, phase)
        with pytest.raises(InvalidSpec) as refused:
            activity_env.run(cluster.check_cluster, ProvisionInput(ref=second, spec=chained))
        assert (
            f"spec.source.statefulSet: StatefulSet {namespace}/{TARGET} is the target of Migration "
            f"{namespace}/{first_ref.name} (uid {first_ref.uid}), which has not finished "
            f"(phase {phase or 'not set yet'})"
        ) in str(refused.value)
        with pytest.raises(InvalidSpec, match="which has not finished"):
            activity_env.run(cluster.provision, ProvisionInput(ref=second, spec=chained))
        assert absent(k8s.AppsV1Api(kube_api).read_namespaced_stateful_set, "orders-db-17", namespace)

    set_phase(custom, namespace, first_ref.name, "Succeeded")
    activity_env.run(cluster.check_cluster, ProvisionInput(ref=second, spec=chained))

    delete_held(custom, namespace, first_ref.name)
    with pytest.raises(InvalidSpec, match=r"which is being deleted \(phase Succeeded\): a deletion asked for before"):
        activity_env.run(cluster.check_cluster, ProvisionInput(ref=second, spec=chained))
    # Its status shows when it succeeded: long before the deletion, which then undoes nothing.
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, first_ref.name, {"status": {"transitionedAt": "2026-01-01T00:00:00Z"}}
    )
    activity_env.run(cluster.check_cluster, ProvisionInput(ref=second, spec=chained))
    release(custom, namespace, first_ref.name)

    activity_env.run(cluster.provision, ProvisionInput(ref=second, spec=chained))
    made = k8s.AppsV1Api(kube_api).read_namespaced_stateful_set("orders-db-17", namespace)
    assert made.metadata.labels[MIGRATION_UID_LABEL] == second.uid
    assert made.spec.template.metadata.labels[MIGRATION_UID_LABEL] == second.uid, "not the first one's, from its source"
    assert {c.metadata.labels[MIGRATION_UID_LABEL] for c in claims_of(kube_api, namespace, "orders-db-17")} == {
        second.uid
    }


@pytest.mark.parametrize("selected", ["by the API server", "from a listing"])
def test_a_second_migration_of_a_source_one_created_before_it_still_moves_is_refused_until_that_one_has_finished(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    spec: MigrationSpec,
    namespace: str,
    source: str,
    migration_crd: str,
    kubectl: Kubectl,
    monkeypatch: pytest.MonkeyPatch,
    selected: str,
) -> None:
    """scale-down-old stops the source's whole server, and a rollback sends the clients back to it: a second Migration
    of that server (another database on it, or the same one to another target) would lose its source while it copies,
    and could not unfreeze it. The one created first goes on; the other is refused, with nothing changed, until the
    first can undo nothing more. A Migration of another source, or a dry run of the same, is no reason to refuse.

    Where the API server cannot select Migrations by their source (a CRD from before the field, Kubernetes 1.30
    without it), ferry lists them all, a page at a time, and picks them itself. That 400 is injected (a fake: the
    suite's CRD has the field), with pages of one Migration."""
    custom = k8s.CustomObjectsApi(kube_api)
    if selected == "from a listing":
        listing = cluster._custom.list_namespaced_custom_object

        def unselected(*args: Any, **options: Any) -> Any:
            if "field_selector" in options:
                raise ApiException(status=400, reason="Bad Request")
            return listing(*args, **options)

        monkeypatch.setattr(cluster._custom, "list_namespaced_custom_object", unselected)
        monkeypatch.setattr(provisioning, "MIGRATIONS_PAGE", 1)
    first = apply_migration(kubectl, namespace, samples.migration())
    planned = apply_migration(kubectl, namespace, samples.migration("orders-db-plan", dryRun=True))
    elsewhere = apply_migration(
        kubectl,
        namespace,
        samples.migration(
            "billing-db-to-16",
            source={"statefulSet": "billing-db", "service": "billing-db"},
            target={"statefulSet": "billing-db-16", "image": "postgres:16", "storageSize": "1Gi"},
        ),
    )
    created = datetime.datetime.fromisoformat(
        custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, first.name)["metadata"][
            "creationTimestamp"
        ]
    )
    # Creation times have whole seconds, and one of the same second as the first counts as created before it.
    eventually(
        "the clock to pass the second the first Migration was created in",
        lambda: datetime.datetime.now(datetime.UTC) >= created + datetime.timedelta(seconds=1),
    )
    other_database = samples.migration(
        "orders-archive-to-16",
        target={"statefulSet": "orders-archive-16", "image": "postgres:16", "storageSize": "2Gi"},
        driver={"type": "postgresql", "sourceSecret": "orders-archive-source", "targetSecret": "orders-archive-target"},
    )
    second = apply_migration(kubectl, namespace, other_database)
    second_spec = MigrationSpec.model_validate(other_database["spec"])
    for running in (elsewhere, planned):  # a dry run changes nothing, and this one is of another source
        set_phase(custom, namespace, running.name, "Running")

    # Created before the second, the first finds nothing in its way.
    activity_env.run(cluster.check_cluster, ProvisionInput(ref=first, spec=spec))
    for phase in (None, "Running", "Paused", "AwaitingApproval", "RollingBack"):
        if phase is not None:
            set_phase(custom, namespace, first.name, phase)
        with pytest.raises(InvalidSpec) as refused:
            activity_env.run(cluster.check_cluster, ProvisionInput(ref=second, spec=second_spec))
        assert (
            f"spec.source.statefulSet: StatefulSet {namespace}/{SOURCE} is the source of Migration "
            f"{namespace}/{first.name} (uid {first.uid}), created before this one, which has not finished "
            f"(phase {phase or 'not set yet'})"
        ) in str(refused.value)
        with pytest.raises(InvalidSpec, match="which has not finished"):
            activity_env.run(cluster.provision, ProvisionInput(ref=second, spec=second_spec))
        assert absent(k8s.AppsV1Api(kube_api).read_namespaced_stateful_set, "orders-archive-16", namespace)
        assert absent(k8s.CoreV1Api(kube_api).read_namespaced_service, "orders-archive-16", namespace)

    set_phase(custom, namespace, first.name, "Succeeded")
    activity_env.run(cluster.check_cluster, ProvisionInput(ref=second, spec=second_spec))
    delete_held(custom, namespace, first.name)
    with pytest.raises(InvalidSpec, match=r"which is being deleted \(phase Succeeded\): a deletion asked for before"):
        activity_env.run(cluster.check_cluster, ProvisionInput(ref=second, spec=second_spec))
    release(custom, namespace, first.name)

    activity_env.run(cluster.provision, ProvisionInput(ref=second, spec=second_spec))
    made = k8s.AppsV1Api(kube_api).read_namespaced_stateful_set("orders-archive-16", namespace)
    assert made.metadata.labels[MIGRATION_UID_LABEL] == second.uid


def test_provision_refuses_a_target_an_older_ferry_made_for_a_migration_of_the_same_name(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    provision_as_an_older_ferry(kube_api, ref, spec)
    before = target_objects(kube_api, ref.namespace, TARGET)

    with pytest.raises(InvalidSpec, match=r"belongs to an older ferry for a Migration named 'orders-db-to-16'"):
        activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))

    assert target_objects(kube_api, ref.namespace, TARGET) == before


def delete_held(custom: k8s.CustomObjectsApi, namespace: str, name: str) -> None:
    """Deletes a Migration that a finalizer of the test's keeps there, being deleted, until `release`."""
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"finalizers": ["example.com/hold"]}}
    )
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)


def release(custom: k8s.CustomObjectsApi, namespace: str, name: str) -> None:
    """Lets a Migration `delete_held` kept go, and waits until it is gone."""
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"finalizers": None}})
    eventually(
        f"Migration {name} to be gone",
        lambda: absent(
            lambda name, namespace: custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name),
            name,
            namespace,
        ),
    )


def set_phase(custom: k8s.CustomObjectsApi, namespace: str, name: str, phase: str) -> None:
    """Writes a Migration's phase, as its saga would."""
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, {"status": {"phase": phase}})
