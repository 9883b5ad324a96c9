"""A real Kubernetes control plane on loopback: etcd, API server, controllers, scheduler, kwok.

No kubelet runs: kwok plays the node, so Pods that the real scheduler binds to the
fake Node become Running and Ready without containers. Volume claims bind through the
controller-manager's own host-path provisioner, named by the StorageClasses created
here, so StatefulSets with volumeClaimTemplates behave as they do on a real cluster. ferry's
admission policies (deploy/admission, see admission.py) are in force from the start.
"""

from __future__ import annotations

import dataclasses
import functools
import ssl
from collections.abc import Callable
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from devstack.stack import admission, pki
from devstack.stack.install import Binaries
from devstack.stack.processes import ManagedProcess, go_environment
from devstack.stack.readiness import LOOPBACK, PortBook, http_ok, wait_until

SERVICE_CIDR = "10.0.0.0/24"
POD_CIDR = "10.244.0.0/16"
NODE_NAME = "ferry-node-0"
STORAGE_CLASSES = {"standard": True, "fast": False}
"""StorageClasses the stack provides, and whether each is the cluster default."""
HOST_PATH_PROVISIONER = "kubernetes.io/host-path"
AUDIT_LOG = "kube-apiserver-audit.log"
"""In the logs folder: who read or changed which Secret, one JSON line each; with `audit_status_writes`, also every
write to a Migration's status, with its body."""
AUDIT_SECRETS = """\
  - level: Metadata
    resources: [{group: "", resources: [secrets]}]
"""
AUDIT_STATUS_WRITES = """\
  - level: Request
    verbs: [patch, update]
    resources: [{group: ferry.dev, resources: [migrations/status]}]
"""
"""For benchmarks: when the API server answered each status write (stageTimestamp, to the microsecond), and what it
wrote. Off by default: it costs the API server an encoding of every status it is sent."""


def audit_policy(*, status_writes: bool = False) -> str:
    rules = AUDIT_SECRETS + (AUDIT_STATUS_WRITES if status_writes else "")
    return f"apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n{rules}  - level: None\n"


