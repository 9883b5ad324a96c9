"""A chaos run: many Migrations at once while ferry's processes and Temporal are killed, then everything checked.

N Migrations of small real databases, each in a namespace of its own; M of them are
rolled back by annotation and K deleted, at random moments; meanwhile worker processes,
the leading watcher and the Temporal server are killed with SIGKILL at random and
started again (Temporal on the same SQLite file). When every Migration has ended, the
run checks what a person would: final phases, one workflow per Migration, equal data
where it Succeeded, nothing left where it was rolled back or deleted while running,
a Service that never lost its endpoints, no finalizer stuck, no pg_dump, pg_restore or psql
still running, no unfinished upload. `scripts/chaos.py` runs it on a stack of its own
and prints the figures; tests/chaos/test_chaos.py runs a small one in the test suite.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import psycopg
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from devstack.stack import pki
from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.stack import Stack, StackInfo
from ferry.api.migration import CLOCK_SKEW_ALLOWANCE
from ferry.api.saga import MigrationRef, MigrationResult, snapshot_key, undo_workflow_id, workflow_id
from ferry.clients import TemporalSettings, connect_temporal
from tests import samples
from tests.cluster import create_source, endpoint_pods

log = logging.getLogger("ferry.chaos")
T = TypeVar("T")

GROUP, VERSION, PLURAL = "ferry.dev", "v1alpha1", "migrations"
FINAL = {"Succeeded", "RolledBack", "Failed", "Abandoned"}
SOURCE, SERVICE, TARGET = "orders-db", "orders-db", "orders-db-16"
SOURCE_REPLICAS = 2
S3_SECRET, SOURCE_SECRET, TARGET_SECRET = "snapshot-credentials", "orders-db-source", "orders-db-target"


@dataclasses.dataclass(frozen=True)
class ChaosPlan:
    """How big a run is. The defaults are the small run of the test suite."""

    migrations: int = 4
    rollbacks: int = 1
    deletions: int = 1
    kills: int = 3
    """Kills at least this many processes (more if the run lasts)."""
    rows: int = 500
    seed: int = dataclasses.field(default_factory=lambda: random.SystemRandom().randrange(1 << 30))
    timeout: float = 900.0
    """Seconds every Migration has to end."""

    @classmethod
    def from_environment(cls) -> ChaosPlan:
        """FERRY_CHAOS_MIGRATIONS, _ROLLBACKS, _DELETIONS, _KILLS, _SEED, _TIMEOUT override the defaults."""
        changes: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = os.environ.get(f"FERRY_CHAOS_{field.name.upper()}")
            if raw:
                changes[field.name] = float(raw) if field.name == "timeout" else int(raw)
        plan = cls(**changes)
        if plan.rollbacks + plan.deletions > plan.migrations:
            raise ValueError("FERRY_CHAOS_ROLLBACKS + FERRY_CHAOS_DELETIONS must not exceed FERRY_CHAOS_MIGRATIONS")
        return plan


@dataclasses.dataclass
class Subject:
    """One Migration of the run and everything made for it."""

    index: int
    namespace: str
    database: str
    ref: MigrationRef | None = None
    rollback_at: float | None = None
    delete_at: float | None = None
    rolled_back_by_annotation: bool = False
    deleted_at: datetime | None = None
    final_phase: str | None = None
    gone: bool = False
    original_acl: str | None = None


@dataclasses.dataclass
class Component:
    """A process of ferry's (worker or watcher) that the run kills and starts again."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    cwd: Path | None = None
    """Where it starts; `python -m` imports ferry from there first (a benchmark runs another checkout this way)."""

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> None:
        """Starts the process, unless it runs already (two restarts may be due for one kill)."""
        if self.running:
            return
        with self.log_path.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.cwd
            )

    def kill(self) -> None:
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(30)

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()


