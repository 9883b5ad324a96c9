"""`kubectl ferry logs`: the lines of the worker's log that name a Migration's workflow, read through the API.

The worker logs JSON lines carrying `workflow_id` (ferry/observability/logs.py), so the
lines about one Migration are those naming its workflow ID. Worker Pods are found by the
labels of deploy/manager/worker.yaml; a worker run elsewhere (`ferry worker` on a host,
`make up`) logs where it runs, which the error says.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from ferry.kubectl.cluster import Cluster
from ferry.kubectl.errors import PluginError

WORKER_SELECTOR = "app.kubernetes.io/name=ferry,app.kubernetes.io/component=worker"
"""The worker Deployment's Pod labels (deploy/manager/worker.yaml)."""
WORKER_NAMESPACE = "ferry-system"
"""Where deploy/ puts the worker: looked in when listing Pods of every namespace is not allowed."""
WORKER_CONTAINER = "worker"


@dataclasses.dataclass(frozen=True)
class WorkerPods:
    """Where to look for the worker's Pods."""

    namespace: str | None = None
    """Only this namespace; None: every namespace (else ferry-system when that is not allowed)."""
    selector: str = WORKER_SELECTOR
    container: str = WORKER_CONTAINER


def nowhere(where: WorkerPods) -> str:
    place = f"namespace {where.namespace}" if where.namespace else "any namespace"
    return (
        f"no ferry worker Pod ({where.selector}) in {place}: the worker logs where it runs, e.g. the standard "
        "error of `ferry worker`, or .ferry/stack/logs/ferry.log under `make up`; pass --worker-namespace or "
        "--worker-selector if your worker Pods are elsewhere"
    )


def find_pods(cluster: Cluster, where: WorkerPods) -> list[k8s.V1Pod]:
    core = k8s.CoreV1Api(cluster.api)
    if where.namespace is not None:
        listed = cluster.call(
            f"Pods in namespace {where.namespace}", core.list_namespaced_pod, where.namespace,
            label_selector=where.selector,
        )  # fmt: skip
    else:
        try:
            listed = cluster.call("Pods", core.list_pod_for_all_namespaces, label_selector=where.selector)
        except PluginError:
            listed = cluster.call(
                f"Pods in namespace {WORKER_NAMESPACE}", core.list_namespaced_pod, WORKER_NAMESPACE,
                label_selector=where.selector,
            )  # fmt: skip
    pods: list[k8s.V1Pod] = sorted(listed.items, key=lambda pod: (pod.metadata.namespace, pod.metadata.name))
    return pods


def matching(text: str, workflow_id: str) -> Iterator[str]:
    """The lines of a log that name the workflow."""
    return (line for line in text.splitlines() if workflow_id in line)


def lines(cluster: Cluster, where: WorkerPods, workflow_id: str, tail: int | None) -> Iterator[str]:
    """Every line of the worker Pods' logs naming the workflow, prefixed by its Pod when there are several."""
    pods = find_pods(cluster, where)
    if not pods:
        raise PluginError(nowhere(where))
    core = k8s.CoreV1Api(cluster.api)
    read = 0
    for pod in pods:
        namespace, name = pod.metadata.namespace, pod.metadata.name
        try:
            text = core.read_namespaced_pod_log(name, namespace, container=where.container, tail_lines=tail)
        except ApiException as error:
            print(f"warning: cannot read the log of pod {namespace}/{name}: {error.status} {error.reason}",
                  file=sys.stderr)  # fmt: skip
            continue
        read += 1
        prefix = f"[pod/{name}] " if len(pods) > 1 else ""
        for line in matching(text or "", workflow_id):
            yield prefix + line
    if not read:
        raise PluginError(f"no worker Pod's log could be read ({len(pods)} found): {nowhere(where)}")
