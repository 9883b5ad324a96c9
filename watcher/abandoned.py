"""Runs ended from outside: a workflow terminated (or timed out) cannot mirror that, so the watcher marks its Migration.

Noticing them costs one visibility query per resync, whatever the number of Migrations:
the runs of the watcher's task queue that closed Terminated or TimedOut since a little
before the previous query. The first query after the watcher starts has no lower bound,
so a run terminated while no watcher ran is found too. The look-back (LOOK_BACK) covers
visibility's delay and a modest skew between this machine's clock and Temporal's.
Only a Migration the query names, and whose status is not finished, costs more: one
describe to confirm, its last history event (who terminated it, and why), the status.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowHistoryEventFilterType
from temporalio.service import RPCError, RPCStatusCode

log = logging.getLogger("ferry.watcher.abandoned")

LOOK_BACK = timedelta(minutes=5)
"""How far before the previous query each query looks again."""
_ENDED = (WorkflowExecutionStatus.TERMINATED, WorkflowExecutionStatus.TIMED_OUT)


class ClosedRuns:
    """The visibility query of each resync: which runs ended from outside."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue
        self._since: datetime | None = None

    async def ended_from_outside(self) -> frozenset[str]:
        """IDs of the workflows on this task queue that closed Terminated or TimedOut since the last query."""
        now = datetime.now(UTC)
        query = f"TaskQueue = '{self._task_queue}' AND (ExecutionStatus = 'Terminated' OR ExecutionStatus = 'TimedOut')"
        if self._since is not None:
            query += f" AND CloseTime >= '{self._since:%Y-%m-%dT%H:%M:%SZ}'"
        found = frozenset([execution.id async for execution in self._client.list_workflows(query)])
        self._since = now - LOOK_BACK
        return found


async def why_abandoned(handle: WorkflowHandle[Any, Any]) -> str | None:
    """Why the run ended without finishing the Migration; None when it did not end that way (or does not exist)."""
    try:
        description = await handle.describe()
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    if description.status not in _ENDED:
        return None
    how = await _termination(handle) if description.status is WorkflowExecutionStatus.TERMINATED else "timed out"
    return (
        f"abandoned: the workflow was {how}; from then on ferry undid nothing more, so the source and the target "
        "are as that run left them (status.steps says which steps it did and which it undid). Inspect them, clean up "
        "by hand, then delete this Migration."
    )


async def _termination(handle: WorkflowHandle[Any, Any]) -> str:
    """'terminated from outside by <identity> (<reason>)' from the run's close event."""
    last = None
    async for event in handle.fetch_history_events(event_filter_type=WorkflowHistoryEventFilterType.CLOSE_EVENT):
        last = event
    if last is None or not last.HasField("workflow_execution_terminated_event_attributes"):
        return "terminated"
    attributes = last.workflow_execution_terminated_event_attributes
    who = f" by {attributes.identity}" if attributes.identity else ""
    why = f" ({attributes.reason})" if attributes.reason else ""
    return f"terminated from outside{who}{why}"
