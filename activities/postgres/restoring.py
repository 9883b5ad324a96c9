"""Restoring a snapshot from S3 into the target: streamed, checked against its SHA-256, all or nothing.

The object is read from S3 and written into pg_restore's stdin as it arrives, hashed
on the way; nothing lands on the worker's disk. pg_restore runs in one transaction
(--single-transaction), so the target gets the whole snapshot or nothing, and the
last piece of the object is held back until the hash of the whole object is known:
when it differs from the SHA-256 recorded at snapshot time, pg_restore is killed
before it can commit, the target keeps nothing of it, and the step fails with
SnapshotCorrupt.

A retry starts from a clean target. Before restoring, the target must be empty (no
schema but an empty public), or hold what an earlier attempt of the same Migration
restored, recognized by the database setting ferry.restored_by: then every
non-system schema is dropped and public is created again the way a new database has
it. A non-empty target without that marker holds someone's data, and the restore
refuses to touch it. undo_migrate (`remove`) empties the target the same way, and
removes the marker and verify's mark (ferry.verified_mark, see unwritten), so that
another Migration may restore into it; a target whose marker names nobody or another
Migration is left as it is.

Objects are restored without owners and privileges (--no-owner --no-privileges) and
belong to the target Secret's user: roles live outside the database, and the
target's server need not have the source's.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from botocore.response import StreamingBody
from psycopg import sql
from temporalio import activity

from activities.heartbeats import Heartbeats
from activities.postgres import database_settings, tls, unwritten
from activities.postgres.connection import Connection
from activities.postgres.database_settings import RESTORED_BY
from activities.postgres.tools import Tool, conninfo, find_bindir
from activities.progress_status import ProgressWriter
from activities.s3 import error_code
from activities.secrets import DatabaseConnection
from activities.settings import MIB, DataActivitySettings
from ferry.api.errors import InvalidSpec, SnapshotCorrupt
from ferry.api.saga import SnapshotResult

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

CHUNK = MIB

USER_SCHEMAS = "n.nspname !~ '^pg_' and n.nspname <> 'information_schema'"
CONTENTS = f"""
select n.nspname from pg_namespace n
where {USER_SCHEMAS} and (
    n.nspname <> 'public'
    or exists (select from pg_class where relnamespace = n.oid)
    or exists (select from pg_proc where pronamespace = n.oid)
    or exists (select from pg_type where typnamespace = n.oid)
)
union all select 'large objects' where exists (select from pg_largeobject_metadata)
union all select 'extension ' || extname from pg_extension where extname <> 'plpgsql'
"""
"""What makes a database not empty: schemas besides public, anything in public, large objects, extensions."""


def open_snapshot(s3: S3Client, artifact: SnapshotResult) -> StreamingBody:
    """The snapshot object's body, once its size is the recorded one.

    Raises:
        SnapshotCorrupt: the object is gone, or its size is not the recorded one.
    """
    try:
        response = s3.get_object(Bucket=artifact.bucket, Key=artifact.key)
    except ClientError as error:
        if error_code(error) != "NoSuchKey":
            raise
        raise SnapshotCorrupt(
            f"the snapshot {artifact.location} is gone. Roll back and migrate again to take a new snapshot; "
            "check that no lifecycle rule deletes objects under spec.snapshot.prefix too early."
        ) from None
    if response["ContentLength"] != artifact.size_bytes:
        response["Body"].close()
        raise SnapshotCorrupt(
            f"the snapshot {artifact.location} is not the one written: it has {response['ContentLength']} "
            f"bytes, recorded were {artifact.size_bytes}. Nothing was restored. Roll back and migrate again "
            "to take a new snapshot, and find out what changed the object."
        )
    return response["Body"]


def prepare_target(conn: Connection, db: DatabaseConnection, owner: str) -> None:
    """Leaves the target empty and marked as `owner`'s, or refuses a target that holds someone else's data."""
    contents = [row[0] for row in conn.execute(CONTENTS)]
    marked_by = database_settings.read(conn).get(RESTORED_BY)
    if contents and marked_by != owner:
        raise InvalidSpec(
            f"the target {db.describe()} is not empty (it has {', '.join(contents[:5])}) and ferry did not restore "
            f"into it for Migration {owner}. ferry only restores into an empty database: point Secret {db.secret} "
            "at one, or empty this one."
        )
    with conn.transaction():
        if contents:
            _clean(conn)
        unwritten.forget(conn)  # a new restore is not verified yet
        if marked_by != owner:
            database_settings.change(conn, RESTORED_BY, owner)


def remove(conn: Connection, db: DatabaseConnection, owner: str) -> bool:
    """Empties the target of what `owner`'s restore put there and removes the marker; False when it holds none.

    One transaction: the target is either as migrate left it or empty and unmarked.
    """
    with conn.transaction():
        marked_by = database_settings.read(conn).get(RESTORED_BY)
        if marked_by != owner:
            whose = f"Migration {marked_by}" if marked_by else "no Migration"
            activity.logger.info("%s holds a restore of %s, not of %s: left as it is", db.describe(), whose, owner)
            return False
        _clean(conn)
        unwritten.forget(conn)
        database_settings.change(conn, RESTORED_BY, None)
    return True


def _clean(conn: Connection) -> None:
    """Drops what an earlier attempt restored, and creates public again as initdb makes it."""
    extensions = [row[0] for row in conn.execute("select extname from pg_extension where extname <> 'plpgsql'")]
    for extension in extensions:
        conn.execute(sql.SQL("drop extension if exists {} cascade").format(sql.Identifier(extension)))
    schemas = [row[0] for row in conn.execute(f"select n.nspname from pg_namespace n where {USER_SCHEMAS}")]
    for schema in schemas:
        conn.execute(sql.SQL("drop schema {} cascade").format(sql.Identifier(schema)))
    conn.execute("select lo_unlink(oid) from pg_largeobject_metadata")
    version = conn.execute("select current_setting('server_version_num')::int").fetchone()
    if version is not None and version[0] >= 150000:
        conn.execute("create schema public authorization pg_database_owner")
        conn.execute("grant usage on schema public to public")
    else:
        conn.execute("create schema public")
        conn.execute("grant all on schema public to public")
    conn.execute("comment on schema public is 'standard public schema'")


def restore(
    db: DatabaseConnection,
    settings: DataActivitySettings,
    body: Any,
    artifact: SnapshotResult,
    heartbeats: Heartbeats,
    progress: ProgressWriter | None = None,
) -> int:
    """Feeds the object's `body` (a botocore StreamingBody) into pg_restore; returns the bytes read.

    `progress` is given the bytes read so far, of the snapshot's size, after each chunk.

    Raises:
        SnapshotCorrupt: the object's SHA-256 is not the recorded one; nothing was committed.
    """
    argv = [
        str(find_bindir(settings.postgres_bindir) / "pg_restore"),
        f"--dbname={conninfo(db, settings)}",
        "--format=custom",
        "--single-transaction",
        "--no-owner",
        "--no-privileges",
        "--no-password",
    ]
    digest, read = hashlib.sha256(), 0
    with Tool(argv, db, settings, reads=True, writes=False) as restoring:
        heartbeats.on_cancel(restoring.kill)
        held, stopped = b"", False
        for chunk in body.iter_chunks(CHUNK):
            digest.update(chunk)
            read += len(chunk)
            if held and not stopped:
                stopped = not _feed(restoring, held)
            held = chunk
            if progress is not None:
                progress.update(bytes_done=read, bytes_total=artifact.size_bytes)
            heartbeats.progress(read_bytes=read, size_bytes=artifact.size_bytes)
            heartbeats.raise_if_cancelled("restoring the snapshot")
        if digest.hexdigest() != artifact.sha256 or read != artifact.size_bytes:
            restoring.kill()
            raise SnapshotCorrupt(
                f"the snapshot {artifact.location} is not the one written: its SHA-256 is {digest.hexdigest()} "
                f"({read} bytes), recorded was {artifact.sha256} ({artifact.size_bytes} bytes). Nothing of it was "
                "restored. Roll back and migrate again to take a new snapshot, and find out what changed the object."
            )
        if not stopped and _feed(restoring, held):
            restoring.stdin.close()
        code = restoring.wait()
        heartbeats.raise_if_cancelled("restoring the snapshot")
        if code != 0:
            failure = restoring.failure(code)
            refused = tls.refusal(db, failure)
            if refused is not None:
                raise refused
            raise RuntimeError(f"could not restore {artifact.location} into {db.describe()}: {failure}")
    return read


def count_tables(conn: Connection) -> int:
    row = conn.execute(
        f"select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace "
        f"where c.relkind in ('r', 'p') and {USER_SCHEMAS}"
    ).fetchone()
    return int(row[0]) if row else 0


def _feed(restoring: Tool, data: bytes) -> bool:
    """Writes to pg_restore; False when it has stopped reading (it exited: its exit code says why)."""
    try:
        restoring.stdin.write(data)
    except BrokenPipeError:
        return False
    return True
