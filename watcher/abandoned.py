"""Runs ended from outside or lost by Temporal: no workflow is left to mirror that, so the watcher marks the Migration.

Two ways a run stops without a word to its Migration: terminated (or timed out), and gone
from Temporal while it ran (`temporal workflow delete`, or a Temporal rebuilt empty).
Noticing either costs one visibility query per resync, whatever the number of Migrations:
the runs of the watcher's task queue that closed Terminated or TimedOut since a little
before the previous query, and, every --lost-runs-interval, those that are Running (a page
per thousand, too many to list at every resync in a fleet of paused Migrations). The
first query after the watcher starts has no lower bound on the closed ones, so a run
terminated while no watcher ran is found too. The look-back (LOOK_BACK) covers
visibility's delay and a modest skew between this machine's clock and Temporal's.

Only a Migration that needs a look costs more: one that the query names as ended, or one
whose status names a run (the saga wrote a phase), unfinished and not being deleted, that
the query does not list as Running. Visibility lags behind a run just started, reset or
continued as new (all keep the workflow ID, which is what is compared), so a describe,
which is strongly consistent, confirms it first; usually there is none. Then one more
describe in the Migration's pass, its last history event (who terminated it, and why),
the status.

A run terminated from outside undid nothing more, and its deletion undoes nothing either.
A run gone from Temporal is marked with the conditions' reason HISTORY_GONE: deleting its
Migration undoes what the steps recorded (watcher/deletion.py, `_history_gone`), as it did
before the mark, and the message says so (unless every step shows Succeeded, or it is a
dry run: then there is nothing to undo, and the reason stays Abandoned). Either way the
steps the run left under way are marked Interrupted (watcher/patching.py), and the message
names them. Nothing is marked
on a Migration being deleted (the deletion handler decides), nor for a run the status
places in another Temporal namespace than the watcher's, whose absence here says nothing.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowHistoryEventFilterType
from temporalio.service import RPCError, RPCStatusCode

from ferry.api.migration import FINALIZER, HISTORY_GONE, UNDER_WAY, Migration
from watcher.decisions import every_step_succeeded

log = logging.getLogger("ferry.watcher.abandoned")

LOOK_BACK = timedelta(minutes=5)
"""How far before the previous query each query looks again."""
_ENDED = (WorkflowExecutionStatus.TERMINATED, WorkflowExecutionStatus.TIMED_OUT)


@dataclasses.dataclass(frozen=True)
class Runs:
    """What the resync's query says of the runs on the watcher's task queue (workflow IDs)."""

    running: frozenset[str] | None
    """Running now, as far as visibility knows; None when the query did not ask (see RunsQuery.ask)."""
    ended_from_outside: frozenset[str]
    """Closed Terminated or TimedOut since the previous query (less LOOK_BACK)."""


class RunsQuery:
    """The one visibility query of each resync."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue
        self._since: datetime | None = None

    async def ask(self, *, running: bool = True) -> Runs:
        """The runs of this task queue that closed Terminated or TimedOut since the last query, and, with `running`,
        those Running now (a page per thousand: the watcher asks for them every --lost-runs-interval, not at every
        resync); a failed query leaves the next one to look from the same time on."""
        now = datetime.now(UTC)
        ended = "(ExecutionStatus = 'Terminated' OR ExecutionStatus = 'TimedOut')"
        if self._since is not None:
            ended = f"({ended} AND CloseTime >= '{self._since:%Y-%m-%dT%H:%M:%SZ}')"
        wanted = f"(ExecutionStatus = 'Running' OR {ended})" if running else ended
        query = f"TaskQueue = '{self._task_queue}' AND {wanted}"
        listed: set[str] = set()
        closed: set[str] = set()
        async for execution in self._client.list_workflows(query):
            (listed if execution.status is WorkflowExecutionStatus.RUNNING else closed).add(execution.id)
        self._since = now - LOOK_BACK
        return Runs(running=frozenset(listed) if running else None, ended_from_outside=frozenset(closed))


def no_such_run(error: RPCError) -> bool:
    """Whether Temporal answered that it has no run under the workflow ID asked for. Not when the namespace is what
    it does not know (NOT_FOUND too, told apart by its details): the watcher's configuration, or a Temporal still
    starting, says nothing of the runs, and taking it for their absence would abandon every Migration."""
    if error.status != RPCStatusCode.NOT_FOUND:
        return False
    return not any(detail.type_url.endswith(".NamespaceNotFoundFailure") for detail in error.grpc_status.details)


