"""A late attempt of the snapshot never deletes or overwrites the objects a later attempt stored.

A worker paused (SIGSTOP, a frozen VM) inside the snapshot step is written off past its
heartbeat timeout; the saga's next attempt stores the snapshot, main object and streams,
and the run goes on, keeping that object set as the recovery point (status.snapshot names
each object's SHA-256; mode Online never restores from it). When the paused worker goes on,
it finds the later attempt's objects (each names the attempt that wrote it) and is refused
with Overtaken: at its start, before it deletes anything, or as it is about to complete an
upload, having aborted its own. The pause itself is not made here: the late attempt is
called after the later one, or, to stand still past its first look, from inside its own
dump. Attempts are activities of one run, as conftest.scheduled_as schedules them.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client as k8s

from activities.postgres import dumping, snapshot_attempts
from activities.postgres.activities import PostgresActivities
from activities.postgres.attempts import Attempt
from activities.settings import DataActivitySettings
from devstack.stack.stack import StackInfo
from ferry.api.errors import Overtaken
from ferry.api.saga import SnapshotResult, stream_key
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps, scheduled_as
from tests.postgres.data import contents, create_bulky, create_shop

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

EARLIER, LATER = 20, 21
"""The activity ids of the written-off attempt and of the saga's next one."""


@pytest.fixture
def in_streams(steps: Steps, kube_api: k8s.ApiClient, data_settings: DataActivitySettings) -> Steps:
    """The steps of a Migration asking for three streams, on a worker that uses streams for any size."""
    settings = dataclasses.replace(data_settings, parallel_min_size=0)
    driver = steps.driver.model_copy(update={"parallelism": 3})
    return dataclasses.replace(steps, postgres=PostgresActivities(kube_api, settings), driver=driver)


def _frozen_source(databases: Databases, steps: Steps) -> None:
    create_shop(databases.source, customers=500, orders=5_000)
    create_bulky(databases.source, rows=20_000)
    steps.freeze()


def _objects(s3: S3Client, bucket: str) -> dict[str, tuple[str, str | None]]:
    """Every object in the bucket: its ETag and the attempt its metadata names (the activity id)."""
    found = {}
    for item in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
        key = str(item["Key"])
        written = snapshot_attempts.written_by(s3, bucket, key)
        found[key] = (str(item["ETag"]), written.activity if written else None)
    return found


def _versions(s3: S3Client, bucket: str) -> list[tuple[str, str]]:
    listed = s3.list_object_versions(Bucket=bucket)
    versions = [(str(item["Key"]), str(item["VersionId"])) for item in listed.get("Versions", [])]
    return sorted(versions + [(str(item["Key"]), "delete marker") for item in listed.get("DeleteMarkers", [])])


