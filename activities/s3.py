"""The snapshot store: an S3 client per Migration, its permanent failures named, and streamed multipart uploads.

A Migration names its bucket, endpoint and region in spec.snapshot and its credentials
in a Secret, so the client depends on the Migration. The process keeps the clients it
made, one for each endpoint, region, credentials, encryption and timeouts (at most
CLIENTS, the least recently used going first), and makes them from one boto3 session, one
at a time (a session is not thread-safe; a client is). A session loads the S3 model and
endpoint rules, about 0.1 s of CPU, and a client its endpoint rules and event handlers,
about 0.05 s more; both used to be paid by every activity while holding the interpreter's
lock, which fifty Migrations prechecking at once felt. Credentials changed in the Secret
make another key, hence a new client: the next attempt uses them.

S3 answers that retrying cannot fix (no such bucket, credentials refused, access
denied) become BucketMissing or BadCredentials with what to do; everything else (the
server unreachable, a 5xx, a reset connection) stays a plain exception, which Temporal
retries.

Every request has bounded waits (DataActivitySettings: connect and read timeouts, a few
attempts): an endpoint that accepts connections and never answers fails the request
with S3NotAnswering, naming the endpoint and the timeout, instead of blocking the
activity while its heartbeats go on and the source stays frozen.

spec.snapshot.serverSideEncryption is asked for on every object ferry writes: the client
adds it to each PutObject and CreateMultipartUpload it sends (`client`), so no upload
path can leave it out.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError

from activities.parts import PartPlan
from activities.secrets import S3Credentials
from activities.settings import DataActivitySettings
from ferry.api.errors import BadCredentials, BucketMissing, InvalidSpec
from ferry.api.migration import EncryptionType, ServerSideEncryption, SnapshotSpec
from ferry.api.saga import MigrationRef, snapshot_key, stream_prefix

log = logging.getLogger("ferry.s3")

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

BAD_CREDENTIALS = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "InvalidSecurity",
        "XAdminUserNotFound",  # versitygw's answer to an unknown access key
    }
)
NOT_ACCESSIBLE = frozenset({"AccessDenied", "AllAccessDisabled"})
REFUSED = frozenset({"AccessDenied", "Forbidden", "403"})
"""Answers to one request these credentials may not make (the bucket's or the user's policy)."""
WRITES = ("PutObject", "CreateMultipartUpload")
"""The requests that create an object: they carry the encryption; an uploaded part inherits its upload's."""


class S3NotAnswering(Exception):
    """The S3 endpoint took a connection but did not answer in time; Temporal retries the step."""


CLIENTS = 32
"""S3 clients a process keeps (one per endpoint, region, credentials, encryption and timeouts): about 0.3 MiB each,
so at most about 11 MiB."""
POOL_CONNECTIONS = 64
"""Connections a client keeps open for reuse. Every Migration of a worker that writes to the same S3 with the same
credentials shares one client: ten snapshots uploading four parts each, with their restores reading, stay within it.
Past it, a request still gets a connection of its own, which is closed after it (and urllib3 logs that)."""


def client(spec: SnapshotSpec, credentials: S3Credentials, settings: DataActivitySettings) -> S3Client:
    """A client for the Migration's S3; path-style addressing for a custom endpoint, as most non-AWS servers want.

    The same arguments give the same client, made once (see the module's docstring)."""
    sse = spec.server_side_encryption
    asked = encryption(sse) if sse is not None else None
    key = (
        spec.endpoint,
        spec.region,
        credentials.access_key_id,
        credentials.secret_access_key,
        tuple(sorted(asked.items())) if asked is not None else None,
        settings.s3_attempts,
        settings.s3_connect_timeout,
        settings.s3_read_timeout,
    )
    return _CLIENTS.get(key, lambda session: _new_client(session, spec, credentials, settings, asked))


