"""What one pass over a Migration does, decided from the object alone: a pure function, tested without a cluster.

Everything a decision needs is durable and in the object: its deletionTimestamp and
finalizers, its spec, its status (phase, status.workflow, acknowledged controls) and the
watcher's annotation naming the workflow it started. Nothing is remembered between
passes, so a restarted or another watcher decides the same. The one outside fact is a
hint from the resync's single visibility query: "this Migration's run closed
Terminated or TimedOut, or is not Running and may be gone from Temporal" (see
watcher/abandoned.py).

A finished Migration that is not being deleted and has no new control decides
`nothing`: it costs neither a Temporal call nor an API write, and a list keeps no more
of it than a summary (watcher/inventory.py). The one exception is a finished Migration
whose deletion still has work (a snapshot kept until then) and which lost ferry's
finalizer (`kubectl replace` of a manifest without it): one write puts it back. An
Abandoned one whose run Temporal lost (HISTORY_GONE) does not get it back: its deletion
would undo what its steps did, and taking the finalizer off is how a person keeps that.

A new Migration's workflow starts before ferry's finalizer is added (with the
annotation, in one write), so a deleted Migration without the finalizer may have a run
going on: the object says nothing of a start whose write it refused. Unless its status
is finished, its pass cancels the run by ID, which costs one call whether or not a run
is there. Where the API server sets the finalizer at creation (deploy/admission/finalizer)
a Migration is held from the start; a pass that starts its workflow then writes nothing,
and `start` stays decided until a status or the annotation names the run (the start is
refused then, and the handler records it: watcher/handling.py).

A Migration the watch saw go (DELETED) leaves one thing to do, decided from its last
state: take its finalizer off the Secrets its spec names (`release_secrets`). ferry's own
release did that already (watcher/deletion.py), and then it costs a patch per Secret that
changes nothing; but a Migration can go without that release: ferry's finalizer removed
by hand, a deletion ferry's finalizer never held (`cancel` above), or a precheck attempt
that marked the Secrets after the release (activities/secrets.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ferry.api.migration import FINALIZER, WORKFLOW_ANNOTATION, AfterSuccess, Migration, Phase, StepState
from ferry.api.saga import MigrationRef, workflow_id
from watcher.controls import Control, Rejection, pending, taken_off


@dataclasses.dataclass(frozen=True)
class Action:
    """The work of one pass, in the order the handler does it; all empty means nothing to do."""

    deletion: bool = False
    """Deleted and still holding ferry's finalizer: the deletion handler decides when to let it go."""
    cancel: bool = False
    """Deleted without ferry's finalizer and not finished: a run may be going on that nothing holds the Migration
    for (its deletion landed between the start and the write that adds the finalizer, while another finalizer kept
    the object). Cancel the run, if there is one; it rolls back."""
    invalid_spec: str | None = None
    """The spec does not validate (an older CRD let it through): a Warning Event and phase Failed, saying why."""
    start: bool = False
    """Neither status.workflow nor the watcher's annotation names the workflow: start it (once, by its ID)."""
    add_finalizer: bool = False
    """Added after the start, in one write with the annotation that records it (see watcher/handling.py)."""
    controls: tuple[Control | Rejection, ...] = ()
    taken_off: tuple[str, ...] = ()
    """Control annotations acknowledged before and taken off since: forget them, so that given again (with any
    value) they are new controls (watcher/controls.py)."""
    check_run: bool = False
    """The resync's query saw the run closed Terminated or TimedOut, or not Running (and a describe found it gone or
    ended so), while the status is not finished: the handler looks (watcher/abandoned.py)."""
    release_secrets: bool = False
    """The watch said DELETED: take the Migration's finalizer off the Secrets its spec names (idempotent), however it
    went. Its last state says which: the names never change (spec.driver and spec.snapshot are immutable)."""

    @property
    def nothing(self) -> bool:
        return self == NOTHING

    @property
    def urgent(self) -> bool:
        """A Migration no workflow has taken yet: handled before the others a list brings."""
        return self.start or self.invalid_spec is not None

    @property
    def summary(self) -> str:
        """What the pass does, e.g. `start+finalizer`, or `nothing` (a metric label, so a small set)."""
        parts = [
            name
            for name, wanted in (
                ("deletion", self.deletion),
                ("cancel", self.cancel),
                ("invalid-spec", self.invalid_spec is not None),
                ("start", self.start),
                ("finalizer", self.add_finalizer),
                ("controls", bool(self.controls)),
                ("controls-taken-off", bool(self.taken_off)),
                ("check-run", self.check_run),
                ("release-secrets", self.release_secrets),
            )
            if wanted
        ]
        return "+".join(parts) or "nothing"


