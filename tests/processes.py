"""`ferry worker` and `ferry watcher` as real processes: started as deploy/manager starts them, watched, stopped.

Each process gets only the FERRY_ variables a test gives it (none of the test run's own),
writes its log to a file, and runs in its own session, so SIGTERM reaches it as it does
in a Pod. Waits poll a condition until a deadline and fail with what the logs say.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


@dataclasses.dataclass
class FerryProcess:
    """One `ferry <command>` process with its log file."""

    popen: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, signum: int = signal.SIGTERM, within: float = 30) -> int:
        """Sends `signum` and waits for the exit; kills it if it takes longer. Returns its exit code."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signum)
        try:
            return self.popen.wait(within)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)
            raise AssertionError(f"{self.log_path.stem} did not stop within {within:.0f}s:\n{self.log()}") from None


def start_ferry(*argv: str, log_path: Path, **variables: str) -> FerryProcess:
    """Starts `ferry <argv>` with exactly the FERRY_ variables given (and KUBECONFIG only if given)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_") and k != "KUBECONFIG"}
    environment.update(variables)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            [sys.executable, "-m", "ferry.cli", *argv],
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return FerryProcess(popen, log_path)


def wait_until(what: str, check: Callable[[], bool], timeout: float, *processes: FerryProcess) -> None:
    """Polls `check` until it holds; fails at once if one of `processes` exits, and at the deadline with their logs."""
    deadline = time.monotonic() + timeout
    while not check():
        for process in processes:
            code = process.popen.poll()
            assert code is None, f"{process.log_path.stem} exited ({code}) waiting for {what}:\n{process.log()}"
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.log_path.stem}\n{p.log()[-6000:]}" for p in processes)
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{logs}")
        time.sleep(0.2)
