"""The controls a person gives a running saga — approve, pause, resume, retry, rollback — and when each applies.

Pure state and rules, so they are tested without a server. The workflow's update
validators ask `refusal` before an update is accepted (a refused update never enters
the history, and its sender gets the reason); its signal handlers, which cannot refuse
(tctl and the temporal CLI send signals), apply what applies and record the rest as
ignored with the same reason. `apply` changes the state and says what the saga will do.
"""

from __future__ import annotations

import dataclasses
import enum

from ferry.api.saga import ControlRequest, Signal

REFUSED_SIGNALS_FORGOTTEN = "refused-signals-are-not-remembered"
"""Patch: a signal refused because it could not apply leaves its request ID unspent, so the same request sent again
once it applies is acted on. It was remembered as acted on, and the later one dropped as a repeat, with no Event."""


class Stage(enum.Enum):
    """Where the saga stands, as far as controls care."""

    FORWARD = "forward"
    ROLLING_BACK = "rolling back"
    FINISHED = "finished"


@dataclasses.dataclass
class Controls:
    """What people asked of the saga so far."""

    approval_required: bool
    stage: Stage = Stage.FORWARD
    approved_by: str | None = None
    approval_settled: bool = False
    """The approval gate is behind the saga (passed, or decided by its deadline): approving is moot."""
    pause_requested: bool = False
    rollback: ControlRequest | None = None
    awaiting_decision: str | None = None
    """The step that failed under failurePolicy Pause and waits for retry or rollback."""
    retry_requested: bool = False
    next_step: str | None = None
    """The step the saga runs next (or is running)."""
    approval_gate: str | None = None
    """The step a required approval is asked for before."""
    writes_stopped: bool = False
    """The source refuses writes where the saga stands (between freeze and switch-traffic): a pause waits."""
    pause_held_off: bool = False
    seen: set[str] = dataclasses.field(default_factory=set)

    def is_repeat(self, request: ControlRequest | None) -> bool:
        """True for a request already acted on (the watcher may deliver one twice); remembers new ones."""
        if self.was_seen(request):
            return True
        self.remember(request)
        return False

    def was_seen(self, request: ControlRequest | None) -> bool:
        """True for a request already acted on; remembers nothing."""
        return request is not None and bool(request.request_id) and request.request_id in self.seen

    def remember(self, request: ControlRequest | None) -> None:
        """Takes `request` as acted on: the same request ID again is a repeat."""
        if request is not None and request.request_id:
            self.seen.add(request.request_id)

    def refusal(self, control: Signal) -> str | None:
        """Why `control` cannot apply now, in a sentence; None when it can."""
        if self.stage is Stage.FINISHED:
            return f"{control} refused: the migration has finished"
        if self.stage is Stage.ROLLING_BACK:
            what = "it is already rolling back" if control is Signal.ROLLBACK else "it is rolling back"
            return f"{control} refused: {what}"
        match control:
            case Signal.APPROVE:
                if not self.approval_required:
                    return "approve refused: this Migration does not ask for approval (spec.approval.required)"
                if self.approved_by is not None:
                    return f"approve refused: already approved by {self.approved_by}"
                if self.approval_settled:
                    return "approve refused: the approval gate is already behind the saga"
            case Signal.PAUSE:
                if self.pause_requested:
                    return "pause refused: the saga is already paused, or pauses before its next step"
            case Signal.RESUME:
                if not self.pause_requested and self.awaiting_decision is not None:
                    return (
                        f"resume refused: {self.awaiting_decision} failed and waits for a decision: send retry to run "
                        "it again, or rollback to undo the started steps"
                    )
                if not self.pause_requested:
                    return "resume refused: the saga is not paused"
            case Signal.RETRY:
                if self.awaiting_decision is None:
                    return "retry refused: no failed step waits for a decision"
            case Signal.ROLLBACK:
                if self.rollback is not None:
                    return "rollback refused: a rollback was already asked for"
        return None

    def apply(self, control: Signal, request: ControlRequest) -> str:
        """Acts on `control` (which must not be refused) and says what the saga does now."""
        by = f" by {request.by}" if request.by else ""
        match control:
            case Signal.APPROVE:
                self.approved_by = request.by or "unknown"
                gate = f" (before {self.approval_gate})" if self.approval_gate else ""
                return f"approved{by}; the saga goes on past its approval gate{gate}"
            case Signal.PAUSE:
                self.pause_requested = True
                if self.writes_stopped:
                    return (
                        f"paused{by}: the source refuses writes until switch-traffic, so the saga holds once writes "
                        "flow again; roll back to stop sooner"
                    )
                before = f" before {self.next_step}" if self.next_step else ""
                return f"paused{by}: the saga holds{before} once the running step (if any) ends"
            case Signal.RESUME:
                self.pause_requested = False
                return f"resumed{by}"
            case Signal.RETRY:
                self.retry_requested = True
                return f"retrying {self.awaiting_decision}{by}"
            case Signal.ROLLBACK:
                self.rollback = request
                return f"rolling back{by}: the running step is stopped and the started steps undone"
        raise ValueError(f"unknown control {control}")

    def rollback_reason(self) -> str | None:
        if self.rollback is None:
            return None
        who = f" by {self.rollback.by}" if self.rollback.by else ""
        why = f": {self.rollback.reason}" if self.rollback.reason else ""
        return f"rollback requested{who}{why}"
