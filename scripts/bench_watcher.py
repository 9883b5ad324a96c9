"""Benchmark: time from creating a Migration to the start of its workflow, over a burst of creates.

Starts a stack of its own (Kubernetes and Temporal only) unless --state-dir names a
running one, runs `ferry watcher` as a separate process, creates N Migrations as fast
as one client can, and prints the median, p95, p99 and maximum of
(workflow start time, from Temporal) - (moment the create call returned).

    .venv/bin/python scripts/bench_watcher.py --count 200
"""

# ruff: noqa: ASYNC220, ASYNC221 - a benchmark driver; blocking setup calls are fine here
from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devstack.stack.install import ensure_binaries  # noqa: E402
from devstack.stack.stack import Stack, StackInfo  # noqa: E402
from ferry.api.saga import MigrationRef, workflow_id  # noqa: E402
from ferry.clients import TemporalSettings, connect_temporal  # noqa: E402
from tests import samples  # noqa: E402
from tests.cluster import crd_established  # noqa: E402


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return ordered[index]


async def measure(info: StackInfo, count: int, logs: Path) -> list[float]:
    assert info.kubeconfig
    assert info.temporal_address
    api = k8s_config.new_client_from_config(config_file=str(info.kubeconfig))
    namespace = f"bench-{int(time.time())}"
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    crd = ROOT / "deploy" / "crd" / "migrations.ferry.dev.yaml"
    binaries = ensure_binaries()
    base = [str(binaries.kubectl), f"--kubeconfig={info.kubeconfig}"]
    subprocess.run([*base, "apply", "--server-side", "-f", str(crd)], check=True, capture_output=True)
    crd_established(
        lambda: (
            subprocess.run(
                [*base, "get", "crd/migrations.ferry.dev", "-o", "json"], check=True, capture_output=True, text=True
            ).stdout
        ),
        "migrations.ferry.dev",
    )
    task_queue = f"bench-{namespace}"
    watcher = subprocess.Popen(
        [
            sys.executable, "-m", "ferry.cli", "watcher", f"--kubeconfig={info.kubeconfig}",
            f"--temporal-address={info.temporal_address}", f"--task-queue={task_queue}",
            f"--namespaces={namespace}", f"--lease-namespace={namespace}",
        ],
        stdout=(logs / "watcher.log").open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    client = await connect_temporal(TemporalSettings(address=info.temporal_address))
    custom = k8s.CustomObjectsApi(api)
    created: dict[str, tuple[MigrationRef, float]] = {}
    try:
        await asyncio.sleep(3)  # let the watcher win its Lease and list
        for index in range(count):
            manifest = samples.migration(f"bench-{index:04d}")
            obj = custom.create_namespaced_custom_object("ferry.dev", "v1alpha1", namespace, "migrations", manifest)
            ref = MigrationRef(namespace=namespace, name=obj["metadata"]["name"], uid=obj["metadata"]["uid"])
            created[ref.uid] = (ref, time.time())
        latencies: list[float] = []
        pending = dict(created)
        deadline = time.monotonic() + 300
        while pending and time.monotonic() < deadline:
            for uid, (ref, at) in list(pending.items()):
                try:
                    description = await client.get_workflow_handle(workflow_id(ref)).describe()
                except Exception:  # noqa: BLE001 - not started yet
                    continue
                latencies.append(description.start_time.timestamp() - at)
                del pending[uid]
            await asyncio.sleep(0.2)
        if pending:
            raise SystemExit(f"{len(pending)} Migrations got no workflow within 300s; see {logs / 'watcher.log'}")
        async for execution in client.list_workflows(f"FerryNamespace = '{namespace}'"):
            await client.get_workflow_handle(execution.id).terminate("benchmark finished")
        return latencies
    finally:
        watcher.terminate()
        watcher.wait(30)
        api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200, help="Migrations to create (default: %(default)s)")
    parser.add_argument("--state-dir", type=Path, help="use the running stack of this state folder")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="ferry-bench-watcher-"))
    stack = None
    if args.state_dir:
        info = StackInfo.load(args.state_dir)
    else:
        state = Path(tempfile.mkdtemp(prefix="ferry-bench-stack-"))
        state.chmod(0o755)
        stack = Stack(state, components=frozenset({"kubernetes", "temporal"}))
        info = stack.start()
    try:
        latencies = asyncio.run(measure(info, args.count, logs))
    finally:
        if stack is not None:
            stack.stop()
            shutil.rmtree(stack.state_dir, ignore_errors=True)
    print(f"Migrations created: {len(latencies)}")
    print(f"create -> workflow start, median: {statistics.median(latencies) * 1000:.0f} ms")
    print(f"create -> workflow start, p95:    {percentile(latencies, 0.95) * 1000:.0f} ms")
    print(f"create -> workflow start, p99:    {percentile(latencies, 0.99) * 1000:.0f} ms")
    print(f"create -> workflow start, max:    {max(latencies) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
