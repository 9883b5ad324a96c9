"""The watcher's writes to Migrations: its finalizer, and the status fields it owns.

Finalizer changes are merge patches carrying the resourceVersion they were computed
from, retried from a fresh read on 409, so no other finalizer is ever lost. The
watcher's status fields (controls, deletion) are merge-patched alone, which leaves the
saga's fields as they are; only an Abandoned Migration gets its phase from the watcher,
because then no workflow is left to write it.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from activities.events import record_event
from ferry.api.migration import FINALIZER, GROUP, PLURAL, VERSION, Condition, EventType, Phase
from ferry.api.saga import MigrationRef
from workflows.status import conditions_for

log = logging.getLogger("ferry.watcher.patching")

MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = "ferry-watcher"
"""The watcher's field manager: it owns status.controls and status.deletion (the saga owns the rest)."""
COMPONENT = "ferry.dev/watcher"
CONFLICT_ATTEMPTS = 10


def ref_of(obj: dict[str, Any]) -> MigrationRef:
    metadata = obj["metadata"]
    return MigrationRef(namespace=metadata["namespace"], name=metadata["name"], uid=metadata["uid"])


class MigrationWriter:
    """Writes to Migration objects on behalf of the watcher."""

    def __init__(self, api: k8s.ApiClient, identity: str) -> None:
        self._custom = k8s.CustomObjectsApi(api)
        self._core = k8s.CoreV1Api(api)
        self._identity = identity

    def read(self, ref: MigrationRef) -> dict[str, Any] | None:
        """The Migration as it is now; None when it is gone or was re-created (another UID)."""
        try:
            obj: dict[str, Any] = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, ref.namespace, PLURAL, ref.name
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return obj if obj["metadata"]["uid"] == ref.uid else None

    def add_finalizer(self, obj: dict[str, Any]) -> None:
        self._change_finalizers(obj, add=True)

    def remove_finalizer(self, obj: dict[str, Any]) -> None:
        self._change_finalizers(obj, add=False)

    def _change_finalizers(self, seen: dict[str, Any], *, add: bool) -> None:
        """Starts from the object as the watch delivered it; re-reads only after a conflict."""
        ref = ref_of(seen)
        obj: dict[str, Any] | None = seen
        for _ in range(CONFLICT_ATTEMPTS):
            if obj is None:
                return
            finalizers: list[str] = obj["metadata"].get("finalizers") or []
            if (FINALIZER in finalizers) == add:
                return
            wanted = [*finalizers, FINALIZER] if add else [f for f in finalizers if f != FINALIZER]
            patch = {"metadata": {"finalizers": wanted, "resourceVersion": obj["metadata"]["resourceVersion"]}}
            try:
                self._custom.patch_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    ref.namespace,
                    PLURAL,
                    ref.name,
                    patch,
                    field_manager=FIELD_MANAGER,
                    _content_type=MERGE_PATCH,
                )
                log.info("%s finalizer %s on Migration %s", "added" if add else "removed", FINALIZER, ref)
                return
            except ApiException as error:
                if error.status == 404:
                    return
                if error.status != 409:
                    raise
            obj = self.read(ref)
        raise RuntimeError(f"Migration {ref} kept changing; could not update its finalizers")

    def patch_status(self, ref: MigrationRef, status: dict[str, Any]) -> None:
        """Merge-patches the given status fields; a missing Migration is left alone."""
        try:
            self._custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                ref.namespace,
                PLURAL,
                ref.name,
                {"status": status},
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def mark_abandoned(self, obj: dict[str, Any], message: str) -> None:
        """Sets phase Abandoned: the workflow ended without finishing the Migration (it was terminated)."""
        status = obj.get("status") or {}
        previous = {raw["type"]: Condition.model_validate(raw) for raw in status.get("conditions") or []}
        generation = obj["metadata"].get("generation")
        conditions = conditions_for(Phase.ABANDONED, message, generation, previous, datetime.now(UTC))
        self.patch_status(
            ref_of(obj),
            {
                "phase": Phase.ABANDONED.value,
                "currentStep": None,
                "message": message,
                "conditions": [
                    c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions.values()
                ],
            },
        )

    def event(self, ref: MigrationRef, kind: EventType, reason: str, message: str, key: str) -> None:
        """Records a watcher Event once per key (a relist does not record it again)."""
        record_event(
            self._core,
            ref,
            type=kind,
            reason=reason,
            message=message,
            key=f"watcher.{key}",
            component=COMPONENT,
            instance=self._identity,
        )
