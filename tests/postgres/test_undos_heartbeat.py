"""An undo, or the check before one, heartbeats while it waits for an S3 endpoint or a database that does not answer.

Their heartbeat timeout is 30 s, and one request to a silent S3 endpoint waits a read timeout
(a minute by default), up to three times, as the tries to connect to a silent database take
nearly a minute: without heartbeats, Temporal took the attempt for lost and started the next
one beside it, and the step failed with a heartbeat timeout instead of the error that says
what is wrong (S3NotAnswering, DatabaseUnreachable).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from activities.postgres.activities import PostgresActivities
from activities.s3 import S3NotAnswering
from activities.settings import DataActivitySettings
from activities.snapshots import SnapshotStoreActivities
from ferry.api.errors import DatabaseUnreachable
from ferry.api.saga import UndoSnapshotInput
from tests.postgres.conftest import Steps, create_secret
from tests.postgres.test_bounded_waits import SILENT_DB, SilentServer


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


@pytest.fixture
def quick(data_settings: DataActivitySettings) -> DataActivitySettings:
    """Waits of seconds instead of minutes, and a heartbeat every 0.2 s: a few heartbeats are due in each wait."""
    return dataclasses.replace(
        data_settings, s3_connect_timeout=1, s3_read_timeout=1, s3_attempts=2, connect_timeout=1, heartbeat_interval=0.2
    )


@pytest.mark.timeout(120)
def test_the_snapshots_undo_heartbeats_while_the_store_does_not_answer_then_fails_saying_so(
    steps: Steps,
    silent: SilentServer,
    quick: DataActivitySettings,
    kube_api: k8s.ApiClient,
    heartbeats: list[dict[str, Any]],
) -> None:
    endpoint = f"http://127.0.0.1:{silent.port}"
    spec = steps.snapshot_spec.model_copy(update={"endpoint": endpoint})
    undo = UndoSnapshotInput(ref=steps.ref, snapshot=spec, key=steps.key, keep=False)

    with pytest.raises(S3NotAnswering, match=f"the S3 endpoint {endpoint} did not answer within 1s"):
        steps.env.run(SnapshotStoreActivities(kube_api, quick).undo_snapshot, undo)

    assert len(heartbeats) >= 5, heartbeats


@pytest.mark.timeout(120)
def test_the_check_before_traffic_goes_back_heartbeats_while_it_tries_to_reach_a_source_that_does_not_answer(
    steps: Steps,
    silent: SilentServer,
    quick: DataActivitySettings,
    kube_api: k8s.ApiClient,
    namespace: str,
    heartbeats: list[dict[str, Any]],
) -> None:
    create_secret(
        kube_api,
        namespace,
        SILENT_DB,
        {"host": "127.0.0.1", "port": str(silent.port), "username": "postgres", "password": "p", "database": "d"},
    )
    hung = dataclasses.replace(
        steps,
        postgres=PostgresActivities(kube_api, quick),
        driver=steps.driver.model_copy(update={"source_secret": SILENT_DB}),
    )

    with pytest.raises(DatabaseUnreachable):
        hung.check_unwritten(None)

    assert len(heartbeats) >= 5, heartbeats
