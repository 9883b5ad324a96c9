"""deploy/: what the real API server accepts, and what ferry's real CLI makes of the Deployments' settings.

The Migration CRD and the namespace ferry-system are applied for real first (a server-side
dry run of the namespace would not make it exist for the objects inside it); everything
else is applied with `--dry-run=server`, so the API server validates and admits each
object (schemas, CEL rules, Pod Security) without keeping it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from activities.secrets import DATABASE_KEYS, S3_KEYS
from ferry import rbac
from ferry.api.migration import MigrationSpec
from tests.conftest import Kubectl
from tests.deploy.files import DEPLOY, SYSTEM_NAMESPACE, documents, find, settings, subcommands, variables_read_by
from tests.deploy.monitoring import PROMETHEUS_RULE_CRD, SERVICE_MONITOR_CRD, installed

ALERT_METRICS = {
    "ferry_steps_total",
    "ferry_compensations_total",
    "ferry_migrations",
    "ferry_migration_step_started_timestamp_seconds",
    "ferry_deletion_pending_since_timestamp_seconds",
    "ferry_watcher_temporal_calls_total",
    "ferry_watcher_event_to_start_seconds",
    "ferry_status_patch_seconds",
}
"""The metrics the alerts may use: the contract with the worker and the watcher, listed atop alerts.yaml."""


def _dry_run(kubectl: Kubectl, *args: str) -> list[str]:
    """Server-side dry-run apply; returns kubectl's lines, one per object. Fails on an error or a warning."""
    result = kubectl("apply", "--server-side", "--dry-run=server", *args, check=False)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    return result.stdout.splitlines()


def _kustomized(kubectl: Kubectl, folder: Path) -> list[dict[str, Any]]:
    """The objects `kubectl apply -k folder` would send, as kustomize builds them."""
    built = kubectl("kustomize", str(folder)).stdout
    return [doc for doc in yaml.safe_load_all(built) if doc]


# --- the whole of deploy/ against the real API server --------------------------------------------


def test_deploy_applies_to_the_api_server_with_every_object(
    kubectl: Kubectl, migration_crd: str, ferry_system: str
) -> None:
    objects = _kustomized(kubectl, DEPLOY)

    applied = _dry_run(kubectl, "-k", str(DEPLOY))

    assert len(applied) == len(objects)
    assert all(line.endswith("serverside-applied (server dry run)") for line in applied), applied
    kinds = {(obj["kind"], obj["metadata"]["name"]) for obj in objects}
    assert {
        ("CustomResourceDefinition", "migrations.ferry.dev"),
        ("Namespace", SYSTEM_NAMESPACE),
        ("ConfigMap", "ferry-config"),
        ("Deployment", "ferry-worker"),
        ("Deployment", "ferry-watcher"),
        ("PodDisruptionBudget", "ferry-worker"),
        ("PodDisruptionBudget", "ferry-watcher"),
        ("ServiceAccount", "ferry-worker"),
        ("ServiceAccount", "ferry-watcher"),
        ("ClusterRole", "ferry-approver"),
        ("ClusterRole", "ferry-operator"),
        ("ValidatingAdmissionPolicy", "ferry-controls"),
        ("ValidatingAdmissionPolicyBinding", "ferry-controls"),
        ("ValidatingAdmissionPolicy", "ferry-plan"),
        ("ValidatingAdmissionPolicyBinding", "ferry-plan"),
        ("ValidatingAdmissionPolicy", "ferry-secrets"),
        ("ValidatingAdmissionPolicyBinding", "ferry-secrets"),
        ("ValidatingAdmissionPolicy", "ferry-named-objects"),
        ("ValidatingAdmissionPolicyBinding", "ferry-named-objects"),
        ("ConfigMap", "ferry-allowlists"),
    } <= kinds


def test_the_worker_reads_secrets_in_no_namespace_until_one_is_listed_and_the_list_is_ferry_rbacs_output() -> None:
    committed = DEPLOY / "rbac" / "worker_secrets.yaml"
    listed = sorted({doc["metadata"]["namespace"] for doc in documents(committed) if "namespace" in doc["metadata"]})
    roles = [doc for doc in documents(DEPLOY / "rbac") if "rules" in doc]

    assert listed == [], "deploy/ lists no namespace: each cluster names its own"
    assert committed.read_text() == rbac.manifest_yaml(listed), "run `make rbac SECRET_NAMESPACES=...`"
    assert not [
        role["metadata"]["name"] for role in roles if any("secrets" in rule["resources"] for rule in role["rules"])
    ]


def test_the_deployments_pass_the_restricted_pod_security_standard(
    kubectl: Kubectl, migration_crd: str, ferry_system: str
) -> None:
    labels = json.loads(kubectl("get", "namespace", ferry_system, "-o", "json").stdout)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"

    # The namespace warns about violations: _dry_run fails on any warning.
    _dry_run(kubectl, "-f", str(DEPLOY / "manager" / "worker.yaml"), "-f", str(DEPLOY / "manager" / "watcher.yaml"))


