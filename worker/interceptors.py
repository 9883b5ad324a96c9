"""Worker interceptors: the Migration on every log line, refusals by the API server explained, errors scrubbed.

The workflow knows the Migration's generation from its input; its outbound interceptor
adds it to every activity it schedules as a `ferry-generation` header (deterministic,
so replays see the same). The activity interceptor reads that header and the
activity's input (`ref`) and sets the logging context around the activity; the
workflow interceptor does the same around the workflow's code.

A 403 from the API server becomes PermissionDenied, a failure retrying cannot fix,
whose message is the server's own sentence (who may not do what, scrubbed as
activities/api_refusals.py scrubs every refusal) and what to do, instead of a dump of
the HTTP response. Any other error of the API server or of PostgreSQL that an activity
did not catch leaves it scrubbed (ferry/failures.py): the SDK logs what leaves the
activity with its message, and a DETAIL quoting a row must not reach the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.converter import default as default_converter
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from activities.api_refusals import FORBIDDEN, refusal
from ferry.failures import scrubbed
from ferry.observability.logs import bind, migration_context
from worker.headers import AddsHeaders

GENERATION_HEADER = "ferry-generation"


def _ref_fields(args: Any) -> dict[str, Any]:
    for argument in args:
        ref = getattr(argument, "ref", None)
        if ref is not None and hasattr(ref, "namespace"):
            return {"namespace": ref.namespace, "name": ref.name}
    return {}


def _generation(headers: Any) -> int | None:
    payload: Payload | None = headers.get(GENERATION_HEADER) if headers else None
    if payload is None:
        return None
    value = default_converter().payload_converter.from_payload(payload, int)
    return int(value)


class _ActivityLogContext(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        fields = _ref_fields(input.args)
        with migration_context(
            workflow_id=activity.info().workflow_id, generation=_generation(input.headers), **fields
        ):
            try:
                return await self.next.execute_activity(input)
            except ApiException as error:
                denied = refusal(error) if error.status == FORBIDDEN else None
                raise (denied or scrubbed(error)) from None
            except psycopg.Error as error:
                raise scrubbed(error) from None


class _WorkflowOutbound(AddsHeaders):
    def __init__(self, next: WorkflowOutboundInterceptor, generation: list[int | None]) -> None:
        super().__init__(next)
        self._generation = generation

    def add(self, headers: Mapping[str, Payload], activity: str) -> Mapping[str, Payload]:
        if self._generation[0] is None:
            return headers
        payload = default_converter().payload_converter.to_payload(self._generation[0])
        return {**headers, GENERATION_HEADER: payload}


class _WorkflowLogContext(WorkflowInboundInterceptor):
    def __init__(self, next: WorkflowInboundInterceptor) -> None:
        super().__init__(next)
        self._generation: list[int | None] = [None]

    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_WorkflowOutbound(outbound, self._generation))

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        first = input.args[0] if input.args else None
        self._generation[0] = getattr(first, "generation", None)
        # The workflow's task has its own context; an evicted workflow's coroutine is closed
        # from elsewhere, so the fields are bound for the task rather than reset on the way out.
        bind(generation=self._generation[0], **_ref_fields(input.args))
        return await self.next.execute_workflow(input)


class LogContextInterceptor(Interceptor):
    """Adds namespace, name, generation and workflow ID to the logs of ferry's workflows and activities."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityLogContext(next)

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _WorkflowLogContext
