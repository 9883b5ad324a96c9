"""Benchmark: the write-downtime window of mode Snapshot against mode Online, with a writer committing throughout.

For each size of --sizes it builds a source database of about that size once (server-side,
as scripts/bench_postgres.py does), then migrates a copy of it in each mode through
ferry's real worker and saga on the local stack (Kubernetes, Temporal, S3, PostgreSQL),
while a writer commits --rate small transactions per second: into the source as an
application's role (the freeze keeps it out), and into the target once switch-traffic
has moved the traffic, as clients behind the Service would. Per size and mode it prints:

- write downtime: status.writeDowntime, from the freeze's start until traffic moved;
- total: from starting the workflow until it ended;
- writes refused: the writer's commits that failed (the freeze, the switch);
- writes acknowledged, and of those the ones missing in the target afterwards (0, or ferry lost a write).

A benchmark, not a test: it asserts nothing about times. The real run needs about
three times the largest size in free disk (template, copy, target, WAL) and takes a while:

    .venv/bin/python scripts/bench_online.py --sizes 10MB               # a quick look, a few minutes
    .venv/bin/python scripts/bench_online.py --sizes 1GB,4GB            # the figures of docs/architecture.md
    .venv/bin/python scripts/bench_online.py --sizes 1GB --modes Online --rate 200
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from kubernetes import client as k8s
from kubernetes import config
from psycopg import sql

from devstack.stack.install import Binaries, ensure_binaries
from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.stack import Stack, StackInfo
from ferry.api.migration import GROUP, PLURAL, VERSION, MigrationSpec
from ferry.api.saga import WORKFLOW_NAME, MigrationInput, MigrationRef, workflow_id
from ferry.clients import TemporalSettings, connect_temporal
from scripts.bench_postgres import build_source, megabytes
from tests import samples
from tests.cluster import create_source, install_crd
from tests.end_to_end import running_worker, worker_settings

TEMPLATE = "ferry_bench"
WRITES = "create table public.bench_writes (id bigint primary key, at timestamptz not null default now())"
MODES = ("Snapshot", "Online")


def _at(
    endpoint: PostgresEndpoint, database: str, user: str | None = None, password: str | None = None
) -> PostgresEndpoint:
    return dataclasses.replace(
        endpoint, database=database, user=user or endpoint.user, password=password or endpoint.password
    )


def _admin(endpoint: PostgresEndpoint, *statements: sql.Composable | str) -> None:
    with psycopg.connect(endpoint.dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


@dataclasses.dataclass
class Writer:
    """Commits one small insert per transaction at `rate` per second, to `endpoint` (which the run may change)."""

    endpoint: PostgresEndpoint
    rate: float
    acknowledged: list[int] = dataclasses.field(default_factory=list)
    refused: int = 0
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.run, name="writer", daemon=True)

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        connected_to: PostgresEndpoint | None = None
        number, due = 0, time.monotonic()
        while not self.stop.is_set():
            due += 1 / self.rate
            time.sleep(max(0.0, due - time.monotonic()))
            number += 1
            try:
                if conn is None or connected_to != self.endpoint:
                    if conn is not None:
                        conn.close()
                    connected_to = self.endpoint
                    conn = psycopg.connect(connected_to.dsn, autocommit=True, connect_timeout=5)
                conn.execute("insert into public.bench_writes (id) values (%s)", (number,))
            except psycopg.Error:
                self.refused += 1
                if conn is not None and conn.closed:
                    conn = None
                continue
            self.acknowledged.append(number)
        if conn is not None:
            conn.close()


@dataclasses.dataclass
class Outcome:
    size_mb: float
    mode: str
    phase: str
    downtime: float | None
    total: float
    refused: int
    acknowledged: int
    lost: int


@contextlib.contextmanager
def local_stack() -> Iterator[tuple[StackInfo, Binaries, k8s.ApiClient]]:
    """The whole local stack in a folder of its own, with the Migration CRD; removed afterwards."""
    binaries = ensure_binaries()
    folder = Path(tempfile.mkdtemp(prefix="ferry-bench-online-", dir=os.environ.get("FERRY_TEST_TMP", "/tmp")))
    folder.chmod(0o755)  # PostgreSQL may run as another user
    try:
        with Stack(folder, binaries=binaries) as info:
            install_crd([str(binaries.kubectl), f"--kubeconfig={info.kubeconfig}"])
            api = config.new_client_from_config(config_file=str(info.kubeconfig))
            try:
                yield info, binaries, api
            finally:
                api.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def ferry_worker(info: StackInfo, task_queue: str) -> contextlib.AbstractAsyncContextManager[None]:
    return running_worker(worker_settings(info, task_queue))


def _secrets(
    api: k8s.ApiClient, namespace: str, info: StackInfo, source: PostgresEndpoint, target: PostgresEndpoint
) -> None:
    core = k8s.CoreV1Api(api)
    for name, endpoint in (("source", source), ("target", target)):
        data = {"host": endpoint.host, "port": str(endpoint.port), "username": endpoint.user,
                "password": endpoint.password, "database": endpoint.database}  # fmt: skip
        core.create_namespaced_secret(namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name), string_data=data))
    credentials = {"accessKeyId": info.s3_access_key or "", "secretAccessKey": info.s3_secret_key or ""}
    core.create_namespaced_secret(
        namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="s3"), string_data=credentials)
    )


async def migrate(
    info: StackInfo, api: k8s.ApiClient, mode: str, size_mb: int, rate: float, app: tuple[str, str]
) -> Outcome:
    """One Migration of a fresh copy of the template in `mode`, with the writer going; returns what it measured."""
    run = f"bench_{mode.lower()}_{uuid.uuid4().hex[:6]}"
    source_admin, target_admin = info.postgres["source"], info.postgres["target"]
    _admin(source_admin, sql.SQL("create database {} template {} strategy file_copy").format(
        sql.Identifier(run), sql.Identifier(TEMPLATE)))  # fmt: skip
    _admin(target_admin, sql.SQL("create database {}").format(sql.Identifier(run)))
    source, target = _at(source_admin, run), _at(target_admin, run)
    namespace = run.replace("_", "-")
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    _secrets(api, namespace, info, source, target)
    create_source(api, namespace)
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    info.s3_client().create_bucket(Bucket=bucket)
    manifest = samples.migration(
        "bench",
        target={"statefulSet": "orders-db-16", "image": "postgres:16", "storageSize": f"{4 + size_mb // 256}Gi"},
        driver={"type": "postgresql", "sourceSecret": "source", "targetSecret": "target", "mode": mode},
        snapshot={"bucket": bucket, "endpoint": info.s3_endpoint, "region": info.s3_region, "credentialsSecret": "s3",
                  "allowInsecureEndpoint": True,  # the stack's S3 is plain http, on loopback
                  "retention": {"afterSuccess": "Delete"}},
    )  # fmt: skip
    custom = k8s.CustomObjectsApi(api)
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    ref = MigrationRef(namespace=namespace, name="bench", uid=created["metadata"]["uid"])
    writer = Writer(_at(source, run, *app), rate)
    task_queue = f"bench-{uuid.uuid4()}"
    assert info.temporal_address is not None
    client = await connect_temporal(
        TemporalSettings(address=info.temporal_address, namespace=info.temporal_namespace or "default")
    )
    async with ferry_worker(info, task_queue):
        writer.thread.start()
        started = time.monotonic()
        handle = await client.start_workflow(
            WORKFLOW_NAME,
            MigrationInput(ref=ref, generation=1, spec=MigrationSpec.model_validate(manifest["spec"])),
            id=workflow_id(ref),
            task_queue=task_queue,
        )
        status: dict[str, Any] = {}
        while True:
            found = await asyncio.to_thread(
                custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, "bench"
            )
            status = found.get("status") or {}
            moved = any(s["name"] == "switch-traffic" and s["state"] == "Succeeded" for s in status.get("steps", []))
            if moved and writer.endpoint.port != target.port:
                writer.endpoint = target  # the Service now selects the target's Pods: the clients follow
            if status.get("phase") in ("Succeeded", "RolledBack", "Failed"):
                break
            await asyncio.sleep(0.2)
        with contextlib.suppress(Exception):
            await handle.result()
        total = time.monotonic() - started
        writer.stop.set()
        writer.thread.join(30)
    with psycopg.connect(target.dsn) as conn:
        in_target = {row[0] for row in conn.execute("select id from public.bench_writes")}
    with psycopg.connect(source_admin.dsn) as conn:
        row = conn.execute("select pg_database_size(%s)", (run,)).fetchone()
    window = status.get("writeDowntime") or {}
    outcome = Outcome(
        size_mb=(row[0] if row else 0) / 2**20, mode=mode, phase=status.get("phase", "?"),
        downtime=window.get("seconds"), total=total, refused=writer.refused,
        acknowledged=len(writer.acknowledged), lost=len(set(writer.acknowledged) - in_target),
    )  # fmt: skip
    k8s.CoreV1Api(api).delete_namespace(namespace)
    for admin in (source_admin, target_admin):
        _admin(admin, sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(run)))
    return outcome


def table(outcomes: list[Outcome]) -> str:
    header = ["size", "mode", "phase", "write downtime", "total", "writes refused", "acknowledged", "lost"]
    rows = [
        [f"{o.size_mb:,.0f} MB", o.mode, o.phase, f"{o.downtime:.1f} s" if o.downtime is not None else "-",
         f"{o.total:.1f} s", str(o.refused), str(o.acknowledged), str(o.lost)]
        for o in outcomes
    ]  # fmt: skip
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) for line in [header, *rows]
    )


async def bench(sizes: list[int], modes: list[str], rate: float) -> list[Outcome]:
    outcomes = []
    with local_stack() as (info, _binaries, api):
        source_admin = info.postgres["source"]
        app = ("bench_app", secrets.token_urlsafe(12))
        role = sql.Identifier(app[0])
        _admin(source_admin, sql.SQL("create role {} login password {}").format(role, sql.Literal(app[1])))
        for size in sizes:
            print(f"building a source database of about {size} MB ...", flush=True)
            template, _rows = build_source(source_admin, size)
            _admin(template, WRITES, sql.SQL("grant insert, select on public.bench_writes to {}").format(role))
            for mode in modes:
                print(f"migrating {size} MB in mode {mode}, {rate:g} writes per second ...", flush=True)
                outcomes.append(await migrate(info, api, mode, size, rate, app))
            _admin(source_admin, sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(TEMPLATE)))
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1GB,4GB", help="source sizes, e.g. 10MB,1GB (default: %(default)s)")
    parser.add_argument("--modes", default=",".join(MODES), help="modes to compare (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=200.0, help="writer's transactions per second (default: 200)")
    args = parser.parse_args()
    sizes = [megabytes(size) for size in args.sizes.split(",")]
    modes = [mode for mode in args.modes.split(",") if mode]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; choose among {', '.join(MODES)}")
    outcomes = asyncio.run(bench(sizes, modes, args.rate))
    print()
    print(table(outcomes))


if __name__ == "__main__":
    main()
