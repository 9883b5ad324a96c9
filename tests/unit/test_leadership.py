"""A leading watcher steps down by its renew deadline even when the API server accepts its renewal and never answers.

The API server here is a real socket that accepts connections and stays silent (`silent_server`), as a hung or
partitioned server does; the Lease calls go through the watcher's own client, with its own timeouts and retries.
"""

from __future__ import annotations

import asyncio

import pytest
from kubernetes import client as k8s

from ferry.kube_requests import DEFAULT_TIMEOUTS, BoundedApiClient
from watcher.kube import Kube
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
