"""mirror_status shows the saga's progress in the Migration's status and Events, as kubectl users see them."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.testing import ActivityEnvironment

from activities import kube_calls
from activities.known_versions import KnownVersion, KnownVersions
from activities.progress_status import FIELD_MANAGER as PROGRESS_FIELD_MANAGER
from activities.progress_status import ProgressWriter
from activities.settings import KubeActivitySettings
from activities.status import StatusActivities
from ferry.api.migration import (
    GROUP,
    PLURAL,
    VERSION,
    Condition,
    ConditionStatus,
    EventType,
    MigrationStatus,
    Phase,
    ProgressStatus,
    StepName,
    StepState,
    StepStatus,
    WorkflowRef,
)
from ferry.api.saga import EventRecord, MigrationRef, MirrorStatusInput, MirrorStatusResult, workflow_id
from tests import samples
from tests.activities.conftest import MIGRATION, UI_URL
from tests.cluster import eventually
from tests.conftest import Kubectl
from worker import runner
from worker.settings import WorkerSettings

STARTED = datetime(2026, 1, 5, 9, 30, tzinfo=UTC)
ACKNOWLEDGED = {"acknowledged": {"ferry.dev/approve": "approved-by-alice"}}
TEST_RUN = "test-run"
"""The run ID the ActivityEnvironment gives every activity it runs: a status write answers with the run it wrote for."""


def _apply(kubectl: Kubectl, namespace: str) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(samples.migration(MIGRATION)))


@pytest.fixture
def migration(kubectl: Kubectl, migration_crd: str, namespace: str) -> MigrationRef:
    """The Migration orders-db-to-16, as kubectl applies it."""
    _apply(kubectl, namespace)
    uid = kubectl("get", "migration", MIGRATION, "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout
    return MigrationRef(namespace=namespace, name=MIGRATION, uid=uid)


@pytest.fixture
def status_activities(kube_api: k8s.ApiClient, settings: KubeActivitySettings) -> StatusActivities:
    return StatusActivities(kube_api, settings)


def _running(ref: MigrationRef, step: StepName = StepName.PROVISION, attempts: int = 1) -> MigrationStatus:
    return MigrationStatus(
        phase=Phase.RUNNING,
        current_step=step,
        message=f"{step.value}: running (attempt {attempts})",
        steps=[StepStatus(name=step, state=StepState.RUNNING, attempts=attempts, started_at=STARTED)],
        conditions=[
            Condition(
                type="Ready",
                status=ConditionStatus.FALSE,
                reason="Provisioning",
                message="waiting for orders-db-16",
                last_transition_time=STARTED,
            )
        ],
        workflow=WorkflowRef(namespace="default", id=workflow_id(ref), run_id="run-1"),
    )


def _status(kubectl: Kubectl, ref: MigrationRef) -> dict[str, Any]:
    stored = json.loads(kubectl("get", "migration", ref.name, "-n", ref.namespace, "-o", "json").stdout)
    status: dict[str, Any] = stored.get("status", {})
    return status


def _acknowledge_a_control(kubectl: Kubectl, ref: MigrationRef) -> None:
    """What the watcher does: record in status.controls that it acted on a control."""
    patch = json.dumps({"status": {"controls": ACKNOWLEDGED}})
    kubectl(
        "patch",
        "migration",
        ref.name,
        "-n",
        ref.namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        patch,
        "--field-manager=ferry-watcher",
    )


def _events(kubectl: Kubectl, ref: MigrationRef) -> list[dict[str, Any]]:
    listed = kubectl(
        "get", "events", "-n", ref.namespace, f"--field-selector=involvedObject.name={ref.name}", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(listed.stdout)["items"]
    return items


def test_mirror_status_writes_what_kubectl_shows_and_keeps_the_watchers_controls(
    kubectl: Kubectl, activity_env: ActivityEnvironment, status_activities: StatusActivities, migration: MigrationRef
) -> None:
    _acknowledge_a_control(kubectl, migration)

    result = activity_env.run(
        status_activities.mirror_status, MirrorStatusInput(ref=migration, status=_running(migration))
    )

    assert result == MirrorStatusResult(found=True, conflicts=0, run_id=TEST_RUN)
    status = _status(kubectl, migration)
    assert status["phase"] == "Running"
    assert status["currentStep"] == "provision"
    assert status["steps"] == [
        {"name": "provision", "state": "Running", "attempts": 1, "undoAttempts": 0, "startedAt": "2026-01-05T09:30:00Z"}
    ]
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [("Ready", "False", "Provisioning")]
    assert status["controls"] == ACKNOWLEDGED
    workflow_path = f"migration%2F{migration.namespace}%2F{MIGRATION}%2F{migration.uid}"
    assert status["workflow"]["url"] == f"{UI_URL}/namespaces/default/workflows/{workflow_path}/run-1/history"
    row = kubectl("get", "migration", MIGRATION, "-n", migration.namespace, "--no-headers").stdout.split()
    assert row[1:3] == ["Running", "provision"]


def test_mirror_status_records_an_event_once_even_when_run_twice(
    kubectl: Kubectl, activity_env: ActivityEnvironment, status_activities: StatusActivities, migration: MigrationRef
) -> None:
    event = EventRecord(type=EventType.NORMAL, reason="StepStarted", message="provision started", key="provision/1")
    mirror = MirrorStatusInput(ref=migration, status=_running(migration), event=event)

    activity_env.run(status_activities.mirror_status, mirror)
    activity_env.run(status_activities.mirror_status, mirror)

    events = _events(kubectl, migration)
    assert [(e["type"], e["reason"], e["message"], e["count"]) for e in events] == [
        ("Normal", "StepStarted", "provision started", 1)
    ]
    assert events[0]["involvedObject"]["uid"] == migration.uid
    assert events[0]["source"] == {"component": "ferry"}
    assert (events[0]["reportingComponent"], events[0]["reportingInstance"]) == ("ferry.dev/saga", "test-worker")


def test_mirror_status_of_a_missing_migration_writes_nothing(
    kubectl: Kubectl, activity_env: ActivityEnvironment, status_activities: StatusActivities, migration: MigrationRef
) -> None:
    event = EventRecord(type=EventType.WARNING, reason="StepFailed", message="provision failed", key="provision/1")
    gone = migration.model_copy(update={"name": "deleted-meanwhile"})
    recreated = migration.model_copy(update={"uid": "uid-of-an-earlier-object"})

    for ref in (gone, recreated):
        result = activity_env.run(
            status_activities.mirror_status, MirrorStatusInput(ref=ref, status=_running(ref), event=event)
        )

        assert result == MirrorStatusResult(found=False)
    assert _status(kubectl, migration) == {}, "a Migration re-created under the same name is another one"
    assert _events(kubectl, migration) == []


def test_the_saga_and_the_watcher_each_keep_their_own_status_fields(
    kubectl: Kubectl, activity_env: ActivityEnvironment, status_activities: StatusActivities, migration: MigrationRef
) -> None:
    activity_env.run(status_activities.mirror_status, MirrorStatusInput(ref=migration, status=_running(migration)))
    _acknowledge_a_control(kubectl, migration)
    finished = _running(migration).model_copy(update={"phase": Phase.SUCCEEDED, "current_step": None})

    activity_env.run(status_activities.mirror_status, MirrorStatusInput(ref=migration, status=finished))

    status = _status(kubectl, migration)
    assert status["controls"] == ACKNOWLEDGED, "the watcher's write between two mirrors is kept"
    assert status["phase"] == "Succeeded"
    assert "currentStep" not in status, "a field the saga no longer sets is gone"
    stored = json.loads(
        kubectl(
            "get", "migration", migration.name, "-n", migration.namespace, "-o", "json", "--show-managed-fields"
        ).stdout
    )
    owners = {entry["manager"] for entry in stored["metadata"]["managedFields"] if entry.get("subresource") == "status"}
    assert {"ferry-saga", "ferry-watcher"} <= owners


class WriteBetweenReadAndWrite(StatusActivities):
    """After its first read of the Migration, the watcher acknowledges a control: a real write to the API server.

    This injects timing, not a fake: the activity's own apply then carries a stale
    resourceVersion, and the 409 Conflict it gets comes from the real API server.
    """

    def __init__(self, kube_api: k8s.ApiClient, settings: KubeActivitySettings, kubectl: Kubectl) -> None:
        super().__init__(kube_api, settings)
        self._kubectl = kubectl
        self.interfered = False

    def _read(self, ref: MigrationRef) -> dict[str, Any] | None:
        migration = super()._read(ref)
        if not self.interfered:
            self.interfered = True
            _acknowledge_a_control(self._kubectl, ref)
        return migration


def test_a_status_write_survives_a_conflicting_write_between_its_read_and_its_write(
    kubectl: Kubectl,
    kube_api: k8s.ApiClient,
    settings: KubeActivitySettings,
    activity_env: ActivityEnvironment,
    migration: MigrationRef,
) -> None:
    racing = WriteBetweenReadAndWrite(kube_api, settings, kubectl)

    result = activity_env.run(racing.mirror_status, MirrorStatusInput(ref=migration, status=_running(migration)))

    assert result.found
    assert result.conflicts >= 1
    status = _status(kubectl, migration)
    assert status["controls"] == ACKNOWLEDGED, "the conflicting write is kept"
    assert status["phase"] == "Running", "and so is the mirrored status"


class CountingReads(StatusActivities):
    """StatusActivities that counts its reads of the Migration (the API server answers them as usual)."""

    def __init__(self, kube_api: k8s.ApiClient, settings: KubeActivitySettings, versions: KnownVersions) -> None:
        super().__init__(kube_api, settings, versions=versions)
        self.reads = 0

    def _read(self, ref: MigrationRef) -> dict[str, Any] | None:
        self.reads += 1
        return super()._read(ref)


class CountingProgressReads(ProgressWriter):
    """The progress writer of a data step, counting its reads of the Migration likewise."""

    def __init__(self, kube_api: k8s.ApiClient, ref: MigrationRef, step: StepName, versions: KnownVersions) -> None:
        super().__init__(kube_api, ref, step.value, interval=0.05, versions=versions)
        self.reads = 0

    def _read(self) -> KnownVersion:
        self.reads += 1
        return super()._read()


@pytest.fixture
def versions() -> KnownVersions:
    """The worker's one cache of the versions its status writes produced, which both its status writers share."""
    return KnownVersions()


