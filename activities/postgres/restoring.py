"""Restoring a snapshot into the target: streamed, checked against its SHA-256, all or nothing.

pg_restore runs in one transaction (--single-transaction) and reads the snapshot on its
stdin (`Restore`), so the target gets the whole snapshot or nothing. It is fed from one
of two streams, hashed on the way; nothing lands on the worker's disk:

- in mode Snapshot, the snapshot step's own pg_dump stream, while the same bytes go to
  S3 (see dumping): the restore commits only once pg_dump has exited cleanly and the
  whole object is stored in S3 with the size written, so the SHA-256 the step records
  is the hash of exactly what was restored. migrate then finds the target restored
  (`Found.holds_restore`) and does not restore again;
- in migrate, when the snapshot step did not restore (a run started before ferry
  restored while dumping) or the target no longer holds its restore, the object read
  back from S3 (`restore`): the last piece is held back
  until the hash of the whole object is known, and when it differs from the SHA-256
  recorded at snapshot time, pg_restore is killed before it can commit, the target
  keeps nothing of it, and the step fails with SnapshotCorrupt.

A retry starts from a clean target. Before restoring, the target must be empty (no
schema but an empty public), or hold what an earlier attempt of the same Migration
restored, recognized by the database setting ferry.restored_by: then every
non-system schema is dropped and public is created again the way a new database has
it, and the publications and subscriptions pg_dump carries (they belong to no schema)
are dropped too. The restore keeps the source's publications in the target: a CDC
consumer of the new primary may need them. A non-empty target without that marker holds someone's data, and the restore
refuses to touch it. undo_migrate (`remove`) empties the target the same way, and
removes the marker and verify's mark (ferry.verified_mark, see unwritten), so that
another Migration may restore into it; a target whose marker names nobody or another
Migration is left as it is, and one verify marked is emptied only if it still is as the
mark says, compared under locks that keep every write out until the drop commits
(WritesOnTarget otherwise, and nothing is dropped: see unwritten.vouch). Nothing else
removes verify's mark: a target that carries it is refused (TargetVerified) by whatever
would empty it, truncate a table of it, mark it or commit a restore into it, since it
may be taking traffic (see unwritten); a failed restore's cleanup (`only_incomplete`)
is refused too.

Where restore_script.usable says so, pg_restore writes its SQL script instead, and psql
runs it with FREEZE added to each ordinary table's COPY, so the rows arrive frozen and
verify's first read of them writes nothing (see restore_script); the snapshot step and
migrate's restore from S3 alike.

Objects are restored without owners and privileges (--no-owner --no-privileges) and
belong to the target Secret's user: roles live outside the database, and the
target's server need not have the source's. Nor its tablespaces: every object lands in
the target database's default one (--no-tablespaces, see tablespaces).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from botocore.exceptions import ClientError
from botocore.response import StreamingBody
from psycopg import sql
from temporalio import activity

from activities.heartbeats import Heartbeats
from activities.postgres import (
    database_settings,
    replication,
    subscription,
    tablespaces,
    target_sessions,
    tls,
    tools,
    unwritten,
)
from activities.postgres.attempts import Attempt
from activities.postgres.connection import Connection, connect
from activities.postgres.database_settings import RESTORED_BY
from activities.postgres.restore_script import Copies, ScriptRefused
from activities.postgres.tools import Tool, conninfo, find_bindir
from activities.progress import Counts
from activities.s3 import error_code
from activities.secrets import DatabaseConnection
from activities.settings import MIB, DataActivitySettings
from ferry.api.errors import InvalidSpec, SnapshotCorrupt
from ferry.api.saga import SnapshotResult

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

CHUNK = MIB
PAUSE = 0.5
"""Seconds prepare_target pauses between two tries to take the locks it needs, when its caller gives no `retry`."""
KILLED = (-signal.SIGKILL, -signal.SIGPIPE)
"""How a tool ends when ferry kills it, or when the other end of its pipe was killed: never the first failure."""

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
union all select 'publication ' || pubname from pg_publication
union all select 'subscription ' || subname from pg_subscription
    where subdbid = (select oid from pg_database where datname = current_database())
"""
"""What makes a database not empty: schemas besides public, anything in public, large objects, extensions, and
publications and subscriptions, which belong to no schema (pg_dump carries them, subscriptions disabled)."""


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


