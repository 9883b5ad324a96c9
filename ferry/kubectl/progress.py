"""The live step table of one Migration: each step with its state, time and attempts, a bar for data steps.

What it shows comes from where a person would look: the Migration's status (phase,
steps, and status.progress, which snapshot, migrate and verify write every few seconds:
bytes or rows done, throughput, time left) and, for a running step without it, the
heartbeat details of its activity in Temporal (bytes dumped, uploaded or restored;
tables checked). Rendering is a pure function of those and the clock, so `kubectl ferry
status` and `make up` show the same table. On a terminal `Display` redraws it in place;
otherwise it prints a line whenever a phase or a step's state changes, and whenever the
running step's progress does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

from ferry.api.migration import STEP_ORDER, DriverMode, step_order
from ferry.kubectl.output import Colours

BAR_WIDTH = 24
STATE_MARKS = {
    "Pending": " ",
    "Running": ">",
    "Retrying": "~",
    "Succeeded": "✓",
    "Failed": "✗",
    "Compensating": "↺",
    "Compensated": "↩",
    "CompensationFailed": "!",
    "Interrupted": "?",
}
STATE_COLOURS = {
    "Running": "cyan",
    "Retrying": "yellow",
    "Succeeded": "green",
    "Failed": "red",
    "Compensating": "yellow",
    "Compensated": "yellow",
    "CompensationFailed": "red",
    "Interrupted": "red",
}
PHASE_COLOURS = {
    "Running": "cyan",
    "AwaitingApproval": "yellow",
    "Paused": "yellow",
    "RollingBack": "yellow",
    "Succeeded": "green",
    "RolledBack": "yellow",
    "Failed": "red",
    "Abandoned": "red",
    "Planned": "green",
}


def parse_time(value: object) -> datetime | None:
    """A Kubernetes timestamp (RFC 3339, `Z` or an offset) as an aware datetime; None when absent."""
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def seconds(step: dict[str, Any], now: datetime | None) -> float | None:
    """How long the step ran: until it finished, or until `now` while it runs; None before it started, and for a step
    that stopped at a time nobody knows (Interrupted)."""
    begin = parse_time(step.get("startedAt"))
    end = parse_time(step.get("finishedAt")) or (None if step.get("state") == "Interrupted" else now)
    if begin is None or end is None:
        return None
    return max(0.0, (end - begin).total_seconds())


def duration(value: float | None) -> str:
    """`4.2s`, `3m05s`, `1h02m`: short enough for a column."""
    if value is None:
        return ""
    if value < 60:
        return f"{value:.1f}s"
    whole = int(value)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def megabytes(count: object) -> str:
    return f"{int(count) / 1_000_000:,.1f} MB" if isinstance(count, int | float) else ""


def bar(done: float, total: float | None) -> str:
    """`[#######.........]  43%` when the total is known, else an empty bar."""
    if not total:
        return "[" + "." * BAR_WIDTH + "]"
    fraction = max(0.0, min(1.0, done / total))
    filled = round(fraction * BAR_WIDTH)
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {fraction * 100:3.0f}%"


def time_left(done: float, total: float | None, elapsed: float | None) -> str:
    """`~12s left` at the average rate so far, once there is a rate to speak of; else empty."""
    if not total or not elapsed or done <= 0 or done >= total or elapsed < 1:
        return ""
    return f"~{duration(elapsed * (total - done) / done)} left"


def detail(step: str, heartbeat: dict[str, Any] | None, elapsed: float | None = None) -> str:
    """The progress note of a running data step, from its last heartbeat."""
    if not heartbeat:
        return ""
    if step == "snapshot" and "dumped_bytes" in heartbeat:
        # A dump's size is not known before it ends, so the snapshot has no total: no bar, no time left.
        uploaded = heartbeat.get("uploaded_bytes", 0)
        return f"{megabytes(heartbeat['dumped_bytes'])} dumped, {megabytes(uploaded)} uploaded"
    if step == "migrate" and "read_bytes" in heartbeat:
        read, size = heartbeat["read_bytes"], heartbeat.get("size_bytes")
        left = time_left(read, size, elapsed)
        return " ".join(part for part in (bar(read, size), megabytes(read), left) if part)
    if step == "verify":
        return f"tables checked: source {heartbeat.get('source_tables', 0)}, target {heartbeat.get('target_tables', 0)}"
    if step == "replicate" and "lag_bytes" in heartbeat:
        copied, tables = heartbeat.get("tables_synced", 0), heartbeat.get("tables", 0)
        return f"tables copied {copied}/{tables}, {megabytes(heartbeat['lag_bytes'])} behind the source"
    if step == "catch-up" and "lsn_to_apply_bytes" in heartbeat:
        return f"{megabytes(heartbeat['lsn_to_apply_bytes'])} still to apply (up to {heartbeat.get('frozen_lsn', '?')})"
    if "waiting_for" in heartbeat:
        return f"waiting for {heartbeat['waiting_for']}"
    return ""


def progress_of(status: dict[str, Any]) -> dict[str, Any] | None:
    """status.progress when it is about the step running now; an older one (a worker that died mid-step) is not."""
    progress = status.get("progress")
    if not isinstance(progress, dict) or progress.get("step") != status.get("currentStep"):
        return None
    steps = {step.get("name"): step for step in status.get("steps") or []}
    running = steps.get(progress.get("step"), {})
    if running.get("state") != "Running" or progress.get("attempt") not in (None, running.get("attempts")):
        return None
    return progress


def progress_note(progress: dict[str, Any]) -> str:
    """`[#####...]  43% 412 MiB of 1.2 GiB, 38 MiB/s, ~21s left`: a bar when a total is known, then the summary."""
    summary = str(progress.get("summary") or "").split(": ", 1)[-1]
    for done, total in (("bytesDone", "bytesTotal"), ("rowsDone", "rowsTotal")):
        if progress.get(total):
            return f"{bar(progress.get(done) or 0, progress[total])} {summary}"
    return summary


def phase_line(status: dict[str, Any], colours: Colours = Colours.NONE) -> str:
    phase = status.get("phase") or "Pending"
    return f"phase: {colours.paint(phase, PHASE_COLOURS.get(phase))}  {status.get('message') or ''}".rstrip()


def order_of(migration: dict[str, Any]) -> tuple[str, ...]:
    """The steps a Migration object runs, by its spec's mode: what to show before its status lists them."""
    mode = ((migration.get("spec") or {}).get("driver") or {}).get("mode")
    return step_order(DriverMode.ONLINE if mode == DriverMode.ONLINE.value else DriverMode.SNAPSHOT)


