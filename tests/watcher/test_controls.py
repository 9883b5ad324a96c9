"""kubectl controls and outside actions show up in the Migration, as a kubectl user sees it."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

from temporalio.client import Client

from devstack.stack.install import Binaries
from devstack.stack.stack import StackInfo
from ferry.api.migration import FINALIZER
from ferry.api.saga import workflow_id
from tests.conftest import Kubectl
from tests.end_to_end import apply_migration, eventually, migration_manifest
from watcher.settings import WatcherSettings
from worker.settings import WorkerSettings

HOLD = "example.com/hold"
"""Another controller's finalizer."""


async def _get(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    result = await asyncio.to_thread(kubectl, "get", "migration", name, "-n", namespace, "-o", "json")
    migration: dict[str, Any] = json.loads(result.stdout)
    return migration


async def _phase_is(kubectl: Kubectl, namespace: str, name: str, phase: str) -> bool:
    return ((await _get(kubectl, namespace, name)).get("status") or {}).get("phase") == phase


async def _events(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    result = await asyncio.to_thread(
        kubectl, "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(result.stdout)["items"]
    return items


async def _annotate(kubectl: Kubectl, namespace: str, name: str, annotation: str, by: str) -> None:
    """Annotates as the user `by`, a cluster admin: the API server takes a control only from its signer
    (deploy/admission), and these tests are about the watcher, not about who may steer."""
    await asyncio.to_thread(
        kubectl, f"--as={by}", "--as-group=system:masters", "annotate", "--overwrite", "migration", name,
        "-n", namespace, annotation,
    )  # fmt: skip


async def test_bad_control_values_give_a_warning_and_a_valid_rollback_then_rolls_back(
    kubectl: Kubectl, migration_crd: str, namespace: str, stack: StackInfo,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, "snapshots", paused=True))
    await eventually("the Paused phase", lambda: _phase_is(kubectl, namespace, ref.name, "Paused"))

    # The reason is longer than the watcher keeps (a bad name never gets past the API server).
    too_long = "alice: " + "x" * 257
    await _annotate(kubectl, namespace, ref.name, f"ferry.dev/rollback={too_long}", by="alice")
    await _annotate(kubectl, namespace, ref.name, "ferry.dev/rolback=alice", by="alice")

    async def two_warnings() -> bool:
        reasons = [e["reason"] for e in await _events(kubectl, namespace, ref.name) if e["type"] == "Warning"]
        return reasons.count("InvalidControl") == 2

    await eventually("two InvalidControl warnings", two_warnings)
    warnings = [e["message"] for e in await _events(kubectl, namespace, ref.name) if e["reason"] == "InvalidControl"]
    assert any(f"ferry.dev/rollback={too_long!r} is not valid" in message for message in warnings)
    assert any("ferry.dev/rolback is not a control ferry knows" in message for message in warnings)
    assert (await _get(kubectl, namespace, ref.name))["status"]["phase"] == "Paused"

    await _annotate(kubectl, namespace, ref.name, "ferry.dev/rollback=alice: wrong target", by="alice")

    await eventually("the RolledBack phase", lambda: _phase_is(kubectl, namespace, ref.name, "RolledBack"))
    # The watcher records the control after the saga took it; with nothing to undo, the saga may finish first.
    await eventually(
        "the rollback to be acknowledged",
        lambda: _acknowledged(kubectl, namespace, ref.name, "ferry.dev/rollback", "alice: wrong target"),
    )
    status = (await _get(kubectl, namespace, ref.name))["status"]
    assert status["message"] == "rolled back: rollback requested by alice: wrong target"
    accepted = [e["message"] for e in await _events(kubectl, namespace, ref.name) if e["reason"] == "ControlAccepted"]
    assert accepted == [
        "ferry.dev/rollback: rolling back by alice: the running step is stopped and the started steps undone"
    ]
    assert status["controls"]["message"] == accepted[0].removeprefix("ferry.dev/rollback: ")


async def test_a_control_the_saga_cannot_apply_is_recorded_as_refused_with_its_reason(
    kubectl: Kubectl, migration_crd: str, namespace: str, stack: StackInfo,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, "snapshots", paused=True))
    await eventually("the Paused phase", lambda: _phase_is(kubectl, namespace, ref.name, "Paused"))

    await _annotate(kubectl, namespace, ref.name, "ferry.dev/retry=carol", by="carol")

    await eventually(
        "the retry to be acknowledged", lambda: _acknowledged(kubectl, namespace, ref.name, "ferry.dev/retry", "carol")
    )
    status = (await _get(kubectl, namespace, ref.name))["status"]
    assert status["controls"]["message"] == "retry refused: no failed step waits for a decision"
    refused = [e for e in await _events(kubectl, namespace, ref.name) if e["reason"] == "ControlRefused"]
    assert [e["message"] for e in refused] == ["ferry.dev/retry: retry refused: no failed step waits for a decision"]
    assert refused[0]["type"] == "Warning"
    assert status["phase"] == "Paused"


async def test_a_control_is_acted_on_once_even_when_the_watcher_sees_it_again(
    kubectl: Kubectl, migration_crd: str, namespace: str, stack: StackInfo, temporal_client: Client,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    manifest = migration_manifest(stack, "snapshots", paused=True, approval={"required": True})
    ref = apply_migration(kubectl, namespace, manifest)
    await eventually("the Paused phase", lambda: _phase_is(kubectl, namespace, ref.name, "Paused"))

    await _annotate(kubectl, namespace, ref.name, "ferry.dev/approve=bob", by="bob")
    await eventually(
        "the approval to be acknowledged",
        lambda: _acknowledged(kubectl, namespace, ref.name, "ferry.dev/approve", "bob"),
    )
    # Another control makes the watcher handle the Migration again, approve annotation and all.
    await _annotate(kubectl, namespace, ref.name, "ferry.dev/pause=bob", by="bob")
    await eventually(
        "the pause to be acknowledged", lambda: _acknowledged(kubectl, namespace, ref.name, "ferry.dev/pause", "bob")
    )

    history = await temporal_client.get_workflow_handle(workflow_id(ref)).fetch_history()
    approvals = [
        event
        for event in history.events
        if event.HasField("workflow_execution_update_accepted_event_attributes")
        and event.workflow_execution_update_accepted_event_attributes.accepted_request.input.name == "approve"
    ]
    assert len(approvals) == 1


async def test_a_control_taken_off_and_given_again_with_the_same_value_is_a_new_control(
    kubectl: Kubectl, migration_crd: str, namespace: str, stack: StackInfo, temporal_client: Client,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    """`kubectl annotate ... ferry.dev/retry-`, then the same `ferry.dev/retry=carol` again: the second was taken for
    the first, already acknowledged, and nothing was sent or said. Now taking it off is counted in the status, and
    the one given again is sent to the saga and answered."""
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, "snapshots", paused=True))
    await eventually("the Paused phase", lambda: _phase_is(kubectl, namespace, ref.name, "Paused"))
    await _annotate(kubectl, namespace, ref.name, "ferry.dev/retry=carol", by="carol")
    await eventually(
        "the retry to be acknowledged", lambda: _acknowledged(kubectl, namespace, ref.name, "ferry.dev/retry", "carol")
    )

    await _annotate(kubectl, namespace, ref.name, "ferry.dev/retry-", by="carol")

    async def counted() -> bool:
        controls = (await _get(kubectl, namespace, ref.name))["status"]["controls"]
        return controls.get("takenOff") == {"ferry.dev/retry": 1} and "ferry.dev/retry" not in controls["acknowledged"]

    await eventually("the retry taken off to be counted", counted)

    await _annotate(kubectl, namespace, ref.name, "ferry.dev/retry=carol", by="carol")

    async def answered_twice() -> bool:
        refused = [e for e in await _events(kubectl, namespace, ref.name) if e["reason"] == "ControlRefused"]
        return len(refused) == 2

    await eventually("a second ControlRefused", answered_twice)
    refused = [e["message"] for e in await _events(kubectl, namespace, ref.name) if e["reason"] == "ControlRefused"]
    assert refused == ["ferry.dev/retry: retry refused: no failed step waits for a decision"] * 2, "the saga's answer"
    assert await _acknowledged(kubectl, namespace, ref.name, "ferry.dev/retry", "carol")
    history = await temporal_client.get_workflow_handle(workflow_id(ref)).fetch_history()
    asked = {
        event.workflow_execution_update_accepted_event_attributes.accepted_request.meta.update_id
        for event in history.events
        if event.HasField("workflow_execution_update_accepted_event_attributes")
        and event.workflow_execution_update_accepted_event_attributes.accepted_request.input.name == "retry"
    }
    assert asked <= {"ferry.dev/retry=carol", "ferry.dev/retry=carol#1"}
    assert (await _get(kubectl, namespace, ref.name))["status"]["phase"] == "Paused"


async def _acknowledged(kubectl: Kubectl, namespace: str, name: str, key: str, value: str) -> bool:
    controls = ((await _get(kubectl, namespace, name)).get("status") or {}).get("controls") or {}
    return bool(controls.get("acknowledged", {}).get(key) == value)


async def test_a_run_terminated_with_the_temporal_cli_shows_as_abandoned(
    kubectl: Kubectl, migration_crd: str, namespace: str, stack: StackInfo, binaries: Binaries,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, "snapshots", paused=True))
    await eventually("the Paused phase", lambda: _phase_is(kubectl, namespace, ref.name, "Paused"))

    await asyncio.to_thread(
        subprocess.run,
        [
            str(binaries.temporal), "workflow", "terminate", f"--address={stack.temporal_address}",
            f"--workflow-id={workflow_id(ref)}", "--reason=operator gave up",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip

    await eventually("the Abandoned phase", lambda: _phase_is(kubectl, namespace, ref.name, "Abandoned"))
    status = (await _get(kubectl, namespace, ref.name))["status"]
    assert "terminated from outside" in status["message"]
    assert "operator gave up" in status["message"]
    assert "from then on ferry undid nothing more" in status["message"], "it may have undone steps before"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Succeeded"]["status"] == "False"
    assert conditions["Succeeded"]["reason"] == "Abandoned"
    assert "Abandoned" in [e["reason"] for e in await _events(kubectl, namespace, ref.name)]


async def test_setting_spec_paused_to_false_resumes_a_migration_created_paused(
    kubectl: Kubectl, migration_crd: str, namespace: str, stack: StackInfo,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, "snapshots", paused=True))
    await eventually("the Paused phase", lambda: _phase_is(kubectl, namespace, ref.name, "Paused"))

    await asyncio.to_thread(
        kubectl, "patch", "migration", ref.name, "-n", namespace, "--type=merge", "-p", '{"spec":{"paused":false}}'
    )

    # Resumed, provision runs, and fails for good: this namespace has no source StatefulSet.
    await eventually("the RolledBack phase", lambda: _phase_is(kubectl, namespace, ref.name, "RolledBack"))
    status = (await _get(kubectl, namespace, ref.name))["status"]
    assert "spec.source.statefulSet: 'orders-db' does not exist" in status["message"]
    assert status["controls"]["acknowledged"]["spec.paused"] == "false@2"
    assert status["observedGeneration"] == 2


async def test_deleting_a_migration_answers_no_change_of_spec_paused_that_nobody_made(
    kubectl: Kubectl, migration_crd: str, namespace: str, stack: StackInfo,
    running_watcher: WatcherSettings, ferry_worker: WorkerSettings,
) -> None:  # fmt: skip
    """The API server adds one to metadata.generation as it marks a Migration held by finalizers as being deleted,
    spec untouched. The watcher took that for a change of spec.paused, and the deletion refused it: a Warning
    `InvalidControl` ("spec.paused refused: the Migration is being deleted") and the same in status.controls."""
    manifest = migration_manifest(stack, "snapshots", paused=True)
    manifest["metadata"]["finalizers"] = [HOLD]  # keeps the object readable once ferry has let it go
    ref = apply_migration(kubectl, namespace, manifest)
    await eventually("the Paused phase", lambda: _phase_is(kubectl, namespace, ref.name, "Paused"))

    async def held() -> bool:
        return FINALIZER in (await _get(kubectl, namespace, ref.name))["metadata"].get("finalizers", [])

    await eventually("ferry's finalizer", held)
    before = await _get(kubectl, namespace, ref.name)
    assert before["status"]["observedGeneration"] == before["metadata"]["generation"]

    await asyncio.to_thread(kubectl, "delete", "migration", ref.name, "-n", namespace, "--wait=false")

    async def let_go() -> bool:
        return not await held()

    await eventually("ferry to roll the run back and let the Migration go", let_go, within=120)
    after = await _get(kubectl, namespace, ref.name)
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1, "the deletion's step"
    assert after["spec"] == before["spec"]
    assert after["status"]["phase"] == "RolledBack"
    answered = after["status"].get("controls") or {}
    assert "spec.paused" not in answered.get("acknowledged", {}), answered
    assert "spec.paused" not in (answered.get("message") or ""), answered
    reasons = [event["reason"] for event in await _events(kubectl, namespace, ref.name)]
    assert "InvalidControl" not in reasons
    assert "WaitingBeforeDeletion" in reasons, "the deletion's pass ran"