@dataclasses.dataclass(frozen=True)
class Found:
    """What a target holds before a restore, as `find` reads it."""

    contents: list[str]
    """What makes it not empty (see CONTENTS); none in an empty database."""
    restored_by: str | None
    """The Migration its marker ferry.restored_by names, if any."""

    @property
    def restorer(self) -> str | None:
        """The Migration that restored into it, whether its restore completed or not."""
        return restorer(self.restored_by)

    def holds_restore(self, owner: str) -> bool:
        """Whether it holds a complete restore of `owner`'s: marked as its own (not as incomplete), and not empty."""
        return self.restored_by == owner and bool(self.contents)


INCOMPLETE = " (incomplete)"
"""What ferry.restored_by ends with while a restore in parallel streams, which commits piece by piece, is under way
(see streams): the target holds that Migration's data, but not all of it."""


def restorer(marker: str | None) -> str | None:
    """The Migration a ferry.restored_by value names, complete or not."""
    return None if marker is None else marker.removesuffix(INCOMPLETE)


def find(conn: Connection) -> Found:
    """What the target holds: its contents and its marker."""
    contents = [row[0] for row in conn.execute(CONTENTS)]
    return Found(contents=contents, restored_by=database_settings.read(conn).get(RESTORED_BY))


def prepare_target(
    conn: Connection,
    db: DatabaseConnection,
    owner: str,
    found: Found | None = None,
    *,
    complete: bool = True,
    retry: replication.Retry | None = None,
) -> None:
    """Leaves the target empty and marked as `owner`'s, or refuses a target that holds someone else's data.

    `found` is what the caller read of the target on `conn` (see `find`); without it, this reads it.
    Without `complete`, the marker says the restore is incomplete until `mark_complete`: for a
    restore that commits in several transactions (see streams).

    A target that holds `owner`'s earlier restore is emptied in a transaction that holds unwritten.LOCK and found no
    verify's mark, so it is ferry's alone: its other sessions are ended first (see target_sessions), and each
    statement waits at most replication.LOCK_WAIT for a lock; then the transaction is rolled back and tried again
    after `retry` (the activity's heartbeats it, and raises once it is cancelled; by default a pause), each try naming
    the sessions that hold locks there.
    """
    if found is None:
        found = find(conn)
    _refuse_others(found, db, owner)

    def work() -> None:
        unwritten.refuse_if_verified(conn, db, "empty the target for a new restore")
        # Again under refuse_if_verified's lock, which every prepare_target of this database takes: of two Migrations
        # that found it empty and unmarked at once, the second finds the first one's marker here.
        now = find(conn)
        _refuse_others(now, db, owner)
        if now.contents:
            target_sessions.end_others(conn)  # no mark, and none until this transaction ends: see target_sessions
            _clean(conn)
        marker = owner if complete else owner + INCOMPLETE
        if now.restored_by != marker:
            database_settings.change(conn, RESTORED_BY, marker)

    replication.briefly_locked(conn, work, target_sessions.naming_holders(conn, retry or _pause))


def _pause(why: str) -> None:
    """The `retry` of a caller that gives none: a pause, saying why."""
    activity.logger.info(
        "a lock on the target was not granted within %s (%s); trying again", replication.LOCK_WAIT, why
    )
    time.sleep(PAUSE)


