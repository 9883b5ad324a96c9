"""Prints the size of a workflow history: event count and payload bytes.

Usage: history_stats.py HISTORY.json [...]
Reads histories as `temporal workflow show --output json` or the SDK's
WorkflowHistory.to_json() writes them, and counts every payload's data bytes.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any


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


def main(paths: list[str]) -> int:
    for path in paths:
        history = json.loads(Path(path).read_text())
        events = history["events"]
        kinds: dict[str, int] = {}
        for event in events:
            kinds[event["eventType"]] = kinds.get(event["eventType"], 0) + 1
        print(f"{path}: {len(events)} events, {_payload_bytes(events)} payload bytes")
        for kind, count in sorted(kinds.items(), key=lambda item: -item[1]):
            print(f"  {count:4} {kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
