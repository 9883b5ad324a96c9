"""How ferry's commands take stop signals, and how they end.

**Stop signals.** A program started with SIGINT ignored (a background job of a script,
some CI runners and supervisors) keeps it ignored across exec, and Python then installs
no handler of its own: a Ctrl-C that comes before the command installs its handlers
would be lost, and the command would run on as if nobody had asked it to stop.
`take_stop_signals` installs the command's handler (by default, SIGINT raises
KeyboardInterrupt) from that moment on and unblocks SIGINT and SIGTERM, whatever the
parent left.

**Ending.** A process that hosted a Temporal client ends without the interpreter's teardown.

The Temporal SDK runs its core in Rust threads that outlive the event loop. When one of
them calls into Python while the interpreter tears itself down, CPython aborts the
process (SIGABRT, "Fatal Python error: PyGILState_Release: thread state ... must be
current when releasing"; temporalio/sdk-python#300). A worker told to stop then exits
with -6 instead of 0 after a clean shutdown, which a supervisor reads as a crash.

So the `ferry` and `python -m devstack` commands end through `exit_without_teardown`: the
exit handlers run (they flush the logs and the spans), the standard streams are flushed,
and the process ends with its exit code before any teardown starts.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn


def exit_without_teardown(code: int) -> NoReturn:
    """Runs the exit handlers, flushes stdout and stderr, and ends the process with `code`."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or a pipe whose reader left: nothing to say there
            stream.flush()
    os._exit(code)


def take_stop_signals(
    handler: Callable[[int, FrameType | None], Any] = signal.default_int_handler,
    signals: tuple[signal.Signals, ...] = (signal.SIGINT,),
) -> None:
    """From now on `handler` answers `signals` (by default: Ctrl-C raises KeyboardInterrupt), and SIGINT and SIGTERM
    reach the process, whatever it inherited."""
    for signum in signals:
        signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
