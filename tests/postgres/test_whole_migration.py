"""Whole migrations of real databases, through ferry's real worker and saga on the stack's Temporal server."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor, Worker

from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.stack import StackInfo
from ferry.api.saga import PrecheckResult, SnapshotResult
from tests.conftest import Kubectl
from tests.end_to_end import (
    SOURCE_SECRET,
    TARGET_SECRET,
    Databases,
    Ready,
    apply_migration,
    migration_manifest,
    readable_history,
    start_migration,
    worker_settings,
)
from tests.postgres.data import connect, contents, create_shop, database_settings, tables
from worker import runner
from workflows.migration import MigrationWorkflow

SAGA_TIMEOUT = 240


def _migration(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    migration: dict[str, Any] = json.loads(kubectl("get", "migration", name, "-n", namespace, "-o", "json").stdout)
    return migration


async def _attempts(handle: WorkflowHandle[Any, Any], activity_type: str) -> list[int]:
    """The attempt numbers with which the saga's history says `activity_type` ran (one entry per scheduling)."""
    scheduled: set[int] = set()
    attempts: list[int] = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == activity_type:
                scheduled.add(event.event_id)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            if started.scheduled_event_id in scheduled:
                attempts.append(started.attempt)
    return attempts


async def test_a_whole_migration_leaves_no_secret_in_its_history_logs_status_or_events(
    caplog: pytest.LogCaptureFixture,
    databases: Databases,
    ready: Ready,
) -> None:
    caplog.set_level(logging.DEBUG)
    create_shop(databases.source, customers=100, orders=2_000)
    manifest = ready.manifest()
    ref = ready.apply(manifest)

    handle = await ready.start(ref, manifest)
    result = await asyncio.wait_for(handle.result(), SAGA_TIMEOUT)

    assert result["phase"] == "Succeeded"
    assert contents(databases.target) == contents(databases.source)
    records = {
        "workflow history": readable_history((await handle.fetch_history()).to_json()),
        "logs": caplog.text,
        "Migration": json.dumps(ready.migration(ref.name)),
        "Events": ready.events(),
    }
    # Each record holds what it should, so the search below searches something real.
    assert result["snapshot"]["sha256"] in records["workflow history"]
    assert "froze database" in records["logs"]
    assert "restored into database" in records["logs"]  # the snapshot step restores as it uploads
    assert '"phase": "Succeeded"' in records["Migration"]
    assert "StepSucceeded" in records["Events"]
    secrets = {
        "source password": databases.source.password,
        "target password": databases.target.password,
        "S3 secret key": ready.stack.s3_secret_key,
    }
    for secret_name, secret in secrets.items():
        assert secret
        for record_name, text in records.items():
            assert secret not in text, f"the {secret_name} is in the {record_name}"


def _server_version_num(endpoint: PostgresEndpoint) -> int:
    with connect(endpoint) as conn:
        row = conn.execute("select current_setting('server_version_num')::int").fetchone()
    assert row is not None
    return int(row[0])


async def _precheck_result(handle: WorkflowHandle[Any, Any]) -> PrecheckResult:
    """What the precheck step returned, as the saga's history keeps it."""
    scheduled: set[int] = set()
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == "postgresql.precheck":
                scheduled.add(event.event_id)
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            completed = event.activity_task_completed_event_attributes
            if completed.scheduled_event_id in scheduled:
                return PrecheckResult.model_validate_json(completed.result.payloads[0].data)
    raise AssertionError("the history holds no completed precheck")


async def test_a_whole_migration_carries_the_data_from_postgresql_15_up_to_18(
    databases: Databases,
    ready: Ready,
) -> None:
    create_shop(databases.source, customers=100, orders=2_000)
    with connect(databases.source) as conn:  # an extension both majors have, with data of its type
        conn.execute("create extension hstore")
        conn.execute("create table shop.tags (order_id bigint primary key references shop.orders, tags hstore)")
        conn.execute("insert into shop.tags select id, hstore('k', id::text) from shop.orders where id % 3 = 0")
    manifest = ready.manifest()
    ref = ready.apply(manifest)

    handle = await ready.start(ref, manifest)
    result = await asyncio.wait_for(handle.result(), SAGA_TIMEOUT)

    assert result["phase"] == "Succeeded"
    assert _server_version_num(databases.source) // 10000 == 15
    assert _server_version_num(databases.target) // 10000 == 18
    precheck = await _precheck_result(handle)
    assert (precheck.source_version[:3], precheck.target_version[:3], precheck.tools_version[:3]) == (
        "15.",
        "18.",
        "18.",
    ), "the worker dumped 15 and restored into 18 with PostgreSQL 18's tools"
    assert contents(databases.target) == contents(databases.source)
    with connect(databases.target) as conn:
        assert tables(conn) == ["audit.log", "shop.customers", "shop.orders", "shop.tags"]
        tagged = conn.execute("select tags -> 'k' from shop.tags where order_id = 3").fetchone()
    assert tagged == ("3",)


