"""Benchmark: ferry's Snapshot mode against the direct ways of copying a database, at chosen sizes.

For each size of --sizes it builds a database of about that size in the stack's source
instance (server-side, with generate_series, spread over --tables tables), then prints,
in one table:

- a direct `pg_dump -Fc | pg_restore` pipe into a fresh target database (pg_dump's
  default compression, pg_restore in one transaction, as ferry restores);
- a direct parallel copy: `pg_dump -Fd -j N` into a folder on disk, then
  `pg_restore -j N` (N from --jobs; no single transaction is possible with -j);
- ferry's time from freeze to verified, once for each count of --streams (its snapshot's
  parallel streams, spec.driver.parallelism), each step too: freeze, snapshot to S3 (which
  restores the target from the same stream, as mode Snapshot's plan asks), migrate
  (which then finds the target restored) and verify, run as the worker runs them (ActivityEnvironment, in this process)
  into another fresh database; this is the write-downtime window (undo_freeze, which
  reopens writes, takes milliseconds);
- for comparison, the same pipe without compression (`pg_dump -Fc -Z0`), as ferry
  dumps by default, and ferry's time against it;
- the ratio of ferry's time to the faster direct way, and the peak resident memory of
  this process while ferry's steps ran (VmHWM, reset before them);
- how long reading every row of the source takes on one connection, with each row hash
  verify may use (activities/postgres/checksums.py: md5, hashtextextended,
  hash_record_extended), and the rows' text forms alone, which the first two read; and a
  second read of ferry's target, by hash_record_extended, after verify read it the first
  time (the first read of restored rows also sets their hint bits, see
  docs/performance.md).

It starts a stack of its own (PostgreSQL and S3 only) in a temporary folder, or uses
the running stack whose state folder --state-dir names. A benchmark: it asserts nothing.

    .venv/bin/python scripts/bench_postgres.py --sizes 100MB
    .venv/bin/python scripts/bench_postgres.py --sizes 1GB,4GB     # the figures of issue #14
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from temporalio.testing import ActivityEnvironment

from activities.postgres import checksums
from activities.postgres.activities import PostgresActivities
from activities.secrets import DatabaseConnection, S3Credentials
from activities.settings import DataActivitySettings, default_streams
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


def build_source(admin: PostgresEndpoint, size_mb: int, tables: int = 1) -> tuple[PostgresEndpoint, int]:
    """A database of about `size_mb` (pg_database_size) in `tables` equal tables; returns it and its row count."""
    source = _fresh_database(admin, DATABASE)
    names = ["orders"] if tables == 1 else [f"orders_{number}" for number in range(1, tables + 1)]
    with psycopg.connect(source.dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(TABLE.replace("public.orders", f"public.{name}").replace("orders_by_", f"{name}_by_"))
        empty = _size_mb(source)
        conn.execute(ROWS.replace("public.orders", f"public.{names[0]}"), (1, 100_000))
        per_row = (_size_mb(source) - empty) / 100_000
        wanted = max(100_000 * len(names), int((size_mb - empty) / per_row))
        done, batch = 100_000, 0
        while done < wanted:
            upto = min(wanted, done + ROWS_PER_BATCH)
            conn.execute(ROWS.replace("public.orders", f"public.{names[batch % len(names)]}"), (done + 1, upto))
            done, batch = upto, batch + 1
            print(f"  generated {done:,} of {wanted:,} rows ({_size_mb(source):,.0f} MB)", flush=True)
        for name in names:
            conn.execute(f"vacuum analyze public.{name}")
    return source, done


def _env(endpoint: PostgresEndpoint) -> dict[str, str]:
    return dict(
        os.environ,
        PGHOST=endpoint.host,
        PGPORT=str(endpoint.port),
        PGUSER=endpoint.user,
        PGPASSWORD=endpoint.password,
        PGDATABASE=endpoint.database,
    )


def pipe(bindir: Path, source: PostgresEndpoint, target: PostgresEndpoint, compress: int | None = None) -> float:
    """Seconds of `pg_dump -Fc | pg_restore` (pg_dump's default compression unless `compress` says), restored as ferry
    restores."""
    started = time.perf_counter()
    argv = [str(bindir / "pg_dump"), "--format=custom"] + ([] if compress is None else [f"--compress={compress}"])
    dump = subprocess.Popen(argv, stdout=subprocess.PIPE, env=_env(source))
    restore_options = ["--single-transaction", "--no-owner", "--no-privileges", f"--dbname={target.database}"]
    restored = subprocess.run([str(bindir / "pg_restore"), *restore_options], stdin=dump.stdout, env=_env(target))
    assert dump.stdout is not None
    dump.stdout.close()
    if dump.wait() != 0 or restored.returncode != 0:
        raise SystemExit("the pg_dump | pg_restore pipe failed")
    return time.perf_counter() - started


def parallel(bindir: Path, source: PostgresEndpoint, target: PostgresEndpoint, jobs: int, folder: Path) -> float:
    """Seconds of `pg_dump -Fd -j N` into `folder`, then `pg_restore -j N`; the folder is removed after."""
    started = time.perf_counter()
    dump = [str(bindir / "pg_dump"), "--format=directory", f"--jobs={jobs}", f"--file={folder}"]
    if subprocess.run(dump, env=_env(source)).returncode != 0:
        raise SystemExit("pg_dump -Fd failed")
    restore = [str(bindir / "pg_restore"), f"--jobs={jobs}", "--no-owner", "--no-privileges"]
    restored = subprocess.run([*restore, f"--dbname={target.database}", str(folder)], env=_env(target))
    elapsed = time.perf_counter() - started
    shutil.rmtree(folder, ignore_errors=True)
    if restored.returncode != 0:
        raise SystemExit("pg_restore -j failed")
    return elapsed


TEXT_ONLY = checksums.RowHash("text forms only", "pg_catalog.length(t::text)")
"""Not a hash: the rows' text forms, which md5 and hashtextextended read, summed by length."""


def read_rows(endpoint: PostgresEndpoint, row_hashes: tuple[checksums.RowHash, ...]) -> dict[str, float]:
    """Seconds to read every row of a database on one connection (the session verify uses), per row hash."""
    figures = {}
    with psycopg.connect(endpoint.dsn, autocommit=True, options=" ".join(
        f"-c {name}={value}" for name, value in checksums.SESSION.items()
    )) as conn:  # fmt: skip
        for row_hash in row_hashes:
            _, figures[row_hash.name] = timed(
                lambda: checksums.fingerprints(conn, lambda _tables, _rows: None, row_hash=row_hash)  # noqa: B023
            )
    return figures


def peak_rss_reset() -> None:
    """Starts this process's peak resident memory (VmHWM) again from its current size."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(call: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started


def ferry(
    info: StackInfo,
    bindir: Path,
    source: PostgresEndpoint,
    target: PostgresEndpoint,
    compression: int | None = None,
    streams: int = 1,
) -> dict[str, Any]:
    """Freeze, snapshot (in `streams` streams), migrate and verify as the saga runs them; returns each step's seconds
    and sizes."""
    assert info.s3_access_key is not None
    assert info.s3_secret_key is not None
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    s3 = info.s3_client()
    s3.create_bucket(Bucket=bucket)
    secrets = FixedSecrets(
        {"source": source, "target": target}, S3Credentials(info.s3_access_key, info.s3_secret_key, "bench/s3")
    )
    chosen = {} if compression is None else {"dump_compression": compression}
    postgres = PostgresActivities(None, DataActivitySettings(postgres_bindir=bindir, **chosen), secrets=secrets)
    ref = MigrationRef(namespace="bench", name="bench", uid=str(uuid.uuid4()))
    driver = DriverSpec(source_secret="source", target_secret="target", parallelism=streams)
    spec = SnapshotSpec(bucket=bucket, endpoint=info.s3_endpoint, allow_insecure_endpoint=True, credentials_secret="s3")

    def run(activity: Callable[[Any], T], input: Any) -> T:
        return ActivityEnvironment().run(activity, input)

    peak_rss_reset()
    frozen, freeze_s = timed(lambda: run(postgres.freeze, FreezeInput(ref=ref, driver=driver)))
    snapshot_input = SnapshotInput(ref=ref, driver=driver, snapshot=spec, key=snapshot_key(ref, spec), restore=True)
    artifact, snapshot_s = timed(lambda: run(postgres.snapshot, snapshot_input))
    migrate_input = MigrateInput(ref=ref, driver=driver, snapshot=spec, artifact=artifact)
    _, migrate_s = timed(lambda: run(postgres.migrate, migrate_input))
    verified, verify_s = timed(lambda: run(postgres.verify, VerifyInput(ref=ref, driver=driver)))
    undo = UndoFreezeInput(ref=ref, driver=driver, previous_setting=frozen.previous_setting)
    _, undo_s = timed(lambda: run(postgres.undo_freeze, undo))
    peak = peak_rss_mib()
    for key in [artifact.key, *(stream.key for stream in artifact.streams)]:
        s3.delete_object(Bucket=bucket, Key=key)
    s3.delete_bucket(Bucket=bucket)
    assert all(check.equal for check in verified.tables)
    return {
        "freeze": freeze_s,
        "snapshot": snapshot_s,
        "migrate": migrate_s,
        "verify": verify_s,
        "undo_freeze": undo_s,
        "snapshot_mb": artifact.total_bytes / 2**20,
        "objects": 1 + len(artifact.streams),
        "peak_rss_mib": peak,
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


def megabytes(size: str) -> int:
    """10MB, 1GB, 4GB (powers of 1024) as MB."""
    found = re.fullmatch(r"(\d+)\s*([MG])B?", size.strip().upper())
    if found is None:
        raise argparse.ArgumentTypeError(f"{size!r} is not a size such as 10MB or 4GB")
    return int(found.group(1)) * (1024 if found.group(2) == "G" else 1)


def measure(
    info: StackInfo,
    bindir: Path,
    size_mb: int,
    tables: int,
    jobs: int,
    compression: int | None = None,
    streams: Sequence[int] = (1,),
) -> dict[str, float]:
    """One size: builds the source, copies it the three ways, drops what it made; returns the figures."""
    source_admin, target_admin = info.postgres["source"], info.postgres["target"]
    print(f"building a source database of about {size_mb} MB in {tables} tables ...", flush=True)
    source, rows = build_source(source_admin, size_mb, tables)
    figures: dict[str, float] = {"size_mb": _size_mb(source), "rows": rows}
    print("pg_dump | pg_restore ...", flush=True)
    figures["pipe"] = pipe(bindir, source, _fresh_database(target_admin, "ferry_bench_pipe"))
    print("pg_dump -Z0 | pg_restore ...", flush=True)
    figures["pipe_z0"] = pipe(bindir, source, _fresh_database(target_admin, "ferry_bench_pipe"), compress=0)
    print(f"pg_dump -Fd -j{jobs}, pg_restore -j{jobs} ...", flush=True)
    folder = Path(tempfile.mkdtemp(prefix="ferry-bench-dump-", dir=os.environ.get("FERRY_TEST_TMP", "/tmp")))
    figures["parallel"] = parallel(bindir, source, _fresh_database(target_admin, "ferry_bench_pipe"), jobs, folder)
    print("row hashes ...", flush=True)
    read = read_rows(source, (checksums.MD5, checksums.HASHTEXT, checksums.COLUMNS, TEXT_ONLY))
    figures.update({f"hash {name}": seconds for name, seconds in read.items()})
    for count in streams:
        print(f"ferry in {count} streams: freeze, snapshot, migrate, verify ...", flush=True)
        target = _fresh_database(target_admin, "ferry_bench_ferry")
        steps = ferry(info, bindir, source, target, compression, count)
        steps["target again"] = read_rows(target, (checksums.COLUMNS,))[checksums.COLUMNS.name]
        steps["ferry"] = steps["freeze"] + steps["snapshot"] + steps["migrate"] + steps["verify"]
        figures.update({f"{name}@{count}": value for name, value in steps.items()})
    for name in ("ferry_bench_pipe", "ferry_bench_ferry"):
        with psycopg.connect(target_admin.dsn, autocommit=True) as conn:
            conn.execute(f'drop database if exists "{name}" with (force)')
    with psycopg.connect(source_admin.dsn, autocommit=True) as conn:
        conn.execute(f'drop database if exists "{DATABASE}" with (force)')
    return figures


def table(results: dict[int, dict[str, float]], jobs: int, streams: Sequence[int]) -> str:
    rows = [
        ("source database (MB)", "size_mb", "{:,.0f}"),
        ("rows", "rows", "{:,.0f}"),
        ("pg_dump -Fc | pg_restore (s)", "pipe", "{:.1f}"),
        (f"pg_dump -Fd -j{jobs} + pg_restore -j{jobs} (s)", "parallel", "{:.1f}"),
        ("(uncompressed pipe: pg_dump -Fc -Z0 | pg_restore (s))", "pipe_z0", "{:.1f}"),
    ]
    for count in streams:
        rows += [
            (f"ferry in {count} stream(s), freeze -> verified (s)", f"ferry@{count}", "{:.1f}"),
            ("  freeze (s)", f"freeze@{count}", "{:.2f}"),
            ("  snapshot, restoring as it uploads (s)", f"snapshot@{count}", "{:.1f}"),
            ("  migrate (finds it restored) (s)", f"migrate@{count}", "{:.1f}"),
            ("  verify (s)", f"verify@{count}", "{:.1f}"),
            ("  then undo_freeze (s)", f"undo_freeze@{count}", "{:.2f}"),
            ("  snapshot objects", f"objects@{count}", "{:.0f}"),
            ("  snapshot objects' size (MB)", f"snapshot_mb@{count}", "{:,.0f}"),
            ("  ferry / faster direct way", f"ratio@{count}", "{:.2f}"),
            ("  (ferry / uncompressed pipe)", f"ratio_z0@{count}", "{:.2f}"),
            ("  target read again after verify (s)", f"target again@{count}", "{:.1f}"),
            ("  peak RSS during ferry's steps (MiB)", f"peak_rss_mib@{count}", "{:,.0f}"),
        ]
    rows += [
        ("source's rows read by md5 (s)", "hash md5", "{:.1f}"),
        ("  by hashtextextended (s)", "hash hashtextextended", "{:.1f}"),
        ("  by hash_record_extended (s)", "hash hash_record_extended", "{:.1f}"),
        ("  their text forms only (s)", "hash text forms only", "{:.1f}"),
    ]
    for figures in results.values():
        for count in streams:
            figures[f"ratio@{count}"] = figures[f"ferry@{count}"] / min(figures["pipe"], figures["parallel"])
            figures[f"ratio_z0@{count}"] = figures[f"ferry@{count}"] / figures["pipe_z0"]
    width = max(len(name) for name, _, _ in rows)
    header = " " * width + "".join(f"{f'{size} MB':>12}" for size in results)
    lines = [header]
    for name, key, form in rows:
        lines.append(f"{name:<{width}}" + "".join(f"{form.format(figures[key]):>12}" for figures in results.values()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1GB", help="source sizes, e.g. 100MB,1GB,4GB (default: %(default)s)")
    parser.add_argument("--tables", type=int, default=4, help="tables the rows are spread over (default: 4)")
    parser.add_argument("--jobs", type=int, default=2, help="jobs of the direct parallel copy (default: 2)")
    parser.add_argument(
        "--compression", type=int, choices=range(10), help="ferry's snapshot compression (default: the worker's)"
    )
    parser.add_argument(
        "--streams",
        default=f"1,{default_streams(os.cpu_count())}",
        help="ferry's runs, by its snapshot's streams (spec.driver.parallelism), e.g. 1,2,4 (default: one, and "
        "this machine's default: %(default)s)",
    )
    parser.add_argument("--state-dir", type=Path, help="use the running stack of this state folder")
    args = parser.parse_args()
    sizes = [megabytes(size) for size in args.sizes.split(",")]
    streams = list(dict.fromkeys(int(count) for count in args.streams.split(",")))
    bindir = ensure_binaries().postgres_bindir
    results: dict[int, dict[str, float]] = {}
    with stack(args.state_dir) as info:
        for size in sizes:
            results[size] = measure(info, bindir, size, args.tables, args.jobs, args.compression, streams)
    print()
    print(table(results, args.jobs, streams))


if __name__ == "__main__":
    main()
