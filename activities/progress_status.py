"""Writes a running data step's progress into its Migration's status.progress, and removes it when the step ends.

People watch the Migration (`kubectl get mig -w`, `make up`), not Temporal's heartbeats,
so snapshot, migrate and verify put their bytes or rows done, throughput and time left
there too, at most once per `progress_interval`. The status has three owners, kept apart
by the API server: the saga (`ferry-saga`), the watcher (`ferry-watcher`) and this
writer, `ferry-progress`, which applies status.progress alone. An apply by the saga or
the watcher neither conflicts with that field nor removes it, and the writer's last apply,
of no field at all, removes exactly the field it owned, whether the activity succeeded,
failed or was cancelled.

Each write is an apply conditional on a resourceVersion known to be the Migration's
uid's, as mirror_status's are: the one the worker's last status write of it produced
(this writer's or mirror_status's: they share the worker's KnownVersions, so neither
costs the other a 409), else that of a read that showed the uid. So a Migration deleted
and created again under the same name (another uid) is never written. The uid alone
would not do: an apply to the status subresource of a custom resource carrying another
uid in its metadata is accepted, since the API server copies the stored object's
metadata before it validates a status write (tests/postgres/test_progress.py shows both).

Progress is a courtesy, so it never costs the step anything: the activity only counts
(no I/O, `update`), a thread of this writer does the writing, every request has short
connect and read timeouts, and a failure is logged once at warning level and otherwise
ignored.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from activities import kube_calls
from activities.api_refusals import server_message
from activities.known_versions import KnownVersion, KnownVersions
from activities.progress import Figures, Meter
from ferry.api.migration import GROUP, PLURAL, VERSION, ProgressStatus
from ferry.api.saga import MigrationRef
from ferry.api.scrubbing import scrub

FIELD_MANAGER = "ferry-progress"
"""Field manager of status.progress, as `kubectl get -o yaml --show-managed-fields` shows it."""
REQUEST_TIMEOUT = (3.0, 5.0)
"""Seconds to connect to the API server and to wait for its answer, per request: a progress write is worth little."""
CONFLICT_ATTEMPTS = 3
"""A write answered 409 (its known version was stale, or the watcher wrote in between) is tried again from a fresh read,
twice at most."""


class _NotOurs(Exception):
    """The Migration is gone, or is another object under the same name."""


class ProgressWriter:
    """Use as a context manager around a data activity's work; `update` records counts from any thread.

    Without an API client, or with an interval of 0, it counts and writes nothing. `versions` is the worker's one
    cache of the versions its status writes produced, shared with mirror_status; without it, a cache of its own.
    """

    def __init__(
        self,
        api_client: k8s.ApiClient | None,
        ref: MigrationRef,
        step: str,
        interval: float,
        *,
        versions: KnownVersions | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._custom = k8s.CustomObjectsApi(api_client) if api_client is not None and interval > 0 else None
        self._versions = versions if versions is not None else KnownVersions()
        self._ref = ref
        self._interval = interval
        self._clock = clock
        self._meter = Meter(step, interval, clock())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False
        self._gone = False
        self.writes = 0
        """Writes the API server accepted, progress and its removal: for tests and logs."""

    @property
    def gone(self) -> bool:
        """Whether the Migration turned out gone, or another object under its name: nothing more is written."""
        return self._gone

    def update(
        self,
        *,
        bytes_done: int | None = None,
        bytes_total: int | None = None,
        rows_done: int | None = None,
        rows_total: int | None = None,
    ) -> None:
        """Records how far the step is; counts left out keep their last value. Cheap: the writing is elsewhere."""
        self._meter.update(
            self._clock(), bytes_done=bytes_done, bytes_total=bytes_total, rows_done=rows_done, rows_total=rows_total
        )

    def __enter__(self) -> ProgressWriter:
        if self._custom is not None:
            context = contextvars.copy_context()  # the activity's, for its logger
            self._thread = threading.Thread(target=context.run, args=(self._run,), name="progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()  # a write in flight lands before the removal, never after it
        self._quietly(self._remove)

    def _run(self) -> None:
        while not self._stop.wait(self._interval) and not self._gone:
            self._quietly(self._write_due)

    def _write_due(self) -> None:
        now = self._clock()
        figures = self._meter.due(now)
        if figures is not None:
            kube_calls.retry_on_conflict(lambda: self._write(figures), CONFLICT_ATTEMPTS)
            self._meter.written(figures, now)

    def _write(self, figures: Figures) -> None:
        known = self._versions.get(self._ref.uid) or self._read()
        figures = dataclasses.replace(figures, attempt=known.attempts.get(figures.step) or None)
        reading = figures.reading
        progress = ProgressStatus(
            step=figures.step,
            attempt=figures.attempt,
            bytes_done=reading.bytes_done,
            bytes_total=reading.bytes_total,
            rows_done=reading.rows_done,
            rows_total=reading.rows_total,
            bytes_per_second=_rounded(figures.bytes_per_second),
            rows_per_second=_rounded(figures.rows_per_second),
            seconds_left=figures.seconds_left,
            updated_at=datetime.now(UTC),
            summary=figures.summary,
        )
        self._apply(known, {"progress": progress.model_dump(mode="json", by_alias=True, exclude_none=True)})

    def _remove(self) -> None:
        """Applies no field at all, which removes the field this manager owned; nothing to do when there is none.

        That there is none is taken only from a read: a known version that shows none may be stale, and no write
        would tell, since none is made.
        """
        if self._gone:
            return

        def remove() -> None:
            known = self._versions.get(self._ref.uid)
            if known is None or not known.shows_progress:
                known = self._read()
            if known.shows_progress:
                self._apply(known, None)

        kube_calls.retry_on_conflict(remove, CONFLICT_ATTEMPTS)

    def _read(self) -> KnownVersion:
        """A read of the Migration, which must show the uid of the one this writer is for."""
        assert self._custom is not None
        ref = self._ref
        try:
            migration: dict[str, Any] = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, ref.namespace, PLURAL, ref.name, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as error:
            if kube_calls.is_not_found(error):
                raise _NotOurs from None
            raise
        if migration["metadata"].get("uid") != ref.uid:
            raise _NotOurs
        return KnownVersion.of(migration)

    def _apply(self, known: KnownVersion, status: dict[str, Any] | None) -> None:
        """Applies `status` conditional on the `known` version; the answer's version is the next write's."""
        assert self._custom is not None
        ref = self._ref
        applied = kube_calls.migration_status_apply(ref, known.resource_version, status)
        try:
            written: dict[str, Any] = self._custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, ref.namespace, PLURAL, ref.name, applied, field_manager=FIELD_MANAGER, force=True,
                _content_type=kube_calls.APPLY_PATCH, _request_timeout=REQUEST_TIMEOUT,
            )  # fmt: skip
        except Exception as error:
            # It may have landed all the same (a timeout): the version it carried, then stale, would cost a 409 and a
            # read, to this writer or to mirror_status; forgotten, it costs the read alone.
            self._versions.forget(ref.uid, known.resource_version)
            if isinstance(error, ApiException) and kube_calls.is_not_found(error):
                raise _NotOurs from None
            raise
        self._versions.remember(written)
        self.writes += 1

    def _quietly(self, write: Callable[[], None]) -> None:
        """Runs a write; what goes wrong is logged (a warning, once) and never reaches the activity."""
        try:
            write()
        except _NotOurs:
            if not self._gone:
                self._gone = True
                activity.logger.info("Migration %s is gone or was created again: no progress written", self._ref)
        except Exception as error:  # noqa: BLE001 - progress must never fail the step
            if not self._warned:
                self._warned = True
                said = server_message(error) if isinstance(error, ApiException) else scrub(str(error))
                activity.logger.warning(
                    "could not write the progress of Migration %s into its status (the step goes on): %s",
                    self._ref,
                    said,
                )


def _rounded(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 1)