def _new_client(
    session: boto3.session.Session,
    spec: SnapshotSpec,
    credentials: S3Credentials,
    settings: DataActivitySettings,
    asked: dict[str, str] | None,
) -> S3Client:
    """`asked`: the encryption parameters each write carries (encryption()), or None."""
    style: Literal["path", "auto"] = "path" if spec.endpoint else "auto"
    config = Config(
        s3={"addressing_style": style},
        retries={"mode": "standard", "total_max_attempts": settings.s3_attempts},
        connect_timeout=settings.s3_connect_timeout,
        read_timeout=settings.s3_read_timeout,
        max_pool_connections=POOL_CONNECTIONS,
    )
    s3: S3Client = session.client(
        "s3",
        endpoint_url=spec.endpoint,
        region_name=spec.region,
        aws_access_key_id=credentials.access_key_id,
        aws_secret_access_key=credentials.secret_access_key,
        config=config,
    )
    if asked is not None:
        # A client's events are its own copy of the session's: this reaches no other client.
        for operation in WRITES:
            s3.meta.events.register(f"before-parameter-build.s3.{operation}", _encrypting(asked))
    return s3


class _Clients:
    """The process's boto3 session and the S3 clients made from it, by key; made on first use, under one lock.

    A client dropped from the cache is not closed: an activity may still be using it, and it goes with its last user.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._session: boto3.session.Session | None = None
        self._clients: collections.OrderedDict[Hashable, S3Client] = collections.OrderedDict()

    def get(self, key: Hashable, make: Callable[[boto3.session.Session], S3Client]) -> S3Client:
        with self._lock:
            found = self._clients.get(key)
            if found is not None:
                self._clients.move_to_end(key)
                return found
            if self._session is None:
                self._session = boto3.session.Session()
            made = self._clients[key] = make(self._session)
            while len(self._clients) > self._limit:
                self._clients.popitem(last=False)
            return made


_CLIENTS = _Clients(CLIENTS)


def encryption(sse: ServerSideEncryption) -> dict[str, str]:
    """The parameters of a write that ask S3 for `sse`."""
    asked = {"ServerSideEncryption": sse.type.value}
    if sse.type is EncryptionType.AWS_KMS and sse.kms_key_id:
        asked["SSEKMSKeyId"] = sse.kms_key_id
    return asked


def _encrypting(asked: dict[str, str]) -> Callable[..., None]:
    def add(params: dict[str, Any], **_: Any) -> None:
        params.update(asked)

    return add


def error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


@contextlib.contextmanager
def permanent_failures(s3: S3Client, bucket: str, credentials: S3Credentials) -> Iterator[None]:
    """Turns S3's answers that retrying cannot fix into BucketMissing or BadCredentials; silence into S3NotAnswering."""
    try:
        yield
    except (ConnectTimeoutError, ReadTimeoutError) as error:
        connecting = isinstance(error, ConnectTimeoutError)
        # botocore's Config sets its options as attributes at run time; its type stubs do not declare them.
        config = s3.meta.config
        timeout = getattr(config, "connect_timeout" if connecting else "read_timeout", None)
        waited = f"{timeout:g}s" if isinstance(timeout, int | float) else "its timeout"
        attempts = (getattr(config, "retries", None) or {}).get("total_max_attempts", 1)
        what = "accept a connection" if connecting else "answer"
        raise S3NotAnswering(
            f"the S3 endpoint {s3.meta.endpoint_url} did not {what} within {waited}, in {attempts} "
            f"attempt{'s' if attempts != 1 else ''}. "
            "Check that spec.snapshot.endpoint names a working S3 server and that the worker reaches it; "
            "the step is retried."
        ) from None
    except ClientError as error:
        code = error_code(error)
        if code == "NoSuchBucket":
            raise BucketMissing(
                f"spec.snapshot.bucket: bucket {bucket!r} does not exist. Create it, or delete the Migration and "
                "create it again naming an existing bucket."
            ) from None
        if code in BAD_CREDENTIALS:
            raise BadCredentials(
                f"S3 refused the credentials in Secret {credentials.secret} ({code}). Put a valid accessKeyId and "
                "secretAccessKey into it; the next attempt reads them again."
            ) from None
        if code in NOT_ACCESSIBLE:
            raise BucketMissing(
                f"spec.snapshot.bucket: the credentials in Secret {credentials.secret} may not use bucket {bucket!r} "
                f"({code}). Allow them to list, read, write and delete objects in it."
            ) from None
        raise


