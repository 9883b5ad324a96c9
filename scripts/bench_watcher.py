"""Benchmark of the watcher: create → workflow start latency, and the watcher at scale (issue #17).

Starts a stack of its own (Kubernetes and Temporal only) unless --state-dir names a
running one, and runs `ferry watcher` as a separate process. No worker runs: workflows
start and wait, so no data moves. Two modes:

- a burst (default): creates --count Migrations as fast as one client can (--threads at
  once) and prints the median, p99 and maximum of (workflow start time, from Temporal) -
  (create returned), then the same for as many direct start_workflow calls on the same
  Temporal server, the ratio of the two throughputs, and the CPU each component spent
  on each burst (API server, etcd, Temporal, watcher, this client); then the watcher's
  own pace: as many Migrations created while it is stopped, and how fast it starts
  their workflows once it has listed them;

      .venv/bin/python scripts/bench_watcher.py --count 500

- at scale (--scale N): N Migrations present first (half Succeeded, half Paused with
  their workflow recorded, all created in parallel with no workflow behind them), then
  one table: the watcher's memory (VmRSS, VmHWM), its CPU between events over a window of
  at least two resyncs, its Temporal calls per resync (its own /metrics), a restart
  (SIGKILL, start, list, act on a new Migration), creates at a steady rate, and a burst
  compared with as many direct start_workflow calls on the same Temporal server.

      .venv/bin/python scripts/bench_watcher.py --scale 10000
"""

# ruff: noqa: ASYNC251 - a benchmark driver; blocking calls are fine here
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from temporalio.client import Client

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devstack.stack.install import ensure_binaries  # noqa: E402
from devstack.stack.processes import ProcessStat, process_stats  # noqa: E402
from devstack.stack.readiness import free_port  # noqa: E402
from devstack.stack.stack import Stack, StackInfo  # noqa: E402
from ferry.api.migration import FINALIZER, WORKFLOW_ANNOTATION, MigrationSpec  # noqa: E402
from ferry.api.saga import MigrationRef, workflow_id  # noqa: E402
from ferry.clients import TemporalSettings, connect_temporal  # noqa: E402
from tests import samples  # noqa: E402
from tests.cluster import install_crd  # noqa: E402
from watcher.starting import ensure_started  # noqa: E402

GROUP, VERSION, PLURAL = "ferry.dev", "v1alpha1", "migrations"
MERGE = "application/merge-patch+json"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return ordered[index]


# --- the watcher process, seen from outside ------------------------------------------------


@dataclasses.dataclass
class WatcherProcess:
    argv: list[str]
    log_path: Path
    metrics_url: str
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.started_at = time.time()
            self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def stop(self, signum: int = signal.SIGTERM) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signum)
            self.popen.wait(60)

    def memory_mib(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) in MiB: resident now, and the peak so far."""
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.pid}/status").read_text().splitlines())
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

    def cpu_seconds(self) -> float:
        """User and system CPU time of the process so far."""
        stat = ProcessStat.read(self.pid)
        assert stat is not None, f"the process {self.pid} is gone"
        return stat.own_cpu_ticks / CLOCK_TICKS

    def counters(self) -> dict[str, dict[str, float]]:
        """ferry's watcher counters from /metrics, by metric then label value."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text: str = response.read().decode()
        found: dict[str, dict[str, float]] = {}
        for metric, label in (
            ("ferry_watcher_temporal_calls_total", "call"),
            ("ferry_watcher_passes_total", "action"),
            ("ferry_watcher_events_total", "type"),
        ):
            values = found.setdefault(metric, {})
            for match in re.finditer(rf"^{metric}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE):
                key = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1))).get(label, "")
                values[key] = values.get(key, 0.0) + float(match.group(2))
        return found

    def event_to_start(self) -> tuple[float, float]:
        """(sum of seconds, count) of the watcher's own histogram: from receiving a new Migration to its start."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text: str = response.read().decode()
        found = dict.fromkeys(("sum", "count"), 0.0)
        for match in re.finditer(r"^ferry_watcher_event_to_start_seconds_(sum|count)(?:\{[^}]*\})? (\S+)$", text, re.M):
            found[match.group(1)] += float(match.group(2))
        return found["sum"], found["count"]

    def listings(self) -> list[tuple[int, float]]:
        """(Migrations listed, when) for every full list the log shows, in order."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            match = re.search(r"listed (\d+) Migrations", line)
            if match:
                moment = re.search(r'"time": "([^"]+)"', line)
                at = datetime.fromisoformat(moment.group(1)).timestamp() if moment else time.time()
                found.append((int(match.group(1)), at))
        return found