@pytest.fixture
def counting(kube_api: k8s.ApiClient, settings: KubeActivitySettings, versions: KnownVersions) -> CountingReads:
    return CountingReads(kube_api, settings, versions)


@pytest.fixture
def mirrored_once(activity_env: ActivityEnvironment, counting: CountingReads, migration: MigrationRef) -> None:
    """The saga's first write of the Migration, through `counting`: its snapshot step running, in a second attempt
    (so that progress shows the saga's attempt, not a default). That first write reads the Migration once."""
    running = _running(migration, StepName.SNAPSHOT, attempts=2)
    result = activity_env.run(counting.mirror_status, MirrorStatusInput(ref=migration, status=running))
    assert result == MirrorStatusResult(found=True, conflicts=0, run_id=TEST_RUN)
    assert counting.reads == 1, "the first write of the Migration reads it"


def _succeeded(ref: MigrationRef) -> MigrationStatus:
    return _running(ref).model_copy(update={"phase": Phase.SUCCEEDED, "current_step": None, "message": "done"})


def _re_create(kubectl: Kubectl, ref: MigrationRef) -> None:
    """Deletes the Migration and applies it again under the same name: another object, with another uid."""
    kubectl("delete", "migration", ref.name, "-n", ref.namespace, "--wait=true")
    _apply(kubectl, ref.namespace)


