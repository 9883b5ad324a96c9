"""A leading watcher steps down by its renew deadline even when the API server accepts its renewal and never answers.

The API server here is a real socket that accepts connections and stays silent (`silent_server`), as a hung or
partitioned server does; the Lease calls go through the watcher's own client, with its own timeouts and retries.
The duration the Lease holds (whole seconds) is never shorter than that renew deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from kubernetes import client as k8s

from ferry.kube_requests import DEFAULT_TIMEOUTS, BoundedApiClient
from watcher.kube import Kube, LeaseRecord
from watcher.leadership import LeaderElector, LeadershipLost
from watcher.settings import LeaseSettings

pytestmark = pytest.mark.unit


async def test_a_leader_whose_renewal_gets_no_answer_steps_down_by_its_renew_deadline(silent_server: str) -> None:
    settings = LeaseSettings(name="ferry-watcher", namespace="ferry", duration=3, renew_deadline=2, retry_period=0.5)
    configuration = k8s.Configuration(host=silent_server)
    kube = Kube(BoundedApiClient(configuration, DEFAULT_TIMEOUTS), "test")
    elector = LeaderElector(kube, settings)

    with pytest.raises(LeadershipLost, match="could not renew Lease ferry/ferry-watcher for 2s"):
        # The bound only keeps a failing test from hanging: a leader hanging with its renewal would take minutes.
        await asyncio.wait_for(elector.hold(asyncio.Event()), timeout=DEFAULT_TIMEOUTS.read)


class _Lease:
    """The Lease as a stand-in for the API server keeps it: what the last write put there."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None

    async def read_lease(self, name: str, namespace: str) -> LeaseRecord | None:
        return self.record

    async def write_lease(self, name: str, namespace: str, record: LeaseRecord) -> bool:
        self.record = dataclasses.replace(record, resource_version="1")
        return True


async def test_a_lease_duration_with_a_fraction_is_rounded_up_never_below_the_renew_deadline() -> None:
    """The Lease holds whole seconds. Rounded down, 15.9 s became 15: the standbys took over at 15 s while the leader,
    whose renew deadline was 15.5 s, still acted."""
    settings = LeaseSettings(name="l", namespace="n", duration=15.9, renew_deadline=15.5, retry_period=2)
    lease = _Lease()
    elector = LeaderElector(lease, settings)  # type: ignore[arg-type]

    assert await elector.acquire(asyncio.Event())
    assert lease.record is not None
    assert lease.record.duration_seconds == 16, "created"
    lease.record = dataclasses.replace(lease.record, duration_seconds=1)
    assert await elector.acquire(asyncio.Event())
    assert lease.record.duration_seconds == 16, "renewed"
    assert lease.record.duration_seconds > settings.renew_deadline
