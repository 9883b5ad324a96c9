"""The Helm chart deploy/helm/ferry: it lints, the API server accepts it, and it renders what kustomize builds.

Equivalence is checked object by object on the whole of both renderings, labels and the
selectors made of them aside (the chart adds the release to them, so two releases do not
select each other's Pods): every RBAC rule, container argument, variable, port, probe,
security setting and disruption budget of the chart with its default values is the
kustomize manifests' own, so neither can change without the other.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.stack.install import Binaries
from ferry import rbac
from tests.conftest import Kubectl
from tests.deploy import rendering
from tests.deploy.conftest import Installation
from tests.deploy.files import DEPLOY, SYSTEM_NAMESPACE, find
from tests.deploy.monitoring import PROMETHEUS_RULE_CRD, SERVICE_MONITOR_CRD, installed

AS_DEPLOY = (
    "namespace.create=true", "prometheusRule.enabled=true", "serviceMonitor.enabled=true",
    "admission.finalizerAtCreate=true",
)  # fmt: skip
"""The chart's values that add what deploy/, deploy/prometheus and deploy/admission/finalizer hold beyond its
defaults."""
EVERYTHING = (*AS_DEPLOY, "grafanaDashboard.enabled=true", "worker.split.enabled=true")

RBAC_KINDS = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}

Key = tuple[str, str, str]
"""(kind, namespace, name) of an object."""


def _key(obj: dict[str, Any]) -> Key:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _selectors_hold(objects: list[dict[str, Any]]) -> None:
    """Within one rendering: each selector selects exactly what it is meant to."""
    deployments = {obj["metadata"]["name"]: obj["spec"] for obj in objects if obj["kind"] == "Deployment"}
    assert set(deployments) - {"ferry-worker-workflows"} == {"ferry-worker", "ferry-watcher"}, "split or not"
    for name, spec in deployments.items():
        selector = spec["selector"]["matchLabels"]
        assert selector.items() <= spec["template"]["metadata"]["labels"].items(), name
        for constraint in spec["template"]["spec"]["topologySpreadConstraints"]:
            assert constraint["labelSelector"]["matchLabels"] == selector, name
    for budget in (obj for obj in objects if obj["kind"] == "PodDisruptionBudget"):
        name = budget["metadata"]["name"]
        assert budget["spec"]["selector"]["matchLabels"] == deployments[name]["selector"]["matchLabels"], name
    for service in (obj for obj in objects if obj["kind"] == "Service"):
        for name, spec in deployments.items():
            assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items(), name
    for policy in (obj for obj in objects if obj["kind"] == "NetworkPolicy"):
        wanted = policy["spec"]["podSelector"]["matchLabels"].items()
        selected = [
            name for name, spec in deployments.items() if wanted <= spec["template"]["metadata"]["labels"].items()
        ]
        assert selected == [policy["metadata"]["name"]], policy["metadata"]["name"]
    for monitor in (obj for obj in objects if obj["kind"] == "ServiceMonitor"):
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        assert [obj for obj in objects if obj["kind"] == "Service" and wanted <= obj["metadata"]["labels"].items()]


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """An object without its labels, annotations and selectors (checked by _selectors_hold instead)."""
    obj = copy.deepcopy(obj)
    labels = obj["metadata"].pop("labels", {})
    obj["metadata"].pop("annotations", None)
    if obj["kind"] == "Namespace":
        obj["metadata"]["labels"] = {k: v for k, v in labels.items() if k.startswith("pod-security.kubernetes.io/")}
    spec = obj.get("spec", {})
    if obj["kind"] in {"Deployment", "PodDisruptionBudget", "Service", "ServiceMonitor"}:
        spec.pop("selector")
    if obj["kind"] == "NetworkPolicy":
        spec.pop("podSelector")
    if obj["kind"] == "Deployment":
        del spec["template"]["metadata"]
        for constraint in spec["template"]["spec"]["topologySpreadConstraints"]:
            del constraint["labelSelector"]
    return obj


def _by_key(objects: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    found = {_key(obj): _comparable(obj) for obj in objects}
    assert len(found) == len(objects), "two objects share a kind, namespace and name"
    return found


@pytest.fixture(scope="module")
def kustomize_objects(binaries: Binaries) -> list[dict[str, Any]]:
    return [
        *rendering.kustomized(binaries.kubectl),
        *rendering.kustomized(binaries.kubectl, DEPLOY / "prometheus"),
        *rendering.kustomized(binaries.kubectl, DEPLOY / "admission" / "finalizer"),
    ]


@pytest.fixture(scope="module")
def chart_objects(helm: Path) -> list[dict[str, Any]]:
    return rendering.parse(rendering.helm_template(helm, "ferry", SYSTEM_NAMESPACE, *AS_DEPLOY))


def test_the_chart_passes_helm_lint_strictly(helm: Path) -> None:
    for values in ((), EVERYTHING):
        sets = [arg for value in values for arg in ("--set", value)]
        linted = rendering.run_tool(helm, "lint", "--strict", rendering.CHART, *sets)

        assert "1 chart(s) linted, 0 chart(s) failed" in linted


def test_the_chart_renders_every_object_kustomize_builds_and_no_other(
    kustomize_objects: list[dict[str, Any]], chart_objects: list[dict[str, Any]]
) -> None:
    assert sorted(_by_key(chart_objects)) == sorted(_by_key(kustomize_objects))


def test_every_object_of_the_chart_is_the_kustomize_one_apart_from_labels_and_selectors(
    kustomize_objects: list[dict[str, Any]], chart_objects: list[dict[str, Any]]
) -> None:
    _selectors_hold(kustomize_objects)
    _selectors_hold(chart_objects)
    built, rendered = _by_key(kustomize_objects), _by_key(chart_objects)

    different = [
        f"{' '.join(key)}:\n--- kustomize\n{yaml.safe_dump(built[key])}--- chart\n{yaml.safe_dump(rendered[key])}"
        for key in sorted(built.keys() & rendered.keys())
        if built[key] != rendered[key]
    ]
    assert not different, "\n".join(different)


def test_the_crd_alerts_and_dashboard_of_the_chart_are_the_files_of_deploy() -> None:
    # Links, not copies: `helm package` stores their targets' contents.
    for link, target in (
        ("crds/migrations.ferry.dev.yaml", DEPLOY / "crd" / "migrations.ferry.dev.yaml"),
        ("files/alerts.yaml", DEPLOY / "prometheus" / "alerts.yaml"),
        ("files/ferry.json", DEPLOY / "grafana" / "ferry.json"),
    ):
        assert (rendering.CHART / link).resolve() == target.resolve(), link


def test_the_dashboard_configmap_holds_the_dashboard(helm: Path) -> None:
    objects = rendering.parse(rendering.helm_template(helm, "ferry", SYSTEM_NAMESPACE, "grafanaDashboard.enabled=true"))
    (config,) = [obj for obj in objects if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == "ferry-dashboard"]

    assert json.loads(config["data"]["ferry.json"]) == json.loads((DEPLOY / "grafana" / "ferry.json").read_text())
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"


def _secret_grants(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = (rbac.NAME, rbac.WATCHER_NAME)
    return [obj for obj in objects if obj["kind"] in RBAC_KINDS and obj["metadata"]["name"] in names]


@pytest.mark.parametrize(
    ("values", "namespaces", "access"),
    [
        ((), [], rbac.SecretAccess.NAMESPACES),
        (("worker.secretNamespaces={shop,billing}",), ["shop", "billing"], rbac.SecretAccess.NAMESPACES),
        (("worker.secretAccess=cluster",), [], rbac.SecretAccess.CLUSTER),
    ],
    ids=["none-by-default", "listed-namespaces", "cluster-when-asked"],
)
def test_the_chart_grants_secrets_where_ferry_rbac_does_from_the_same_list(
    helm: Path, values: tuple[str, ...], namespaces: list[str], access: rbac.SecretAccess
) -> None:
    rendered = _secret_grants(rendering.parse(rendering.helm_template(helm, "ferry", SYSTEM_NAMESPACE, *values)))
    generated = rbac.objects(namespaces, access, SYSTEM_NAMESPACE)

    assert _by_key(rendered) == _by_key(generated)
    subjects = [grant["subjects"] for grant in rendered if grant["kind"].endswith("Binding")]
    accounts = [
        [{"kind": "ServiceAccount", "name": account, "namespace": SYSTEM_NAMESPACE}]
        for account in ("ferry-worker", "ferry-watcher")
        for _ in range(1 if access is rbac.SecretAccess.CLUSTER else len(namespaces))
    ]
    assert subjects == accounts


def test_a_secret_access_other_than_namespaces_or_cluster_stops_the_chart(helm: Path) -> None:
    result = subprocess.run(
        [str(helm), "template", "ferry", str(rendering.CHART), "--set", "worker.secretAccess=everywhere"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert result.returncode != 0
    assert 'worker.secretAccess is "everywhere": it is namespaces' in result.stderr


def test_the_network_policies_follow_their_values_and_go_when_disabled(helm: Path) -> None:
    def policies(*values: str) -> dict[str, dict[str, Any]]:
        objects = rendering.parse(rendering.helm_template(helm, "ferry", SYSTEM_NAMESPACE, *values))
        return {obj["metadata"]["name"]: obj["spec"] for obj in objects if obj["kind"] == "NetworkPolicy"}

    changed = policies(
        "networkPolicy.databases.ports={6432}",
        "networkPolicy.databases.to[0].ipBlock.cidr=10.20.0.0/16",
        "networkPolicy.ingressFrom[0].namespaceSelector.matchLabels.team=monitoring",
    )

    assert policies("networkPolicy.enabled=false") == {}
    assert {"ports": [{"port": 6432, "protocol": "TCP"}], "to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}]} in changed[
        "ferry-worker"
    ]["egress"]
    assert all(5432 not in [port["port"] for port in rule["ports"]] for rule in changed["ferry-worker"]["egress"])
    for spec in changed.values():
        assert spec["ingress"][0]["from"] == [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]


def test_a_split_worker_is_two_deployments_one_for_the_steps_one_for_the_saga_with_no_data_egress(
    helm: Path,
) -> None:
    objects = rendering.parse(rendering.helm_template(helm, "ferry", SYSTEM_NAMESPACE, "worker.split.enabled=true"))

    def runs(component: str) -> list[str]:
        (container,) = rendering.deployment(objects, component)["spec"]["template"]["spec"]["containers"]
        return [variable["value"] for variable in container.get("env", []) if variable["name"] == "FERRY_RUNS"]

    def egress_ports(name: str) -> set[int]:
        (policy,) = [obj for obj in objects if obj["kind"] == "NetworkPolicy" and obj["metadata"]["name"] == name]
        return {port["port"] for rule in policy["spec"]["egress"] for port in rule["ports"]}

    assert (runs("worker"), runs("worker-workflows")) == (["activities"], ["workflows"])
    assert rendering.service_account(objects, "worker-workflows") == rendering.service_account(objects, "worker")
    assert rendering.deployment(objects, "worker-workflows")["spec"]["replicas"] == 2
    assert {5432, 443} <= egress_ports("ferry-worker"), "the steps reach the databases and S3"
    assert 5432 not in egress_ports("ferry-worker-workflows"), "the saga's side moves no data"
    budgets = {obj["metadata"]["name"] for obj in objects if obj["kind"] == "PodDisruptionBudget"}
    assert budgets == {"ferry-worker", "ferry-worker-workflows", "ferry-watcher"}
    _selectors_hold(objects)


def test_another_lease_name_changes_the_watchers_flag_and_its_role_together(helm: Path) -> None:
    objects = rendering.parse(rendering.helm_template(helm, "ops", "ops", "watcher.leaseName=ops-leader"))
    (role,) = [obj for obj in objects if obj["kind"] == "Role"]
    allowed = [name for rule in role["rules"] for name in rule.get("resourceNames", [])]

    assert rendering.lease_name(objects) == "ops-leader"
    assert allowed == ["ops-leader"]
    assert rendering.service_account(objects, "watcher") == "ops-ferry-watcher"


def test_the_secrets_policy_names_the_service_accounts_the_charts_deployments_run_as(helm: Path) -> None:
    """For any release and namespace: a policy naming other accounts would leave ferry's patch on Secrets unlimited."""
    objects = rendering.parse(rendering.helm_template(helm, "ops", "platform"))
    policy = find(objects, "ValidatingAdmissionPolicy", "ops-ferry-secrets")
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "ops-ferry-secrets")
    (condition,) = policy["spec"]["matchConditions"]

    named = sorted(re.findall(r"'([^']*)'", condition["expression"]))
    accounts = [
        f"system:serviceaccount:platform:{rendering.service_account(objects, c)}" for c in ("watcher", "worker")
    ]
    assert named == accounts == ["system:serviceaccount:platform:ops-ferry-watcher",
                                 "system:serviceaccount:platform:ops-ferry-worker"]  # fmt: skip
    assert binding["spec"]["policyName"] == "ops-ferry-secrets"


