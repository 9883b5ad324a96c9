"""When an entry of ferry's per-Migration records was written, and which entries a record keeps: the newest.

ferry.unfrozen_by (freezing) and ferry.replication_ended (replication_ended) are database
settings holding a JSON object with an entry per Migration, each stamped with when it was
written ("at"). Each keeps only its newest entries, so that it stays small; each is read
and written again in one transaction, under a lock of its own module's.

The stamp is the server's clock in one form, whatever the session's TimeZone and
DateStyle (a role or a database may set either): UTC, ISO 8601 (`STAMP`). An older ferry
wrote `now()::text`, which follows them, and kept the entries whose text sorted largest:
an entry written in America/New_York sorted below one written in UTC hours before it, one
in DateStyle SQL (05/06/2026 ...) below both, so a new entry could be pruned as it was
written, and the late attempt it was there to refuse went through. So entries are ordered
by the time their stamp names (`written_at`): an older ferry's in DateStyle ISO names its
zone's offset, and reads exactly; one that cannot be read (DateStyle SQL, German or
Postgres name the zone by an abbreviation, which may mean several offsets) counts as older
than any that can, so it never pushes out a newer entry. And the entry being written is
kept whatever its stamp says (`newest`), so neither the server's clock stepped back nor
an unreadable neighbour prunes it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from activities.postgres.connection import Connection

STAMP = """select to_char(clock_timestamp() at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
"""The server's clock, e.g. 2026-05-06T10:00:00.123456Z: the same text in every session."""
UNREADABLE = datetime.min.replace(tzinfo=UTC)
"""When an entry whose stamp cannot be read counts as written: before any other."""

Entry = TypeVar("Entry")


def stamp(conn: Connection) -> str:
    """Now, by the clock of `conn`'s server, as `STAMP` writes it. Read after the caller's lock is taken, it orders
    the entries written under that lock as they were written (`now()` is when the transaction began)."""
    row = conn.execute(STAMP).fetchone()
    assert row is not None
    return str(row[0])


def written_at(at: object) -> datetime:
    """When an entry stamped `at` was written: `STAMP`'s form, or an older ferry's in DateStyle ISO
    (2026-05-06 06:00:00.123456-04); UNREADABLE for anything else, or a time that names no offset."""
    if not isinstance(at, str):
        return UNREADABLE
    try:
        when = datetime.fromisoformat(at)
    except ValueError:
        return UNREADABLE
    return UNREADABLE if when.tzinfo is None else when


def newest(entries: dict[str, Entry], at: Callable[[Entry], object], count: int, current: str) -> dict[str, Entry]:
    """The `count` newest of `entries` by `written_at` of their stamps (`at`); `current`, the entry being written,
    always among them."""
    others = sorted(
        ((key, entry) for key, entry in entries.items() if key != current),
        key=lambda item: (written_at(at(item[1])), str(at(item[1]))),
    )
    room = max(count - 1, 0)
    return {**dict(others[max(len(others) - room, 0) :]), current: entries[current]}
