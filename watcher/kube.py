"""Every call the watcher makes to the Kubernetes API, as async methods on typed models.

The watcher uses the generated, blocking client the worker uses (docs/architecture.md,
"Threads, not an asyncio client", says why): each call below runs in a thread of the
loop's default executor, and each watch in a thread of its own that hands its events to
the loop. This module is the only place where the watcher crosses between asyncio and
threads, and the only one that sees the client's raw dicts: objects are parsed into
ferry.api models here, in the thread that received them, so the event loop never
spends its time validating a list of ten thousand Migrations.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from collections.abc import AsyncGenerator, Callable, Mapping
from datetime import datetime
from typing import Any, Generic, TypeVar

from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from activities.events import Recorded, record_event
from ferry.api.migration import GROUP, PLURAL, VERSION, EventType, Migration
from ferry.api.saga import MigrationRef
from ferry.kube_requests import DEFAULT_TIMEOUTS

log = logging.getLogger("ferry.watcher.kube")

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
"""Accept header that asks the API server to answer with an object's metadata alone."""
FIELD_MANAGER = "ferry-watcher"
"""The watcher's field manager: it owns status.controls and status.deletion (the saga owns the rest)."""
COMPONENT = "ferry.dev/watcher"
WATCH_TIMEOUT = 240
"""Seconds the API server keeps one watch request open; the watch then resumes from where it was."""
WATCH_READ_TIMEOUT = WATCH_TIMEOUT + DEFAULT_TIMEOUTS.read
"""Seconds a watch may stay silent before its connection counts as dead (the server ends it after WATCH_TIMEOUT)."""


LIST_PAGE = 500
"""Migrations per page of a list: bounds what one response holds in memory at once."""
Kept = TypeVar("Kept")


class Conflict(Exception):
    """The write carried a resourceVersion that is no longer the object's (409): read again, then retry."""


