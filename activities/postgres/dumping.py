"""Streaming pg_dump into S3: the snapshot never lands on the worker's disk.

pg_dump writes the custom format (what pg_restore reads; compressed if the worker is told to) into a pipe.
The activity reads it one part at a time, hashing and counting as it goes, and
uploads each part while pg_dump writes the next, a few parts in flight. In mode
Snapshot each part also goes to a pg_restore into the target as it is uploaded (see
restoring.Restore), which commits only after the upload completed: the data crosses
once, and dump, upload and restore run at the same time. The parts'
sizes follow the source's size and memory stays bounded (activities/parts.py). Any
failure or cancellation kills pg_dump and aborts the multipart upload, so S3 keeps no
half-written parts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from temporalio import activity

from activities import parts
from activities.heartbeats import Heartbeats
from activities.postgres import tls
from activities.postgres.connection import Connection
from activities.postgres.restoring import Restore
from activities.postgres.tools import Tool, conninfo, find_bindir
from activities.progress import Counts
from activities.s3 import MultipartUpload, Precondition
from activities.secrets import DatabaseConnection
from activities.settings import DataActivitySettings
from ferry.api.errors import BadCredentials, InvalidSpec

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def dump_to_s3(
    db: DatabaseConnection,
    settings: DataActivitySettings,
    s3: S3Client,
    bucket: str,
    key: str,
    heartbeats: Heartbeats,
    estimate: int,
    progress: Counts | None = None,
    restore: Restore | None = None,
    options: Sequence[str] = (),
    metadata: dict[str, str] | None = None,
    check: Callable[[], Precondition | None] | None = None,
) -> tuple[str, int]:
    """Uploads a pg_dump of `db` (`estimate` bytes in the database) to s3://bucket/key; returns its SHA-256 and size.

    `progress` is given the bytes dumped so far after each part. `restore` is fed each
    part as it is uploaded; the caller commits it once the object is known complete.
    `options` are pg_dump's besides the format and the compression (see streams).
    `metadata` is the object's user metadata; `check` runs once every part is stored, just
    before the upload completes, and may refuse (raise), which aborts the upload, or
    return what it saw at the key for the completion's condition (see snapshot_attempts).
    """
    pg_dump = find_bindir(settings.postgres_bindir) / "pg_dump"
    argv = [
        str(pg_dump),
        f"--dbname={conninfo(db, settings)}",
        "--format=custom",
        f"--compress={settings.dump_compression}",
        "--no-password",
        *options,
    ]
    digest, size = hashlib.sha256(), 0
    with Tool(argv, db, settings, reads=False, writes=True) as dump:
        heartbeats.on_cancel(dump.kill)
        sizes = parts.plan(
            estimate,
            smallest=settings.part_size,
            concurrency=settings.upload_concurrency,
            memory=settings.upload_memory,
        )
        activity.logger.info(
            "snapshot of %s (%d bytes in the database) in parts of %d MiB at first, up to %d in flight",
            db.describe(),
            estimate,
            sizes.first_part // parts.MIB,
            sizes.in_flight(sizes.first_part),
        )
        upload = MultipartUpload(s3, bucket, key, sizes, metadata)
        try:
            while part := dump.stdout.read(upload.next_part_size()):
                digest.update(part)
                size += len(part)
                if size > settings.max_object_size:
                    raise _too_large(db, settings, size)
                upload.add(part)
                if restore is not None:
                    restore.feed(part)
                if progress is not None:
                    progress.update(bytes_done=size)
                heartbeats.progress(dumped_bytes=size, uploaded_bytes=upload.uploaded)
                heartbeats.raise_if_cancelled("uploading the snapshot")
            code = dump.wait()
            heartbeats.raise_if_cancelled("dumping the source")
            if code != 0:
                failure = dump.failure(code)
                refused = tls.refusal(db, failure)
                if refused is not None:
                    raise refused
                if "permission denied" in failure:
                    raise BadCredentials(
                        f"the user in Secret {db.secret} may not read everything in {db.describe()}: {failure}. "
                        "Snapshot with the database owner or a superuser."
                    )
                raise RuntimeError(f"could not dump {db.describe()}: {failure}")
            upload.complete(check)
        except BaseException:
            _abort(upload)
            raise
    return digest.hexdigest(), size


def _too_large(db: DatabaseConnection, settings: DataActivitySettings, size: int) -> InvalidSpec:
    """The dump outgrew the largest object the store takes: stopped at once rather than refused at the end."""
    gib = 1024 * parts.MIB
    return InvalidSpec(
        f"the dump of {db.describe()} outgrew the largest object the snapshot store takes "
        f"({settings.max_object_size / gib:,.1f} GiB, the worker's --snapshot-max-object-size-gib) after "
        f"{size / gib:,.1f} GiB: a dump can be larger than the database (values compressed in its storage are dumped "
        f"whole){' and this worker does not compress dumps' if settings.dump_compression == 0 else ''}. Nothing was "
        "restored and the upload was aborted. Migrate it in mode Online, or give the worker "
        "--snapshot-compression 1 (or raise its limit if the store takes larger objects), then create the Migration "
        "again."
    )


def database_size(conn: Connection) -> int:
    """The database's size on disk: what the snapshot's parts are planned for."""
    row = conn.execute("select pg_database_size(current_database())").fetchone()
    return int(row[0]) if row else 0


def _abort(upload: MultipartUpload) -> None:
    try:
        upload.abort()
    except Exception as error:  # noqa: BLE001 - the original failure matters more; the next attempt cleans up
        activity.logger.warning("could not abort the snapshot's multipart upload (the next attempt will): %s", error)