NOTHING = Action()


def ref_of(migration: Migration) -> MigrationRef:
    metadata = migration.metadata
    return MigrationRef(namespace=metadata.namespace, name=metadata.name, uid=metadata.uid)


def started(migration: Migration) -> bool:
    """Whether the Migration's workflow is known to exist, from the object alone."""
    expected = workflow_id(ref_of(migration))
    workflow = migration.status.workflow
    return (workflow is not None and workflow.id == expected) or (
        migration.metadata.annotations.get(WORKFLOW_ANNOTATION) == expected
    )


def every_step_succeeded(migration: Migration) -> bool:
    """Whether the status shows every step of the run Succeeded: the migration was done, whatever its phase says (the
    saga ignores a cancel from then on; its retention cleanup and the write saying Succeeded come after)."""
    steps = migration.status.steps
    return bool(steps) and all(step.state is StepState.SUCCEEDED for step in steps)


def decide(migration: Migration, *, gone: bool = False, run_closed: bool = False) -> Action:
    """What to do with this state of a Migration.

    `gone`: the watch said DELETED (the object no longer exists): only its Secrets are left to let go, if its spec
    parses (one that does not never ran, so never marked them).
    `run_closed`: the resync named its run among those terminated or timed out, or gone from Temporal.
    """
    if gone:
        return Action(release_secrets=migration.spec is not None)
    if migration.metadata.deletion_timestamp is not None:
        if FINALIZER in migration.metadata.finalizers:
            return Action(deletion=True, controls=tuple(_answered_by_deletion(pending(migration))))
        return Action(cancel=not migration.finished)
    given, off = tuple(pending(migration)), tuple(taken_off(migration))
    if migration.finished:
        # Held only where its deletion still has work: `kubectl replace` of a manifest without finalizers drops
        # ferry's, and a Migration let go at once would leave the snapshot its retention deletes with it. Not one
        # Abandoned because its run went from Temporal (HISTORY_GONE): its deletion would undo what its steps did,
        # and taking ferry's finalizer off is how a person keeps that instead (README); put back, the deletion that
        # follows would empty and delete the target they meant to keep.
        held = FINALIZER in migration.metadata.finalizers or not deleting_it_has_work(migration)
        return Action(controls=given, taken_off=off, add_finalizer=not held)
    if migration.spec is None:
        return Action(invalid_spec=migration.spec_problem or "the spec does not validate")
    return Action(
        add_finalizer=FINALIZER not in migration.metadata.finalizers,
        start=not started(migration),
        controls=given,
        taken_off=off,
        check_run=run_closed,
    )


def deleting_it_has_work(migration: Migration) -> bool:
    """Whether deleting this finished Migration has work for ferry: the retention cleanup of a snapshot that
    afterSuccess: DeleteWithMigration keeps until then (watcher/deletion.py)."""
    status, spec = migration.status, migration.spec
    return (
        status.phase is Phase.SUCCEEDED
        and status.snapshot is not None
        and not status.snapshot.deleted
        and spec is not None
        and spec.snapshot.retention.after_success is AfterSuccess.DELETE_WITH_MIGRATION
    )


def _answered_by_deletion(given: Iterable[Control | Rejection]) -> Iterable[Rejection]:
    """Controls given to a Migration being deleted are refused, saying why: the deletion decides what happens to its
    run (watcher/deletion.py). Answered, not left unacknowledged, which `kubectl ferry` would read as a watcher that
    is not running."""
    for item in given:
        if isinstance(item, Rejection):
            yield item
            continue
        yield Rejection(
            item.key,
            item.value,
            f"{item.key} refused: the Migration is being deleted; ferry rolls back a run still going, or cleans up "
            "after a finished one, then lets it go",
            item.occurrence,
        )


def handling_order(listed: Iterable[Migration]) -> list[Migration]:
    """A list's Migrations in the order to hand them over.

    Migrations no workflow has taken yet come first (in the list's order), so a restarted
    watcher acts on a new Migration before it looks at thousands of others again.
    """
    return sorted(listed, key=lambda migration: not decide(migration).urgent)
