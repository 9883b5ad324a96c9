"""Heartbeats for activities that block for long stretches, and how a cancellation reaches them.

A data activity spends most of its time blocked: reading pg_dump's output, writing
pg_restore's input, uploading a part, waiting for a checksum query. While blocked it
cannot heartbeat, so Temporal would take a slow step for a dead worker, and it would
not see a cancellation. So a watchdog thread heartbeats the latest progress every few
seconds, and once the activity is cancelled it calls the activity's stop callbacks
(kill the child process, cancel the query). That unblocks the work, which then cleans
up and raises CancelledError at its next `raise_if_cancelled`.

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

    def raise_if_cancelled(self, doing: str) -> None:
        if activity.is_cancelled():
            raise CancelledError(f"cancelled while {doing}")

    def __enter__(self) -> Heartbeats:
        context = contextvars.copy_context()  # the activity context, so the watchdog may heartbeat
        self._watchdog = threading.Thread(target=context.run, args=(self._watch,), name="heartbeats", daemon=True)
        self._watchdog.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
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
        for stop in stops:
            try:
                stop()
            except Exception as error:  # noqa: BLE001 - one failed stop must not keep the others from running
                activity.logger.warning("stopping after a cancellation failed: %s", error)
