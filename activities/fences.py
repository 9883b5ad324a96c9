"""Which action of a Migration wrote an object last, so that a late attempt of an earlier one writes nothing over it.

The saga runs a Migration's activities one at a time, and each attempt of a step or an
undo is an activity of its own. An attempt whose worker stood still past its timeout (a
paused VM, a SIGSTOP) goes on later, while the saga has moved on: scale-down-old's, going
on after undo_scale_down_old restored the replicas, would set zero again under a Service
already pointed back at the source. The resourceVersion guard cannot stop it: its 409
makes it read again and compute its change from what the undo left. The gate
(worker/gate.py) looks only at an activity's start.

So every write of ferry to an object it changes in place (the stable Service, the source
StatefulSet) records, in the same conditional write, when Temporal scheduled the writing
activity (`activity.info().scheduled_time`: the server's clock, the same for every
attempt of one activity, later for every activity the saga schedules after it), under
the Migration's uid, in the annotation ferry.dev/fence as JSON `{"<uid>": "<time>"}`.
Before it writes, an activity that finds a time of its own Migration strictly later than
its own was overtaken: it refuses (Overtaken) and writes nothing. Its write being
conditional on the read it checked, a later fence written meanwhile is a 409 and a read
that sees it. Equal times pass (attempts of one activity); other Migrations' times are
kept, for their own late attempts, and ignored.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from temporalio import activity

from activities import kube_calls
from ferry.api.errors import Overtaken
from ferry.api.saga import MigrationRef

FENCE_ANNOTATION = "ferry.dev/fence"
"""On the objects ferry changes in place: when the latest activity of each Migration that wrote it was scheduled."""
KEPT = 16
"""Migrations whose times an object keeps, the latest: a late attempt is minutes late, not sixteen Migrations."""


def token() -> datetime:
    """When Temporal scheduled the running activity: its place among its Migration's actions."""
    return _utc(activity.info().scheduled_time)


def refuse_if_overtaken(read_object: dict[str, Any], ref: MigrationRef, doing: str) -> None:
    """Raises Overtaken when `read_object` was written by an activity of `ref`'s Migration scheduled after this one.

    `doing` says what this activity was about to do, for the message.
    """
    mine, latest = token(), _fences(kube_calls.annotations_of(read_object)).get(ref.uid)
    if latest is None or latest <= mine:
        return
    metadata = read_object["metadata"]
    raise Overtaken(
        f"refused to {doing}: this attempt was overtaken by a later action of the same Migration {ref} (uid "
        f"{ref.uid}), whose fence on {metadata['namespace']}/{metadata['name']} was scheduled at {latest.isoformat()}, "
        f"after this attempt ({mine.isoformat()}). It is a late attempt the saga has moved past (its worker stood "
        "still past its timeout), and it changed nothing. Nothing to do; if no later action of this Migration ran, "
        f"remove the entry of {ref.uid} from the annotation {FENCE_ANNOTATION} and retry."
    )


def is_fenced(read_object: dict[str, Any], ref: MigrationRef) -> bool:
    """Whether `read_object` already carries this activity's time for `ref` (an earlier write of this activity)."""
    return _fences(kube_calls.annotations_of(read_object)).get(ref.uid) == token()


def fenced_annotations(
    read_object: dict[str, Any], ref: MigrationRef, doing: str, changes: dict[str, str | None] | None = None
) -> dict[str, Any]:
    """The JSON Patch operation that writes `read_object`'s annotations as read, with `changes` (None removes a key)
    and this activity's time for `ref`; refuses first (refuse_if_overtaken). Put it in a write conditional on the
    read (kube_calls.patch_if_unchanged).

    It writes the whole map: an operation on one key fails with 422 (not 409) when a concurrent change removed the
    map, and 422 is a refusal that is not retried. Under the resourceVersion guard, a concurrent change is a 409
    either way.
    """
    refuse_if_overtaken(read_object, ref, doing)
    annotations = dict(kube_calls.annotations_of(read_object))
    for key, value in (changes or {}).items():
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value
    fences = {**_fences(annotations), ref.uid: token()}
    kept = sorted(fences.items(), key=lambda item: item[1], reverse=True)[:KEPT]
    annotations[FENCE_ANNOTATION] = json.dumps({uid: at.isoformat() for uid, at in kept}, sort_keys=True)
    return kube_calls.set_value("/metadata/annotations", annotations)


def _fences(annotations: dict[str, str]) -> dict[str, datetime]:
    """The times of the annotation by Migration uid; what is unreadable counts as absent."""
    try:
        data = json.loads(annotations.get(FENCE_ANNOTATION) or "{}")
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    found: dict[str, datetime] = {}
    for uid, text in data.items():
        try:
            found[uid] = _utc(datetime.fromisoformat(text))
        except (TypeError, ValueError):
            continue
    return found


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
