"""The watcher's metrics, from what it sees of Migrations (names in ferry.observability.metrics)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from temporalio.common import MetricMeter

from ferry.api.migration import Phase
from ferry.observability import metrics as names


def _timestamp(raw: str | None) -> float:
    return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp() if raw else 0.0


class WatcherMetrics:
    def __init__(self, meter: MetricMeter) -> None:
        self.events = meter.create_counter(names.WATCHER_EVENTS, "Migration events the watcher received")
        self.event_to_start = meter.create_histogram_float(
            names.EVENT_TO_START, "From receiving a Migration without a workflow to that workflow existing", "s"
        )
        self._migrations = meter.create_gauge(names.MIGRATIONS, "Migrations by phase, as last listed")
        self._step_started = meter.create_gauge_float(
            names.STEP_STARTED, "When the running step of a Migration started (0: none running)", "s"
        )
        self._deletion_pending = meter.create_gauge_float(
            names.DELETION_PENDING, "Since when a deleted Migration waits for its undo (0: not waiting)", "s"
        )
        self._running: set[tuple[str, str, str]] = set()
        self._deleting: set[tuple[str, str]] = set()

    def observe_listing(self, items: list[dict[str, Any]]) -> None:
        """Updates the gauges from a full list of Migrations (gauges cannot forget a series: they go to 0)."""
        by_phase = dict.fromkeys((phase.value for phase in Phase), 0)
        running: dict[tuple[str, str, str], float] = {}
        deleting: dict[tuple[str, str], float] = {}
        for item in items:
            status = item.get("status") or {}
            phase = status.get("phase") or Phase.PENDING.value
            by_phase[phase] = by_phase.get(phase, 0) + 1
            key = (item["metadata"]["namespace"], item["metadata"]["name"])
            step = status.get("currentStep")
            if step and status.get("phase") in (Phase.RUNNING.value, Phase.ROLLING_BACK.value):
                entry: dict[str, Any] = next((s for s in status.get("steps") or [] if s.get("name") == step), {})
                running[(*key, step)] = _timestamp(entry.get("startedAt"))
            if (status.get("deletion") or {}).get("waitingSince"):
                deleting[key] = _timestamp(status["deletion"]["waitingSince"])
        for phase, count in by_phase.items():
            self._migrations.set(count, {"phase": phase})
        for namespace, name, step in self._running - running.keys():
            self._step_started.set(0.0, {"namespace": namespace, "name": name, "step": step})
        for (namespace, name, step), started in running.items():
            self._step_started.set(started, {"namespace": namespace, "name": name, "step": step})
        for namespace, name in self._deleting - deleting.keys():
            self._deletion_pending.set(0.0, {"namespace": namespace, "name": name})
        for (namespace, name), since in deleting.items():
            self._deletion_pending.set(since, {"namespace": namespace, "name": name})
        self._running, self._deleting = set(running), set(deleting)
