"""Which attempt of the snapshot step wrote each of its objects, so that a late attempt never deletes or overwrites
a later one's.

Every attempt writes the same keys (ferry.api.saga.snapshot_key, stream_key), and each
begins by removing what an earlier attempt left there. An attempt whose worker stood still
(SIGSTOP, a frozen VM) past its heartbeat timeout is written off; the saga's next attempt
stores the snapshot and the run goes on, keeping that object set as its recovery point
(status.snapshot, with each object's SHA-256). Were the written-off attempt to go on and do
the same, it would delete the later one's streams (the largest tables would restore empty)
and overwrite its main object (its SHA-256 no longer that of the status).

So every object carries the attempt that wrote it (`Attempt.as_json`, in its user metadata
`x-amz-meta-ferry-attempt`, given at CreateMultipartUpload), and an attempt reads it
(`refuse_if_overtaken`) before it deletes anything, on the main object and every stream
found, and again on the main object and its own key just before it completes each upload.
An object written by a later attempt (`Attempt.before`) stops it with Overtaken, before it
changed anything, or having aborted only its own upload. An object of an earlier attempt,
or one with no readable attempt (an older ferry's), is garbage, and removed as before.

The last read and the completion are two requests, and a worker may stand still between
them. So the completion is a conditional write (`before_completing` returns what it saw
at the key: If-Match its ETag, or If-None-Match * where nothing was there): an object
written there meanwhile makes the store refuse it, and the check runs again, now refusing
with Overtaken. A store without conditional writes either ignores them, and the gap stays
open there, or says so (NotImplemented), and the upload completes without one after the
check has looked again (activities/s3.py, `MultipartUpload.complete`). What is left open
everywhere: the main object is looked at before a stream's upload completes, but the
condition covers only the stream's own key. And an unfinished upload
carries no metadata to read (ListMultipartUploads does not return it), so a late attempt
may abort a later attempt's upload still under way: that attempt then fails and the saga
tries again, with nothing of it stored yet to lose.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from activities import s3 as snapshot_store
from activities.postgres.attempts import Attempt
from ferry.api.errors import Overtaken

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import HeadObjectOutputTypeDef

METADATA = "ferry-attempt"
"""The user metadata (x-amz-meta-ferry-attempt) naming the attempt that wrote an object; S3 gives names back in lower
case."""


def metadata(attempt: Attempt) -> dict[str, str]:
    """The user metadata of an object `attempt` writes: its attempt, as compact JSON (ASCII, no spaces, which an HTTP
    header keeps as it is)."""
    return {METADATA: json.dumps(attempt.as_json(), separators=(",", ":"), sort_keys=True)}


def written_by(s3: S3Client, bucket: str, key: str) -> Attempt | None:
    """The attempt that wrote the object at `key`; None when there is none (or a delete marker hides it), or it names
    no attempt ferry can read (an older ferry's)."""
    return _attempt_of(_head(s3, bucket, key))


def _head(s3: S3Client, bucket: str, key: str) -> HeadObjectOutputTypeDef | None:
    """The object at `key` as HeadObject describes it; None when there is none (or a delete marker hides it)."""
    try:
        return s3.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if snapshot_store.is_missing(error):
            return None
        raise


def _attempt_of(head: HeadObjectOutputTypeDef | None) -> Attempt | None:
    if head is None:
        return None
    value = head.get("Metadata", {}).get(METADATA)
    if value is None:
        return None
    try:
        return Attempt.from_json(json.loads(value))
    except (KeyError, TypeError, ValueError):
        return None


def refuse_if_overtaken(s3: S3Client, bucket: str, keys: list[str], mine: Attempt, *, main: str, done: str) -> None:
    """Raises Overtaken when an object at one of `keys` was written by an attempt of the snapshot scheduled after
    `mine`. `main` is the snapshot's key; `done` says what this attempt did to the bucket so far."""
    for key in dict.fromkeys(keys):
        _refuse_if_later(_head(s3, bucket, key), bucket, key, mine, main=main, done=done)


def _refuse_if_later(
    head: HeadObjectOutputTypeDef | None, bucket: str, key: str, mine: Attempt, *, main: str, done: str
) -> None:
    theirs = _attempt_of(head)
    if theirs is not None and mine.before(theirs):
        raise Overtaken(
            f"refused to write the snapshot s3://{bucket}/{main}: s3://{bucket}/{key} was written by a later attempt "
            f"of the snapshot ({theirs.describe()}) than this one ({mine.describe()}). This is a late attempt the "
            "saga has moved past (its worker stood still past its heartbeat timeout, then went on), and the later "
            f"one's objects are the snapshot the saga keeps. It {done}, and left every object of the later attempt "
            "as it is. Nothing to do."
        )


def before_completing(
    s3: S3Client, bucket: str, main: str, key: str, mine: Attempt
) -> Callable[[], snapshot_store.Precondition]:
    """The check `mine` runs once every part of its object at `key` is stored, just before the upload completes and
    the object replaces what is there: refused when the main object, or what is at `key`, is a later attempt's.
    Otherwise it returns what it saw at `key`, and the upload completes only if that is still there."""

    done = f"aborted its own upload of s3://{bucket}/{key}"

    def check() -> snapshot_store.Precondition:
        if key != main:
            refuse_if_overtaken(s3, bucket, [main], mine, main=main, done=done)
        head = _head(s3, bucket, key)
        _refuse_if_later(head, bucket, key, mine, main=main, done=done)
        return snapshot_store.Precondition(etag=str(head["ETag"]) if head is not None else None)

    return check
