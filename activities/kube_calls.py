"""Reads and writes through the generated Kubernetes client, the way ferry's activities need them.

Objects that ferry writes back are read as raw JSON, not as the client's models: the
models drop fields they do not know when reading, and refuse them when writing, so a
model round trip would lose or reject whatever a newer API server adds.

Conditional writes are JSON Patches that start by setting metadata.resourceVersion to
the one of the read they were computed from. The API server answers 409 Conflict when
the object changed since that read, so no concurrent change is ever overwritten; the
caller reads again and recomputes (`retry_on_conflict`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from ferry.api.migration import API_VERSION, GROUP, KIND, PLURAL, VERSION
from ferry.api.saga import MigrationRef

T = TypeVar("T")

CONFLICT_ATTEMPTS = 10
"""Fresh reads a conditional write gets before the activity fails and Temporal retries it."""

APPLY_PATCH = "application/apply-patch+yaml"
JSON_PATCH = "application/json-patch+json"


def is_not_found(error: ApiException) -> bool:
    return getattr(error, "status", None) == 404


def is_conflict(error: ApiException) -> bool:
    """409: the object changed since it was read, or (on create) it already exists."""
    return getattr(error, "status", None) == 409


def read_json(read: Callable[..., Any], name: str, namespace: str) -> dict[str, Any]:
    """Calls a generated `read_namespaced_*` method and returns the object exactly as the server sent it."""
    response = read(name, namespace, _preload_content=False)
    try:
        raw: dict[str, Any] = json.loads(response.data)
        return raw
    finally:
        response.release_conn()


def read_json_or_none(read: Callable[..., Any], name: str, namespace: str) -> dict[str, Any] | None:
    """Like `read_json`, but None when the object does not exist."""
    try:
        return read_json(read, name, namespace)
    except ApiException as error:
        if is_not_found(error):
            return None
        raise


def read_migration(custom: k8s.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    """The Migration of that name as raw JSON; None when there is none."""
    return read_json_or_none(
        lambda name, namespace, **options: custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, **options
        ),
        name,
        namespace,
    )


def read_or_none(read: Callable[..., Any], name: str, namespace: str) -> Any:
    """A generated `read_namespaced_*` call returning the client's model, or None when the object does not exist."""
    try:
        return read(name, namespace)
    except ApiException as error:
        if is_not_found(error):
            return None
        raise


def delete_if_unchanged(delete: Callable[..., Any], name: str, namespace: str, uid: str, resource_version: str) -> None:
    """A generated `delete_namespaced_*` call that deletes only the object as it was read (else 409).

    The preconditions make the API server refuse when the object was replaced (another
    uid) or changed (another resourceVersion) since the read that decided to delete it;
    NotFound means the work is done.
    """
    options = k8s.V1DeleteOptions(
        propagation_policy="Background",
        preconditions=k8s.V1Preconditions(uid=uid, resource_version=resource_version),
    )
    try:
        delete(name, namespace, body=options)
    except ApiException as error:
        if not is_not_found(error):
            raise


def apply(patch: Callable[..., Any], manifest: dict[str, Any], field_manager: str, *, dry_run: bool = False) -> Any:
    """Server-side applies a full manifest through a generated `patch_namespaced_*` method.

    With `dry_run`, the API server validates and admits the object as it would store it,
    and stores nothing: a refusal (422) then comes before anything was written.
    """
    metadata = manifest["metadata"]
    options: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
    return patch(
        metadata["name"],
        metadata["namespace"],
        manifest,
        field_manager=field_manager,
        force=True,
        _content_type=APPLY_PATCH,
        **options,
    )


def patch_if_unchanged(patch: Callable[..., Any], read_object: dict[str, Any], operations: list[dict[str, Any]]) -> Any:
    """Applies JSON Patch operations unless the object changed since `read_object` was read (then 409)."""
    metadata = read_object["metadata"]
    guard = {"op": "replace", "path": "/metadata/resourceVersion", "value": metadata["resourceVersion"]}
    return patch(metadata["name"], metadata["namespace"], [guard, *operations], _content_type=JSON_PATCH)


def set_value(path: str, value: Any) -> dict[str, Any]:
    """A JSON Patch operation that sets `path` to `value`, replacing (never merging) what was there."""
    return {"op": "add", "path": path, "value": value}


def annotations_of(read_object: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = read_object["metadata"].get("annotations") or {}
    return found


def retry_on_conflict(attempt: Callable[[], T], attempts: int = CONFLICT_ATTEMPTS) -> tuple[T, int]:
    """Runs read-compute-write `attempt`s until one is not answered 409; returns its result and the conflicts.

    After `attempts` conflicts in a row the last one is raised: the activity fails and
    Temporal retries it later, which is what to do under that much contention.
    """
    conflicts = 0
    while True:
        try:
            return attempt(), conflicts
        except ApiException as error:
            if not is_conflict(error) or conflicts + 1 >= attempts:
                raise
            conflicts += 1


def migration_status_apply(ref: MigrationRef, resource_version: str, status: dict[str, Any] | None) -> dict[str, Any]:
    """A server-side apply of a Migration's status, conditional on `resource_version` (the read that showed its uid).

    `status` None applies no field at all, which removes every field the applying manager owned.
    """
    applied: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": ref.name, "namespace": ref.namespace, "resourceVersion": resource_version},
    }
    if status is not None:
        applied["status"] = status
    return applied
