"""A source that is a primary with a streaming standby, as behind a failover manager: ferry's freeze, its undo and its
checks act on the primary, and an unfreeze reaches the standby before the undo counts as done.

A physical standby shares its primary's identity, so the check of the database a Secret
reaches (identity.py) lets a session on it through; every query of the freeze's checks
works on a standby too, and replaying WAL moves none of the counters they compare. After
a switchover, the Secret still naming the old primary (now a standby of the new one), the
check before traffic moved passed while the new primary took writes the target lacked.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from psycopg import sql
from temporalio.testing import ActivityEnvironment

from activities.postgres.connection import ServerInRecovery
from devstack.stack.install import Binaries
from devstack.stack.postgres import SUPERUSER
from devstack.stack.readiness import LOOPBACK
from devstack.stack.stack import StackInfo
from ferry.api.errors import WritesAfterFreeze
from ferry.api.saga import MigrationRef
from tests.cluster import eventually
from tests.end_to_end import S3_SECRET, SOURCE_SECRET, TARGET_SECRET, Databases
from tests.postgres.conftest import Steps, create_secret, precheck_problems
from tests.postgres.data import connect, connection_of, create_shop, database_settings
from tests.postgres.standby import Pair, Server, streaming_pair

SHOP = "shop"
FROZEN = "default_transaction_read_only=on"


def _shop(primary: Server) -> None:
    with connect(primary.endpoint()) as conn:
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(SHOP)))
    create_shop(primary.endpoint(SHOP), customers=100, orders=1_000)


@pytest.fixture
def pair(binaries: Binaries) -> Iterator[Pair]:
    """pod-0, the primary, and pod-1 streaming from it, both holding a small shop."""
    with streaming_pair(binaries.source_postgres_bindir, _shop) as made:
        yield made


@pytest.fixture
def migration_secrets(
    kube_api: k8s.ApiClient, namespace: str, stack: StackInfo, pair: Pair, databases: Databases
) -> None:
    """The source Secret names pod-0, the primary, as a Secret naming the StatefulSet's first Pod does."""
    create_secret(kube_api, namespace, SOURCE_SECRET, connection_of(pair.primary.endpoint(SHOP)))
    create_secret(kube_api, namespace, TARGET_SECRET, connection_of(databases.target))
    assert stack.s3_access_key is not None
    assert stack.s3_secret_key is not None
    credentials = {"accessKeyId": stack.s3_access_key, "secretAccessKey": stack.s3_secret_key}
    create_secret(kube_api, namespace, S3_SECRET, credentials)


@pytest.fixture
def ref(applied_ref: MigrationRef) -> MigrationRef:
    """A Migration that exists: the precheck records in its status which databases it checked."""
    return applied_ref


def _point_source_at(kube_api: k8s.ApiClient, namespace: str, server: Server) -> None:
    k8s.CoreV1Api(kube_api).patch_namespaced_secret(
        SOURCE_SECRET, namespace, {"stringData": {"port": str(server.port)}}
    )


def _attempt_timeout(env: ActivityEnvironment, seconds: float) -> None:
    """The start-to-close timeout of the activities' attempts: undo_freeze waits for standbys a quarter of it."""
    env.info = dataclasses.replace(env.info, start_to_close_timeout=timedelta(seconds=seconds))


