"""A worker of one data activity, in a process of its own, that SIGKILLs itself in the middle of it.

test_outages runs it to show that another worker finishes the snapshot. It kills itself
at its first heartbeat reporting uploaded bytes: by then S3 holds an unfinished
multipart upload and pg_dump is still writing, which is the moment under test; a kill
from outside could not be timed that precisely. With --activity replicate it dies at the
first heartbeat reporting the replication's lag (the subscription and its slot exist,
the initial copy runs), with catch_up at the first reporting what is still to apply
(test_online_outages).

    python -m tests.postgres.worker_process --state-dir DIR --task-queue QUEUE --bindir DIR
        [--activity NAME] [--streams]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import os
import signal
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from kubernetes import config as k8s_config
from temporalio.worker import Worker

from activities.postgres.activities import PostgresActivities
from activities.postgres.replicating import ReplicationActivities
from activities.settings import MIB, DataActivitySettings
from devstack.stack.stack import StackInfo
from ferry.clients import TemporalSettings, connect_temporal
from tests.postgres.heartbeat_hooks import OnHeartbeat

IDENTITY = "doomed-worker"
DEATHS = {"snapshot": "uploaded_bytes", "replicate": "lag_bytes", "catch_up": "lsn_to_apply_bytes"}
"""The heartbeat detail whose first report kills the worker, by activity."""


def _die_once(key: str) -> Callable[[dict[str, Any]], None]:
    """A hook that kills the worker at the first heartbeat reporting `key` (uploaded bytes: more than none), also
    under a stream's name (stream1_uploaded_bytes, see activities/postgres/streams.py)."""

    def hook(details: dict[str, Any]) -> None:
        for name, value in details.items():
            if name.endswith(key) and (key != "uploaded_bytes" or value > 0):
                os.kill(os.getpid(), signal.SIGKILL)

    return hook


async def _run(info: StackInfo, task_queue: str, bindir: Path, doomed: str = "snapshot", streams: bool = False) -> None:
    assert info.temporal_address is not None
    client = await connect_temporal(
        TemporalSettings(address=info.temporal_address, namespace=info.temporal_namespace or "default")
    )
    api = k8s_config.new_client_from_config(config_file=str(info.kubeconfig))
    settings = DataActivitySettings(postgres_bindir=bindir, part_size=5 * MIB, upload_concurrency=2)
    if streams:  # a snapshot in streams whatever the source's size
        settings = dataclasses.replace(settings, parallel_min_size=0)
    postgres = PostgresActivities(api, settings)
    replication = ReplicationActivities(api, settings)
    activity = {"snapshot": postgres.snapshot, "replicate": replication.replicate, "catch_up": replication.catch_up}
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as executor:
        worker = Worker(
            client,
            task_queue=task_queue,
            activities=[activity[doomed]],
            activity_executor=executor,
            interceptors=[OnHeartbeat(_die_once(DEATHS[doomed]))],
            max_heartbeat_throttle_interval=timedelta(seconds=1),
            identity=IDENTITY,
        )
        await worker.run()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--bindir", type=Path, required=True)
    parser.add_argument("--activity", choices=sorted(DEATHS), default="snapshot")
    parser.add_argument("--streams", action="store_true", help="take snapshots in streams whatever their size")
    args = parser.parse_args()
    asyncio.run(_run(StackInfo.load(args.state_dir), args.task_queue, args.bindir, args.activity, args.streams))


if __name__ == "__main__":
    main()
