"""Settings of the Kubernetes-side activities, one typed object the worker fills from its flags."""

from __future__ import annotations

import dataclasses
import socket


@dataclasses.dataclass(frozen=True)
class KubeActivitySettings:
    """How the Kubernetes-side activities poll, label their writes and link to Temporal."""

    poll_interval: float = 1.0
    """Seconds between two polls while an activity waits for the cluster (readiness, endpoints, deletion)."""

    temporal_ui_url: str | None = None
    """Base URL of the Temporal Web UI, e.g. http://localhost:8233. When set, status.workflow.url
    links to the run: {ui}/namespaces/{ns}/workflows/{id}/{run_id}/history."""

    field_manager: str = "ferry"
    """Field manager of ferry's server-side applies, as `kubectl get -o yaml --show-managed-fields` shows it."""

    reporting_instance: str = dataclasses.field(default_factory=socket.gethostname)
    """reportingInstance of the Events ferry records: which worker wrote them (default: the host name)."""
