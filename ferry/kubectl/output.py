"""Output as kubectl gives it: tables for people, `-o json|yaml` for scripts, colours only on a terminal."""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

CODES = {"red": "31", "green": "32", "yellow": "33", "cyan": "36", "bold": "1"}


class Colours(enum.Enum):
    """Whether text is painted: ANSI colours on a terminal, nothing elsewhere or with NO_COLOR set."""

    NONE = False
    ANSI = True

    @classmethod
    def for_stream(cls, stream: TextIO) -> Colours:
        return cls.ANSI if stream.isatty() and not os.environ.get("NO_COLOR") else cls.NONE

    def paint(self, text: str, colour: str | None) -> str:
        if self is Colours.NONE or colour is None:
            return text
        return f"\x1b[{CODES[colour]}m{text}\x1b[0m"


def dump(data: Any, form: str) -> str:
    """`data` as JSON (indented, like kubectl) or YAML."""
    if form == "yaml":
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return json.dumps(data, indent=4, ensure_ascii=False) + "\n"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns as kubectl aligns them: left-aligned, three spaces apart, the last one not padded."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    out = []
    for row in [header, *rows]:
        cells = [str(cell).ljust(width) for cell, width in zip(row[:-1], widths[:-1], strict=True)]
        out.append("   ".join([*cells, str(row[-1])]).rstrip())
    return out