def step_lines(
    status: dict[str, Any],
    heartbeat: dict[str, Any] | None,
    now: datetime | None,
    colours: Colours = Colours.NONE,
    order: Sequence[str] = STEP_ORDER,
) -> list[str]:
    """One line per step: mark, name, state, time, attempts when more than one, and a note.

    The steps are those the status lists (the run's own), else `order`. The note is the
    running step's progress, a retrying step's last error, an undo's attempts, or that an interrupted step's outcome
    is unknown.
    """
    steps = {step["name"]: step for step in status.get("steps") or []}
    current = status.get("currentStep")
    progress = progress_of(status)
    lines = []
    for name in steps or order:
        step = steps.get(name, {"state": "Pending"})
        state = step.get("state", "Pending")
        took = seconds(step, now) if now else None
        note = ""
        if name == current and state == "Running":
            note = progress_note(progress) if progress else detail(name, heartbeat, took)
        if state in ("Retrying", "Failed", "CompensationFailed") and step.get("lastError"):
            note = f"last error: {step['lastError']}"
        if state == "Interrupted":
            note = "the run stopped while it was under way: what it did may be done in part"
        attempts = f" (attempt {step['attempts']})" if step.get("attempts", 0) > 1 else ""
        if step.get("undoAttempts", 0) > 1:
            attempts += f" (undo attempt {step['undoAttempts']})"
        mark = colours.paint(STATE_MARKS.get(state, "?"), STATE_COLOURS.get(state))
        painted = colours.paint(f"{state:18}", STATE_COLOURS.get(state))
        lines.append(f"  {mark} {name:15} {painted} {duration(took):>8}{attempts}  {note}".rstrip())
    return lines


def lines(
    status: dict[str, Any],
    heartbeat: dict[str, Any] | None,
    now: datetime | None,
    colours: Colours = Colours.NONE,
    order: Sequence[str] = STEP_ORDER,
) -> list[str]:
    """The whole table: the phase and its message, then every step."""
    return [phase_line(status, colours), *step_lines(status, heartbeat, now, colours, order)]


@dataclasses.dataclass
class Display:
    """Renders a Migration's status to a stream, again and again as it changes."""

    out: TextIO
    interactive: bool
    colours: Colours = Colours.NONE
    order: Sequence[str] = STEP_ORDER
    """The steps shown while the status lists none yet (see `order_of`)."""
    _drawn: int = 0
    _seen: set[str] = dataclasses.field(default_factory=set)

    def render(self, status: dict[str, Any], heartbeat: dict[str, Any] | None, now: datetime) -> None:
        if self.interactive:
            table = lines(status, heartbeat, now, self.colours, self.order)
            if self._drawn:
                self.out.write(f"\x1b[{self._drawn}F\x1b[J")
            self.out.write("\n".join(table) + "\n")
            self._drawn = len(table)
        else:
            # A log of what changed: one line per new phase or step state, and per new progress of a running step.
            table = lines({k: v for k, v in status.items() if k != "progress"}, None, None, order=self.order)
            logged = [(" ".join(line.split()[:3]), line.strip()) for line in table]
            progress = progress_of(status)
            if progress and progress.get("summary"):
                logged.append((f"progress {progress['summary']}", f"  {progress['summary']}"))
            for key, line in logged:
                if key not in self._seen:
                    self._seen.add(key)
                    self.out.write(f"{now:%H:%M:%S} {line}\n")
        self.out.flush()
