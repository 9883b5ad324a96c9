"""`kubectl ferry get`: Migrations as a table (phase, step, steps done, age, message), or as kubectl's -o gives them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ferry.kubectl.output import Colours, table
from ferry.kubectl.progress import PHASE_COLOURS, parse_time

DONE_STATES = {"Succeeded"}


def age(created: datetime | None, now: datetime) -> str:
    """kubectl's short age: `42s`, `7m`, `5h`, `3d`."""
    if created is None:
        return "<unknown>"
    seconds = max(0, int((now - created).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def steps_done(status: dict[str, Any]) -> str:
    """`5/8`: the steps that succeeded, of all the saga's steps (empty before the saga reported)."""
    steps = status.get("steps") or []
    if not steps:
        return ""
    return f"{sum(1 for step in steps if step.get('state') in DONE_STATES)}/{len(steps)}"


def rows(items: list[dict[str, Any]], now: datetime, *, namespaces: bool, colours: Colours) -> list[str]:
    """The table of Migrations, sorted as kubectl sorts them (namespace, then name)."""
    header = ["NAMESPACE"] if namespaces else []
    header += ["NAME", "PHASE", "STEP", "STEPS", "AGE", "MESSAGE"]
    cells = []
    for item in sorted(items, key=lambda i: (i["metadata"].get("namespace", ""), i["metadata"]["name"])):
        metadata, status = item["metadata"], item.get("status") or {}
        phase = status.get("phase") or "Pending"
        row = [metadata.get("namespace", "")] if namespaces else []
        row += [
            metadata["name"],
            phase,
            status.get("currentStep") or "",
            steps_done(status),
            age(parse_time(metadata.get("creationTimestamp")), now),
            status.get("message") or "",
        ]
        cells.append(row)
    lines = table(header, cells)
    if colours is Colours.NONE:
        return lines
    # Paint the phase after aligning, so the escape codes do not count as width.
    start = lines[0].index("PHASE")
    painted = [lines[0]]
    for line, row in zip(lines[1:], cells, strict=True):
        phase = row[2 if namespaces else 1]
        painted.append(line[:start] + colours.paint(phase, PHASE_COLOURS.get(phase)) + line[start + len(phase) :])
    return painted
