"""Runs the watcher: win the Lease, then list and watch Migrations and handle each one.

Events are coalesced per Migration: while one is being handled, newer states of it wait,
and only the latest is handled next, so a burst of status updates costs one pass.
Different Migrations are handled concurrently, up to the configured limit. A handler
that fails is retried with backoff; it never stops the watcher. The health probes answer
from the start; the watcher is ready once connected to Temporal, which it waits for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.common import MetricMeter
from temporalio.contrib.opentelemetry import TracingInterceptor

from ferry import startup
from ferry.api.saga import MigrationRef
from ferry.observability import health, tracing
from watcher.deletion import DeletionHandler
from watcher.handling import MigrationHandler
from watcher.leadership import LeaderElector
from watcher.metrics import WatcherMetrics
from watcher.patching import MigrationWriter
from watcher.settings import WatcherSettings
from watcher.watching import MigrationWatch

log = logging.getLogger("ferry.watcher")

RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)

Handle = Callable[[dict[str, Any], bool, float], Awaitable[None]]
"""Handles (object, listed, received): received is when the watcher first got this Migration's pending state."""


@dataclasses.dataclass
class _Pending:
    obj: dict[str, Any]
    listed: bool
    received: float
    failures: int = 0


class Dispatcher:
    """Handles the latest state of each Migration, one at a time per Migration."""

    def __init__(self, handle: Handle, concurrency: int) -> None:
        self._handle = handle
        self._limit = asyncio.Semaphore(concurrency)
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.handled = 0

    def submit(self, obj: dict[str, Any], listed: bool, failures: int = 0, received: float | None = None) -> None:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        earlier = self._pending.get(key)
        first_seen = earlier.received if earlier else received if received is not None else time.monotonic()
        self._pending[key] = _Pending(obj, listed or bool(earlier and earlier.listed), first_seen, failures)
        if key not in self._running:
            self._running[key] = asyncio.create_task(self._drain(key))

    async def _drain(self, key: tuple[str, str]) -> None:
        try:
            while key in self._pending:
                pending = self._pending.pop(key)
                async with self._limit:
                    try:
                        await self._handle(pending.obj, pending.listed, pending.received)
                        self.handled += 1
                    except Exception:
                        delay = RETRY_DELAYS[min(pending.failures, len(RETRY_DELAYS) - 1)]
                        log.exception("handling Migration %s/%s failed; retrying in %.0fs", *key, delay)
                        asyncio.get_running_loop().call_later(
                            delay, self._retry, key, pending.obj, pending.listed, pending.failures + 1
                        )
        finally:
            del self._running[key]

    def _retry(self, key: tuple[str, str], obj: dict[str, Any], listed: bool, failures: int) -> None:
        if key not in self._pending:  # a newer state supersedes the failed one
            self.submit(obj, listed, failures)

    async def close(self) -> None:
        for task in list(self._running.values()):
            task.cancel()
        for task in list(self._running.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task


class Watcher:
    """Watches Migrations and hands each to the handler; runs while this replica leads."""

    def __init__(self, client: Client, api: k8s.ApiClient, settings: WatcherSettings, metrics: WatcherMetrics) -> None:
        self._api = api
        self._settings = settings
        self._metrics = metrics
        self._writer = MigrationWriter(api, settings.lease.identity)
        deletion = DeletionHandler(client, self._writer, settings, self._resubmit)
        self._handler = MigrationHandler(client, self._writer, settings, deletion, metrics)
        self._dispatcher = Dispatcher(self._handler.handle, settings.concurrency)
        self._background: set[asyncio.Task[None]] = set()
        self.watches: list[MigrationWatch] = []

    def _resubmit(self, ref: MigrationRef) -> None:
        """Looks at a Migration again (a wait it had ended); it may be gone by now."""
        loop = asyncio.get_running_loop()

        async def again() -> None:
            obj = await asyncio.to_thread(self._writer.read, ref)
            if obj is not None:
                self._dispatcher.submit(obj, True)

        task = loop.create_task(again())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()

        def deliver(obj: dict[str, Any], kind: str) -> None:
            self._metrics.events.add(1, {"type": kind})
            loop.call_soon_threadsafe(self._dispatcher.submit, obj, kind == "LISTED", 0, time.monotonic())

        listings: dict[str | None, list[dict[str, Any]]] = {}
        lock = threading.Lock()

        def listed_in(scope: str | None) -> Callable[[list[dict[str, Any]]], None]:
            def listed(items: list[dict[str, Any]]) -> None:
                with lock:  # each namespace lists in its own thread; the gauges cover them all
                    listings[scope] = items
                    self._metrics.observe_listing([item for found in listings.values() for item in found])

            return listed

        stop_threads = threading.Event()
        scopes: list[str | None] = list(self._settings.namespaces) or [None]
        self.watches = [MigrationWatch(self._api, ns, deliver, stop_threads, listed_in(ns)) for ns in scopes]
        threads = [
            threading.Thread(target=watch.run, name=f"watch-{watch.scope}", daemon=True) for watch in self.watches
        ]
        for thread in threads:
            thread.start()
        resync = asyncio.create_task(self._resync(stop))
        try:
            await stop.wait()
        finally:
            stop_threads.set()
            resync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await resync
            await self._dispatcher.close()

    async def _resync(self, stop: asyncio.Event) -> None:
        """Relists every interval: level-triggered safety net, and how terminated runs are noticed."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._settings.resync_interval)
            if stop.is_set():
                return
            for watch in self.watches:
                try:
                    await asyncio.to_thread(watch.list_all)
                except Exception as error:  # noqa: BLE001 - the next resync tries again
                    log.warning("resync of %s failed: %s", watch.scope, error)


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
        interceptors = [TracingInterceptor()] if tracing.configure(observed.tracing, "ferry-watcher") else []
        # Blocking Kubernetes calls run in threads: one per Migration handled at once, plus the
        # Lease and a resync, each with a connection of its own.
        threads = settings.concurrency + 4
        api = startup.kubernetes_api(settings.kubeconfig, connections=threads + len(settings.namespaces) + 1)
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
                api.close()
        if client is None:
            return
        connected.set()
        metrics = WatcherMetrics(runtime.metric_meter if runtime else MetricMeter.noop)
        elector = LeaderElector(api, settings.lease)
        await _lead(client, api, elector, settings, metrics, stop)


async def _lead(
    client: Client,
    api: k8s.ApiClient,
    elector: LeaderElector,
    settings: WatcherSettings,
    metrics: WatcherMetrics,
    stop: asyncio.Event,
) -> None:
    try:
        if not await elector.acquire(stop):
            return
        leading = asyncio.Event()
        watcher = Watcher(client, api, settings, metrics)
        work = asyncio.create_task(watcher.run(leading))
        try:
            await elector.hold(stop)
        finally:
            leading.set()
            await work
        await asyncio.to_thread(elector.release)
    finally:
        api.close()
