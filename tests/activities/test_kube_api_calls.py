"""Calls to the Kubernetes API are bounded in time, and the API server's refusals end a step as one sentence."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import watch
from temporalio.testing import ActivityEnvironment

from activities.cluster import ClusterActivities
from activities.settings import KubeActivitySettings
from devstack.stack.stack import StackInfo
from ferry.api.errors import InvalidSpec
from ferry.api.migration import MigrationSpec, ResourceRequirements
from ferry.api.saga import MigrationRef, ProvisionInput
from ferry.clients import kubernetes_client
from ferry.kube_requests import RequestTimeouts
from tests.activities.cluster_state import absent
from tests.activities.conftest import TARGET


def test_a_request_the_api_server_refuses_ends_provision_as_one_sentence_and_creates_nothing(
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    cluster: ClusterActivities,
    ref: MigrationRef,
    spec: MigrationSpec,
    source: str,
) -> None:
    # The CRD cannot know that requests above limits make an invalid Pod template: the API server says so (422).
    resources = ResourceRequirements(requests={"cpu": "2"}, limits={"cpu": "1"})
    invalid = spec.model_copy(update={"target": spec.target.model_copy(update={"resources": resources})})

    with pytest.raises(InvalidSpec) as refused:
        activity_env.run(cluster.provision, ProvisionInput(ref=ref, spec=invalid))

    message = str(refused.value)
    assert message.startswith(f"the Kubernetes API server refused what ferry asked for Migration {ref}: ")
    assert "must be less than or equal to cpu limit" in message
    # The field's path stays; the value the server quotes is withheld (a refused value may be anyone's data).
    assert '.resources.requests: Invalid value: "…": must be less than or equal to cpu limit' in message
    assert message.endswith(f"then delete Migration {ref} and create it again.")
    assert "\n" not in message
    assert "HTTP response headers" not in message
    assert absent(k8s.AppsV1Api(kube_api).read_namespaced_stateful_set, TARGET, ref.namespace)
    assert absent(k8s.CoreV1Api(kube_api).read_namespaced_service, TARGET, ref.namespace), "checked before writing"


class SilentServer:
    """An "API server" that accepts connections and never answers: it holds them, like a hung one, or drops them.

    It counts the connections it got: one per request sent, since none is answered.
    """

    def __init__(self, tmp_path: Path, *, drop: bool = False) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._drop = drop
        self._held: list[socket.socket] = []
        self.connections = 0
        host, port = self._listener.getsockname()
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "silent", "cluster": {"server": f"http://{host}:{port}"}}],
            "users": [{"name": "nobody", "user": {"token": "unused"}}],
            "contexts": [{"name": "silent", "context": {"cluster": "silent", "user": "nobody"}}],
            "current-context": "silent",
        }
        self.kubeconfig = tmp_path / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # the listener closed at the test's end
            while True:
                connection, _ = self._listener.accept()
                self.connections += 1
                if self._drop:
                    connection.recv(65536)  # the request, then the connection closes without an answer
                    connection.close()
                else:
                    self._held.append(connection)

    def wait_for_a_connection(self) -> None:
        """Until the accepting thread has counted the connection the client made (it may lag on a busy machine)."""
        deadline = time.monotonic() + 30
        while self.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self._listener.close()
        for connection in self._held:
            connection.close()


@pytest.fixture
def silent_server(tmp_path: Path) -> Iterator[SilentServer]:
    server = SilentServer(tmp_path)
    try:
        yield server
    finally:
        server.close()


def test_a_read_from_an_api_server_that_never_answers_fails_after_one_read_timeout_not_four(
    silent_server: SilentServer,
) -> None:
    # urllib3 by default asks again three times after a read timeout: two minutes at the 30 s default, longer
    # than an activity's heartbeat timeout. ferry's clients give up after the first.
    with (
        contextlib.closing(kubernetes_client(silent_server.kubeconfig, timeouts=RequestTimeouts(read=0.5))) as api,
        pytest.raises(urllib3.exceptions.ReadTimeoutError),
    ):
        k8s.CoreV1Api(api).list_namespace()

    silent_server.wait_for_a_connection()
    assert silent_server.connections == 1, "the request was sent once, not again after its read timeout"


def test_a_connection_dropped_before_an_answer_is_still_tried_again(tmp_path: Path) -> None:
    server = SilentServer(tmp_path, drop=True)
    try:
        with (
            contextlib.closing(kubernetes_client(server.kubeconfig)) as api,
            pytest.raises(urllib3.exceptions.HTTPError),
        ):
            k8s.CoreV1Api(api).list_namespace()
    finally:
        server.close()

    assert server.connections == 4, "urllib3's three retries after a dropped connection stay"


def test_a_watch_stays_open_longer_than_the_read_timeout(stack: StackInfo, namespace: str) -> None:
    with contextlib.closing(kubernetes_client(stack.kubeconfig, timeouts=RequestTimeouts(read=0.5))) as api:
        started = time.monotonic()
        events = list(watch.Watch().stream(k8s.CoreV1Api(api).list_namespaced_config_map, namespace, timeout_seconds=3))

    assert time.monotonic() - started >= 2.5, "the API server ended the watch after its timeoutSeconds"
    assert {event["type"] for event in events} <= {"ADDED"}, "at most kube-root-ca.crt appears, then silence"


def test_check_cluster_heartbeats_while_the_api_server_does_not_answer_then_fails_with_its_timeout(
    silent_server: SilentServer,
    activity_env: ActivityEnvironment,
    heartbeats: list[tuple[object, ...]],
    ref: MigrationRef,
    spec: MigrationSpec,
) -> None:
    # The precheck's guard has a 30 s heartbeat timeout, and each of its calls may wait a read timeout (30 s): without
    # heartbeats, Temporal took the attempt for lost and started another beside it, instead of seeing the timeout.
    settings = KubeActivitySettings(poll_interval=0.2)
    with (
        contextlib.closing(kubernetes_client(silent_server.kubeconfig, timeouts=RequestTimeouts(read=2))) as api,
        pytest.raises(urllib3.exceptions.ReadTimeoutError),
    ):
        activity_env.run(ClusterActivities(api, settings).check_cluster, ProvisionInput(ref=ref, spec=spec))

    assert len(heartbeats) >= 5, heartbeats
