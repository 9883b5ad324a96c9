"""What the watcher keeps of each Migration between passes: a few fields, never the object.

A pass handles the latest state of a Migration, then the watcher lets it go. What
outlives the pass is a Summary per Migration, for two uses: the gauges (Migrations by
phase, when the running step started, since when a deletion waits), and the resync's
questions: whether a run Temporal says ended from outside belongs to an unfinished
Migration, and which unfinished Migrations' runs it does not list as Running. A list
keeps the whole object only of the Migrations a pass has work for (`keep`, run in the
thread that parsed the list), so ten thousand finished Migrations cost the watcher a few
megabytes, whatever their status holds.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Iterator
from datetime import datetime

from ferry.api.migration import Migration, Phase
from ferry.api.saga import MigrationRef, workflow_id
from watcher.decisions import decide

Key = tuple[str, str]
"""A Migration's namespace and name."""


@dataclasses.dataclass(frozen=True, slots=True)
class Summary:
    """The little the watcher keeps of one Migration."""

    uid: str
    phase: Phase | None
    step: str | None = None
    """The step running or being undone (phase Running or RollingBack); None otherwise."""
    step_started: float = 0.0
    """When that step started (seconds since the epoch), 0 if unknown."""
    deletion_since: float = 0.0
    """Since when a deleted Migration waits for ferry (status.deletion), 0 when it does not."""
    deleting: bool = False
    """Its deletion was asked for (deletionTimestamp): the deletion handler, not the resync, looks at its run."""

    @property
    def finished(self) -> bool:
        return self.phase is not None and self.phase.finished


def key_of(migration: Migration) -> Key:
    return (migration.metadata.namespace, migration.metadata.name)


def summarize(migration: Migration) -> Summary:
    status = migration.status
    step = status.current_step if status.phase in (Phase.RUNNING, Phase.ROLLING_BACK) else None
    entry = next((s for s in status.steps if s.name == step), None) if step else None
    return Summary(
        uid=migration.metadata.uid,
        phase=status.phase,
        step=step,
        step_started=_timestamp(entry.started_at if entry else None),
        deletion_since=_timestamp(status.deletion.waiting_since if status.deletion else None),
        deleting=migration.metadata.deletion_timestamp is not None,
    )


def _timestamp(moment: datetime | None) -> float:
    return moment.timestamp() if moment else 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Listed:
    """One Migration of a list, as the watcher keeps it."""

    key: Key
    summary: Summary
    migration: Migration | None
    """The whole object only when a pass has work for it; None when decide() says `nothing`."""


def keep(migration: Migration) -> Listed:
    """What a list keeps of one Migration: its summary, and the object itself only if a pass has work for it."""
    namespace, name = key_of(migration)
    wanted = None if decide(migration).nothing else migration
    return Listed((sys.intern(namespace), name), summarize(migration), wanted)


class Inventory:
    """The summaries of every Migration in the watcher's scope, kept current by its lists and watch events."""

    def __init__(self) -> None:
        self._summaries: dict[Key, Summary] = {}

    def __len__(self) -> int:
        return len(self._summaries)

    def get(self, key: Key) -> Summary | None:
        return self._summaries.get(key)

    def items(self) -> Iterator[tuple[Key, Summary]]:
        return iter(self._summaries.items())

    def replace(self, namespace: str | None, listed: Iterable[Listed]) -> None:
        """A full list of `namespace` (None: of all namespaces) replaces what was known of it."""
        if namespace is None:
            self._summaries.clear()
        else:
            for key in [key for key in self._summaries if key[0] == namespace]:
                del self._summaries[key]
        self._summaries.update((item.key, item.summary) for item in listed)

    def update(self, migration: Migration, *, gone: bool = False) -> None:
        """A watch event: the Migration's new state, or `gone`."""
        if gone:
            self._summaries.pop(key_of(migration), None)
        else:
            self._summaries[key_of(migration)] = summarize(migration)

    def unfinished_among(self, workflow_ids: Iterable[str]) -> list[MigrationRef]:
        """The Migrations, still unfinished, whose workflow has one of these IDs (as the resync's query returns)."""
        found = []
        for workflow in workflow_ids:
            parts = workflow.split("/")
            if len(parts) != 4:
                continue
            namespace, name, uid = parts[1:]
            summary = self._summaries.get((namespace, name))
            if summary is None or summary.uid != uid or summary.finished:
                continue
            ref = MigrationRef(namespace=namespace, name=name, uid=uid)
            if workflow_id(ref) == workflow:
                found.append(ref)
        return found

    def unfinished_not_among(self, running: Iterable[str]) -> list[MigrationRef]:
        """The Migrations whose status names a run (the saga wrote a phase), unfinished and not being deleted, whose
        workflow has none of these IDs (the runs visibility lists as Running): each may have lost its run."""
        listed = frozenset(running)
        found = []
        for (namespace, name), summary in self._summaries.items():
            if summary.phase is None or summary.finished or summary.deleting:
                continue
            ref = MigrationRef(namespace=namespace, name=name, uid=summary.uid)
            if workflow_id(ref) not in listed:
                found.append(ref)
        return found
