"""Live progress of one Migration in the terminal: each step with its state and time, a bar for data steps.

What it shows comes from where a person would look: the Migration's status (phase,
steps) and, for the step running now, the heartbeat details of its activity in
Temporal (bytes dumped, uploaded or restored). On a terminal the table is redrawn in
place; otherwise a line is printed whenever something changes.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, TextIO

from ferry.api.migration import STEP_ORDER

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
}


def _duration(step: dict[str, Any], now: datetime) -> str:
    started = step.get("startedAt")
    if not started:
        return ""
    begin = datetime.fromisoformat(started.replace("Z", "+00:00"))
    finished = step.get("finishedAt")
    end = datetime.fromisoformat(finished.replace("Z", "+00:00")) if finished else now
    return f"{max(0.0, (end - begin).total_seconds()):6.1f}s"


def _megabytes(count: object) -> str:
    return f"{int(count) / 1_000_000:,.1f} MB" if isinstance(count, int | float) else ""


def bar(done: float, total: float | None) -> str:
    """`[#######.........]  43%` when the total is known, else an empty bar."""
    if not total:
        return "[" + "." * BAR_WIDTH + "]"
    fraction = max(0.0, min(1.0, done / total))
    filled = round(fraction * BAR_WIDTH)
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {fraction * 100:3.0f}%"


def detail(step: str, heartbeat: dict[str, Any] | None, source_bytes: int | None) -> str:
    """The progress note of a running data step, from its last heartbeat."""
    if not heartbeat:
        return ""
    if step == "snapshot" and "dumped_bytes" in heartbeat:
        # pg_dump compresses, so the database's size only bounds the snapshot's.
        uploaded = heartbeat.get("uploaded_bytes", 0)
        return f"{_megabytes(heartbeat['dumped_bytes'])} dumped, {_megabytes(uploaded)} uploaded"
    if step == "migrate" and "read_bytes" in heartbeat:
        return f"{bar(heartbeat['read_bytes'], heartbeat.get('size_bytes'))} {_megabytes(heartbeat['read_bytes'])}"
    if step == "verify":
        return f"tables checked: source {heartbeat.get('source_tables', 0)}, target {heartbeat.get('target_tables', 0)}"
    return ""


@dataclasses.dataclass
class Display:
    """Renders a Migration's status to a stream."""

    out: TextIO
    interactive: bool
    _drawn: int = 0
    _seen: set[str] = dataclasses.field(default_factory=set)

    def render(self, status: dict[str, Any], heartbeat: dict[str, Any] | None, now: datetime) -> None:
        lines = self.lines(status, heartbeat, now)
        if self.interactive:
            if self._drawn:
                self.out.write(f"\x1b[{self._drawn}F\x1b[J")
            self.out.write("\n".join(lines) + "\n")
            self._drawn = len(lines)
        else:
            # A log of what changed: one line per new phase or step state.
            for line in self.lines(status, None, None):
                key = " ".join(line.split()[:3])
                if key not in self._seen:
                    self._seen.add(key)
                    self.out.write(f"{now:%H:%M:%S} {line.strip()}\n")
        self.out.flush()

    def lines(self, status: dict[str, Any], heartbeat: dict[str, Any] | None, now: datetime | None) -> list[str]:
        phase = status.get("phase") or "Pending"
        lines = [f"phase: {phase}  {status.get('message') or ''}".rstrip()]
        steps = {step["name"]: step for step in status.get("steps") or []}
        current = status.get("currentStep")
        for name in steps or STEP_ORDER:
            step = steps.get(name, {"state": "Pending"})
            state = step.get("state", "Pending")
            took = _duration(step, now) if now else ""
            note = detail(name, heartbeat, None) if name == current and state == "Running" else ""
            if state == "Retrying" and step.get("lastError"):
                note = f"last error: {step['lastError']}"
            attempts = f" (attempt {step['attempts']})" if step.get("attempts", 0) > 1 else ""
            mark = STATE_MARKS.get(state, "?")
            lines.append(f"  {mark} {name:15} {state:18} {took:>8}{attempts}  {note}".rstrip())
        return lines
