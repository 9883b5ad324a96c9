"""The base of the workflow interceptors that send something with every activity a workflow starts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.worker import StartActivityInput, StartLocalActivityInput, WorkflowOutboundInterceptor


class AddsHeaders(WorkflowOutboundInterceptor):
    """Gives every activity and local activity (the status writes) the workflow starts the headers of `add`."""

    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        input.headers = self.add(input.headers, input.activity)
        return self.next.start_activity(input)

    def start_local_activity(self, input: StartLocalActivityInput) -> workflow.ActivityHandle[Any]:
        input.headers = self.add(input.headers, input.activity)
        return self.next.start_local_activity(input)

    def add(self, headers: Mapping[str, Payload], activity: str) -> Mapping[str, Payload]:
        """`headers` of a call of `activity` with this interceptor's own added; deterministic, since it runs in
        workflow code."""
        raise NotImplementedError
