"""The S3 server speaks real S3 to boto3, multipart uploads included."""

from __future__ import annotations

import hashlib
import os
import uuid

from boto3.s3.transfer import TransferConfig

from devstack.stack.stack import StackInfo


def test_boto3_round_trips_a_20_mb_object_through_multipart_upload(stack: StackInfo, tmp_path) -> None:  # type: ignore[no-untyped-def]
    s3 = stack.s3_client()
    bucket = f"roundtrip-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    payload = os.urandom(20 * 1024 * 1024)
    source = tmp_path / "payload.bin"
    source.write_bytes(payload)
    five_mb_parts = TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024)

    s3.upload_file(str(source), bucket, "big/payload.bin", Config=five_mb_parts)
    downloaded = tmp_path / "downloaded.bin"
    s3.download_file(bucket, "big/payload.bin", str(downloaded))

    head = s3.head_object(Bucket=bucket, Key="big/payload.bin")
    assert head["ContentLength"] == len(payload)
    # A multipart object's ETag is "<md5 of the part md5s>-<number of parts>".
    assert head["ETag"].strip('"').endswith("-4")
    assert hashlib.sha256(downloaded.read_bytes()).digest() == hashlib.sha256(payload).digest()
