"""A snapshot's multipart upload against the real S3 server: parts that grow as the dump outgrows its plan.

S3 allows 10,000 parts of at least 5 MiB, and the stack's S3 server refuses smaller
parts as S3 does, so a test cannot reach the real limit cheaply; these tests give the
plan a limit of a few parts instead, which the upload treats exactly as S3's.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from activities.parts import MIB, plan
from activities.s3 import CONDITIONAL_TRIES, MultipartUpload, Precondition
from devstack.stack.stack import StackInfo

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def _stream_through(upload: MultipartUpload, data: bytes) -> list[int]:
    """Feeds `data` part by part as the upload asks, the way the snapshot feeds pg_dump's output; returns the sizes."""
    source, sizes = io.BytesIO(data), []
    while part := source.read(upload.next_part_size()):
        upload.add(part)
        sizes.append(len(part))
    return sizes


def test_a_dump_larger_than_its_plan_gets_larger_parts_and_is_stored_whole(stack: StackInfo, bucket: str) -> None:
    s3 = stack.s3_client()
    data = os.urandom(60 * MIB)
    parts = plan(8 * MIB, smallest=5 * MIB, concurrency=2, memory=64 * MIB, max_parts=8)
    upload = MultipartUpload(s3, bucket, "grown.dump", parts)

    sizes = _stream_through(upload, data)
    upload.complete()

    assert [size // MIB for size in sizes] == [5, 5, 5, 5, 10, 10, 20]
    stored = s3.get_object(Bucket=bucket, Key="grown.dump")["Body"].read()
    assert hashlib.sha256(stored).digest() == hashlib.sha256(data).digest()


def test_a_dump_larger_than_one_object_may_be_fails_and_leaves_no_upload(stack: StackInfo, bucket: str) -> None:
    s3 = stack.s3_client()
    parts = plan(1, smallest=5 * MIB, concurrency=2, memory=64 * MIB, max_parts=2)
    upload = MultipartUpload(s3, bucket, "too-big.dump", parts)

    with pytest.raises(RuntimeError, match="outgrew the 2 parts S3 allows in one upload") as failure:
        _stream_through(upload, os.urandom(16 * MIB))
    upload.abort()

    assert "migrate this database in mode Online" in str(failure.value)
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def _one_part_upload(s3: S3Client, bucket: str, key: str) -> MultipartUpload:
    upload = MultipartUpload(s3, bucket, key, plan(MIB, smallest=5 * MIB, concurrency=1, memory=64 * MIB))
    upload.add(b"the new object")
    return upload


def _looking_at(s3: S3Client, bucket: str, key: str, looks: list[Precondition]) -> Callable[[], Precondition]:
    """A check that only says what is at `key` (its ETag, or nothing), as the snapshot's check does once it finds
    nothing of a later attempt there; it keeps what it said."""

    def look() -> Precondition:
        try:
            etag: str | None = str(s3.head_object(Bucket=bucket, Key=key)["ETag"])
        except ClientError:
            etag = None
        looks.append(Precondition(etag))
        return looks[-1]

    return look


def test_an_upload_completes_only_over_what_its_check_saw_and_looks_again_when_that_changed(
    stack: StackInfo, bucket: str
) -> None:
    s3 = stack.s3_client()
    s3.put_object(Bucket=bucket, Key="object", Body=b"first")
    upload, looks = _one_part_upload(s3, bucket, "object"), []
    look = _looking_at(s3, bucket, "object", looks)

    def changed_after_the_first_look() -> Precondition:
        seen = look()
        if len(looks) == 1:
            s3.put_object(Bucket=bucket, Key="object", Body=b"written meanwhile")
        return seen

    upload.complete(changed_after_the_first_look)

    assert len(looks) == 2, "refused once by the store, then completed over what the second look saw"
    assert looks[0] != looks[1]
    assert s3.get_object(Bucket=bucket, Key="object")["Body"].read() == b"the new object"


def test_an_upload_whose_key_changes_at_every_look_gives_up_and_can_be_aborted(stack: StackInfo, bucket: str) -> None:
    s3 = stack.s3_client()
    upload, looks = _one_part_upload(s3, bucket, "busy"), []
    look = _looking_at(s3, bucket, "busy", looks)

    def always_changed() -> Precondition:
        seen = look()
        s3.put_object(Bucket=bucket, Key="busy", Body=f"write {len(looks)}".encode())
        return seen

    with pytest.raises(RuntimeError, match="something else is writing that key"):
        upload.complete(always_changed)
    upload.abort()

    assert len(looks) == CONDITIONAL_TRIES
    assert s3.get_object(Bucket=bucket, Key="busy")["Body"].read() == f"write {CONDITIONAL_TRIES}".encode()
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_an_upload_over_a_delete_marker_completes_though_the_store_counts_the_marker_as_an_object(
    stack: StackInfo, bucket: str
) -> None:
    """versitygw refuses If-None-Match: * where the key's newest version is a delete marker (AWS takes it): with
    nothing there at two looks, the upload completes without the condition, as it did before there was one."""
    s3 = stack.s3_client()
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket=bucket, Key="deleted", Body=b"old")
    s3.delete_object(Bucket=bucket, Key="deleted")
    upload, looks = _one_part_upload(s3, bucket, "deleted"), []

    upload.complete(_looking_at(s3, bucket, "deleted", looks))

    assert looks[0] == Precondition(None)
    assert s3.get_object(Bucket=bucket, Key="deleted")["Body"].read() == b"the new object"


def test_a_store_that_says_it_takes_no_conditional_writes_gets_the_upload_completed_without_one(
    stack: StackInfo, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some S3-compatible stores answer a conditional header on CompleteMultipartUpload with NotImplemented. Refusing
    the upload there would fail every snapshot after its whole dump was stored, the source frozen: it completes
    without the condition, as before ferry used them, once the check has looked again (and may still refuse).

    versitygw takes conditional writes, so such a store's answer is made here, by the client: a stand-in for a store
    the suite does not run."""
    s3 = stack.s3_client()
    s3.put_object(Bucket=bucket, Key="object", Body=b"first")
    upload, looks = _one_part_upload(s3, bucket, "object"), []
    real = s3.complete_multipart_upload

    def without_conditional_writes(**request: Any) -> Any:
        if "IfMatch" in request or "IfNoneMatch" in request:
            raise ClientError({"Error": {"Code": "NotImplemented", "Message": "not implemented"}}, "Complete")
        return real(**request)

    monkeypatch.setattr(s3, "complete_multipart_upload", without_conditional_writes)

    upload.complete(_looking_at(s3, bucket, "object", looks))

    assert len(looks) == 2, "looked at again before completing without the condition"
    assert s3.get_object(Bucket=bucket, Key="object")["Body"].read() == b"the new object"