async def stopped_without_a_word(handle: WorkflowHandle[Any, Any]) -> bool:
    """Whether the latest run under this workflow ID is gone from Temporal, or was terminated or timed out: asked of
    a run visibility does not list Running. A run that closed by itself wrote how it ended."""
    try:
        description = await handle.describe()
    except RPCError as error:
        if no_such_run(error):
            return True
        raise
    return description.status in _ENDED


@dataclasses.dataclass(frozen=True)
class Abandonment:
    """Why a Migration is Abandoned, as its status and a Warning Event say."""

    message: str
    reason: str | None = None
    """The conditions' reason, when not the phase's: HISTORY_GONE, whose deletion still undoes."""


async def why_abandoned(handle: WorkflowHandle[Any, Any], migration: Migration, namespace: str) -> Abandonment | None:
    """Why the run ended without finishing the Migration; None when it did not end that way.

    `namespace` is the client's Temporal namespace: a run the status places in another one is not looked for here,
    and its absence says nothing (a watcher pointed at another namespace must not abandon every Migration)."""
    try:
        description = await handle.describe()
    except RPCError as error:
        if not no_such_run(error):
            raise
        return _history_gone(migration, handle.id, namespace)
    if description.status not in _ENDED:
        return None
    how = await _termination(handle) if description.status is WorkflowExecutionStatus.TERMINATED else "timed out"
    return Abandonment(
        f"abandoned: the workflow was {how}; from then on ferry undid nothing more, so the source and the target "
        "are as that run left them (status.steps says which steps it did and which it undid)."
        f"{_interrupted(migration)} Inspect them, clean up by hand, then delete this Migration."
    )


def _history_gone(migration: Migration, saga: str, namespace: str) -> Abandonment | None:
    """The run the status names is not in Temporal: its history was deleted while it ran, or Temporal lost it. What
    deleting the Migration does then is what watcher/deletion.py (`_history_gone`) does, and the message says so."""
    shown = migration.status.workflow
    if migration.status.phase is None or (shown is not None and shown.namespace != namespace):
        if shown is not None:
            log.warning(
                "Migration %s/%s: its status names workflow %s in Temporal namespace %s, this watcher's is %s: not "
                "marked",
                migration.metadata.namespace, migration.metadata.name, saga, shown.namespace, namespace,
            )  # fmt: skip
        return None
    gone = (
        f"abandoned: Temporal has no record of workflow {saga} any more (its history was deleted, e.g. with "
        "`temporal workflow delete`, or Temporal was rebuilt empty), so nothing runs this Migration: no step goes on "
        "and nothing is undone by itself"
    )
    if migration.spec is not None and migration.spec.dry_run:
        return Abandonment(f"{gone}. A dry run changes nothing: deleting this Migration lets it go.")
    if every_step_succeeded(migration):
        return Abandonment(
            f"{gone}. status.steps shows every step Succeeded: the migration was done (the run's last status write "
            "did not land). Deleting this Migration undoes nothing: it runs the snapshot's "
            "retention cleanup, if the retention asks for one, then lets it go."
        )
    return Abandonment(
        f"{gone}. status.steps is what the run last recorded: the steps it did, and those it undid; the source and "
        f"the target are as it left them.{_interrupted(migration)} Deleting this Migration undoes, from those "
        "records, what the steps did, as a rollback would (the undo workflow: traffic back to the source, which takes "
        "writes again, and the target "
        f"removed), then lets it go. To keep what it did instead, remove the finalizer {FINALIZER} by hand before "
        "deleting it.",
        HISTORY_GONE,
    )


def _interrupted(migration: Migration) -> str:
    """The sentence naming the steps the run left under way, which the mark shows Interrupted; empty when none was."""
    names = [step.name for step in migration.status.steps if step.state in UNDER_WAY]
    if not names:
        return ""
    which = f"{names[0]} was" if len(names) == 1 else f"{', '.join(names)} were"
    return (
        f" {which} under way when the run stopped, and nobody recorded how that ended: status.steps shows "
        f"{'it' if len(names) == 1 else 'them'} Interrupted, and what {'it' if len(names) == 1 else 'they'} did may "
        "be done in part, in full or not at all."
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
