"""Which object the retention cleanup of a deleted Migration deletes: its own snapshot, wherever the status says."""

from __future__ import annotations

from typing import Any

import pytest

from ferry.api.migration import Migration, MigrationStatus, Phase, SnapshotStatus
from ferry.api.saga import snapshot_key
from tests import samples
from watcher.deletion import _retention_cleanup

pytestmark = pytest.mark.unit


def _succeeded(snapshot: SnapshotStatus) -> Migration:
    manifest: dict[str, Any] = samples.migration()
    manifest["spec"]["snapshot"]["retention"] = {"afterSuccess": "DeleteWithMigration"}
    manifest["metadata"].update(namespace="shop", uid="7e0c4a52-0000-4000-8000-000000000001")
    migration = Migration.parse(manifest)
    return migration.model_copy(update={"status": MigrationStatus(phase=Phase.SUCCEEDED, snapshot=snapshot)})


def test_the_cleanup_deletes_the_key_the_spec_gives_whatever_object_the_status_names() -> None:
    """Anyone who may write the status could name another Migration's kept snapshot there."""
    forged = SnapshotStatus(
        location="s3://shared/shop/other/0000/snapshot.dump",
        bucket="shared",
        key="shop/other/0000/snapshot.dump",
        sha256="0" * 64,
        size_bytes=1,
    )
    migration = _succeeded(forged)

    cleanup = _retention_cleanup(migration)

    assert cleanup is not None
    assert migration.spec is not None
    assert cleanup.artifact.bucket == migration.spec.snapshot.bucket
    assert cleanup.artifact.key == snapshot_key(cleanup.ref, migration.spec.snapshot)