@dataclasses.dataclass
class Report:
    plan: ChaosPlan
    phases: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    kills: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    problems: list[str] = dataclasses.field(default_factory=list)
    figures: dict[str, int] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    def table(self) -> str:
        rows = [
            ("migrations", str(self.plan.migrations)),
            ("rolled back by annotation", str(self.plan.rollbacks)),
            ("deleted", str(self.plan.deletions)),
            ("seed", str(self.plan.seed)),
            ("seconds", f"{self.seconds:.0f}"),
            *((f"final phase {phase}", str(count)) for phase, count in sorted(self.phases.items())),
            *((f"SIGKILL {what}", str(count)) for what, count in sorted(self.kills.items())),
            ("SIGKILL in all", str(sum(self.kills.values()))),
            *((name, str(value)) for name, value in self.figures.items()),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


class ChaosRun:
    """One run against a stack: kubernetes, S3 and PostgreSQL from `info`, Temporal from `temporal` (killable)."""

    worker_flags: ClassVar[tuple[str, ...]] = ("--poll-interval=0.5",)
    """Settings for a test's pace: the waits poll twice a second (the worker's default is once)."""
    watcher_flags: ClassVar[tuple[str, ...]] = ("--resync-interval=10",)
    """A resync every ten seconds (the default is thirty): a chaos run's pace."""

    def __init__(
        self,
        info: StackInfo,
        temporal: Stack,
        kube_api: k8s.ApiClient,
        plan: ChaosPlan,
        workdir: Path,
        *,
        workers: int = 2,
        component_cwd: Path | None = None,
    ) -> None:
        assert temporal.info is not None
        assert temporal.info.temporal_address is not None
        self.info = info
        self.temporal = temporal
        self.temporal_address = temporal.info.temporal_address
        self.api = kube_api
        self.plan = plan
        self.workdir = workdir
        self.random = random.Random(plan.seed)
        self.run_id = uuid.uuid4().hex[:6]
        self.task_queue = f"ferry-chaos-{self.run_id}"
        self.bucket = f"ferry-chaos-{self.run_id}"
        self.lease_namespace = f"chaos-{self.run_id}-lease"
        self.subjects = [
            Subject(i, f"chaos-{self.run_id}-{i:03d}", f"chaos_{self.run_id}_{i:03d}") for i in range(plan.migrations)
        ]
        self.components: dict[str, Component] = {}
        self.workers = [f"worker-{chr(ord('a') + i)}" for i in range(workers)]
        self.component_cwd = component_cwd
        self.report = Report(plan)
        self._stop = threading.Event()
        self._empty_endpoints: collections.Counter[str] = collections.Counter()
        self._samples = 0

    # --- the run ------------------------------------------------------------------------------

    def run(self) -> Report:
        started = time.monotonic()
        log.info("chaos run %s: %s", self.run_id, self.plan)
        self._prepare()
        threads = [threading.Thread(target=target, daemon=True, name=name) for name, target in self._loops().items()]
        try:
            # Whatever fails (even before the first apply), ferry's processes stop with the run: none outlives it.
            self._start_components()
            try:
                self._apply_migrations()
                for thread in threads:
                    thread.start()
                self._drive(started)
            finally:
                self._stop.set()
                for thread in threads:
                    if thread.is_alive():
                        thread.join(60)
            self._settle()
            self.report.seconds = time.monotonic() - started
            self._check()
        finally:
            self._stop_components()
        return self.report

    def _loops(self) -> dict[str, Callable[[], None]]:
        """What runs beside the main thread; processes are killed and started by the main thread only (the stack's
        processes die with the thread that started them)."""
        return {"controls": self._control_loop, "sampler": self._sample_loop}

    # --- preparing the world ------------------------------------------------------------------

    def _prepare(self) -> None:
        core = k8s.CoreV1Api(self.api)
        self.info.s3_client().create_bucket(Bucket=self.bucket)
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=self.lease_namespace)))
        for subject in self.subjects:
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=subject.namespace)))
            source, target = self._databases(subject)
            self._secrets(core, subject.namespace, source, target)
        for subject in self.subjects:
            create_source(self.api, subject.namespace)
            subject.original_acl = self._acl(subject)
        chosen = self.random.sample(self.subjects, self.plan.rollbacks + self.plan.deletions)
        for subject in chosen[: self.plan.rollbacks]:
            subject.rollback_at = self.random.uniform(2, 25)
        for subject in chosen[self.plan.rollbacks :]:
            subject.delete_at = self.random.uniform(2, 25)

    def _databases(self, subject: Subject) -> tuple[PostgresEndpoint, PostgresEndpoint]:
        source_admin, target_admin = self.info.postgres["source"], self.info.postgres["target"]
        for admin in (source_admin, target_admin):
            with psycopg.connect(admin.dsn, autocommit=True) as conn:
                conn.execute(f'create database "{subject.database}"')
        source = dataclasses.replace(source_admin, database=subject.database)
        with psycopg.connect(source.dsn) as conn:
            conn.execute("create table orders (id bigserial primary key, note text not null, total numeric(10,2))")
            conn.execute(
                "insert into orders (note, total) select 'order ' || n, n * 1.5 from generate_series(1, %s) n",
                (self.plan.rows,),
            )
        return source, dataclasses.replace(target_admin, database=subject.database)

    def _secrets(self, core: k8s.CoreV1Api, namespace: str, source: PostgresEndpoint, target: PostgresEndpoint) -> None:
        def connection(endpoint: PostgresEndpoint) -> dict[str, str]:
            return {
                "host": endpoint.host,
                "port": str(endpoint.port),
                "username": endpoint.user,
                "password": endpoint.password,
                "database": endpoint.database,
            }

        assert self.info.s3_access_key is not None
        assert self.info.s3_secret_key is not None
        credentials = {"accessKeyId": self.info.s3_access_key, "secretAccessKey": self.info.s3_secret_key}
        for name, data in (
            (SOURCE_SECRET, connection(source)),
            (TARGET_SECRET, connection(target)),
            (S3_SECRET, credentials),
        ):
            core.create_namespaced_secret(
                namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name), string_data=data)
            )

    def _manifest(self, subject: Subject) -> dict[str, Any]:
        snapshot = {
            "bucket": self.bucket,
            "endpoint": self.info.s3_endpoint,
            "allowInsecureEndpoint": True,  # the stack's S3 is plain http, on loopback
            "region": self.info.s3_region,
            "credentialsSecret": S3_SECRET,
        }
        driver = {"type": "postgresql", "sourceSecret": SOURCE_SECRET, "targetSecret": TARGET_SECRET}
        manifest = samples.migration("orders-db-to-16", snapshot=snapshot, driver=driver)
        manifest["metadata"]["namespace"] = subject.namespace
        return manifest

    def _apply_migrations(self) -> None:
        custom = k8s.CustomObjectsApi(self.api)
        for subject in self.subjects:
            created = custom.create_namespaced_custom_object(
                GROUP, VERSION, subject.namespace, PLURAL, self._manifest(subject)
            )
            subject.ref = MigrationRef(
                namespace=subject.namespace, name="orders-db-to-16", uid=created["metadata"]["uid"]
            )
        self._applied = time.monotonic()

    # --- ferry's processes --------------------------------------------------------------------

    def _start_components(self) -> None:
        kubeconfig = str(self.info.kubeconfig)
        common = [
            f"--kubeconfig={kubeconfig}",
            f"--temporal-address={self.temporal_address}",
            f"--task-queue={self.task_queue}",
        ]
        namespaces = ",".join(subject.namespace for subject in self.subjects)
        for index, name in enumerate(self.workers):
            self._component(
                name,
                [
                    sys.executable,
                    "-m",
                    "ferry.cli",
                    "worker",
                    *common,
                    *self.worker_flags,
                    # The stack's PostgreSQL 18 tools: the worker's own search would find Debian's 15 only.
                    f"--postgres-bindir={self.info.postgres_bindir or ''}",
                    *self._worker_options(index),
                ],
            )
        for name in ("watcher-a", "watcher-b"):
            self._component(
                name,
                [
                    sys.executable, "-m", "ferry.cli", "watcher", *common,
                    f"--namespaces={namespaces}", f"--lease-namespace={self.lease_namespace}",
                    "--lease-duration=15", "--lease-renew-deadline=10", "--lease-retry-period=2",
                    *self.watcher_flags, f"--identity={name}",
                ],
            )  # fmt: skip
        for component in self.components.values():
            component.start()

    def _worker_options(self, index: int) -> list[str]:
        """More flags for the worker of that index (none here; a benchmark adds its metrics address)."""
        return []

    def _component(self, name: str, argv: list[str]) -> None:
        self.components[name] = Component(name, argv, self.workdir / f"{name}.log", cwd=self.component_cwd)

    def _stop_components(self) -> None:
        for component in self.components.values():
            component.stop()

    def _leader(self) -> str | None:
        try:
            lease = k8s.CoordinationV1Api(self.api).read_namespaced_lease("ferry-watcher", self.lease_namespace)
        except ApiException:
            return None
        holder: str | None = lease.spec.holder_identity
        return holder if holder in self.components else None

    def _kill_something(self) -> Callable[[], None] | None:
        """Kills a worker, the leading watcher or Temporal with SIGKILL; returns how to start it again."""
        victim = self.random.choice(["worker", "worker", "watcher", "temporal"])
        if victim == "temporal":
            process = self.temporal.process("temporal")
            if process.popen is None or process.popen.poll() is not None:
                return None  # killed already, and not started again yet
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            assert process.popen is not None
            process.popen.wait(30)
            self.report.kills["temporal server"] += 1
            log.info("SIGKILL temporal")
            return process.start
        if victim == "watcher":
            leader = self._leader()
            if leader is None:
                return None
            component, kind = self.components[leader], "leader watcher"
        else:
            component, kind = self.components[self.random.choice(self.workers)], "worker"
        if not component.running:
            return None  # killed already, and not started again yet
        component.kill()
        self.report.kills[kind] += 1
        log.info("SIGKILL %s", component.name)
        return component.start

    def _supervise(self) -> None:
        """Starts again a component that exited on its own, as its Deployment would (a watcher that lost its
        Lease exits on purpose, for instance)."""
        for component in self.components.values():
            if component.popen is not None and component.popen.poll() is not None:
                self.report.figures[f"exits of {component.name} on its own (started again)"] = (
                    self.report.figures.get(f"exits of {component.name} on its own (started again)", 0) + 1
                )
                component.start()

    def _drive(self, started: float) -> None:
        """The main loop: kills and restarts at random moments, supervises, until every Migration has ended."""
        next_kill = time.monotonic() + self.random.uniform(2, 6)
        restarts: list[tuple[float, Callable[[], None]]] = []
        next_look = 0.0
        while True:
            now = time.monotonic()
            for due, restart in [r for r in restarts if r[0] <= now]:
                restart()
                restarts.remove((due, restart))
            if now >= next_kill:
                restart_later = self._kill_something()
                if restart_later is not None:
                    restarts.append((now + self.random.uniform(0.5, 3), restart_later))
                next_kill = now + self.random.uniform(2, 6)
            if not restarts:
                self._supervise()
            if now >= next_look:
                next_look = now + 2
                if self._all_ended(started):
                    for _, restart in restarts:
                        restart()
                    return
            time.sleep(0.2)

    def enough_kills(self) -> bool:
        return sum(self.report.kills.values()) >= self.plan.kills

    # --- controls: rollbacks and deletions at random moments ----------------------------------

    def _control_loop(self) -> None:
        custom = k8s.CustomObjectsApi(self.api)
        waiting = [s for s in self.subjects if s.rollback_at is not None or s.delete_at is not None]
        while waiting and not self._stop.wait(0.2):
            elapsed = time.monotonic() - self._applied
            for subject in list(waiting):
                assert subject.ref is not None
                if subject.rollback_at is not None and elapsed >= subject.rollback_at:
                    # Signed by the stack's admin, as whom the harness acts (deploy/admission checks the name).
                    rollback = f"{pki.ADMIN.common_name}: rolled back at random"
                    patch = {"metadata": {"annotations": {"ferry.dev/rollback": rollback}}}
                    with contextlib.suppress(ApiException):
                        custom.patch_namespaced_custom_object(
                            GROUP, VERSION, subject.namespace, PLURAL, subject.ref.name, patch
                        )
                        subject.rolled_back_by_annotation = True
                    waiting.remove(subject)
                elif subject.delete_at is not None and elapsed >= subject.delete_at:
                    with contextlib.suppress(ApiException):
                        custom.delete_namespaced_custom_object(
                            GROUP, VERSION, subject.namespace, PLURAL, subject.ref.name
                        )
                        deleted = custom.get_namespaced_custom_object(
                            GROUP, VERSION, subject.namespace, PLURAL, subject.ref.name
                        )
                        subject.deleted_at = _time(deleted["metadata"]["deletionTimestamp"])
                    if subject.deleted_at is None:
                        subject.deleted_at = datetime.now(UTC)
                    waiting.remove(subject)

    # --- the clients' Service, sampled --------------------------------------------------------

    def _sample_loop(self) -> None:
        while not self._stop.wait(0.25):
            for subject in self.subjects:
                with contextlib.suppress(ApiException):
                    if not endpoint_pods(self.api, subject.namespace, SERVICE):
                        self._empty_endpoints[subject.namespace] += 1
            self._samples += 1

    # --- waiting for the end ------------------------------------------------------------------

    def _all_ended(self, started: float) -> bool:
        """Whether every Migration has ended (and enough kills happened); records a problem at the timeout."""
        custom = k8s.CustomObjectsApi(self.api)
        pending = []
        for subject in self.subjects:
            assert subject.ref is not None
            try:
                obj = custom.get_namespaced_custom_object(GROUP, VERSION, subject.namespace, PLURAL, subject.ref.name)
            except ApiException as error:
                if error.status != 404:
                    raise
                subject.gone = True
                continue
            phase = (obj.get("status") or {}).get("phase")
            subject.final_phase = phase
            if phase not in FINAL or obj["metadata"].get("deletionTimestamp"):
                pending.append(f"{subject.namespace}: {phase}")
        if not pending and self.enough_kills():
            return True
        if time.monotonic() > started + self.plan.timeout:
            self.report.problems.append(f"not ended within {self.plan.timeout:.0f}s: {', '.join(pending[:10])}")
            return True
        return False

    def _settle(self) -> None:
        """Lets a killed component come back, so the checks see the world ferry leaves, not one mid-restart."""
        for component in self.components.values():
            if component.popen is None or component.popen.poll() is not None:
                component.start()

    # --- the checks ---------------------------------------------------------------------------

    def _check(self) -> None:
        report = self.report
        for subject in self.subjects:
            report.phases["deleted" if subject.gone else subject.final_phase or "none"] += 1
        problems = report.problems
        workflows = self._workflows_per_migration()
        # A Migration deleted before any watcher saw it never gets a workflow; every other gets exactly one.
        deleted_unseen = {s.ref.uid for s in self.subjects if s.ref is not None and s.gone}
        wrong = {
            uid: count for uid, count in workflows.items() if count != 1 and not (count == 0 and uid in deleted_unseen)
        }
        report.figures["Migrations without exactly one workflow"] = len(wrong)
        report.figures["deleted before any workflow"] = sum(1 for uid, count in workflows.items() if count == 0)
        report.figures["Succeeded with data not equal"] = 0
        report.figures["undone with something left"] = 0
        for subject in self.subjects:
            assert subject.ref is not None
            expect = self._expectation(subject)
            found = self._left_behind(subject) if expect == "nothing left" else self._data_differs(subject)
            if found:
                key = "undone with something left" if expect == "nothing left" else "Succeeded with data not equal"
                report.figures[key] += 1
                problems.append(f"{subject.namespace} ({expect}): {'; '.join(found)}")
        report.figures["Failed or Abandoned"] = report.phases["Failed"] + report.phases["Abandoned"]
        report.figures["samples of the Service"] = self._samples
        report.figures["samples with no endpoints"] = sum(self._empty_endpoints.values())
        report.figures["stuck finalizers"] = sum(1 for s in self.subjects if s.deleted_at is not None and not s.gone)
        report.figures["pg_dump/pg_restore/psql still running"] = len(
            _tools_running({subject.database for subject in self.subjects})
        )
        report.figures["unfinished multipart uploads"] = len(
            self.info.s3_client().list_multipart_uploads(Bucket=self.bucket).get("Uploads", [])
        )
        for name, value in report.figures.items():
            # A watcher that loses its Lease exits on purpose, and its Deployment starts it again.
            informative = name in ("samples of the Service", "deleted before any workflow") or name.startswith(
                "exits of watcher-"
            )
            if value and not informative:
                problems.append(f"{name}: {value}")
        for namespace, count in self._empty_endpoints.items():
            problems.append(f"{namespace}: the Service had no endpoints in {count} samples")
        for uid, count in wrong.items():
            problems.append(f"Migration {uid} has {count} workflows")

    def _expectation(self, subject: Subject) -> str:
        """What the world must look like for this subject: the migration done, or nothing left of it."""
        if subject.gone:
            return "data equal" if self._succeeded_before_deletion(subject) else "nothing left"
        return "data equal" if subject.final_phase == "Succeeded" else "nothing left"

    def _succeeded_before_deletion(self, subject: Subject) -> bool:
        """Deleted after its run succeeded, or less than CLOCK_SKEW_ALLOWANCE before: the target stays, as promised (the
        watcher counts a success within the allowance after the deletion as before it, its clock and the API server's
        being two machines')."""
        assert subject.ref is not None
        assert subject.deleted_at is not None
        run = self._temporal(_describe(workflow_id(subject.ref)))
        undo = self._temporal(_describe(undo_workflow_id(subject.ref)))
        if run is None or undo is not None:
            return False
        status, closed, phase = run
        return (
            status is WorkflowExecutionStatus.COMPLETED
            and closed is not None
            and closed - subject.deleted_at <= CLOCK_SKEW_ALLOWANCE
            and phase == "Succeeded"
        )

    def _workflows_per_migration(self) -> dict[str, int]:
        refs = [subject.ref for subject in self.subjects if subject.ref is not None]
        return self._temporal(_count_runs(refs))

    def _temporal(self, work: Callable[[Client], Awaitable[T]]) -> T:
        """Runs `work` with a client of the run's Temporal, once it answers again after the last kill."""

        async def connected() -> T:
            deadline = time.monotonic() + 120
            while True:
                try:
                    client = await connect_temporal(TemporalSettings(address=self.temporal_address))
                    break
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(1)
            return await work(client)

        return asyncio.run(connected())

    def _left_behind(self, subject: Subject) -> list[str]:
        assert subject.ref is not None
        found = []
        apps, core = k8s.AppsV1Api(self.api), k8s.CoreV1Api(self.api)
        names = [item.metadata.name for item in apps.list_namespaced_stateful_set(subject.namespace).items]
        if TARGET in names:
            found.append("the target StatefulSet is still there")
        if TARGET in [item.metadata.name for item in core.list_namespaced_service(subject.namespace).items]:
            found.append("the target's Service is still there")
        claims = core.list_namespaced_persistent_volume_claim(
            subject.namespace, label_selector=f"ferry.dev/statefulset={TARGET}"
        )
        if claims.items:
            found.append(f"{len(claims.items)} target claims are still there")
        source = apps.read_namespaced_stateful_set(SOURCE, subject.namespace)
        if source.spec.replicas != SOURCE_REPLICAS:
            found.append(f"the source has {source.spec.replicas} replicas, not {SOURCE_REPLICAS}")
        service = core.read_namespaced_service(SERVICE, subject.namespace)
        if (service.spec.selector or {}) != {"app": SOURCE}:
            found.append(f"the Service selects {service.spec.selector}")
        if not endpoint_pods(self.api, subject.namespace, SERVICE):
            found.append("the Service has no endpoints")
        found += self._source_not_writable(subject)
        target = dataclasses.replace(self.info.postgres["target"], database=subject.database)
        with psycopg.connect(target.dsn) as conn:
            tables = conn.execute(
                "select count(*) from pg_tables where schemaname not in ('pg_catalog', 'information_schema')"
            ).fetchone()
        if tables and tables[0]:
            found.append(f"the target database still holds {tables[0]} tables")
        key = snapshot_key(subject.ref, _snapshot_spec(self, subject))
        listed = self.info.s3_client().list_objects_v2(Bucket=self.bucket, Prefix=key)
        if listed.get("KeyCount", 0):
            found.append("the snapshot object is still there (afterRollback: Delete)")
        return found

    def _source_not_writable(self, subject: Subject) -> list[str]:
        source = dataclasses.replace(self.info.postgres["source"], database=subject.database)
        found = []
        with psycopg.connect(source.dsn) as conn:
            settings = conn.execute(
                # ferry.unfrozen_by stays: it refuses a late attempt of the freeze (activities/postgres/freezing.py)
                "select (select array_agg(entry) from unnest(setconfig) entry "
                "where entry not like 'ferry.unfrozen_by=%') "
                "from pg_db_role_setting s join pg_database d on d.oid = s.setdatabase "
                "where d.datname = current_database() and s.setrole = 0"
            ).fetchone()
            if settings and settings[0]:
                found.append(f"the source database keeps the settings {settings[0]}")
            slots = conn.execute(
                "select count(*) from pg_replication_slots where database = current_database()"
            ).fetchone()
            if slots and slots[0]:
                found.append(f"{slots[0]} replication slots are left on the source")
        if self._acl(subject) != subject.original_acl:
            found.append(f"the source's privileges are {self._acl(subject)}, were {subject.original_acl}")
        return found

    def _acl(self, subject: Subject) -> str | None:
        admin = self.info.postgres["source"]
        with psycopg.connect(admin.dsn) as conn:
            row = conn.execute(
                "select has_database_privilege('public', datname, 'CONNECT') from pg_database where datname = %s",
                (subject.database,),
            ).fetchone()
        return None if row is None else f"PUBLIC CONNECT={row[0]}"

    def _data_differs(self, subject: Subject) -> list[str]:
        fingerprints = []
        for side in ("source", "target"):
            endpoint = dataclasses.replace(self.info.postgres[side], database=subject.database)
            with psycopg.connect(endpoint.dsn) as conn:
                fingerprints.append(
                    conn.execute("select count(*), md5(string_agg(o::text, ',' order by id)) from orders o").fetchone()
                )
        return [] if fingerprints[0] == fingerprints[1] else [f"source {fingerprints[0]} != target {fingerprints[1]}"]