COMPONENTS = {
    "kube-apiserver": "kube-apiserver",
    "etcd": "etcd",
    "temporal server start-dev": "Temporal",
    "ferry.cli watcher": "watcher",
}
"""Command-line fragments of the processes whose CPU a burst's figures break down, and their names there."""


def cpu_by_component() -> dict[str, float]:
    """CPU seconds used so far by each component of COMPONENTS, and by this benchmark (the creating client)."""
    used = dict.fromkeys([*COMPONENTS.values(), "benchmark client"], 0.0)
    for stat in process_stats():
        try:
            command = Path(f"/proc/{stat.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # it ended meanwhile
        seconds = stat.own_cpu_ticks / CLOCK_TICKS
        if stat.pid == os.getpid():
            used["benchmark client"] += seconds
            continue
        for fragment, name in COMPONENTS.items():
            if fragment in command:
                used[name] += seconds
                break
    return used


def cpu_spent(before: dict[str, float]) -> str:
    after = cpu_by_component()
    return ", ".join(f"{name} {after[name] - before.get(name, 0.0):.1f}" for name in after)


def wait_until(what: str, check: Callable[[], bool], within: float, every: float = 0.05) -> float:
    """Polls `check` until it holds; returns when (time.time()); fails naming `what` at the deadline."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {within:.0f}s waiting for {what}")
        time.sleep(every)
    return time.time()


# --- the cluster side ----------------------------------------------------------------------


@dataclasses.dataclass
class Cluster:
    info: StackInfo
    namespace: str
    _local: threading.local = dataclasses.field(default_factory=threading.local)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        """A client per thread, so parallel creates do not share one connection pool."""
        if not hasattr(self._local, "custom"):
            api = k8s_config.new_client_from_config(config_file=str(self.info.kubeconfig))
            self._local.custom = k8s.CustomObjectsApi(api)
        custom: k8s.CustomObjectsApi = self._local.custom
        return custom

    def create(self, name: str, **spec: Any) -> MigrationRef:
        manifest = samples.migration(name, **spec)
        if spec.get("paused"):
            manifest["metadata"]["finalizers"] = [FINALIZER]
        obj = self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, manifest)
        return MigrationRef(namespace=self.namespace, name=name, uid=obj["metadata"]["uid"])

    def create_settled(self, name: str, phase: str) -> MigrationRef:
        """A Migration whose workflow the status names (as the saga's mirror leaves it): Succeeded, or Paused (whose
        run `populate` starts: the watcher marks Abandoned an unfinished Migration whose run Temporal does not have)."""
        ref = self.create(name, paused=phase == "Paused")
        status = {"phase": phase, "observedGeneration": 1, "workflow": {"namespace": "default", "id": workflow_id(ref)}}
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURAL, name, {"status": status}, _content_type=MERGE
        )
        return ref

    def recorded(self, refs: dict[str, MigrationRef]) -> bool:
        """Whether the watcher's annotation names the workflow of every one of `refs`."""
        listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)["items"]
        found = {item["metadata"]["name"]: (item["metadata"].get("annotations") or {}) for item in listed}
        return all(found.get(name, {}).get(WORKFLOW_ANNOTATION) == workflow_id(ref) for name, ref in refs.items())

    def release(self, name: str) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, {"metadata": {"finalizers": None}}, _content_type=MERGE
        )