def _show_progress(
    kubectl: Kubectl, kube_api: k8s.ApiClient, ref: MigrationRef, versions: KnownVersions
) -> tuple[CountingProgressReads, dict[str, Any]]:
    """A snapshot's progress writer, as the worker's data activities make it: it writes the step's progress (the status
    that shows it is returned), then removes it as the step ends."""
    with CountingProgressReads(kube_api, ref, StepName.SNAPSHOT, versions) as writer:
        writer.update(bytes_done=3 * 2**20)
        eventually("the progress to be written", lambda: writer.writes >= 1, timeout=30)
        shown = _status(kubectl, ref)
    assert writer.writes >= 2, "the progress, then its removal"
    assert not writer.gone
    return writer, shown


def test_a_transition_after_the_workers_own_write_costs_one_request_not_a_read_and_a_write(
    kubectl: Kubectl,
    activity_env: ActivityEnvironment,
    counting: CountingReads,
    migration: MigrationRef,
    mirrored_once: None,
) -> None:
    result = activity_env.run(counting.mirror_status, MirrorStatusInput(ref=migration, status=_succeeded(migration)))

    assert result == MirrorStatusResult(found=True, conflicts=0, run_id=TEST_RUN)
    assert counting.reads == 1, "the second write carries the version the first one produced"
    assert _status(kubectl, migration)["phase"] == "Succeeded"


