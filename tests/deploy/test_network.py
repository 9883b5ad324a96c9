"""deploy/network: each component reaches only what it calls, and takes connections only on its probe and metrics ports.

The stack's cluster enforces no NetworkPolicy (kwok runs no network plugin), so these
tests check what enforcement would act on: that each policy selects exactly its
component's Pods, the ports and peers of its rules against the Deployments and the
settings, and that the real API server accepts them (a server-side dry run).
"""

from __future__ import annotations

from typing import Any

import pytest

from devstack.stack.install import Binaries
from tests.conftest import Kubectl
from tests.deploy import rendering
from tests.deploy.files import DEPLOY, SYSTEM_NAMESPACE, documents, find

COMPONENTS = ("worker", "watcher")
Port = tuple[str, int | str]
"""(protocol, port) of a rule: a number, or the name of a container's port."""

DNS: set[Port] = {("UDP", 53), ("TCP", 53)}
API_SERVER: set[Port] = {("TCP", 443), ("TCP", 6443)}
TEMPORAL: set[Port] = {("TCP", 7233)}
DATABASES: set[Port] = {("TCP", 5432)}
S3: set[Port] = {("TCP", 443), ("TCP", 9000)}


@pytest.fixture(scope="module")
def deployed(binaries: Binaries) -> list[dict[str, Any]]:
    """Everything `kubectl apply -k deploy/` sends."""
    return rendering.kustomized(binaries.kubectl)


def _policy(objects: list[dict[str, Any]], component: str) -> dict[str, Any]:
    return find(objects, "NetworkPolicy", f"ferry-{component}")


def _ports(rule: dict[str, Any]) -> set[Port]:
    return {(port["protocol"], port["port"]) for port in rule["ports"]}


def _rule_to(policy: dict[str, Any], ports: set[Port]) -> dict[str, Any]:
    (rule,) = [rule for rule in policy["spec"]["egress"] if _ports(rule) == ports]
    found: dict[str, Any] = rule
    return found


def _selects(selector: dict[str, Any], deployment: dict[str, Any]) -> bool:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return bool(selector["matchLabels"].items() <= labels.items()) and not selector.get("matchExpressions")


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_component_has_a_policy_for_both_directions_that_selects_its_pods_and_no_others(
    deployed: list[dict[str, Any]], component: str
) -> None:
    policy = _policy(deployed, component)
    deployments = {name: find(deployed, "Deployment", f"ferry-{name}") for name in COMPONENTS}

    assert policy["metadata"]["namespace"] == deployments[component]["metadata"]["namespace"] == SYSTEM_NAMESPACE
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert {
        name for name, deployment in deployments.items() if _selects(policy["spec"]["podSelector"], deployment)
    } == {component}


@pytest.mark.parametrize("component", COMPONENTS)
def test_only_the_probe_and_metrics_ports_of_each_component_take_connections(
    deployed: list[dict[str, Any]], component: str
) -> None:
    (rule,) = _policy(deployed, component)["spec"]["ingress"]
    (container,) = find(deployed, "Deployment", f"ferry-{component}")["spec"]["template"]["spec"]["containers"]
    probes = {container["livenessProbe"]["httpGet"]["port"], container["readinessProbe"]["httpGet"]["port"]}

    assert _ports(rule) == {("TCP", "health"), ("TCP", "metrics")}
    assert {port["name"] for port in container["ports"]} == {"health", "metrics"}
    assert probes == {"health"}


def test_the_worker_reaches_dns_temporal_the_api_server_the_databases_and_s3_and_nothing_else(
    deployed: list[dict[str, Any]],
) -> None:
    policy = _policy(deployed, "worker")

    reachable = set().union(*(_ports(rule) for rule in policy["spec"]["egress"]))
    assert reachable == DNS | TEMPORAL | API_SERVER | DATABASES | S3
    # PostgreSQL in any namespace: Pods of every namespace, and no address outside the cluster.
    assert _rule_to(policy, DATABASES)["to"] == [{"namespaceSelector": {}}]


def test_the_watcher_reaches_dns_temporal_and_the_api_server_and_no_database_or_bucket(
    deployed: list[dict[str, Any]],
) -> None:
    policy = _policy(deployed, "watcher")

    reachable = set().union(*(_ports(rule) for rule in policy["spec"]["egress"]))
    assert reachable == DNS | TEMPORAL | API_SERVER


@pytest.mark.parametrize("component", COMPONENTS)
def test_temporal_is_reached_where_the_settings_say_it_is(deployed: list[dict[str, Any]], component: str) -> None:
    address = find(documents(DEPLOY / "manager"), "ConfigMap", "ferry-config")["data"]["FERRY_TEMPORAL_ADDRESS"]
    host, _, port = address.rpartition(":")
    service_namespace = host.split(".")[1]  # <service>.<namespace>.svc.cluster.local

    temporal: set[Port] = {("TCP", int(port))}
    rule = _rule_to(_policy(deployed, component), temporal)

    assert rule["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": service_namespace}}}]


def test_the_api_server_accepts_the_policies(kubectl: Kubectl, ferry_system: str) -> None:
    result = kubectl("apply", "--server-side", "--dry-run=server", "-k", str(DEPLOY / "network"), check=False)

    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "networkpolicy.networking.k8s.io/ferry-watcher serverside-applied (server dry run)",
        "networkpolicy.networking.k8s.io/ferry-worker serverside-applied (server dry run)",
    ]
