"""The API server's deterministic refusals, turned into failures that say what to do and are never retried.

A 400 or 422 means the request itself is wrong, typically an object ferry built from the
Migration's spec and its source that the API server does not accept (e.g. requests
above limits): sending it again gets the same answer. A 403 means ferry's
ServiceAccount lacks a permission. Left alone, either would be a plain ApiException,
retried until the step's timeout and shown as an HTTP dump; here they become
InvalidSpec and PermissionDenied, which every retry policy lists as non-retryable,
with the server's own sentence (the `message` of its Status body, scrubbed: a 422 quotes
the values it refused, which may be anything the spec or the source held) and what to do.
Everything else (conflicts, timeouts, 5xx) stays retryable.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from kubernetes.client.exceptions import ApiException

from ferry.api.errors import InvalidSpec, PermanentError, PermissionDenied
from ferry.api.scrubbing import api_server_said

F = TypeVar("F", bound=Callable[..., Any])

INVALID_REQUEST = (400, 422)
FORBIDDEN = 403


def server_message(error: ApiException) -> str:
    """What the API server said, in its words (the Status body's message, else the HTTP reason), values withheld."""
    return api_server_said(error.status, error.reason, error.body)


def refusal(error: ApiException, migration: object = None) -> PermanentError | None:
    """The permanent failure a refusal stands for, or None when retrying may help."""
    said = server_message(error)
    if error.status == FORBIDDEN:
        return PermissionDenied(
            f"the Kubernetes API server refused: {said}. Grant that permission to ferry's worker "
            "(deploy/rbac/worker_role.yaml), then retry the step or roll back."
        )
    if error.status in INVALID_REQUEST:
        which = f"Migration {migration}" if migration is not None else "the Migration"
        return InvalidSpec(
            f"the Kubernetes API server refused what ferry asked for {which}: {said}. Correct what it names "
            f"(in the spec, or in the source it copies), then delete {which} and create it again."
        )
    return None


def explain_refusals(method: F) -> F:
    """Wraps an activity method (whose input has a `ref`) so that refusals end it as permanent failures."""

    @functools.wraps(method)
    def explained(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except ApiException as error:
            failure = refusal(error, getattr(args[0], "ref", None) if args else None)
            if failure is None:
                raise
            raise failure from None

    return cast(F, explained)