def test_a_write_by_the_watcher_between_two_transitions_is_kept_and_the_second_transition_lands(
    kubectl: Kubectl,
    activity_env: ActivityEnvironment,
    counting: CountingReads,
    migration: MigrationRef,
    mirrored_once: None,
) -> None:
    _acknowledge_a_control(kubectl, migration)
    result = activity_env.run(counting.mirror_status, MirrorStatusInput(ref=migration, status=_succeeded(migration)))

    assert result == MirrorStatusResult(found=True, conflicts=1, run_id=TEST_RUN), (
        "the version it knew was stale: a 409, then a read"
    )
    assert counting.reads == 2
    status = _status(kubectl, migration)
    assert (status["phase"], status["controls"]) == ("Succeeded", ACKNOWLEDGED)


def test_a_transition_after_the_workers_progress_write_costs_one_request_not_a_conflict_a_read_and_a_write(
    kubectl: Kubectl,
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    counting: CountingReads,
    versions: KnownVersions,
    migration: MigrationRef,
    mirrored_once: None,
) -> None:
    activity_env.run(lambda: _show_progress(kubectl, kube_api, migration, versions))
    result = activity_env.run(counting.mirror_status, MirrorStatusInput(ref=migration, status=_succeeded(migration)))

    assert result == MirrorStatusResult(found=True, conflicts=0, run_id=TEST_RUN), (
        "it writes on the version the progress left"
    )
    assert counting.reads == 1
    status = _status(kubectl, migration)
    assert status["phase"] == "Succeeded"
    assert "progress" not in status


def test_progress_written_after_a_transition_costs_one_request_and_says_the_sagas_attempt(
    kubectl: Kubectl,
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    counting: CountingReads,
    versions: KnownVersions,
    migration: MigrationRef,
    mirrored_once: None,
) -> None:
    writer, shown = activity_env.run(lambda: _show_progress(kubectl, kube_api, migration, versions))

    assert writer.reads == 0, "the progress and its removal each carry the version the write before produced"
    assert (shown["progress"]["step"], shown["progress"]["attempt"]) == ("snapshot", 2), "mirrored_once's attempt"
    assert shown["phase"] == "Running", "the saga's fields are untouched"
    assert "progress" not in _status(kubectl, migration)


def test_progress_after_a_write_by_the_watcher_reads_again_and_keeps_it(
    kubectl: Kubectl,
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    counting: CountingReads,
    versions: KnownVersions,
    migration: MigrationRef,
    mirrored_once: None,
) -> None:
    _acknowledge_a_control(kubectl, migration)

    writer, shown = activity_env.run(lambda: _show_progress(kubectl, kube_api, migration, versions))

    assert writer.reads == 1, "the version it knew was stale: a 409, then a read; the removal needs none"
    assert (shown["progress"]["attempt"], shown["controls"]) == (2, ACKNOWLEDGED)
    assert _status(kubectl, migration)["controls"] == ACKNOWLEDGED


