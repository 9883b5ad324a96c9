"""Heartbeats for activities that block for long stretches, and how a cancellation reaches them.

A data activity spends most of its time blocked: reading pg_dump's output, writing
pg_restore's input, uploading a part, waiting for a checksum query. While blocked it
cannot heartbeat, so Temporal would take a slow step for a dead worker, and it would
not see a cancellation. So a watchdog thread heartbeats the latest progress every few
seconds, and once the activity is cancelled it calls the activity's stop callbacks
(kill the child process, cancel the query). That unblocks the work, which then cleans
up and raises CancelledError at its next `raise_if_cancelled`. The stops run at once, each
in a thread of its own: a stop may wait seconds for a server (cancelling a query), and
ten sessions must stop in the time of one.

Every session connection.connect opens while a Heartbeats is entered registers a stop of
its own with it (`current`), and takes it back when it closes: a call that a server
leaves unanswered is cancelled, then its socket shut down (see connection.Session), so
the work's calls do not keep an activity's thread blocked on a database after its
cancellation, or after its start-to-close timeout (which the SDK turns into one). A call
begun after the cancellation is the cleanup's, and is left to finish: a cleanup on a
server that stopped answering can still block.

The activities using this are defined with `no_thread_cancel_exception=True`: the SDK
then never raises into their thread at an arbitrary point, so their cleanup always
runs to its end.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from types import TracebackType

from temporalio import activity
from temporalio.exceptions import CancelledError

POLL = 0.2
"""Seconds between the watchdog's looks at the cancellation flag."""

_CURRENT: contextvars.ContextVar[Heartbeats | None] = contextvars.ContextVar("ferry_heartbeats", default=None)
"""The Heartbeats entered in this context (the activity's thread, and threads started with a copy of its context)."""


def current() -> Heartbeats | None:
    """The Heartbeats the caller's activity has entered, if any: what its sessions register their stops with."""
    return _CURRENT.get()


class Heartbeats:
    """Use as a context manager around an activity's work; `progress` records what to report."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._details: dict[str, object] = {}
        self._stops: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._cancel_seen = False
        self._watchdog: threading.Thread | None = None
        self._entered: contextvars.Token[Heartbeats | None] | None = None

    def progress(self, **details: object) -> None:
        """Records progress and heartbeats it now (the worker throttles what it sends to the server)."""
        self.note(**details)
        with self._lock:
            details_now = dict(self._details)
        activity.heartbeat(details_now)

    def note(self, **details: object) -> None:
        """Records progress for the watchdog's next heartbeat; callable from any thread."""
        with self._lock:
            self._details.update(details)

    def on_cancel(self, stop: Callable[[], None]) -> None:
        """Calls `stop` from the watchdog once the activity is cancelled (at once, if it already is)."""
        with self._lock:
            self._stops.append(stop)
            cancelled = self._cancel_seen
        if cancelled:
            stop()

    def forget(self, stop: Callable[[], None]) -> None:
        """Takes back a stop `on_cancel` registered (a session that closed has nothing left to stop)."""
        with self._lock:
            self._stops = [kept for kept in self._stops if kept != stop]

    def raise_if_cancelled(self, doing: str) -> None:
        if activity.is_cancelled():
            raise CancelledError(f"cancelled while {doing}")

    def __enter__(self) -> Heartbeats:
        context = contextvars.copy_context()  # the activity context, so the watchdog may heartbeat
        self._watchdog = threading.Thread(target=context.run, args=(self._watch,), name="heartbeats", daemon=True)
        self._watchdog.start()
        self._entered = _CURRENT.set(self)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._entered is not None:
            _CURRENT.reset(self._entered)
            self._entered = None
        self._done.set()
        if self._watchdog is not None:
            self._watchdog.join()

    def _watch(self) -> None:
        waited = 0.0
        while not self._done.wait(POLL):
            waited += POLL
            if activity.is_cancelled():
                self._stop_all()
            if waited >= self._interval:
                waited = 0.0
                with self._lock:
                    details = dict(self._details)
                activity.heartbeat(details)

    def _stop_all(self) -> None:
        with self._lock:
            if self._cancel_seen:
                return
            self._cancel_seen = True
            stops = list(self._stops)
        for stop in stops:  # not waited for: each ends the work it stops, which the activity's thread waits for
            context = contextvars.copy_context()  # the activity context, for the logger
            threading.Thread(target=context.run, args=(_stop, stop), name="stopping", daemon=True).start()


def _stop(stop: Callable[[], None]) -> None:
    try:
        stop()
    except Exception as error:  # noqa: BLE001 - one failed stop must not keep the others from running
        activity.logger.warning("stopping after a cancellation failed: %s", error)
