"""How every activity waits for the cluster: poll, heartbeat the progress, stop when cancelled.

Kubernetes converges in the background, so an activity that changed something polls
until the outcome is visible. Each poll heartbeats what it saw, which lets Temporal
tell a slow step from a dead worker and shows the progress in the UI; and it is when
a cancellation arrives, so a cancelled activity stops within one poll interval. There
is no deadline here: the workflow's per-step start-to-close timeout is the deadline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from temporalio import activity
from temporalio.exceptions import CancelledError


@dataclasses.dataclass(frozen=True)
class Progress:
    """What one poll saw."""

    done: bool
    """Whether the wait is over."""
    waiting_for: str
    """What is awaited, in words, e.g. `StatefulSet shop/orders-db-18 Ready`."""
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    """Numbers worth heartbeating, e.g. ready and desired replicas."""
    names: tuple[str, ...] = ()
    """Objects the poll found, e.g. the Pods an EndpointSlice lists."""

    def details(self) -> dict[str, object]:
        return {"waiting_for": self.waiting_for, **self.counts}


def wait_for(check: Callable[[], Progress], interval: float) -> Progress:
    """Calls `check` every `interval` seconds until it reports done; heartbeats every answer.

    Raises:
        CancelledError: the activity was cancelled while waiting.
    """
    while True:
        progress = check()
        activity.heartbeat(progress.details())
        if progress.done:
            return progress
        if not activity.is_cancelled():
            activity.wait_for_cancelled_sync(timeout=interval)
        if activity.is_cancelled():
            raise CancelledError(f"cancelled while waiting for {progress.waiting_for}")
