"""Benchmark: ferry's PostgreSQL driver against a plain `pg_dump | pg_restore` pipe, on a database of a chosen size.

It builds a database of about --size-mb in the stack's source instance (server-side,
with generate_series), then prints:

- the time of a direct `pg_dump -Fc | pg_restore` pipe into a fresh target database, with
  pg_dump's default compression and with ferry's (lower) level;
- ferry's time from freeze to verified: freeze, snapshot to S3, migrate from S3 and
  verify, run directly as activities (ActivityEnvironment) into another fresh database;
- the write-downtime window: from the start of the freeze until writes could resume,
  i.e. until verify is done (undo_freeze, which reopens writes, takes milliseconds);
- the ratio of ferry's time to the pipe's.

It starts a stack of its own (PostgreSQL and S3 only) in a temporary folder, or uses
the running stack whose state folder --state-dir names.

    .venv/bin/python scripts/bench_postgres.py --size-mb 100
    .venv/bin/python scripts/bench_postgres.py --size-mb 1024 --state-dir .ferry/stack
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from temporalio.testing import ActivityEnvironment

from activities.postgres.activities import PostgresActivities
from activities.secrets import DatabaseConnection, S3Credentials
from activities.settings import DataActivitySettings
from devstack.stack.install import ensure_binaries
from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.stack import Stack, StackInfo
from ferry.api.migration import DriverSpec, SnapshotSpec
from ferry.api.saga import (
    FreezeInput,
    MigrateInput,
    MigrationRef,
    SnapshotInput,
    UndoFreezeInput,
    VerifyInput,
    snapshot_key,
)

T = TypeVar("T")
DATABASE = "ferry_bench"
ROWS_PER_BATCH = 500_000
TABLE = """
create table public.orders (
    id bigint primary key,
    customer_id int not null,
    amount numeric(12, 2) not null,
    status text not null,
    note text not null,
    payload jsonb not null,
    created_at timestamptz not null
);
create index orders_by_customer on public.orders (customer_id);
"""
ROWS = """
insert into public.orders
select i, i %% 100000, (i %% 1000000) / 100.0, (array['new', 'paid', 'shipped', 'returned'])[1 + i %% 4],
       md5(i::text) || ' ' || md5((i * 31)::text),
       jsonb_build_object('sku', 'sku-' || i %% 5000, 'qty', 1 + i %% 5, 'gift', i %% 7 = 0),
       timestamptz '2024-01-01 00:00+00' + i * interval '1 second'
from generate_series(%s, %s) as i
"""


class FixedSecrets:
    """The connections a Migration's Secrets would hold; this stack has no Kubernetes."""

    def __init__(self, databases: dict[str, PostgresEndpoint], credentials: S3Credentials) -> None:
        self._databases, self._credentials = databases, credentials

    def database(self, namespace: str, name: str, field: str) -> DatabaseConnection:
        endpoint = self._databases[name]
        return DatabaseConnection(
            endpoint.host, endpoint.port, endpoint.user, endpoint.password, endpoint.database, f"{namespace}/{name}"
        )

    def s3_credentials(self, namespace: str, name: str) -> S3Credentials:
        return self._credentials


def _at(endpoint: PostgresEndpoint, database: str) -> PostgresEndpoint:
    return PostgresEndpoint(endpoint.host, endpoint.port, endpoint.user, endpoint.password, database)