def test_the_worker_gives_its_saga_status_and_progress_writers_one_cache_of_versions() -> None:
    bound = {activity.__name__: activity for activity in runner.activities(k8s.ApiClient(), WorkerSettings())}

    writers = [getattr(bound[name], "__self__", None) for name in ("mirror_status", "snapshot", "migrate", "verify")]

    shared = [getattr(writer, "_versions", None) for writer in writers]
    assert isinstance(shared[0], KnownVersions)
    assert all(versions is shared[0] for versions in shared)


def test_a_migration_re_created_under_the_same_name_after_a_write_gets_no_progress_of_the_first(
    kubectl: Kubectl,
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    counting: CountingReads,
    versions: KnownVersions,
    migration: MigrationRef,
    mirrored_once: None,
) -> None:
    _re_create(kubectl, migration)
    before = json.loads(kubectl("get", "migration", MIGRATION, "-n", migration.namespace, "-o", "json").stdout)

    def write_for_the_first() -> CountingProgressReads:
        with CountingProgressReads(kube_api, migration, StepName.SNAPSHOT, versions) as writer:
            writer.update(bytes_done=2**20)
            eventually("the writer to see another uid", lambda: writer.gone, timeout=30)
        return writer

    writer = activity_env.run(write_for_the_first)

    assert (writer.writes, writer.reads) == (0, 1), "the version it knew was the first one's: a 409, then a read"
    after = json.loads(kubectl("get", "migration", MIGRATION, "-n", migration.namespace, "-o", "json").stdout)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], "not written at all"


def test_a_migration_re_created_under_the_same_name_after_a_write_is_left_alone(
    kubectl: Kubectl,
    activity_env: ActivityEnvironment,
    counting: CountingReads,
    migration: MigrationRef,
    mirrored_once: None,
) -> None:
    _re_create(kubectl, migration)

    result = activity_env.run(counting.mirror_status, MirrorStatusInput(ref=migration, status=_succeeded(migration)))

    assert result.found is False
    assert _status(kubectl, migration) == {}, "the new object (another uid) gets nothing of the earlier one's run"


# --- a late write never goes back ------------------------------------------------------------------------------------


RUNNING_AT = datetime(2026, 1, 5, 9, 31, tzinfo=UTC)
SUCCEEDED_AT = datetime(2026, 1, 5, 9, 45, tzinfo=UTC)


@pytest.mark.parametrize("writer", ["the same worker", "another worker"])
def test_a_late_write_of_an_earlier_transition_leaves_the_later_one(
    kubectl: Kubectl,
    kube_api: k8s.ApiClient,
    settings: KubeActivitySettings,
    activity_env: ActivityEnvironment,
    status_activities: StatusActivities,
    migration: MigrationRef,
    writer: str,
) -> None:
    """An attempt held up (a slow API server) while the saga went on, or a remote attempt of an older run, comes last:
    its Running must not replace the Succeeded written since. Its Event is still recorded: the transition happened."""
    succeeded = _succeeded(migration).model_copy(update={"transitioned_at": SUCCEEDED_AT})
    running = _running(migration).model_copy(update={"transitioned_at": RUNNING_AT})
    late = status_activities if writer == "the same worker" else StatusActivities(kube_api, settings)
    started = EventRecord(type=EventType.NORMAL, reason="StepStarted", message="provision started", key="1.late")
    activity_env.run(status_activities.mirror_status, MirrorStatusInput(ref=migration, status=succeeded))

    result = activity_env.run(late.mirror_status, MirrorStatusInput(ref=migration, status=running, event=started))

    assert result.found
    status = _status(kubectl, migration)
    assert (status["phase"], status["transitionedAt"]) == ("Succeeded", "2026-01-05T09:45:00Z")
    assert [event["reason"] for event in _events(kubectl, migration)] == ["StepStarted"]


