"""A worker interceptor that calls a function with each heartbeat's details, to break something at a known point.

The hook runs where the SDK sends heartbeats (the worker's event loop), while the
activity's thread waits for it; so whatever the hook does happens before the
activity goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio.worker import ActivityInboundInterceptor, ActivityOutboundInterceptor, Interceptor

Hook = Callable[[dict[str, Any]], None]


class OnHeartbeat(Interceptor):
    def __init__(self, hook: Hook) -> None:
        self._hook = hook

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self._hook)


class _Inbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, hook: Hook) -> None:
        super().__init__(next)
        self._hook = hook

    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        super().init(_Outbound(outbound, self._hook))


class _Outbound(ActivityOutboundInterceptor):
    def __init__(self, next: ActivityOutboundInterceptor, hook: Hook) -> None:
        super().__init__(next)
        self._hook = hook

    def heartbeat(self, *details: Any) -> None:
        self._hook(details[0] if details and isinstance(details[0], dict) else {})
        super().heartbeat(*details)