@dataclasses.dataclass
class KubeControlPlane:
    """Starts and stops the control plane of one state folder."""

    binaries: Binaries
    folder: Path
    ports: PortBook
    logs: Path
    processes: list[ManagedProcess] = dataclasses.field(default_factory=list)
    audit_status_writes: bool = False
    """Also audit every write to a Migration's status (AUDIT_STATUS_WRITES)."""

    @property
    def keys(self) -> pki.Pki:
        return pki.Pki(self.folder / "pki")

    @property
    def server(self) -> str:
        return f"https://{LOOPBACK}:{self.ports.port('kube-apiserver')}"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (system:masters), for people, tests and ferry itself."""
        return self.folder / "kubeconfig"

    def _kubeconfig_for(self, client: pki.ClientIdentity) -> Path:
        if client == pki.ADMIN:
            return self.kubeconfig
        return self.folder / "kubeconfigs" / f"{client.name}.yaml"

    def _process(self, name: str, argv: list[str]) -> ManagedProcess:
        # The API server's graceful shutdown waits on clients' open requests; its state is
        # in etcd, which stops gracefully after it, so a short wait is enough.
        stop_timeout = 5.0 if name == "kube-apiserver" else 15.0
        process = ManagedProcess(
            name=name, argv=argv, log_path=self.logs / f"{name}.log", stop_timeout=stop_timeout, env=go_environment()
        )
        self.processes.append(process)
        return process

    def start_etcd(self) -> ManagedProcess:
        client_url = f"http://{LOOPBACK}:{self.ports.port('etcd')}"
        peer_url = f"http://{LOOPBACK}:{self.ports.port('etcd-peer')}"
        etcd = self._process(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=ferry",
                f"--data-dir={self.folder / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=ferry={peer_url}",
                "--log-level=warn",
                # A local stack does not need to survive power loss, and fsync dominates
                # its latency on shared disks; a clean stop still persists everything.
                "--unsafe-no-fsync",
            ],
        )
        etcd.start()
        return etcd

    def wait_etcd(self, etcd: ManagedProcess, timeout: float) -> None:
        url = f"http://{LOOPBACK}:{self.ports.port('etcd')}/health"
        wait_until("etcd", lambda: http_ok(url, expect=b'"health":"true"'), timeout=timeout, process=etcd)

    def start_apiserver(self) -> ManagedProcess:
        self.keys.ensure()
        p = self.keys
        policy = self.folder / "audit-policy.yaml"
        policy.write_text(audit_policy(status_writes=self.audit_status_writes))
        apiserver = self._process(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers=http://{LOOPBACK}:{self.ports.port('etcd')}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                f"--secure-port={self.ports.port('kube-apiserver')}",
                f"--tls-cert-file={p.serving_cert}",
                f"--tls-private-key-file={p.serving_key}",
                f"--client-ca-file={p.ca_cert}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={p.service_account_pub}",
                f"--service-account-signing-key-file={p.service_account_key}",
                # The advertised loopback address is not a valid Endpoints address; nothing
                # inside this cluster needs to reach the API server through its Service.
                "--endpoint-reconciler-type=none",
                "--event-ttl=24h",
                f"--cert-dir={self.folder / 'pki'}",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.logs / AUDIT_LOG}",
                "--audit-log-maxsize=100",
                "--audit-log-maxbackup=1",
                # deploy/admission/finalizer: ferry's finalizer set as a Migration is created (beta in 1.34).
                "--feature-gates=MutatingAdmissionPolicy=true",
                "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
            ],
        )
        apiserver.start()
        return apiserver

    def wait_apiserver(self, apiserver: ManagedProcess, timeout: float) -> None:
        context = ssl.create_default_context(cafile=str(self.keys.ca_cert))
        context.load_cert_chain(str(self.keys.client_cert(pki.ADMIN)), str(self.keys.client_key(pki.ADMIN)))
        wait_until(
            "kube-apiserver",
            lambda: http_ok(f"{self.server}/readyz", context=context),
            timeout=timeout,
            process=apiserver,
        )

    def write_kubeconfigs(self) -> None:
        for client in pki.CLIENTS:
            self.keys.write_kubeconfig(client, self.server, self._kubeconfig_for(client))

    def start_controllers(self) -> list[ManagedProcess]:
        """Starts controller-manager, scheduler and kwok; the API server must be up."""
        p = self.keys
        manager = self._process(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={self._kubeconfig_for(pki.CONTROLLER_MANAGER)}",
                f"--authentication-kubeconfig={self._kubeconfig_for(pki.CONTROLLER_MANAGER)}",
                f"--authorization-kubeconfig={self._kubeconfig_for(pki.CONTROLLER_MANAGER)}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={self.ports.port('kube-controller-manager')}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={p.service_account_key}",
                f"--root-ca-file={p.ca_cert}",
                f"--cluster-signing-cert-file={p.ca_cert}",
                f"--cluster-signing-key-file={p.ca_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--enable-hostpath-provisioner=true",
                # No cloud provider and no kubelet: these controllers have nothing to do.
                "--controllers=*,-node-ipam-controller,-node-route-controller,-service-lb-controller,"
                "-cloud-node-lifecycle-controller",
            ],
        )
        scheduler = self._process(
            "kube-scheduler",
            [
                str(self.binaries.kube_scheduler),
                f"--kubeconfig={self._kubeconfig_for(pki.SCHEDULER)}",
                f"--authentication-kubeconfig={self._kubeconfig_for(pki.SCHEDULER)}",
                f"--authorization-kubeconfig={self._kubeconfig_for(pki.SCHEDULER)}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={self.ports.port('kube-scheduler')}",
                "--leader-elect=false",
                # A Pod found unschedulable (its claim not bound yet) waits for an event to try again; when that
                # event is missed it waited 5 minutes (a test's Migration sat in provision until it timed out).
                "--pod-max-in-unschedulable-pods-duration=10s",
            ],
        )
        kwok = self._process(
            "kwok",
            [
                str(self.binaries.kwok),
                f"--kubeconfig={self._kubeconfig_for(pki.KWOK)}",
                "--manage-all-nodes=true",
                f"--cidr={POD_CIDR}",
                f"--node-ip={LOOPBACK}",
                f"--server-address={LOOPBACK}:{self.ports.port('kwok')}",
                # Renew a node Lease as a kubelet would, so the node lifecycle controller
                # sees a live node and never taints it unreachable.
                "--node-lease-duration-seconds=40",
                # An explicit configuration keeps a personal ~/.kwok/kwok.yaml out of the stack.
                f"--config={self._kwok_config()}",
            ],
        )
        for process in (manager, scheduler, kwok):
            process.start()
        return [manager, scheduler, kwok]

    def _kwok_config(self) -> Path:
        path = self.folder / "kwok.yaml"
        path.write_text("apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions: {}\n")
        return path

    def wait_controllers(self, started: list[ManagedProcess], timeout: float) -> None:
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # self-signed serving certs; only /healthz is read
        manager, scheduler, kwok = started
        for process, port in ((manager, "kube-controller-manager"), (scheduler, "kube-scheduler")):
            url = f"https://{LOOPBACK}:{self.ports.port(port)}/healthz"
            check = functools.partial(http_ok, url, context=insecure)
            wait_until(process.name, check, timeout=timeout, process=process)
        api = self.api_client()
        try:
            self._bootstrap(api)
            admission.install(self.binaries.kubectl, self.kubeconfig)
            core = k8s.CoreV1Api(api)
            wait_until(
                f"node {NODE_NAME} (kwok)",
                lambda: _node_ready(core.read_node(NODE_NAME)),
                timeout=timeout,
                process=kwok,
            )
            wait_until(
                "the default ServiceAccount (controller-manager)",
                lambda: bool(core.read_namespaced_service_account("default", "default")),
                timeout=timeout,
                process=manager,
            )
        finally:
            api.close()

    def api_client(self) -> k8s.ApiClient:
        return k8s_config.new_client_from_config(config_file=str(self.kubeconfig))

    def _bootstrap(self, api: k8s.ApiClient) -> None:
        """Creates the fake Node and the StorageClasses; existing ones are left alone."""
        node = k8s.V1Node(
            metadata=k8s.V1ObjectMeta(
                name=NODE_NAME,
                labels={
                    "kubernetes.io/hostname": NODE_NAME,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                },
                annotations={"kwok.x-k8s.io/node": "fake"},
            ),
            status=k8s.V1NodeStatus(
                allocatable={"cpu": "64", "memory": "256Gi", "pods": "500"},
                capacity={"cpu": "64", "memory": "256Gi", "pods": "500"},
            ),
        )
        _create_if_missing(lambda: k8s.CoreV1Api(api).create_node(node))
        storage = k8s.StorageV1Api(api)
        for name, default in STORAGE_CLASSES.items():
            storage_class = k8s.V1StorageClass(
                metadata=k8s.V1ObjectMeta(
                    name=name,
                    annotations={"storageclass.kubernetes.io/is-default-class": str(default).lower()},
                ),
                provisioner=HOST_PATH_PROVISIONER,
                reclaim_policy="Delete",
                volume_binding_mode="Immediate",
                allow_volume_expansion=True,
            )
            _create_if_missing(functools.partial(storage.create_storage_class, storage_class))


def _create_if_missing(create: Callable[[], object]) -> None:
    try:
        create()
    except ApiException as error:
        if error.status != 409:
            raise


def _node_ready(node: k8s.V1Node) -> bool:
    conditions = (node.status and node.status.conditions) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)