class Gone(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


@dataclasses.dataclass(frozen=True)
class Listing(Generic[Kept]):
    """One full list of Migrations, as much of each as the caller keeps."""

    items: list[Kept]
    resource_version: str
    """Where a watch that follows this list starts."""


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    type: str
    """ADDED, MODIFIED, DELETED, or BOOKMARK (which only moves `resource_version` on)."""
    resource_version: str
    migration: Migration | None
    """The object's state after the event; None for a bookmark (or an object without valid metadata)."""


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """What leader election reads and writes of a coordination.k8s.io Lease."""

    holder: str | None
    duration_seconds: int | None
    acquire_time: datetime | None
    renew_time: datetime | None
    transitions: int
    resource_version: str | None = None
    """The version this record was read at (a write is conditional on it); None: the Lease does not exist."""


class Kube:
    """The watcher's Kubernetes API, on one blocking ApiClient whose connection pool fits the threads."""

    def __init__(self, api: k8s.ApiClient, identity: str) -> None:
        self._api = api
        self._custom = k8s.CustomObjectsApi(api)
        self._events = _EventsApi(api)
        self._coordination = k8s.CoordinationV1Api(api)
        self._secrets = _SecretsApi(api)
        self._identity = identity

    def close(self) -> None:
        self._api.close()

    # --- Migrations ------------------------------------------------------------------------

    async def list_migrations(
        self, namespace: str | None, keep: Callable[[Migration], Kept], page: int = LIST_PAGE
    ) -> Listing[Kept]:
        """Every Migration in `namespace` (None: all namespaces), parsed, as much of each as `keep` returns.

        The list is read `page` objects at a time (one consistent snapshot: the pages share
        its resourceVersion), and `keep` runs in this thread on each object as its page is
        parsed, so neither the raw pages nor whole models of objects the caller does not
        need outlive their page.
        """
        return await asyncio.to_thread(self._list, namespace, keep, page)

    def _list(self, namespace: str | None, keep: Callable[[Migration], Kept], page: int) -> Listing[Kept]:
        function, arguments = self._list_call(namespace)
        kept: list[Kept] = []
        token: str | None = None
        while True:
            # The raw body, parsed here once: the client's own path decodes it to a str first, a second copy.
            response = function(*arguments, limit=page, _continue=token, _preload_content=False)
            try:
                listed: dict[str, Any] = json.loads(response.data)
            finally:
                response.release_conn()
            kept.extend(keep(migration) for raw in listed.get("items", []) if (migration := _parse(raw)) is not None)
            token = listed["metadata"].get("continue")
            if not token:
                return Listing(kept, listed["metadata"]["resourceVersion"])

    async def watch_migrations(self, namespace: str | None, resource_version: str) -> AsyncGenerator[WatchEvent, None]:
        """The events after `resource_version` until the server ends the watch; raises Gone when it is too old.

        The blocking stream runs in a thread of its own; closing this iterator (or cancelling
        the task that reads it) stops the stream at once.
        """
        loop = asyncio.get_running_loop()
        received: asyncio.Queue[WatchEvent | BaseException | None] = asyncio.Queue()
        stream = watch.Watch()
        function, arguments = self._list_call(namespace)

        def hand_over(item: WatchEvent | BaseException | None) -> bool:
            try:
                loop.call_soon_threadsafe(received.put_nowait, item)
            except RuntimeError:  # the loop has closed: nobody reads any more
                return False
            return True

        def pump() -> None:
            try:
                for raw in stream.stream(
                    function,
                    *arguments,
                    resource_version=resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_TIMEOUT,
                    _request_timeout=(DEFAULT_TIMEOUTS.connect, WATCH_READ_TIMEOUT),
                ):
                    if not hand_over(_event(raw)):
                        stream.stop()
                        return
            except ApiException as error:
                hand_over(Gone(str(error.reason)) if error.status == 410 else error)
                return
            except Exception as error:  # noqa: BLE001 - handed to the loop, which raises it
                hand_over(error)
                return
            hand_over(None)

        threading.Thread(target=pump, name=f"watch-{namespace or 'all'}", daemon=True).start()
        try:
            while (item := await received.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stream.stop()

    async def read_migration(self, ref: MigrationRef) -> Migration | None:
        """The Migration as it is now; None when it is gone or was re-created (another uid)."""
        return await asyncio.to_thread(self._read, ref)

    def _read(self, ref: MigrationRef) -> Migration | None:
        try:
            raw = self._custom.get_namespaced_custom_object(GROUP, VERSION, ref.namespace, PLURAL, ref.name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        migration = _parse(raw)
        return migration if migration is not None and migration.metadata.uid == ref.uid else None

    async def patch_migration(self, ref: MigrationRef, patch: Mapping[str, Any]) -> Migration | None:
        """Merge-patches the object (not its status); None when it is gone; raises Conflict on 409."""
        return await asyncio.to_thread(self._patch, ref, patch)

    def _patch(self, ref: MigrationRef, patch: Mapping[str, Any]) -> Migration | None:
        return self._merge_patch(self._custom.patch_namespaced_custom_object, ref, patch)

    async def patch_status(
        self, ref: MigrationRef, status: Mapping[str, Any], resource_version: str
    ) -> Migration | None:
        """Merge-patches the given status fields of the object at `resource_version` (a version of this very
        Migration); None when it is gone; raises Conflict on 409, which another write in between causes."""
        return await asyncio.to_thread(self._patch_status, ref, status, resource_version)

    def _patch_status(self, ref: MigrationRef, status: Mapping[str, Any], resource_version: str) -> Migration | None:
        # A uid in the patch would not do: the status subresource takes only the status from a write.
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        return self._merge_patch(self._custom.patch_namespaced_custom_object_status, ref, body)

    def _merge_patch(self, call: Callable[..., Any], ref: MigrationRef, body: Mapping[str, Any]) -> Migration | None:
        """`call` (a patch of the object or of its status) with `body` as the watcher; None when the Migration is
        gone; Conflict on 409."""
        try:
            raw = call(
                GROUP, VERSION, ref.namespace, PLURAL, ref.name, body, field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
            )  # fmt: skip
        except ApiException as error:
            if error.status == 404:
                return None
            if error.status == 409:
                raise Conflict(f"Migration {ref} changed since it was read") from error
            raise
        return _parse(raw)

    async def remove_secret_finalizer(self, namespace: str, name: str, finalizer: str) -> None:
        """Removes `finalizer` from the Secret, and only it (a strategic merge patch: no read, no conflict). Idempotent:
        a Secret without it, or gone, is left as it is. The answer is asked for as the object's metadata alone, so
        the Secret's data never reaches the watcher."""
        await asyncio.to_thread(self._remove_secret_finalizer, namespace, name, finalizer)

    def _remove_secret_finalizer(self, namespace: str, name: str, finalizer: str) -> None:
        patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": [finalizer]}}
        try:
            self._secrets.patch_metadata(namespace, name, patch)
        except ApiException as error:
            if error.status == 404:
                return
            raise

    async def record_event(self, ref: MigrationRef, kind: EventType, reason: str, message: str, key: str) -> Recorded:
        """Records a watcher Event once per key (a second pass finds it there and records nothing)."""
        return await asyncio.to_thread(
            record_event, self._events, ref, type=kind, reason=reason, message=message, key=f"watcher.{key}",
            component=COMPONENT, instance=self._identity,
        )  # fmt: skip

    def _list_call(self, namespace: str | None) -> tuple[Callable[..., Any], tuple[str, ...]]:
        if namespace:
            return self._custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, PLURAL)
        return self._custom.list_cluster_custom_object, (GROUP, VERSION, PLURAL)

    # --- the Lease -------------------------------------------------------------------------

    async def read_lease(self, name: str, namespace: str) -> LeaseRecord | None:
        return await asyncio.to_thread(self._read_lease, name, namespace)

    def _read_lease(self, name: str, namespace: str) -> LeaseRecord | None:
        try:
            lease = self._coordination.read_namespaced_lease(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        spec = lease.spec
        return LeaseRecord(
            holder=spec.holder_identity,
            duration_seconds=spec.lease_duration_seconds,
            acquire_time=spec.acquire_time,
            renew_time=spec.renew_time,
            transitions=spec.lease_transitions or 0,
            resource_version=lease.metadata.resource_version,
        )

    async def write_lease(self, name: str, namespace: str, record: LeaseRecord) -> bool:
        """Creates the Lease, or replaces it conditionally on the version `record` was read at; False on a conflict."""
        return await asyncio.to_thread(self._write_lease, name, namespace, record)

    def _write_lease(self, name: str, namespace: str, record: LeaseRecord) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": record.resource_version},
            "spec": {
                "holderIdentity": record.holder,
                "leaseDurationSeconds": record.duration_seconds,
                "acquireTime": record.acquire_time,
                "renewTime": record.renew_time,
                "leaseTransitions": record.transitions,
            },
        }
        try:
            if record.resource_version is None:
                self._coordination.create_namespaced_lease(namespace, body)
            else:
                self._coordination.replace_namespaced_lease(name, namespace, body)
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True


class _EventsApi:
    """The one core/v1 call the watcher makes, creating an Event, posted through the ApiClient itself.

    The generated CoreV1Api would serve as well, but loading it builds the validators of every
    core/v1 model: some 85 MiB, more than everything else the watcher holds for ten thousand
    Migrations. activities/events.py calls this object as it would call a CoreV1Api.
    """

    def __init__(self, api: k8s.ApiClient) -> None:
        self._api = api

    def create_namespaced_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        json_only = {"Accept": "application/json", "Content-Type": "application/json"}
        request = self._api.param_serialize(
            method="POST", resource_path="/api/v1/namespaces/{namespace}/events", path_params={"namespace": namespace},
            header_params=json_only, body=body, auth_settings=["BearerToken"],
        )  # fmt: skip
        response = self._api.call_api(*request)
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=response.data.decode(errors="replace"), data=None)


class _SecretsApi:
    """The one call the watcher makes on Secrets, posted through the ApiClient itself (as _EventsApi, and for the
    same reason): a strategic merge patch of a Secret's metadata, whose answer is its metadata alone
    (PartialObjectMetadata), never its data."""

    def __init__(self, api: k8s.ApiClient) -> None:
        self._api = api

    def patch_metadata(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        headers = {"Accept": METADATA_ONLY, "Content-Type": STRATEGIC_MERGE_PATCH}
        request = self._api.param_serialize(
            method="PATCH", resource_path="/api/v1/namespaces/{namespace}/secrets/{name}",
            path_params={"namespace": namespace, "name": name}, header_params=headers, body=patch,
            auth_settings=["BearerToken"],
        )  # fmt: skip
        response = self._api.call_api(*request)
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=response.data.decode(errors="replace"), data=None)


def _parse(raw: Mapping[str, Any]) -> Migration | None:
    """The typed Migration; None (logged) for an object without the metadata every object has."""
    try:
        return Migration.parse(raw)
    except (ValidationError, KeyError) as error:
        log.error("skipping a Migration object whose metadata does not parse: %s", error)
        return None


def _event(raw: Mapping[str, Any]) -> WatchEvent:
    kind, obj = raw["type"], raw["object"]
    return WatchEvent(kind, obj["metadata"]["resourceVersion"], None if kind == "BOOKMARK" else _parse(obj))