def is_missing(error: ClientError) -> bool:
    return error_code(error) in {"NoSuchKey", "NoSuchUpload", "404", "NotFound"}


def require_own_snapshot(ref: MigrationRef, spec: SnapshotSpec, bucket: str, key: str, doing: str) -> None:
    """Refuses (InvalidSpec, before anything is written or deleted) an object that is not the Migration's snapshot.

    The key comes from the ref and the spec (`snapshot_key`), for every attempt alike; one
    given in an input (a result, the status the watcher read) is trusted only when it is
    that key. Another Migration's kept snapshot in the same bucket may be the only copy of
    its database.
    """
    own = snapshot_key(ref, spec)
    if bucket != spec.bucket or key != own:
        raise InvalidSpec(
            f"refusing to {doing} s3://{bucket}/{key}: Migration {ref} keeps its snapshot at s3://{spec.bucket}/{own} "
            "(spec.snapshot), and only there; ferry changed nothing. The input or status that named the other object "
            "was not written by ferry: check who changed it."
        )


def abort_incomplete_uploads(s3: S3Client, bucket: str, key: str, *, under: bool = False) -> int:
    """Aborts every unfinished multipart upload of exactly `key` or, with `under`, of every key that starts with
    it, e.g. left by a worker that died; returns how many. Each key listed is checked here too: a store (or a proxy)
    that ignored the prefix would otherwise have every upload in the bucket aborted."""
    aborted = 0
    for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=key):
        for upload in page.get("Uploads", []):
            found = str(upload.get("Key", ""))
            if found != key and not (under and found.startswith(key)):
                continue
            try:
                s3.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
            except ClientError as error:
                if not is_missing(error):
                    raise
            aborted += 1
    return aborted


UNVERSIONED = frozenset({"NotImplemented", "MethodNotAllowed", "AccessDenied", "NoSuchBucket"})
"""Answers to ListObjectVersions that leave nothing more to delete: a store without versions, or a listing this
credential may not make (then a versioned bucket keeps the older versions; the warning says so)."""


def delete_every_version(s3: S3Client, bucket: str, key: str) -> int:
    """Deletes the object at `key` and, in a bucket with versioning, every version of it and every delete marker:
    a plain delete there only hides the object under a marker, and the database's rows stay in the bucket. Returns
    how many versions and markers it deleted besides. Only versions of exactly `key` are touched, whatever the store
    lists (the version written before versioning was turned on, "null", too). Idempotent."""
    s3.delete_object(Bucket=bucket, Key=key)
    deleted, kept = 0, 0
    try:
        for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=key):
            for found in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                if found.get("Key") != key or not found.get("VersionId"):
                    continue
                try:
                    s3.delete_object(Bucket=bucket, Key=key, VersionId=found["VersionId"])
                except ClientError as error:
                    if error_code(error) in REFUSED:
                        kept += 1
                        continue
                    if not is_missing(error):
                        raise
                deleted += 1
    except ClientError as error:
        if error_code(error) not in UNVERSIONED:
            raise
        if error_code(error) == "AccessDenied":
            log.warning(
                "s3://%s/%s is deleted, but its older versions, if the bucket keeps versions, may not be: the "
                "credentials may not list them (s3:ListBucketVersions). Delete them by hand.",
                bucket,
                key,
            )
    if kept:
        log.warning(
            "s3://%s/%s is deleted, but %d older versions of it are left: the credentials may not delete versions "
            "(s3:DeleteObjectVersion). Delete them by hand.",
            bucket,
            key,
            kept,
        )
    return deleted


