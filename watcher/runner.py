"""Runs the watcher: win the Lease, then list and watch Migrations and hand each to the dispatcher.

A list (at the start, and after 410 Gone) hands over the Migrations no workflow has
taken yet first, so a restarted watcher acts on a new Migration before it looks at the
others again; the Migrations a pass has nothing to do for are counted, summarized
(watcher/inventory.py) and let go. A resync, every interval, relists nothing: it asks
Temporal its one question (which runs are Running, which ended from outside), reads the
few unfinished Migrations whose run ended so or is gone (watcher/abandoned.py), and
refreshes the gauges from the summaries. The health probes answer from the start; the
watcher is ready once connected to Temporal, which it waits for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time

from temporalio.client import Client, Interceptor
from temporalio.common import MetricMeter
from temporalio.contrib.opentelemetry import TracingInterceptor

from ferry import startup
from ferry.api.saga import MigrationRef, workflow_id
from ferry.observability import health, tracing
from watcher.abandoned import RunsQuery, stopped_without_a_word
from watcher.decisions import handling_order
from watcher.deletion import DeletionHandler
from watcher.dispatching import Dispatcher
from watcher.handling import MigrationHandler
from watcher.inventory import Inventory, Listed, key_of
from watcher.kube import Kube, WatchEvent
from watcher.leadership import LeaderElector
from watcher.metrics import CountingInterceptor, WatcherMetrics
from watcher.patching import MigrationWriter
from watcher.settings import WatcherSettings
from watcher.watching import MigrationWatch

log = logging.getLogger("ferry.watcher")


class Watcher:
    """Watches Migrations and hands each to the handler; runs while this replica leads."""

    def __init__(self, client: Client, kube: Kube, settings: WatcherSettings, metrics: WatcherMetrics) -> None:
        self._kube = kube
        self._settings = settings
        self._metrics = metrics
        writer = MigrationWriter(kube)
        self._deletion = DeletionHandler(client, writer, settings, self._resubmit)
        self._handler = MigrationHandler(client, writer, settings, self._deletion, metrics, self._record_if_needed)
        self._dispatcher = Dispatcher(self._handler.handle, settings.concurrency)
        self._client = client
        self._runs = RunsQuery(client, settings.task_queue)
        self._lost_runs_due = 0.0
        """When (time.monotonic()) a resync next lists the Running runs, to find those Temporal lost: the first one."""
        self._inventory = Inventory()
        self._background: set[asyncio.Task[None]] = set()
        self.watches: list[MigrationWatch] = []

    def _resubmit(self, ref: MigrationRef) -> None:
        """Looks at a Migration again (a wait it had ended); it may be gone by now."""

        async def again() -> None:
            migration = await self._kube.read_migration(ref)
            if migration is not None:
                self._dispatcher.submit(migration)

        task = asyncio.get_running_loop().create_task(again())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _record_if_needed(self, ref: MigrationRef) -> None:
        """Looks again at a Migration whose run started --record-start-after ago, unless the latest state the watch
        brought has a status: ferry wrote it (the saga names its run in each status), so there is no start to record
        and not even a read is needed."""
        summary = self._inventory.get((ref.namespace, ref.name))
        if summary is not None and summary.uid == ref.uid and summary.phase is not None:
            return
        self._resubmit(ref)

    def _on_event(self, event: WatchEvent) -> None:
        self._metrics.events.add(1, {"type": event.type})
        if event.migration is not None:
            gone = event.type == "DELETED"
            self._inventory.update(event.migration, gone=gone)
            self._metrics.changed(key_of(event.migration), self._inventory.get(key_of(event.migration)))
            self._dispatcher.submit(event.migration, gone=gone)

    def _on_listing(self, scope: str | None, items: list[Listed]) -> None:
        if items:
            self._metrics.events.add(len(items), {"type": "LISTED"})
        self._inventory.replace(scope, items)
        self._metrics.observe(self._inventory.items())
        wanted = [item.migration for item in items if item.migration is not None]
        if idle := len(items) - len(wanted):
            self._metrics.passes.add(idle, {"action": "nothing"})  # decided in the list's thread (inventory.keep)
        received = time.monotonic()
        for migration in handling_order(wanted):
            self._dispatcher.submit(migration, received=received)

    async def run(self, stop: asyncio.Event) -> None:
        scopes: list[str | None] = list(self._settings.namespaces) or [None]
        self.watches = [MigrationWatch(self._kube, ns, self._on_listing, self._on_event) for ns in scopes]
        tasks = [asyncio.create_task(watch.run(stop)) for watch in self.watches]
        tasks.append(asyncio.create_task(self._resync(stop)))
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self._handler.close()
            await self._dispatcher.close()
            await self._deletion.close()

    async def _resync(self, stop: asyncio.Event) -> None:
        """Every interval: one query for the runs ended from outside (and, every --lost-runs-interval, the Running
        ones), a look at each unfinished Migration whose run ended so or is not listed Running (watcher/abandoned.py),
        and the gauges."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._settings.resync_interval)
            if stop.is_set():
                return
            listing = time.monotonic() >= self._lost_runs_due
            try:
                runs = await self._runs.ask(running=listing)
            except Exception as error:  # noqa: BLE001 - the next resync asks again, from the same time on
                log.warning("could not ask Temporal which runs are Running or ended from outside: %s", error)
            else:
                for ref in self._inventory.unfinished_among(runs.ended_from_outside):
                    await self._look_at(ref, "whose run ended from outside")
                if runs.running is not None:
                    self._lost_runs_due = time.monotonic() + self._settings.lost_runs_interval
                    for ref in self._inventory.unfinished_not_among(runs.running | runs.ended_from_outside):
                        if await self._stopped_without_a_word(ref):
                            await self._look_at(ref, "whose run is not running")
            self._metrics.observe(self._inventory.items())

    async def _stopped_without_a_word(self, ref: MigrationRef) -> bool:
        """Whether the run of a Migration visibility does not list Running is gone from Temporal, or ended from
        outside (a describe: visibility lags behind a run just started, reset or continued as new)."""
        try:
            return await stopped_without_a_word(self._client.get_workflow_handle(workflow_id(ref)))
        except Exception as error:  # noqa: BLE001 - the next resync asks again
            log.warning("could not describe the run of Migration %s, which is not listed Running: %s", ref, error)
            return False

    async def _look_at(self, ref: MigrationRef, why: str) -> None:
        """Reads the Migration and hands it over with the hint that its run stopped without a word."""
        try:
            migration = await self._kube.read_migration(ref)
        except Exception as error:  # noqa: BLE001 - the next resync finds it again
            log.warning("could not read Migration %s, %s: %s", ref, why, error)
            return
        if migration is not None:
            self._inventory.update(migration)
            self._dispatcher.submit(migration, run_closed=True)


