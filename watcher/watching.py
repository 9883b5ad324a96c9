"""List, then watch, Migrations: resume from the last resourceVersion, relist on 410 Gone.

A list happens when a watch starts and after 410 Gone, never on a timer: a watch that
resumes from its resourceVersion misses no event, so relisting ten thousand Migrations
would only spend CPU. A list hands over what watcher/inventory.py keeps of each object
(the whole object only when a pass has work for it); a watch event hands over the parsed
object (watcher/kube.py): the handler is level-triggered and never needs more than the
latest state and whether it is gone. A broken watch resumes where it was after a
backoff. Bookmarks are handed over too: they are the watch's sign of life when nothing
changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import urllib3
from kubernetes.client.exceptions import ApiException

from watcher.inventory import Listed, keep
from watcher.kube import Gone, Kube, WatchEvent

log = logging.getLogger("ferry.watcher.watching")

BACKOFF_MAX = 30.0

OnListing = Callable[[str | None, list[Listed]], None]
"""Receives every full list: (its namespace or None for all, what is kept of each Migration)."""
OnEvent = Callable[[WatchEvent], None]
"""Receives each ADDED, MODIFIED, DELETED or BOOKMARK event."""


class MigrationWatch:
    """Keeps one list-and-watch of Migrations going (in one namespace, or all) until cancelled."""

    def __init__(self, kube: Kube, namespace: str | None, on_listing: OnListing, on_event: OnEvent) -> None:
        self._kube = kube
        self._namespace = namespace
        self._on_listing = on_listing
        self._on_event = on_event
        self._version: str | None = None
        """Where the watch resumes; None asks for a full list first."""
        self.relists = 0
        """How many full lists this watch made (the first one included)."""

    @property
    def scope(self) -> str:
        return f"namespace {self._namespace}" if self._namespace else "all namespaces"

    async def run(self, stop: asyncio.Event) -> None:
        """Until stopped (or cancelled): list, then watch; a broken watch resumes where it was, 410 Gone relists."""
        backoff = 0.5
        while not stop.is_set():
            try:
                if self._version is None:
                    self._version = await self.list_all()
                await self._watch()
                backoff = 0.5
            except Gone:
                log.info("resourceVersion %s of %s is too old (410 Gone); relisting", self._version, self.scope)
                self._version = None
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
                log.warning(
                    "watch of Migrations in %s failed (%s); resuming from resourceVersion %s in %.1fs",
                    self.scope, error, self._version, backoff,
                )  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    async def list_all(self) -> str:
        """Hands over every Migration in scope; returns where to watch from."""
        listing = await self._kube.list_migrations(self._namespace, keep)
        self.relists += 1
        self._on_listing(self._namespace, listing.items)
        log.info(
            "listed %d Migrations in %s at resourceVersion %s", len(listing.items), self.scope, listing.resource_version
        )
        return listing.resource_version

    async def _watch(self) -> None:
        """Watches from the last resourceVersion seen until the server ends the watch."""
        assert self._version is not None
        async with contextlib.aclosing(self._kube.watch_migrations(self._namespace, self._version)) as events:
            async for event in events:
                self._version = event.resource_version
                if event.type == "BOOKMARK" or (
                    event.migration is not None and event.type in ("ADDED", "MODIFIED", "DELETED")
                ):
                    self._on_event(event)
