"""A worker of the snapshot activity, in a process of its own, that SIGKILLs itself in the middle of an upload.

test_outages runs it to show that another worker finishes the snapshot. It kills itself
at its first heartbeat reporting uploaded bytes: by then S3 holds an unfinished
multipart upload and pg_dump is still writing, which is the moment under test; a kill
from outside could not be timed that precisely.

    python -m tests.postgres.worker_process --state-dir DIR --task-queue QUEUE --bindir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

from kubernetes import config as k8s_config
from temporalio.worker import Worker

from activities.postgres.activities import PostgresActivities
from activities.settings import MIB, DataActivitySettings
from devstack.stack.stack import StackInfo
from ferry.clients import TemporalSettings, connect_temporal
from tests.postgres.heartbeat_hooks import OnHeartbeat

IDENTITY = "doomed-worker"


def _die_once_uploading(details: dict[str, Any]) -> None:
    if details.get("uploaded_bytes", 0) > 0:
        os.kill(os.getpid(), signal.SIGKILL)


async def _run(info: StackInfo, task_queue: str, bindir: Path) -> None:
    assert info.temporal_address is not None
    client = await connect_temporal(
        TemporalSettings(address=info.temporal_address, namespace=info.temporal_namespace or "default")
    )
    api = k8s_config.new_client_from_config(config_file=str(info.kubeconfig))
    settings = DataActivitySettings(postgres_bindir=bindir, part_size=5 * MIB, upload_concurrency=2)
    postgres = PostgresActivities(api, settings)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as executor:
        worker = Worker(
            client,
            task_queue=task_queue,
            activities=[postgres.snapshot],
            activity_executor=executor,
            interceptors=[OnHeartbeat(_die_once_uploading)],
            max_heartbeat_throttle_interval=timedelta(seconds=1),
            identity=IDENTITY,
        )
        await worker.run()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--bindir", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(_run(StackInfo.load(args.state_dir), args.task_queue, args.bindir))


if __name__ == "__main__":
    main()