def remove_streams(s3: S3Client, bucket: str, key: str, *, keep_objects: bool = False) -> int:
    """Aborts the unfinished uploads of the parallel streams of the snapshot at `key` and, unless `keep_objects`,
    deletes their objects (see ferry.api.saga.stream_key); returns how many of both. Idempotent."""
    removed = abort_incomplete_uploads(s3, bucket, stream_prefix(key), under=True)
    if keep_objects:
        return removed
    for found in stream_objects(s3, bucket, key):
        delete_every_version(s3, bucket, found)
        removed += 1
    return removed


def stream_objects(s3: S3Client, bucket: str, key: str) -> list[str]:
    """The keys of the objects of the parallel streams of the snapshot at `key` (see ferry.api.saga.stream_key)."""
    prefix = stream_prefix(key)
    return [
        str(found["Key"])
        for listing in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for found in listing.get("Contents", [])
        # Not a store that ignored the prefix: another snapshot's object, or anyone's.
        if str(found["Key"]).startswith(prefix)
    ]


CONDITIONAL_TRIES = 3
"""Completions of one upload refused because its key changed since the check, before the upload gives up."""
NOT_MET = frozenset({"PreconditionFailed", "412"})
"""S3's answer to a conditional write whose condition no longer holds."""
CHANGED = NOT_MET | {"ConditionalRequestConflict", "409"}
"""NOT_MET, or 409: another write to the key was under way; either way the key is looked at again."""
CONDITIONS_REFUSED = frozenset({"NotImplemented", "501"})
"""A store's answer to a conditional header it does not implement (some S3-compatible stores): the upload completes
without one, as it did before ferry used them."""


@dataclasses.dataclass(frozen=True)
class Precondition:
    """What was at a key when it was last looked at: the object's ETag, or nothing (`etag` None)."""

    etag: str | None

    @property
    def absent(self) -> bool:
        return self.etag is None

    def headers(self) -> dict[str, Any]:
        """The conditional write's parameters: If-Match the ETag seen, or If-None-Match * where there was none."""
        return {"IfNoneMatch": "*"} if self.etag is None else {"IfMatch": self.etag}


