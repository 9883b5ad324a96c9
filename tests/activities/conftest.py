"""Fixtures of the activity tests: a real source StatefulSet and Service, and activities wired to the stack.

Activities run through Temporal's ActivityEnvironment, which gives them an activity
context (heartbeats, cancellation, logger) without a worker; everything they touch is
the session stack's real API server, controllers and kwok node.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.testing import ActivityEnvironment

from activities.cluster import ClusterActivities
from activities.settings import KubeActivitySettings
from ferry.api.migration import MigrationSpec
from ferry.api.saga import MigrationRef, ProvisionInput, ProvisionResult
from tests import samples
from tests.cluster import create_source

TARGET = "orders-db-16"
TARGET_PODS = ["orders-db-16-0", "orders-db-16-1"]
MIGRATION = "orders-db-to-16"
UI_URL = "http://temporal-ui.example:8233"


@pytest.fixture
def settings() -> KubeActivitySettings:
    return KubeActivitySettings(poll_interval=0.2, temporal_ui_url=UI_URL, reporting_instance="test-worker")


@pytest.fixture
def heartbeats() -> list[tuple[Any, ...]]:
    """Every heartbeat the activities under test sent, in order."""
    return []


@pytest.fixture
def activity_env(heartbeats: list[tuple[Any, ...]]) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: heartbeats.append(details)
    return env


@pytest.fixture
def cluster(kube_api: k8s.ApiClient, settings: KubeActivitySettings) -> ClusterActivities:
    return ClusterActivities(kube_api, settings)


@pytest.fixture
def ref(namespace: str) -> MigrationRef:
    return MigrationRef(namespace=namespace, name=MIGRATION, uid=str(uuid.uuid4()))


@pytest.fixture
def spec() -> MigrationSpec:
    target = {
        "statefulSet": TARGET,
        "image": "postgres:16",
        "replicas": 2,
        "storageClassName": "fast",
        "storageSize": "2Gi",
    }
    return MigrationSpec.model_validate(samples.migration(target=target)["spec"])


@pytest.fixture
def source(kube_api: k8s.ApiClient, namespace: str) -> str:
    """orders-db: two Ready postgres:15 replicas on 1Gi "standard" volumes, behind the stable Service orders-db."""
    return create_source(kube_api, namespace)


@pytest.fixture
def provisioned(
    activity_env: ActivityEnvironment, cluster: ClusterActivities, ref: MigrationRef, spec: MigrationSpec, source: str
) -> ProvisionResult:
    """The target, provisioned by the activity under test and Ready."""
    return activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=spec))
