"""The saga's view of a Migration's status, kept by the workflow and mirrored into the resource.

Deterministic: times come from the caller (workflow.now()), nothing does I/O. Conditions
follow the Kubernetes conventions: one entry per type, lastTransitionTime changes only
when the status of that condition changes.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from ferry.api.migration import (
    STEP_ORDER,
    Condition,
    ConditionStatus,
    Phase,
    PlanStatus,
    ReplicationStatus,
    SnapshotStatus,
    StepState,
    StepStatus,
    WorkflowRef,
    WriteDowntimeStatus,
)
from ferry.api.migration import MigrationStatus as StatusModel

TRUE, FALSE, UNKNOWN = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN

CONDITION_TYPES = ("Succeeded", "Progressing", "AwaitingApproval", "Paused", "RolledBack", "Planned")
"""Each one's status follows the phase. Planned is True at the end of a dry run, so that `kubectl wait
--for=condition=Planned` returns once the plan is written; Succeeded, which a dry run is not, stays False. Adding a
type changes only the status the saga writes (an activity's input), no command: recorded histories replay
(tests/workflows/test_versions.py)."""


def _condition_states(phase: Phase) -> dict[str, ConditionStatus]:
    succeeded = TRUE if phase is Phase.SUCCEEDED else FALSE if phase.finished else UNKNOWN
    return {
        "Succeeded": succeeded,
        "Progressing": TRUE if phase in (Phase.PENDING, Phase.RUNNING, Phase.ROLLING_BACK) else FALSE,
        "AwaitingApproval": TRUE if phase is Phase.AWAITING_APPROVAL else FALSE,
        "Paused": TRUE if phase is Phase.PAUSED else FALSE,
        "RolledBack": TRUE if phase is Phase.ROLLED_BACK else FALSE,
        "Planned": TRUE if phase is Phase.PLANNED else FALSE,
    }


def conditions_for(
    phase: Phase, message: str, generation: int | None, previous: dict[str, Condition], now: datetime
) -> dict[str, Condition]:
    """The conditions of a Migration in `phase`; a condition keeps its lastTransitionTime unless its status changes."""
    conditions = {}
    for kind, state in _condition_states(phase).items():
        before = previous.get(kind)
        conditions[kind] = Condition(
            type=kind,
            status=state,
            reason=phase.value,
            message=message,
            observed_generation=generation,
            last_transition_time=before.last_transition_time if before and before.status == state else now,
        )
    return conditions


@dataclasses.dataclass
class SagaStatus:
    """Mutable status the workflow updates at every transition."""

    workflow: WorkflowRef
    generation: int
    phase: Phase = Phase.PENDING
    current_step: str | None = None
    message: str = ""
    transitioned_at: datetime | None = None
    """When the saga last moved to a phase (workflow.now()): how long it took to be seen is measured from here."""
    approved_by: str | None = None
    snapshot: SnapshotStatus | None = None
    plan: PlanStatus | None = None
    write_downtime: WriteDowntimeStatus | None = None
    replication: ReplicationStatus | None = None
    order: tuple[str, ...] = STEP_ORDER
    """The steps this run has, in the order they run."""
    steps: dict[str, StepStatus] = dataclasses.field(default_factory=dict)
    conditions: dict[str, Condition] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.steps = {step: self.steps.get(step, StepStatus(name=step)) for step in self.order}

    @classmethod
    def resumed_from(
        cls, model: StatusModel, workflow: WorkflowRef, generation: int, order: tuple[str, ...]
    ) -> SagaStatus:
        """The status a later run (the undo of a finished one) continues from: its steps, snapshot and approval."""
        conditions = {condition.type: condition for condition in model.conditions}
        return cls(
            workflow=workflow,
            generation=generation,
            phase=model.phase or Phase.PENDING,
            message=model.message or "",
            approved_by=model.approved_by,
            snapshot=model.snapshot,
            plan=model.plan,
            write_downtime=model.write_downtime,
            replication=model.replication,
            order=order,
            steps={entry.name: entry for entry in model.steps},
            conditions=conditions,
        )

    def set_phase(self, phase: Phase, message: str, now: datetime) -> None:
        self.phase = phase
        self.message = message
        self.transitioned_at = now
        self.conditions = conditions_for(phase, message, self.generation, self.conditions, now)

    def update_step(self, step: str, now: datetime, **changes: object) -> StepStatus:
        """Replaces fields of a step's entry; state changes to RUNNING count an attempt and stamp times."""
        entry = self.steps[step]
        fields = dict(changes)
        state = fields.get("state")
        if state is StepState.RUNNING:
            fields.setdefault("attempts", entry.attempts + 1)
            fields.setdefault("started_at", now)
            fields.setdefault("finished_at", None)
            fields.setdefault("last_error", None)
        elif state in (StepState.SUCCEEDED, StepState.FAILED, StepState.COMPENSATED, StepState.COMPENSATION_FAILED):
            fields.setdefault("finished_at", now)
        self.steps[step] = entry.model_copy(update=fields)
        return self.steps[step]

    def to_model(self) -> StatusModel:
        return StatusModel(
            phase=self.phase,
            current_step=self.current_step,
            message=self.message,
            transitioned_at=self.transitioned_at,
            steps=[self.steps[step] for step in self.order],
            conditions=[self.conditions[kind] for kind in CONDITION_TYPES if kind in self.conditions],
            observed_generation=self.generation,
            workflow=self.workflow,
            snapshot=self.snapshot,
            approved_by=self.approved_by,
            plan=self.plan,
            write_downtime=self.write_downtime,
            replication=self.replication,
        )
