"""The Temporal dev server runs real workflows, and the temporal CLI sees them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from devstack.stack.install import Binaries
from devstack.stack.stack import TEMPORAL_FOLDER, StackInfo
from devstack.stack.temporal import DATABASE_FILE
from ferry.api import search_attributes


@activity.defn
async def greet(name: str) -> str:
    return f"hello, {name}"


@workflow.defn(sandboxed=False)
class Greeting:
    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(greet, name, start_to_close_timeout=timedelta(seconds=10))


async def test_workflow_runs_and_the_temporal_cli_lists_it(
    temporal_client: Client, task_queue: str, stack: StackInfo, binaries: Binaries
) -> None:
    workflow_id = f"greeting-{task_queue}"
    async with Worker(temporal_client, task_queue=task_queue, workflows=[Greeting], activities=[greet]):
        result = await temporal_client.execute_workflow(Greeting.run, "ferry", id=workflow_id, task_queue=task_queue)

    assert result == "hello, ferry"
    listed = await asyncio.to_thread(
        subprocess.run,
        [
            str(binaries.temporal),
            "workflow",
            "list",
            f"--address={stack.temporal_address}",
            f"--query=WorkflowId = '{workflow_id}'",
            "--output=json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    runs = json.loads(listed.stdout)
    assert [run["execution"]["workflowId"] for run in runs] == [workflow_id]
    assert runs[0]["status"] == "WORKFLOW_EXECUTION_STATUS_COMPLETED"


def test_ferrys_search_attributes_are_registered(stack: StackInfo, binaries: Binaries) -> None:
    listed = subprocess.run(
        [str(binaries.temporal), "operator", "search-attribute", "list", f"--address={stack.temporal_address}"],
        capture_output=True,
        text=True,
        check=True,
    )

    for key in search_attributes.ALL:
        assert key.name in listed.stdout


def test_the_dev_server_keeps_its_database_with_a_write_ahead_log(stack: StackInfo) -> None:
    """With SQLite's default rollback journal the server started workflows less than half as fast."""
    database = stack.state_dir / TEMPORAL_FOLDER / DATABASE_FILE
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as conn:
        assert conn.execute("pragma journal_mode").fetchone() == ("wal",)
