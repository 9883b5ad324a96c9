"""What happens to a snapshot object after the saga used it: undone with the snapshot step, or deleted by retention.

These do not depend on the data driver: a snapshot is one object in S3 whatever made it.
"""

from __future__ import annotations

from botocore.exceptions import ClientError
from kubernetes import client as k8s
from temporalio import activity

from activities import s3 as snapshot_store
from activities.secrets import Secrets, secrets_from
from activities.settings import DataActivitySettings
from ferry.api.migration import SnapshotSpec
from ferry.api.saga import DeleteSnapshotInput, MigrationRef, SnapshotResult, SnapshotStoreActivity, UndoSnapshotInput


class SnapshotStoreActivities:
    """Deletes snapshot objects, with the credentials from the Secret the Migration names."""

    def __init__(
        self, api_client: k8s.ApiClient | None, settings: DataActivitySettings, *, secrets: Secrets | None = None
    ) -> None:
        """`secrets` replaces the Kubernetes Secrets read through `api_client`, e.g. in a benchmark."""
        self._secrets = secrets_from(api_client, secrets)
        self._settings = settings

    @activity.defn(name=SnapshotStoreActivity.UNDO_SNAPSHOT.value)
    def undo_snapshot(self, input: UndoSnapshotInput) -> None:
        """Deletes the snapshot object, unless retention keeps it after a rollback.

        Idempotent: an object (or bucket) that is already gone counts as deleted.
        """
        artifact = input.artifact or SnapshotResult(
            bucket=input.snapshot.bucket, key=input.key, sha256="", size_bytes=0
        )
        if input.keep:
            activity.logger.info("keeping %s after the rollback (retention afterRollback: Keep)", artifact.location)
            return
        self._delete(input.ref, input.snapshot, artifact)

    @activity.defn(name=SnapshotStoreActivity.DELETE_SNAPSHOT.value)
    def delete_snapshot(self, input: DeleteSnapshotInput) -> None:
        """Deletes the snapshot object for retention. Idempotent: an object already gone counts as deleted."""
        self._delete(input.ref, input.snapshot, input.artifact)

    def _delete(self, ref: MigrationRef, spec: SnapshotSpec, artifact: SnapshotResult) -> None:
        credentials = self._secrets.s3_credentials(ref.namespace, spec.credentials_secret)
        s3 = snapshot_store.client(spec, credentials, self._settings)
        with snapshot_store.permanent_failures(s3, artifact.bucket, credentials):
            try:
                snapshot_store.abort_incomplete_uploads(s3, artifact.bucket, artifact.key)
                s3.delete_object(Bucket=artifact.bucket, Key=artifact.key)
            except ClientError as error:
                if snapshot_store.error_code(error) != "NoSuchBucket":
                    raise
                activity.logger.warning("bucket %s is gone, and %s with it", artifact.bucket, artifact.location)
                return
        activity.logger.info("deleted %s", artifact.location)