def _describe(
    workflow: str,
) -> Callable[[Client], Awaitable[tuple[WorkflowExecutionStatus, datetime | None, str | None] | None]]:
    """(status, close time, phase of its result) of a workflow; None when there is no such workflow."""

    async def describe(client: Client) -> tuple[WorkflowExecutionStatus, datetime | None, str | None] | None:
        handle = client.get_workflow_handle(workflow, result_type=MigrationResult)
        try:
            described = await handle.describe()
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        assert described.status is not None
        phase = None
        if described.status is WorkflowExecutionStatus.COMPLETED:
            phase = (await handle.result()).phase.value
        return described.status, described.close_time, phase

    return describe


def _count_runs(refs: list[MigrationRef]) -> Callable[[Client], Awaitable[dict[str, int]]]:
    """How many runs each Migration's workflow ID has had."""

    async def count(client: Client) -> dict[str, int]:
        counts = {}
        for ref in refs:
            counted = await client.count_workflows(f"WorkflowId = '{workflow_id(ref)}'")
            counts[ref.uid] = counted.count
        return counts

    return count


def cleanup(run: ChaosRun) -> None:
    """Removes what the run made: its namespaces (finalizers released first), databases and bucket contents."""
    custom, core = k8s.CustomObjectsApi(run.api), k8s.CoreV1Api(run.api)
    for subject in run.subjects:
        with contextlib.suppress(ApiException):
            for item in custom.list_namespaced_custom_object(GROUP, VERSION, subject.namespace, PLURAL)["items"]:
                custom.patch_namespaced_custom_object(
                    GROUP, VERSION, subject.namespace, PLURAL, item["metadata"]["name"],
                    {"metadata": {"finalizers": None}},
                )  # fmt: skip
        with contextlib.suppress(ApiException):
            core.delete_namespace(subject.namespace)
        for side in ("source", "target"):
            with psycopg.connect(run.info.postgres[side].dsn, autocommit=True) as conn:
                conn.execute(f'drop database if exists "{subject.database}" with (force)')
    with contextlib.suppress(ApiException):
        core.delete_namespace(run.lease_namespace)


