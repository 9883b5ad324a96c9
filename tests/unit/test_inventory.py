"""What the watcher keeps of each Migration between passes: a summary, and the object only while it has work."""

from __future__ import annotations

from typing import Any

from ferry.api.migration import FINALIZER, Migration, Phase
from tests import samples
from watcher.inventory import Inventory, Summary, keep


def migration(
    name: str, namespace: str = "shop", *, finalizers: tuple[str, ...] = (FINALIZER,), **status: Any
) -> Migration:
    raw = samples.migration(name)
    raw["metadata"] = {
        "name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1, "resourceVersion": "1",
        "finalizers": list(finalizers),
    }  # fmt: skip
    return Migration.parse({**raw, "status": status})


def started(name: str, phase: str, namespace: str = "shop", **status: Any) -> Migration:
    workflow = {"namespace": "default", "id": f"migration/{namespace}/{name}/uid-{name}"}
    return migration(name, namespace, phase=phase, workflow=workflow, **status)


def test_a_list_keeps_only_a_summary_of_migrations_that_need_nothing() -> None:
    finished, waiting = keep(started("done", "Succeeded")), keep(started("paused", "Paused"))

    assert finished.migration is None
    assert waiting.migration is None
    assert finished.summary == Summary(uid="uid-done", phase=Phase.SUCCEEDED)
    assert waiting.summary == Summary(uid="uid-paused", phase=Phase.PAUSED)


def test_a_list_keeps_the_whole_object_of_a_migration_a_pass_has_work_for() -> None:
    new = migration("new")
    without_finalizer = started("running", "Running", finalizers=())

    assert keep(new).migration is new
    assert keep(without_finalizer).migration is without_finalizer


def test_the_summary_names_the_running_step_and_when_it_started() -> None:
    steps = [
        {"name": "precheck", "state": "Succeeded"},
        {"name": "provision", "state": "Running", "startedAt": "2026-11-22T12:00:00Z"},
    ]

    summary = keep(started("busy", "Running", currentStep="provision", steps=steps)).summary

    assert (summary.step, summary.step_started) == ("provision", 1795348800.0)
    assert keep(started("waits", "Paused", currentStep="provision", steps=steps)).summary.step is None


def test_only_unfinished_migrations_are_named_among_runs_ended_from_outside() -> None:
    inventory = Inventory()
    inventory.replace("shop", [keep(started("done", "Succeeded")), keep(started("paused", "Paused"))])
    inventory.update(started("running", "Running"))

    ended = [
        "migration/shop/done/uid-done",  # finished already: its status says how it ended
        "migration/shop/paused/uid-paused",
        "migration/shop/running/uid-earlier",  # a Migration of the same name before this one
        "migration/shop/gone/uid-gone",  # not known here
        "cleanup/shop/running/uid-running",  # not a migration run
    ]

    assert [ref.name for ref in inventory.unfinished_among(ended)] == ["paused"]


def test_a_list_of_one_namespace_replaces_only_what_was_known_of_that_namespace() -> None:
    inventory = Inventory()
    inventory.replace("shop", [keep(started("a", "Succeeded")), keep(started("b", "Succeeded"))])
    inventory.replace("billing", [keep(started("c", "Paused", namespace="billing"))])
    inventory.update(started("b", "Succeeded"), gone=True)

    inventory.replace("shop", [keep(started("d", "Succeeded"))])

    assert sorted(key for key, _ in inventory.items()) == [("billing", "c"), ("shop", "d")]
