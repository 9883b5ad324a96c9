"""Hands the latest state of each Migration to the handler, one pass at a time per Migration.

Events are coalesced per Migration: while one is being handled, newer states of it wait,
and only the latest is handled next, so a burst of status updates costs one pass.
A state the pass's own later write superseded is dropped: the watch brings the newer one.
The one state never dropped is a DELETED one: its pass lets the Migration's Secrets go
(watcher/decisions.py). A newer state of the same object cannot follow it, but one of a
Migration created again under the name can: the gone one's pass then runs first.
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
    gone_before: tuple[Pending, ...] = ()
    """Passes over the last states of earlier objects of this name (other uids) that the watch said DELETED before
    this state came, each with its failures so far: each runs first."""


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
        gone_before = _gone_before(earlier, migration)
        self._pending[key] = Pending(migration, gone, run_closed, first_seen, failures, gone_before)
        if key not in self._running:
            self._running[key] = asyncio.create_task(self._drain(key))

    async def _drain(self, key: tuple[str, str]) -> None:
        try:
            while key in self._pending:
                pending = self._pending.pop(key)
                async with self._limit:
                    for gone in pending.gone_before:
                        await self._pass(key, gone)
                    await self._pass(key, pending)
        finally:
            del self._running[key]

    async def _pass(self, key: tuple[str, str], pending: Pending) -> None:
        try:
            written = await self._handle(
                pending.migration, gone=pending.gone, run_closed=pending.run_closed, received=pending.received
            )
            self._drop_superseded(key, written)
        except Exception:
            delay = RETRY_DELAYS[min(pending.failures, len(RETRY_DELAYS) - 1)]
            log.exception("handling Migration %s/%s failed; retrying in %.0fs", *key, delay)
            asyncio.get_running_loop().call_later(delay, self._retry, key, pending)

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
        if (
            waiting is not None
            and not (waiting.run_closed or waiting.gone or waiting.gone_before)
            and waiting.migration.metadata.resource_version in superseded
        ):
            del self._pending[key]

    def _retry(self, key: tuple[str, str], failed: Pending) -> None:
        if self._closed:
            return
        waiting = self._pending.get(key)
        if waiting is None:
            self.submit(failed.migration, gone=failed.gone, run_closed=failed.run_closed, failures=failed.failures + 1)
        elif failed.gone and failed.migration.metadata.uid != waiting.migration.metadata.uid:
            # A Migration created again under the name does not supersede the gone one: its Secrets are still to go.
            again = dataclasses.replace(failed, failures=failed.failures + 1, gone_before=())
            self._pending[key] = dataclasses.replace(waiting, gone_before=(again, *waiting.gone_before))
        # else a newer state of the same object supersedes the failed one

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


def _gone_before(earlier: Pending | None, newer: Migration) -> tuple[Pending, ...]:
    """The gone states `earlier` carries that a state of `newer` must not drop: its own, if the watch said DELETED
    and `newer` is another object (a Migration created again under the name), and those it carried already."""
    if earlier is None:
        return ()
    if earlier.gone and earlier.migration.metadata.uid != newer.metadata.uid:
        return (*earlier.gone_before, dataclasses.replace(earlier, gone_before=()))
    return earlier.gone_before
