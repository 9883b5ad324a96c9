"""Kubernetes Events about a Migration, recorded once per transition however often a call is retried.

An Event's name is derived from the Migration's UID and a key naming the transition,
so a second recording of the same transition finds the Event there (409) and stops.
An Event is what people read about what ferry did, never a condition of doing it: where
the API server takes no new object (the namespace is being deleted, or is gone), the
Event is left out and the caller goes on, to the end of a rollback or to releasing
ferry's finalizer, which is what lets such a namespace go.
Used by the status mirror (the saga's Events) and by the watcher (its own Events).
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
from datetime import UTC, datetime

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from ferry.api.migration import API_VERSION, KIND, EventType
from ferry.api.saga import MigrationRef

MAX_MESSAGE = 1024
MAX_NAME = 253

log = logging.getLogger("ferry.events")


class Recorded(enum.Enum):
    """What became of an Event `record_event` was asked to record."""

    NEW = "new"
    ALREADY = "already"
    """Recorded before, under the same key."""
    NAMESPACE_GOING = "namespace going"
    """Left out: the namespace is being deleted, or is gone."""


def record_event(
    core: k8s.CoreV1Api,
    ref: MigrationRef,
    *,
    type: EventType,
    reason: str,
    message: str,
    key: str,
    component: str,
    instance: str,
) -> Recorded:
    """Creates the Event unless it exists; returns what became of it."""
    digest = hashlib.sha256(f"{ref.uid}{key}".encode()).hexdigest()[:16]
    name = f"{ref.name[: MAX_NAME - len(digest) - 1]}.{digest}"
    now = datetime.now(UTC)
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": ref.namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": ref.name,
            "namespace": ref.namespace,
            "uid": ref.uid,
        },
        "type": type.value,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": {"component": "ferry"},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        core.create_namespaced_event(ref.namespace, body)
    except ApiException as error:
        if error.status == 409:
            log.debug("Event %s/%s was already recorded", ref.namespace, name)
            return Recorded.ALREADY
        if _no_new_objects_in_namespace(error):
            log.info("Event %s %s/%s not recorded: its namespace is being deleted", reason, ref.namespace, name)
            return Recorded.NAMESPACE_GOING
        raise
    return Recorded.NEW


def _no_new_objects_in_namespace(error: ApiException) -> bool:
    """Whether the API server refused the Event for its namespace: one being deleted (403, cause
    NamespaceTerminating), or one already gone (404 naming the namespace)."""
    try:
        status = json.loads(error.body or "{}")
    except ValueError:
        return False
    details = (status.get("details") or {}) if isinstance(status, dict) else {}
    if error.status == 403:
        return any(cause.get("reason") == "NamespaceTerminating" for cause in details.get("causes") or [])
    return error.status == 404 and details.get("kind") == "namespaces"
