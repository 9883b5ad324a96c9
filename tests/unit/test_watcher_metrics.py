"""The watcher's gauges follow watch events, not only resyncs: a step or a deletion shorter than a resync shows."""

from __future__ import annotations

from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig

from ferry.api.migration import Phase
from ferry.observability import metrics as names
from watcher.inventory import Summary
from watcher.metrics import WatcherMetrics

KEY = ("shop", "orders")


def _gauges() -> tuple[WatcherMetrics, MetricBuffer]:
    buffer = MetricBuffer(1000)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    return WatcherMetrics(runtime.metric_meter), buffer


Series = dict[tuple[tuple[str, object], ...], float]


def _last(buffer: MetricBuffer) -> dict[str, Series]:
    """The last value of each series set since the previous call, by metric name."""
    values: dict[str, Series] = {}
    for update in buffer.retrieve_updates():
        labels = {k: v for k, v in update.attributes.items() if k != "service_name"}
        values.setdefault(update.metric.name, {})[tuple(sorted(labels.items()))] = update.value
    return values


def test_a_deletion_seen_in_one_event_is_served_before_any_resync() -> None:
    metrics, buffer = _gauges()
    metrics.changed(KEY, Summary(uid="u", phase=Phase.RUNNING, deletion_since=1_000.0))

    assert _last(buffer)[names.DELETION_PENDING] == {(("name", "orders"), ("namespace", "shop")): 1_000.0}


def test_a_migration_gone_sets_its_deletion_and_step_gauges_to_zero() -> None:
    metrics, buffer = _gauges()
    metrics.changed(
        KEY, Summary(uid="u", phase=Phase.ROLLING_BACK, step="provision", step_started=5.0, deletion_since=1_000.0)
    )
    buffer.retrieve_updates()

    metrics.changed(KEY, None)

    served = _last(buffer)
    assert served[names.DELETION_PENDING] == {(("name", "orders"), ("namespace", "shop")): 0.0}
    assert served[names.STEP_STARTED] == {(("name", "orders"), ("namespace", "shop"), ("step", "provision")): 0.0}


def test_a_new_step_zeroes_the_previous_one() -> None:
    metrics, buffer = _gauges()
    metrics.changed(KEY, Summary(uid="u", phase=Phase.RUNNING, step="freeze", step_started=5.0))
    buffer.retrieve_updates()

    metrics.changed(KEY, Summary(uid="u", phase=Phase.RUNNING, step="snapshot", step_started=9.0))

    assert _last(buffer)[names.STEP_STARTED] == {
        (("name", "orders"), ("namespace", "shop"), ("step", "freeze")): 0.0,
        (("name", "orders"), ("namespace", "shop"), ("step", "snapshot")): 9.0,
    }
