"""Which objects are a Migration's: ferry decides by the Migration's uid, never by its name.

A Migration deleted and applied again (GitOps does this) has the same name and a new
uid. Deciding by name, the second run took the first one's live target for its own
and, on rollback, deleted it with its volumes. So every object ferry creates (the
target StatefulSet, its headless Service, its Pods and claims through the templates)
carries the uid of the Migration that created it in MIGRATION_UID_LABEL, and ferry
changes or deletes an object only when that uid is its own Migration's. The name
label stays, for people. Objects made by a ferry from before the uid label carry only
the name label: no Migration can prove they are its own, so they are never taken over
nor deleted, only named in refusals and warnings.
"""

from __future__ import annotations

from typing import Any

from ferry.api.migration import MANAGED_BY_LABEL, MIGRATION_LABEL, MIGRATION_UID_LABEL
from ferry.api.saga import MigrationRef

MANAGED_BY = "ferry"


def object_labels(ref: MigrationRef) -> dict[str, str]:
    """Labels of every object ferry creates for the Migration `ref`."""
    return {MANAGED_BY_LABEL: MANAGED_BY, MIGRATION_LABEL: ref.name, MIGRATION_UID_LABEL: ref.uid}


def labels_of(obj: Any) -> dict[str, str]:
    """The labels of an object read as raw JSON (a dict) or as one of the client's models."""
    if obj is None:
        return {}
    if isinstance(obj, dict):
        found: dict[str, str] = (obj.get("metadata") or {}).get("labels") or {}
        return found
    return dict(obj.metadata.labels or {})


def name_of(obj: Any) -> str:
    if isinstance(obj, dict):
        return str(obj["metadata"]["name"])
    return str(obj.metadata.name)


def belongs_to(obj: Any, ref: MigrationRef) -> bool:
    """Whether ferry created `obj` for the Migration `ref`: its uid label is that Migration's uid."""
    return labels_of(obj).get(MIGRATION_UID_LABEL) == ref.uid


def owner(obj: Any) -> str:
    """Whose `obj` is, in words, for refusals and warnings."""
    labels = labels_of(obj)
    uid, name = labels.get(MIGRATION_UID_LABEL), labels.get(MIGRATION_LABEL)
    if uid:
        return f"another Migration, {name!r} (uid {uid})"
    if name:
        return (
            f"an older ferry for a Migration named {name!r} (it has only the name label {MIGRATION_LABEL}, "
            "so no Migration can prove it is its own)"
        )
    return "someone other than ferry"


def own_selector(ref: MigrationRef, **labels: str) -> str:
    """A label selector for objects of the Migration `ref`, narrowed by `labels`."""
    pairs = {MIGRATION_UID_LABEL: ref.uid, **labels}
    return ",".join(f"{key}={value}" for key, value in sorted(pairs.items()))
