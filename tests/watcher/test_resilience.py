"""The watcher survives what clusters do to it: a lost watch (410 Gone) and the death of a replica."""

from __future__ import annotations

import base64
import json
import shutil
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from temporalio.client import Client

from devstack.stack.install import Binaries
from devstack.stack.stack import Stack, StackInfo
from ferry.api.saga import MigrationRef
from tests.cluster import install_crd
from tests.conftest import CRD_MANIFEST, make_state_dir
from tests.end_to_end import eventually, migration_manifest
from tests.watcher.conftest import has_workflow


def _create(api: k8s.ApiClient, namespace: str, stack: StackInfo, name: str) -> MigrationRef:
    created = k8s.CustomObjectsApi(api).create_namespaced_custom_object(
        "ferry.dev", "v1alpha1", namespace, "migrations", migration_manifest(stack, "snapshots", name=name)
    )
    return MigrationRef(namespace=namespace, name=name, uid=created["metadata"]["uid"])


def _holder(api: k8s.ApiClient, namespace: str) -> str | None:
    try:
        lease = k8s.CoordinationV1Api(api).read_namespaced_lease("ferry-watcher", namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    holder: str | None = lease.spec.holder_identity
    return holder


async def test_a_standby_watcher_takes_over_when_the_active_one_dies(
    kube_api: k8s.ApiClient, migration_crd: str, namespace: str, stack: StackInfo, temporal_client: Client,
    watcher_process,  # type: ignore[no-untyped-def]
) -> None:  # fmt: skip
    first, second = watcher_process("alpha"), watcher_process("beta")
    first.start()
    await eventually("alpha to lead", lambda: _async(_holder(kube_api, namespace) == "alpha"), within=30)
    second.start()
    before = _create(kube_api, namespace, stack, "before-failover")
    await eventually("a workflow from alpha", lambda: has_workflow(temporal_client, before))
    await eventually("beta to stand by", lambda: _async("standing by" in second.log()), within=30)
    assert _holder(kube_api, namespace) == "alpha"

    first.kill()
    killed_at = time.monotonic()
    await eventually("beta to lead", lambda: _async(_holder(kube_api, namespace) == "beta"), within=30)
    takeover = time.monotonic() - killed_at

    after = _create(kube_api, namespace, stack, "after-failover")
    await eventually("a workflow from beta", lambda: has_workflow(temporal_client, after))
    # The lease lasts 4s; beta checks every 0.5s.
    assert takeover < 4 + 1 + 0.5
    second.signal(signal.SIGTERM)


async def _async(value: bool) -> bool:
    return value


@pytest.fixture
def own_cluster(binaries: Binaries) -> Iterator[tuple[Stack, StackInfo]]:
    """A Kubernetes control plane of this test's own, to restart and compact without disturbing others."""
    folder = make_state_dir("ferry-relist-")
    stack = Stack(folder, components=frozenset({"kubernetes"}), binaries=binaries)
    info = stack.start()
    install_crd([str(binaries.kubectl), f"--kubeconfig={info.kubeconfig}"], CRD_MANIFEST)
    yield stack, info
    stack.stop()
    shutil.rmtree(folder, ignore_errors=True)


def _compact_etcd(etcd_url: str) -> int:
    """Compacts etcd up to its current revision through its JSON gateway; returns that revision."""
    request = json.dumps({"key": base64.b64encode(b"/").decode()}).encode()
    with urllib.request.urlopen(f"{etcd_url}/v3/kv/range", data=request, timeout=5) as response:
        revision = int(json.loads(response.read())["header"]["revision"])
    compaction = json.dumps({"revision": str(revision), "physical": True}).encode()
    with urllib.request.urlopen(f"{etcd_url}/v3/kv/compaction", data=compaction, timeout=30):
        pass
    return revision


async def test_after_410_gone_the_watcher_relists_and_misses_nothing(
    own_cluster: tuple[Stack, StackInfo], stack: StackInfo, temporal_client: Client, binaries: Binaries,
    watcher_process, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:  # fmt: skip
    cluster, info = own_cluster
    assert info.kubeconfig is not None
    api = k8s_config.new_client_from_config(config_file=str(info.kubeconfig))
    namespace = "relist"
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    watcher = watcher_process(
        "relister", info.kubeconfig, f"--namespaces={namespace}", f"--lease-namespace={namespace}"
    )
    watcher.start()
    first = _create(api, namespace, stack, "first")
    await eventually("the first workflow", lambda: has_workflow(temporal_client, first))

    watcher.signal(signal.SIGSTOP)  # its watch connection stays open, holding an old resourceVersion
    meanwhile = [_create(api, namespace, stack, f"meanwhile-{index}") for index in range(5)]
    cluster.restart("kube-apiserver")  # from the main thread, as stack processes must be
    etcd_port = json.loads((cluster.state_dir / "ports.json").read_text())["etcd"]
    _compact_etcd(f"http://127.0.0.1:{etcd_port}")
    watcher.signal(signal.SIGCONT)

    await eventually("a relist after 410 Gone", lambda: _async("(410 Gone); relisting" in watcher.log()))
    for ref in meanwhile:
        await eventually(f"the workflow of {ref.name}", lambda ref=ref: has_workflow(temporal_client, ref))
    api.close()
