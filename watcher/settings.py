"""The watcher's settings: one typed object, filled from flags and FERRY_ environment variables."""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
from pathlib import Path

from ferry.api.saga import TASK_QUEUE
from ferry.clients import TemporalSettings, add_connection_arguments, env, temporal_settings
from ferry.observability import settings as observability
from ferry.observability.settings import ObservabilitySettings


@dataclasses.dataclass(frozen=True)
class LeaseSettings:
    """Leader election between watcher replicas, through a coordination.k8s.io Lease."""

    name: str = "ferry-watcher"
    """Name of the Lease object."""
    namespace: str = "default"
    """Namespace of the Lease object (deploy/ uses the watcher's own namespace)."""
    duration: float = 15.0
    """Seconds a leader's claim lasts without renewal; another replica takes over after it."""
    renew_deadline: float = 10.0
    """Seconds a leader keeps trying to renew before it steps down (less than duration)."""
    retry_period: float = 2.0
    """Seconds between two attempts to acquire or renew."""
    identity: str = dataclasses.field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    """This replica's name in the Lease."""


@dataclasses.dataclass(frozen=True)
class WatcherSettings:
    """Everything `ferry watcher` needs."""

    temporal: TemporalSettings = dataclasses.field(default_factory=TemporalSettings)
    task_queue: str = TASK_QUEUE
    """Task queue the migration workflows are started on (the worker polls it)."""
    kubeconfig: Path | None = None
    """kubeconfig to use (default: in-cluster configuration, else ~/.kube/config)."""
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty means all."""
    lease: LeaseSettings = dataclasses.field(default_factory=LeaseSettings)
    resync_interval: float = 30.0
    """Seconds between two full relists: catches runs terminated from outside (Abandoned)."""
    deletion_timeout: float = 1800.0
    """Seconds a deleted Migration waits for its undo or cleanup before ferry releases it anyway."""
    concurrency: int = 16
    """Migrations handled at once (events of one Migration are always handled in order)."""
    observability: ObservabilitySettings = dataclasses.field(default_factory=ObservabilitySettings)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)
    observability.add_arguments(parser)
    parser.add_argument(
        "--namespaces",
        default=env("NAMESPACES", ""),
        help="comma-separated namespaces to watch; empty watches all [FERRY_NAMESPACES] (default: all)",
    )
    lease = parser.add_argument_group("leader election")
    lease.add_argument(
        "--lease-name",
        default=env("LEASE_NAME", "ferry-watcher"),
        help="name of the Lease that elects the active watcher [FERRY_LEASE_NAME] (default: %(default)s)",
    )
    lease.add_argument(
        "--lease-namespace",
        default=env("LEASE_NAMESPACE", "default"),
        help="namespace of that Lease [FERRY_LEASE_NAMESPACE] (default: %(default)s)",
    )
    lease.add_argument(
        "--lease-duration",
        type=float,
        default=float(env("LEASE_DURATION", "15") or 15),
        help="seconds before a silent leader is replaced [FERRY_LEASE_DURATION] (default: %(default)s)",
    )
    lease.add_argument(
        "--lease-renew-deadline",
        type=float,
        default=float(env("LEASE_RENEW_DEADLINE", "10") or 10),
        help="seconds a leader tries to renew before stepping down [FERRY_LEASE_RENEW_DEADLINE] (default: %(default)s)",
    )
    lease.add_argument(
        "--lease-retry-period",
        type=float,
        default=float(env("LEASE_RETRY_PERIOD", "2") or 2),
        help="seconds between acquire or renew attempts [FERRY_LEASE_RETRY_PERIOD] (default: %(default)s)",
    )
    lease.add_argument(
        "--identity",
        default=env("IDENTITY"),
        help="this replica's name in the Lease [FERRY_IDENTITY] (default: host name and pid)",
    )
    parser.add_argument(
        "--resync-interval",
        type=float,
        default=float(env("RESYNC_INTERVAL", "30") or 30),
        help="seconds between full relists [FERRY_RESYNC_INTERVAL] (default: %(default)s)",
    )
    parser.add_argument(
        "--deletion-timeout",
        type=float,
        default=float(env("DELETION_TIMEOUT", "1800") or 1800),
        help="seconds a deleted Migration waits for its undo before its finalizer is released "
        "[FERRY_DELETION_TIMEOUT] (default: %(default)s)",
    )


def from_arguments(args: argparse.Namespace) -> WatcherSettings:
    lease = LeaseSettings(
        name=args.lease_name,
        namespace=args.lease_namespace,
        duration=args.lease_duration,
        renew_deadline=args.lease_renew_deadline,
        retry_period=args.lease_retry_period,
    )
    if args.identity:
        lease = dataclasses.replace(lease, identity=args.identity)
    if not lease.retry_period < lease.renew_deadline < lease.duration:
        raise ValueError(
            "leader election needs --lease-retry-period < --lease-renew-deadline < --lease-duration, got "
            f"{lease.retry_period} < {lease.renew_deadline} < {lease.duration}"
        )
    return WatcherSettings(
        temporal=temporal_settings(args),
        task_queue=args.task_queue,
        kubeconfig=args.kubeconfig,
        namespaces=tuple(ns.strip() for ns in args.namespaces.split(",") if ns.strip()),
        lease=lease,
        resync_interval=args.resync_interval,
        deletion_timeout=args.deletion_timeout,
        observability=observability.from_arguments(args),
    )
