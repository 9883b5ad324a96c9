"""kubectl controls as the watcher reads them: annotations `ferry.dev/<control>=<who>[: <reason>]` and spec.paused."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ferry.api.migration import Migration
from ferry.api.saga import MAX_GENERATION, ControlRequest, Signal
from tests import samples
from watcher import controls


def migration(annotations: dict[str, str], *, generation: int = 1, **status: Any) -> Migration:
    raw = samples.migration("m", paused=status.pop("paused", False))
    raw["metadata"] = {
        "name": "m",
        "namespace": "shop",
        "uid": "u",
        "generation": generation,
        "annotations": annotations,
    }
    return Migration.parse({**raw, "status": status})


def test_a_control_names_who_asked_and_why() -> None:
    [control] = controls.pending(migration({"ferry.dev/rollback": "alice: wrong target"}))

    assert isinstance(control, controls.Control)
    assert control.signal is Signal.ROLLBACK
    assert (control.request.by, control.request.reason) == ("alice", "wrong target")
    assert control.request.request_id == "ferry.dev/rollback=alice: wrong target"


def test_an_acknowledged_value_is_not_sent_again_but_a_new_value_is() -> None:
    acked = {"controls": {"acknowledged": {"ferry.dev/retry": "bob"}}}

    assert controls.pending(migration({"ferry.dev/retry": "bob"}, **acked)) == []
    [again] = controls.pending(migration({"ferry.dev/retry": "bob: 2nd"}, **acked))
    assert isinstance(again, controls.Control)


def test_a_control_taken_off_is_found_and_given_again_it_is_a_new_request() -> None:
    acked = {"ferry.dev/retry": "bob", "ferry.dev/pause": "bob", "spec.paused": "true@2"}

    off = migration({"ferry.dev/pause": "bob"}, controls={"acknowledged": acked})
    assert controls.taken_off(off) == ["ferry.dev/retry"], "spec.paused is no annotation, and pause is still there"
    assert controls.pending(off) == []

    again = migration({"ferry.dev/retry": "bob"}, controls={"acknowledged": {}, "takenOff": {"ferry.dev/retry": 2}})
    [retry] = controls.pending(again)
    assert isinstance(retry, controls.Control)
    assert retry.request.request_id == retry.event_key == "ferry.dev/retry=bob#2"
    assert controls.taken_off(again) == []


def test_a_bad_value_given_again_after_it_was_taken_off_is_answered_again() -> None:
    again = migration({"ferry.dev/retry": "no good!"}, controls={"takenOff": {"ferry.dev/retry": 1}})

    [refused] = controls.pending(again)
    assert isinstance(refused, controls.Rejection)
    assert refused.event_key == "ferry.dev/retry=no good!#1"


def test_unknown_controls_and_bad_values_are_rejected_with_the_reason() -> None:
    found = controls.pending(migration({"ferry.dev/rolback": "alice", "ferry.dev/approve": "not valid!"}))

    assert all(isinstance(item, controls.Rejection) for item in found)
    whys = sorted(item.why for item in found if isinstance(item, controls.Rejection))
    assert whys[0].startswith("ferry.dev/approve='not valid!' is not valid")
    assert whys[1].startswith("ferry.dev/rolback is not a control ferry knows")


def test_a_pause_and_a_resume_waiting_together_pause_and_the_resume_is_refused_saying_how_to_give_it_again() -> None:
    found = controls.pending(migration({"ferry.dev/resume": "alice", "ferry.dev/pause": "bob: hold on"}))

    [pause] = [item for item in found if isinstance(item, controls.Control)]
    [resume] = [item for item in found if isinstance(item, controls.Rejection)]
    assert pause.signal is Signal.PAUSE
    assert (resume.key, resume.value) == ("ferry.dev/resume", "alice")
    assert "which of the two came last is unknown: ferry pauses" in resume.why
    assert "ferry.dev/resume='alice: again'" in resume.why


def test_spec_paused_set_to_false_beside_a_waiting_pause_is_refused_too() -> None:
    found = controls.pending(migration({"ferry.dev/pause": "bob"}, generation=3, paused=False, observedGeneration=2))

    assert [(type(item).__name__, item.key) for item in found] == [
        ("Control", "ferry.dev/pause"),
        ("Rejection", controls.SPEC_PAUSED),
    ]
    rejection = found[1]
    assert isinstance(rejection, controls.Rejection)
    assert rejection.why.endswith("(kubectl annotate --overwrite ... ferry.dev/resume=<who>)")


def test_a_resume_alone_is_sent() -> None:
    acked = {"controls": {"acknowledged": {"ferry.dev/pause": "bob"}}}

    [resume] = controls.pending(migration({"ferry.dev/pause": "bob", "ferry.dev/resume": "alice"}, **acked))

    assert isinstance(resume, controls.Control)
    assert resume.signal is Signal.RESUME


def test_other_annotations_are_not_controls() -> None:
    assert controls.pending(migration({"kubectl.kubernetes.io/last-applied-configuration": "{}"})) == []


def test_spec_paused_is_a_control_only_once_the_run_saw_an_older_generation() -> None:
    assert controls.pending(migration({}, generation=1, paused=True)) == []
    [pause] = controls.pending(migration({}, generation=2, paused=True, observedGeneration=1))

    assert isinstance(pause, controls.Control)
    assert pause.signal is Signal.PAUSE
    assert pause.value == "true@2"


def test_other_controls_do_not_carry_the_generation_while_a_change_of_spec_paused_waits_to_be_sent() -> None:
    """Sent first, an approve carrying generation 2 would make the saga's observedGeneration 2; had the pause then
    failed to reach it, the next pass would find nothing newer and drop the pause without a word."""
    found = controls.pending(migration({"ferry.dev/approve": "alice"}, generation=2, paused=True, observedGeneration=1))

    [approve, pause] = found
    assert isinstance(approve, controls.Control)
    assert isinstance(pause, controls.Control)
    assert approve.request.generation is None
    assert (pause.key, pause.request.generation, pause.request.of_spec) == (controls.SPEC_PAUSED, 2, True)


def test_other_controls_carry_the_generation_when_spec_paused_has_nothing_to_send() -> None:
    [approve] = controls.pending(migration({"ferry.dev/approve": "alice"}, generation=2, observedGeneration=2))

    assert isinstance(approve, controls.Control)
    assert approve.request.generation == 2
    assert not approve.request.of_spec


# --- the generation a control carries ---------------------------------------------------------------


@pytest.mark.parametrize("generation", [10**20, 2**63, 2**53, -1])
def test_a_control_carrying_a_generation_no_migration_can_have_is_refused_saying_so(generation: int) -> None:
    """A signal sent by hand (tctl, temporal CLI) with such a generation is dropped: kept as the largest seen, it would
    make the watcher ignore every later spec.paused, and from 2^63 on the API server refuse every status write."""
    with pytest.raises(ValidationError, match=r"a Migration's generation is from 0 to 2\^53 - 1"):
        ControlRequest.model_validate({"by": "tctl-user", "generation": generation})


def test_every_generation_a_migration_can_have_is_taken() -> None:
    assert ControlRequest(generation=MAX_GENERATION).generation == MAX_GENERATION
    assert ControlRequest(generation=1).generation == 1
    assert ControlRequest().generation is None
