"""snapshot streams a pg_dump of the source into one S3 object, with the SHA-256 and size it records."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities.postgres import streams
from activities.settings import MIB
from devstack.stack.install import Binaries
from devstack.stack.stack import StackInfo
from tests.cluster import eventually
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import connect, create_bulky, create_shop, other_sessions


def _objects(stack: StackInfo, bucket: str) -> list[str]:
    listed = stack.s3_client().list_objects_v2(Bucket=bucket)
    return [item["Key"] for item in listed.get("Contents", [])]


def _unfinished_uploads(stack: StackInfo, bucket: str) -> list[str]:
    return [upload["Key"] for upload in stack.s3_client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def test_snapshot_puts_a_restorable_dump_in_s3_with_the_checksum_and_size_it_reports(
    steps: Steps,
    databases: Databases,
    stack: StackInfo,
    bucket: str,
    binaries: Binaries,
    heartbeats: list[dict[str, Any]],
) -> None:
    create_shop(databases.source, customers=500, orders=5_000)

    result = steps.snapshot()

    assert (result.bucket, result.key) == (
        bucket,
        f"{steps.ref.namespace}/orders-db-to-16/{steps.ref.uid}/snapshot.dump",
    )
    stored = stack.s3_client().get_object(Bucket=bucket, Key=result.key)["Body"].read()
    assert len(stored) == result.size_bytes
    assert hashlib.sha256(stored).hexdigest() == result.sha256
    listing = subprocess.run(
        [str(binaries.postgres_bindir / "pg_restore"), "--list"], input=stored, capture_output=True, check=True
    ).stdout.decode()
    for entry in (
        "TABLE shop customers",
        "TABLE DATA shop orders",
        "SEQUENCE audit ticket_seq",
        "VIEW shop big_orders",
    ):
        assert entry in listing
    assert _objects(stack, bucket) == [result.key]
    assert _unfinished_uploads(stack, bucket) == []
    assert max(details.get("dumped_bytes", 0) for details in heartbeats) == result.size_bytes


def test_snapshot_run_again_replaces_the_object_and_aborts_the_upload_a_dead_attempt_left(
    steps: Steps, databases: Databases, stack: StackInfo, bucket: str
) -> None:
    create_shop(databases.source, customers=500, orders=5_000)
    s3 = stack.s3_client()
    dead = s3.create_multipart_upload(Bucket=bucket, Key=steps.key)
    s3.upload_part(Bucket=bucket, Key=steps.key, UploadId=dead["UploadId"], PartNumber=1, Body=b"x" * 5 * MIB)

    steps.snapshot()
    again = steps.snapshot()

    assert _objects(stack, bucket) == [steps.key]
    assert _unfinished_uploads(stack, bucket) == []
    stored = s3.get_object(Bucket=bucket, Key=steps.key)["Body"].read()
    assert hashlib.sha256(stored).hexdigest() == again.sha256


def test_a_snapshot_cancelled_in_the_middle_of_its_upload_stops_pg_dump_and_leaves_nothing_in_s3(
    steps: Steps, databases: Databases, stack: StackInfo, bucket: str
) -> None:
    create_bulky(databases.source, rows=300_000)  # about 20 MB: several parts
    env = ActivityEnvironment()
    seen: list[dict[str, Any]] = []

    def cancel_after_the_first_part(*details: Any) -> None:
        seen.append(details[0])
        if details[0].get("dumped_bytes", 0) >= 5 * MIB:
            env.cancel()

    env.on_heartbeat = cancel_after_the_first_part

    with pytest.raises(CancelledError):
        dataclasses.replace(steps, env=env).snapshot()

    assert seen[-1]["dumped_bytes"] < 20 * MIB, "it stopped before the dump was through"
    assert _objects(stack, bucket) == []
    assert _unfinished_uploads(stack, bucket) == []
    eventually("pg_dump's session to end", lambda: other_sessions(databases.source) == 0, timeout=10)


def test_a_snapshot_blocked_on_the_source_keeps_heartbeating_and_stops_when_cancelled(
    steps: Steps, databases: Databases, stack: StackInfo, bucket: str
) -> None:
    """pg_dump waits for a table lock another session holds, so the activity is blocked reading its output."""
    with connect(databases.source) as conn:
        conn.execute("create table public.orders (id int primary key)")
    env = ActivityEnvironment()
    seen: list[dict[str, Any]] = []

    def cancel_after_three_heartbeats(*details: Any) -> None:
        seen.append(details[0])
        if len(seen) >= 3:  # not ==: the step's thread and the heartbeat watchdog both append
            env.cancel()

    env.on_heartbeat = cancel_after_three_heartbeats
    with connect(databases.source) as locker, locker.transaction():
        locker.execute("lock table public.orders in access exclusive mode")
        give_up = threading.Timer(60, env.cancel)  # should the heartbeats never come
        give_up.start()

        with pytest.raises(CancelledError):
            dataclasses.replace(steps, env=env).snapshot()
        give_up.cancel()

    assert len(seen) >= 3, "the watchdog heartbeats while pg_dump waits"
    assert all(details == {} for details in seen), "pg_dump had written nothing"
    assert _objects(stack, bucket) == []
    assert _unfinished_uploads(stack, bucket) == []
    eventually("pg_dump's session to end", lambda: other_sessions(databases.source) == 0, timeout=10)


def test_the_dump_reads_the_snapshot_of_a_session_that_passed_the_checks_so_no_other_server_can_serve_it(
    steps: Steps, databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pg_dump connects on its own, and nothing checks which server its connection reached (a standby, another Pod
    behind the host's name): it imports the snapshot of the session ferry checked. Here the snapshot handed over is
    another real server's, the target's, as if pg_dump had reached a server other than the checked session's: the
    dump fails, and nothing is stored."""
    create_shop(databases.source, customers=10, orders=10)
    exported = streams.exported_snapshot

    @contextlib.contextmanager
    def elsewhere(conn: Any) -> Iterator[str]:
        with exported(conn), connect(databases.target) as other, other.transaction():
            other.execute("set transaction isolation level repeatable read, read only")
            row = other.execute("select pg_export_snapshot()").fetchone()
            assert row is not None
            yield str(row[0])

    monkeypatch.setattr(streams, "exported_snapshot", elsewhere)

    with pytest.raises(RuntimeError, match=r"could not dump .*invalid snapshot identifier"):
        steps.snapshot()
