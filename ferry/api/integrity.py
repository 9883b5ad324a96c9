"""What ties a run to the Migration it acts for: the claim every activity carries and the worker checks.

Anyone who can reach the Temporal frontend can start a workflow with an input of their
choosing. The worker therefore never trusts a workflow's input by itself: ferry's workflows
attach a claim to every activity they schedule (a header, derived deterministically from
the workflow's input), and the worker's gate (worker/gate.py) checks it against the live
Migration before the activity runs: the same UID, a run of that Migration's own workflow
IDs, and the same plan (the SHA-256 of the spec's immutable fields; the control field
`paused` may change). This module holds only the shapes and the digests, without side
effects, so the workflow and the worker compute them the same way.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
from typing import Any

from ferry.api.migration import IMMUTABLE_SPEC_FIELDS, ApiModel, MigrationSpec, SnapshotSpec
from ferry.api.saga import (
    CLEANUP_WORKFLOW_NAME,
    UNDO_WORKFLOW_NAME,
    WORKFLOW_NAME,
    WORKFLOW_NAME_V1,
    DeleteSnapshotInput,
    MigrationInput,
    MigrationRef,
    UndoMigrationInput,
    cleanup_workflow_id,
    undo_workflow_id,
    workflow_id,
)

CLAIM_HEADER = "ferry-claim"
NOT_BACKED = "NotBackedByMigration"
"""The failure type of an activity refused by the gate; retrying cannot change the answer."""


class Scope(enum.StrEnum):
    """What of the spec a run acts on: the whole plan, or (retention cleanup) only the snapshot's location."""

    PLAN = "plan"
    SNAPSHOT = "snapshot"


class Claim(ApiModel):
    """Which Migration a run acts for, and the digest of what it was asked to do."""

    ref: MigrationRef
    scope: Scope
    digest: str
    vouched: bool = False
    """The run has already found its Migration alive and matching (an earlier call passed the gate): its undos may
    still run once the Migration is gone, to take back what it did. A run never vouched for acts on nothing."""
    signature: str = ""
    """HMAC-SHA256, under the workers' claim key, of the rest of the claim and of the run and activity it was made for
    (`signature`); empty where no key is configured."""


def signature(key: bytes, claim: Claim, workflow_id: str, run_id: str, activity: str) -> str:
    """What a claim made by one of ferry's workflows carries, so the gate knows ferry's own code made it: the headers
    of an activity are whatever its scheduler says, and anyone who can reach Temporal can run a workflow of their own
    that schedules activities on ferry's task queue. Bound to the run (its ID is the server's) and the activity, a
    claim read from a history is worth nothing in another run."""
    message = {
        "claim": claim.model_dump(mode="json", exclude={"signature"}),
        "workflow": workflow_id,
        "run": run_id,
        "activity": activity,
    }
    canonical = json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest()


def _sha256(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def plan_digest(spec: MigrationSpec) -> str:
    """The SHA-256 of the plan: every immutable field of the spec, as the API server would hold it."""
    dumped = spec.model_dump(mode="json", by_alias=True)
    return _sha256({field: dumped.get(field) for field in IMMUTABLE_SPEC_FIELDS})


def snapshot_digest(snapshot: SnapshotSpec) -> str:
    return _sha256(snapshot.model_dump(mode="json", by_alias=True))


def digest(spec: MigrationSpec, scope: Scope) -> str:
    return plan_digest(spec) if scope is Scope.PLAN else snapshot_digest(spec.snapshot)


def claim_of(workflow_input: object) -> Claim | None:
    """The claim of a run of one of ferry's workflows, from its input; None for any other input."""
    if isinstance(workflow_input, MigrationInput | UndoMigrationInput):
        return Claim(ref=workflow_input.ref, scope=Scope.PLAN, digest=plan_digest(workflow_input.spec))
    if isinstance(workflow_input, DeleteSnapshotInput):
        return Claim(ref=workflow_input.ref, scope=Scope.SNAPSHOT, digest=snapshot_digest(workflow_input.snapshot))
    return None


def workflow_ids(ref: MigrationRef) -> frozenset[str]:
    """The only workflow IDs whose runs may act for this Migration (its saga, its undo, its retention cleanup)."""
    return frozenset(workflow_types(ref))


def workflow_types(ref: MigrationRef) -> dict[str, frozenset[str]]:
    """Per workflow ID that may act for this Migration, the workflow types a run under it may be: each ID is one
    workflow's, so an undo started under the saga's ID (which a deletion does not gate) is no run of this Migration."""
    return {
        workflow_id(ref): frozenset({WORKFLOW_NAME, WORKFLOW_NAME_V1}),
        undo_workflow_id(ref): frozenset({UNDO_WORKFLOW_NAME}),
        cleanup_workflow_id(ref): frozenset({CLEANUP_WORKFLOW_NAME}),
    }


def is_undo(activity_type: str) -> bool:
    """Whether an activity takes back what a step (or the run) did: undo_*, and deleting the run's own snapshot."""
    operation = activity_type.rsplit(".", 1)[-1]
    return operation.startswith("undo_") or operation == "delete_snapshot"
