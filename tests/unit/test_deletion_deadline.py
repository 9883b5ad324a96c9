"""The deletion's deadline: never reached before a running run was asked to roll back, and not reached early because
the replica that set it has a clock of its own.

The Temporal client and the watcher's writer are stand-ins here: what is specified is the order of the handler's
calls and when it lets go, not what the servers answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from ferry.api.migration import CLOCK_SKEW_ALLOWANCE, FINALIZER, DeletionStatus, Migration
from tests import samples
from watcher.deletion import DeletionHandler
from watcher.settings import WatcherSettings

pytestmark = pytest.mark.unit

CANCELLED = "rolling back before deletion: the workflow was cancelled"


@dataclasses.dataclass
class Description:
    status: WorkflowExecutionStatus
    close_time: datetime | None = None


class Run:
    """A run that keeps running; `describe` takes `slow` seconds (a Temporal under load)."""

    def __init__(self, calls: list[str], slow: float = 0.0) -> None:
        self.id = "migration/shop/m/u"
        self._calls = calls
        self._slow = slow

    async def describe(self) -> Description:
        await asyncio.sleep(self._slow)
        return Description(WorkflowExecutionStatus.RUNNING)

    async def cancel(self) -> None:
        self._calls.append("cancel")

    async def result(self) -> Any:
        await asyncio.Event().wait()


class Client:
    def __init__(self, run: Run) -> None:
        self._run = run

    def get_workflow_handle(self, workflow_id: str, **_: Any) -> Run:
        assert workflow_id == self._run.id
        return self._run


class Writer:
    def __init__(self, calls: list[str]) -> None:
        self._calls = calls

    async def event(self, ref: Any, kind: Any, reason: str, message: str, key: str) -> None:
        self._calls.append(f"event {reason}")

    async def waiting_for_deletion(self, ref: Any, deletion: DeletionStatus) -> None:
        self._calls.append("waiting")

    async def remove_finalizer(self, migration: Migration) -> None:
        self._calls.append("released")

    async def remove_secret_finalizer(self, namespace: str, name: str, finalizer: str) -> None:
        pass


def deleted(deletion: DeletionStatus | None = None) -> Migration:
    """A Migration being deleted, held by ferry's finalizer, whose run is started and not finished."""
    raw = samples.migration("m")
    raw["metadata"] = {
        "name": "m", "namespace": "shop", "uid": "u", "resourceVersion": "7", "finalizers": [FINALIZER],
        "deletionTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }  # fmt: skip
    status: dict[str, Any] = {"phase": "Running", "workflow": {"namespace": "default", "id": "migration/shop/m/u"}}
    if deletion is not None:
        status["deletion"] = deletion.model_dump(mode="json", by_alias=True)
    return Migration.parse({**raw, "status": status})


def waiting(deadline: datetime, why: str) -> DeletionStatus:
    return DeletionStatus(
        message=f"{why}; the finalizer {FINALIZER} is released when it finishes, or at {deadline:%H:%M:%SZ}",
        waiting_since=deadline - timedelta(minutes=30),
        deadline=deadline,
    )


@pytest.fixture
def calls() -> list[str]:
    return []


@pytest.fixture
async def handler(calls: list[str], request: pytest.FixtureRequest) -> AsyncIterator[DeletionHandler]:
    slow, timeout = getattr(request, "param", (0.0, 1800.0))
    settings = WatcherSettings(deletion_timeout=timeout)
    made = DeletionHandler(Client(Run(calls, slow)), Writer(calls), settings, lambda ref: None)  # type: ignore[arg-type]
    yield made
    await made.close()


def test_a_deletion_timeout_of_zero_is_refused() -> None:
    """Zero meant: let go before the run was even asked to roll back."""
    with pytest.raises(ValueError, match="greater than 0"):
        WatcherSettings(deletion_timeout=0)


@pytest.mark.parametrize("handler", [(0.05, 0.01)], indirect=True)
async def test_a_run_is_asked_to_roll_back_before_a_deadline_shorter_than_the_describe_lets_the_migration_go(
    handler: DeletionHandler, calls: list[str]
) -> None:
    await handler.handle(deleted())

    assert calls == ["cancel", "event FinalizerReleased", "released"]


async def test_a_run_never_asked_to_roll_back_is_asked_before_a_passed_deadline_lets_the_migration_go(
    handler: DeletionHandler, calls: list[str]
) -> None:
    """status.deletion records another reason (its deadline passed long ago): the cancel goes first all the same."""
    past = datetime.now(UTC) - timedelta(hours=1)

    await handler.handle(deleted(waiting(past, "its run has succeeded and is closing")))

    assert calls == ["cancel", "event FinalizerReleased", "released"]


async def test_a_deadline_another_replica_set_is_not_reached_early_by_a_clock_that_runs_ahead(
    handler: DeletionHandler, calls: list[str]
) -> None:
    """By this replica's clock the deadline passed 30 s ago; the one that wrote it may run that much behind."""
    recorded = deleted(waiting(datetime.now(UTC) - timedelta(seconds=30), CANCELLED))

    await handler.handle(recorded)

    assert calls == [], "still waiting for the rollback: no second cancel, no release"


async def test_a_deadline_passed_by_more_than_the_allowance_lets_the_migration_go(
    handler: DeletionHandler, calls: list[str]
) -> None:
    recorded = deleted(waiting(datetime.now(UTC) - CLOCK_SKEW_ALLOWANCE - timedelta(seconds=1), CANCELLED))

    await handler.handle(recorded)

    assert calls == ["event FinalizerReleased", "released"]
