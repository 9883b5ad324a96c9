"""List, then watch, Migrations: resume from the last resourceVersion, relist on 410 Gone.

The Kubernetes client is blocking, so each watch runs in a thread of its own and hands
objects to the asyncio side through a callback. Every object is handed over whole:
the handler is level-triggered and never needs the event type, only the latest state.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from ferry.api.migration import GROUP, PLURAL, VERSION

log = logging.getLogger("ferry.watcher.watching")

WATCH_TIMEOUT = 240
"""Seconds the API server keeps one watch request open; the watch then resumes from where it was."""
BACKOFF_MAX = 30.0

Deliver = Callable[[dict[str, Any], str], None]
"""Receives (object, kind): kind is LISTED for objects from a full list, else the watch event's type
(ADDED, MODIFIED, DELETED)."""
Listed = Callable[[list[dict[str, Any]]], None]
"""Receives every full list, e.g. to count Migrations by phase."""


class MigrationWatch:
    """Keeps one list-and-watch of Migrations going (in one namespace, or all) until stopped."""

    def __init__(
        self,
        api: k8s.ApiClient,
        namespace: str | None,
        deliver: Deliver,
        stop: threading.Event,
        listed: Listed | None = None,
    ) -> None:
        self._custom = k8s.CustomObjectsApi(api)
        self._namespace = namespace
        self._deliver = deliver
        self._listed = listed
        self._stop = stop
        self._version: str | None = None
        """Where the watch resumes; None asks for a full list first."""
        self.relists = 0
        """How many full lists this watch made (the first one included)."""

    @property
    def scope(self) -> str:
        return f"namespace {self._namespace}" if self._namespace else "all namespaces"

    def run(self) -> None:
        """Blocks until stopped: list, then watch; a broken watch resumes where it was, 410 Gone relists."""
        backoff = 0.5
        while not self._stop.is_set():
            try:
                if self._version is None:
                    self._version = self.list_all()
                self._watch()
                backoff = 0.5
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
                if self._stop.is_set():
                    return
                log.warning(
                    "watch of Migrations in %s failed (%s); resuming from resourceVersion %s in %.1fs",
                    self.scope, error, self._version, backoff,
                )  # fmt: skip
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    def list_all(self) -> str:
        """Delivers every Migration in scope; returns the list's resourceVersion."""
        listed: dict[str, Any] = self._list_function()(*self._list_arguments())
        self.relists += 1
        items = listed.get("items", [])
        for item in items:
            item.setdefault("apiVersion", f"{GROUP}/{VERSION}")
            self._deliver(item, "LISTED")
        if self._listed is not None:
            self._listed(items)
        version: str = listed["metadata"]["resourceVersion"]
        log.info("listed %d Migrations in %s at resourceVersion %s", len(listed.get("items", [])), self.scope, version)
        return version

    def _watch(self) -> None:
        """Watches from the last resourceVersion seen until stopped; returns on 410 Gone, which asks for a relist."""
        while not self._stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    self._list_function(),
                    *self._list_arguments(),
                    resource_version=self._version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_TIMEOUT,
                ):
                    if self._stop.is_set():
                        stream.stop()
                        return
                    obj = event["object"]
                    self._version = obj["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._deliver(obj, event["type"])
            except ApiException as error:
                if error.status == 410:
                    log.info("resourceVersion %s of %s is too old (410 Gone); relisting", self._version, self.scope)
                    self._version = None
                    return
                raise

    def _list_function(self) -> Callable[..., Any]:
        function: Callable[..., Any] = (
            self._custom.list_namespaced_custom_object if self._namespace else self._custom.list_cluster_custom_object
        )
        return function

    def _list_arguments(self) -> tuple[str, ...]:
        if self._namespace:
            return (GROUP, VERSION, self._namespace, PLURAL)
        return (GROUP, VERSION, PLURAL)
