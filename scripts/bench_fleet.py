"""Fifty Migrations at once, on one worker and then on two; or the history of each kind of run.

    .venv/bin/python scripts/bench_fleet.py                    # 50 Migrations, 1 worker, then 2 workers
    .venv/bin/python scripts/bench_fleet.py --histories        # events and bytes of four kinds of run
    .venv/bin/python scripts/bench_fleet.py --source DIR       # ferry's processes run the checkout in DIR

Starts the local stack in a temporary folder (Kubernetes, S3, PostgreSQL, and a Temporal
server of its own) and runs Migrations of small real databases with the chaos harness
(tests/chaos/harness.py), without its kills, rollbacks or deletions, then checks what the
harness checks. It applies the Migrations once every worker polls the task queue and a
watcher leads, so that they meet a running ferry. It prints, per fleet: how many
Succeeded, the time from applying the Migrations until the last Succeeded status
arrived, each worker's peak resident memory (VmHWM in /proc), the peak of its activity,
local activity (status writes) and workflow task slots in use (the SDK's
`temporal_worker_task_slots_used`, sampled every 0.2 s from the worker's /metrics), and
p50/p99 of "transition -> visible": for every moment the saga stamps into the status
(status.transitionedAt, each step's startedAt and finishedAt, all workflow.now() of the
transition), the local time at which a watch of the Migrations first received a status
carrying it, minus that moment; and the same from the API server's side: when it received,
and when it answered, the first status write carrying it (the stack's audit log of status
writes, to the microsecond), so that ferry's share and the API server's own show apart.
Temporal's clock, the API server's and this one are the same machine's.
It also prints how busy the machine's CPUs were in the first ten seconds after the apply,
which processes used that CPU (in seconds; a process's reaped children count as its own:
a PostgreSQL server's backends, a worker's pg_dumps), from /proc, and the requests the API
server answered in those seconds, by verb and resource (its apiserver_request_total).
A benchmark, not a test: it asserts nothing about times.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import os
import re
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kubernetes import client as k8s
from kubernetes import config, watch
from kubernetes.client.exceptions import ApiException
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from devstack.stack import pki
from devstack.stack.install import Binaries, ensure_binaries
from devstack.stack.kube import AUDIT_LOG
from devstack.stack.processes import process_stats
from devstack.stack.stack import Stack, StackInfo
from ferry.api.saga import workflow_id
from scripts.history_stats import History
from tests.chaos.harness import (
    GROUP,
    PLURAL,
    VERSION,
    ChaosPlan,
    ChaosRun,
    Subject,
    cleanup,
    keep_only_logs,
    own_temporal,
)
from tests.cluster import install_crd

SLOTS = "temporal_worker_task_slots_used"
MEANS = {
    "status write (apply, Events; a read when needed)": "ferry_status_patch_seconds",
    "status write as local activity": "temporal_local_activity_execution_latency",
    "workflow task schedule-to-start": "temporal_workflow_task_schedule_to_start_latency",
    "workflow task execution": "temporal_workflow_task_execution_latency",
    "activity schedule-to-start": "temporal_activity_schedule_to_start_latency",
}
"""Where the time goes, as means of the worker's own histograms (sum / count over every label)."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _time(raw: str) -> datetime:
    return datetime.fromisoformat(raw.replace("Z", "+00:00"))


def _stamps(status: dict[str, Any]) -> dict[str, str]:
    """Every transition time the status carries (as written, so equal instants compare equal), with what it marks."""
    marks = f"phase {status.get('phase')}" + (f", {status['currentStep']}" if status.get("currentStep") else "")
    found = {status["transitionedAt"]: marks} if status.get("transitionedAt") else {}
    for step in status.get("steps", []):
        for field in ("startedAt", "finishedAt"):
            if step.get(field):
                found.setdefault(step[field], f"{step.get('name')} {field}")
    return found


