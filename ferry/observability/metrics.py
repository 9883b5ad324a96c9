"""Prometheus metrics: the Temporal SDK's own and ferry's, on one /metrics endpoint per process.

ferry's instruments are created from the SDK's metric meter (the runtime's in the watcher,
`activity.metric_meter()` and `workflow.metric_meter()` in the worker), so the SDK's
Prometheus exporter serves them beside its own; in workflows the meter is replay-safe.
The names below are a contract: deploy/prometheus/ alerts on them.
"""

from __future__ import annotations

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

STEP_DURATION = "ferry_step_duration_seconds"
"""Histogram {step, outcome}: how long a step took, retries included (outcome: succeeded | failed)."""
STEPS = "ferry_steps_total"
"""Counter {step, outcome}: steps finished."""
COMPENSATIONS = "ferry_compensations_total"
"""Counter {step, outcome}: undos run (outcome: succeeded | failed)."""
MIGRATIONS = "ferry_migrations"
"""Gauge {phase}: Migrations by phase, as the watcher last listed them."""
WATCHER_EVENTS = "ferry_watcher_events_total"
"""Counter {type}: Migration events the watcher received (LISTED, ADDED, MODIFIED, DELETED)."""
WATCHER_PASSES = "ferry_watcher_passes_total"
"""Counter {action}: passes the watcher made over a Migration, by what each did (`nothing`, `start+finalizer`, ...)."""
WATCHER_TEMPORAL_CALLS = "ferry_watcher_temporal_calls_total"
"""Counter {call}: calls the watcher made to Temporal (start_workflow, describe_workflow, list_workflows, ...)."""
EVENT_TO_START = "ferry_watcher_event_to_start_seconds"
"""Histogram: from the watcher receiving a Migration without a workflow to that workflow existing."""
STATUS_PATCH = "ferry_status_patch_seconds"
"""Histogram: how long mirroring the saga's status into a Migration took."""
STATUS_PATCH_CONFLICTS = "ferry_status_patch_conflicts_total"
"""Counter: 409 Conflicts retried while mirroring status."""
STEP_STARTED = "ferry_migration_step_started_timestamp_seconds"
"""Gauge {namespace, name, step}: when the running step of a Migration started (for "stuck" alerts)."""
DELETION_PENDING = "ferry_deletion_pending_since_timestamp_seconds"
"""Gauge {namespace, name}: since when a deleted Migration waits for its undo or cleanup."""
WRITE_DOWNTIME = "ferry_write_downtime_seconds"
"""Histogram {outcome: moved|undone}: from the freeze's start until traffic moved, or until the freeze was undone."""

_LONG = [0.5, 1, 5, 15, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600]
_SHORT = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
BUCKETS = {STEP_DURATION: _LONG, WRITE_DOWNTIME: _LONG, EVENT_TO_START: _SHORT, STATUS_PATCH: _SHORT}


def prometheus_runtime(bind_address: str, component: str) -> Runtime:
    """A Temporal runtime whose metrics (the SDK's and ferry's) are served at http://bind_address/metrics."""
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(
                bind_address=bind_address,
                durations_as_seconds=True,
                histogram_bucket_overrides=BUCKETS,
            ),
            global_tags={"component": component},
        )
    )
