"""What a step changed on an object it does not own, recorded on the object with the uid of the Migration that did it.

switch-traffic changes the stable Service's selector, scale-down-old the source's
replicas. Each records the value from before its change in an annotation, in the same
write as the change, as JSON `{"migration": "<uid>", "selector"|"replicas": ...}`. A
retry of the step finds the record and returns the value from before, not its own
change; the undo, which may run without the step's result and for a step that did
nothing, restores the recorded value only when the record is its own Migration's.
A ferry from before the uid wrote the bare value (a JSON selector, a number): such a
record is still read, with no owner, so it serves the run that wrote it (which passes
its undo the value explicitly) and no other.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Generic, TypeVar

from ferry.api.saga import MigrationRef

PREVIOUS_SELECTOR_ANNOTATION = "ferry.dev/previous-selector"
"""On the stable Service while it points at the target: who switched it, and its selector before."""
PREVIOUS_REPLICAS_ANNOTATION = "ferry.dev/previous-replicas"
"""On the source StatefulSet while scaled down: who scaled it down, and its replicas before."""

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Record(Generic[T]):
    """A value from before a step's change, and the uid of the Migration whose step changed it."""

    value: T
    """The selector or replica count before the change."""
    migration: str | None
    """uid of the Migration that made the change; None for a record written by a ferry from before the uid."""

    def is_of(self, ref: MigrationRef) -> bool:
        """Whether the Migration `ref` made the change."""
        return self.migration == ref.uid

    def is_of_another(self, ref: MigrationRef) -> bool:
        """Whether a Migration other than `ref` is known to have made the change."""
        return self.migration is not None and self.migration != ref.uid


def switched_by(record: Record[Any] | None) -> str:
    """What a refusal quoting a selector adds when its record names the Migration that switched it; else ''."""
    return f", switched by the Migration with uid {record.migration}" if record is not None and record.migration else ""


def encode_selector(ref: MigrationRef, selector: dict[str, str]) -> str:
    return json.dumps({"migration": ref.uid, "selector": selector}, sort_keys=True)


def encode_replicas(ref: MigrationRef, replicas: int) -> str:
    return json.dumps({"migration": ref.uid, "replicas": replicas}, sort_keys=True)


def selector_record(annotations: dict[str, str]) -> Record[dict[str, str]] | None:
    """The Service's record of its selector before a switch; None when absent or unreadable."""
    data = _loads(annotations.get(PREVIOUS_SELECTOR_ANNOTATION))
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("selector"), dict) and isinstance(data.get("migration"), str):
        data, migration = data["selector"], data["migration"]
    else:
        migration = None  # the old format: the selector itself
    if not all(isinstance(key, str) and isinstance(value, str) for key, value in data.items()):
        return None
    return Record(value=dict(data), migration=migration)


def replicas_record(annotations: dict[str, str]) -> Record[int] | None:
    """The StatefulSet's record of its replicas before a scale-down; None when absent or unreadable."""
    data = _loads(annotations.get(PREVIOUS_REPLICAS_ANNOTATION))
    if isinstance(data, dict) and isinstance(data.get("migration"), str):
        replicas, migration = data.get("replicas"), data["migration"]
    else:
        replicas, migration = data, None  # the old format: the number itself
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        return None
    return Record(value=replicas, migration=migration)


def _loads(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
