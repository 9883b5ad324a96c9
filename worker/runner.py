"""Builds and runs ferry's worker: the migration workflow and every activity, on one task queue.

Activities talk to blocking clients (Kubernetes, PostgreSQL, S3), so they are plain
functions run in a thread pool; heartbeats are sent at least every two seconds so a
cancellation (a rollback) reaches a running activity promptly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.worker import Worker

from activities.cluster import ClusterActivities
from activities.postgres.activities import PostgresActivities
from activities.settings import MIB, DataActivitySettings, KubeActivitySettings
from activities.snapshots import SnapshotStoreActivities
from activities.status import StatusActivities
from ferry.clients import connect_temporal, kubernetes_client
from ferry.observability import health, tracing
from ferry.observability.metrics import prometheus_runtime
from worker.interceptors import LogContextInterceptor
from worker.settings import WorkerSettings
from workflows.cleanup import RetentionCleanupWorkflow
from workflows.migration import MigrationWorkflow

log = logging.getLogger("ferry.worker")

HEARTBEAT_THROTTLE = timedelta(seconds=2)


def activities(api: k8s.ApiClient, settings: WorkerSettings) -> list[Callable[..., Any]]:
    """Every activity the saga calls, bound to its clients."""
    kube_settings = KubeActivitySettings(poll_interval=settings.poll_interval, temporal_ui_url=settings.temporal_ui_url)
    data_settings = DataActivitySettings(
        postgres_bindir=settings.postgres_bindir,
        part_size=settings.snapshot_part_size_mib * MIB,
        upload_concurrency=settings.snapshot_upload_concurrency,
        dump_compression=settings.snapshot_compression,
    )
    cluster = ClusterActivities(api, kube_settings)
    status = StatusActivities(api, kube_settings)
    postgres = PostgresActivities(api, data_settings)
    snapshots = SnapshotStoreActivities(api, data_settings)
    return [
        cluster.provision,
        cluster.undo_provision,
        cluster.switch_traffic,
        cluster.undo_switch_traffic,
        cluster.scale_down_old,
        cluster.undo_scale_down_old,
        status.mirror_status,
        postgres.precheck,
        postgres.freeze,
        postgres.undo_freeze,
        postgres.check_frozen,
        postgres.snapshot,
        postgres.migrate,
        postgres.undo_migrate,
        postgres.verify,
        snapshots.undo_snapshot,
        snapshots.delete_snapshot,
    ]


def build_worker(
    client: Client,
    api: k8s.ApiClient,
    settings: WorkerSettings,
    executor: concurrent.futures.Executor,
) -> Worker:
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[MigrationWorkflow, RetentionCleanupWorkflow],
        activities=activities(api, settings),
        activity_executor=executor,
        max_concurrent_activities=settings.max_concurrent_activities,
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        graceful_shutdown_timeout=timedelta(seconds=settings.graceful_shutdown),
        interceptors=[LogContextInterceptor()],
        identity=f"ferry-worker@{socket.gethostname()}",
    )


async def run(settings: WorkerSettings, *, stop: asyncio.Event | None = None) -> None:
    """Runs the worker until `stop` is set (or forever); shuts down gracefully."""
    observed = settings.observability
    runtime = prometheus_runtime(observed.metrics_address, "worker") if observed.metrics_address else None
    # The tracing interceptor on the client is also used by workers built from it.
    interceptors = [TracingInterceptor()] if tracing.configure(observed.tracing, "ferry-worker") else []
    client = await connect_temporal(
        settings.temporal, identity=f"ferry-worker@{socket.gethostname()}", runtime=runtime, interceptors=interceptors
    )
    api = kubernetes_client(settings.kubeconfig, connections=settings.max_concurrent_activities + 2)
    with concurrent.futures.ThreadPoolExecutor(max_workers=settings.max_concurrent_activities) as executor:
        worker = build_worker(client, api, settings, executor)
        log.info(
            "worker polling task queue %s on %s (namespace %s)",
            settings.task_queue,
            settings.temporal.address,
            settings.temporal.namespace,
        )
        async with worker, health.serving(observed.health_address, lambda: worker.is_running):
            await (stop or asyncio.Event()).wait()
    api.close()
