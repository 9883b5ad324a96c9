"""A program run in a pseudo-terminal, as a person runs `make up`: what it shows is read as it comes.

Waits are for what the terminal shows (a pattern), with a deadline; a program that exits
early fails the wait at once, with the terminal's output so far.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Terminal:
    """A program in a pseudo-terminal; everything it writes is read as it comes and kept."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        controller, terminal = pty.openpty()
        self.process = subprocess.Popen(
            argv, stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True, env=env
        )
        os.close(terminal)
        self._controller = controller
        self._chunks: list[str] = []
        self._reader = threading.Thread(target=self._read, name="terminal", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        # Reading all along keeps the program from blocking on a full terminal while the test waits.
        while True:
            try:
                chunk = os.read(self._controller, 65536)
            except OSError:  # the terminal closed: the program ended
                return
            if not chunk:
                return
            self._chunks.append(chunk.decode(errors="replace"))

    @property
    def output(self) -> str:
        return "".join(self._chunks)

    def shown(self, lines: int = 60) -> str:
        """The end of what the terminal showed, for a failure message."""
        return "\n".join(self.output.splitlines()[-lines:])

    def wait_for(self, what: str, pattern: str, within: float) -> re.Match[str]:
        """Waits until the output matches `pattern`; fails early if the program exits first."""
        found = self.wait_until(what, lambda: re.search(pattern, self.output), within)
        assert found is not None
        return found

    def wait_until(self, what: str, condition: Callable[[], T], within: float) -> T:
        """Waits until `condition()` is true and returns it; fails early if the program exits first."""
        deadline = time.monotonic() + within
        while True:
            found = condition()
            if found:
                return found
            code = self.process.poll()
            if code is not None:
                self._reader.join(5)  # whatever it wrote last
                found = condition()
                if found:
                    return found
                raise AssertionError(f"ferry up exited ({code}) waiting for {what}; its terminal:\n{self.shown()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {within:.0f}s waiting for {what}; its terminal:\n{self.shown()}")
            time.sleep(0.1)

    def interrupt(self) -> None:
        """What Ctrl-C does: SIGINT to the terminal's foreground process group."""
        os.killpg(self.process.pid, signal.SIGINT)

    def send(self, signum: int) -> None:
        """What `kill -<signum> PID` does: the signal to the program alone."""
        os.kill(self.process.pid, signum)

    def wait_exit(self, within: float) -> int:
        try:
            code = self.process.wait(within)
        except subprocess.TimeoutExpired:
            self.show_threads()
            shown = self.shown(200)
            raise AssertionError(f"ferry up still runs {within:.0f}s after it was told to stop:\n{shown}") from None
        self._reader.join(10)
        return code

    def show_threads(self) -> None:
        """Asks the program to show every thread's stack (`ferry up` registers SIGUSR1 for that)."""
        shown = len(self.output)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        seen, quiet_since = len(self.output), time.monotonic()
        while time.monotonic() < deadline:  # until the dump has come and the terminal is quiet for half a second
            if len(self.output) != seen:
                seen, quiet_since = len(self.output), time.monotonic()
            elif "File " in self.output[shown:] and time.monotonic() - quiet_since > 0.5:
                return
            time.sleep(0.1)

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        self._reader.join(10)
        os.close(self._controller)
