"""Mirrors the saga's progress into the Migration's status, and records its Events, for kubectl users.

The workflow owns the status; the watcher owns two parts of it: status.controls (which
kubectl controls it has acted on) and status.deletion (why a deleted Migration waits).
So the status is written from a fresh read that keeps the watcher's parts, conditional
on that read's resourceVersion: when the watcher wrote in between, the API server
answers 409 and the write is recomputed from a new read. Events get names derived from
the transition they record, so a retried activity finds its Event already there
instead of recording it twice (see activities/events.py).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from activities import kube_calls
from activities.events import record_event
from activities.settings import KubeActivitySettings
from ferry.api.migration import GROUP, PLURAL, VERSION, WATCHER_STATUS_FIELDS, MigrationStatus
from ferry.api.saga import EventRecord, KubeActivity, MigrationRef, MirrorStatusInput, MirrorStatusResult
from ferry.observability import metrics

WATCHER_FIELDS = WATCHER_STATUS_FIELDS
"""Status fields that belong to the watcher; mirror_status keeps whatever the fresh read holds."""
REPORTING_COMPONENT = "ferry.dev/saga"


class StatusActivities:
    """The activity that writes the workflow's view of a Migration into the Migration itself."""

    def __init__(self, api_client: k8s.ApiClient, settings: KubeActivitySettings) -> None:
        self._custom = k8s.CustomObjectsApi(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._settings = settings

    @activity.defn(name=KubeActivity.MIRROR_STATUS.value)
    def mirror_status(self, input: MirrorStatusInput) -> MirrorStatusResult:
        """Writes the given status into the Migration (keeping status.controls), then records the Event, if any.

        Idempotent: the same input writes the same status (and nothing when it is already
        there), and the Event's name is derived from the Migration's UID and the event's
        key, so a second run finds it and records nothing. A Migration that is gone, or
        was re-created under the same name (another UID), is left alone: found=False.
        """
        ref = input.ref
        started = time.monotonic()
        found, conflicts = kube_calls.retry_on_conflict(lambda: self._write_status(ref, input.status))
        meter = activity.metric_meter()
        meter.create_histogram_float(metrics.STATUS_PATCH, "Mirroring a saga's status into its Migration", "s").record(
            time.monotonic() - started
        )
        if conflicts:
            meter.create_counter(metrics.STATUS_PATCH_CONFLICTS, "409 Conflicts retried by mirror_status").add(
                conflicts
            )
        if not found:
            activity.logger.info("Migration %s is gone: status not mirrored", ref)
            return MirrorStatusResult(found=False, conflicts=conflicts)
        if conflicts:
            activity.logger.info("status of Migration %s written after %d conflicts", ref, conflicts)
        if input.event is not None:
            self._record_event(ref, input.event)
        return MirrorStatusResult(found=True, conflicts=conflicts)

    def _read(self, ref: MigrationRef) -> dict[str, Any] | None:
        """One fresh read of the Migration, None when it is gone. Kept apart so tests can add a write after it."""
        try:
            migration: dict[str, Any] = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, ref.namespace, PLURAL, ref.name
            )
        except ApiException as error:
            if kube_calls.is_not_found(error):
                return None
            raise
        return migration

    def _write_status(self, ref: MigrationRef, status: MigrationStatus) -> bool:
        """One read-compute-write attempt; False when the Migration is not (or no longer) there."""
        migration = self._read(ref)
        if migration is None or migration["metadata"].get("uid") != ref.uid:
            return False
        current = migration.get("status") or {}
        wanted = self._status_document(status, current)
        if wanted == current:
            return True
        # Replacing the status subresource sends the whole object; the API server takes only its
        # status, and only if metadata.resourceVersion is still the one just read (else 409).
        try:
            self._custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, ref.namespace, PLURAL, ref.name, {**migration, "status": wanted}
            )
        except ApiException as error:
            if kube_calls.is_not_found(error):
                return False
            raise
        return True

    def _status_document(self, status: MigrationStatus, current: dict[str, Any]) -> dict[str, Any]:
        wanted: dict[str, Any] = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        for field in WATCHER_FIELDS:
            wanted.pop(field, None)
            if field in current:
                wanted[field] = current[field]
        workflow = wanted.get("workflow")
        if workflow is not None and "url" not in workflow:
            url = self._workflow_url(workflow)
            if url is not None:
                workflow["url"] = url
        return wanted

    def _workflow_url(self, workflow: dict[str, Any]) -> str | None:
        """The run's page in the Temporal Web UI; None without a UI URL or a run ID to link to."""
        ui, run_id = self._settings.temporal_ui_url, workflow.get("runId")
        if ui is None or run_id is None:
            return None
        # Workflow IDs contain '/', which the UI expects percent-encoded in its path.
        namespace, workflow_id = quote(workflow["namespace"], safe=""), quote(workflow["id"], safe="")
        return f"{ui.rstrip('/')}/namespaces/{namespace}/workflows/{workflow_id}/{run_id}/history"

    def _record_event(self, ref: MigrationRef, event: EventRecord) -> None:
        created = record_event(
            self._core,
            ref,
            type=event.type,
            reason=event.reason,
            message=event.message,
            key=event.key,
            component=REPORTING_COMPONENT,
            instance=self._settings.reporting_instance,
        )
        if created:
            activity.logger.info("recorded %s Event %s for Migration %s", event.type.value, event.reason, ref)
