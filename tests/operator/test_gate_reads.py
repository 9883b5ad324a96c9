"""The gate's reads of Migrations run on the worker's own threads, one per slot, and a run's first status write
needs no read of its own after them.

When fifty Migrations start at once, each run's first status write passes the gate,
which reads the Migration from an API server that is then at its busiest. Those reads
used to run on asyncio's default executor (the CPU count plus 4 threads, at most 32), so
on 2 cores they went six at a time, and the last runs' first status showed up seconds
after their transition. Here the read is a stand-in that answers only once READS reads
are under way at the same time: a fake, to hold the reads open as a loaded API server
does, which the real one cannot be made to do on demand. With fewer threads than READS,
none of them would ever answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
import uuid
from datetime import timedelta
from typing import Any

from kubernetes import client as k8s
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

from activities.known_versions import KnownVersions
from activities.status import StatusActivities
from devstack.stack.stack import StackInfo
from ferry.api.migration import MigrationSpec
from ferry.api.saga import WORKFLOW_NAME, MigrationInput, MigrationRef, workflow_id
from tests import samples
from tests.end_to_end import worker_settings
from worker import runner
from worker.gate import MigrationGate

READS = 40
"""Gated calls at once: more than asyncio's default executor ever has threads (32)."""
SPEC = samples.migration()["spec"]


@workflow.defn(name=WORKFLOW_NAME, sandboxed=False)
class GateReadsProbe:
    """A run of a Migration (its claim comes from the input, as the saga's does) making READS gated calls at once.
    Registered under the saga's workflow type, which the gate requires of a run under the saga's ID."""

    @workflow.run
    async def run(self, input: MigrationInput) -> list[int]:
        calls = [
            workflow.execute_local_activity(
                "gated",
                index,
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
            for index in range(READS)
        ]
        return list(await asyncio.gather(*calls))


@activity.defn(name="gated")
def gated(index: int) -> int:
    return index


async def test_a_burst_of_gated_calls_reads_their_migrations_all_at_once_and_the_status_writers_learn_the_version(
    temporal_client: Client, task_queue: str
) -> None:
    ref = MigrationRef(namespace="shop", name="orders-db-to-16", uid=str(uuid.uuid4()))
    all_under_way = threading.Barrier(READS, timeout=30)

    def read(asked: MigrationRef) -> dict[str, Any]:
        all_under_way.wait()  # answers only once READS reads are waiting for an answer
        return {"metadata": {"name": asked.name, "namespace": asked.namespace, "uid": asked.uid,
                             "resourceVersion": "4711"}, "spec": SPEC}  # fmt: skip

    versions = KnownVersions()
    with concurrent.futures.ThreadPoolExecutor(READS) as threads:
        gate = MigrationGate(read, executor=threads, versions=versions)
        async with Worker(
            temporal_client, task_queue=task_queue, workflows=[GateReadsProbe], activities=[gated],
            activity_executor=threads, max_concurrent_local_activities=READS, interceptors=[gate],
        ):  # fmt: skip
            result = await temporal_client.execute_workflow(
                GateReadsProbe.run,
                MigrationInput(ref=ref, generation=1, spec=MigrationSpec.model_validate(SPEC)),
                id=workflow_id(ref),
                task_queue=task_queue,
                execution_timeout=timedelta(seconds=90),
            )

    assert result == list(range(READS))
    known = versions.get(ref.uid)
    assert known is not None
    assert known.resource_version == "4711"


async def test_ferrys_worker_reads_for_its_gate_on_its_activity_threads_and_shares_what_they_learn(
    temporal_client: Client, task_queue: str, stack: StackInfo
) -> None:
    settings = worker_settings(stack, task_queue)
    with concurrent.futures.ThreadPoolExecutor(runner.threads(settings)) as threads:
        worker = runner.build_worker(temporal_client, k8s.ApiClient(), settings, threads)
        gate = next(each for each in worker.config()["interceptors"] if isinstance(each, MigrationGate))
        mirror_status = next(each for each in worker.config()["activities"] if each.__name__ == "mirror_status")

        assert gate.executor is threads
        assert gate.versions is not None
        status_activities = getattr(mirror_status, "__self__", None)
        assert isinstance(status_activities, StatusActivities)
        assert gate.versions is status_activities._versions


async def test_ferrys_watches_pass_the_same_gate_on_a_task_queue_slots_and_threads_of_their_own(
    temporal_client: Client, task_queue: str, stack: StackInfo
) -> None:
    settings = dataclasses.replace(worker_settings(stack, task_queue), max_concurrent_watches=7)
    with concurrent.futures.ThreadPoolExecutor(runner.watch_threads(settings)) as threads:
        config = runner.build_watch_worker(temporal_client, k8s.ApiClient(), settings, threads).config()

    assert config["task_queue"] == f"{task_queue}-watches"
    assert [each.__name__ for each in config["activities"]] == ["watch_replication"]
    assert config["max_concurrent_activities"] == runner.watch_threads(settings) == 7
    assert config["activity_executor"] is threads
    gate = next(each for each in config["interceptors"] if isinstance(each, MigrationGate))
    assert gate.executor is threads, "its reads take none of the steps' threads"
    assert gate.key == runner.claim_key(settings) is not None
    assert config["identity"] == runner.identity(settings)
    assert runner.watch_threads(dataclasses.replace(settings, runs="workflows")) == 0, "a workflows process runs none"
