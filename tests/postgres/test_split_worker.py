"""A worker split in two processes' worth of roles: one runs the saga and its status writes, the other the steps.

Both are ferry's real worker (`runner.run`) in this process, on the test's task queue, with
`runs` set; the history tells which of them did what, by the identity each gives Temporal.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Literal

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from devstack.stack.stack import StackInfo
from tests.conftest import Kubectl
from tests.end_to_end import (
    Databases,
    apply_migration,
    migration_manifest,
    running_worker,
    start_migration,
    worker_settings,
)
from tests.postgres.data import contents, create_shop
from worker import runner
from worker.settings import WorkerSettings

SAGA_TIMEOUT = 240


def _split(stack: StackInfo, task_queue: str, runs: Literal["workflows", "activities"]) -> WorkerSettings:
    return dataclasses.replace(worker_settings(stack, task_queue), runs=runs)


@pytest.fixture
async def split_worker(stack: StackInfo, task_queue: str) -> AsyncIterator[dict[str, str]]:
    """A `workflows` worker and an `activities` worker; yields each role's identity."""
    roles: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as running:
        for runs in ("workflows", "activities"):
            settings = _split(stack, task_queue, runs)
            roles[runs] = runner.identity(settings)
            await running.enter_async_context(running_worker(settings))
        yield roles


async def test_a_migration_succeeds_on_a_split_worker_with_every_step_on_one_side_and_the_saga_on_the_other(
    stack: StackInfo,
    databases: Databases,
    bucket: str,
    migration_secrets: None,
    source_workload: str,
    migration_crd: str,
    split_worker: dict[str, str],
    temporal_client: Client,
    task_queue: str,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    create_shop(databases.source, customers=50, orders=500)
    manifest = migration_manifest(stack, bucket)
    ref = apply_migration(kubectl, namespace, manifest)

    handle = await start_migration(temporal_client, ref, manifest, task_queue)
    result = await asyncio.wait_for(handle.result(), SAGA_TIMEOUT)

    assert result["phase"] == "Succeeded"
    assert contents(databases.target) == contents(databases.source)
    ran: dict[str, set[str]] = {"workflow tasks": set(), "activities": set()}
    status_writes = 0
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            ran["workflow tasks"].add(event.workflow_task_started_event_attributes.identity)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            ran["activities"].add(event.activity_task_started_event_attributes.identity)
        elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            status_writes += event.marker_recorded_event_attributes.marker_name == "core_local_activity"
    assert ran == {"workflow tasks": {split_worker["workflows"]}, "activities": {split_worker["activities"]}}
    assert status_writes > 0, "the saga's status writes ran as local activities, beside its workflow tasks"
    assert await asyncio.to_thread(_phase_shown, kubectl, namespace, ref.name) == "Succeeded"


def _phase_shown(kubectl: Kubectl, namespace: str, name: str) -> str:
    return kubectl("get", "migration", name, "-n", namespace, "-o", "jsonpath={.status.phase}").stdout.strip()