@pytest.fixture
def monitoring_crds(kubectl: Kubectl) -> Iterator[None]:
    with installed(kubectl, PROMETHEUS_RULE_CRD, SERVICE_MONITOR_CRD):
        yield


def test_everything_the_chart_renders_applies_to_the_api_server(
    helm: Path, kubectl: Kubectl, migration_crd: str, ferry_system: str, monitoring_crds: None
) -> None:
    rendered = rendering.helm_template(helm, "ferry", SYSTEM_NAMESPACE, *EVERYTHING)

    # ferry-system warns about Pod Security violations, and a warning fails the apply here.
    result = kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", stdin=rendered, check=False)

    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    applied = result.stdout.splitlines()
    assert len(applied) == len(rendering.parse(rendered))
    assert all(line.endswith("serverside-applied (server dry run)") for line in applied), applied


@pytest.mark.parametrize("component", ["worker", "watcher"])
def test_the_charts_service_accounts_may_do_exactly_what_those_of_deploy_may(
    kubectl: Kubectl, kustomize_installation: Installation, helm_installation: Installation, component: str
) -> None:
    def allowed(installation: Installation, namespace: str) -> list[str]:
        """What the API server's RBAC lets the account do in a namespace, its own Lease's name made generic."""
        account = f"system:serviceaccount:{installation.namespace}:{installation.service_account(component)}"
        listed = kubectl("auth", "can-i", "--list", "-n", namespace, f"--as={account}").stdout
        return sorted(" ".join(line.replace(installation.lease, "LEASE").split()) for line in listed.splitlines())

    # In a workload's namespace, and in the one the components run in (the Lease).
    assert allowed(helm_installation, "shop") == allowed(kustomize_installation, "shop")
    assert allowed(helm_installation, helm_installation.namespace) == allowed(
        kustomize_installation, kustomize_installation.namespace
    )
    assert any("migrations.ferry.dev" in line for line in allowed(helm_installation, "shop"))


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _documented(lines: list[str], number: int) -> bool:
    """A key is documented by a comment right above it (or above the run of keys it closes) or by its parent's."""
    indent, above = _indent(lines[number]), number - 1
    while above >= 0 and lines[above].strip() and not lines[above].lstrip().startswith("#"):
        if _indent(lines[above]) != indent:
            break
        above -= 1
    if above >= 0 and lines[above].lstrip().startswith("#") and _indent(lines[above]) == indent:
        return True
    parents = [
        i for i in range(number - 1, -1, -1)
        if lines[i].strip() and not lines[i].lstrip().startswith("#") and _indent(lines[i]) < indent
    ]  # fmt: skip
    return bool(parents) and _documented(lines, parents[0])


def test_every_value_is_documented_in_values_yaml() -> None:
    lines = (rendering.CHART / "values.yaml").read_text().splitlines()

    # Leaves only (a key with its value on its line): a group is documented by its leaves or its own comment.
    undocumented = [
        line.strip() for number, line in enumerate(lines)
        if line.strip() and not line.lstrip().startswith(("#", "-")) and line.split(":", 1)[1].strip()
        and not _documented(lines, number)
    ]  # fmt: skip

    assert not undocumented, undocumented