def audit_logs(logs: Path) -> list[Path]:
    """The API server's audit log files, oldest first: it rotates the log at 100 MB and keeps one backup, named
    after the log with the time of the rotation (which sorts before the log's own name)."""
    stem = Path(AUDIT_LOG).stem
    return sorted(logs.glob(f"{stem}-*.log")) + [path for path in [logs / AUDIT_LOG] if path.exists()]


def answered(files: list[Path]) -> dict[str, dict[str, tuple[float, float]]]:
    """When the API server received and answered the first successful status write carrying each stamp, by namespace
    and stamp.

    From the stack's audit log of status writes (a Stack with audit_status_writes), read oldest file first: its
    requestReceivedTimestamp is when the write arrived, its stageTimestamp at ResponseComplete when the write was
    committed and answered, both on the API server's clock.
    """
    found: dict[str, dict[str, tuple[float, float]]] = collections.defaultdict(dict)
    for file in files:
        with file.open() as lines:
            for line in lines:
                event = json.loads(line)
                ref = event.get("objectRef") or {}
                if ref.get("resource") != "migrations" or ref.get("subresource") != "status":
                    continue
                code = (event.get("responseStatus") or {}).get("code", 0)
                if event.get("stage") != "ResponseComplete" or code >= 300:
                    continue
                status = (event.get("requestObject") or {}).get("status") or {}
                received = _time(event["requestReceivedTimestamp"]).timestamp()
                at = _time(event["stageTimestamp"]).timestamp()
                for stamp in _stamps(status):
                    found[ref["namespace"]].setdefault(stamp, (received, at))
    return found


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


COUNTS = {
    "status writes": "ferry_status_patch_seconds_count",
    "status writes that met a 409": "ferry_status_patch_conflicts_total",
}
"""Counters of the worker's own, summed over every label."""


def _totals(text: str) -> dict[str, float]:
    """Each metric's value in Prometheus text, summed over its labels, by metric name."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.partition("{")[0].partition(" ")[0]
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def requests_by_kind(text: str) -> collections.Counter[str]:
    """The API server's requests in its Prometheus text (apiserver_request_total), summed by verb and resource, as
    'GET migrations' or 'PATCH migrations/status'."""
    counted: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.partition("{")[2].rpartition("}")[0]))
            resource = "/".join(part for part in (labels.get("resource"), labels.get("subresource")) if part)
            counted[f"{labels.get('verb', '?')} {resource or '(no resource)'}"] += int(float(line.rsplit(" ", 1)[1]))
    return counted


def _api_requests(api: k8s.ApiClient) -> collections.Counter[str]:
    """The requests the API server has answered since it started, by kind (see requests_by_kind)."""
    method, url, headers, _, _ = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    answer = api.call_api(method, url, headers)
    answer.read()
    return requests_by_kind(answer.data.decode())


def _counts(totals: dict[str, float]) -> dict[str, float]:
    return {what: totals[metric] for what, metric in COUNTS.items() if metric in totals}


def _means(totals: dict[str, float]) -> dict[str, float]:
    return {
        what: totals.get(f"{metric}_sum", 0.0) / totals[f"{metric}_count"]
        for what, metric in MEANS.items()
        if totals.get(f"{metric}_count")
    }


def _vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


BURST = 10.0
"""Seconds after the apply over which the machine's CPU is accounted: when fifty runs start at once."""


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every CPU since boot (/proc/stat); idle and iowait count as not busy."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def _process_ticks(names: dict[int, str]) -> dict[int, tuple[str, int]]:
    """Every process's CPU ticks, its reaped children's included (a PostgreSQL server's backends, a worker's
    pg_dumps), named by `names` (ferry's processes) or else by its command."""
    return {stat.pid: (names.get(stat.pid, stat.command), stat.cpu_ticks) for stat in process_stats()}