def _snapshot_spec(run: ChaosRun, subject: Subject) -> Any:
    from ferry.api.migration import MigrationSpec

    return MigrationSpec.model_validate(run._manifest(subject)["spec"]).snapshot


def _time(raw: str) -> datetime:
    return datetime.fromisoformat(raw.replace("Z", "+00:00"))


def _tools_running(databases: set[str]) -> list[int]:
    """pg_dump, pg_restore and psql processes alive on this machine that work on one of `databases`: ferry gives each
    tool its database in PGDATABASE, so another run's tools, or a test's running beside this one, do not count."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() not in ("pg_dump", "pg_restore", "psql"):
                    continue
                environment = (entry / "environ").read_bytes().split(b"\0")
                named = {
                    item.removeprefix(b"PGDATABASE=").decode()
                    for item in environment
                    if item.startswith(b"PGDATABASE=")
                }
                if named & databases:
                    found.append(int(entry.name))
    return found


@contextlib.contextmanager
def own_temporal(state_dir: Path, binaries: Any) -> Iterator[Stack]:
    """A Temporal dev server of the run's own, which it may kill without disturbing anything else."""
    stack = Stack(state_dir, components=frozenset({"temporal"}), binaries=binaries)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def keep_only_logs(folder: Path) -> None:
    """Removes every file under `folder` but its logs (`*.log`), then the folders left empty: a stopped run's stack
    (etcd's data, both PostgreSQL clusters, the S3 objects, Temporal's database) is most of a gigabyte, its logs a few
    megabytes. Runs after the stack has stopped, so nothing writes there any more."""
    for path in sorted(folder.rglob("*"), key=lambda found: len(found.parts), reverse=True):
        if path.is_symlink() or (path.is_file() and path.suffix != ".log"):
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
