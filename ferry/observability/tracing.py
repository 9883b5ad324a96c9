"""OpenTelemetry tracing: one trace per migration, from the watcher's event to the last activity.

The watcher opens a span around the handling that starts a Migration's workflow; the
Temporal SDK's tracing interceptor carries its context into the workflow's headers, so
the workflow's spans and every activity's span join the same trace, whichever worker
runs them. Spans go to an OTLP/HTTP collector, or to a file of JSON lines (the local
stack and the tests use that), or both.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult
from pydantic.dataclasses import dataclass

from ferry.configuration.knobs import SETTINGS, Knob


@dataclass(frozen=True, config=SETTINGS)
class TracingSettings:
    """Where spans go: an OTLP collector, a file, both or nowhere."""

    otlp_endpoint: Annotated[str | None, Knob(also_env=("OTEL_EXPORTER_OTLP_ENDPOINT",))] = None
    """Send traces to this OTLP/HTTP collector, e.g. http://otel-collector:4318; spans go to /v1/traces
    (default: off)."""
    file: Annotated[Path | None, Knob(flag="trace-file")] = None
    """Append finished spans to this file as JSON lines (default: off)."""

    @property
    def enabled(self) -> bool:
        return bool(self.otlp_endpoint or self.file)


class JsonLinesExporter(SpanExporter):
    """Appends spans to a file, one JSON object a line; processes sharing the file take turns."""

    def __init__(self, path: Path) -> None:
        self._path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(json.loads(span.to_json())) + "\n" for span in spans)
        with self._path.open("a") as out:
            fcntl.flock(out, fcntl.LOCK_EX)
            out.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def configure(settings: TracingSettings, service: str) -> TracerProvider | None:
    """Installs the global tracer provider; None (tracing off) when no destination is set."""
    if not settings.enabled:
        return None
    existing = trace.get_tracer_provider()
    if isinstance(existing, TracerProvider):
        provider = existing  # a second component in the same process shares it
    else:
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        trace.set_tracer_provider(provider)
    # The worker and the watcher may share a process (ferry up, tests): each destination once.
    if settings.otlp_endpoint and ("otlp", settings.otlp_endpoint) not in _destinations:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = settings.otlp_endpoint.rstrip("/") + "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        _destinations.add(("otlp", settings.otlp_endpoint))
    if settings.file and ("file", str(settings.file)) not in _destinations:
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(settings.file)))
        _destinations.add(("file", str(settings.file)))
    return provider


_destinations: set[tuple[str, str]] = set()
