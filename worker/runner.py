"""Builds and runs ferry's worker: the migration workflow and every activity on its task queue, and the watches on
the watches' task queue (ferry.api.saga.watches_task_queue).

Activities talk to blocking clients (Kubernetes, PostgreSQL, S3), so they are plain
functions run in a thread pool; heartbeats are sent at least every two seconds so a
cancellation (a rollback) reaches a running activity promptly. A watch runs beside its
Migration's wait for as long as the wait, days maybe, so it has a Temporal worker of its own
in this process, with its own slots and threads: waiting Migrations never take the slots the
steps and undos need. The health probes answer from the start; the worker is ready once both
poll, which may wait for Temporal to come up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.worker import Interceptor, Worker

from activities.cluster import ClusterActivities
from activities.known_versions import KnownVersions
from activities.postgres.activities import PostgresActivities
from activities.postgres.replicating import ReplicationActivities
from activities.postgres.watching import ReplicationWatch
from activities.snapshots import SnapshotStoreActivities
from activities.status import StatusActivities
from ferry import startup
from ferry.api.saga import watches_task_queue
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
    # The watch stays registered here too: a run without the patch watch-on-its-own-queue (workflows/saga.py) has
    # its watch, and the watch's retries, on this task queue.
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
        interceptors=interceptors(api, settings, executor, versions),
        identity=identity(settings),
    )


def build_watch_worker(
    client: Client, api: k8s.ApiClient, settings: WorkerSettings, executor: concurrent.futures.Executor
) -> Worker:
    """The worker of the watches' task queue: the watch alone, in --max-concurrent-watches slots, on `executor` (a
    thread each: the watch is a sync activity), past the same gate."""
    watch = ReplicationWatch(api, settings.data_activities)
    return Worker(
        client,
        task_queue=watches_task_queue(settings.task_queue),
        activities=[watch.watch_replication],
        activity_executor=executor,
        max_concurrent_activities=settings.max_concurrent_watches,
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        graceful_shutdown_timeout=timedelta(seconds=settings.graceful_shutdown),
        interceptors=interceptors(api, settings, executor),
        identity=identity(settings),
    )


def interceptors(
    api: k8s.ApiClient,
    settings: WorkerSettings,
    executor: concurrent.futures.Executor,
    versions: KnownVersions | None = None,
) -> list[Interceptor]:
    """Every worker's interceptors: the Migration on each log line, and the gate (worker/gate.py), whose reads run on
    `executor`, before the activity takes its thread; `versions`, the status writers' cache, learns what they read."""
    return [
        LogContextInterceptor(),
        MigrationGate(read_migration(api), executor=executor, versions=versions, key=claim_key(settings)),
    ]


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
    """A thread for each slot of the task queue this process runs a thread in: activities, status writes, or both."""
    return {
        "everything": settings.max_concurrent_activities + settings.max_concurrent_status_writes,
        "workflows": settings.max_concurrent_status_writes,
        "activities": settings.max_concurrent_activities,
    }[settings.runs]


def watch_threads(settings: WorkerSettings) -> int:
    """A thread for each watch slot, where this process runs activities; a `workflows` process runs no watch."""
    return 0 if settings.runs == "workflows" else settings.max_concurrent_watches


async def run(settings: WorkerSettings, *, stop: asyncio.Event | None = None) -> None:
    """Runs the worker until `stop` is set (or forever), waiting for Temporal first; shuts down gracefully.

    Raises StartupError when it cannot start: a port taken, a kubeconfig that does not load.
    """
    stop = stop or asyncio.Event()
    observed = settings.observability
    polling: list[Worker] = []

    def ready() -> bool:
        """Ready once every worker of the process polls: the task queue's and, where it runs activities, the
        watches'."""
        return bool(polling) and all(worker.is_running for worker in polling)

    async with health.serving(observed.health_address, ready):
        runtime = startup.metrics_runtime(observed.metrics_address, "worker")
        # The tracing interceptor on the client is also used by workers built from it.
        tracing_interceptors = [TracingInterceptor()] if tracing.configure(observed.tracing, "ferry-worker") else []
        api = startup.kubernetes_api(settings.kubeconfig, connections=threads(settings) + watch_threads(settings) + 2)
        try:
            while not stop.is_set():
                client = await startup.wait_for_temporal(
                    settings.temporal,
                    stop,
                    identity=identity(settings),
                    runtime=runtime,
                    interceptors=tracing_interceptors,
                )
                if client is None:
                    return
                with contextlib.ExitStack() as pools:
                    # Activities and status writes (local activities) share a pool: a thread for each slot of either.
                    pool = pools.enter_context(concurrent.futures.ThreadPoolExecutor(max_workers=threads(settings)))
                    polling[:] = [build_worker(client, api, settings, pool)]
                    queues = [settings.task_queue]
                    if watch_threads(settings):
                        watching = concurrent.futures.ThreadPoolExecutor(
                            max_workers=watch_threads(settings), thread_name_prefix="ferry-watch"
                        )
                        polling.append(build_watch_worker(client, api, settings, pools.enter_context(watching)))
                        queues.append(watches_task_queue(settings.task_queue))
                    log.info(
                        "worker polling task queues %s for %s on %s (namespace %s)",
                        ", ".join(queues),
                        settings.runs,
                        settings.temporal.address,
                        settings.temporal.namespace,
                    )
                    try:
                        await _run_until(polling, stop)
                        return
                    except TemporalGone as gone:
                        # Temporal went away between the connection and the worker's first call: wait again.
                        log.warning(
                            "Temporal at %s went away as the worker started (%s)", settings.temporal.address, gone
                        )
        finally:
            api.close()


async def _run_until(workers: list[Worker], stop: asyncio.Event) -> None:
    """Runs the workers until `stop` is set (or the task is cancelled), then shuts them all down gracefully, at once.

    A worker that stops on its own failed (e.g. its namespace does not exist): the others stop too, and it is a
    StartupError.
    """
    running = [asyncio.create_task(worker.run()) for worker in workers]
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({*running, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        await asyncio.gather(*(w.shutdown() for w, task in zip(workers, running, strict=True) if not task.done()))
        await asyncio.wait(running)
    failures = [error for task in running if (error := task.exception()) is not None]
    if not failures:
        return
    if isinstance(failures[0], RuntimeError):  # e.g. "Worker validation failed: Namespace ... is not found"
        if startup.unreachable(failures[0]):
            raise TemporalGone(startup.reason(failures[0])) from failures[0]
        raise startup.StartupError(f"the worker stopped: {failures[0]}") from failures[0]
    raise failures[0]


class TemporalGone(Exception):
    """The worker could not reach Temporal as it started: it waits for Temporal again, as at first."""
