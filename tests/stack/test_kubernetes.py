"""The local control plane behaves as a real cluster: CRD validation, controllers, scheduling, volumes."""

from __future__ import annotations

import os
import time
from pathlib import Path

from kubernetes import client as k8s

from devstack.stack.processes import GOGC
from devstack.stack.stack import StackInfo
from tests.cluster import crd_established, stack_process
from tests.conftest import Kubectl

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.stacktest.ferry.dev
spec:
  group: stacktest.ferry.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              required: [size]
              properties:
                size: {type: integer, minimum: 1, maximum: 10}
"""


def _widget(name: str, size: object) -> str:
    return f"""
apiVersion: stacktest.ferry.dev/v1
kind: Widget
metadata: {{name: {name}}}
spec: {{size: {size}}}
"""


def _apply_widget_crd(kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", stdin=WIDGET_CRD)
    crd = "widgets.stacktest.ferry.dev"
    crd_established(lambda: kubectl("get", f"crd/{crd}", "-o", "json").stdout, crd)


def test_kubectl_applies_a_crd_and_a_custom_resource(kubectl: Kubectl, namespace: str) -> None:
    _apply_widget_crd(kubectl)

    kubectl("apply", "-n", namespace, "-f", "-", stdin=_widget("small", 3))

    got = kubectl("get", "widget", "small", "-n", namespace, "-o", "jsonpath={.spec.size}")
    assert got.stdout == "3"


def test_api_server_rejects_a_custom_resource_violating_the_schema(kubectl: Kubectl, namespace: str) -> None:
    _apply_widget_crd(kubectl)

    rejected = kubectl("apply", "-n", namespace, "-f", "-", stdin=_widget("huge", 99), check=False)

    assert rejected.returncode != 0
    assert "spec.size" in rejected.stderr
    assert "should be less than or equal to 10" in rejected.stderr
    absent = kubectl("get", "widget", "huge", "-n", namespace, check=False)
    assert "NotFound" in absent.stderr


def test_statefulset_with_volume_claims_becomes_ready_without_help(kube_api: k8s.ApiClient, namespace: str) -> None:
    apps = k8s.AppsV1Api(kube_api)
    core = k8s.CoreV1Api(kube_api)
    labels = {"app": "db"}
    core.create_namespaced_service(
        namespace,
        k8s.V1Service(
            metadata=k8s.V1ObjectMeta(name="db"),
            spec=k8s.V1ServiceSpec(cluster_ip="None", selector=labels, ports=[k8s.V1ServicePort(port=5432)]),
        ),
    )
    apps.create_namespaced_stateful_set(
        namespace,
        k8s.V1StatefulSet(
            metadata=k8s.V1ObjectMeta(name="db"),
            spec=k8s.V1StatefulSetSpec(
                service_name="db",
                replicas=3,
                selector=k8s.V1LabelSelector(match_labels=labels),
                template=k8s.V1PodTemplateSpec(
                    metadata=k8s.V1ObjectMeta(labels=labels),
                    spec=k8s.V1PodSpec(
                        containers=[
                            k8s.V1Container(
                                name="postgres",
                                image="postgres:16",
                                volume_mounts=[k8s.V1VolumeMount(name="data", mount_path="/var/lib/postgresql")],
                            )
                        ]
                    ),
                ),
                volume_claim_templates=[
                    k8s.V1PersistentVolumeClaim(
                        metadata=k8s.V1ObjectMeta(name="data"),
                        spec=k8s.V1PersistentVolumeClaimSpec(
                            access_modes=["ReadWriteOnce"],
                            storage_class_name="fast",
                            resources=k8s.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
                        ),
                    )
                ],
            ),
        ),
    )

    deadline = time.monotonic() + 120
    ready = 0
    while time.monotonic() < deadline:
        ready = apps.read_namespaced_stateful_set_status("db", namespace).status.ready_replicas or 0
        if ready == 3:
            break
        time.sleep(0.5)

    assert ready == 3
    claims = core.list_namespaced_persistent_volume_claim(namespace).items
    assert sorted(c.metadata.name for c in claims) == ["data-db-0", "data-db-1", "data-db-2"]
    assert {c.status.phase for c in claims} == {"Bound"}
    pods = core.list_namespaced_pod(namespace).items
    assert {p.status.phase for p in pods} == {"Running"}
    assert all(p.spec.node_name for p in pods)


def test_the_stacks_go_programs_collect_garbage_less_often_than_gos_default(stack: StackInfo) -> None:
    """CPU, not memory, runs short on the stack's machine (devstack/stack/processes.py GOGC): its API server and etcd
    run with the stack's GOGC unless the environment set one."""
    wanted = os.environ.get("GOGC", GOGC)
    for program in ("kube-apiserver", "etcd"):
        environ = Path(f"/proc/{stack_process(stack, program)}/environ").read_bytes().split(b"\0")
        assert f"GOGC={wanted}".encode() in environ, program
