"""The snapshot step survives what goes wrong under it: S3 going away mid-upload, its worker killed mid-upload.

They run the real snapshot activity on a real worker, as the SnapshotStep workflow
(tests/postgres/step.py) retries it with the saga's own retry policy. A snapshot
interrupted for good is undone without its result, from its deterministic key.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Interceptor, Worker

from activities.postgres import restoring
from activities.postgres.activities import PostgresActivities, owner
from activities.settings import DataActivitySettings
from activities.snapshots import SnapshotStoreActivities
from devstack.stack.install import Binaries
from devstack.stack.stack import Stack, StackInfo
from ferry.api.migration import DriverSpec, SnapshotSpec
from ferry.api.saga import MigrationRef, SnapshotInput, SnapshotResult, UndoSnapshotInput, snapshot_key, stream_key
from tests.cluster import eventually
from tests.conftest import make_state_dir
from tests.end_to_end import SOURCE_SECRET, TARGET_SECRET, Databases
from tests.postgres.conftest import Steps, create_secret
from tests.postgres.data import connect, contents, create_bulky, create_shop, other_sessions, tables
from tests.postgres.heartbeat_hooks import OnHeartbeat
from tests.postgres.step import SnapshotStep

REPOSITORY = Path(__file__).parent.parent.parent
UPLOAD_PARTS = {2: 150_000, 4: 250_000}
"""Rows of 64 incompressible bytes that make a snapshot of about that many 5 MiB parts."""


@contextlib.asynccontextmanager
async def _worker(
    client: Client,
    task_queue: str,
    *,
    workflow: bool,
    postgres: PostgresActivities | None,
    interceptors: tuple[Interceptor, ...] = (),
) -> AsyncIterator[None]:
    """A worker in this process hosting the SnapshotStep workflow, the snapshot activity, or both."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as executor:
        worker = Worker(
            client,
            task_queue=task_queue,
            workflows=[SnapshotStep] if workflow else [],
            activities=[postgres.snapshot] if postgres else [],
            activity_executor=executor,
            interceptors=interceptors,
            identity="in-test-worker",
        )
        async with worker:
            yield


async def _snapshot_step(client: Client, task_queue: str, input: SnapshotInput) -> WorkflowHandle[Any, SnapshotResult]:
    return await client.start_workflow(
        SnapshotStep.run, input, id=f"snapshot-step-{uuid.uuid4()}", task_queue=task_queue
    )


async def _started_attempts(handle: WorkflowHandle[Any, Any]) -> list[tuple[int, str]]:
    """(attempt, worker identity) of each recorded start of the snapshot activity."""
    return [
        (event.activity_task_started_event_attributes.attempt, event.activity_task_started_event_attributes.identity)
        async for event in handle.fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]