def prepare(info: StackInfo, namespace: str) -> Cluster:
    api = k8s_config.new_client_from_config(config_file=str(info.kubeconfig))
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    install_crd([str(ensure_binaries().kubectl), f"--kubeconfig={info.kubeconfig}"])
    return Cluster(info, namespace)


def watcher_process(info: StackInfo, namespace: str, task_queue: str, logs: Path, *extra: str) -> WatcherProcess:
    address = f"127.0.0.1:{free_port()}"
    argv = [
        sys.executable, "-m", "ferry.cli", "watcher", f"--kubeconfig={info.kubeconfig}",
        f"--temporal-address={info.temporal_address}", f"--task-queue={task_queue}",
        f"--namespaces={namespace}", f"--lease-namespace={namespace}", f"--metrics-address={address}",
        # The same identity after a restart, as a restarted container has: it takes its Lease back at once.
        "--identity=bench-watcher", *extra,
    ]  # fmt: skip
    return WatcherProcess(argv, logs / "watcher.log", f"http://{address}/metrics")


async def start_times(
    client: Client, refs: dict[str, MigrationRef], within: float, task_queue: str, since: float
) -> dict[str, float]:
    """When each Migration's workflow started (Temporal's clock), by name; fails if one has none in time.

    One visibility query a second (the workflows on `task_queue` started since `since`),
    not a describe per Migration in a loop: polling must not load the Temporal server
    whose starts it measures.
    """
    names = {workflow_id(ref): name for name, ref in refs.items()}
    after = datetime.fromtimestamp(since - 1, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    query = f"TaskQueue = '{task_queue}' AND StartTime >= '{after}'"
    deadline = time.monotonic() + within
    while True:
        found = {
            names[execution.id]: execution.start_time.timestamp()
            async for execution in client.list_workflows(query)
            if execution.id in names
        }
        if len(found) == len(names):
            return found
        if time.monotonic() > deadline:
            missing = sorted(set(refs) - set(found))
            raise SystemExit(f"{len(missing)} Migrations got no workflow within {within:.0f}s, e.g. {missing[:3]}")
        await asyncio.sleep(1.0)


# --- the burst mode (as before) ------------------------------------------------------------


async def burst_mode(info: StackInfo, args: argparse.Namespace, logs: Path) -> Figures:
    """A watcher on an empty namespace, then `burst` of --count creates."""
    figures = Figures()
    namespace = f"bench-{int(time.time())}"
    task_queue = f"bench-{namespace}"
    cluster = prepare(info, namespace)
    process = watcher_process(info, namespace, task_queue, logs, f"--concurrency={args.concurrency}")
    process.start()
    client = await connect_temporal(TemporalSettings(address=str(info.temporal_address)))
    load = os.getloadavg()[0]
    try:
        wait_until("the watcher's first list", lambda: bool(process.listings()), 60)
        direct = await burst(process, cluster, client, args, args.count, task_queue, figures)
        await backlog(process, cluster, client, args, task_queue, direct, figures)
        figures.add(
            "machine: cores, load average (1 min) at start / end",
            f"{os.cpu_count()}, {load:.1f} / {os.getloadavg()[0]:.1f}",
        )
        return figures
    finally:
        process.stop()
        await terminate_all(client, f"(TaskQueue = '{task_queue}' OR TaskQueue = '{task_queue}-direct')")


async def terminate_all(client: Client, query: str) -> None:
    limit = asyncio.Semaphore(16)

    async def one(workflow: str) -> None:
        async with limit:
            await client.get_workflow_handle(workflow).terminate("benchmark finished")

    ids = [execution.id async for execution in client.list_workflows(f"{query} AND ExecutionStatus = 'Running'")]
    await asyncio.gather(*(one(workflow) for workflow in ids))


# --- the scale mode ------------------------------------------------------------------------


@dataclasses.dataclass
class Figures:
    rows: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)

    def add(self, what: str, value: str, target: str = "") -> None:
        self.rows.append((what, value, target))
        print(f"  {what}: {value}", flush=True)

    def latencies(self, what: str, values: list[float], p50: str = "", p99: str = "") -> None:
        ms = [value * 1000 for value in values]
        self.add(f"{what} p50", f"{statistics.median(ms):.0f} ms", p50)
        self.add(f"{what} p99", f"{percentile(ms, 0.99):.0f} ms", p99)
        self.add(f"{what} max", f"{max(ms):.0f} ms")

    def print(self) -> None:
        width = max(len(row[0]) for row in self.rows)
        value_width = max(len(row[1]) for row in self.rows)
        print(f"\n{'figure'.ljust(width)}  {'measured'.rjust(value_width)}  target")
        for what, value, target in self.rows:
            print(f"{what.ljust(width)}  {value.rjust(value_width)}  {target}")