class CorruptTheSnapshot(Interceptor):
    """Changes one byte of the snapshot object in S3 right after the snapshot step wrote it, and empties the target
    of the restore the step made while uploading, so that migrate must read the object back.

    A stand-in for bit rot or a meddling hand: the real S3 server cannot be made to change an
    object on demand. Everything else (worker, saga, databases, S3) is real.
    """

    def __init__(self, stack: StackInfo, target: PostgresEndpoint, stream: int | None = None) -> None:
        """`stream`: change that stream's object (from 0) of a snapshot in streams, not the main one."""
        self._stack = stack
        self._target = target
        self._stream = stream

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Corrupting(next, self._corrupt)

    def _corrupt(self, result: Any) -> None:
        artifact = SnapshotResult.model_validate(result) if isinstance(result, dict) else result
        s3 = self._stack.s3_client()
        key = artifact.key if self._stream is None else artifact.streams[self._stream].key
        stored = bytearray(s3.get_object(Bucket=artifact.bucket, Key=key)["Body"].read())
        stored[len(stored) // 2] ^= 0x01
        s3.put_object(Bucket=artifact.bucket, Key=key, Body=bytes(stored))
        with connect(self._target) as conn:  # a person emptying the target, marker and all
            conn.execute("drop schema if exists shop, audit cascade")
            conn.execute(f"alter database {self._target.database} reset ferry.restored_by")


class _Corrupting(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, corrupt: Any) -> None:
        super().__init__(next)
        self._corrupt = corrupt

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        result = await super().execute_activity(input)
        if activity.info().activity_type == "postgresql.snapshot":
            await asyncio.to_thread(self._corrupt, result)
        return result


@contextlib.asynccontextmanager
async def _worker(
    client: Client,
    kube_api: k8s.ApiClient,
    stack: StackInfo,
    task_queue: str,
    interceptor: Interceptor,
    **data: Any,
) -> AsyncIterator[None]:
    """ferry's worker as runner.build_worker makes it, plus a test interceptor; `data` changes its data settings."""
    settings = worker_settings(stack, task_queue)
    settings = dataclasses.replace(settings, data_activities=dataclasses.replace(settings.data_activities, **data))
    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as executor:
        worker = Worker(
            client,
            task_queue=task_queue,
            workflows=[MigrationWorkflow],
            activities=runner.activities(kube_api, settings),
            activity_executor=executor,
            interceptors=[interceptor],
            max_heartbeat_throttle_interval=timedelta(seconds=2),
        )
        async with worker:
            yield


async def test_a_snapshot_changed_before_migrate_reads_it_back_rolls_the_migration_back_and_leaves_the_source_as_it_was(
    stack: StackInfo,
    databases: Databases,
    bucket: str,
    migration_secrets: None,
    source_workload: str,
    migration_crd: str,
    temporal_client: Client,
    kube_api: k8s.ApiClient,
    task_queue: str,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    create_shop(databases.source, customers=100, orders=2_000)
    with connect(databases.source) as conn:
        conn.execute(f"alter database {databases.source.database} set default_transaction_read_only = off")
    source_before, settings_before = contents(databases.source), database_settings(databases.source)
    manifest = migration_manifest(stack, bucket)
    ref = apply_migration(kubectl, namespace, manifest)

    async with _worker(temporal_client, kube_api, stack, task_queue, CorruptTheSnapshot(stack, databases.target)):
        handle = await start_migration(temporal_client, ref, manifest, task_queue)
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), SAGA_TIMEOUT)

    status = _migration(kubectl, namespace, ref.name)["status"]
    assert status["phase"] == "RolledBack"
    steps = {step["name"]: step for step in status["steps"]}
    # migrate failed, and its undo ran anyway (it is the saga's rule): it found nothing restored to remove.
    assert steps["migrate"]["state"] == "Compensated"
    assert steps["migrate"]["lastError"].startswith("SnapshotCorrupt: the snapshot s3://")
    assert (steps["freeze"]["state"], steps["snapshot"]["state"]) == ("Compensated", "Compensated")
    assert await _attempts(handle, "postgresql.migrate") == [1], "a corrupt snapshot is not retried"
    assert database_settings(databases.source) == settings_before == ["default_transaction_read_only=off"]
    assert contents(databases.source) == source_before
    with connect(databases.source) as conn:
        conn.execute("insert into audit.log (order_id, note) values (1, 'written after the rollback')")
    with connect(databases.target) as conn:
        assert tables(conn) == [], "nothing of the changed snapshot was restored"
    assert stack.s3_client().list_objects_v2(Bucket=bucket).get("KeyCount") == 0, "the rollback deleted the snapshot"