def _objects_and_uploads(s3: Any, bucket: str) -> tuple[list[str], list[str]]:
    objects = [item["Key"] for item in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    uploads = [upload["Key"] for upload in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    return objects, uploads


class S3Outage:
    """Stops an S3 server at the first heartbeat reporting uploaded bytes, and starts it again `after` seconds later.

    The hook runs on the worker's event loop, which is the test's main thread, where the
    stack starts its processes; the restart is scheduled on that loop too.
    """

    def __init__(self, state_dir: Path, binaries: Binaries, after: float) -> None:
        self._state_dir, self._binaries, self._after = state_dir, binaries, after
        self.stack = Stack(state_dir, components=frozenset({"s3"}), binaries=binaries)
        self.stops = 0
        self.restarted = False

    def start(self) -> StackInfo:
        return self.stack.start()

    def on_heartbeat(self, details: dict[str, Any]) -> None:
        if details.get("uploaded_bytes", 0) > 0 and self.stops == 0:
            self.stops += 1
            self.stack.stop()
            asyncio.get_running_loop().call_later(self._after, self._restart)

    def _restart(self) -> None:
        self.stack = Stack(self._state_dir, components=frozenset({"s3"}), binaries=self._binaries)
        self.stack.start()  # same folder, same port: the objects and unfinished uploads are still there
        self.restarted = True


async def test_s3_going_away_in_the_middle_of_an_upload_the_step_retries_and_completes_once_it_is_back(
    databases: Databases,
    binaries: Binaries,
    kube_api: k8s.ApiClient,
    namespace: str,
    ref: MigrationRef,
    data_settings: DataActivitySettings,
    migration_secrets: None,
    temporal_client: Client,
    task_queue: str,
) -> None:
    create_bulky(databases.source, rows=UPLOAD_PARTS[4])  # the outage begins after part 2
    state_dir = make_state_dir("ferry-s3-outage-")
    outage = S3Outage(state_dir, binaries, after=1.0)
    own = outage.start()
    try:
        assert own.s3_access_key is not None
        assert own.s3_secret_key is not None
        credentials = {"accessKeyId": own.s3_access_key, "secretAccessKey": own.s3_secret_key}
        create_secret(kube_api, namespace, "outage-s3", credentials)
        s3 = own.s3_client()
        s3.create_bucket(Bucket="snapshots")
        spec = SnapshotSpec(
            bucket="snapshots", endpoint=own.s3_endpoint, allow_insecure_endpoint=True, credentials_secret="outage-s3"
        )
        input = SnapshotInput(
            ref=ref,
            driver=DriverSpec(source_secret=SOURCE_SECRET, target_secret=TARGET_SECRET),
            snapshot=spec,
            key=snapshot_key(ref, spec),
        )
        postgres = PostgresActivities(kube_api, data_settings)

        hook = OnHeartbeat(outage.on_heartbeat)
        async with _worker(temporal_client, task_queue, workflow=True, postgres=postgres, interceptors=(hook,)):
            handle = await _snapshot_step(temporal_client, task_queue, input)
            result = await asyncio.wait_for(handle.result(), 120)

        assert outage.stops == 1
        assert outage.restarted
        attempts = await _started_attempts(handle)
        assert attempts[-1][0] > 1, "the step was retried"
        objects, uploads = _objects_and_uploads(s3, "snapshots")
        assert (objects, uploads) == ([input.key], [])
        stored = s3.get_object(Bucket="snapshots", Key=result.key)["Body"].read()
        assert (len(stored), hashlib.sha256(stored).hexdigest()) == (result.size_bytes, result.sha256)
    finally:
        outage.stack.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


async def _killed_mid_upload(
    stack: StackInfo, binaries: Binaries, client: Client, task_queue: str, input: SnapshotInput, *options: str
) -> WorkflowHandle[Any, SnapshotResult]:
    """Starts the snapshot step on a worker that kills itself once S3 holds part of the upload; returns the step."""
    # The doomed worker runs only the activity: a workflow task left on its sticky queue
    # would wait out the sticky timeout.
    doomed = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.postgres.worker_process",
        f"--state-dir={stack.state_dir}",
        f"--task-queue={task_queue}",
        f"--bindir={binaries.postgres_bindir}",
        *options,
        cwd=REPOSITORY,
    )
    try:
        handle = await _snapshot_step(client, task_queue, input)
        code = await asyncio.wait_for(doomed.wait(), 60)
    finally:
        if doomed.returncode is None:
            doomed.kill()
            await doomed.wait()
    assert code == -9, "the worker killed itself in the middle of the upload"
    return handle


@pytest.mark.parametrize("restore", [False, True], ids=["dump only", "restoring while dumping"])
async def test_a_worker_killed_in_the_middle_of_a_snapshot_is_replaced_and_one_whole_object_is_written(
    stack: StackInfo,
    databases: Databases,
    binaries: Binaries,
    steps: Steps,
    data_settings: DataActivitySettings,
    kube_api: k8s.ApiClient,
    temporal_client: Client,
    task_queue: str,
    bucket: str,
    restore: bool,
) -> None:
    create_bulky(databases.source, rows=UPLOAD_PARTS[2])  # the worker dies after part 1
    input = SnapshotInput(
        ref=steps.ref, driver=steps.driver, snapshot=steps.snapshot_spec, key=steps.key, restore=restore
    )
    async with _worker(temporal_client, task_queue, workflow=True, postgres=None):
        handle = await _killed_mid_upload(stack, binaries, temporal_client, task_queue, input)
        s3 = stack.s3_client()
        assert _objects_and_uploads(s3, bucket) == ([], [steps.key]), "it died with an unfinished upload"
        eventually("the dead worker's pg_dump to go", lambda: other_sessions(databases.source) == 0, timeout=20)
        # Its pg_restore read the end of its input when the worker died, failed, and rolled back.
        eventually("the dead worker's pg_restore to go", lambda: other_sessions(databases.target) == 0, timeout=20)
        with connect(databases.target) as conn:
            assert tables(conn) == [], "nothing of the interrupted stream is in the target"

        replacement = PostgresActivities(kube_api, data_settings)
        async with _worker(temporal_client, task_queue, workflow=False, postgres=replacement):
            result = await asyncio.wait_for(handle.result(), 120)

    assert await _started_attempts(handle) == [(2, "in-test-worker")]
    assert _objects_and_uploads(s3, bucket) == ([steps.key], [])
    stored = s3.get_object(Bucket=bucket, Key=steps.key)["Body"].read()
    assert (len(stored), hashlib.sha256(stored).hexdigest()) == (result.size_bytes, result.sha256)
    assert result.restored == restore
    assert steps.migrate(result).during_snapshot == restore
    assert [check.equal for check in steps.verify().tables] == [True]


async def test_a_worker_killed_in_the_middle_of_a_snapshot_in_streams_is_replaced_and_the_target_restored_whole(
    stack: StackInfo,
    databases: Databases,
    binaries: Binaries,
    steps: Steps,
    data_settings: DataActivitySettings,
    kube_api: k8s.ApiClient,
    temporal_client: Client,
    task_queue: str,
    bucket: str,
) -> None:
    """The worker dies while the streams upload and restore: the target holds the schema and is marked incomplete;
    the next attempt empties it, replaces every object, and restores it whole."""
    create_bulky(databases.source, rows=UPLOAD_PARTS[4])
    create_shop(databases.source, customers=2_000, orders=20_000)
    driver = steps.driver.model_copy(update={"parallelism": 2})
    input = SnapshotInput(ref=steps.ref, driver=driver, snapshot=steps.snapshot_spec, key=steps.key, restore=True)
    async with _worker(temporal_client, task_queue, workflow=True, postgres=None):
        handle = await _killed_mid_upload(stack, binaries, temporal_client, task_queue, input, "--streams")
        s3 = stack.s3_client()
        objects, uploads = _objects_and_uploads(s3, bucket)
        assert steps.key in objects, "the main archive was stored before the streams began"
        assert stream_key(steps.key, 1) in uploads, "it died with the largest table's stream unfinished"
        eventually("the dead worker's pg_dumps to go", lambda: other_sessions(databases.source) == 0, timeout=20)
        eventually("the dead worker's restores to go", lambda: other_sessions(databases.target) == 0, timeout=20)
        with connect(databases.target) as conn:
            assert not restoring.find(conn).holds_restore(owner(steps.ref)), "a partial target is never taken for whole"

        replacement = PostgresActivities(kube_api, dataclasses.replace(data_settings, parallel_min_size=0))
        async with _worker(temporal_client, task_queue, workflow=False, postgres=replacement):
            result = await asyncio.wait_for(handle.result(), 120)

    assert await _started_attempts(handle) == [(2, "in-test-worker")]
    assert len(result.streams) == 2
    assert _objects_and_uploads(s3, bucket) == (sorted([steps.key, *(stream.key for stream in result.streams)]), [])
    for stream in result.streams:
        stored = s3.get_object(Bucket=bucket, Key=stream.key)["Body"].read()
        assert (len(stored), hashlib.sha256(stored).hexdigest()) == (stream.size_bytes, stream.sha256)
    assert contents(databases.target) == contents(databases.source)
    in_streams = dataclasses.replace(steps, driver=driver)
    assert in_streams.migrate(result).during_snapshot
    assert all(check.equal for check in in_streams.verify().tables)


async def test_a_snapshot_interrupted_mid_upload_is_undone_without_its_result_and_leaves_nothing_in_s3(
    stack: StackInfo,
    databases: Databases,
    binaries: Binaries,
    steps: Steps,
    snapshots: SnapshotStoreActivities,
    temporal_client: Client,
    task_queue: str,
    bucket: str,
) -> None:
    create_bulky(databases.source, rows=UPLOAD_PARTS[2])
    input = SnapshotInput(ref=steps.ref, driver=steps.driver, snapshot=steps.snapshot_spec, key=steps.key)
    async with _worker(temporal_client, task_queue, workflow=True, postgres=None):
        handle = await _killed_mid_upload(stack, binaries, temporal_client, task_queue, input)
        await handle.terminate("the saga rolls back: the snapshot never reported a result")
    s3 = stack.s3_client()
    assert _objects_and_uploads(s3, bucket) == ([], [steps.key]), "the interrupted snapshot left an unfinished upload"

    undo = UndoSnapshotInput(ref=steps.ref, snapshot=steps.snapshot_spec, artifact=None, key=steps.key, keep=False)
    result = ActivityEnvironment().run(snapshots.undo_snapshot, undo)
    again = ActivityEnvironment().run(snapshots.undo_snapshot, undo.model_copy(update={"key": ""}))

    assert result.deleted
    assert again.deleted, "without a key either, the undo finds the snapshot by the Migration"
    assert _objects_and_uploads(s3, bucket) == ([], [])