def kinds(index: int) -> tuple[str, str]:
    """The name and phase of the index-th Migration present: Succeeded and Paused in turn."""
    return (f"done-{index:05d}", "Succeeded") if index % 2 == 0 else (f"paused-{index:05d}", "Paused")


async def populate(
    cluster: Cluster, client: Client, args: argparse.Namespace, task_queue: str, figures: Figures
) -> None:
    """--scale Migrations, half Succeeded, half Paused; each Paused one with its run, Running on the watcher's task
    queue (no worker polls it), as a paused saga is."""
    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
        made = list(pool.map(lambda index: (kinds(index)[1], cluster.create_settled(*kinds(index))), range(args.scale)))
    spec = MigrationSpec.model_validate(samples.migration()["spec"])
    limit = asyncio.Semaphore(args.concurrency)

    async def run_of(ref: MigrationRef) -> None:
        async with limit:
            await ensure_started(client, ref, 1, spec.model_copy(update={"paused": True}), task_queue)

    await asyncio.gather(*(run_of(ref) for phase, ref in made if phase == "Paused"))
    figures.add(
        "Migrations present (half Succeeded, half Paused with their runs)",
        f"{args.scale}, made in {time.monotonic() - began:.0f} s",
    )


def handled_all(process: WatcherProcess, count: int) -> Callable[[], bool]:
    """Whether the watcher's passes (of whatever action) add up to `count` yet."""

    def check() -> bool:
        try:
            return sum(process.counters()["ferry_watcher_passes_total"].values()) >= count
        except OSError:
            return False

    return check


def at_rest(process: WatcherProcess, args: argparse.Namespace, figures: Figures) -> None:
    """Memory and CPU between events, over a window of at least two resyncs, and what each resync asked Temporal."""
    cpu, before = process.cpu_seconds(), process.counters()
    counted = before["ferry_watcher_temporal_calls_total"]
    window = max(args.idle_seconds, 2 * args.resync_interval + 5)
    time.sleep(window)
    spent = process.cpu_seconds() - cpu
    calls = process.counters()["ferry_watcher_temporal_calls_total"]
    delta = {name: calls[name] - counted.get(name, 0.0) for name in calls if calls[name] > counted.get(name, 0.0)}
    resyncs = delta.get("list_workflows", 0.0)  # each resync asks exactly one visibility query
    events = process.counters()["ferry_watcher_events_total"]
    received = {kind: events[kind] - before["ferry_watcher_events_total"].get(kind, 0.0) for kind in events}
    rss, hwm = process.memory_mib()
    figures.add("events received while idle", ", ".join(f"{k}={v:.0f}" for k, v in received.items() if v) or "none")
    figures.add("watcher RSS at rest", f"{rss:.0f} MiB", "≤ 150 MB")
    figures.add("watcher RSS peak (VmHWM, first start)", f"{hwm:.0f} MiB", "≤ 150 MB")
    figures.add(
        f"idle CPU over {window:.0f} s ({resyncs:.0f} resyncs)", f"{100 * spent / window:.2f} % of a core", "≈ 0"
    )
    per_resync = f"{sum(delta.values()) / resyncs:.1f}" if resyncs else "no resync seen"
    figures.add(
        "Temporal calls per resync", f"{per_resync} ({', '.join(f'{k}={v:.0f}' for k, v in delta.items())})", "O(1)"
    )


