"""How `ferry` and `python -m devstack` end: exit handlers and streams done, then no interpreter teardown.

The teardown is where a Temporal SDK thread calling into Python aborts the process
(ferry/process.py); these check what the end still does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]

ENDING = """
import atexit, sys, threading, time
from ferry.process import exit_without_teardown

atexit.register(lambda: print("exit handler ran", flush=True))
print("buffered, not flushed;", end=" ")
print("to stderr too", end="", file=sys.stderr)
# A thread that never ends and is not a daemon: a normal exit would wait for it forever.
threading.Thread(target=lambda: time.sleep(3600), daemon=False).start()
exit_without_teardown(3)
"""


def test_the_end_runs_the_exit_handlers_flushes_both_streams_and_gives_the_code_without_waiting_for_threads() -> None:
    ended = subprocess.run([sys.executable, "-c", ENDING], cwd=ROOT, capture_output=True, text=True, timeout=60)

    assert ended.returncode == 3
    assert ended.stdout == "buffered, not flushed; exit handler ran\n"
    assert ended.stderr == "to stderr too"


def test_the_ferry_command_ends_with_its_own_exit_code_and_all_it_wrote() -> None:
    written = subprocess.run(
        [sys.executable, "-m", "ferry.cli", "crd", "-o", "-"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    refused = subprocess.run(
        [sys.executable, "-m", "ferry.cli", "rbac", "--secret-namespaces", "not a name!"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert written.returncode == 0, written.stderr
    assert yaml.safe_load(written.stdout)["metadata"]["name"] == "migrations.ferry.dev"
    assert refused.returncode == 2
    assert refused.stderr == "ferry rbac: not a namespace name: not a name!\n"