def _in_streams(stack: StackInfo, bucket: str) -> dict[str, Any]:
    """A Migration asking for two streams."""
    return migration_manifest(
        stack,
        bucket,
        driver={"type": "postgresql", "sourceSecret": SOURCE_SECRET, "targetSecret": TARGET_SECRET, "parallelism": 2},
    )


async def test_a_whole_migration_in_parallel_streams_carries_the_data_from_postgresql_15_up_to_18(
    stack: StackInfo,
    databases: Databases,
    bucket: str,
    migration_secrets: None,
    source_workload: str,
    migration_crd: str,
    temporal_client: Client,
    kube_api: k8s.ApiClient,
    task_queue: str,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    """spec.driver.parallelism reaches the snapshot step through the CRD and the saga, across major versions."""
    create_shop(databases.source, customers=300, orders=6_000)
    manifest = _in_streams(stack, bucket)
    ref = apply_migration(kubectl, namespace, manifest)

    async with _worker(temporal_client, kube_api, stack, task_queue, Interceptor(), parallel_min_size=0):
        handle = await start_migration(temporal_client, ref, manifest, task_queue)
        result = await asyncio.wait_for(handle.result(), SAGA_TIMEOUT)

    assert result["phase"] == "Succeeded"
    assert (_server_version_num(databases.source) // 10000, _server_version_num(databases.target) // 10000) == (15, 18)
    assert contents(databases.target) == contents(databases.source)
    keys = [item["Key"] for item in stack.s3_client().list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert sorted(key.rsplit("/", 1)[1] for key in keys) == [
        "snapshot.dump", "snapshot.tables-1.dump", "snapshot.tables-2.dump"
    ]  # fmt: skip


async def test_a_changed_stream_object_rolls_the_migration_back_and_the_rollback_deletes_every_object(
    stack: StackInfo,
    databases: Databases,
    bucket: str,
    migration_secrets: None,
    source_workload: str,
    migration_crd: str,
    temporal_client: Client,
    kube_api: k8s.ApiClient,
    task_queue: str,
    kubectl: Kubectl,
    namespace: str,
) -> None:
    create_shop(databases.source, customers=300, orders=6_000)
    source_before = contents(databases.source)
    manifest = _in_streams(stack, bucket)
    ref = apply_migration(kubectl, namespace, manifest)
    corrupt = CorruptTheSnapshot(stack, databases.target, stream=1)

    async with _worker(temporal_client, kube_api, stack, task_queue, corrupt, parallel_min_size=0):
        handle = await start_migration(temporal_client, ref, manifest, task_queue)
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), SAGA_TIMEOUT)

    status = _migration(kubectl, namespace, ref.name)["status"]
    assert status["phase"] == "RolledBack"
    steps = {step["name"]: step for step in status["steps"]}
    assert steps["migrate"]["lastError"].startswith("SnapshotCorrupt: the snapshot s3://")
    assert "snapshot.tables-2.dump" in steps["migrate"]["lastError"]
    assert contents(databases.source) == source_before
    with connect(databases.target) as conn:
        assert tables(conn) == [], "the undo emptied what the streams had committed"
    assert stack.s3_client().list_objects_v2(Bucket=bucket).get("KeyCount") == 0, "the rollback deleted every object"
