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
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from kubernetes import client as k8s
from urllib3 import BaseHTTPResponse
from urllib3.connectionpool import ConnectionPool
from urllib3.exceptions import ReadTimeoutError
from urllib3.util.retry import Retry


@dataclasses.dataclass(frozen=True)
class RequestTimeouts:
    """How long one request to the API server may take; a call that passes `_request_timeout` chooses its own."""

    connect: float = 5.0
    """Seconds to open the connection (TCP and TLS)."""
    read: float = 30.0
    """Seconds to wait for the response to start, and between two reads of it; not applied to watches."""


DEFAULT_TIMEOUTS = RequestTimeouts()


class ReadTimeoutsNotRetried(Retry):
    """urllib3's retries, except that a read that timed out is not tried again.

    By default urllib3 tries an idempotent request (every GET) three more times after a
    read timeout, so a hung API server held a read for four read timeouts (two minutes)
    instead of one. An activity that does not heartbeat then outlives its heartbeat
    timeout and Temporal starts a second attempt beside it. A read timeout means the
    server took the request and did not answer: asking again at once rarely helps, and
    the caller (the step's next attempt, the watcher's next pass) tries again anyway.
    Connections refused or dropped before an answer are still retried, as before.
    """

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> Self:
        if isinstance(error, ReadTimeoutError):
            raise error
        return super().increment(method, url, response, error, _pool, _stacktrace)


def request_retries() -> Retry:
    """The retries every Kubernetes API client of ferry makes: urllib3's default count, read timeouts excepted."""
    return ReadTimeoutsNotRetried(Retry.DEFAULT.total)


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
