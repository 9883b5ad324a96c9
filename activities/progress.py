"""How far a data step is, in numbers and in words: what its activity writes into status.progress.

Pure: a `Meter` takes the counts the activity reaches (bytes dumped or restored, rows
compared) with the time it reached them, and says the throughput over a moving window,
the time left when a total is known, and a one-line summary such as
`migrate: 412 MiB of 1.2 GiB, 38 MiB/s, ~21s left`. It also decides when a new write is
due (`due`): at most one per interval, and none while it would say what the last one
said. A step that stalls (pg_restore building indexes after its last byte) still gets
writes while its throughput falls over the window, until it says 0 B/s; then none. The
clock is the caller's, so tests give it one of their own instead of sleeping.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Protocol

WINDOW = 30.0
"""Seconds of samples the throughput is measured over: recent enough to follow a change of pace, long enough to be
steady between two parts or two tables."""
STEADY = 1.0
"""Below this many seconds since the attempt started, there is no throughput to speak of yet."""
BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
COUNT_UNITS = ("", "k", "M", "G", "T")


class Counts(Protocol):
    """What a data step counts its progress into (a ProgressWriter, or a share of a total)."""

    def update(
        self,
        *,
        bytes_done: int | None = None,
        bytes_total: int | None = None,
        rows_done: int | None = None,
        rows_total: int | None = None,
    ) -> None: ...


@dataclasses.dataclass(frozen=True)
class Reading:
    """Counts at one moment; None where the step does not count that kind."""

    at: float
    """The meter's clock (seconds, monotonic)."""
    bytes_done: int | None = None
    bytes_total: int | None = None
    rows_done: int | None = None
    rows_total: int | None = None


@dataclasses.dataclass(frozen=True)
class Figures:
    """A reading with what follows from it: throughput and time left."""

    step: str
    reading: Reading
    bytes_per_second: float | None
    rows_per_second: float | None
    seconds_left: int | None
    attempt: int | None = None

    @property
    def summary(self) -> str:
        return summary(self)


class Meter:
    """The counts of one attempt of a step; thread-safe (the activity counts, a writer thread reads)."""

    def __init__(self, step: str, interval: float, now: float) -> None:
        self.step = step
        self._interval = interval
        self._lock = threading.Lock()
        self._latest = Reading(at=now, bytes_done=None, rows_done=None)
        self._samples: collections.deque[Reading] = collections.deque([Reading(at=now, bytes_done=0, rows_done=0)])
        self._written: Figures | None = None
        self._written_at: float | None = None

    def update(
        self,
        now: float,
        *,
        bytes_done: int | None = None,
        bytes_total: int | None = None,
        rows_done: int | None = None,
        rows_total: int | None = None,
    ) -> None:
        """Records counts reached at `now`; a count left out keeps its last value."""
        with self._lock:
            last = self._latest
            self._latest = Reading(
                at=now,
                bytes_done=last.bytes_done if bytes_done is None else bytes_done,
                bytes_total=last.bytes_total if bytes_total is None else bytes_total,
                rows_done=last.rows_done if rows_done is None else rows_done,
                rows_total=last.rows_total if rows_total is None else rows_total,
            )
            self._samples.append(self._latest)
            # Keep one sample older than the window, the baseline the window's rate starts from.
            while len(self._samples) > 2 and self._samples[1].at <= now - WINDOW:
                self._samples.popleft()

    def figures(self, now: float) -> Figures:
        with self._lock:
            latest = self._latest
            # The window starts at the newest sample that is at least WINDOW old, else at the attempt's start.
            oldest = next((s for s in reversed(self._samples) if s.at <= now - WINDOW), self._samples[0])
        elapsed = now - oldest.at
        bytes_rate = _rate(oldest.bytes_done, latest.bytes_done, elapsed)
        rows_rate = _rate(oldest.rows_done, latest.rows_done, elapsed)
        left = _left(latest.bytes_done, latest.bytes_total, bytes_rate)
        if left is None:
            left = _left(latest.rows_done, latest.rows_total, rows_rate)
        return Figures(self.step, latest, bytes_rate, rows_rate, left)

    def due(self, now: float) -> Figures | None:
        """The figures to write now, or None: nothing counted yet, the last write is less than an interval old, or
        it said the same. Whoever writes what it returns calls `written` afterwards."""
        with self._lock:
            latest, written, written_at = self._latest, self._written, self._written_at
        if latest.bytes_done is None and latest.rows_done is None:
            return None
        if written_at is not None and now - written_at < self._interval:
            return None
        figures = self.figures(now)
        if written is not None and _said(written) == _said(figures):
            return None
        return figures

    def written(self, figures: Figures, now: float) -> None:
        with self._lock:
            self._written, self._written_at = figures, now


def _said(figures: Figures) -> tuple[object, ...]:
    reading = figures.reading
    return reading.bytes_done, reading.bytes_total, reading.rows_done, reading.rows_total, figures.summary


def _rate(before: int | None, after: int | None, seconds: float) -> float | None:
    if before is None or after is None or seconds < STEADY:
        return None
    return max(0.0, (after - before) / seconds)


def _left(done: int | None, total: int | None, rate: float | None) -> int | None:
    if done is None or total is None or not rate:
        return None
    return max(0, round((total - done) / rate))


def size(count: float, units: tuple[str, ...] = BINARY_UNITS, base: int = 1024) -> str:
    """`412 MiB`, `1.2 GiB`, `950 B`: one decimal below 10, none above."""
    value, unit = float(count), 0
    while value >= base and unit < len(units) - 1:
        value /= base
        unit += 1
    shown = f"{value:.1f}" if value < 10 and unit else f"{value:.0f}"
    return f"{shown} {units[unit]}" if units is BINARY_UNITS else f"{shown}{units[unit]}"


def rows(count: float) -> str:
    """`950`, `12k`, `1.2M`."""
    return size(count, COUNT_UNITS, 1000)


def duration(seconds: int) -> str:
    """`21s`, `3m05s`, `1h02m`."""
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def summary(figures: Figures) -> str:
    """One line for people: `migrate: 412 MiB of 1.2 GiB, 38 MiB/s, ~21s left`, `verify: 120k of 600k rows, ...`."""
    reading = figures.reading
    parts = []
    if reading.bytes_done is not None:
        total = f" of {size(reading.bytes_total)}" if reading.bytes_total is not None else ""
        parts.append(f"{size(reading.bytes_done)}{total}")
        if figures.bytes_per_second is not None:
            parts.append(f"{size(figures.bytes_per_second)}/s")
    if reading.rows_done is not None:
        total = f" of {rows(reading.rows_total)}" if reading.rows_total is not None else ""
        parts.append(f"{rows(reading.rows_done)}{total} rows")
        if figures.rows_per_second is not None:
            parts.append(f"{rows(figures.rows_per_second)} rows/s")
    if figures.seconds_left is not None:
        parts.append(f"~{duration(figures.seconds_left)} left")
    attempt = f" (attempt {figures.attempt})" if figures.attempt is not None and figures.attempt > 1 else ""
    return f"{figures.step}{attempt}: {', '.join(parts)}"
