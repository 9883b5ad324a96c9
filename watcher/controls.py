"""kubectl controls: annotations `ferry.dev/<control>=<who>[: <reason>]` and the spec.paused field.

A control is acted on once: the watcher sends its signal with a request id derived from
the annotation and its value (the workflow ignores an id it has seen), then records the
value in status.controls.acknowledged, so a relist does not repeat it. To give the same
control again, give it a new value, e.g. `kubectl annotate --overwrite ... ferry.dev/retry="alice: 2nd"`,
or take the annotation off and give it again: the watcher sees it go, forgets its
acknowledgement and counts it in status.controls.takenOff (`taken_off`), and the count
is part of the next one's request id and Event, so the same value given again is a new
control rather than one the saga ignores as seen. Taken off and given again while no
watcher watched, it looks unchanged and is not acted on: a new value always is.
"""

from __future__ import annotations

import dataclasses
import re

from ferry.api.migration import CONTROL_PREFIX, Migration
from ferry.api.saga import ControlRequest, Signal

SPEC_PAUSED = "spec.paused"
"""Key under which the acted-on value of spec.paused is acknowledged."""

_WHO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9@._+-]{0,62}$")
_CONTROLS = tuple(signal.value for signal in Signal)
"""Each control is the signal (and update) of that name."""
FORMAT = "'<who>' or '<who>: <reason>', where <who> is a name of up to 63 letters, digits or @._+-"


@dataclasses.dataclass(frozen=True)
class Control:
    """A control to send to the workflow."""

    key: str
    """The annotation (or spec.paused) that asked for it."""
    value: str
    """Its value, as acknowledged once acted on."""
    signal: Signal
    request: ControlRequest
    occurrence: int = 0
    """How often the annotation was taken off before it was given this time (status.controls.takenOff)."""

    @property
    def event_key(self) -> str:
        return _event_key(self.key, self.value, self.occurrence)


@dataclasses.dataclass(frozen=True)
class Rejection:
    """An annotation that cannot be acted on; recorded as a Warning Event and in status."""

    key: str
    value: str
    why: str
    occurrence: int = 0

    @property
    def event_key(self) -> str:
        return _event_key(self.key, self.value, self.occurrence)


def _event_key(key: str, value: str, occurrence: int) -> str:
    """What names one giving of a control: its request id, and the key of its Event (recorded once per key)."""
    return f"{key}={value}" + (f"#{occurrence}" if occurrence else "")


def taken_off(migration: Migration) -> list[str]:
    """The control annotations ferry acknowledged that are no longer on the Migration: taken off since."""
    controls = migration.status.controls
    if controls is None:
        return []
    annotations = migration.metadata.annotations
    return sorted(key for key in controls.acknowledged if key.startswith(CONTROL_PREFIX) and key not in annotations)


def pending(migration: Migration) -> list[Control | Rejection]:
    """The controls of a Migration not yet acknowledged in its status, in a stable order."""
    metadata, status = migration.metadata, migration.status
    generation = metadata.generation
    acknowledged = status.controls.acknowledged if status.controls else {}
    counted = status.controls.taken_off if status.controls else {}
    found: list[Control | Rejection] = []
    for key, value in sorted(metadata.annotations.items()):
        if not key.startswith(CONTROL_PREFIX) or acknowledged.get(key) == value:
            continue
        found.append(_parse(key, value, generation, counted.get(key, 0)))
    paused = migration.spec is not None and migration.spec.paused
    of_spec = spec_generation(migration)
    value = f"{str(paused).lower()}@{of_spec}"
    observed = status.observed_generation
    # spec.paused is a control only when it changed after the workflow last saw the spec:
    # the workflow reads it from its input at start, and reports what it saw as
    # status.observedGeneration.
    if observed is not None and of_spec > observed and acknowledged.get(SPEC_PAUSED) != value:
        request = ControlRequest(
            by="spec.paused", reason=f"spec.paused set to {str(paused).lower()}", generation=of_spec,
            request_id=f"{SPEC_PAUSED}={value}", of_spec=True,
        )  # fmt: skip
        found.append(Control(SPEC_PAUSED, value, Signal.PAUSE if paused else Signal.RESUME, request))
    return _unseen_until_sent(_pause_over_resume(found))


