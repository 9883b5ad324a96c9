"""What the worker's own status writes of a Migration left it at, so that its next write need not read it first.

A read the worker made anyway (the gate's, worker/gate.py) counts too, when nothing newer
is known: a run's first status write then needs no read of its own.

A worker has two writers of a Migration's status: mirror_status (the saga's fields) and
the progress writer (status.progress), each an apply conditional on a resourceVersion
known to be the Migration's. They share one `KnownVersions`, so each write's answer is
the version the other writes on next: a progress write followed by a transition costs
one request, not a 409, a read and a write.

The cache is only a shortcut. A write carrying a known version lands only on the object
exactly as it was at that version (resourceVersions are never reused, not even by a
Migration re-created under the same name), so whatever is computed from a known version
is as fresh as a read's; a stale one costs a 409 and a read, a forgotten one a read.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

KNOWN_VERSIONS = 4096
"""Migrations whose latest written resourceVersion a worker keeps; a Migration past that costs one read more."""


@dataclasses.dataclass(frozen=True)
class KnownVersion:
    """One resourceVersion of a Migration, and what its status writers take from the object at that version."""

    resource_version: str
    """What a write conditional on this version carries in metadata.resourceVersion."""
    attempts: Mapping[str, int]
    """status.steps[].attempts by step name: the attempt the progress writer says its step is at."""
    shows_progress: bool
    """Whether status.progress is there, which the progress writer removes when its step ends."""
    transitioned_at: str | None = None
    """status.transitionedAt as stored: mirror_status writes no status of a transition older than this."""
    phase: str | None = None
    """status.phase, and the two below: whether status.progress is left over from a step no longer running."""
    current_step: str | None = None
    progress_step: str | None = None

    @classmethod
    def of(cls, migration: dict[str, Any]) -> KnownVersion:
        """What a Migration, as the API server sent it (a read's or a write's answer), says."""
        status: dict[str, Any] = migration.get("status") or {}
        steps: list[dict[str, Any]] = status.get("steps") or []
        return cls(
            resource_version=migration["metadata"]["resourceVersion"],
            attempts={step["name"]: step.get("attempts") or 0 for step in steps if "name" in step},
            shows_progress="progress" in status,
            transitioned_at=status.get("transitionedAt"),
            phase=status.get("phase"),
            current_step=status.get("currentStep"),
            progress_step=(status.get("progress") or {}).get("step"),
        )


class KnownVersions:
    """Per Migration uid, the version this worker's last status write of it produced (thread-safe, bounded).

    One per worker process, shared by its status writers; see the module's docstring for
    why no write depends on it.
    """

    def __init__(self, limit: int = KNOWN_VERSIONS) -> None:
        self._limit = limit
        self._versions: OrderedDict[str, KnownVersion] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, uid: str) -> KnownVersion | None:
        with self._lock:
            return self._versions.get(uid)

    def remember(self, written: dict[str, Any]) -> None:
        """Keeps the version of a Migration as a status write's answer carries it, under that object's own uid."""
        self._keep(written, replace=True)

    def learn(self, read: dict[str, Any]) -> None:
        """Keeps the version a read of a Migration found, unless one is known already: resourceVersions do not say
        which is newer, and a write's answer known since the read was sent may be."""
        self._keep(read, replace=False)

    def _keep(self, migration: dict[str, Any], *, replace: bool) -> None:
        known = KnownVersion.of(migration)
        uid: str = migration["metadata"]["uid"]
        with self._lock:  # the check and the change at once: a write's answer kept meanwhile is not replaced
            if not replace and uid in self._versions:
                return
            self._versions[uid] = known
            self._versions.move_to_end(uid)
            while len(self._versions) > self._limit:
                self._versions.popitem(last=False)

    def forget(self, uid: str, resource_version: str) -> None:
        """Drops `resource_version` after a write carrying it failed; a newer version another write left is kept."""
        with self._lock:
            known = self._versions.get(uid)
            if known is not None and known.resource_version == resource_version:
                del self._versions[uid]
