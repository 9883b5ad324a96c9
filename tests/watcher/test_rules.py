"""The watcher's rules that need no server: a deletion's generation, when a success happened, which runs to look at."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.protobuf.any_pb2 import Any as Detail
from temporalio.api.common.v1 import GrpcStatus
from temporalio.service import RPCError, RPCStatusCode

from ferry.api.migration import FINALIZER, HISTORY_GONE, Migration, Phase
from tests import samples
from watcher import controls
from watcher.abandoned import no_such_run
from watcher.decisions import Action, decide
from watcher.deletion import closing_after_success
from watcher.inventory import Inventory, keep

pytestmark = pytest.mark.unit

UID = "0b7c"
NAME = "orders-db-to-16"
WORKFLOW = f"migration/shop/{NAME}/{UID}"
DELETED = datetime(2026, 11, 22, 12, 30, tzinfo=UTC)
STEPS = ("precheck", "provision", "freeze", "snapshot", "migrate", "verify", "switch-traffic", "scale-down-old")


def migration(
    *, generation: int = 1, deleted: bool = False, paused: bool = False, finalizers: tuple[str, ...] = (FINALIZER,),
    name: str = NAME, uid: str = UID, dry_run: bool = False, **status: Any,
) -> Migration:  # fmt: skip
    raw = samples.migration(name, paused=paused, dryRun=dry_run)
    raw["metadata"] = {
        "name": name, "namespace": "shop", "uid": uid, "generation": generation, "resourceVersion": "1",
        "finalizers": list(finalizers),
    }  # fmt: skip
    if deleted:
        raw["metadata"]["deletionTimestamp"] = DELETED.strftime("%Y-%m-%dT%H:%M:%SZ")
    return Migration.parse({**raw, "status": status})


def steps(finished: datetime | None, *, last: str = "Succeeded") -> list[dict[str, Any]]:
    """Every step Succeeded at `finished` (or a second apart before it), the last one in state `last`."""
    entries: list[dict[str, Any]] = []
    for index, name in enumerate(STEPS):
        entry: dict[str, Any] = {"name": name, "state": "Succeeded"}
        if finished is not None:
            moment = finished - timedelta(seconds=len(STEPS) - 1 - index)
            entry["finishedAt"] = moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        entries.append(entry)
    entries[-1]["state"] = last
    if last != "Succeeded":
        entries[-1].pop("finishedAt", None)
    return entries


def _at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- a deletion's generation is not a change of spec.paused -----------------------------------------


def test_the_generation_a_deletion_adds_is_no_change_of_spec_paused() -> None:
    """The API server adds one to metadata.generation when it marks a Migration held by finalizers as being deleted:
    no spec changed, so there is nothing to answer (it once answered with an InvalidControl Warning)."""
    deleted = migration(generation=3, deleted=True, phase="Paused", observedGeneration=2, paused=True)

    assert controls.pending(deleted) == []
    assert decide(deleted) == Action(deletion=True)


def test_a_change_of_spec_paused_made_just_before_the_deletion_is_refused_saying_why() -> None:
    """Set at generation 3, not yet sent when the deletion came (generation 4): the deletion refuses it, and the
    refusal names the spec's generation, not the deletion's."""
    deleted = migration(generation=4, deleted=True, paused=True, phase="Running", observedGeneration=2)

    [refused] = decide(deleted).controls

    assert isinstance(refused, controls.Rejection)
    assert (refused.key, refused.value) == (controls.SPEC_PAUSED, "true@3")
    assert refused.why.startswith("spec.paused refused: the Migration is being deleted")


def test_a_change_of_spec_paused_the_saga_took_before_the_deletion_is_not_answered_again() -> None:
    acknowledged = {"acknowledged": {controls.SPEC_PAUSED: "true@3"}}
    deleted = migration(
        generation=4, deleted=True, paused=True, phase="Paused", observedGeneration=3, controls=acknowledged
    )

    assert controls.pending(deleted) == []


def test_a_live_migration_still_sends_each_change_of_spec_paused() -> None:
    [pause] = controls.pending(migration(generation=3, paused=True, phase="Running", observedGeneration=2))

    assert isinstance(pause, controls.Control)
    assert (pause.value, pause.request.generation) == ("true@3", 3)


# --- when a run succeeded, for a deletion ---------------------------------------------------------


def test_a_success_is_dated_by_when_its_last_step_finished_not_by_the_succeeded_write() -> None:
    """The saga undoes nothing once every step is done; its retention cleanup and the write saying Succeeded come
    after. A deletion asked for in between came after the success."""
    last_step = DELETED - timedelta(seconds=5)
    shown = migration(phase="Succeeded", transitionedAt=_at(DELETED + timedelta(seconds=30)), steps=steps(last_step))

    assert shown.status.succeeded_at == last_step
    running = migration(phase="Running", steps=steps(last_step))
    assert running.status.succeeded_at == last_step, "Succeeded not written yet"


def test_without_the_steps_times_a_success_is_dated_by_its_succeeded_transition() -> None:
    written = DELETED + timedelta(seconds=3)

    assert migration(phase="Succeeded", transitionedAt=_at(written), steps=steps(None)).status.succeeded_at == written
    assert migration(phase="Succeeded", transitionedAt=_at(written)).status.succeeded_at == written


def test_a_run_with_a_step_not_succeeded_has_not_succeeded() -> None:
    assert migration(phase="Running", steps=steps(DELETED, last="Running")).status.succeeded_at is None
    assert migration(phase="RolledBack", steps=steps(DELETED, last="Compensated")).status.succeeded_at is None


def test_a_run_whose_every_step_succeeded_is_left_to_close_not_cancelled() -> None:
    """A cancel would be ignored by the saga (and once made it dated the success after the deletion, and the watcher
    undid what the saga said it would not)."""
    assert closing_after_success(migration(phase="Succeeded"))
    assert closing_after_success(migration(phase="Running", steps=steps(DELETED)))
    assert not closing_after_success(migration(phase="Running", steps=steps(DELETED, last="Running")))
    assert not closing_after_success(migration(phase="Running"))
    assert not closing_after_success(migration(phase="RollingBack", steps=steps(DELETED))), "a rollback goes on"


# --- runs Temporal lost ---------------------------------------------------------------------------


def _started(name: str, phase: str | None, *, deleted: bool = False) -> Migration:
    status: dict[str, Any] = {"workflow": {"namespace": "default", "id": f"migration/shop/{name}/uid-{name}"}}
    if phase is not None:
        status["phase"] = phase
    return migration(name=name, uid=f"uid-{name}", deleted=deleted, **status)


def test_the_resync_looks_only_at_unfinished_migrations_whose_run_is_not_listed_running() -> None:
    inventory = Inventory()
    inventory.replace(
        "shop",
        [
            keep(_started("listed", "Running")),
            keep(_started("lost", "AwaitingApproval")),
            keep(_started("paused", "Paused")),
            keep(_started("done", "Succeeded")),  # finished: its status says how it ended
            keep(_started("new", None)),  # no status from the saga yet: its start may still be on its way
            keep(_started("going", "Running", deleted=True)),  # the deletion handler looks at its run
        ],
    )

    running = ["migration/shop/listed/uid-listed", "migration/shop/paused/uid-another"]

    assert sorted(ref.name for ref in inventory.unfinished_not_among(running)) == ["lost", "paused"]


def _history_gone(**status: Any) -> Migration:
    condition = {
        "type": "Succeeded", "status": "False", "reason": HISTORY_GONE, "message": "abandoned",
        "lastTransitionTime": "2026-11-22T12:00:00Z",
    }  # fmt: skip
    return migration(phase="Abandoned", conditions=[condition], **status)


def test_a_migration_abandoned_because_temporal_lost_its_run_may_still_undo_what_it_did() -> None:
    """Its deletion undoes from the steps' records, so another Migration may not build on its target, nor move its
    source, until it is gone; one terminated from outside undoes nothing more."""
    assert _history_gone().status.history_gone
    assert _history_gone().may_still_undo
    assert not migration(phase="Abandoned").status.history_gone
    assert not migration(phase="Abandoned").may_still_undo


def test_a_migration_abandoned_because_temporal_lost_its_run_keeps_ferrys_finalizer_off_once_taken_off() -> None:
    """Taking it off is how a person keeps what the run did (the README says so): put back at once, as it was, the
    deletion that followed undid it all the same, emptying and deleting the target they meant to keep. (`kubectl
    replace` of a manifest without it now keeps that too: the deletion leaves things as the run left them.)"""
    assert decide(_history_gone(finalizers=())).nothing
    assert decide(_history_gone()).nothing
    assert decide(migration(phase="Abandoned", finalizers=())).nothing
    assert Phase.ABANDONED.finished


def _not_found(message: str, failure: str) -> RPCError:
    detail = Detail(type_url=f"type.googleapis.com/temporal.api.errordetails.v1.{failure}")
    status = GrpcStatus(code=RPCStatusCode.NOT_FOUND.value, message=message, details=[detail])
    return RPCError(message, RPCStatusCode.NOT_FOUND, status.SerializeToString())


def test_only_a_run_temporal_does_not_know_counts_as_gone_not_a_namespace_it_does_not_know() -> None:
    """Both answer NOT_FOUND (as the dev server does): a watcher given the wrong namespace, or a Temporal still
    creating it, would otherwise mark every unfinished Migration Abandoned."""
    assert no_such_run(_not_found("workflow not found for ID: migration/shop/m/u", "NotFoundFailure"))
    assert not no_such_run(_not_found("Namespace nope is not found.", "NamespaceNotFoundFailure"))
    assert not no_such_run(RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b""))


def test_a_migration_refused_for_one_temporal_lost_is_told_that_deleting_that_one_undoes_it() -> None:
    """The refusal of a Migration whose source or target another one may still undo says why that one may: not 'being
    deleted', which it is not."""
    from activities.provisioning import _why_it_may_still_undo

    assert _why_it_may_still_undo(_history_gone()) == (
        "which Temporal lost before it finished (phase Abandoned, reason HistoryGone): deleting it undoes what its "
        "steps recorded"
    )
