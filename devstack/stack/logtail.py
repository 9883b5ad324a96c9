"""The cause of a failure from the end of a component's log: the few lines a person reads first.

Logs are appended to across runs (ManagedProcess writes a `--- <time> <command>` line
before each start), so only the last run's lines count. Of those, blank lines and the
frames of Python and Go stack traces are noise; a JSON log line (etcd, Go's zap) is
reduced to its level, message and error. What is left is cut to its last few lines,
each trimmed, so that the terminal shows a cause and the log keeps the rest.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

RUN_HEADER = re.compile(r"^--- \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d ")
"""The line ManagedProcess writes before each start of a program."""
GO_STACK_DUMP = re.compile(r"^goroutine \d+ \[")
LINES = 3
WIDTH = 200


def cause_lines(log_path: Path, *, lines: int = LINES, width: int = WIDTH) -> list[str]:
    """The last meaningful lines of the last run in the log at `log_path` (none if there is no log)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return []
    return meaningful(text, lines=lines, width=width)


def meaningful(text: str, *, lines: int = LINES, width: int = WIDTH) -> list[str]:
    """The last `lines` meaningful lines of `text`, each at most `width` characters."""
    run = text.splitlines()
    starts = [index for index, line in enumerate(run) if RUN_HEADER.match(line)]
    if starts:
        run = run[starts[-1] + 1 :]
    kept: list[str] = []
    for line in run:
        if GO_STACK_DUMP.match(line):
            break  # a Go panic: what follows is the stack of every goroutine
        if not line.strip() or line[0].isspace() or line.startswith("Traceback (most recent call last)"):
            continue
        kept.append(_trimmed(_condensed(line), width))
    return kept[-lines:]


def _condensed(line: str) -> str:
    """`level: message: error` for a structured (JSON) log line; the line itself otherwise."""
    if not line.startswith("{"):
        return line.rstrip()
    try:
        record = json.loads(line)
    except ValueError:
        return line.rstrip()
    if not isinstance(record, dict):
        return line.rstrip()
    message = record.get("msg") or record.get("message")
    if not message:
        return line.rstrip()
    parts = [str(record["level"])] if record.get("level") else []
    parts.append(str(message))
    if record.get("error"):
        parts.append(str(record["error"]))
    return ": ".join(parts)


def _trimmed(line: str, width: int) -> str:
    line = " ".join(line.split())
    return line if len(line) <= width else line[: width - 1] + "…"
