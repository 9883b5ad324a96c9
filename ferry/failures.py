"""Failures as Temporal records them: every message scrubbed, so no row value or field value reaches a history.

The activities scrub what they quote of a server or a tool (ferry.api.scrubbing), but an
exception nobody caught (a psycopg error in the middle of verify, an ApiException after
the conflicts ran out, a botocore error) reaches Temporal as it is, and Temporal keeps
its message in the workflow's history for as long as the namespace's retention, and the
saga copies it into the status and an Event. This converter is the one place every
failure passes on its way into a history, from activities and workflows alike: it
scrubs the message of each failure of the chain, turns a Kubernetes HTTP dump into the
API server's sentence, and adds a PostgreSQL error's SQLSTATE. Stack traces stay: they
hold ferry's source lines, not values.

The worker's activity interceptor also replaces such an exception by `scrubbed(it)`
before the SDK logs it ("Completing activity as failed", with its message), so the
worker's log holds no more than the history.
"""

from __future__ import annotations

import psycopg
from kubernetes.client.exceptions import ApiException
from temporalio.api.failure.v1 import Failure
from temporalio.converter import DefaultFailureConverter, PayloadConverter
from temporalio.exceptions import ApplicationError, FailureError

from ferry.api.scrubbing import api_server_said, scrub


class ScrubbingFailureConverter(DefaultFailureConverter):
    """Temporal's failure converter, with every message of the chain scrubbed."""

    def to_failure(self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure) -> None:
        super().to_failure(exception, payload_converter, failure)
        if not isinstance(exception, FailureError):
            failure.message = said(exception)
        level = failure
        while True:
            level.message = scrub(level.message)
            if not level.HasField("cause"):
                return
            level = level.cause


def said(exception: BaseException) -> str:
    """What an exception from a client library says, in words a person reads, before scrubbing."""
    if isinstance(exception, ApiException):
        # Its str() is an HTTP dump: the response's headers and its whole body.
        said = api_server_said(exception.status, exception.reason, exception.body)
        return f"the Kubernetes API server answered {exception.status}: {said}"
    text = str(exception) or type(exception).__name__
    if isinstance(exception, psycopg.Error) and exception.sqlstate:
        first, _, rest = text.partition("\n")
        return f"{first} (SQLSTATE {exception.sqlstate})\n{rest}"
    return text


def scrubbed(exception: BaseException) -> ApplicationError:
    """`exception` as the failure Temporal would record: same type name and stack, its message scrubbed."""
    failure = ApplicationError(scrub(said(exception)), type=type(exception).__name__)
    return failure.with_traceback(exception.__traceback__)