def _fresh_database(admin: PostgresEndpoint, name: str) -> PostgresEndpoint:
    with psycopg.connect(admin.dsn, autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')
        conn.execute(f'create database "{name}"')
    return _at(admin, name)


def _size_mb(endpoint: PostgresEndpoint) -> float:
    with psycopg.connect(endpoint.dsn) as conn:
        row = conn.execute("select pg_database_size(current_database())").fetchone()
    assert row is not None
    return float(row[0]) / 2**20


def build_source(admin: PostgresEndpoint, size_mb: int) -> tuple[PostgresEndpoint, int]:
    """A database of about `size_mb` (pg_database_size), filled in batches; returns it and its row count."""
    source = _fresh_database(admin, DATABASE)
    with psycopg.connect(source.dsn, autocommit=True) as conn:
        conn.execute(TABLE)
        empty = _size_mb(source)
        conn.execute(ROWS, (1, 100_000))
        per_row = (_size_mb(source) - empty) / 100_000
        wanted = max(100_000, int((size_mb - empty) / per_row))
        done = 100_000
        while done < wanted:
            upto = min(wanted, done + ROWS_PER_BATCH)
            conn.execute(ROWS, (done + 1, upto))
            done = upto
            print(f"  generated {done:,} of {wanted:,} rows ({_size_mb(source):,.0f} MB)", flush=True)
        conn.execute("vacuum analyze public.orders")
    return source, done


def pipe(bindir: Path, source: PostgresEndpoint, target: PostgresEndpoint, compress: int | None = None) -> float:
    """Seconds of `pg_dump -Fc | pg_restore`, with the restore options ferry uses; pg_dump's compression by default."""

    def env(endpoint: PostgresEndpoint) -> dict[str, str]:
        return dict(
            os.environ,
            PGHOST=endpoint.host,
            PGPORT=str(endpoint.port),
            PGUSER=endpoint.user,
            PGPASSWORD=endpoint.password,
            PGDATABASE=endpoint.database,
        )

    started = time.perf_counter()
    level = [] if compress is None else [f"--compress={compress}"]
    dump = subprocess.Popen(
        [str(bindir / "pg_dump"), "--format=custom", *level], stdout=subprocess.PIPE, env=env(source)
    )
    restore_options = ["--single-transaction", "--no-owner", "--no-privileges", f"--dbname={target.database}"]
    restored = subprocess.run([str(bindir / "pg_restore"), *restore_options], stdin=dump.stdout, env=env(target))
    assert dump.stdout is not None
    dump.stdout.close()
    if dump.wait() != 0 or restored.returncode != 0:
        raise SystemExit("the pg_dump | pg_restore pipe failed")
    return time.perf_counter() - started


def timed(call: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started


def ferry(info: StackInfo, bindir: Path, source: PostgresEndpoint, target: PostgresEndpoint) -> dict[str, Any]:
    """Freeze, snapshot, migrate and verify as the saga runs them; returns each step's seconds and sizes."""
    assert info.s3_access_key is not None
    assert info.s3_secret_key is not None
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    s3 = info.s3_client()
    s3.create_bucket(Bucket=bucket)
    secrets = FixedSecrets(
        {"source": source, "target": target}, S3Credentials(info.s3_access_key, info.s3_secret_key, "bench/s3")
    )
    postgres = PostgresActivities(None, DataActivitySettings(postgres_bindir=bindir), secrets=secrets)
    ref = MigrationRef(namespace="bench", name="bench", uid=str(uuid.uuid4()))
    driver = DriverSpec(source_secret="source", target_secret="target")
    spec = SnapshotSpec(bucket=bucket, endpoint=info.s3_endpoint, allow_insecure_endpoint=True, credentials_secret="s3")

    def run(activity: Callable[[Any], T], input: Any) -> T:
        return ActivityEnvironment().run(activity, input)

    frozen, freeze_s = timed(lambda: run(postgres.freeze, FreezeInput(ref=ref, driver=driver)))
    snapshot_input = SnapshotInput(ref=ref, driver=driver, snapshot=spec, key=snapshot_key(ref, spec))
    artifact, snapshot_s = timed(lambda: run(postgres.snapshot, snapshot_input))
    migrate_input = MigrateInput(ref=ref, driver=driver, snapshot=spec, artifact=artifact)
    _, migrate_s = timed(lambda: run(postgres.migrate, migrate_input))
    verified, verify_s = timed(lambda: run(postgres.verify, VerifyInput(ref=ref, driver=driver)))
    undo = UndoFreezeInput(ref=ref, driver=driver, previous_setting=frozen.previous_setting)
    _, undo_s = timed(lambda: run(postgres.undo_freeze, undo))
    s3.delete_object(Bucket=bucket, Key=artifact.key)
    s3.delete_bucket(Bucket=bucket)
    assert all(check.equal for check in verified.tables)
    return {
        "freeze": freeze_s,
        "snapshot": snapshot_s,
        "migrate": migrate_s,
        "verify": verify_s,
        "undo_freeze": undo_s,
        "snapshot_mb": artifact.size_bytes / 2**20,
    }


@contextlib.contextmanager
def stack(state_dir: Path | None) -> Iterator[StackInfo]:
    if state_dir is not None:
        yield StackInfo.load(state_dir)
        return
    folder = Path(tempfile.mkdtemp(prefix="ferry-bench-", dir=os.environ.get("FERRY_TEST_TMP", "/tmp")))
    folder.chmod(0o755)  # PostgreSQL may run as another user
    try:
        with Stack(folder, components=frozenset({"postgres", "s3"}), binaries=ensure_binaries()) as info:
            yield info
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the source database (default: %(default)s)")
    parser.add_argument("--state-dir", type=Path, help="use the running stack of this state folder")
    args = parser.parse_args()
    bindir = ensure_binaries().postgres_bindir
    with stack(args.state_dir) as info:
        source_admin, target_admin = info.postgres["source"], info.postgres["target"]
        print(f"building a source database of about {args.size_mb} MB ...", flush=True)
        source, rows = build_source(source_admin, args.size_mb)
        size = _size_mb(source)
        pipe_s = pipe(bindir, source, _fresh_database(target_admin, "ferry_bench_pipe"))
        level = DataActivitySettings().dump_compression
        same_level_s = pipe(bindir, source, _fresh_database(target_admin, "ferry_bench_pipe"), compress=level)
        steps = ferry(info, bindir, source, _fresh_database(target_admin, "ferry_bench_ferry"))
        ferry_s = steps["freeze"] + steps["snapshot"] + steps["migrate"] + steps["verify"]
        print()
        print(f"source database:            {size:,.0f} MB, {rows:,} rows; snapshot {steps['snapshot_mb']:,.0f} MB")
        print(f"pg_dump | pg_restore pipe:  {pipe_s:8.1f} s   (pg_dump's default compression)")
        print(f"  the same at ferry's -Z{level}:   {same_level_s:8.1f} s")
        print(
            f"ferry, freeze to verified:  {ferry_s:8.1f} s   (freeze {steps['freeze']:.2f} s, snapshot "
            f"{steps['snapshot']:.1f} s, migrate {steps['migrate']:.1f} s, verify {steps['verify']:.1f} s)"
        )
        print(f"write downtime:             {ferry_s:8.1f} s   (freeze start until verify done)")
        print(f"  then undo_freeze:         {steps['undo_freeze']:8.2f} s")
        against_same_level = f"({ferry_s / same_level_s:.2f} against the -Z{level} pipe)"
        print(f"ratio ferry / pipe:         {ferry_s / pipe_s:8.2f}   {against_same_level}")
        for name in ("ferry_bench_pipe", "ferry_bench_ferry"):
            with psycopg.connect(target_admin.dsn, autocommit=True) as conn:
                conn.execute(f'drop database if exists "{name}" with (force)')
        with psycopg.connect(source_admin.dsn, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{DATABASE}" with (force)')


if __name__ == "__main__":
    main()
