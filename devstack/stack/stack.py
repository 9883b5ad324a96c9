"""The whole local stack: start in dependency order, describe the endpoints, stop everything.

Everything a stack owns lives in one state folder: data (etcd, Temporal's SQLite file,
S3 objects, PostgreSQL clusters), key material (the API server's certificates, the payload
codec's key), kubeconfigs, logs and the pid file.
Starting a stack on a folder that held one before resumes its data. One exception: when
ferry runs as root and the `postgres` user cannot enter the state folder, the PostgreSQL
clusters live in a folder of their own that the state folder links to (postgres_home.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import boto3

from devstack.stack import postgres_home
from devstack.stack.codec import CodecServer, ensure_keys
from devstack.stack.errors import StartError
from devstack.stack.install import Binaries, ensure_binaries
from devstack.stack.kube import KubeControlPlane
from devstack.stack.postgres import PostgresEndpoint, PostgresInstance
from devstack.stack.processes import ManagedProcess, PidFile
from devstack.stack.readiness import PortBook
from devstack.stack.s3 import REGION, S3Server
from devstack.stack.temporal import NAMESPACE, TemporalDevServer

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger("devstack.stack")

COMPONENTS = frozenset({"kubernetes", "temporal", "s3", "postgres"})
POSTGRES_INSTANCES = ("source", "target")
"""The PostgreSQL instances: `source` runs PostgreSQL 15 and `target` PostgreSQL 18 (see versions.py)."""
TEMPORAL_FOLDER = "temporal"
"""The Temporal dev server's folder in the state folder: its SQLite database (temporal.DATABASE_FILE) is there."""
START_TIMEOUT = 300.0
"""Seconds each component may take to come up. A first start on a cold, busy machine is slow (page
cache, initdb, Temporal's schema); a component that exits meanwhile fails the start at once."""


@dataclasses.dataclass(frozen=True)
class StackInfo:
    """Where a running stack's components listen; also written to `<state>/stack.json`."""

    state_dir: Path
    logs_dir: Path
    kubeconfig: Path | None = None
    kube_server: str | None = None
    temporal_address: str | None = None
    temporal_namespace: str | None = None
    temporal_ui_url: str | None = None
    codec_keys: Path | None = None
    """The payload codec's key folder (made once per state folder), for FERRY_CODEC_KEYS."""
    codec_endpoint: str | None = None
    """The codec server the Web UI decodes through; also for `temporal --codec-endpoint`."""
    s3_endpoint: str | None = None
    s3_access_key: str | None = None
    s3_secret_key: str | None = None
    s3_region: str | None = None
    postgres: dict[str, PostgresEndpoint] = dataclasses.field(default_factory=dict)
    postgres_data: Path | None = None
    """The folder holding each PostgreSQL instance's data folder (`<instance>/data`)."""
    postgres_data_outside: str | None = None
    """Why `postgres_data` is outside the state folder, when it is."""
    postgres_bindir: Path | None = None
    """The client tools for the instances, the newest major's (pg_dump refuses newer servers): what ferry's
    worker needs as --postgres-bindir, since the stack's PostgreSQL 18 is in no folder it searches."""

    def s3_client(self) -> S3Client:
        """A boto3 client for the stack's S3 server, with its root credentials."""
        if self.s3_endpoint is None:
            raise StartError("this stack runs no S3 server (start it with the s3 component)")
        return boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            aws_access_key_id=self.s3_access_key,
            aws_secret_access_key=self.s3_secret_key,
            region_name=self.s3_region,
        )

    def to_json(self) -> str:
        raw: dict[str, Any] = dataclasses.asdict(self)
        return json.dumps(raw, indent=2, default=str)

    @classmethod
    def load(cls, state_dir: Path) -> StackInfo:
        """Reads the description a running stack wrote, for other processes to attach to it."""
        raw = json.loads((state_dir / "stack.json").read_text())
        raw["postgres"] = {name: PostgresEndpoint(**endpoint) for name, endpoint in raw["postgres"].items()}
        for key in ("state_dir", "logs_dir", "kubeconfig", "postgres_data", "postgres_bindir", "codec_keys"):
            if raw.get(key) is not None:
                raw[key] = Path(raw[key])
        return cls(**raw)


