"""Observability settings shared by the worker and the watcher: metrics endpoint, traces, log format."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from ferry.observability.tracing import TracingSettings


@dataclasses.dataclass(frozen=True)
class ObservabilitySettings:
    metrics_address: str | None = None
    """host:port to serve Prometheus metrics on at /metrics (the SDK's and ferry's); None: no endpoint."""
    tracing: TracingSettings = dataclasses.field(default_factory=TracingSettings)
    log_format: str = "json"
    """`json` (one object per line, for log collectors) or `text` (for a terminal)."""
    health_address: str | None = None
    """host:port to answer Kubernetes probes on (/healthz, /readyz); None: no endpoint."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("observability")
    group.add_argument(
        "--metrics-address",
        default=os.environ.get("FERRY_METRICS_ADDRESS"),
        help="serve Prometheus metrics at http://ADDRESS/metrics, e.g. 0.0.0.0:9464 [FERRY_METRICS_ADDRESS] "
        "(default: off)",
    )
    group.add_argument(
        "--otlp-endpoint",
        default=os.environ.get("FERRY_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        help="send traces to this OTLP/HTTP collector, e.g. http://otel-collector:4318 "
        "[FERRY_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT] (default: off)",
    )
    group.add_argument(
        "--trace-file",
        type=Path,
        default=os.environ.get("FERRY_TRACE_FILE"),
        help="append finished spans to this file as JSON lines [FERRY_TRACE_FILE] (default: off)",
    )
    group.add_argument(
        "--health-address",
        default=os.environ.get("FERRY_HEALTH_ADDRESS"),
        help="answer probes at http://ADDRESS/healthz and /readyz, e.g. 0.0.0.0:8080 [FERRY_HEALTH_ADDRESS] "
        "(default: off)",
    )
    group.add_argument(
        "--log-format",
        choices=("json", "text"),
        default=os.environ.get("FERRY_LOG_FORMAT", "json"),
        help="json: one object per line with the Migration's namespace, name, generation and workflow ID; "
        "text: for a terminal [FERRY_LOG_FORMAT] (default: %(default)s)",
    )


def from_arguments(args: argparse.Namespace) -> ObservabilitySettings:
    return ObservabilitySettings(
        metrics_address=args.metrics_address,
        tracing=TracingSettings(otlp_endpoint=args.otlp_endpoint, file=args.trace_file),
        log_format=args.log_format,
        health_address=args.health_address,
    )