def refusal(found: Found, db: DatabaseConnection, owner: str) -> str | None:
    """Why `owner` may not restore into a target that holds `found`, if it may not: someone's data, or another
    Migration's marker (its restore under way, uncommitted still, or left by a run that could not undo it)."""
    if found.contents and found.restorer != owner:
        return (
            f"the target {db.describe()} is not empty (it has {', '.join(found.contents[:5])}) and ferry did not "
            f"restore into it for Migration {owner}. ferry only restores into an empty database: point Secret "
            f"{db.secret} at one, or empty this one."
        )
    if found.restorer is not None and found.restorer != owner:
        return (
            f"the target {db.describe()} is marked as restored into by Migration {found.restorer} (the database "
            f"setting {RESTORED_BY}), not by Migration {owner}: that Migration is restoring into it, or left its "
            f"mark there. Point Secret {db.secret} at a database no other Migration uses; if none uses this one, "
            f"remove the mark (ALTER DATABASE ... RESET {RESTORED_BY}) and try again."
        )
    return None


def _refuse_others(found: Found, db: DatabaseConnection, owner: str) -> None:
    why = refusal(found, db, owner)
    if why is not None:
        raise InvalidSpec(why)


def mark_complete(conn: Connection, db: DatabaseConnection, owner: str) -> None:
    """Marks the target as holding `owner`'s whole restore, once its last part committed; refused on a verified one."""
    with conn.transaction():
        unwritten.refuse_if_verified(conn, db, "mark the restore complete")
        database_settings.change(conn, RESTORED_BY, owner)


def remove(
    conn: Connection,
    db: DatabaseConnection,
    owner: str,
    *,
    only_incomplete: bool = False,
    retry: replication.Retry | None = None,
    end_sessions: Callable[[Connection], int] | None = None,
    attempt: Attempt | None = None,
) -> bool:
    """Empties the target of what `owner`'s restore put there and removes the marker; False when it holds none.

    One transaction: the target is either as migrate left it or empty and unmarked. A target verify has marked may
    have taken traffic: it is emptied only if it is still as the mark says, compared once `end_sessions` (required
    then) has ended its other sessions, under locks that keep any write out until the drop has committed; otherwise
    WritesOnTarget, and nothing is dropped (see unwritten.vouch). Given `end_sessions` (an undo), a target without
    the mark has its other sessions ended before the drop (see target_sessions): ferry moved no traffic to it. With
    `retry` (an undo, which heartbeats), each statement waits at most replication.LOCK_WAIT for a lock (DROP SCHEMA
    waits behind any session using a table), then the transaction is rolled back and tried again after `retry` (see
    replication.briefly_locked), each try naming the sessions holding locks there; without it, as long as the
    session's lock_timeout says.
    With `only_incomplete` (a failed restore in streams cleaning up after itself), a restore
    marked complete is left as it is: it is another attempt's, which finished after this one
    was written off (its worker stopped past its heartbeat timeout, then went on), and it may
    be verified, and take traffic, by now. `attempt`, an undo's own: a late one is refused (see unwritten.vouch).
    """

    def work() -> bool:
        marker = database_settings.read(conn).get(RESTORED_BY)
        marked_by = restorer(marker)
        if marked_by != owner:
            whose = f"Migration {marked_by}" if marked_by else "no Migration"
            activity.logger.info("%s holds a restore of %s, not of %s: left as it is", db.describe(), whose, owner)
            return False
        if only_incomplete and marker == owner:
            activity.logger.warning(
                "%s holds a complete restore of %s, made by another attempt: left as it is", db.describe(), owner
            )
            return False
        if end_sessions is None:
            unwritten.refuse_if_verified(conn, db, "empty the target of a partial restore")
        elif unwritten.unmarked(conn):
            # Never verified, so ferry moved no traffic to it, and no mark can come before this transaction ends: the
            # target is ferry's alone, and no client's lock may hold the drop up (see target_sessions).
            target_sessions.end_others(conn)
        else:
            unwritten.vouch(conn, db, owner, end_sessions, attempt)
        _clean(conn)
        unwritten.forget(conn)
        database_settings.change(conn, RESTORED_BY, None)
        return True

    if retry is not None:
        return replication.briefly_locked(conn, work, target_sessions.naming_holders(conn, retry))
    with conn.transaction():
        return work()