async def steady(
    process: WatcherProcess, cluster: Cluster, client: Client, args: argparse.Namespace, task_queue: str,
    figures: Figures,
) -> int:  # fmt: skip
    """Creates at --steady-rate for --steady-seconds; returns how many."""
    own_before = process.event_to_start()
    refs, created = {}, {}
    began, since = time.monotonic(), time.time()
    for index in range(int(args.steady_rate * args.steady_seconds)):
        time.sleep(max(0.0, began + index / args.steady_rate - time.monotonic()))
        name = f"steady-{index:04d}"
        refs[name] = cluster.create(name)
        created[name] = time.time()
    started = await start_times(client, refs, 120, task_queue, since)
    what = f"steady {args.steady_rate:g}/s create → start ({len(refs)})"
    figures.latencies(what, [started[name] - created[name] for name in refs], "≤ 100 ms", "≤ 500 ms")
    own = [after - before for after, before in zip(process.event_to_start(), own_before, strict=True)]
    figures.add("  of which the watcher's own (event received → started), mean", f"{1000 * own[0] / own[1]:.0f} ms")
    return len(refs)


async def restart(process: WatcherProcess, cluster: Cluster, client: Client, task_queue: str, figures: Figures) -> None:
    """SIGKILL, then a start: how long until it has listed everything and started a Migration created meanwhile."""
    process.stop(signal.SIGKILL)
    lists_before, since = len(process.listings()), time.time()
    probe = {"restart-probe": cluster.create("restart-probe")}
    process.start()
    wait_until("the list after the restart", lambda: len(process.listings()) > lists_before, 120)
    count, listed_at = process.listings()[lists_before]
    probe_started = (await start_times(client, probe, 60, task_queue, since))["restart-probe"]
    figures.add(f"restart: start → listed all {count}", f"{listed_at - process.started_at:.1f} s", "≤ 10 s")
    figures.add("restart: start → new Migration's workflow", f"{probe_started - process.started_at:.1f} s")
    figures.add("restart: listed → new Migration's workflow", f"{probe_started - listed_at:+.2f} s", "≤ 1 s")


async def burst(
    process: WatcherProcess,
    cluster: Cluster,
    client: Client,
    args: argparse.Namespace,
    count: int,
    task_queue: str,
    figures: Figures,
) -> float:
    """`count` creates as fast as one client can (--threads at once), then as many direct starts on another task
    queue nobody polls. Creating one at a time would measure the client's round trips, not the watcher.
    `task_queue` is the watcher's.

    Both sides are timed by Temporal's start times, read once each side's starts are done: the
    direct side once its calls have returned, the ferry side once the watcher's own count of
    starts says so. Reading Temporal's visibility while the starts go on would load the
    server whose pace is measured, on one side only."""

    def create(index: int) -> tuple[str, MigrationRef, float]:
        name = f"burst-{index:04d}"
        ref = cluster.create(name)
        return name, ref, time.time()

    with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
        await warm_up(cluster, client, pool, args.threads, task_queue)
        before = _started_by(process)
        cpu = cpu_by_component()
        first = time.time()
        made = list(pool.map(create, range(count)))
    creating = time.time() - first
    wait_until("the watcher's count of starts", lambda: _started_by(process) >= before + count, 300, every=0.2)
    refs = {name: ref for name, ref, _ in made}
    created = {name: at for name, _, at in made}
    started = await start_times(client, refs, 300, task_queue, first)
    ferry = count / (max(started.values()) - first)
    figures.add(f"burst: {count} creates by one client ({args.threads} at once)", f"{count / creating:.0f} creates/s")
    figures.latencies("burst via ferry create → start", [started[name] - created[name] for name in refs])
    figures.add("burst via ferry: CPU seconds spent", cpu_spent(cpu))
    # No worker writes a status naming the runs, so the watcher records each start in its annotation after
    # --record-start-after: let those writes land before the direct calls, which would share the machine with them.
    wait_until("the watcher's record of every start", lambda: cluster.recorded(refs), 120 + count / 10, every=0.5)
    cpu = cpu_by_component()
    latencies, direct = await direct_starts(client, f"{task_queue}-direct", cluster.namespace, count, args.concurrency)
    figures.latencies(f"burst direct start_workflow ({args.concurrency} at once)", latencies)
    figures.add("burst direct: CPU seconds spent", cpu_spent(cpu))
    figures.add("burst throughput: ferry / direct", f"{ferry:.0f}/s / {direct:.0f}/s = {ferry / direct:.2f}", "≥ 0.8")
    return direct


