"""The worker's settings: one typed object, filled from flags and environment variables."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ferry.api.saga import TASK_QUEUE
from ferry.clients import TemporalSettings, add_connection_arguments, env, temporal_settings


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)
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


def from_arguments(args: argparse.Namespace) -> WorkerSettings:
    return WorkerSettings(
        temporal=temporal_settings(args),
        task_queue=args.task_queue,
        kubeconfig=args.kubeconfig,
        temporal_ui_url=args.temporal_ui_url,
        max_concurrent_activities=args.max_concurrent_activities,
        poll_interval=args.poll_interval,
    )
