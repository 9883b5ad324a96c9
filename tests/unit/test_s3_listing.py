"""Cleaning up a snapshot's uploads and streams acts only on its own keys, whatever the store lists.

A fake stands in for the store here, to inject what the real one does not do on demand: a
store (or a proxy in front of it) that ignores the listing's prefix and returns every key of
the bucket, other Migrations' kept snapshots among them.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from activities import s3 as snapshot_store

pytestmark = pytest.mark.unit

KEY = "shop/orders/uid-1/snapshot.dump"
OTHERS = ["shop/orders/uid-0/snapshot.dump", "shop/billing/uid-9/snapshot.tables-1.dump"]


def _store() -> tuple[Any, Stubber]:
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b")
    return client, Stubber(client)


def test_aborting_a_snapshots_uploads_leaves_those_of_keys_a_careless_listing_adds() -> None:
    client, store = _store()
    mine = f"{KEY.removesuffix('.dump')}.tables-2.dump"
    uploads = [{"Key": key, "UploadId": f"u-{n}"} for n, key in enumerate([*OTHERS, mine])]
    store.add_response("list_multipart_uploads", {"Uploads": uploads}, {"Bucket": "b", "Prefix": ANY})
    store.add_response("abort_multipart_upload", {}, {"Bucket": "b", "Key": mine, "UploadId": "u-2"})

    with store:
        removed = snapshot_store.remove_streams(client, "b", KEY, keep_objects=True)

    assert removed == 1
    store.assert_no_pending_responses()


def test_removing_a_snapshots_streams_deletes_no_object_a_careless_listing_adds() -> None:
    client, store = _store()
    mine = f"{KEY.removesuffix('.dump')}.tables-1.dump"
    store.add_response("list_multipart_uploads", {"Uploads": []}, {"Bucket": "b", "Prefix": ANY})
    listed = [{"Key": key, "Size": 1} for key in [*OTHERS, mine]]
    store.add_response("list_objects_v2", {"Contents": listed, "KeyCount": 3}, {"Bucket": "b", "Prefix": ANY})
    store.add_response("delete_object", {}, {"Bucket": "b", "Key": mine})
    versions = [{"Key": key, "VersionId": f"v-{n}"} for n, key in enumerate([*OTHERS, mine])]
    store.add_response("list_object_versions", {"Versions": versions}, {"Bucket": "b", "Prefix": mine})
    store.add_response("delete_object", {}, {"Bucket": "b", "Key": mine, "VersionId": "v-2"})

    with store:
        removed = snapshot_store.remove_streams(client, "b", KEY)

    assert removed == 1
    store.assert_no_pending_responses()
