"""The metric names a PromQL expression reads, and those a Prometheus text exposition serves.

A metric name in PromQL is an identifier that is not a function or an aggregation (those
are followed by a parenthesis), not a keyword, not inside a label matcher (`{...}`, whose
identifiers are label names), a grouping (`by (...)`, `on (...)`, ...) or a range (`[...]`),
and not a number or a duration. Strings are dropped first, so nothing inside quotes counts.
"""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d[\w.]*|\.\d[\w.]*)")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right",
    "inf", "nan", "atan2",
}  # fmt: skip
_EXPOSED = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{|\s)", re.MULTILINE)


def metric_names(expression: str) -> set[str]:
    """The metrics an expression selects: {"ferry_steps_total"} for `sum by (step) (rate(ferry_steps_total[5m]))`."""
    text = _STRING.sub(" ", expression)
    text = _MATCHERS.sub(" {} ", text)
    text = _GROUPING.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _VARIABLE.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name, rest = match.group(0), text[match.end() :].lstrip()
        if name.lower() in _KEYWORDS or rest.startswith("("):
            continue
        names.add(name)
    return names


def exposed_names(exposition: str) -> set[str]:
    """The names of the samples in a /metrics page (histograms as their _bucket, _sum and _count series)."""
    return {match.group(1) for match in _EXPOSED.finditer(exposition) if not match.group(1).startswith("#")}