class Stack:
    """Starts and stops the real components in one state folder.

    Use as a context manager, or call `start()` and make sure `stop()` runs. `components`
    picks a subset (any of kubernetes, temporal, s3, postgres) for tests that need less.
    `audit_status_writes` makes the API server also audit every write to a Migration's status
    (for benchmarks: when each was answered, and what it wrote).
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        components: frozenset[str] = COMPONENTS,
        binaries: Binaries | None = None,
        timeout: float = START_TIMEOUT,
        audit_status_writes: bool = False,
    ) -> None:
        unknown = components - COMPONENTS
        if unknown:
            raise ValueError(f"unknown stack components {sorted(unknown)}; choose from {sorted(COMPONENTS)}")
        self.state_dir = state_dir.resolve()
        self.components = components
        self.timeout = timeout
        self.audit_status_writes = audit_status_writes
        self._binaries = binaries
        self._processes: list[ManagedProcess] = []
        self._readiness: dict[str, Callable[[ManagedProcess], None]] = {}
        self._pidfile = PidFile(self.state_dir / "pids.json")
        self.info: StackInfo | None = None

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    def start(self) -> StackInfo:
        started = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        leftovers = self._pidfile.kill_leftovers()
        if leftovers:
            log.warning("killed processes left by an earlier run of this stack: %s", ", ".join(leftovers))
        binaries = self._binaries or ensure_binaries()
        ports = PortBook(self.state_dir / "ports.json")
        try:
            info = self._start(binaries, ports)
        except BaseException:
            self.stop()
            raise
        (self.state_dir / "stack.json").write_text(info.to_json())
        self.info = info
        log.info("stack is up in %.1fs (state in %s)", time.monotonic() - started, self.state_dir)
        return info

    def _launch(self, process: ManagedProcess) -> ManagedProcess:
        self._processes.append(process)
        self._pidfile.record(self._processes)
        return process

    def _start(self, binaries: Binaries, ports: PortBook) -> StackInfo:
        fields: dict[str, Any] = {"state_dir": self.state_dir, "logs_dir": self.logs_dir}
        # Launch what needs nothing else first, so they boot while the control plane does.
        kube = temporal = s3 = codec = None
        etcd = None
        postgres: list[PostgresInstance] = []
        if "kubernetes" in self.components:
            kube = KubeControlPlane(
                binaries, self.state_dir / "kubernetes", ports, self.logs_dir,
                audit_status_writes=self.audit_status_writes,
            )  # fmt: skip
            etcd = self._launch(kube.start_etcd())
            control_plane = kube
            self._readiness["etcd"] = lambda process: control_plane.wait_etcd(process, self.timeout)
            self._readiness["kube-apiserver"] = lambda process: control_plane.wait_apiserver(process, self.timeout)
        if "temporal" in self.components:
            codec = CodecServer(ensure_keys(self.state_dir / "codec-keys"), ports, self.logs_dir)
            temporal = TemporalDevServer(
                binaries, self.state_dir / TEMPORAL_FOLDER, ports, self.logs_dir, codec_endpoint=codec.endpoint
            )
            self._launch(codec.start(temporal.ui_origins))
            self._launch(temporal.start())
            codec_server = codec
            self._readiness["codec-server"] = lambda process: codec_server.wait(self.timeout)
        if "s3" in self.components:
            s3 = S3Server(binaries, self.state_dir / "s3", ports, self.logs_dir)
            self._launch(s3.start())
            s3_server = s3
            self._readiness["s3"] = lambda process: s3_server.wait(self.timeout)
        if "postgres" in self.components:
            user = postgres_home.ServiceUser.when_root()
            home = postgres_home.choose(self.state_dir / "postgres", POSTGRES_INSTANCES, user)
            fields.update(postgres_data=home.folder, postgres_data_outside=home.why_outside)
            fields.update(postgres_bindir=binaries.postgres_bindir)
            for name in POSTGRES_INSTANCES:
                folder = self.state_dir / "postgres" / name
                bindir = binaries.source_postgres_bindir if name == "source" else binaries.target_postgres_bindir
                instance = PostgresInstance(name, bindir, folder, ports, self.logs_dir, home, user)
                self._launch(instance.start())
                postgres.append(instance)

        if kube is not None and etcd is not None:
            kube.wait_etcd(etcd, self.timeout)
            apiserver = self._launch(kube.start_apiserver())
            kube.wait_apiserver(apiserver, self.timeout)
            kube.write_kubeconfigs()
            controllers = [self._launch(p) for p in kube.start_controllers()]
            kube.wait_controllers(controllers, self.timeout)
            fields.update(kubeconfig=kube.kubeconfig, kube_server=kube.server)
        if temporal is not None and codec is not None:
            temporal.wait(self.timeout)
            codec.wait(self.timeout)
            fields.update(
                temporal_address=temporal.address, temporal_namespace=NAMESPACE, temporal_ui_url=temporal.ui_url,
                codec_keys=codec.keys, codec_endpoint=codec.endpoint,
            )  # fmt: skip
        if s3 is not None:
            s3.wait(self.timeout)
            access, secret = s3.credentials
            fields.update(s3_endpoint=s3.endpoint, s3_access_key=access, s3_secret_key=secret, s3_region=REGION)
        for instance in postgres:
            instance.wait(self.timeout)
        fields["postgres"] = {instance.name: instance.endpoint for instance in postgres}
        return StackInfo(**fields)

    def restart(self, name: str) -> None:
        """Stops one component's process and starts it again, e.g. to test what survives an outage.

        `name` is a process name (kube-apiserver, etcd, s3, postgres-source, ...); the call
        returns when the component is ready again, where the stack knows how to tell.
        """
        process = self.process(name)
        process.stop()
        process.start()
        self._pidfile.record(self._processes)
        if name in self._readiness:
            self._readiness[name](process)

    def process(self, name: str) -> ManagedProcess:
        """The running process of a component, e.g. to stop it for a while."""
        for process in self._processes:
            if process.name == name:
                return process
        names = ", ".join(p.name for p in self._processes)
        raise ValueError(f"this stack runs no process named {name!r}; it runs {names}")

    def check_running(self) -> None:
        """Raises ComponentStopped, naming it and with the end of its log, for a process of the stack that exited."""
        for process in self._processes:
            process.check_running()

    def stop(self) -> None:
        """Stops every process this stack started, the last started first."""
        for process in reversed(self._processes):
            process.stop()
        self._processes.clear()
        self._pidfile.clear()
        (self.state_dir / "stack.json").unlink(missing_ok=True)
        self.info = None

    def __enter__(self) -> StackInfo:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def describe(info: StackInfo) -> str:
    """A human-readable summary of where everything is."""
    lines = [f"state folder:      {info.state_dir}", f"logs:              {info.logs_dir}"]
    if info.kubeconfig:
        lines += [f"kubeconfig:        {info.kubeconfig}", f"  export KUBECONFIG={info.kubeconfig}"]
    if info.temporal_address:
        lines += [
            f"Temporal:          {info.temporal_address} (namespace {info.temporal_namespace})",
            f"Temporal Web UI:   {info.temporal_ui_url}",
        ]
    if info.codec_endpoint:
        lines += [
            f"codec server:      {info.codec_endpoint} (payloads are encrypted with the keys in {info.codec_keys})",
            f"  export FERRY_CODEC_KEYS={info.codec_keys} TEMPORAL_CODEC_ENDPOINT={info.codec_endpoint}",
        ]
    if info.s3_endpoint:
        lines += [f"S3:                {info.s3_endpoint} (access key {info.s3_access_key}, secret in stack.json)"]
    for name, endpoint in info.postgres.items():
        lines.append(f"PostgreSQL {name + ':':8}{endpoint.host}:{endpoint.port} (user {endpoint.user})")
    if info.postgres_bindir:
        lines.append(f"PostgreSQL tools:  {info.postgres_bindir} (for ferry worker --postgres-bindir)")
    if info.postgres_data_outside:
        lines.append(f"PostgreSQL data:   {info.postgres_data}")
        lines.append(f"  outside the state folder: {info.postgres_data_outside}")
    return "\n".join(lines)