def spec_generation(migration: Migration) -> int:
    """The generation of the Migration's spec: metadata.generation, less the one the deletion added, if any.

    The API server adds one to the generation of an object held by finalizers when it marks it as being deleted
    (once: a second delete finds deletionTimestamp set and adds nothing), though the spec stays as it was. Taken as
    a change of spec, that step would make a deletion answer a spec.paused nobody touched (`InvalidControl`,
    "spec.paused refused: the Migration is being deleted"). A spec.paused changed just before the deletion, and not
    yet sent, still counts: its generation is above the one the saga observed, and the deletion refuses it, saying
    so. Only spec.paused may change in a spec (the CRD refuses a change of the rest), so every generation above the
    saga's observedGeneration but the deletion's is a change of it, or an edit that put it back as it was.
    """
    generation = migration.metadata.generation
    if migration.metadata.deletion_timestamp is not None and generation > 1:
        return generation - 1
    return generation


def _unseen_until_sent(found: list[Control | Rejection]) -> list[Control | Rejection]:
    """While a change of spec.paused waits to be sent, the other controls do not carry the generation: the saga
    would take it as seen, and if the change then failed to reach it, the next pass would find nothing newer than
    the saga's observedGeneration and drop the change without a word. A change refused here (a Rejection) is
    answered, so the other controls carry the generation that answers it."""
    if not any(isinstance(item, Control) and item.key == SPEC_PAUSED for item in found):
        return found
    return [
        dataclasses.replace(item, request=item.request.model_copy(update={"generation": None}))
        if isinstance(item, Control) and item.key != SPEC_PAUSED
        else item
        for item in found
    ]


def _pause_over_resume(found: list[Control | Rejection]) -> list[Control | Rejection]:
    """A pause and a resume both waiting (given while the watcher could not act: Temporal away, no worker) say
    nothing of which came last, and annotations keep no order. The pause is acted on, and the resume refused, saying
    so: acting on both could let the saga start its next step between them, against a pause given last."""
    if not any(isinstance(item, Control) and item.signal is Signal.PAUSE for item in found):
        return found
    return [
        _refused_resume(item) if isinstance(item, Control) and item.signal is Signal.RESUME else item for item in found
    ]


def _refused_resume(resume: Control) -> Rejection:
    again = (
        f"{CONTROL_PREFIX}{Signal.RESUME.value}=<who>"
        if resume.key == SPEC_PAUSED
        else f"{resume.key}='{resume.request.by}: again'"
    )
    return Rejection(
        resume.key,
        resume.value,
        f"{resume.key} came with a pause not yet acted on, and which of the two came last is unknown: ferry pauses. "
        f"To go on, give resume again (kubectl annotate --overwrite ... {again})",
        resume.occurrence,
    )


def _parse(key: str, value: str, generation: int, occurrence: int) -> Control | Rejection:
    name = key[len(CONTROL_PREFIX) :]
    if name not in _CONTROLS:
        why = f"{key} is not a control ferry knows; use one of {', '.join(_CONTROLS)}"
        return Rejection(key, value, why, occurrence)
    who, _, reason = value.partition(":")
    who, reason = who.strip(), reason.strip()
    if not _WHO.match(who) or len(reason) > 256:
        return Rejection(key, value, f"{key}={value!r} is not valid; the value must be {FORMAT}", occurrence)
    request_id = _event_key(key, value, occurrence)
    request = ControlRequest(by=who, reason=reason, generation=generation, request_id=request_id)
    return Control(key, value, Signal(name), request, occurrence)
