"""`kubectl ferry status -w`: a Kubernetes watch on one Migration, its table redrawn until it finishes.

The watch runs in a thread (the Kubernetes client blocks) and hands each version of the
object to the event loop, which also asks Temporal for the running step's heartbeat
once a second, so bytes and time left move between two writes of the status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

import urllib3
from kubernetes import client as k8s
from temporalio.client import Client

from ferry.api.migration import FINISHED_PHASES, GROUP, PLURAL, VERSION
from ferry.kubectl import temporal
from ferry.kubectl.cluster import TIMEOUTS, Cluster
from ferry.kubectl.errors import PluginError
from ferry.kubectl.output import Colours
from ferry.kubectl.progress import Display, order_of

FINISHED = {phase.value for phase in FINISHED_PHASES}
TICK = 1.0
"""Seconds between two redraws while nothing changes (a running step's time and heartbeat move)."""
WATCH_SECONDS = 60
"""How long one watch request lasts before it is made again from the last version seen."""


def workflow_of(obj: dict[str, Any]) -> str | None:
    return ((obj.get("status") or {}).get("workflow") or {}).get("id")


async def running_heartbeat(client: Client | None, obj: dict[str, Any]) -> dict[str, Any] | None:
    status = obj.get("status") or {}
    workflow = workflow_of(obj)
    if client is None or not workflow or not status.get("currentStep") or status.get("phase") in FINISHED:
        return None
    return await temporal.heartbeat(client, workflow)


class _Watch:
    """A watch on one Migration, run in a thread; `close` ends its request at once from any thread.

    The request is read here rather than through kubernetes.watch, so that closing it can
    interrupt a read that would otherwise block until the server ends the watch: the
    process must not exit while a thread still reads from a socket.
    """

    def __init__(self, cluster: Cluster, obj: dict[str, Any], put: Callable[[tuple[str, Any]], None]) -> None:
        self._cluster = cluster
        self._metadata = obj["metadata"]
        self._put = put
        self._closed = threading.Event()
        self._response: Any = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        namespace, name = self._metadata["namespace"], self._metadata["name"]
        version = self._metadata["resourceVersion"]
        custom = k8s.CustomObjectsApi(self._cluster.api)
        try:
            while not self._closed.is_set():
                try:
                    response = custom.list_namespaced_custom_object(
                        GROUP, VERSION, namespace, PLURAL, field_selector=f"metadata.name={name}", watch=True,
                        resource_version=version, timeout_seconds=WATCH_SECONDS, _preload_content=False,
                        _request_timeout=(TIMEOUTS.connect, WATCH_SECONDS + TIMEOUTS.read),
                    )  # fmt: skip
                except urllib3.exceptions.MaxRetryError as error:
                    if isinstance(error.reason, urllib3.exceptions.ReadTimeoutError):
                        raise _silent(namespace, name) from None
                    raise
                with self._lock:
                    self._response = response
                try:
                    for kind, current in _events(response):
                        if kind == "ERROR":
                            if current.get("code") != 410:
                                raise PluginError(str(current.get("message") or current))
                            # Too old to resume from: read the object again and watch from there.
                            current, kind = self._cluster.migration(namespace, name), "MODIFIED"
                        version = current["metadata"]["resourceVersion"]
                        self._put((kind, current))
                except urllib3.exceptions.ReadTimeoutError:
                    raise _silent(namespace, name) from None
                finally:
                    response.release_conn()
        except Exception as error:  # noqa: BLE001 - handed to the loop, which reports it in one line
            if not self._closed.is_set():
                self._put(("FAILED", error))


def _silent(namespace: str, name: str) -> PluginError:
    """The server ends a watch after WATCH_SECONDS: one silent for longer than that and the read timeout has a server
    behind it that no longer answers, which is said in one line rather than waited on for ever."""
    return PluginError(
        f"the API server stopped answering: the watch of Migration {namespace}/{name} got nothing for "
        f"{WATCH_SECONDS + TIMEOUTS.read:.0f}s. Check the cluster (kubectl get --raw /readyz), then run the command "
        "again"
    )


def _events(response: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """The (type, object) of each line of a watch response, until the server or `close` ends it."""
    pending = b""
    for chunk in response.stream(65536, decode_content=True):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line.strip():
                event = json.loads(line)
                yield event["type"], event["object"]


async def follow(cluster: Cluster, obj: dict[str, Any], client: Client | None, out: TextIO) -> dict[str, Any]:
    """Shows the Migration's table until it reaches a final phase; returns its last version."""
    display = Display(out, interactive=out.isatty(), colours=Colours.for_stream(out), order=order_of(obj))
    loop = asyncio.get_running_loop()
    changes: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def put(item: tuple[str, Any]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits for it any more
            loop.call_soon_threadsafe(changes.put_nowait, item)

    watching = _Watch(cluster, obj, put)
    watching.start()
    name = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
    try:
        while True:
            status = obj.get("status") or {}
            display.render(status, await running_heartbeat(client, obj), datetime.now(UTC))
            if status.get("phase") in FINISHED:
                return obj
            with contextlib.suppress(TimeoutError):
                kind, payload = await asyncio.wait_for(changes.get(), timeout=TICK)
                if kind == "DELETED":
                    raise PluginError(f"Migration {name} was deleted while being watched")
                if kind == "FAILED":
                    raise PluginError(f"the watch on Migration {name} ended: {payload}")
                obj = payload
    finally:
        watching.close()


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)