def test_the_sample_migration_and_its_secrets_apply_in_a_workload_namespace(
    kubectl: Kubectl, migration_crd: str, namespace: str
) -> None:
    applied = _dry_run(kubectl, "-n", namespace, "-k", str(DEPLOY / "samples"))

    assert len(applied) == 4
    assert any(line.startswith("migration.ferry.dev/orders-db-to-18 ") for line in applied), applied


def test_the_admission_policies_apply_with_their_bindings_and_allowlists(
    kubectl: Kubectl, migration_crd: str, ferry_system: str
) -> None:
    applied = _dry_run(kubectl, "-k", str(DEPLOY / "admission"))

    assert sorted(applied) == [
        "configmap/ferry-allowlists serverside-applied (server dry run)",
        "validatingadmissionpolicy.admissionregistration.k8s.io/ferry-controls serverside-applied (server dry run)",
        "validatingadmissionpolicy.admissionregistration.k8s.io/ferry-named-objects serverside-applied "
        "(server dry run)",
        "validatingadmissionpolicy.admissionregistration.k8s.io/ferry-plan serverside-applied (server dry run)",
        "validatingadmissionpolicy.admissionregistration.k8s.io/ferry-secrets serverside-applied (server dry run)",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/ferry-controls serverside-applied "
        "(server dry run)",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/ferry-named-objects serverside-applied "
        "(server dry run)",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/ferry-plan serverside-applied (server dry run)",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/ferry-secrets serverside-applied "
        "(server dry run)",
    ]


def test_the_finalizer_policy_applies_with_its_binding(kubectl: Kubectl, migration_crd: str) -> None:
    applied = _dry_run(kubectl, "-k", str(DEPLOY / "admission" / "finalizer"))

    assert sorted(applied) == [
        "mutatingadmissionpolicy.admissionregistration.k8s.io/ferry-finalizer serverside-applied (server dry run)",
        "mutatingadmissionpolicybinding.admissionregistration.k8s.io/ferry-finalizer serverside-applied "
        "(server dry run)",
    ]


def test_the_sample_secrets_have_the_keys_the_worker_reads_under_the_names_the_migration_gives() -> None:
    samples = documents(DEPLOY / "samples")
    migration = find(samples, "Migration", "orders-db-to-18")
    spec = MigrationSpec.model_validate(migration["spec"])

    for name, keys in (
        (spec.driver.source_secret, DATABASE_KEYS),
        (spec.driver.target_secret, DATABASE_KEYS),
        (spec.snapshot.credentials_secret, S3_KEYS),
    ):
        secret = find(samples, "Secret", name)
        assert set(secret["stringData"]) == set(keys), f"Secret {name}"


@pytest.fixture
def monitoring_crds(kubectl: Kubectl) -> Iterator[None]:
    with installed(kubectl, PROMETHEUS_RULE_CRD, SERVICE_MONITOR_CRD):
        yield


def test_the_alerts_and_their_scraping_apply_for_the_prometheus_operator(
    kubectl: Kubectl, ferry_system: str, monitoring_crds: None
) -> None:
    applied = _dry_run(kubectl, "-k", str(DEPLOY / "prometheus"))

    assert sorted(applied) == [
        "prometheusrule.monitoring.coreos.com/ferry serverside-applied (server dry run)",
        "service/ferry-metrics serverside-applied (server dry run)",
        "servicemonitor.monitoring.coreos.com/ferry serverside-applied (server dry run)",
    ]


def test_the_metrics_service_selects_both_components_on_their_metrics_port() -> None:
    monitoring = documents(DEPLOY / "prometheus")
    service = find(monitoring, "Service", "ferry-metrics")
    monitor = find(monitoring, "ServiceMonitor", "ferry")

    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [endpoint["port"] for endpoint in monitor["spec"]["endpoints"]] == ["metrics"]
    assert [port["targetPort"] for port in service["spec"]["ports"]] == ["metrics"]
    for component in ("worker", "watcher"):
        deployment = _deployment(f"ferry-{component}")
        assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        assert "metrics" in {port["name"] for port in _container(deployment)["ports"]}, component


# --- what the rules and the Deployments say, read against the code ------------------------------


def _rules() -> list[dict[str, Any]]:
    rule = find(documents(DEPLOY / "prometheus"), "PrometheusRule", "ferry")
    return [item for group in rule["spec"]["groups"] for item in group["rules"]]


def test_the_alerts_use_only_the_metrics_of_their_contract() -> None:
    used = set()
    for rule in _rules():
        for metric in re.findall(r"\bferry_[a-z_]+", rule["expr"]):
            used.add(re.sub(r"_(bucket|count|sum)$", "", metric))
    header = (DEPLOY / "prometheus" / "alerts.yaml").read_text().split("apiVersion:")[0]

    assert used == ALERT_METRICS
    for metric in ALERT_METRICS:
        assert metric in header, f"{metric} is not listed atop alerts.yaml"


