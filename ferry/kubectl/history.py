"""A Migration's run as its Temporal history tells it: every step, undo and check, attempt by attempt, with times.

The saga runs each attempt of a step as one activity, so the history's activity events
(scheduled, started, closed) are the record of what ran and how it ended; updates and
signals are the controls people gave. This module turns those events into rows, a pure
function of the events, so it is tested without a server.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from ferry.api.migration import StepName
from ferry.api.saga import KubeActivity

BOOKKEEPING = {KubeActivity.MIRROR_STATUS.value}
"""Activities that only write the status: left out unless asked for."""
_STEPS = {step.value.replace("-", "_"): step.value for step in StepName}
"""Every step of either mode, by the operation its activity is named after (catch_up: catch-up)."""


@dataclasses.dataclass
class Row:
    """One activity attempt, or one control given to the run."""

    kind: str
    """`step`, `undo`, `check` (a guard or another activity), `control`, or `workflow`."""
    name: str
    """The activity (e.g. undo_provision), the control (e.g. approve) or the workflow's event."""
    step: str | None
    """The saga step it belongs to, e.g. provision; None when it belongs to none."""
    scheduled: datetime | None = None
    started: datetime | None = None
    closed: datetime | None = None
    outcome: str = "Scheduled"
    """Completed, Failed, TimedOut, Canceled, or Scheduled/Running while it is still open; for a control:
    Accepted, Rejected or Signalled."""
    detail: str = ""
    """The failure's message, or who gave a control."""

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("scheduled", "started", "closed"):
            data[key] = data[key].isoformat().replace("+00:00", "Z") if data[key] else None
        return data


def _time(stamp: Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)


def kind_of(activity: str) -> tuple[str, str | None]:
    """(`step`|`undo`|`check`, the step) of an activity name; a data driver's carry its prefix (`postgresql.`)."""
    operation = activity.rpartition(".")[2]
    if operation in _STEPS:
        return "step", _STEPS[operation]
    if operation.startswith("undo_") and operation.removeprefix("undo_") in _STEPS:
        return "undo", _STEPS[operation.removeprefix("undo_")]
    return "check", None


def rows(events: Iterable[HistoryEvent], *, bookkeeping: bool = False) -> list[Row]:
    """The rows of a history, in the order their activities were scheduled (controls where they came)."""
    found: list[Row] = []
    by_scheduled: dict[int, Row] = {}
    for event in events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            if name in BOOKKEEPING and not bookkeeping:
                continue
            what, step = kind_of(name)
            row = Row(what, name, step, scheduled=_time(event.event_time))
            by_scheduled[event.event_id] = row
            found.append(row)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attributes = event.activity_task_started_event_attributes
            if (opened := by_scheduled.get(attributes.scheduled_event_id)) is not None:
                opened.started, opened.outcome = _time(event.event_time), "Running"
        elif kind in _CLOSING:
            outcome, field = _CLOSING[kind]
            attributes = getattr(event, field)
            if (ended := by_scheduled.get(attributes.scheduled_event_id)) is not None:
                ended.closed, ended.outcome = _time(event.event_time), outcome
                if outcome in ("Failed", "TimedOut") and attributes.HasField("failure"):
                    ended.detail = _failure(attributes.failure)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            update = event.workflow_execution_update_accepted_event_attributes.accepted_request.input
            at = _time(event.event_time)
            found.append(Row("control", update.name, None, scheduled=at, outcome="Accepted", detail=_by(update.args)))
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            signal = event.workflow_execution_signaled_event_attributes
            at = _time(event.event_time)
            found.append(
                Row("control", signal.signal_name, None, scheduled=at, outcome="Signalled", detail=_by(signal.input))
            )
        elif kind in _WORKFLOW_ENDS:
            at = _time(event.event_time)
            found.append(
                Row("workflow", _WORKFLOW_ENDS[kind], None, scheduled=at, closed=at, outcome=_WORKFLOW_ENDS[kind])
            )
    return found


def _by(payloads: Payloads) -> str:
    """`by alice: slow queries` from a control's input (a ControlRequest as JSON), when it says."""
    if not payloads.payloads:
        return ""
    try:
        request = json.loads(payloads.payloads[0].data)
    except ValueError:
        return ""
    if not isinstance(request, dict) or not request.get("by"):
        return ""
    return f"by {request['by']}: {request['reason']}" if request.get("reason") else f"by {request['by']}"


def _failure(failure: Any) -> str:
    """The innermost message of a failure chain: what went wrong, not the SDK's wrapping."""
    message = failure.message
    while failure.HasField("cause"):
        failure = failure.cause
        message = failure.message or message
    return " ".join(str(message).split())


_CLOSING = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: ("Completed", "activity_task_completed_event_attributes"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: ("Failed", "activity_task_failed_event_attributes"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: ("TimedOut", "activity_task_timed_out_event_attributes"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: ("Canceled", "activity_task_canceled_event_attributes"),
}
_WORKFLOW_ENDS = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: "Completed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: "Failed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: "TimedOut",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: "Canceled",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: "Terminated",
}


def _clock(value: datetime | None) -> str:
    return f"{value:%H:%M:%S}.{value.microsecond // 1000:03d}" if value else "-"


def _took(row: Row) -> str:
    begin, end = row.started or row.scheduled, row.closed
    if begin is None or end is None or row.kind in ("control", "workflow"):
        return ""
    return f"{(end - begin).total_seconds():.1f}s"


def table_rows(found: list[Row]) -> list[list[str]]:
    """The rows as a table's cells: KIND, NAME, STEP, SCHEDULED, STARTED, CLOSED, TOOK, OUTCOME."""
    return [
        [row.kind, row.name, row.step or "", _clock(row.scheduled), _clock(row.started), _clock(row.closed),
         _took(row), f"{row.outcome}: {row.detail}" if row.detail else row.outcome]
        for row in found
    ]  # fmt: skip


HEADER = ["KIND", "NAME", "STEP", "SCHEDULED", "STARTED", "CLOSED", "TOOK", "OUTCOME"]
