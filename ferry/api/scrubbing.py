"""Error text from outside ferry, cut to what a person needs before it becomes a status, an Event or history.

Servers and tools echo data in their errors. PostgreSQL's DETAIL names the key and the
row that failed (`Key (email)=(...)`, `Failing row contains (...)`), its CONTEXT quotes
the COPY line being loaded, LINE and QUERY quote the statement, and an input error
quotes the value it could not read. The Kubernetes API server's 422 quotes the field's
value (`Invalid value: "..."`). A status message, an Event and a workflow's history are
read by many more people than may read the rows, and outlive them; so every text that
came from a server or a tool goes through `scrub` before ferry puts it into one.

What stays is what a person acts on: the primary message of each error (what failed,
on which constraint, table, column or field), HINT lines, and the tool's own lines
(pg_restore's `COPY failed for table "orders"`). What goes: DETAIL, CONTEXT, QUERY,
STATEMENT, WHERE, LINE and the lines continuing them, pg_dump's and pg_restore's
"Command was" and "Query was", an HTTP dump's headers and body; and in what stays, each
quoted value (after a colon, or after the word value), key values, failing rows, the
value of a Kubernetes field error and raw byte sequences become `…`. The result is one
line, at most `limit` characters. It is a pure function, so the workflow may call it
too, and applying it twice changes nothing.
"""

from __future__ import annotations

import json
import re

MESSAGE_LIMIT = 4000
"""Characters of a whole message (a status message, a failure in the history): room for a precheck's list."""
EXCERPT_LIMIT = 500
"""Characters of what one server or tool said, inside a message of ferry's own."""
WITHHELD = "…"
"""What stands where a value was."""

_FRONTEND = r"(?:pg_dump|pg_restore|psql)"
_DROPPED = (
    r"(?:DETAIL|CONTEXT|QUERY|STATEMENT|WHERE|LINE \d+|Command was|Query was"
    r"|HTTP response headers|HTTP response body):"
)
_KEPT = r"(?:ERROR|FATAL|PANIC|WARNING|NOTICE|HINT|INFO|LOG):"

_FRONTEND_PREFIX = re.compile(rf"{_FRONTEND}:\s+(?:detail:\s+|hint:\s+)?")
_DROPPED_START = re.compile(_DROPPED)
_KEPT_START = re.compile(rf"{_KEPT}|{_FRONTEND}:")
_DROPPED_INLINE = re.compile(rf"(?:(?<=\s)|(?<=\|)){_DROPPED}|{_FRONTEND}:\s+detail:\s+(?:Command|Query) was:")

_KEY = re.compile(
    r"(Key \((?:[^()]|\([^()]*\))*\)=)\(.*\)"
    r"(?=\s+(?:already exists|is |conflicts with)|[.,]?\s*$)"
)
_FAILING_ROW = re.compile(r"(Failing row contains )\(.*\)")
_FIELD_VALUE = re.compile(r"\b(Invalid value|Unsupported value|Duplicate value|Not found): ")
_QUOTED_VALUE = re.compile(r'(: |\bvalue )"(?:[^"\\]|\\.)*"')
_BYTES = re.compile(r"\b0x[0-9a-fA-F]{2}(?:\s+0x[0-9a-fA-F]{2})*")
_CLOSING = {"{": "}", "[": "]", "(": ")"}


def scrub(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text` without the values it quotes and the sections that quote data, on one line of at most `limit`."""
    kept: list[str] = []
    dropping = False
    for raw in text.splitlines():
        line = raw.strip()
        body = _FRONTEND_PREFIX.sub("", line, count=1) if _FRONTEND_PREFIX.match(line) else line
        if _DROPPED_START.match(body):
            dropping = True
            continue
        if _KEPT_START.match(line):
            dropping = False
        elif dropping:
            continue  # the statement, query or data a dropped line started
        cut = _DROPPED_INLINE.search(line)
        line = _withhold(line[: cut.start()] if cut else line).strip(" |")
        if line:
            kept.append(line)
    return _bounded(" ".join(" | ".join(kept).split()), limit)


def api_server_said(status: int | None, reason: str | None, body: str | bytes | None) -> str:
    """The sentence of a Kubernetes API server's error (its Status body's message), scrubbed, else its HTTP reason."""
    try:
        said = json.loads(body or "{}").get("message")
    except (ValueError, AttributeError):
        said = None
    return scrub(str(said or reason or f"HTTP {status}"), EXCERPT_LIMIT).rstrip(".")


def _withhold(line: str) -> str:
    line = _KEY.sub(rf"\1({WITHHELD})", line)
    line = _FAILING_ROW.sub(rf"\1({WITHHELD})", line)
    line = _field_values(line)
    line = _QUOTED_VALUE.sub(rf'\1"{WITHHELD}"', line)
    return _BYTES.sub(f"0x{WITHHELD}", line)


def _field_values(line: str) -> str:
    """The value after each `Invalid value: ` (and its kin) of a Kubernetes field error, withheld whatever its form."""
    out, position = [], 0
    for match in _FIELD_VALUE.finditer(line):
        if match.start() < position:
            continue  # inside a value already withheld
        end = _value_end(line, match.end())
        out += [line[position : match.end()], f'"{WITHHELD}"']
        position = end
    return "".join(out) + line[position:]


def _value_end(line: str, start: int) -> int:
    """Where a value printed by the API server ends: a Go-quoted string, or up to ": " or ", " outside brackets."""
    if line.startswith('"', start):
        end = start + 1
        while end < len(line) and line[end] != '"':
            end += 2 if line[end] == "\\" else 1
        return min(end + 1, len(line))
    closers: list[str] = []
    position = start
    while position < len(line):
        char = line[position]
        if char == '"':
            position = _value_end(line, position)
            continue
        if char in _CLOSING:
            closers.append(_CLOSING[char])
        elif closers and char == closers[-1]:
            closers.pop()
        elif not closers and line.startswith((": ", ", "), position):
            break
        position += 1
    return position


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + WITHHELD