def _started_by(process: WatcherProcess) -> float:
    """How many workflows the watcher process has started, by its own count; -1 while it does not answer."""
    try:
        return process.event_to_start()[1]
    except OSError:
        return -1.0


async def warm_up(
    cluster: Cluster, client: Client, pool: concurrent.futures.ThreadPoolExecutor, threads: int, task_queue: str
) -> None:
    """One Migration per creating thread, through the watcher to its workflow, before the clock starts.

    Measured: the first creates after the CRD is installed wait about 2 s on the API server
    (its handler for the new resource and the admission policies' first checks), and each
    thread makes its client and connection on its first create. Neither is the watcher's
    doing, and counting them would charge a burst through ferry with a one-off cost the
    direct calls, which run second, never pay.
    """
    since = time.time()
    names = [f"warm-{index:02d}" for index in range(threads)]
    refs = dict(zip(names, pool.map(cluster.create, names), strict=True))
    await start_times(client, refs, 120, task_queue, since)


async def backlog(
    process: WatcherProcess,
    cluster: Cluster,
    client: Client,
    args: argparse.Namespace,
    task_queue: str,
    direct: float,
    figures: Figures,
) -> None:
    """The watcher's own pace, with the creates out of the way: --count Migrations created while it is stopped, then
    a start; from its list to the last of their workflows' starts. Each costs a start (and, in a namespace the
    finalizer policy leaves out, the watcher's one write), so this is the most a burst through ferry could reach on
    this machine."""
    process.stop()
    lists_before = len(process.listings())
    names = [f"backlog-{index:04d}" for index in range(args.count)]
    with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
        refs = dict(zip(names, pool.map(cluster.create, names), strict=True))
    since = time.time()
    process.start()
    wait_until("the list after the start", lambda: len(process.listings()) > lists_before, 120)
    listed, listed_at = process.listings()[lists_before]
    # As in `burst`: Temporal's start times are read once the watcher counts every start, not while it makes them.
    wait_until("the watcher's count of starts", lambda: _started_by(process) >= len(refs), 300, every=0.2)
    started = await start_times(client, refs, 300, task_queue, since)
    pace = len(refs) / (max(started.values()) - listed_at)
    figures.add(
        f"backlog: {len(refs)} created while the watcher was stopped, then its start: listed {listed} → last start",
        f"{max(started.values()) - listed_at:.1f} s, {pace:.0f}/s",
    )
    figures.add("backlog pace: ferry / the direct calls above", f"{pace:.0f}/s / {direct:.0f}/s = {pace / direct:.2f}")


