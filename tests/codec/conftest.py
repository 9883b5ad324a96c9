"""What the encryption tests share: ferry's real worker and watcher with the stack's codec keys.

The session stack makes one codec key per state folder and runs `ferry codec-server` with
it for the Web UI; these components encrypt with that same key, as they do under `make up`
and in a cluster. The session's `temporal_client` has no key: it reads what Temporal stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import pytest

from devstack.stack.stack import StackInfo
from ferry.clients import TemporalSettings
from tests.end_to_end import watcher_settings, worker_settings
from watcher import runner as watcher_runner
from watcher.settings import WatcherSettings
from worker import runner as worker_runner
from worker.settings import WorkerSettings


@pytest.fixture
def encrypted(stack: StackInfo) -> TemporalSettings:
    """The stack's Temporal, with the stack's codec keys."""
    assert stack.temporal_address is not None
    assert stack.codec_keys is not None
    return TemporalSettings(
        address=stack.temporal_address, namespace=stack.temporal_namespace or "default", codec_keys=stack.codec_keys
    )


@pytest.fixture
async def encrypting_worker(
    stack: StackInfo, task_queue: str, encrypted: TemporalSettings
) -> AsyncIterator[WorkerSettings]:
    """ferry's real worker, in this process, on the test's task queue, encrypting with the stack's keys."""
    settings = dataclasses.replace(worker_settings(stack, task_queue), temporal=encrypted)
    stop = asyncio.Event()
    running = asyncio.create_task(worker_runner.run(settings, stop=stop))
    yield settings
    stop.set()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(running, timeout=60)


@pytest.fixture
async def encrypting_watcher(
    stack: StackInfo, task_queue: str, namespace: str, encrypted: TemporalSettings
) -> AsyncIterator[WatcherSettings]:
    """ferry's real watcher, in this process, watching the test's namespace, encrypting with the stack's keys."""
    settings = watcher_settings(stack, task_queue, namespace, temporal=encrypted)
    stop = asyncio.Event()
    running = asyncio.create_task(watcher_runner.run(settings, stop=stop))
    yield settings
    stop.set()
    await asyncio.wait_for(running, timeout=30)
