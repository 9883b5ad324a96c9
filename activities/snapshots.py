"""What happens to a snapshot object after the saga used it: undone with the snapshot step, or deleted by retention.

These do not depend on the data driver: a snapshot is one object in S3 whatever made it, with the objects of its
parallel streams beside it when it was taken in streams (ferry.api.saga.stream_key), which go with it. So does the
precheck's probe (ferry.api.saga.precheck_key), which a precheck deletes at once but a worker killed in between leaves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError
from kubernetes import client as k8s
from temporalio import activity

from activities import s3 as snapshot_store
from activities.heartbeats import Heartbeats
from activities.secrets import Secrets, retried_until_readable, secrets_from
from activities.settings import DataActivitySettings
from ferry.api.migration import SnapshotSpec
from ferry.api.saga import (
    DeleteSnapshotInput,
    MigrationRef,
    SnapshotStoreActivity,
    UndoSnapshotInput,
    UndoSnapshotResult,
    precheck_key,
    snapshot_key,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class SnapshotStoreActivities:
    """Deletes snapshot objects, with the credentials from the Secret the Migration names."""

    def __init__(
        self, api_client: k8s.ApiClient | None, settings: DataActivitySettings, *, secrets: Secrets | None = None
    ) -> None:
        """`secrets` replaces the Kubernetes Secrets read through `api_client`, e.g. in a benchmark."""
        self._secrets = secrets_from(api_client, secrets)
        self._settings = settings

    @activity.defn(name=SnapshotStoreActivity.UNDO_SNAPSHOT.value)
    def undo_snapshot(self, input: UndoSnapshotInput) -> UndoSnapshotResult:
        """Aborts the snapshot's unfinished uploads and deletes its object, unless retention keeps it.

        Works without the snapshot's result too (it was interrupted, or its outcome is
        unknown): the key is deterministic (`snapshot_key`), so the undo finds whatever
        any attempt wrote under it. Unfinished uploads are aborted even when retention
        keeps the object: they are nobody's snapshot.

        Idempotent: an object, upload or bucket that is already gone counts as deleted.
        """
        bucket = input.artifact.bucket if input.artifact else input.snapshot.bucket
        key = input.artifact.key if input.artifact else (input.key or snapshot_key(input.ref, input.snapshot))
        with Heartbeats(self._settings.heartbeat_interval):  # see _delete
            deleted = self._delete(input.ref, input.snapshot, bucket, key, keep_object=input.keep)
        return UndoSnapshotResult(deleted=deleted)

    @activity.defn(name=SnapshotStoreActivity.DELETE_SNAPSHOT.value)
    def delete_snapshot(self, input: DeleteSnapshotInput) -> None:
        """Deletes the snapshot object for retention. Idempotent: an object already gone counts as deleted."""
        with Heartbeats(self._settings.heartbeat_interval):  # see _delete
            self._delete(input.ref, input.snapshot, input.artifact.bucket, input.artifact.key, keep_object=False)

    def _delete(self, ref: MigrationRef, spec: SnapshotSpec, bucket: str, key: str, *, keep_object: bool) -> bool:
        """Aborts the unfinished uploads of s3://bucket/key and of its streams, and deletes those objects unless
        `keep_object`; deletes the precheck's probe in any case (nobody's snapshot).

        Returns whether nothing is left there. The callers heartbeat meanwhile: one request to a store that does not
        answer waits a read timeout (a minute by default), up to its attempts, longer than the heartbeat timeout, and
        Temporal would take the attempt for lost and start another beside it, instead of the step failing with
        S3NotAnswering.
        """
        snapshot_store.require_own_snapshot(ref, spec, bucket, key, "delete")
        location = f"s3://{bucket}/{key}"
        with retried_until_readable(f"deleting {location}"):
            credentials = self._secrets.s3_credentials(ref.namespace, spec.credentials_secret)
        s3 = snapshot_store.client(spec, credentials, self._settings)
        with snapshot_store.permanent_failures(s3, bucket, credentials):
            try:
                _delete_probe(s3, bucket, precheck_key(ref, spec))
                aborted = snapshot_store.abort_incomplete_uploads(s3, bucket, key)
                if aborted:
                    activity.logger.info("aborted %d unfinished uploads of %s", aborted, location)
                removed = snapshot_store.remove_streams(s3, bucket, key, keep_objects=keep_object)
                if removed:
                    activity.logger.info("removed %d unfinished uploads or objects of %s's streams", removed, location)
                if keep_object:
                    activity.logger.info("keeping %s after the rollback (retention afterRollback: Keep)", location)
                    return False
                versions = snapshot_store.delete_every_version(s3, bucket, key)
                if versions:
                    activity.logger.info("deleted %d older versions and delete markers of %s", versions, location)
            except ClientError as error:
                if snapshot_store.error_code(error) != "NoSuchBucket":
                    raise
                activity.logger.warning("bucket %s is gone, and %s with it", bucket, location)
                return True
        activity.logger.info("deleted %s", location)
        return True


def _delete_probe(s3: S3Client, bucket: str, key: str) -> None:
    """Deletes the precheck's probe at `key` (every version) if a worker killed between its write and its delete
    left it. Looked for first: in a bucket that keeps versions, deleting a key that is not there adds a delete
    marker, which credentials that may not delete versions would leave behind."""
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if snapshot_store.is_missing(error):
            return
        raise
    snapshot_store.delete_every_version(s3, bucket, key)
    activity.logger.info("deleted s3://%s/%s, the precheck's probe a killed worker left", bucket, key)
