"""A snapshot's multipart upload against the real S3 server: parts that grow as the dump outgrows its plan.

S3 allows 10,000 parts of at least 5 MiB, and the stack's S3 server refuses smaller
parts as S3 does, so a test cannot reach the real limit cheaply; these tests give the
plan a limit of a few parts instead, which the upload treats exactly as S3's.
"""

from __future__ import annotations

import hashlib
import io
import os

import pytest

from activities.parts import MIB, plan
from activities.s3 import MultipartUpload
from devstack.stack.stack import StackInfo


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