def test_every_alert_has_a_severity_a_summary_a_description_and_balanced_expressions() -> None:
    rules = _rules()

    assert {rule["alert"] for rule in rules} >= {
        "FerryStepErrorRateHigh",
        "FerryMigrationStuckInStep",
        "FerryFinalizerPendingTooLong",
    }
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["annotations"]["description"], rule["alert"]
        expression = rule["expr"]
        for opening, closing in ("()", "[]", "{}"):
            assert expression.count(opening) == expression.count(closing), rule["alert"]


def _deployment(name: str) -> dict[str, Any]:
    return find(documents(DEPLOY / "manager"), "Deployment", name)


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = container
    return found


@pytest.mark.parametrize("component", ["worker", "watcher"])
def test_each_deployment_runs_its_ferry_subcommand_as_its_service_account(component: str) -> None:
    deployment = _deployment(f"ferry-{component}")
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    accounts = {doc["metadata"]["name"] for doc in documents(DEPLOY / "rbac") if doc["kind"] == "ServiceAccount"}

    assert container["args"][0] == component
    assert component in subcommands()
    assert pod["serviceAccountName"] == f"ferry-{component}"
    assert pod["serviceAccountName"] in accounts
    assert deployment["spec"]["replicas"] == 2


@pytest.mark.parametrize("component", ["worker", "watcher"])
def test_each_deployment_runs_non_root_on_a_read_only_root_without_capabilities(component: str) -> None:
    deployment = _deployment(f"ferry-{component}")
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    container_security = _container(deployment)["securityContext"]

    assert pod_security["runAsNonRoot"] is True
    assert container_security["readOnlyRootFilesystem"] is True
    assert container_security["allowPrivilegeEscalation"] is False
    assert container_security["capabilities"]["drop"] == ["ALL"]
    assert _container(deployment)["resources"]["limits"]["memory"]


@pytest.mark.parametrize("component", ["worker", "watcher"])
def test_each_deployment_keeps_a_replica_through_voluntary_disruptions(component: str) -> None:
    deployment = _deployment(f"ferry-{component}")
    budget = find(documents(DEPLOY / "manager"), "PodDisruptionBudget", f"ferry-{component}")

    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("component", ["worker", "watcher"])
def test_the_configmap_sets_only_variables_the_components_read(component: str) -> None:
    config = find(documents(DEPLOY / "manager"), "ConfigMap", "ferry-config")
    read_by_either = variables_read_by("worker") | variables_read_by("watcher")
    loaded = [source["configMapRef"]["name"] for source in _container(_deployment(f"ferry-{component}"))["envFrom"]]

    assert loaded == ["ferry-config"]
    assert set(config["data"]) <= read_by_either, set(config["data"]) - read_by_either
    assert config["data"]["FERRY_TASK_QUEUE"], "the worker and the watcher must agree on the task queue"


@pytest.mark.parametrize("component", ["worker", "watcher"])
def test_each_deployment_encrypts_with_the_keys_of_the_mounted_codec_secret(component: str) -> None:
    deployment = _deployment(f"ferry-{component}")
    container = _container(deployment)
    volumes = {volume["name"]: volume for volume in deployment["spec"]["template"]["spec"]["volumes"]}
    keys = {item["name"]: item.get("value") for item in container["env"]}["FERRY_CODEC_KEYS"]

    (mount,) = [mount for mount in container["volumeMounts"] if mount["mountPath"] == keys]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["secret"] == {"secretName": "ferry-codec-keys"}


def test_the_watchers_lease_is_the_one_in_its_own_namespace_that_its_role_allows() -> None:
    deployment = _deployment("ferry-watcher")
    container = _container(deployment)
    pod_name = "ferry-watcher-5d8f7-abcde"
    # Kubernetes expands $(VAR) in args from the container's env; the downward API fills these.
    downward = {"POD_NAMESPACE": deployment["metadata"]["namespace"], "POD_NAME": pod_name}
    declared = {
        item["name"]: item["valueFrom"]["fieldRef"]["fieldPath"] for item in container["env"] if "valueFrom" in item
    }
    args = [re.sub(r"\$\((\w+)\)", lambda match: downward[match.group(1)], arg) for arg in container["args"]]
    config = find(documents(DEPLOY / "manager"), "ConfigMap", "ferry-config")["data"]
    role = find(documents(DEPLOY / "rbac"), "Role", "ferry-watcher-leader-election")

    loaded = settings(args, config)

    assert declared == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    assert loaded.lease.namespace == SYSTEM_NAMESPACE == role["metadata"]["namespace"]
    assert loaded.lease.identity == pod_name
    named = [rule for rule in role["rules"] if rule.get("resourceNames")]
    assert [loaded.lease.name] == [name for rule in named for name in rule["resourceNames"]]


def test_the_worker_stops_its_activities_within_its_pods_termination_grace_period() -> None:
    """Past terminationGracePeriodSeconds the kubelet kills the worker: its activities would end without a word."""
    deployment = _deployment("ferry-worker")
    config = find(documents(DEPLOY / "manager"), "ConfigMap", "ferry-config")["data"]

    loaded = settings(_container(deployment)["args"], config)

    assert loaded.graceful_shutdown < deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