def test_check_frozen_refuses_the_old_primary_a_switchover_made_a_standby_instead_of_missing_the_new_ones_writes(
    steps: Steps, pair: Pair, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """Before, the check passed: replay moves no counter, and the old primary restored its statistics, the mark's,
    from its clean shutdown. Traffic then moved, and the run ended Succeeded without the row the new primary took."""
    steps.precheck()  # pins the Secret to the database: a standby of it has the same identity
    frozen = steps.freeze()
    new = pair.standby
    pair.switchover()
    with connect(new.endpoint(SHOP)) as superuser:  # frozen by the replayed freeze, but a superuser may write
        superuser.execute("begin read write; update shop.orders set total = total + 1 where id = 7; commit")
    pair.wait_replayed()

    with pytest.raises(ServerInRecovery, match=f"Secret {namespace}/{SOURCE_SECRET}'s host reaches a standby"):
        steps.check_frozen(frozen.fence)

    _point_source_at(kube_api, namespace, new)  # the failover manager's primary Service, say
    with pytest.raises(WritesAfterFreeze, match="the statistics were reset since the freeze"):
        steps.check_frozen(frozen.fence)  # the new primary's are its own: the Migration rolls back


def test_precheck_names_a_source_secret_that_reaches_a_standby(
    steps: Steps, pair: Pair, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """Otherwise the freeze would refuse it attempt after attempt, then fail."""
    _point_source_at(kube_api, namespace, pair.standby)

    problems = precheck_problems(steps.precheck)

    assert any(p.startswith(f"Secret {namespace}/{SOURCE_SECRET} reaches a standby: ") for p in problems), problems
    _point_source_at(kube_api, namespace, pair.primary)
    steps.precheck()  # the primary passes


def test_the_freeze_its_undo_the_snapshot_and_verify_refuse_a_secret_that_reaches_a_standby(
    steps: Steps, pair: Pair, kube_api: k8s.ApiClient, namespace: str
) -> None:
    _point_source_at(kube_api, namespace, pair.standby)
    with pytest.raises(ServerInRecovery, match="is in recovery"):
        steps.freeze()

    _point_source_at(kube_api, namespace, pair.primary)
    frozen = steps.freeze()
    pair.wait_replayed()
    _point_source_at(kube_api, namespace, pair.standby)
    for step in (steps.undo_freeze, steps.snapshot, steps.verify, lambda: steps.check_frozen(frozen.fence)):
        with pytest.raises(ServerInRecovery, match="is in recovery"):
            step()
    assert FROZEN in database_settings(pair.primary.endpoint(SHOP)), "the undo changed nothing"

    _point_source_at(kube_api, namespace, pair.primary)
    steps.undo_freeze()
    assert database_settings(pair.primary.endpoint(SHOP)) == []


def test_undo_freeze_returns_once_the_streaming_standby_has_replayed_the_unfreeze(
    steps: Steps,
    pair: Pair,
    activity_env: ActivityEnvironment,
    heartbeats: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, the undo returned as soon as it committed: a failover then could promote a standby still frozen
    (read-only, CONNECT revoked) under a Migration that said RolledBack."""
    steps.freeze()
    pair.wait_replayed()
    standby = pair.standby
    _attempt_timeout(activity_env, 120)
    done: list[float] = []

    def undo_freeze() -> None:
        steps.undo_freeze()
        done.append(time.monotonic())

    undo = threading.Thread(target=undo_freeze)
    with standby.replay_paused():
        undo.start()
        eventually(
            "the undo waiting for pod-1",
            lambda: any("pod-1" in str(beat.get("standbys_behind")) for beat in heartbeats),
            timeout=15,
        )
        assert not done
        assert database_settings(pair.primary.endpoint(SHOP)) == [], "unfrozen on the primary"
        assert FROZEN in database_settings(standby.endpoint(SHOP)), "not yet on the standby"
    undo.join(timeout=60)

    assert done, "the undo returned"
    assert not [r for r in caplog.records if "not replayed" in r.getMessage()], "it saw the replay, not its bound"
    assert database_settings(standby.endpoint(SHOP)) == []


def test_undo_freeze_goes_on_with_a_warning_when_a_streaming_standby_does_not_replay_within_its_bound(
    steps: Steps, pair: Pair, activity_env: ActivityEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    """An undo must not hang on a standby that is stuck: past its bound it goes on, naming the standby."""
    steps.freeze()
    pair.wait_replayed()
    _attempt_timeout(activity_env, 8)  # a bound of 2 s
    with pair.standby.replay_paused():
        started = time.monotonic()

        steps.undo_freeze()

        waited = time.monotonic() - started
        assert FROZEN in database_settings(pair.standby.endpoint(SHOP)), "still paused"
    assert waited >= 2, "it waited its bound, a quarter of the attempt's 8 s"
    assert database_settings(pair.primary.endpoint(SHOP)) == []
    (warning,) = [record.getMessage() for record in caplog.records if "not replayed" in record.getMessage()]
    assert "standbys pod-1 at 127.0.0.1 had not replayed the unfreeze" in warning
    assert "after 2.0 s" in warning, "the attempt's own timeout set the bound, not the longest one"
    pair.wait_replayed()
    assert database_settings(pair.standby.endpoint(SHOP)) == []


def test_undo_freeze_does_not_wait_for_a_wal_receiver_that_replays_nothing(
    steps: Steps, pair: Pair, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """pg_receivewal (an archiver, a backup tool's WAL stream) streams like a standby but has no replay position:
    waiting for it would cost every undo its whole bound, and warn of a standby that is none."""
    steps.freeze()
    pair.wait_replayed()
    archive = tmp_path / "wal"
    archive.mkdir()
    primary = pair.primary
    reach = f"host={LOOPBACK} port={primary.port} user={SUPERUSER} application_name=archiver"
    receiver = subprocess.Popen(
        [str(primary.bindir / "pg_receivewal"), "-D", str(archive), f"--dbname={reach}", "--no-password"],
        env={**os.environ, "PGPASSWORD": primary.password},
    )
    try:
        eventually("the archiver to stream", lambda: "archiver" in primary.streaming_standbys())

        steps.undo_freeze()

        assert not [r for r in caplog.records if "archiver" in r.getMessage()], "neither waited for nor named"
        assert database_settings(primary.endpoint(SHOP)) == []
    finally:
        receiver.terminate()
        receiver.wait(timeout=30)
