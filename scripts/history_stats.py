"""Prints the size of a workflow history: events, bytes as Temporal stores them, payload bytes, events by type.

Usage: history_stats.py HISTORY.json [...]
Reads histories as `temporal workflow show --output json` or the SDK's
WorkflowHistory.to_json() writes them. "bytes" is the size of the encoded History
message, what Temporal's history size limits count; "payload bytes" is the part of it
that is ferry's own data (inputs, results, statuses). scripts/bench_fleet.py
--histories measures real runs with the same figures.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import sys
from pathlib import Path
from typing import Any

from temporalio.api.history.v1 import History as HistoryMessage
from temporalio.client import WorkflowHistory


def _payload_bytes(node: Any) -> int:
    if isinstance(node, dict):
        total = 0
        if "metadata" in node and "data" in node and isinstance(node["data"], str):
            total += len(base64.b64decode(node["data"]))
        for key, value in node.items():
            if key != "data":
                total += _payload_bytes(value)
        return total
    if isinstance(node, list):
        return sum(_payload_bytes(item) for item in node)
    return 0


@dataclasses.dataclass(frozen=True)
class History:
    """The figures of one history."""

    events: int
    bytes: int
    payload_bytes: int
    kinds: collections.Counter[str]

    @classmethod
    def of(cls, history: WorkflowHistory) -> History:
        encoded = HistoryMessage(events=history.events).ByteSize()
        listed = history.to_json_dict()["events"]
        kinds = collections.Counter(str(event["eventType"]) for event in listed)
        return cls(events=len(history.events), bytes=encoded, payload_bytes=_payload_bytes(listed), kinds=kinds)

    @classmethod
    def of_proto(cls, history: dict[str, Any]) -> History:
        """From the JSON form of a History message (WorkflowHistory.to_json_dict())."""
        return cls.of(WorkflowHistory.from_json("", history))

    def figures(self) -> dict[str, str]:
        return {
            "events": str(self.events),
            "bytes": f"{self.bytes} ({self.bytes / 1024:.0f} KiB)",
            "payload bytes": str(self.payload_bytes),
            **{kind.removeprefix("EVENT_TYPE_").lower(): str(count) for kind, count in self.kinds.most_common()},
        }


def main(paths: list[str]) -> int:
    for path in paths:
        history = History.of(WorkflowHistory.from_json(path, Path(path).read_text()))
        print(f"{path}: {history.events} events, {history.bytes} bytes, {history.payload_bytes} payload bytes")
        for kind, count in history.kinds.most_common():
            print(f"  {count:4} {kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