async def run(settings: WatcherSettings, *, stop: asyncio.Event | None = None) -> None:
    """Runs until `stop` is set, waiting for Temporal first.

    Raises LeadershipLost if this replica stops leading (the process should exit), and
    StartupError when it cannot start: a port taken, a kubeconfig that does not load.
    """
    stop = stop or asyncio.Event()
    identity = settings.lease.identity
    observed = settings.observability
    # Ready once connected: a standby replica is as ready as the leader, so a rollout or a
    # disruption budget counts it.
    connected = asyncio.Event()
    async with health.serving(observed.health_address, connected.is_set):
        runtime = startup.metrics_runtime(observed.metrics_address, "watcher")
        metrics = WatcherMetrics(runtime.metric_meter if runtime else MetricMeter.noop)
        interceptors: list[Interceptor] = [CountingInterceptor(metrics.temporal_calls)]
        if tracing.configure(observed.tracing, "ferry-watcher"):
            interceptors.append(TracingInterceptor())
        # Kubernetes calls run in threads (watcher/kube.py): one per Migration handled at once, plus
        # the Lease, a resync and a re-read; each watch has a thread and a connection of its own.
        threads = settings.concurrency + 4
        api = startup.kubernetes_api(settings.kubeconfig, connections=threads + len(settings.namespaces) + 1)
        kube = Kube(api, identity)
        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(threads, "ferry-watcher"))
        client = None
        try:
            client = await startup.wait_for_temporal(
                settings.temporal,
                stop,
                identity=f"ferry-watcher@{identity}",
                runtime=runtime,
                interceptors=interceptors,
            )
        finally:
            if client is None:  # stopped while waiting, or cannot start: _lead would have closed it
                kube.close()
        if client is None:
            return
        connected.set()
        await _lead(client, kube, LeaderElector(kube, settings.lease), settings, metrics, stop)


async def _lead(
    client: Client,
    kube: Kube,
    elector: LeaderElector,
    settings: WatcherSettings,
    metrics: WatcherMetrics,
    stop: asyncio.Event,
) -> None:
    try:
        if not await elector.acquire(stop):
            return
        leading = asyncio.Event()
        watcher = Watcher(client, kube, settings, metrics)
        work = asyncio.create_task(watcher.run(leading))
        try:
            await elector.hold(stop)
        finally:
            leading.set()
            await work
        await elector.release()
    finally:
        kube.close()
