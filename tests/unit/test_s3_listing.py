"""Cleaning up a snapshot's uploads and streams acts only on its own keys, whatever the store lists; the precheck
tries what the steps will do in the bucket.

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
from activities.postgres import prechecks
from activities.postgres.prechecks import Problems
from activities.secrets import S3Credentials

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


def test_the_precheck_refuses_credentials_that_may_write_the_bucket_but_not_read_or_list_it() -> None:
    """A policy that allows s3:PutObject and s3:DeleteObject only (the precheck's probe used to try no more): the
    snapshot would be written, then migrate could not read it back, after the freeze. The real store here cannot be
    made to refuse one operation to one user, so a stub answers as such a policy does."""
    client, store = _store()
    store.add_client_error("get_object", service_error_code="AccessDenied", http_status_code=403)
    store.add_response("list_objects_v2", {"KeyCount": 1}, {"Bucket": "b", "Prefix": KEY, "MaxKeys": 1})
    store.add_client_error("list_multipart_uploads", service_error_code="AccessDenied", http_status_code=403)
    problems = Problems()

    with store:
        prechecks._may_use(client, "b", KEY, S3Credentials("ak", "sk", "ns/s3-credentials"), problems)

    store.assert_no_pending_responses()
    [problem] = problems
    assert (
        "may write to bucket 'b' but were refused s3:GetObject (migrate and verify read the snapshot back), " in problem
    )
    assert "s3:ListBucketMultipartUploads" in problem
    assert "s3:ListBucket (" not in problem
