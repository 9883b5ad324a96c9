"""The snapshot's way to S3 is as safe as the spec says: encryption at rest asked for, no plain http unless allowed.

What the worker sends is read from botocore's own record of each request it sends (its
debug log carries the prepared request), from the real client talking to the stack's S3.
That server, versitygw with its posix backend, takes the encryption headers and ignores
them (it stores nothing encrypted and echoes no x-amz-server-side-encryption), so what can
be checked here is that every write asks for it, and that S3 servers which ignore it
still work.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from devstack.stack.stack import StackInfo
from ferry.api.errors import PrecheckFailed
from ferry.api.migration import ServerSideEncryption
from ferry.api.saga import MigrationRef
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import create_shop

SSE = "x-amz-server-side-encryption"
SSE_KEY = "x-amz-server-side-encryption-aws-kms-key-id"
KMS_KEY = "arn:aws:kms:us-east-1:111122223333:key/ferry-snapshots"


@pytest.fixture
def ref(applied_ref: MigrationRef) -> MigrationRef:
    """A Migration that exists: the precheck reads it after marking its Secrets."""
    return applied_ref


@dataclasses.dataclass(frozen=True)
class Sent:
    """One request botocore sent."""

    method: str
    url: str
    headers: dict[str, str]

    @property
    def operation(self) -> str:
        """The S3 operation, told by method and query: the ones a snapshot's writes use."""
        if self.method == "POST" and self.url.endswith("?uploads"):
            return "CreateMultipartUpload"
        if self.method == "PUT":
            return "UploadPart" if "partNumber=" in self.url else "PutObject"
        return f"{self.method} {self.url}"


def _sent(caplog: pytest.LogCaptureFixture) -> list[Sent]:
    requests = []
    for record in caplog.records:
        if record.name == "botocore.endpoint" and record.msg == "Sending http request: %s":
            request: Any = record.args[0] if isinstance(record.args, tuple) else None
            headers = {
                str(k).lower(): v.decode() if isinstance(v, bytes) else str(v) for k, v in request.headers.items()
            }
            requests.append(Sent(request.method, request.url, headers))
    return requests


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.mark.parametrize(
    "encryption",
    [ServerSideEncryption(type="AES256"), ServerSideEncryption(type="aws:kms", kms_key_id=KMS_KEY)],
    ids=["AES256", "aws:kms"],
)
def test_every_object_ferry_writes_asks_s3_for_the_specs_encryption(
    encryption: ServerSideEncryption, steps: Steps, databases: Databases, stack: StackInfo, bucket: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    create_shop(databases.source, customers=50, orders=500)
    encrypted = dataclasses.replace(
        steps, snapshot_spec=steps.snapshot_spec.model_copy(update={"server_side_encryption": encryption})
    )
    caplog.set_level(logging.DEBUG, logger="botocore.endpoint")

    encrypted.precheck()
    artifact = encrypted.snapshot()

    asked = {SSE: encryption.type.value} | ({SSE_KEY: KMS_KEY} if encryption.kms_key_id else {})
    writes = [sent for sent in _sent(caplog) if sent.operation in ("PutObject", "CreateMultipartUpload")]
    assert sorted(sent.operation for sent in writes) == ["CreateMultipartUpload", "PutObject"]
    for sent in writes:
        assert {name: sent.headers.get(name) for name in (SSE, SSE_KEY) if name in sent.headers} == asked, sent
    parts = [sent for sent in _sent(caplog) if sent.operation == "UploadPart"]
    assert parts, "the snapshot went up in parts"
    assert all(SSE not in sent.headers for sent in parts), "a part inherits its upload's encryption"
    assert stack.s3_client().head_object(Bucket=bucket, Key=artifact.key)["ContentLength"] == artifact.size_bytes


def test_precheck_refuses_a_plain_http_endpoint_not_explicitly_allowed_and_sends_it_nothing(
    steps: Steps, stack: StackInfo, caplog: pytest.LogCaptureFixture
) -> None:
    insecure = dataclasses.replace(
        steps, snapshot_spec=steps.snapshot_spec.model_copy(update={"allow_insecure_endpoint": False})
    )
    caplog.set_level(logging.DEBUG, logger="botocore.endpoint")

    with pytest.raises(PrecheckFailed) as raised:
        insecure.precheck()

    assert str(raised.value).startswith(
        f"precheck found 1 problem, and changed nothing: (1) spec.snapshot.endpoint {stack.s3_endpoint} is plain "
        "http: the snapshot (the whole database) and the S3 credentials would cross the network unencrypted. Use an "
        "https:// endpoint, or, for a network path you trust, set spec.snapshot.allowInsecureEndpoint: true"
    )
    assert _sent(caplog) == [], "not one request, so the credentials never crossed the network"


def test_a_migration_without_encryption_asks_for_none_after_one_with_it_in_the_same_worker(
    steps: Steps, databases: Databases, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's S3 clients come from one shared session: what one Migration's client asks must stay its own."""
    create_shop(databases.source, customers=50, orders=500)
    encrypted = dataclasses.replace(
        steps,
        snapshot_spec=steps.snapshot_spec.model_copy(
            update={"server_side_encryption": ServerSideEncryption(type="aws:kms", kms_key_id=KMS_KEY)}
        ),
    )
    encrypted.snapshot()
    caplog.set_level(logging.DEBUG, logger="botocore.endpoint")

    steps.snapshot()

    writes = [sent for sent in _sent(caplog) if sent.operation in ("PutObject", "CreateMultipartUpload")]
    assert "CreateMultipartUpload" in [sent.operation for sent in writes]
    assert all(SSE not in sent.headers and SSE_KEY not in sent.headers for sent in writes), writes
