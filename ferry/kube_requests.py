"""Every request to the Kubernetes API gets a deadline, so a dead connection fails a call instead of hanging it.

The generated client waits forever unless each call passes `_request_timeout`: a
half-open connection to the API server would then hold a worker thread, and the step,
until the step's start-to-close timeout (minutes to days) ends the attempt. The client
that `ferry.clients.kubernetes_client` builds gives every call a connect and a read
timeout unless the call passes its own. Watches and log streams stay open on purpose
and may be quiet for minutes, so they get only the connect timeout; the API server
ends a watch after its timeoutSeconds.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client as k8s


@dataclasses.dataclass(frozen=True)
class RequestTimeouts:
    """How long one request to the API server may take; a call that passes `_request_timeout` chooses its own."""

    connect: float = 5.0
    """Seconds to open the connection (TCP and TLS)."""
    read: float = 30.0
    """Seconds to wait for the response to start, and between two reads of it; not applied to watches."""


DEFAULT_TIMEOUTS = RequestTimeouts()


def _streams(url: str) -> bool:
    """Whether a request asks for a stream that stays open: a watch, or a followed log."""
    query = parse_qs(urlsplit(url).query)
    return "true" in query.get("watch", []) or "true" in query.get("follow", [])


class BoundedApiClient(k8s.ApiClient):  # type: ignore[misc]  # the generated client is untyped
    """An ApiClient whose calls all have `timeouts`, unless a call passes `_request_timeout` itself."""

    def __init__(self, configuration: k8s.Configuration, timeouts: RequestTimeouts) -> None:
        super().__init__(configuration)
        self.timeouts = timeouts

    def call_api(self, method: Any, url: Any, *args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        if _request_timeout is None:
            read = None if _streams(str(url)) else self.timeouts.read
            _request_timeout = (self.timeouts.connect, read)
        return super().call_api(method, url, *args, _request_timeout=_request_timeout, **kwargs)