@dataclasses.dataclass
class CpuAccount:
    """Who used the machine's CPU between two moments, in seconds of CPU, and how busy the machine was."""

    busy: float
    by_process: dict[str, float]

    @classmethod
    def between(
        cls, machine: tuple[tuple[int, int], tuple[int, int]], processes: tuple[dict[int, tuple[str, int]], ...]
    ) -> CpuAccount:
        (busy0, total0), (busy1, total1) = machine
        before, after = processes
        tick = os.sysconf("SC_CLK_TCK")
        used: collections.Counter[str] = collections.Counter()
        for pid, (name, ticks) in after.items():
            earlier = before.get(pid)
            # A kernel thread renames itself after its work: the PID says it is the same one.
            used[name] += (ticks - (earlier[1] if earlier is not None and earlier[1] <= ticks else 0)) / tick
        return cls(busy=(busy1 - busy0) / max(1, total1 - total0), by_process=dict(used))


@dataclasses.dataclass
class Observed:
    """What the watch received for one Migration: (local receive time, status) in order."""

    statuses: list[tuple[float, dict[str, Any]]] = dataclasses.field(default_factory=list)

    def latencies(self) -> list[float]:
        return [latency for latency, _ in self.marked()]

    def marked(self) -> list[tuple[float, str]]:
        """(transition -> visible, what the transition marks) for every transition seen."""
        first_seen: dict[str, tuple[float, str]] = {}
        for received, status in self.statuses:
            for stamp, what in _stamps(status).items():
                first_seen.setdefault(stamp, (received, what))
        return [(received - _time(stamp).timestamp(), what) for stamp, (received, what) in first_seen.items()]

    def succeeded_at(self) -> float | None:
        return next((at for at, status in self.statuses if status.get("phase") == "Succeeded"), None)


