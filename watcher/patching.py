"""The watcher's writes to Migrations: its finalizer, its annotation, the status fields it owns, its Events.

Finalizer changes are merge patches carrying the resourceVersion they were computed
from, retried from a fresh read on a conflict, so no other finalizer is ever lost. A new
Migration costs one write: its finalizer and the annotation naming its workflow go
together, after the start (a burst of creates waits on the API server's writes); none
when the API server set the finalizer as it created the Migration (watcher/handling.py). The
watcher's status fields (controls, deletion) are merge-patched alone, which leaves the
saga's fields as they are, at the resourceVersion of a read that found the Migration's
uid; only an Abandoned Migration (and a Failed one whose spec does not validate) gets its
phase from the watcher, with the conditions the saga would write, because then no
workflow is left to write it. An Abandoned one's steps left under way (Running, Retrying,
Compensating) become Interrupted in that same write: no run will finish them. A merge patch
replaces a list whole, so that write is built from the read it is conditional on: a write
of the saga's in between costs a 409, and the write is built again from the next read.

The writer remembers, until the pass asks (`take_written`), the resourceVersions its
writes produced: a state of the Migration that the pass's own later write superseded
need not be handled again (see watcher/dispatching.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from activities.events import Recorded
from ferry.api.migration import (
    FINALIZER,
    UNDER_WAY,
    WORKFLOW_ANNOTATION,
    DeletionStatus,
    EventType,
    Migration,
    Phase,
    StepState,
)
from ferry.api.saga import MigrationRef
from watcher.decisions import ref_of
from watcher.kube import Conflict, Kube
from workflows.status import conditions_for

log = logging.getLogger("ferry.watcher.patching")

CONFLICT_ATTEMPTS = 10

StatusFields = Mapping[str, Any] | Callable[[Migration], Mapping[str, Any]]
"""Status fields to merge-patch, or how to build them from the Migration as the write's read found it."""