def _uploads(s3: S3Client, bucket: str) -> list[str]:
    return [str(upload["Key"]) for upload in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def _keys(snapshot: SnapshotResult) -> list[str]:
    return sorted([snapshot.key, *(stream.key for stream in snapshot.streams)])


@pytest.mark.parametrize("versions", [False, True], ids=["plain bucket", "bucket keeping versions"])
def test_a_late_snapshot_attempt_is_refused_and_leaves_every_object_of_the_later_attempt(
    in_streams: Steps, databases: Databases, stack: StackInfo, bucket: str, versions: bool
) -> None:
    """It used to remove the later attempt's streams first (every version of them) and dump again: status.snapshot
    named objects that were gone, and the largest tables would have restored empty."""
    s3 = stack.s3_client()
    if versions:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    _frozen_source(databases, in_streams)
    later = scheduled_as(in_streams, LATER).snapshot()
    assert len(later.streams) >= 2
    stored, stored_versions = _objects(s3, bucket), _versions(s3, bucket)
    assert sorted(stored) == _keys(later)
    assert {attempt for _, attempt in stored.values()} == {str(LATER)}, "every object names the attempt that wrote it"

    with pytest.raises(Overtaken) as refused:
        scheduled_as(in_streams, EARLIER).snapshot()

    message = str(refused.value)
    assert f"was written by a later attempt of the snapshot (activity {LATER} of workflow run" in message
    assert "This is a late attempt the saga has moved past" in message
    assert "It changed nothing, and left every object of the later attempt as it is." in message
    assert _objects(s3, bucket) == stored, "the same objects, with the same ETags"
    assert _versions(s3, bucket) == stored_versions, "no version deleted, none added"
    assert _uploads(s3, bucket) == []
    scheduled_as(in_streams, LATER + 1).migrate(later)  # the recovery point restores, every SHA-256 as recorded
    assert contents(databases.target) == contents(databases.source)


def test_a_late_attempt_that_went_on_past_its_first_look_does_not_complete_its_upload_over_the_later_one(
    in_streams: Steps, databases: Databases, stack: StackInfo, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The earlier attempt found nothing of a later one at its start, then stood still before its upload began; the
    later attempt stored everything meanwhile. As the earlier one is about to complete its main object, it looks
    again, aborts its own upload and is refused: without that look it would replace the later main object."""
    _frozen_source(databases, in_streams)
    s3 = stack.s3_client()
    original = dumping.dump_to_s3
    later: list[SnapshotResult] = []
    failed: list[BaseException] = []

    def run_the_later_attempt() -> None:
        try:
            later.append(scheduled_as(in_streams, LATER).snapshot())
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            failed.append(error)

    def standing_still(*args: Any, **kwargs: Any) -> tuple[str, int]:
        if not later and not failed and Attempt.current().activity == str(EARLIER):
            meanwhile = threading.Thread(target=run_the_later_attempt)
            meanwhile.start()
            meanwhile.join()
        return original(*args, **kwargs)

    monkeypatch.setattr(dumping, "dump_to_s3", standing_still)

    with pytest.raises(Overtaken) as refused:
        scheduled_as(in_streams, EARLIER).snapshot()

    assert failed == []
    [snapshot] = later
    assert f"It aborted its own upload of s3://{bucket}/{in_streams.key}" in str(refused.value)
    stored = _objects(s3, bucket)
    assert sorted(stored) == _keys(snapshot)
    assert {attempt for _, attempt in stored.values()} == {str(LATER)}
    assert _uploads(s3, bucket) == []
    monkeypatch.undo()
    scheduled_as(in_streams, LATER + 1).migrate(snapshot)
    assert contents(databases.target) == contents(databases.source)


def test_in_the_normal_order_the_later_attempt_replaces_the_earlier_ones_objects_and_removes_its_leftovers(
    in_streams: Steps, steps: Steps, databases: Databases, stack: StackInfo, bucket: str
) -> None:
    """Attempt 20 stored a snapshot in streams, and an older ferry left a stream object without the metadata; attempt
    21, on a worker that takes no streams, replaces the main object and removes every stream: what is left names 21."""
    _frozen_source(databases, in_streams)
    earlier = scheduled_as(in_streams, EARLIER).snapshot()
    assert len(earlier.streams) >= 2
    s3 = stack.s3_client()
    unnamed = stream_key(in_streams.key, len(earlier.streams) + 1)
    s3.put_object(Bucket=bucket, Key=unnamed, Body=b"an older ferry's stream")

    later = scheduled_as(steps, LATER).snapshot()

    assert later.streams == []
    left = _objects(s3, bucket)
    assert sorted(left) == [later.key], "the earlier attempt's streams and the unnamed one are gone"
    assert left[later.key][1] == str(LATER)
    assert _uploads(s3, bucket) == []
    scheduled_as(steps, LATER + 1).migrate(later)
    assert contents(databases.target) == contents(databases.source)


@pytest.mark.parametrize("versions", [False, True], ids=["plain bucket", "bucket keeping versions"])
def test_an_object_a_later_attempt_stores_between_the_last_look_and_the_completion_is_not_replaced(
    steps: Steps, databases: Databases, stack: StackInfo, bucket: str, versions: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The earlier attempt looks at the key just before completing its upload and finds nothing of a later attempt;
    then it stands still, and the later attempt stores its object there. Its completion is a write conditional on
    what it saw, so the store refuses it, and the look, made again, refuses the attempt. Without the condition, the
    completion replaced the later attempt's object (its SHA-256 no longer the one in status.snapshot).

    The interleaving is made by writing the later attempt's object from inside the check (a put of its own, named
    as the later attempt names its objects): a worker standing still between two requests cannot be had on demand."""
    s3 = stack.s3_client()
    if versions:
        s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    _frozen_source(databases, steps)
    original = snapshot_attempts.before_completing
    stored: list[str] = []

    def with_a_later_write_meanwhile(*args: Any) -> Any:
        check = original(*args)

        def looked_then_stood_still() -> Any:
            seen = check()
            if not stored:
                mine = Attempt.current()
                theirs = dataclasses.replace(mine, activity=str(LATER), number=1)
                put = s3.put_object(
                    Bucket=bucket,
                    Key=steps.key,
                    Body=b"the later attempt's snapshot",
                    Metadata=snapshot_attempts.metadata(theirs),
                )
                stored.append(str(put["ETag"]))
            return seen

        return looked_then_stood_still

    monkeypatch.setattr(snapshot_attempts, "before_completing", with_a_later_write_meanwhile)

    with pytest.raises(Overtaken) as refused:
        scheduled_as(steps, EARLIER).snapshot()

    assert f"It aborted its own upload of s3://{bucket}/{steps.key}" in str(refused.value)
    assert _objects(s3, bucket) == {steps.key: (stored[0], str(LATER))}, "the later attempt's object, as it stored it"
    assert s3.get_object(Bucket=bucket, Key=steps.key)["Body"].read() == b"the later attempt's snapshot"
    assert _uploads(s3, bucket) == []
