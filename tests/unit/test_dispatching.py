"""The dispatcher: one pass at a time per Migration, only its latest state, never one its own pass superseded."""

from __future__ import annotations

import asyncio

from ferry.api.migration import Migration
from tests import samples
from watcher.dispatching import Dispatcher


def state(version: str, name: str = "m") -> Migration:
    raw = samples.migration(name)
    raw["metadata"] = {"name": name, "namespace": "shop", "uid": "u", "resourceVersion": version}
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
