"""Reading metric names out of PromQL as the dashboard test does: functions, keywords, labels, ranges are no metrics."""

from __future__ import annotations

import pytest

from tests.observability.promql import exposed_names, metric_names

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ('sum by (step) (rate(ferry_steps_total{outcome="failed"}[15m]))', {"ferry_steps_total"}),
        ("time() - (ferry_migration_step_started_timestamp_seconds > 0) > 3 * 3600",
         {"ferry_migration_step_started_timestamp_seconds"}),
        ("max(ferry_migrations) > 0 and sum(rate(ferry_watcher_events_total[10m])) == 0",
         {"ferry_migrations", "ferry_watcher_events_total"}),
        ("histogram_quantile(0.99, sum by (le) (rate(ferry_status_patch_seconds_bucket[$__rate_interval])))",
         {"ferry_status_patch_seconds_bucket"}),
        ("sum(rate(a:recorded[5m] offset 1h)) without (pod) / on (instance) group_left (team) up{job=~'a|b'} * 1e3",
         {"a:recorded", "up"}),
        ('label_replace(ferry_migrations, "to", "$1", "phase", "(.*)")', {"ferry_migrations"}),
        ("sum(ferry_migrations) by (phase) + rate(temporal_request[5m:30s])", {"ferry_migrations", "temporal_request"}),
    ],
)  # fmt: skip
def test_metric_names_are_the_selected_series_only(expression: str, names: set[str]) -> None:
    assert metric_names(expression) == names


def test_exposed_names_are_the_sample_names_of_an_exposition() -> None:
    exposition = (
        "# HELP ferry_steps_total Saga steps finished\n"
        "# TYPE ferry_steps_total counter\n"
        'ferry_steps_total{step="freeze",outcome="succeeded"} 1\n'
        'ferry_status_patch_seconds_bucket{le="0.1"} 3\n'
        "ferry_status_patch_seconds_count 3\n"
    )

    assert exposed_names(exposition) == {
        "ferry_steps_total",
        "ferry_status_patch_seconds_bucket",
        "ferry_status_patch_seconds_count",
    }
