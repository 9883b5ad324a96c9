"""The worker's settings: one typed object, filled from flags and environment variables."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ferry.api.saga import TASK_QUEUE
from ferry.clients import TemporalSettings, add_connection_arguments, env, temporal_settings
from ferry.observability import settings as observability
from ferry.observability.settings import ObservabilitySettings


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    """Everything `ferry worker` needs; each field has a flag and an environment variable."""

    temporal: TemporalSettings = dataclasses.field(default_factory=TemporalSettings)
    task_queue: str = TASK_QUEUE
    """Task queue to poll; the watcher starts workflows on the same one."""
    kubeconfig: Path | None = None
    """kubeconfig to use (default: in-cluster configuration, else ~/.kube/config)."""
    temporal_ui_url: str | None = None
    """Base URL of the Temporal Web UI, for the link in each Migration's status."""
    max_concurrent_activities: int = 20
    """Activities run at once by this worker (each long one holds a thread)."""
    poll_interval: float = 1.0
    """Seconds between two polls while an activity waits for the cluster."""
    postgres_bindir: Path | None = None
    """Folder with pg_dump and pg_restore (default: the PATH, else the newest /usr/lib/postgresql/*/bin)."""
    snapshot_part_size_mib: int = 16
    """MiB per part of a snapshot's multipart upload (at least 5); a snapshot can have 10,000 parts."""
    snapshot_upload_concurrency: int = 4
    """Parts of one snapshot uploaded at once; each holds a part in memory."""
    snapshot_compression: int = 1
    """pg_dump's compression level, 0-9: level 1 is nearly as small as pg_dump's default 6, and much faster."""
    graceful_shutdown: float = 30.0
    """Seconds running activities may finish after SIGTERM before they are cancelled (keep it under the
    pod's termination grace period)."""
    observability: ObservabilitySettings = dataclasses.field(default_factory=ObservabilitySettings)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)
    observability.add_arguments(parser)
    parser.add_argument(
        "--graceful-shutdown",
        type=float,
        default=float(env("GRACEFUL_SHUTDOWN", "30") or 30),
        help="seconds running activities may finish after SIGTERM before they are cancelled "
        "[FERRY_GRACEFUL_SHUTDOWN] (default: %(default)s)",
    )
    parser.add_argument(
        "--max-concurrent-activities",
        type=int,
        default=int(env("MAX_CONCURRENT_ACTIVITIES", "20") or 20),
        help="activities this worker runs at once [FERRY_MAX_CONCURRENT_ACTIVITIES] (default: %(default)s)",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=float(env("POLL_INTERVAL", "1.0") or 1.0),
        help="seconds between polls while waiting for the cluster [FERRY_POLL_INTERVAL] (default: %(default)s)",
    )
    group = parser.add_argument_group("PostgreSQL and snapshots")
    group.add_argument(
        "--postgres-bindir",
        type=Path,
        default=env("POSTGRES_BINDIR"),
        help="folder with pg_dump and pg_restore, of the newest major version among sources and targets "
        "[FERRY_POSTGRES_BINDIR] (default: the PATH, else the newest /usr/lib/postgresql/*/bin)",
    )
    group.add_argument(
        "--snapshot-part-size-mib",
        type=int,
        default=int(env("SNAPSHOT_PART_SIZE_MIB", "16") or 16),
        help="MiB per part of a snapshot's multipart upload, at least 5; a snapshot has at most 10,000 parts "
        "[FERRY_SNAPSHOT_PART_SIZE_MIB] (default: %(default)s)",
    )
    group.add_argument(
        "--snapshot-upload-concurrency",
        type=int,
        default=int(env("SNAPSHOT_UPLOAD_CONCURRENCY", "4") or 4),
        help="parts of one snapshot uploaded at once, each held in memory "
        "[FERRY_SNAPSHOT_UPLOAD_CONCURRENCY] (default: %(default)s)",
    )
    group.add_argument(
        "--snapshot-compression",
        type=int,
        choices=range(10),
        default=int(env("SNAPSHOT_COMPRESSION", "1") or 1),
        help="pg_dump's compression level, 0-9; the dump runs while the source is frozen "
        "[FERRY_SNAPSHOT_COMPRESSION] (default: %(default)s)",
    )


def from_arguments(args: argparse.Namespace) -> WorkerSettings:
    return WorkerSettings(
        temporal=temporal_settings(args),
        task_queue=args.task_queue,
        kubeconfig=args.kubeconfig,
        temporal_ui_url=args.temporal_ui_url,
        max_concurrent_activities=args.max_concurrent_activities,
        poll_interval=args.poll_interval,
        postgres_bindir=args.postgres_bindir,
        snapshot_part_size_mib=args.snapshot_part_size_mib,
        snapshot_upload_concurrency=args.snapshot_upload_concurrency,
        snapshot_compression=args.snapshot_compression,
        graceful_shutdown=args.graceful_shutdown,
        observability=observability.from_arguments(args),
    )
