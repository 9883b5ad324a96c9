"""Mirrors the saga's progress into the Migration's status, and records its Events, for kubectl users.

The status has three owners, kept apart by the API server rather than by ferry's care:
the saga writes its fields with server-side apply as field manager `ferry-saga`, the
watcher writes its own (status.controls, status.deletion) as `ferry-watcher`, and the
running data activity its status.progress as `ferry-progress` (activities/progress_status.py). An
apply sets exactly the fields it carries and removes those it carried before and no
longer does, so no owner ever copies, or overwrites, another's fields. (The API server
stamps each owner's entry in managedFields with the time of its last change, by its own
clock: the watcher reads `ferry-saga`'s to tell a success written before a deletion,
`Migration.success_timing`, so only the saga writes as `ferry-saga`.) The
apply is conditional on a resourceVersion known to be this Migration's (its uid): the
one this worker's previous write of it produced, or else a fresh read's. The progress
writer of the same worker shares that knowledge (activities/known_versions.py), so its
writes cost a transition nothing; a write by another (the watcher's, another worker's)
makes the apply a 409, and the activity reads again; a Migration re-created under the
same name is another object, left alone. So a transition usually costs one request, not
a read and a write.
Events get names derived from the transition they record, so a retried activity finds
its Event already there instead of recording it twice (see activities/events.py).

A write also removes status.progress when it is left over: a data activity killed
(SIGKILL, OOM) before its progress writer removed it leaves it, and once the saga has
moved on, to another step or to a final phase, no attempt of that step comes to replace
it (see `_leftover_progress`).

A write is never older than what it replaces (see `_older_than_shown`): the resourceVersion
fences only the object, and a write that lost a 409 is tried again on a fresh read, so a
late attempt (one held up by a slow API server while the saga went on, or a remote attempt
of an older run) would otherwise put an earlier phase back over a later one.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from activities import kube_calls
from activities.api_refusals import server_message
from activities.events import Recorded, record_event
from activities.known_versions import KnownVersion, KnownVersions
from activities.progress_status import FIELD_MANAGER as PROGRESS_FIELD_MANAGER
from activities.settings import KubeActivitySettings
from ferry.api.migration import (
    ACTIVITY_STATUS_FIELDS,
    GROUP,
    PLURAL,
    SAGA_FIELD_MANAGER,
    VERSION,
    WATCHER_STATUS_FIELDS,
    MigrationStatus,
    Phase,
)
from ferry.api.saga import EventRecord, KubeActivity, MigrationRef, MirrorStatusInput, MirrorStatusResult
from ferry.api.scrubbing import scrub
from ferry.observability import metrics

REPORTING_COMPONENT = "ferry.dev/saga"


class StatusActivities:
    """The activity that writes the workflow's view of a Migration into the Migration itself."""

    def __init__(
        self, api_client: k8s.ApiClient, settings: KubeActivitySettings, *, versions: KnownVersions | None = None
    ) -> None:
        """`versions` is the worker's one cache of the versions its status writes produced, shared with the progress
        writer (see PostgresActivities); without it, the activity keeps one of its own."""
        self._custom = k8s.CustomObjectsApi(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._settings = settings
        self._versions = versions if versions is not None else KnownVersions()

    @activity.defn(name=KubeActivity.MIRROR_STATUS.value)
    def mirror_status(self, input: MirrorStatusInput) -> MirrorStatusResult:
        """Applies the given status to the Migration (the watcher's fields stay as they are), then records the Event.

        Idempotent: the same input applies the same status (a no-op the second time), and
        each Event (the transition's, and those of earlier transitions whose writes this one
        replaces) has a name derived from the Migration's UID and the event's key, so a second
        run finds it and records nothing. A Migration that is gone, or was re-created under the
        same name (another UID), is left alone: found=False.
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
        self._remove_leftover_progress(ref)
        for event in [*input.earlier_events, *([input.event] if input.event is not None else [])]:
            self._record_event(ref, event)
        return MirrorStatusResult(found=True, conflicts=conflicts, run_id=activity.info().workflow_run_id)

    def _read(self, ref: MigrationRef) -> dict[str, Any] | None:
        """One read of the Migration, None when it is gone. Kept apart so tests can add a write after it."""
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
        """Applies the saga's status fields; False when the Migration is not (or no longer) this one.

        The apply carries a resourceVersion of the object with the Migration's uid (the
        worker's last write's, this activity's or the progress writer's, else a read's), so
        it lands on that very object: after another write in between the API server answers
        409, and the caller tries again from a read.
        """
        known = self._known(ref)
        if known is None:
            return False
        if _older_than_shown(status, known):
            activity.logger.info(
                "Migration %s shows a later transition (%s) than this write's (%s): not written",
                ref,
                known.transitioned_at,
                status.transitioned_at,
            )
            return True
        resource_version = known.resource_version
        wanted: dict[str, Any] = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        for field in (*WATCHER_STATUS_FIELDS, *ACTIVITY_STATUS_FIELDS):
            wanted.pop(field, None)
        workflow = wanted.get("workflow")
        if workflow is not None and "url" not in workflow:
            url = self._workflow_url(workflow)
            if url is not None:
                workflow["url"] = url
        applied = kube_calls.migration_status_apply(ref, resource_version, wanted)
        return self._apply(ref, resource_version, applied, SAGA_FIELD_MANAGER)

    def _known(self, ref: MigrationRef) -> KnownVersion | None:
        """The Migration's version this worker last wrote or read, else a read's; None when it is gone or another."""
        known = self._versions.get(ref.uid)
        if known is not None:
            return known
        migration = self._read(ref)
        if migration is None or migration["metadata"].get("uid") != ref.uid:
            return None
        return KnownVersion.of(migration)

    def _apply(self, ref: MigrationRef, resource_version: str, applied: dict[str, Any], manager: str) -> bool:
        """Applies `applied` (conditional on `resource_version`) to the status as `manager`; False when the Migration
        is gone. The version it wrote is remembered."""
        try:
            written: dict[str, Any] = self._custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, ref.namespace, PLURAL, ref.name, applied, field_manager=manager, force=True,
                _content_type=kube_calls.APPLY_PATCH,
            )  # fmt: skip
        except Exception as error:
            # It may have landed all the same (a timeout): the version it carried, then stale, would cost a 409 and a
            # read, to this activity or to the progress writer; forgotten, it costs the read alone.
            self._versions.forget(ref.uid, resource_version)
            if isinstance(error, ApiException) and kube_calls.is_not_found(error):
                return False
            raise
        self._versions.remember(written)
        return True

    def _remove_leftover_progress(self, ref: MigrationRef) -> None:
        """Removes status.progress when it is left over from a step no longer running; nothing else otherwise.

        The removal is the progress writer's own (activities/progress_status.py): an apply of no field as
        `ferry-progress`, which owns status.progress, conditional on the version that showed it left over (this
        write's, else a read's). A progress written since costs a 409 and a read, which decides again. It is a
        courtesy, like the progress: a failure is logged and the status write stands.
        """

        def remove() -> None:
            known = self._known(ref)
            if known is None or not _leftover_progress(known):
                return
            applied = kube_calls.migration_status_apply(ref, known.resource_version, None)
            if self._apply(ref, known.resource_version, applied, PROGRESS_FIELD_MANAGER):
                activity.logger.info("removed the progress of %s left over in Migration %s", known.progress_step, ref)

        try:
            kube_calls.retry_on_conflict(remove)
        except Exception as error:  # noqa: BLE001 - a leftover progress must not fail the status write
            said = server_message(error) if isinstance(error, ApiException) else scrub(str(error))
            activity.logger.warning("could not remove the progress left over in Migration %s: %s", ref, said)

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
        if created is Recorded.NEW:
            activity.logger.info("recorded %s Event %s for Migration %s", event.type.value, event.reason, ref)


def _older_than_shown(status: MigrationStatus, shown: KnownVersion) -> bool:
    """Whether `status` is of a transition older than the one the Migration shows, so that writing it would go back.

    The saga stamps each phase transition with transitionedAt, by the workflow's clock
    (workflow.now(), the start of the workflow task: the same for every transition of one
    task, later for every later task, and later for a later run of the same Migration, as
    the undo's). So a stored transitionedAt strictly later than the write's is a later
    transition, whichever run or worker wrote it: the write is skipped. Equal times decide
    nothing, and the write goes ahead: they are the same transition (a write of a step's
    start or end, an Event, within one phase, which carries the phase's time) or
    transitions of one workflow task, which the saga writes as one. A missing time (a run
    of version 1, or an undo before its first transition) decides nothing either.

    Within one phase this cannot tell a late write from a new one: the saga stamps
    nothing finer (a per-run sequence of its writes would).
    """
    if status.transitioned_at is None or shown.transitioned_at is None:
        return False
    try:
        stored = datetime.fromisoformat(shown.transitioned_at)
    except ValueError:
        return False  # not the saga's (written by hand): it orders nothing
    return _aware(stored) > _aware(status.transitioned_at)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _leftover_progress(shown: KnownVersion) -> bool:
    """Whether status.progress names a step that no longer runs: the phase is final, or the saga's current step is
    another (the next one, or one it waits before). Its own step's next attempt replaces it instead, so progress of
    the current step stays, whatever its attempt."""
    if shown.progress_step is None:
        return False
    finished = shown.phase is not None and shown.phase in {phase.value for phase in Phase if phase.finished}
    return finished or shown.progress_step != shown.current_step
