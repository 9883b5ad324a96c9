"""The dispatcher: one pass at a time per Migration, only its latest state, never one its own pass superseded."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ferry.api.migration import Migration
from tests import samples
from watcher import dispatching
from watcher.dispatching import Dispatcher


def state(version: str, name: str = "m", uid: str = "u") -> Migration:
    raw = samples.migration(name)
    raw["metadata"] = {"name": name, "namespace": "shop", "uid": uid, "resourceVersion": version}
    return Migration.parse(raw)


class Recorder:
    """A handler that holds each pass until released and says it wrote `writes`."""

    def __init__(self, writes: list[str]) -> None:
        self.handled: list[str] = []
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self._writes = writes

    async def __call__(self, migration: Migration, *, gone: bool, run_closed: bool, received: float) -> list[str]:
        self.handled.append(migration.metadata.resource_version)
        self.started.set()
        await self.release.wait()
        written, self._writes = self._writes, []
        return written


async def test_only_the_latest_state_waiting_is_handled_next() -> None:
    handler = Recorder(writes=[])
    dispatcher = Dispatcher(handler, concurrency=4)

    dispatcher.submit(state("1"))
    await handler.started.wait()
    for version in ("2", "3", "4"):
        dispatcher.submit(state(version))
    handler.release.set()
    await dispatcher.idle()

    assert handler.handled == ["1", "4"]


async def test_a_state_the_pass_itself_superseded_is_not_handled_again() -> None:
    handler = Recorder(writes=["2", "3"])  # e.g. the finalizer with the annotation, then a control's acknowledgement
    dispatcher = Dispatcher(handler, concurrency=4)

    dispatcher.submit(state("1"))
    await handler.started.wait()
    dispatcher.submit(state("2"))  # the watch brings the pass's first write while it runs
    handler.release.set()
    await dispatcher.idle()
    dispatcher.submit(state("3"))  # then its last write
    await dispatcher.idle()

    assert handler.handled == ["1", "3"]


async def test_a_superseded_state_that_arrives_after_the_pass_is_not_handled_either() -> None:
    handler = Recorder(writes=["2", "3"])
    dispatcher = Dispatcher(handler, concurrency=4)
    handler.release.set()

    dispatcher.submit(state("1"))
    await dispatcher.idle()
    dispatcher.submit(state("2"))  # the watch was slower than the pass
    await dispatcher.idle()
    dispatcher.submit(state("3"))
    await dispatcher.idle()
    dispatcher.submit(state("2"))  # the first other state ended the exception: nothing is dropped any more
    await dispatcher.idle()

    assert handler.handled == ["1", "3", "2"]


async def test_a_migration_created_again_under_its_name_does_not_drop_the_pass_over_the_one_that_went() -> None:
    """That pass lets the gone one's Secrets go (watcher/decisions.py): `kubectl delete` then `kubectl apply` of the
    same file brings the DELETED event and the new object's one in a burst."""
    passes: list[tuple[str, str, bool]] = []
    release = asyncio.Event()

    async def handle(migration: Migration, *, gone: bool, run_closed: bool, received: float) -> list[str]:
        passes.append((migration.metadata.uid, migration.metadata.resource_version, gone))
        await release.wait()
        return []

    dispatcher = Dispatcher(handle, concurrency=4)
    dispatcher.submit(state("1", uid="old"))
    await asyncio.sleep(0)
    dispatcher.submit(state("2", uid="old"), gone=True)
    dispatcher.submit(state("3", uid="new"))
    dispatcher.submit(state("4", uid="new"))
    release.set()
    await dispatcher.idle()

    assert passes == [("old", "1", False), ("old", "2", True), ("new", "4", False)]


async def test_a_failed_pass_over_a_migration_that_went_is_retried_though_one_created_again_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dispatching, "RETRY_DELAYS", (0.05,))
    passes: list[tuple[str, bool]] = []
    failed = asyncio.Event()

    async def handle(migration: Migration, *, gone: bool, run_closed: bool, received: float) -> list[str]:
        passes.append((migration.metadata.uid, gone))
        if gone and not failed.is_set():
            failed.set()
            raise RuntimeError("the API server did not answer")
        if not gone:
            await asyncio.sleep(0.3)  # the retry comes while the new object's next state waits
        return []

    dispatcher = Dispatcher(handle, concurrency=4)
    dispatcher.submit(state("2", uid="old"), gone=True)
    await failed.wait()
    await asyncio.sleep(0)
    dispatcher.submit(state("3", uid="new"))
    await asyncio.sleep(0.01)
    dispatcher.submit(state("4", uid="new"))
    await asyncio.sleep(0.1)
    await dispatcher.idle()

    assert passes == [("old", True), ("new", False), ("old", True), ("new", False)]


async def test_a_failing_pass_over_a_migration_that_went_backs_off_more_each_time_though_one_created_again_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deleted, then applied again while the API server refuses the Secrets' release: the new object's states keep
    coming, and each retry of the gone one's pass waits longer than the one before, as any failed pass does."""
    delays_used: list[int] = []

    class Delays(tuple[float, ...]):
        def __getitem__(self, index: Any) -> Any:
            delays_used.append(index)
            return 0.01

    monkeypatch.setattr(dispatching, "RETRY_DELAYS", Delays((0.0,) * 5))
    gone_passes = 0
    released = asyncio.Event()

    async def handle(migration: Migration, *, gone: bool, run_closed: bool, received: float) -> list[str]:
        nonlocal gone_passes
        if gone:
            gone_passes += 1
            if gone_passes <= 3:
                raise RuntimeError("the API server did not answer")
            released.set()
            return []
        await asyncio.sleep(0.05)  # the gone pass's retry comes meanwhile
        if gone_passes < 3:
            dispatcher.submit(state(str(10 + gone_passes), uid="new"))
        return []

    dispatcher = Dispatcher(handle, concurrency=4)
    dispatcher.submit(state("2", uid="old"), gone=True)
    dispatcher.submit(state("3", uid="new"))
    await released.wait()
    await dispatcher.idle()

    assert delays_used == [0, 1, 2], "the retries' delays grow"
