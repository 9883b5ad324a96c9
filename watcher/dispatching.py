"""Hands the latest state of each Migration to the handler, one pass at a time per Migration.

Events are coalesced per Migration: while one is being handled, newer states of it wait,
and only the latest is handled next, so a burst of status updates costs one pass.
A state the pass's own later write superseded is dropped: the watch brings the newer one.
Different Migrations are handled concurrently, up to the configured limit, in the order
they were submitted. A pass that fails is retried with backoff; it never stops the watcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Protocol

from ferry.api.migration import Migration

log = logging.getLogger("ferry.watcher")

RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)


class Handle(Protocol):
    async def __call__(self, migration: Migration, *, gone: bool, run_closed: bool, received: float) -> list[str]:
        """One pass; returns the resourceVersions the pass's own writes produced, in order."""


@dataclasses.dataclass(frozen=True)
class Pending:
    migration: Migration
    gone: bool
    """The watch said DELETED."""
    run_closed: bool
    """The resync's query saw its run end from outside; kept when a newer state supersedes this one."""
    received: float
    """When the watcher first got a state of this Migration that is still waiting (time.monotonic())."""
    failures: int = 0


class Dispatcher:
    """Handles the latest state of each Migration, one at a time per Migration."""

    def __init__(self, handle: Handle, concurrency: int) -> None:
        self._handle = handle
        self._limit = asyncio.Semaphore(concurrency)
        self._pending: dict[tuple[str, str], Pending] = {}
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._superseded: dict[tuple[str, str], frozenset[str]] = {}
        """Per Migration, the resourceVersions its last pass wrote and then wrote over."""
        self._closed = False

    def submit(
        self, migration: Migration, *, gone: bool = False, run_closed: bool = False, received: float | None = None,
        failures: int = 0,
    ) -> None:  # fmt: skip
        key = (migration.metadata.namespace, migration.metadata.name)
        superseded = self._superseded.pop(key, frozenset())
        if migration.metadata.resource_version in superseded and not (gone or run_closed):
            self._superseded[key] = superseded  # the pass's last write is still to come
            return
        earlier = self._pending.get(key)
        first_seen = earlier.received if earlier else received if received is not None else time.monotonic()
        run_closed = run_closed or bool(earlier and earlier.run_closed)
        self._pending[key] = Pending(migration, gone, run_closed, first_seen, failures)
        if key not in self._running:
            self._running[key] = asyncio.create_task(self._drain(key))

    async def _drain(self, key: tuple[str, str]) -> None:
        try:
            while key in self._pending:
                pending = self._pending.pop(key)
                async with self._limit:
                    try:
                        written = await self._handle(
                            pending.migration, gone=pending.gone, run_closed=pending.run_closed,
                            received=pending.received,
                        )  # fmt: skip
                        self._drop_superseded(key, written)
                    except Exception:
                        delay = RETRY_DELAYS[min(pending.failures, len(RETRY_DELAYS) - 1)]
                        log.exception("handling Migration %s/%s failed; retrying in %.0fs", *key, delay)
                        asyncio.get_running_loop().call_later(delay, self._retry, key, pending)
        finally:
            del self._running[key]

    def _drop_superseded(self, key: tuple[str, str], written: list[str]) -> None:
        """Forgets the states that the pass's own later write superseded (e.g. the finalizer and annotation it wrote
        before it acknowledged a control), waiting or still to come: the watch brings that write's state too, and
        handling an older one would only repeat the pass. Watch events come in order, so the first other state ends
        this."""
        superseded = frozenset(written[:-1])
        if not superseded:
            return
        self._superseded[key] = superseded
        waiting = self._pending.get(key)
        if waiting is not None and not waiting.run_closed and waiting.migration.metadata.resource_version in superseded:
            del self._pending[key]

    def _retry(self, key: tuple[str, str], failed: Pending) -> None:
        if not self._closed and key not in self._pending:  # a newer state supersedes the failed one
            self.submit(failed.migration, gone=failed.gone, run_closed=failed.run_closed, failures=failed.failures + 1)

    async def idle(self) -> None:
        """Waits until no pass is under way and none waits."""
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._running.values()):
            task.cancel()
        for task in list(self._running.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