def _clean(conn: Connection) -> None:
    """Drops what an earlier attempt restored, and creates public again as initdb makes it.

    Publications and subscriptions belong to no schema, so they are dropped one by one (a subscription detached from
    its slot first, which no transaction could drop otherwise, and which is the source's to keep: see subscription).
    """
    subscriptions = [
        row[0]
        for row in conn.execute(
            "select subname from pg_subscription where subdbid = (select oid from pg_database "
            "where datname = current_database())"
        )
    ]
    for name in subscriptions:
        subscription.drop(conn, name)
    for row in conn.execute("select pubname from pg_publication").fetchall():
        conn.execute(sql.SQL("drop publication if exists {}").format(sql.Identifier(row[0])))
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


class Restore:
    """One pg_restore into the target that commits only when told to: fed from the caller's thread, written by its own.

    pg_restore runs in one transaction (--single-transaction) and reads the snapshot on
    its stdin. `feed` hands it bytes; a thread writes them while the caller reads the
    next ones (from S3, or from pg_dump), so reading and restoring overlap. At most
    QUEUED bytes wait between the two: past that, `feed` waits, and pg_restore sets the
    pace. The thread always holds back the last piece it was given, so pg_restore cannot
    reach the end of the snapshot, hence cannot commit, until `commit` hands that piece
    over. `abort`, a cancellation, or leaving the context without `commit` kills
    pg_restore, and the server rolls its transaction back: the target keeps nothing.

    With `freeze` (the source's tables, see restore_script.freezable), pg_restore writes
    its script instead, and a second thread passes it through restore_script.Copies to
    psql, so those tables' rows load frozen. psql is handed the end of the script only
    once pg_restore exited cleanly and the script ended with its COMMIT; otherwise it
    is killed with pg_restore, and the server rolls its transaction back just the same.

    Memory: the pieces are slices of the caller's buffers, not copies; at most QUEUED
    bytes of them wait, plus the piece held back, so the caller's last two or three
    buffers stay alive (a snapshot part each, when fed from pg_dump: see dumping).
    """

    QUEUED = 8 * CHUNK

    def __init__(
        self,
        db: DatabaseConnection,
        settings: DataActivitySettings,
        heartbeats: Heartbeats,
        location: str,
        freeze: frozenset[bytes] | None = None,
        truncate: bool = False,
    ) -> None:
        self._db, self._settings, self._heartbeats, self._location = db, settings, heartbeats, location
        self._copies = None if freeze is None else Copies(freeze, truncate)
        self._psql: Tool | None = None
        """psql, running pg_restore's script, when restoring with `freeze`."""
        self._relay: threading.Thread | None = None
        self._refused: ScriptRefused | None = None
        self._queue: queue.Queue[memoryview | None] = queue.Queue(maxsize=self.QUEUED // CHUNK)
        self._stopped = threading.Event()
        """pg_restore stopped reading (it exited, or was killed): nothing more reaches it."""
        self._committed = False
        self._tool: Tool | None = None
        self._writer: threading.Thread | None = None

    def __enter__(self) -> Restore:
        with self._guarded("restore into the target"):  # before a stream's TRUNCATE could lock a table taking traffic
            pass
        bindir = find_bindir(self._settings.postgres_bindir)
        dbname = f"--dbname={conninfo(self._db, self._settings)}"
        options = ["--no-owner", "--no-privileges", tablespaces.RESTORE_OPTION]
        pg_restore = [str(bindir / "pg_restore"), "--format=custom", "--single-transaction", *options]
        if self._copies is None:
            argv = [*pg_restore, dbname, "--no-password"]
            self._tool = Tool(argv, self._db, self._settings, reads=True, writes=False)
        else:
            psql = [str(bindir / "psql"), "--no-psqlrc", "--quiet", "--set=ON_ERROR_STOP=1", dbname, "--no-password"]
            self._psql = Tool(psql, self._db, self._settings, reads=True, writes=False)
            try:
                self._tool = Tool([*pg_restore, "--file=-"], self._db, self._settings, reads=True, writes=True)
            except BaseException:
                self._psql.__exit__(None, None, None)
                raise
            self._relay = threading.Thread(target=self._relay_script, name="pg_restore-psql", daemon=True)
            self._relay.start()
        self._heartbeats.on_cancel(self.abort)
        self._writer = threading.Thread(target=self._write, name="pg_restore-stdin", daemon=True)
        self._writer.start()
        return self

    def feed(self, data: bytes | memoryview) -> None:
        """Queues `data` for pg_restore, waiting while QUEUED bytes wait already.

        Raises:
            RuntimeError: pg_restore has stopped (its exit code and what it said are in the message).
        """
        view = memoryview(data)
        for start in range(0, len(view), CHUNK):
            self._put(view[start : start + CHUNK])

    def commit(self) -> None:
        """Hands pg_restore the last piece and waits for it to commit.

        Raises:
            RuntimeError: pg_restore failed; its transaction was rolled back.
        """
        with self._guarded("commit a restore into the target"):  # it commits in the block, or never
            self._put(None)
            assert self._writer is not None
            assert self._tool is not None
            self._writer.join()
            if self._relay is not None:
                self._relay.join()
            codes = [tool.wait() for tool in self._tools()]
            if any(codes) or (self._copies is not None and not self._copies.complete):
                # killed by a cancellation, or it failed: rolled back either way
                self._heartbeats.raise_if_cancelled("restoring the snapshot")
                raise self._failure()
            self._committed = True  # even if a cancellation came meanwhile: the step did its work, and its undo knows

    @contextlib.contextmanager
    def _guarded(self, doing: str) -> Iterator[None]:
        """Refuses (TargetVerified) a target verify has marked, and keeps verify from marking it during the block (see
        unwritten): the restore, whose end is held back, commits within the block or not at all."""
        with connect(self._db, self._settings) as conn, unwritten.unverified(conn, self._db, doing):
            yield

    def abort(self) -> None:
        """Kills pg_restore (and psql) before it can commit; callable from any thread."""
        self._stopped.set()
        for tool in self._tools():
            tool.kill()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if not self._committed:
            self.abort()
        if self._writer is not None:
            self._writer.join()
        if self._relay is not None:
            self._relay.join()
        for tool in self._tools():
            tool.__exit__(kind, error, traceback)

    def _tools(self) -> list[Tool]:
        """The running tools, psql (when there is one) first: when both failed, psql's error says why."""
        return [tool for tool in (self._psql, self._tool) if tool is not None]

    def _put(self, item: memoryview | None) -> None:
        while True:
            if self._stopped.is_set():
                self._raise_stopped()
            try:
                self._queue.put(item, timeout=0.2)
            except queue.Full:
                continue
            return

    def _raise_stopped(self) -> NoReturn:
        self._heartbeats.raise_if_cancelled("restoring the snapshot")
        raise self._failure()

    def _failure(self) -> Exception:
        """Why the restore failed: a refused script, else the first tool that failed and was not killed for another's
        failure (psql first), else the first that failed."""
        if self._refused is not None:
            said = str(self._refused)
        else:
            ended = [(tool, tool.wait()) for tool in self._tools()]
            failed = [(tool, code) for tool, code in ended if code != 0]
            first = [(tool, code) for tool, code in failed if code not in KILLED] or failed
            if first:
                said = first[0][0].failure(first[0][1])
            else:  # both exited cleanly, and the script did not end with its COMMIT
                said = "pg_restore's script ended without its COMMIT, so psql committed nothing"
        refused = tls.refusal(self._db, said)
        if refused is not None:
            return refused
        message = f"could not restore {self._location} into {self._db.describe()}: {said}"
        return tools.lock_table_refusal(self._db, message) or RuntimeError(message)

    def _relay_script(self) -> None:
        """The relay thread, with `freeze`: pg_restore's script through Copies into psql. psql gets the end of its input
        only when pg_restore exited cleanly and the script is whole; otherwise both are killed."""
        assert self._tool is not None
        assert self._psql is not None
        assert self._copies is not None
        whole = False
        try:
            script = self._tool.stdout.fileno()
            while chunk := os.read(script, CHUNK):
                for piece in self._copies.feed(chunk):
                    self._psql.stdin.write(piece)
            whole = self._tool.exit_code() == 0 and self._copies.complete
            if whole:
                self._psql.stdin.close()  # psql runs the rest of the script, COMMIT last, and exits
        except (OSError, ValueError):  # psql exited (its exit code says why), or a kill closed a pipe
            pass
        except ScriptRefused as refused:
            self._refused = refused
        finally:
            if not whole:
                self.abort()

    def _write(self) -> None:
        """The writing thread: everything but the last piece, then that piece once `commit` queues its None."""
        assert self._tool is not None
        held: memoryview | None = None
        while not self._stopped.is_set():
            try:
                item = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if held is not None and not self._send(held):
                break
            if item is None:
                with contextlib.suppress(OSError):
                    self._tool.stdin.close()
                return
            held = item
        self._stopped.set()

    def _send(self, data: memoryview) -> bool:
        """Writes to pg_restore; False when it has stopped reading (it exited: its exit code says why)."""
        assert self._tool is not None
        try:
            self._tool.stdin.write(data)
        except (BrokenPipeError, ValueError):  # ValueError: the pipe was closed by a kill meanwhile
            self._stopped.set()
            return False
        return True


def restore(
    db: DatabaseConnection,
    settings: DataActivitySettings,
    body: Any,
    artifact: SnapshotResult,
    heartbeats: Heartbeats,
    progress: Counts | None = None,
    freeze: frozenset[bytes] | None = None,
    truncate: bool = False,
) -> int:
    """Feeds the object's `body` (a botocore StreamingBody) into pg_restore; returns the bytes read.

    `progress` is given the bytes read so far, of the snapshot's size, after each chunk;
    `freeze`, the tables whose rows load frozen through psql (see `Restore`); `truncate`,
    for a stream of rows alone, has each of those tables emptied before its COPY.

    Raises:
        SnapshotCorrupt: the object's SHA-256 is not the recorded one; nothing was committed.
    """
    digest, read = hashlib.sha256(), 0
    with Restore(db, settings, heartbeats, artifact.location, freeze, truncate) as restoring:
        for chunk in body.iter_chunks(CHUNK):
            digest.update(chunk)
            read += len(chunk)
            restoring.feed(chunk)
            if progress is not None:
                progress.update(bytes_done=read, bytes_total=artifact.size_bytes)
            heartbeats.progress(read_bytes=read, size_bytes=artifact.size_bytes)
            heartbeats.raise_if_cancelled("restoring the snapshot")
        if digest.hexdigest() != artifact.sha256 or read != artifact.size_bytes:
            restoring.abort()
            raise changed(artifact, digest.hexdigest(), read)
        restoring.commit()
    return read


def changed(artifact: SnapshotResult, sha256: str, size: int) -> SnapshotCorrupt:
    """The object read back is not the one written: its hash or size is not the recorded one."""
    return SnapshotCorrupt(
        f"the snapshot {artifact.location} is not the one written: its SHA-256 is {sha256} ({size} bytes), recorded "
        f"was {artifact.sha256} ({artifact.size_bytes} bytes). Nothing of it was restored. Roll back and migrate "
        "again to take a new snapshot, and find out what changed the object."
    )


def count_tables(conn: Connection) -> int:
    row = conn.execute(
        f"select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace "
        f"where c.relkind in ('r', 'p') and {USER_SCHEMAS}"
    ).fetchone()
    return int(row[0]) if row else 0