def test_a_write_of_the_transition_shown_or_a_later_one_lands(
    kubectl: Kubectl, activity_env: ActivityEnvironment, status_activities: StatusActivities, migration: MigrationRef
) -> None:
    """Equal times are the same transition (a step's start, then its end, within one phase): each write lands."""
    running = _running(migration).model_copy(update={"transitioned_at": RUNNING_AT})
    activity_env.run(status_activities.mirror_status, MirrorStatusInput(ref=migration, status=running))
    ended = running.model_copy(
        update={"steps": [StepStatus(name=StepName.PROVISION, state=StepState.SUCCEEDED, attempts=1)]}
    )

    activity_env.run(status_activities.mirror_status, MirrorStatusInput(ref=migration, status=ended))
    assert _status(kubectl, migration)["steps"][0]["state"] == "Succeeded"

    succeeded = _succeeded(migration).model_copy(update={"transitioned_at": SUCCEEDED_AT})
    activity_env.run(status_activities.mirror_status, MirrorStatusInput(ref=migration, status=succeeded))
    assert _status(kubectl, migration)["phase"] == "Succeeded"


# --- progress left over by a killed step --------------------------------------------------------------------------


def _leave_progress(kube_api: k8s.ApiClient, ref: MigrationRef, step: StepName) -> None:
    """What a data activity killed mid-step (SIGKILL, OOM) leaves: its progress writer's last write, never removed."""
    progress = ProgressStatus(step=step.value, bytes_done=2**20, updated_at=STARTED, summary=f"{step.value}: 1 MiB")
    custom = k8s.CustomObjectsApi(kube_api)
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, ref.namespace, PLURAL, ref.name)
    shown = {"progress": progress.model_dump(mode="json", by_alias=True, exclude_none=True)}
    applied = kube_calls.migration_status_apply(ref, stored["metadata"]["resourceVersion"], shown)
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ref.namespace, PLURAL, ref.name, applied, field_manager=PROGRESS_FIELD_MANAGER, force=True,
        _content_type=kube_calls.APPLY_PATCH,
    )  # fmt: skip


LEFT_OVER = {
    "rolled back": (Phase.ROLLED_BACK, None),
    "failed": (Phase.FAILED, None),
    "succeeded": (Phase.SUCCEEDED, None),
    "on to the next step": (Phase.RUNNING, StepName.VERIFY),
    "paused before the next step": (Phase.PAUSED, StepName.VERIFY),
}


@pytest.mark.parametrize("case", LEFT_OVER, ids=list(LEFT_OVER))
def test_progress_left_by_a_killed_step_goes_once_the_saga_moved_on(
    kubectl: Kubectl,
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    status_activities: StatusActivities,
    migration: MigrationRef,
    case: str,
) -> None:
    """Else the Progress column says `migrate: ... ~21s left` of a RolledBack Migration for ever."""
    phase, step = LEFT_OVER[case]
    activity_env.run(
        status_activities.mirror_status, MirrorStatusInput(ref=migration, status=_running(migration, StepName.MIGRATE))
    )
    _leave_progress(kube_api, migration, StepName.MIGRATE)
    moved_on = _running(migration).model_copy(update={"phase": phase, "current_step": step})

    activity_env.run(status_activities.mirror_status, MirrorStatusInput(ref=migration, status=moved_on))

    status = _status(kubectl, migration)
    assert status["phase"] == phase.value
    assert "progress" not in status


def test_progress_of_the_step_running_stays_whatever_the_saga_writes(
    kubectl: Kubectl,
    kube_api: k8s.ApiClient,
    activity_env: ActivityEnvironment,
    status_activities: StatusActivities,
    migration: MigrationRef,
) -> None:
    """A step's next attempt replaces its progress; a write of that step's retry must not take it away meanwhile."""
    activity_env.run(
        status_activities.mirror_status, MirrorStatusInput(ref=migration, status=_running(migration, StepName.MIGRATE))
    )
    _leave_progress(kube_api, migration, StepName.MIGRATE)
    retrying = _running(migration, StepName.MIGRATE, attempts=2)

    activity_env.run(status_activities.mirror_status, MirrorStatusInput(ref=migration, status=retrying))

    status = _status(kubectl, migration)
    assert (status["progress"]["step"], status["steps"][0]["attempts"]) == ("migrate", 2)
