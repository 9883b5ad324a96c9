"""`pytest -m unit` skips importing modules without unit tests; it must still select every unit test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def unit_tests_collected(*, collect_all: bool) -> set[str]:
    env = {**os.environ, "FERRY_COLLECT_ALL": "1" if collect_all else "0"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "unit", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return {line for line in run.stdout.splitlines() if "::" in line}


def test_the_unit_shortcut_selects_exactly_the_tests_a_full_collection_marks_unit() -> None:
    shortcut = unit_tests_collected(collect_all=False)
    full = unit_tests_collected(collect_all=True)
    assert len(full) > 100
    assert shortcut == full, f"only in the full collection: {sorted(full - shortcut)[:10]}"
