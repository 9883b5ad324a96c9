"""Builds and runs ferry's worker: the migration workflow and every activity, on one task queue.

Activities talk to blocking clients (Kubernetes, PostgreSQL, S3), so they are plain
functions run in a thread pool; heartbeats are sent at least every two seconds so a
cancellation (a rollback) reaches a running activity promptly. The health probes answer
from the start; the worker is ready once it polls, which may wait for Temporal to come up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.worker import Worker

from activities.cluster import ClusterActivities
from activities.known_versions import KnownVersions
from activities.postgres.activities import PostgresActivities
from activities.postgres.replicating import ReplicationActivities
from activities.postgres.watching import ReplicationWatch
from activities.snapshots import SnapshotStoreActivities
from activities.status import StatusActivities
from ferry import startup
from ferry.observability import health, tracing
from worker.gate import MigrationGate, read_migration
from worker.interceptors import LogContextInterceptor
from worker.sandbox import WORKFLOW_RUNNER
from worker.settings import WorkerSettings
from workflows.cleanup import RetentionCleanupWorkflow
from workflows.legacy import MigrationWorkflowV1
from workflows.migration import MigrationWorkflow
from workflows.undo import MigrationUndoWorkflow

log = logging.getLogger("ferry.worker")

HEARTBEAT_THROTTLE = timedelta(seconds=2)


def activities(
    api: k8s.ApiClient, settings: WorkerSettings, versions: KnownVersions | None = None
) -> list[Callable[..., Any]]:
    """Every activity the saga calls, bound to its clients; `versions` is the worker's one cache of Migrations'
    known resourceVersions."""
    # The two writers of a Migration's status, mirror_status and the data steps' progress, each write on the version
    # the other's last write produced (or the gate's read found): one request per write, not a 409, a read and a write.
    versions = versions if versions is not None else KnownVersions()
    cluster = ClusterActivities(api, settings.kube_activities)
    status = StatusActivities(api, settings.kube_activities, versions=versions)
    postgres = PostgresActivities(api, settings.data_activities, versions=versions)
    replication = ReplicationActivities(api, settings.data_activities)
    watch = ReplicationWatch(api, settings.data_activities)
    snapshots = SnapshotStoreActivities(api, settings.data_activities)
    return [
        cluster.check_cluster,
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
        postgres.undo_snapshot,
        postgres.migrate,
        postgres.undo_migrate,
        postgres.verify,
        postgres.check_unwritten,
        replication.replicate,
        replication.undo_replicate,
        replication.catch_up,
        replication.undo_catch_up,
        watch.watch_replication,
        snapshots.undo_snapshot,
        snapshots.delete_snapshot,
    ]


def build_worker(
    client: Client,
    api: k8s.ApiClient,
    settings: WorkerSettings,
    executor: concurrent.futures.Executor,
) -> Worker:
    # One cache of known resourceVersions: the status writers write on it, the gate's reads add to it.
    versions = KnownVersions()
    # Status writes are local activities: a `workflows` process registers every activity to run them, and
    # polls for no other activity.
    workflows = [] if settings.runs == "activities" else [
        MigrationWorkflow, MigrationUndoWorkflow, RetentionCleanupWorkflow, MigrationWorkflowV1
    ]  # fmt: skip
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=workflows,
        workflow_runner=WORKFLOW_RUNNER,
        activities=activities(api, settings, versions),
        no_remote_activities=settings.runs == "workflows",
        activity_executor=executor,
        max_concurrent_activities=settings.max_concurrent_activities,
        max_concurrent_workflow_tasks=settings.max_concurrent_workflow_tasks,
        max_concurrent_local_activities=settings.max_concurrent_status_writes,
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        graceful_shutdown_timeout=timedelta(seconds=settings.graceful_shutdown),
        interceptors=[
            LogContextInterceptor(),
            # The gate's reads run on `executor` too, before the activity takes its thread (see worker/gate.py).
            MigrationGate(read_migration(api), executor=executor, versions=versions, key=claim_key(settings)),
        ],
        identity=identity(settings),
    )


def claim_key(settings: WorkerSettings) -> bytes | None:
    """The key the saga signs its claims with and the gate checks them by (worker/gate.py); None, with a warning."""
    if settings.claim_key is None:
        log.warning(
            "no --claim-key: the claims of ferry's runs are not signed, so anyone who can run a workflow in Temporal "
            "namespace %s could schedule this worker's activities with a claim of their own; set FERRY_CLAIM_KEY "
            "from a Secret shared by every worker process",
            settings.temporal.namespace,
        )
        return None
    return settings.claim_key.get_secret_value().encode()


def identity(settings: WorkerSettings) -> str:
    """Who this process is in histories and `tctl`: a split process says what it runs, and the process ID tells two
    workers on one host apart (as the SDK's own default identity does), which Temporal counts as one poller else."""
    role = "" if settings.runs == "everything" else f"-{settings.runs}"
    return f"ferry-worker{role}.{os.getpid()}@{socket.gethostname()}"


def threads(settings: WorkerSettings) -> int:
    """A thread for each slot this process runs a thread in: activities, status writes, or both."""
    return {
        "everything": settings.max_concurrent_activities + settings.max_concurrent_status_writes,
        "workflows": settings.max_concurrent_status_writes,
        "activities": settings.max_concurrent_activities,
    }[settings.runs]


async def run(settings: WorkerSettings, *, stop: asyncio.Event | None = None) -> None:
    """Runs the worker until `stop` is set (or forever), waiting for Temporal first; shuts down gracefully.

    Raises StartupError when it cannot start: a port taken, a kubeconfig that does not load.
    """
    stop = stop or asyncio.Event()
    observed = settings.observability
    polling: list[Worker] = []
    async with health.serving(observed.health_address, lambda: any(worker.is_running for worker in polling)):
        runtime = startup.metrics_runtime(observed.metrics_address, "worker")
        # The tracing interceptor on the client is also used by workers built from it.
        interceptors = [TracingInterceptor()] if tracing.configure(observed.tracing, "ferry-worker") else []
        api = startup.kubernetes_api(settings.kubeconfig, connections=threads(settings) + 2)
        try:
            while not stop.is_set():
                client = await startup.wait_for_temporal(
                    settings.temporal, stop, identity=identity(settings), runtime=runtime, interceptors=interceptors
                )
                if client is None:
                    return
                # Activities and status writes (local activities) share the pool: a thread for each slot of either.
                with concurrent.futures.ThreadPoolExecutor(max_workers=threads(settings)) as pool:
                    worker = build_worker(client, api, settings, pool)
                    polling[:] = [worker]
                    log.info(
                        "worker polling task queue %s for %s on %s (namespace %s)",
                        settings.task_queue,
                        settings.runs,
                        settings.temporal.address,
                        settings.temporal.namespace,
                    )
                    try:
                        await _run_until(worker, stop)
                        return
                    except TemporalGone as gone:
                        # Temporal went away between the connection and the worker's first call: wait again.
                        log.warning(
                            "Temporal at %s went away as the worker started (%s)", settings.temporal.address, gone
                        )
        finally:
            api.close()


async def _run_until(worker: Worker, stop: asyncio.Event) -> None:
    """Runs the worker until `stop` is set (or the task is cancelled), then shuts it down gracefully.

    A worker that stops on its own failed (e.g. its namespace does not exist): a StartupError.
    """
    running = asyncio.create_task(worker.run())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not running.done():
            await worker.shutdown()
            await running
    try:
        running.result()
    except RuntimeError as error:  # e.g. "Worker validation failed: Namespace ... is not found"
        if startup.unreachable(error):
            raise TemporalGone(startup.reason(error)) from error
        raise startup.StartupError(f"the worker stopped: {error}") from error


class TemporalGone(Exception):
    """The worker could not reach Temporal as it started: it waits for Temporal again, as at first."""