class MultipartUpload:
    """One multipart upload fed part by part as its PartPlan says; complete() or abort() ends it. The object gets
    `metadata` as its user metadata (x-amz-meta-<name>)."""

    def __init__(
        self, s3: S3Client, bucket: str, key: str, plan: PartPlan, metadata: dict[str, str] | None = None
    ) -> None:
        self._s3, self._bucket, self._key, self._plan = s3, bucket, key, plan
        created = s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata=metadata or {})
        self._upload_id = created["UploadId"]
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=plan.concurrency, thread_name_prefix="upload")
        self._in_flight: set[concurrent.futures.Future[dict[str, Any]]] = set()
        self._parts: list[CompletedPartTypeDef] = []
        self.uploaded = 0
        """Bytes S3 has acknowledged."""
        self.largest_part = 0
        """The largest part sent so far, in bytes."""

    @property
    def parts(self) -> int:
        """Parts sent so far."""
        return len(self._parts) + len(self._in_flight)

    def next_part_size(self) -> int:
        """How many bytes the next part should hold (past the last part S3 allows: 1, to see if the data ended)."""
        number = self.parts + 1
        return self._plan.part_size(number) if number <= self._plan.max_parts else 1

    def add(self, data: bytes) -> None:
        """Starts uploading the next part once fewer than the plan's parts are in flight. Raises an upload's error.

        So while the next part is read, at most `plan.in_flight(size)` parts are uploading.
        """
        number = self.parts + 1
        if number > self._plan.max_parts:
            raise RuntimeError(
                f"the snapshot outgrew the {self._plan.max_parts} parts S3 allows in one upload "
                f"({self.uploaded} bytes stored, the last parts of {self.largest_part} bytes): it is larger than "
                "one S3 object may be. Nothing was restored; migrate this database in mode Online."
            )
        while len(self._in_flight) >= self._plan.in_flight(len(data)):
            self._collect(concurrent.futures.FIRST_COMPLETED)
        self.largest_part = max(self.largest_part, len(data))
        self._in_flight.add(self._pool.submit(self._upload_part, number, data))

    def complete(self, check: Callable[[], Precondition | None] | None = None) -> None:
        """Waits for the parts in flight, then calls `check` (which may refuse, raising: the caller aborts), then
        completes the upload: the object appears at the key, replacing what was there.

        `check` may return a Precondition, what it saw at the key: the upload then completes only if that is still
        there (a conditional write), so nothing written between the check and the completion is replaced. When
        the store says it changed meanwhile, the check runs again (and may refuse now), up to CONDITIONAL_TRIES
        times. A store that ignores the condition completes as it would without one; one that says it does not take
        it (NotImplemented) completes without it, after the check has looked again."""
        while self._in_flight:
            self._collect(concurrent.futures.ALL_COMPLETED)
        self._pool.shutdown()
        parts = sorted(self._parts, key=lambda part: int(part["PartNumber"]))
        request: dict[str, Any] = {
            "Bucket": self._bucket, "Key": self._key, "UploadId": self._upload_id, "MultipartUpload": {"Parts": parts},
        }  # fmt: skip
        for tries in range(1, CONDITIONAL_TRIES + 1):
            precondition = check() if check is not None else None
            try:
                self._s3.complete_multipart_upload(**request, **(precondition.headers() if precondition else {}))
                return
            except ClientError as error:
                code = error_code(error)
                if precondition is None or (code not in CHANGED and code not in CONDITIONS_REFUSED):
                    raise
                if code in CONDITIONS_REFUSED:
                    # A store without conditional writes that says so: a look again, then as ferry did before them.
                    log.warning(
                        "s3://%s/%s: the store does not take conditional writes (%s): completing the upload without "
                        "one, after looking at the key again",
                        self._bucket, self._key, code,
                    )  # fmt: skip
                    self._complete_unconditionally(check, request)
                    return
                if precondition.absent and code in NOT_MET and tries > 1:
                    # Nothing there at two looks and refused twice: a store that counts a delete marker as an
                    # object (versitygw does). If a third look still finds nothing, complete as before the condition.
                    again = check() if check is not None else None
                    if again is not None and not again.absent:
                        continue  # something is there now: the next try's look decides
                    log.warning(
                        "s3://%s/%s: the store refuses If-None-Match although no object is there (a delete marker?); "
                        "completing the upload without the condition",
                        self._bucket, self._key,
                    )  # fmt: skip
                    self._s3.complete_multipart_upload(**request)
                    return
                log.info("s3://%s/%s changed while its upload completed; looking again", self._bucket, self._key)
        raise RuntimeError(
            f"s3://{self._bucket}/{self._key} changed {CONDITIONAL_TRIES} times between this upload's look at it and "
            "its completion: something else is writing that key. The upload is aborted and the step tries again; "
            "if this repeats, find what writes the snapshot's key (another Migration or tool sharing the bucket)."
        )

    def _complete_unconditionally(
        self, check: Callable[[], Precondition | None] | None, request: dict[str, Any]
    ) -> None:
        if check is not None:
            check()  # may refuse, as before every completion
        self._s3.complete_multipart_upload(**request)

    def abort(self) -> None:
        """Stops the upload and has S3 drop its parts; safe to call after a failure of any kind."""
        for future in self._in_flight:
            future.cancel()
        self._pool.shutdown(wait=True)
        try:
            self._s3.abort_multipart_upload(Bucket=self._bucket, Key=self._key, UploadId=self._upload_id)
        except ClientError as error:
            if not is_missing(error):
                raise

    def _collect(self, when: str) -> None:
        done, self._in_flight = concurrent.futures.wait(self._in_flight, return_when=when)
        for future in done:
            part = future.result()
            self._parts.append({"PartNumber": part["PartNumber"], "ETag": part["ETag"]})
            self.uploaded += int(part["Size"])

    def _upload_part(self, number: int, data: bytes) -> dict[str, Any]:
        response = self._s3.upload_part(
            Bucket=self._bucket, Key=self._key, UploadId=self._upload_id, PartNumber=number, Body=data
        )
        return {"PartNumber": number, "ETag": response["ETag"], "Size": len(data)}
