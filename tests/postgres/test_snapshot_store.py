"""undo_snapshot and delete_snapshot remove the snapshot object, unless retention keeps it; twice is harmless."""

from __future__ import annotations

import pytest
from temporalio.testing import ActivityEnvironment

from activities.settings import MIB
from activities.snapshots import SnapshotStoreActivities
from devstack.stack.stack import StackInfo
from ferry.api.errors import InvalidSpec
from ferry.api.migration import SnapshotSpec
from ferry.api.saga import (
    DeleteSnapshotInput,
    MigrationRef,
    SnapshotResult,
    UndoSnapshotInput,
    precheck_key,
    snapshot_key,
)


@pytest.fixture
def artifact(stack: StackInfo, ref: MigrationRef, snapshot_spec: SnapshotSpec) -> SnapshotResult:
    key = snapshot_key(ref, snapshot_spec)
    stack.s3_client().put_object(Bucket=snapshot_spec.bucket, Key=key, Body=b"a snapshot")
    return SnapshotResult(bucket=snapshot_spec.bucket, key=key, sha256="0" * 64, size_bytes=10)


def _keys(stack: StackInfo, bucket: str) -> list[str]:
    return [item["Key"] for item in stack.s3_client().list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_undo_snapshot_deletes_the_object_and_any_unfinished_upload_of_it(
    activity_env: ActivityEnvironment,
    snapshots: SnapshotStoreActivities,
    stack: StackInfo,
    ref: MigrationRef,
    snapshot_spec: SnapshotSpec,
    artifact: SnapshotResult,
) -> None:
    s3 = stack.s3_client()
    s3.put_object(Bucket=artifact.bucket, Key="someone/else.dump", Body=b"not ours")
    upload = s3.create_multipart_upload(Bucket=artifact.bucket, Key=artifact.key)
    s3.upload_part(Bucket=artifact.bucket, Key=artifact.key, UploadId=upload["UploadId"], PartNumber=1, Body=b"x" * MIB)
    undo = UndoSnapshotInput(ref=ref, snapshot=snapshot_spec, artifact=artifact, keep=False)

    activity_env.run(snapshots.undo_snapshot, undo)
    activity_env.run(snapshots.undo_snapshot, undo)  # a second run is harmless

    assert _keys(stack, artifact.bucket) == ["someone/else.dump"]
    assert s3.list_multipart_uploads(Bucket=artifact.bucket).get("Uploads", []) == []


def test_undo_snapshot_keeps_the_object_when_retention_says_so(
    activity_env: ActivityEnvironment,
    snapshots: SnapshotStoreActivities,
    stack: StackInfo,
    ref: MigrationRef,
    snapshot_spec: SnapshotSpec,
    artifact: SnapshotResult,
) -> None:
    activity_env.run(
        snapshots.undo_snapshot, UndoSnapshotInput(ref=ref, snapshot=snapshot_spec, artifact=artifact, keep=True)
    )

    assert _keys(stack, artifact.bucket) == [artifact.key]


def test_delete_snapshot_deletes_the_object_and_a_bucket_already_gone_counts_as_deleted(
    activity_env: ActivityEnvironment,
    snapshots: SnapshotStoreActivities,
    stack: StackInfo,
    ref: MigrationRef,
    snapshot_spec: SnapshotSpec,
    artifact: SnapshotResult,
) -> None:
    delete = DeleteSnapshotInput(ref=ref, snapshot=snapshot_spec, artifact=artifact)

    activity_env.run(snapshots.delete_snapshot, delete)

    assert _keys(stack, artifact.bucket) == []
    stack.s3_client().delete_bucket(Bucket=artifact.bucket)
    activity_env.run(snapshots.delete_snapshot, delete)


@pytest.mark.parametrize("named", ["another Migration's key", "another bucket"])
def test_the_undo_and_the_retention_cleanup_refuse_an_object_that_is_not_this_migrations_snapshot(
    activity_env: ActivityEnvironment,
    snapshots: SnapshotStoreActivities,
    stack: StackInfo,
    ref: MigrationRef,
    snapshot_spec: SnapshotSpec,
    artifact: SnapshotResult,
    named: str,
) -> None:
    """The object to delete was taken from the input: the status the watcher read (anyone who may write the status),
    or a run started by hand. Another Migration's kept snapshot in a shared bucket may be the only copy of its data."""
    others = MigrationRef(namespace=ref.namespace, name="other", uid="0b7d6a1e-0000-4000-8000-000000000001")
    victim = snapshot_key(others, snapshot_spec)
    stack.s3_client().put_object(Bucket=snapshot_spec.bucket, Key=victim, Body=b"the only copy")
    elsewhere = (
        artifact.model_copy(update={"key": victim})
        if named == "another Migration's key"
        else artifact.model_copy(update={"bucket": "another-bucket"})
    )

    for activity, argument in (
        (snapshots.delete_snapshot, DeleteSnapshotInput(ref=ref, snapshot=snapshot_spec, artifact=elsewhere)),
        (snapshots.undo_snapshot, UndoSnapshotInput(ref=ref, snapshot=snapshot_spec, artifact=elsewhere, keep=False)),
    ):
        with pytest.raises(InvalidSpec, match=f"keeps its snapshot at s3://{snapshot_spec.bucket}/{artifact.key}"):
            activity_env.run(activity, argument)

    assert sorted(_keys(stack, snapshot_spec.bucket)) == sorted([artifact.key, victim]), "nothing was deleted"


def test_deleting_the_snapshot_in_a_bucket_that_keeps_versions_leaves_no_version_of_it(
    activity_env: ActivityEnvironment,
    snapshots: SnapshotStoreActivities,
    stack: StackInfo,
    ref: MigrationRef,
    snapshot_spec: SnapshotSpec,
) -> None:
    """A plain delete in a versioned bucket only hides the object under a delete marker: the database's rows would
    stay in the bucket, one copy per attempt that wrote it, after retention said Delete."""
    s3 = stack.s3_client()
    key = snapshot_key(ref, snapshot_spec)
    s3.put_object(Bucket=snapshot_spec.bucket, Key=key, Body=b"written before the bucket kept versions")  # "null"
    s3.put_bucket_versioning(Bucket=snapshot_spec.bucket, VersioningConfiguration={"Status": "Enabled"})
    for attempt in (b"the first attempt's dump", b"the second attempt's dump"):
        s3.put_object(Bucket=snapshot_spec.bucket, Key=key, Body=attempt)
    s3.put_object(Bucket=snapshot_spec.bucket, Key=f"{key}.other", Body=b"not this snapshot")
    artifact = SnapshotResult(bucket=snapshot_spec.bucket, key=key, sha256="0" * 64, size_bytes=25)

    activity_env.run(snapshots.delete_snapshot, DeleteSnapshotInput(ref=ref, snapshot=snapshot_spec, artifact=artifact))

    listed = s3.list_object_versions(Bucket=snapshot_spec.bucket)
    left = [(item["Key"], "version") for item in listed.get("Versions", [])]
    left += [(item["Key"], "delete marker") for item in listed.get("DeleteMarkers", [])]
    assert left == [(f"{key}.other", "version")]


def test_the_retention_cleanup_deletes_every_version_of_a_probe_a_killed_precheck_left(
    activity_env: ActivityEnvironment,
    snapshots: SnapshotStoreActivities,
    stack: StackInfo,
    ref: MigrationRef,
    snapshot_spec: SnapshotSpec,
    artifact: SnapshotResult,
) -> None:
    """The precheck writes its probe beside the snapshot and deletes it at once; a worker killed in between leaves it,
    one version per attempt in a bucket that keeps versions. Another Migration's probe stays."""
    s3 = stack.s3_client()
    s3.put_bucket_versioning(Bucket=snapshot_spec.bucket, VersioningConfiguration={"Status": "Enabled"})
    probe = precheck_key(ref, snapshot_spec)
    for attempt in (b"the first attempt's probe", b"the second attempt's probe"):
        s3.put_object(Bucket=snapshot_spec.bucket, Key=probe, Body=attempt)
    others = MigrationRef(namespace=ref.namespace, name="other", uid="0b7d6a1e-0000-4000-8000-000000000002")
    s3.put_object(Bucket=snapshot_spec.bucket, Key=precheck_key(others, snapshot_spec), Body=b"its precheck, running")

    activity_env.run(snapshots.delete_snapshot, DeleteSnapshotInput(ref=ref, snapshot=snapshot_spec, artifact=artifact))

    listed = s3.list_object_versions(Bucket=snapshot_spec.bucket)
    left = [(item["Key"], "version") for item in listed.get("Versions", [])]
    left += [(item["Key"], "delete marker") for item in listed.get("DeleteMarkers", [])]
    assert left == [(precheck_key(others, snapshot_spec), "version")]