class MigrationWriter:
    """Writes to Migration objects on behalf of the watcher."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self._written: dict[str, list[str]] = {}

    def take_written(self, ref: MigrationRef) -> list[str]:
        """The resourceVersions the writes to this Migration produced since the last call, in order."""
        return self._written.pop(ref.uid, [])

    def _wrote(self, ref: MigrationRef, migration: Migration | None) -> None:
        if migration is not None:
            self._written.setdefault(ref.uid, []).append(migration.metadata.resource_version)

    async def hold(self, migration: Migration, workflow_id: str | None) -> bool:
        """One write: ferry's finalizer and, when given, the annotation naming the workflow (which exists now; see
        WORKFLOW_ANNOTATION), each where missing.

        False when the Migration cannot hold the finalizer: it is gone, or is being deleted (the API server adds no
        finalizer then). The run stops all the same: the run of a gone one acts on nothing (worker/gate.py), and the
        pass of a lingering one cancels it (watcher/decisions.py).
        """
        return await self._change_finalizers(migration, add=True, workflow_id=workflow_id)

    async def remove_finalizer(self, migration: Migration) -> None:
        await self._change_finalizers(migration, add=False)

    async def _change_finalizers(self, seen: Migration, *, add: bool, workflow_id: str | None = None) -> bool:
        """Starts from the object as the watch delivered it; re-reads only after a conflict.

        Returns whether the Migration ends with the finalizer as wanted. The annotation, when given, goes in the same
        write. Written alone (the finalizer was there), it carries no resourceVersion and may land on a Migration
        created again under the same name meanwhile: harmless, since that one's workflow has another ID (another
        uid), which is what the annotation is compared with.
        """
        ref = ref_of(seen)
        migration: Migration | None = seen
        for _ in range(CONFLICT_ATTEMPTS):
            if migration is None:
                return not add
            finalizers = migration.metadata.finalizers
            metadata: dict[str, Any] = {}
            if (FINALIZER in finalizers) != add:
                if add and migration.metadata.deletion_timestamp is not None:
                    log.info("Migration %s is being deleted: no finalizer added (its next pass cancels a run)", ref)
                    return False
                wanted = [*finalizers, FINALIZER] if add else [f for f in finalizers if f != FINALIZER]
                metadata = {"finalizers": wanted, "resourceVersion": migration.metadata.resource_version}
            if workflow_id is not None and migration.metadata.annotations.get(WORKFLOW_ANNOTATION) != workflow_id:
                metadata["annotations"] = {WORKFLOW_ANNOTATION: workflow_id}
            if not metadata:
                return True
            try:
                written = await self._kube.patch_migration(ref, {"metadata": metadata})
            except Conflict:
                migration = await self._kube.read_migration(ref)
                continue
            if written is None:
                return not add  # gone meanwhile
            self._wrote(ref, written)
            if "finalizers" in metadata:
                log.info("%s finalizer %s on Migration %s", "added" if add else "removed", FINALIZER, ref)
            return True
        raise RuntimeError(f"Migration {ref} kept changing; could not update its finalizers")

    async def remove_secret_finalizer(self, namespace: str, name: str, finalizer: str) -> None:
        """Takes a Migration's finalizer off a Secret it names (see activities/secrets.py, SecretProtection)."""
        await self._kube.remove_secret_finalizer(namespace, name, finalizer)
        log.info("removed finalizer %s from Secret %s/%s (if it was there)", finalizer, namespace, name)

    async def patch_status(self, ref: MigrationRef, fields: StatusFields, *, unless_deleted: bool = False) -> bool:
        """Merge-patches the given status fields (the watcher's own) of this very Migration; a missing one is left
        alone, and so, with `unless_deleted`, is one whose deletion was asked for meanwhile. Returns whether it wrote.

        Each write carries the resourceVersion of a read that found the Migration's uid, so what a pass decided for
        one Migration never lands on another created since under its name (a status saying Abandoned, or a passed
        deletion deadline, would misrepresent or release it). A write in between (the saga writes often) costs a
        read and another try. `fields` given as a function is built from each read, so a field it copies from the
        status (a list, which a merge patch replaces whole) is never older than the version the write lands on.
        """
        wanted: Mapping[str, Any] = {}
        for _ in range(CONFLICT_ATTEMPTS):
            migration = await self._kube.read_migration(ref)
            if migration is None or (unless_deleted and migration.metadata.deletion_timestamp is not None):
                return False
            wanted = fields(migration) if callable(fields) else fields
            try:
                written = await self._kube.patch_status(ref, wanted, migration.metadata.resource_version)
            except Conflict:
                continue
            self._wrote(ref, written)
            return written is not None
        raise RuntimeError(f"Migration {ref} kept changing; could not write its status fields {sorted(wanted)}")

    async def acknowledge(self, ref: MigrationRef, key: str, value: str, message: str) -> None:
        """Records in status.controls that the control `key=value` was acted on (or refused), and how."""
        await self.patch_status(ref, {"controls": {"acknowledged": {key: value}, "message": message}})

    async def take_off(self, ref: MigrationRef, keys: tuple[str, ...]) -> None:
        """Forgets the acknowledgement of each control annotation in `keys` that is still off the Migration, and
        counts it in status.controls.takenOff: given again, it is a new control (watcher/controls.py)."""

        def forgotten(migration: Migration) -> Mapping[str, Any]:
            controls = migration.status.controls
            if controls is None:
                return {}
            off = [key for key in keys if key in controls.acknowledged and key not in migration.metadata.annotations]
            counts = {key: controls.taken_off.get(key, 0) + 1 for key in off}
            return {"controls": {"acknowledged": dict.fromkeys(off), "takenOff": counts}} if off else {}

        await self.patch_status(ref, forgotten)

    async def waiting_for_deletion(self, ref: MigrationRef, deletion: DeletionStatus) -> None:
        await self.patch_status(ref, {"deletion": deletion.model_dump(mode="json", by_alias=True)})

    async def mark_abandoned(self, migration: Migration, message: str, reason: str | None = None) -> bool:
        """Sets phase Abandoned: the workflow ended without finishing the Migration (terminated, or its history gone).

        `reason`, when given, is the conditions' reason instead of the phase (HISTORY_GONE). Not on a Migration being
        deleted: the deletion handler decides what happens to it (watcher/deletion.py), from its status as it was.
        Steps left under way become Interrupted (`_interrupted`). Returns whether it wrote."""
        return await self._finish(
            migration, Phase.ABANDONED, message, reason=reason, unless_deleted=True, interrupts=True
        )

    async def mark_failed(self, migration: Migration, message: str) -> None:
        """Sets phase Failed for a Migration no workflow will run (its spec does not validate), with observedGeneration:
        the watcher is what observed that spec."""
        await self._finish(migration, Phase.FAILED, message, observed=True)

    async def _finish(
        self, migration: Migration, phase: Phase, message: str, *, reason: str | None = None, observed: bool = False,
        unless_deleted: bool = False, interrupts: bool = False,
    ) -> bool:  # fmt: skip
        """Writes a final phase, with its message and the conditions the saga would write for it (workflows/status.py),
        so `kubectl wait --for=condition=Succeeded=false` returns. Each condition names the generation it saw; with
        `observed`, status.observedGeneration too (else it stays the saga's, which is what spec.paused is compared
        with). With `interrupts`, the steps left under way become Interrupted in the same write.

        Conditions and steps are lists, which a merge patch replaces whole: both are built from the read the write
        is conditional on (`patch_status`), so nothing the saga wrote before it is lost."""
        generation = migration.metadata.generation
        now = datetime.now(UTC)

        def fields(read: Migration, *, with_steps: bool = interrupts) -> dict[str, Any]:
            previous = {condition.type: condition for condition in read.status.conditions}
            conditions = conditions_for(phase, message, generation, previous, now)
            if reason is not None:
                conditions = {kind: c.model_copy(update={"reason": reason}) for kind, c in conditions.items()}
            written: dict[str, Any] = {
                "phase": phase.value,
                "currentStep": None,
                "message": message,
                "conditions": [
                    c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions.values()
                ],
            }
            if observed:
                written["observedGeneration"] = generation
            steps = _interrupted(read) if with_steps else None
            if steps is not None:
                written["steps"] = steps
            return written

        ref = ref_of(migration)
        try:
            return await self.patch_status(ref, fields, unless_deleted=unless_deleted)
        except ApiException as error:
            if error.status != 422 or not interrupts:
                raise
            # The CRD installed predates the state Interrupted (Helm never upgrades CRDs): the phase matters more.
            log.warning(
                "Migration %s: the API server refused the step state %s (its CRD is older than this watcher: "
                "kubectl apply --server-side --force-conflicts -f deploy/crd/); writing phase %s with status.steps as "
                "the run left them",
                ref, StepState.INTERRUPTED.value, phase.value,
            )  # fmt: skip
            return await self.patch_status(
                ref, lambda read: fields(read, with_steps=False), unless_deleted=unless_deleted
            )

    async def event(self, ref: MigrationRef, kind: EventType, reason: str, message: str, key: str) -> Recorded:
        """Records a watcher Event once per key (a relist does not record it again)."""
        return await self._kube.record_event(ref, kind, reason, message, key)


def _interrupted(migration: Migration) -> list[dict[str, Any]] | None:
    """status.steps with each step left under way (UNDER_WAY) marked Interrupted; None when none is, or when the
    status did not parse whole (`status_problem`): the list is written whole, and one this watcher cannot read
    entirely is left as it is.

    finishedAt stays as the run left it (unset for a step that was running): nobody knows when, or whether, the
    step's work stopped (an activity of a terminated run may go on until its worker notices), and the watcher's
    clock when it noticed, a resync or more later, would pass for that. lastError stays too: why the last attempt
    failed is still true."""
    status = migration.status
    if migration.status_problem is not None or not any(step.state in UNDER_WAY for step in status.steps):
        return None
    return [
        (step.model_copy(update={"state": StepState.INTERRUPTED}) if step.state in UNDER_WAY else step).model_dump(
            mode="json", by_alias=True, exclude_none=True
        )
        for step in status.steps
    ]