async def scale_mode(info: StackInfo, args: argparse.Namespace, logs: Path) -> Figures:
    figures = Figures()
    namespace = f"bench-{int(time.time())}"
    task_queue = f"bench-{namespace}"
    cluster = prepare(info, namespace)
    client = await connect_temporal(TemporalSettings(address=str(info.temporal_address)))
    extra = (f"--resync-interval={args.resync_interval}", f"--concurrency={args.concurrency}")
    process = watcher_process(info, namespace, task_queue, logs, *extra)
    load = os.getloadavg()[0]
    try:
        await populate(cluster, client, args, task_queue, figures)
        process.start()
        wait_until("the first list", lambda: bool(process.listings()), 120)
        figures.add("start → listed all (first start)", f"{process.listings()[0][1] - process.started_at:.1f} s")
        wait_until("a pass over every Migration", handled_all(process, args.scale), 300, every=0.5)
        time.sleep(2)
        at_rest(process, args, figures)
        created = await steady(process, cluster, client, args, task_queue, figures)
        await restart(process, cluster, client, task_queue, figures)
        wait_until("a pass over every Migration, restarted", handled_all(process, args.scale + created), 300, every=0.5)
        await burst(process, cluster, client, args, args.burst, task_queue, figures)
        rss, hwm = process.memory_mib()
        figures.add("watcher RSS after the burst", f"{rss:.0f} MiB", "≤ 150 MB")
        figures.add("watcher RSS peak (VmHWM, restarted)", f"{hwm:.0f} MiB", "≤ 150 MB")
        # Every figure above shares the machine: a busy one slows the API server and Temporal most.
        figures.add(
            "machine: cores, load average (1 min) at start / end",
            f"{os.cpu_count()}, {load:.1f} / {os.getloadavg()[0]:.1f}",
        )
        return figures
    finally:
        process.stop()
        await terminate_all(client, f"(TaskQueue = '{task_queue}' OR TaskQueue = '{task_queue}-direct')")
        if args.state_dir:  # a stack that stays: leave no finalizer behind (the finalizer policy gave every one)
            names = [name for name, _ in map(kinds, range(args.scale))]
            with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
                list(pool.map(cluster.release, names))


async def direct_starts(
    client: Client, task_queue: str, namespace: str, count: int, concurrency: int
) -> tuple[list[float], float]:
    """`count` starts of the migration workflow as the watcher makes them, `concurrency` at once, on a task queue
    nobody polls: (each call's latency to its start, starts per second from the first call to the last start)."""
    spec = MigrationSpec.model_validate(samples.migration()["spec"])
    limit = asyncio.Semaphore(concurrency)
    sent: dict[str, float] = {}

    async def one(index: int) -> None:
        ref = MigrationRef(namespace=namespace, name=f"direct-{index:04d}", uid=f"direct-{index}")
        async with limit:
            sent[ref.name] = time.time()
            await ensure_started(client, ref, 1, spec, task_queue)

    first = time.time()
    await asyncio.gather(*(one(index) for index in range(count)))
    refs = {name: MigrationRef(namespace=namespace, name=name, uid=f"direct-{int(name[7:])}") for name in sent}
    started = await start_times(client, refs, 60, task_queue, first)
    return [started[name] - sent[name] for name in sent], count / (max(started.values()) - first)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--count", type=int, default=500, help="burst mode: Migrations to create (default: %(default)s)"
    )
    parser.add_argument("--scale", type=int, help="scale mode: Migrations present while measuring, e.g. 10000")
    parser.add_argument("--threads", type=int, default=8, help="threads creating Migrations (default: %(default)s)")
    parser.add_argument("--resync-interval", type=float, default=30.0, help="the watcher's (default: %(default)s)")
    parser.add_argument(
        "--concurrency", type=int, default=16, help="the watcher's, and the direct starts' (default: %(default)s)"
    )
    parser.add_argument("--idle-seconds", type=float, default=0.0, help="idle window (default: two resyncs and 5 s)")
    parser.add_argument("--steady-rate", type=float, default=10.0, help="creates per second (default: %(default)s)")
    parser.add_argument("--steady-seconds", type=float, default=30.0, help="for this long (default: %(default)s)")
    parser.add_argument(
        "--burst", type=int, default=500, help="scale mode: creates in the burst (default: %(default)s)"
    )
    parser.add_argument("--state-dir", type=Path, help="use the running stack of this state folder")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="ferry-bench-watcher-"))
    print(f"logs in {logs}", flush=True)
    stack = None
    if args.state_dir:
        info = StackInfo.load(args.state_dir)
    else:
        state = Path(tempfile.mkdtemp(prefix="ferry-bench-stack-"))
        state.chmod(0o755)
        stack = Stack(state, components=frozenset({"kubernetes", "temporal"}))
        info = stack.start()
    try:
        if args.scale:
            asyncio.run(scale_mode(info, args, logs)).print()
            return 0
        asyncio.run(burst_mode(info, args, logs)).print()
    finally:
        if stack is not None:
            stack.stop()
            shutil.rmtree(stack.state_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
