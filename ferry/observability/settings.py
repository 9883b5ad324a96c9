"""Observability settings shared by the worker and the watcher: metrics endpoint, traces, log format, probes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field
from pydantic.dataclasses import dataclass

from ferry.configuration.knobs import SETTINGS
from ferry.observability.tracing import TracingSettings


def host_port(address: str) -> str:
    """Checks `host:port` (an empty host means every interface), as the listeners below take it."""
    _, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("should be host:port, e.g. 0.0.0.0:8080, with a port from 1 to 65535")
    return address


HostPort = Annotated[str, AfterValidator(host_port)]


@dataclass(frozen=True, config=SETTINGS)
class ObservabilitySettings:
    """How the component shows what it does: Prometheus metrics, traces, logs and Kubernetes probes."""

    metrics_address: HostPort | None = None
    """Serve Prometheus metrics at http://ADDRESS/metrics, e.g. 0.0.0.0:9464: the SDK's and ferry's (default: off)."""
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    log_format: Literal["json", "text"] = "json"
    """json: one object per line with the Migration's namespace, name, generation and workflow ID; text: for a
    terminal."""
    health_address: HostPort | None = None
    """Answer Kubernetes probes at http://ADDRESS/healthz and /readyz, e.g. 0.0.0.0:8080 (default: off)."""