class ObservedRun(ChaosRun):
    """A chaos run without the chaos: nothing killed, nothing rolled back; it watches, samples and measures."""

    worker_flags: ClassVar[tuple[str, ...]] = ()
    """ferry as shipped measures what a fleet costs: the waits poll at the worker's default interval, not a test's."""
    watcher_flags: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *args: Any, split: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.split = split
        self.metrics_ports = [_free_port() for _ in self.workers]
        self.observed: dict[str, Observed] = {subject.namespace: Observed() for subject in self.subjects}
        self.peak_slots: dict[tuple[str, str], int] = {}
        self.peak_rss_kib: dict[str, int] = {}
        self.cpu_at_apply: tuple[tuple[int, int], dict[int, tuple[str, int]]] | None = None
        self.burst_cpu: CpuAccount | None = None
        self.requests_at_apply: collections.Counter[str] | None = None
        self.burst_requests: collections.Counter[str] | None = None
        self.means: dict[str, dict[str, float]] = {}
        self.counts: dict[str, dict[str, float]] = {}
        self.applied_at = 0.0
        self.answered: dict[str, dict[str, tuple[float, float]]] = {}

    def _worker_options(self, index: int) -> list[str]:
        runs = ["--runs=workflows" if index == 0 else "--runs=activities"] if self.split else []
        return [f"--metrics-address=127.0.0.1:{self.metrics_ports[index]}", *runs]

    def _kill_something(self) -> Callable[[], None] | None:
        return None

    def _loops(self) -> dict[str, Callable[[], None]]:
        return {"slots": self._slots_loop}

    def _apply_migrations(self) -> None:
        self._wait_until_ready()
        # The watch starts from a list made before the first apply, so it sees every status written after it, even
        # one written before its connection is up (the applies take seconds, and a running worker writes at once).
        listed = k8s.CustomObjectsApi(self.api).list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1)
        since = listed["metadata"]["resourceVersion"]
        threading.Thread(target=self._watch_loop, args=(since,), daemon=True, name="watch").start()
        self.applied_at = time.time()
        self.cpu_at_apply = (_machine_ticks(), _process_ticks(self._component_names()))
        self.requests_at_apply = _api_requests(self.api)
        super()._apply_migrations()

    def _wait_until_ready(self, timeout: float = 120.0) -> None:
        """Waits until every worker polls the task queue and a watcher leads: the Migrations meet a running ferry,
        as a fleet does, instead of four processes importing and connecting on the same 2 cores."""

        async def ready(client: Client) -> None:
            deadline = time.monotonic() + timeout
            while len(await self._pollers(client)) < len(self.workers) or self._leader() is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ferry's workers and watcher were not all running after {timeout:.0f} s")
                await asyncio.sleep(0.2)

        self._temporal(ready)  # one client for every look

    async def _pollers(self, client: Client) -> set[str]:
        """The identities polling the run's task queue, for workflow or activity tasks."""
        identities: set[str] = set()
        for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
            described = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=client.namespace, task_queue=TaskQueue(name=self.task_queue), task_queue_type=kind
                )
            )
            identities.update(poller.identity for poller in described.pollers)
        return identities

    def _watch_loop(self, resource_version: str | None) -> None:
        custom = k8s.CustomObjectsApi(self.api)
        while not self._stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    custom.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                    resource_version=resource_version, timeout_seconds=5,
                ):  # fmt: skip
                    received = time.time()
                    obj = event["object"]
                    resource_version = obj["metadata"]["resourceVersion"]
                    seen = self.observed.get(obj["metadata"]["namespace"])
                    if seen is not None and obj.get("status"):
                        seen.statuses.append((received, obj["status"]))
                    if self._stop.is_set():
                        break
            except ApiException as error:
                if error.status != 410:
                    raise
                resource_version = None
            finally:
                stream.stop()

    def _component_names(self) -> dict[int, str]:
        return {component.popen.pid: name for name, component in self.components.items() if component.popen is not None}

    def _account_burst(self) -> None:
        """Once, BURST seconds after the apply: the CPU each process used since the apply."""
        if self.burst_cpu is not None or self.cpu_at_apply is None or time.time() < self.applied_at + BURST:
            return
        machine, processes = self.cpu_at_apply
        self.burst_cpu = CpuAccount.between(
            (machine, _machine_ticks()), (processes, _process_ticks(self._component_names()))
        )
        if self.requests_at_apply is not None:
            self.burst_requests = _api_requests(self.api) - self.requests_at_apply

    def _slots_loop(self) -> None:
        while not self._stop.wait(0.2):
            self._account_burst()
            for name, port in zip(self.workers, self.metrics_ports, strict=True):
                with contextlib.suppress(OSError):
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
                        text = answer.read().decode()
                    for line in text.splitlines():
                        # The run's task queue, not its watches' (<task queue>-watches), whose slots are apart.
                        if line.startswith(SLOTS + "{") and f'task_queue="{self.task_queue}"' in line:
                            kind = line.split('worker_type="', 1)[1].split('"', 1)[0]
                            used = int(float(line.rsplit(" ", 1)[1]))
                            key = (name, kind)
                            self.peak_slots[key] = max(self.peak_slots.get(key, 0), used)

    def _check(self) -> None:
        if files := audit_logs(self.info.logs_dir):
            self.answered = answered(files)
        for name in self.workers:
            popen = self.components[name].popen
            if popen is not None and popen.poll() is None:
                self.peak_rss_kib[name] = _vm_hwm_kib(popen.pid)
            with contextlib.suppress(OSError):
                port = self.metrics_ports[self.workers.index(name)]
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                    totals = _totals(answer.read().decode())
                    self.means[name], self.counts[name] = _means(totals), _counts(totals)
        super()._check()

    def figures(self) -> dict[str, str]:
        latencies = [value for seen in self.observed.values() for value in seen.latencies()]
        ends = [at for seen in self.observed.values() if (at := seen.succeeded_at()) is not None]
        rows = {
            "Succeeded": f"{self.report.phases['Succeeded']} of {self.plan.migrations}",
            "total time (apply -> last Succeeded seen)": f"{max(ends) - self.applied_at:.1f} s" if ends else "-",
        }
        for name in self.workers:
            rows[f"{name} peak RSS (VmHWM)"] = f"{self.peak_rss_kib.get(name, 0) / 1024:.0f} MiB"
            for kind in ("ActivityWorker", "LocalActivityWorker", "WorkflowWorker"):
                rows[f"{name} peak {kind} slots used"] = str(self.peak_slots.get((name, kind), "-"))
            for what, mean in self.means.get(name, {}).items():
                rows[f"{name} mean {what}"] = f"{mean:.3f} s"
            for what, count in self.counts.get(name, {}).items():
                rows[f"{name} {what}"] = f"{count:.0f}"
        if self.burst_cpu is not None:
            rows[f"machine CPU busy, first {BURST:.0f} s after the apply"] = f"{100 * self.burst_cpu.busy:.0f} %"
            for name, seconds in sorted(self.burst_cpu.by_process.items(), key=lambda item: -item[1])[:7]:
                rows[f"  CPU used in those {BURST:.0f} s by {name}"] = f"{seconds:.1f} s"
        if self.burst_requests is not None:
            rows[f"API server requests in those {BURST:.0f} s"] = str(self.burst_requests.total())
            for kind, count in self.burst_requests.most_common(10):
                rows[f"  {kind}"] = str(count)
        written: list[tuple[float, float]] = []  # (transition -> received, -> answered) of each stamp's first write
        for namespace in self.observed:
            for stamp, (received, at) in self.answered.get(namespace, {}).items():
                moment = _time(stamp).timestamp()
                written.append((received - moment, at - moment))
        if written:
            arrived, committed = [received for received, _ in written], [at for _, at in written]
            rows["transitions written"] = str(len(written))
            rows["transition -> write received by the API server p50"] = f"{_percentile(arrived, 0.50):.3f} s"
            rows["transition -> write received by the API server p99"] = f"{_percentile(arrived, 0.99):.3f} s"
            serving = [at - received for received, at in written]
            rows["API server's own time on those writes p50"] = f"{_percentile(serving, 0.50):.3f} s"
            rows["API server's own time on those writes p99"] = f"{_percentile(serving, 0.99):.3f} s"
            rows["transition -> answered by the API server p50"] = f"{_percentile(committed, 0.50):.3f} s"
            rows["transition -> answered by the API server p99"] = f"{_percentile(committed, 0.99):.3f} s"
            rows["transition -> answered by the API server max"] = f"{max(committed):.3f} s"
        if latencies:
            rows["transitions measured"] = str(len(latencies))
            rows["transition -> visible p50"] = f"{_percentile(latencies, 0.50):.3f} s"
            rows["transition -> visible p99"] = f"{_percentile(latencies, 0.99):.3f} s"
            rows["transition -> visible max"] = f"{max(latencies):.3f} s"
            marked = sorted((pair for seen in self.observed.values() for pair in seen.marked()), reverse=True)
            slowest = collections.Counter(what for _, what in marked[: max(1, len(marked) // 20)])
            rows["slowest 5 %: what they mark"] = ", ".join(f"{what}: {n}" for what, n in slowest.most_common(3))
        if self.report.problems:
            rows["problems"] = str(len(self.report.problems))
        return rows


# --- the four kinds of run whose histories are measured -----------------------------------------

SCENARIOS = ("default plan", "paused then resumed", "snapshot failing 3 times", "rolled back")


class ScenarioRun(ObservedRun):
    """One Migration of each kind, at once. The snapshot of the third writes to an S3 server of its own, stopped once
    its precheck passed and started again after three failed attempts: a real outage, which the saga retries."""

    def __init__(self, *args: Any, binaries: Binaries, outage_dir: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.binaries, self.outage_dir = binaries, outage_dir
        self.outage = Stack(outage_dir, components=frozenset({"s3"}), binaries=binaries)
        self.outage_info: StackInfo | None = None
        self.outage_state = "not started"
        self.resumed = self.rolled_back = False

    def _prepare(self) -> None:
        super()._prepare()
        self.outage_info = self.outage.start()
        self.outage_state = "up"
        self.outage_info.s3_client().create_bucket(Bucket=self.bucket)
        assert self.outage_info.s3_access_key is not None
        assert self.outage_info.s3_secret_key is not None
        k8s.CoreV1Api(self.api).create_namespaced_secret(
            self.subjects[2].namespace,
            k8s.V1Secret(
                metadata=k8s.V1ObjectMeta(name="outage-s3"),
                string_data={
                    "accessKeyId": self.outage_info.s3_access_key,
                    "secretAccessKey": self.outage_info.s3_secret_key,
                },
            ),
        )

    def _manifest(self, subject: Subject) -> dict[str, Any]:
        manifest = super()._manifest(subject)
        spec = manifest["spec"]
        if subject.index == 1:
            spec["paused"] = True
        elif subject.index == 2:
            assert self.outage_info is not None
            spec["snapshot"].update(endpoint=self.outage_info.s3_endpoint, credentialsSecret="outage-s3")
        elif subject.index == 3:
            spec["approval"] = {"required": True}
        return manifest

    def _latest(self, index: int) -> dict[str, Any]:
        statuses = self.observed[self.subjects[index].namespace].statuses
        return statuses[-1][1] if statuses else {}

    def _step(self, index: int, name: str) -> dict[str, Any]:
        return next((step for step in self._latest(index).get("steps", []) if step["name"] == name), {})

    def _drive(self, started: float) -> None:
        """The scenarios' moves, on the main thread (where the stack's processes are started and stopped)."""
        custom = k8s.CustomObjectsApi(self.api)
        next_look = 0.0
        paused_since: float | None = None
        while True:
            if not self.resumed and self._latest(1).get("phase") == "Paused":
                paused_since = paused_since or time.monotonic()
                if time.monotonic() - paused_since > 5:
                    self._patch(custom, 1, {"spec": {"paused": False}})
                    self.resumed = True
            if self.outage_state == "up" and self._step(2, "precheck").get("state") == "Succeeded":
                self.outage.stop()
                self.outage_state = "down"
            snapshot = self._step(2, "snapshot")
            if self.outage_state == "down" and snapshot.get("attempts", 0) >= 3 and snapshot["state"] == "Retrying":
                self.outage = Stack(self.outage_dir, components=frozenset({"s3"}), binaries=self.binaries)
                self.outage.start()  # same folder, same port
                self.outage_state = "back"
            if not self.rolled_back and self._latest(3).get("phase") == "AwaitingApproval":
                # Signed by the stack's admin, as whom the bench acts (deploy/admission checks the name).
                annotation = {"ferry.dev/rollback": f"{pki.ADMIN.common_name}: rolled back while awaiting approval"}
                self._patch(custom, 3, {"metadata": {"annotations": annotation}})
                self.rolled_back = True
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + 2
                if self._all_ended(started):
                    return
            time.sleep(0.2)

    def _patch(self, custom: k8s.CustomObjectsApi, index: int, patch: dict[str, Any]) -> None:
        subject = self.subjects[index]
        assert subject.ref is not None
        custom.patch_namespaced_custom_object(GROUP, VERSION, subject.namespace, PLURAL, subject.ref.name, patch)

    def _expectation(self, subject: Subject) -> str:
        return "nothing left" if subject.index == 3 else "data equal"

    def histories(self) -> list[tuple[str, str, History]]:
        async def fetch(client: Client) -> list[tuple[str, str, History]]:
            found = []
            for name, subject in zip(SCENARIOS, self.subjects, strict=True):
                assert subject.ref is not None
                fetched = await client.get_workflow_handle(workflow_id(subject.ref)).fetch_history()
                found.append((name, subject.final_phase or "?", History.of(fetched)))
            return found

        return self._temporal(fetch)


# --- running them ----------------------------------------------------------------------------------


@contextlib.contextmanager
def stack_for_runs(workdir: Path) -> Iterator[tuple[Binaries, StackInfo, k8s.ApiClient, Stack]]:
    binaries = ensure_binaries()
    components = frozenset({"kubernetes", "s3", "postgres"})
    with Stack(workdir / "stack", components=components, binaries=binaries, audit_status_writes=True) as info:
        install_crd([str(binaries.kubectl), f"--kubeconfig={info.kubeconfig}"])
        api = config.new_client_from_config(config_file=str(info.kubeconfig))
        with own_temporal(workdir / "temporal", binaries) as temporal:
            yield binaries, info, api, temporal


def table(columns: dict[str, dict[str, str]]) -> str:
    names = list(dict.fromkeys(name for rows in columns.values() for name in rows))
    width = max(len(name) for name in names)
    widths = [max(len(title), *(len(rows.get(name, "")) for name in names)) for title, rows in columns.items()]
    lines = [" " * width + "".join(f"  {title:>{w}}" for title, w in zip(columns, widths, strict=True))]
    for name in names:
        cells = (rows.get(name, "-") for rows in columns.values())
        lines.append(f"{name:<{width}}" + "".join(f"  {cell:>{w}}" for cell, w in zip(cells, widths, strict=True)))
    return "\n".join(lines)


def fleets(args: argparse.Namespace, workdir: Path) -> int:
    columns: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    with stack_for_runs(workdir) as (_, info, api, temporal):
        for workers in args.workers:
            plan = ChaosPlan(migrations=args.migrations, rollbacks=0, deletions=0, kills=0, rows=args.rows,
                             timeout=args.timeout)  # fmt: skip
            run = ObservedRun(
                info,
                temporal,
                api,
                plan,
                workdir / f"{workers}-workers",
                workers=workers,
                component_cwd=args.source,
                split=args.split,
            )
            run.workdir.mkdir()
            try:
                run.run()
            finally:
                cleanup(run)
            columns[f"{workers} worker{'s' if workers > 1 else ''}"] = run.figures()
            problems += run.report.problems
    print(f"\n{args.migrations} Migrations at once ({args.rows} rows each), source: {args.source or 'this checkout'}\n")
    print(table(columns))
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print(f"\nlogs of ferry's processes: {workdir}")
    return 1 if problems else 0


def histories(args: argparse.Namespace, workdir: Path) -> int:
    with stack_for_runs(workdir) as (binaries, info, api, temporal):
        plan = ChaosPlan(migrations=len(SCENARIOS), rollbacks=0, deletions=0, kills=0, rows=args.rows,
                         timeout=args.timeout)  # fmt: skip
        run = ScenarioRun(
            info, temporal, api, plan, workdir / "scenarios", workers=1, component_cwd=args.source,
            binaries=binaries, outage_dir=workdir / "outage-s3",
        )  # fmt: skip
        run.workdir.mkdir()
        try:
            run.run()
            found = run.histories()
        finally:
            cleanup(run)
            run.outage.stop()
    print(f"\nhistory of each kind of run, source: {args.source or 'this checkout'}\n")
    columns = {
        name: {"final phase": phase, **history.figures()} for name, phase, history in found
    }  # one column per scenario
    print(table(columns))
    for problem in run.report.problems:
        print(f"PROBLEM: {problem}")
    return 1 if run.report.problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--histories", action="store_true", help="measure the four kinds of run's histories instead")
    parser.add_argument("--migrations", type=int, default=50)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="one fleet per count, in order")
    parser.add_argument(
        "--split", action="store_true",
        help="the first worker runs only workflows and status writes (--runs=workflows), the others only steps",
    )  # fmt: skip
    parser.add_argument("--rows", type=int, default=500, help="rows in each source database")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for every Migration to end")
    parser.add_argument("--source", type=Path, help="a checkout of ferry whose worker and watcher to run")
    args = parser.parse_args()
    if args.split and not args.histories and min(args.workers) < 2:
        parser.error("--split needs two workers or more in every fleet (one for workflows, one for steps): --workers 2")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    workdir = Path(tempfile.mkdtemp(prefix="ferry-bench-fleet-"))
    workdir.chmod(0o755)
    try:
        return histories(args, workdir) if args.histories else fleets(args, workdir)
    finally:
        keep_only_logs(workdir)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
