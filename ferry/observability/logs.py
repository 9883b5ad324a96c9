"""Structured JSON logs: every line says which Migration it is about.

A line's migration fields (namespace, name, generation, workflow_id) come from, in order:
the `migration_context` the watcher or the worker's interceptor set around the work; a
`ferry` dict passed as `extra`; the Temporal SDK's own `temporal_activity` and
`temporal_workflow` extras, whose workflow ID names the Migration
(`migration/<namespace>/<name>/<uid>`). Fields that no source knows are null, so every
line has the same keys. Only entry points call `configure`.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

FIELDS = ("namespace", "name", "generation", "workflow_id")

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("ferry_migration", default=None)


@contextlib.contextmanager
def migration_context(**fields: Any) -> Iterator[None]:
    """Adds these migration fields to every line logged inside the block (in this task or thread)."""
    merged = {**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    token = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(token)


def bind(**fields: Any) -> None:
    """Adds migration fields for the rest of the current task, which must run in a context of its own
    (every asyncio task does): a workflow's coroutine may be closed from another context, where a
    context manager could not reset them."""
    _context.set({**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}})


def _from_workflow_id(workflow_id: str) -> dict[str, Any]:
    parts = workflow_id.split("/")
    if len(parts) == 4 and parts[0] in ("migration", "cleanup"):
        return {"namespace": parts[1], "name": parts[2]}
    return {}


def migration_fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = dict(_context.get() or {})
    extra = getattr(record, "ferry", None)
    if isinstance(extra, dict):
        fields.update({k: v for k, v in extra.items() if v is not None})
    for attribute in ("temporal_activity", "temporal_workflow"):
        temporal = getattr(record, attribute, None)
        if isinstance(temporal, dict) and temporal.get("workflow_id"):
            fields.setdefault("workflow_id", temporal["workflow_id"])
    if "workflow_id" in fields:
        for key, value in _from_workflow_id(str(fields["workflow_id"])).items():
            fields.setdefault(key, value)
    return {key: fields.get(key) for key in FIELDS}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the migration fields, and any error."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **migration_fields(record),
        }
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """Human-readable lines that still name the Migration, for terminals."""

    def format(self, record: logging.LogRecord) -> str:
        fields = migration_fields(record)
        where = f" [{fields['namespace']}/{fields['name']}]" if fields["name"] else ""
        text = f"{datetime.fromtimestamp(record.created, UTC):%H:%M:%S} {record.levelname} {record.name}{where}: "
        text += record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(*, level: int = logging.INFO, json_lines: bool = True, stream: Any = None) -> None:
    """Sends all logging to one stream (default stderr) as JSON lines, or text for a terminal."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
