"""Mode Snapshot in parallel streams: the largest tables' rows dumped, stored and restored by several pipes at once.

One pg_dump feeds one pg_restore, and each uses one core at most: the source's server
sends one COPY at a time, the target's parses one. With `spec.driver.parallelism` (or the
worker's --snapshot-streams) above one, and a source of at least --snapshot-parallel-min-mib
with two tables or more, the snapshot step works in streams instead:

1. **Plan** (`plan`): the source's tables are shared among the streams, largest first,
   each to the stream with the fewest bytes so far, up to NAMED_LIMIT tables; the rest
   stay with the main archive.
2. **One view of the source.** A session of the worker's exports a snapshot of the source
   (pg_export_snapshot) and holds it until the last dump ended; every pg_dump reads
   that snapshot (--snapshot), so all the objects together are one consistent dump, as
   one pg_dump would be. The source is frozen anyway; this makes it certain.
3. **The main archive**, at the snapshot's own key: everything but the streamed tables'
   rows (the schema, sequences, large objects, the other tables' rows, indexes,
   constraints, materialized views). It is stored, then read back into a temporary file
   on the worker while its SHA-256 is checked, and its pre-data section (the tables and
   whatever they need) is restored in one transaction.
4. **The streams**, at once: each pg_dump --data-only of its tables goes to an object of
   its own beside the snapshot (ferry.api.saga.stream_key) and, as it is uploaded, into
   a restoring.Restore of the target, which commits only once that object is stored
   whole, as a single-stream snapshot does. Its rows load with COPY FREEZE where
   restore_script may, after a TRUNCATE in the same transaction (FREEZE needs one).
5. **The rest** of the main archive, by pg_restore --jobs with as many sessions as
   streams: sequences, large objects, the other tables' rows, then the indexes and
   constraints built in parallel, and materialized views refreshed last.

**All or nothing without one transaction.** The target commits piece by piece, so its
marker (ferry.restored_by, see restoring) says the restore is incomplete from the moment
the target is prepared until the last piece committed (`restoring.mark_complete`). An
incomplete target is never taken for a restored one: migrate restores again, the next
attempt empties it first (prepare_target), and the undo empties it like a complete one.
The first stream that fails stops the others (their tools are killed, their uploads
aborted), the step empties the target and removes its marker (on a connection of its own,
once: should that fail, the marker stays and the above applies), and fails with the
stream's error; a cancellation empties it the same way.

migrate restores such a snapshot from S3 the same way (`restore_from_store`) when the
snapshot step did not restore it: the main archive into a temporary file, its schema, the
streams at once (each checked against its SHA-256 before it commits), then the rest.

Memory: each stream's upload gets an equal share of --snapshot-memory-mib, at least
10 MiB (`stream_settings`). Disk: the main archive (the schema, and the rows of the
tables no stream took), in a private temporary folder of the worker's (mode 0700) while
the target is restored, removed afterwards, or by the next restore on that disk when the
worker was killed first (activities/postgres/scratch.py); the step checks for room before
reading it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

from temporalio import activity

from activities.heartbeats import Heartbeats
from activities.postgres import replication, restoring, tablespaces, unwritten
from activities.postgres.connection import NO_TRANSACTION_TIMEOUTS, Connection, connect
from activities.postgres.scratch import scratch_folder
from activities.postgres.tools import Tool, conninfo, find_bindir
from activities.progress import Counts
from activities.secrets import DatabaseConnection
from activities.settings import MIB, DataActivitySettings
from ferry.api.saga import SnapshotResult

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

NAMED_LIMIT = 1000
"""The most tables the streams take, largest first: each is named on pg_dump's command line (twice: in its stream,
and as excluded from the main archive); the rows of the others, the smallest, go with the main archive."""
TABLES = f"""
select format('%I.%I', n.nspname, c.relname), n.nspname, c.relname, pg_table_size(c.oid)
{replication.USER_TABLES} and c.relkind = 'r'
order by 4 desc, 1
"""
"""The source's tables whose rows pg_dump dumps as a table's, largest first: ordinary ones, partitions included (a
partitioned table holds no rows of its own), no extension's (pg_dump decides about those)."""

ROOM = 64 * MIB
"""Room left free on the worker's temporary folder beside the main archive."""

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    """As quote_ident spells it, and so as pg_dump's script names it."""
    pattern: str
    """A pg_dump pattern that matches this table alone (every character inside double quotes is itself)."""
    size: int


def pattern(schema: str, name: str) -> str:
    """The pg_dump pattern for exactly schema.name."""
    return '"{}"."{}"'.format(schema.replace('"', '""'), name.replace('"', '""'))


def plan(conn: Connection, streams: int) -> list[list[Table]]:
    """The source's tables shared among at most `streams` streams (see `share`)."""
    tables = [
        Table(name, pattern(schema, relation), int(size)) for name, schema, relation, size in conn.execute(TABLES)
    ]
    return share(tables, streams)


def share(tables: Sequence[Table], streams: int) -> list[list[Table]]:
    """The largest NAMED_LIMIT of `tables` (given largest first) shared among `streams`, each to the stream with the
    fewest bytes so far; streams left without a table are dropped."""
    loads, groups = [0] * streams, [list[Table]() for _ in range(streams)]
    for table in tables[:NAMED_LIMIT]:
        lightest = loads.index(min(loads))
        groups[lightest].append(table)
        loads[lightest] += table.size
    return [group for group in groups if group]


@contextlib.contextmanager
def exported_snapshot(conn: Connection) -> Iterator[str]:
    """Holds a snapshot of the database on `conn` for other sessions to import while the context lasts; yields its
    name (pg_dump's --snapshot)."""
    conn.execute(NO_TRANSACTION_TIMEOUTS)  # it waits in its transaction while the dumps run
    with conn.transaction():
        conn.execute("set transaction isolation level repeatable read, read only")
        row = conn.execute("select pg_export_snapshot()").fetchone()
        assert row is not None
        yield str(row[0])


def main_options(snapshot: str, groups: Sequence[Sequence[Table]]) -> list[str]:
    """pg_dump's options for the main archive: everything but the streamed tables' rows."""
    return [f"--snapshot={snapshot}", *(f"--exclude-table-data={table.pattern}" for group in groups for table in group)]


def stream_options(snapshot: str, group: Sequence[Table]) -> list[str]:
    """pg_dump's options for one stream: its tables' rows alone, each name required to match."""
    return [f"--snapshot={snapshot}", "--data-only", "--strict-names", *(f"--table={table.pattern}" for table in group)]


def stream_settings(settings: DataActivitySettings, streams: int) -> DataActivitySettings:
    """The settings one of `streams` uploads at once works with: its share of the snapshot's memory."""
    return dataclasses.replace(settings, upload_memory=max(10 * MIB, settings.upload_memory // streams))


class Group:
    """Runs jobs in threads of their own, as one: the first to fail stops the others, and `run` raises its error."""

    def __init__(self, heartbeats: Heartbeats) -> None:
        self._heartbeats = heartbeats
        self._lock = threading.Lock()
        self._stops: list[Callable[[], None]] = []
        self.stopped = threading.Event()

    def run(self, jobs: Sequence[Callable[[Heartbeats], T]]) -> list[T]:
        """Runs every job with heartbeats of its own (see `_Member`); returns their results in order."""
        results: list[T | None] = [None] * len(jobs)
        errors: list[BaseException] = []
        """In the order they came: the first is why the group stopped, the others mostly what stopping caused."""

        def work(index: int) -> None:
            try:
                results[index] = jobs[index](_Member(self._heartbeats, self, f"stream{index + 1}"))
            except BaseException as error:  # noqa: BLE001 - handed to the caller's thread below
                with self._lock:
                    errors.append(error)
                self.stop()

        threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(work, index), name=f"stream-{index + 1}")
            for index in range(len(jobs))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            self._heartbeats.raise_if_cancelled("restoring in streams")
            raise next((error for error in errors if not isinstance(error, _Stopped)), errors[0])
        return cast(list[T], results)  # every job returned: none failed

    def on_stop(self, stop: Callable[[], None]) -> None:
        with self._lock:
            self._stops.append(stop)
            stopped = self.stopped.is_set()
        if stopped:
            stop()

    def stop(self) -> None:
        """Stops every job's tools; callable from any thread."""
        with self._lock:
            if self.stopped.is_set():
                return
            self.stopped.set()
            stops = list(self._stops)
        for stop in stops:
            try:
                stop()
            except Exception as error:  # noqa: BLE001 - one failed stop must not keep the others from running
                activity.logger.warning("could not stop a stream: %s", error)


class _Stopped(RuntimeError):
    """A job stopped because another one failed: never the error the step reports."""


class _Member(Heartbeats):
    """The heartbeats one job of a Group is given: the activity's, its details named after the job, and what it
    stops on cancellation also stopped when another job fails."""

    def __init__(self, parent: Heartbeats, group: Group, label: str) -> None:
        self._parent, self._group, self._label = parent, group, label

    def progress(self, **details: object) -> None:
        self._parent.progress(**self._named(details))

    def note(self, **details: object) -> None:
        self._parent.note(**self._named(details))

    def on_cancel(self, stop: Callable[[], None]) -> None:
        self._group.on_stop(stop)
        self._parent.on_cancel(stop)

    def raise_if_cancelled(self, doing: str) -> None:
        self._parent.raise_if_cancelled(doing)
        if self._group.stopped.is_set():
            raise _Stopped(f"{self._label} stopped while {doing}: another stream failed")

    def _named(self, details: dict[str, object]) -> dict[str, object]:
        return {f"{self._label}_{name}": value for name, value in details.items()}


class Total:
    """Adds up the bytes of several streams into one step's progress; each stream counts through its `share`."""

    def __init__(self, progress: Counts | None, total: int | None = None) -> None:
        self._progress, self._total = progress, total
        self._lock = threading.Lock()
        self._done: dict[int, int] = {}

    def share(self, index: int) -> Counts:
        total = self

        class _Share:
            def update(self, *, bytes_done: int | None = None, **_: int | None) -> None:
                if bytes_done is not None:
                    total._add(index, bytes_done)

        return _Share()

    def _add(self, index: int, done: int) -> None:
        with self._lock:
            self._done[index] = done
            if self._progress is not None:
                self._progress.update(bytes_done=sum(self._done.values()), bytes_total=self._total)


def fetch(s3: S3Client, artifact: SnapshotResult, path: Path, heartbeats: Heartbeats) -> Path:
    """Reads the object `artifact` into `path`, checking its size and SHA-256; returns `path`.

    Raises:
        SnapshotCorrupt: the object is gone, or is not the one recorded.
    """
    body = restoring.open_snapshot(s3, artifact)
    digest, read = hashlib.sha256(), 0
    try:
        with path.open("wb") as file:
            for chunk in body.iter_chunks(restoring.CHUNK):
                digest.update(chunk)
                read += len(chunk)
                file.write(chunk)
                heartbeats.raise_if_cancelled("reading the snapshot's main archive")
    finally:
        body.close()
    if digest.hexdigest() != artifact.sha256 or read != artifact.size_bytes:
        raise restoring.changed(artifact, digest.hexdigest(), read)
    return path


def _room_for(folder: Path, main: SnapshotResult) -> None:
    """Fails before the read when the worker's temporary folder cannot hold the main archive."""
    free = shutil.disk_usage(folder).free
    if free < main.size_bytes + ROOM:
        raise RuntimeError(
            f"the worker's temporary folder {folder.parent} has {free / MIB:,.0f} MiB free, and the main archive of a "
            f"snapshot in streams ({main.location}, {main.size_bytes / MIB:,.0f} MiB) must be read there to be "
            "restored around the streams. Give the worker more room there (TMPDIR), or set spec.driver.parallelism "
            "to 1, which needs none."
        )


def restore_sections(
    db: DatabaseConnection,
    settings: DataActivitySettings,
    archive: Path,
    heartbeats: Heartbeats,
    location: str,
    *options: str,
) -> None:
    """Runs pg_restore on the archive file with `options` (its sections, and --single-transaction or --jobs)."""
    argv = [
        str(find_bindir(settings.postgres_bindir) / "pg_restore"),
        "--format=custom",
        "--no-owner",
        "--no-privileges",
        tablespaces.RESTORE_OPTION,
        "--exit-on-error",
        *options,
        f"--dbname={conninfo(db, settings)}",
        "--no-password",
        str(archive),
    ]
    with (
        connect(db, settings) as guard,
        unwritten.unverified(guard, db, "restore the snapshot's main archive"),  # see unwritten
        Tool(argv, db, settings, reads=False, writes=False) as tool,
    ):
        heartbeats.on_cancel(tool.kill)
        code = tool.wait()
        heartbeats.raise_if_cancelled("restoring the snapshot's main archive")
        if code != 0:
            raise tool.error(code, f"restore {location} into {db.describe()}")


def restore_around(
    db: DatabaseConnection,
    settings: DataActivitySettings,
    s3: S3Client,
    main: SnapshotResult,
    heartbeats: Heartbeats,
    jobs: Sequence[Callable[[Heartbeats], T]],
    sessions: int,
) -> list[T]:
    """Restores the main archive `main` into `db` around the streams' `jobs`: its schema before them, and the rest
    (with `sessions` sessions) once every job is done; returns the jobs' results."""
    with scratch_folder() as folder:
        _room_for(folder, main)
        archive = fetch(s3, main, folder / "main.dump", heartbeats)
        restore_sections(db, settings, archive, heartbeats, main.location, "--section=pre-data", "--single-transaction")
        results = Group(heartbeats).run(jobs)
        restore_sections(
            db,
            settings,
            archive,
            heartbeats,
            main.location,
            "--section=data",
            "--section=post-data",
            f"--jobs={sessions}",
        )
    return results


def restore_from_store(
    db: DatabaseConnection,
    settings: DataActivitySettings,
    s3: S3Client,
    artifact: SnapshotResult,
    heartbeats: Heartbeats,
    progress: Counts | None,
    freeze: frozenset[bytes] | None,
) -> int:
    """Restores a snapshot taken in streams from S3 into `db` (prepared and marked incomplete); returns the bytes
    read. Every object is checked against its SHA-256 before what it holds commits."""
    total = Total(progress, artifact.total_bytes)

    def job(index: int) -> Callable[[Heartbeats], int]:
        stream = artifact.stream(index)

        def restore(heartbeats: Heartbeats) -> int:
            body = restoring.open_snapshot(s3, stream)
            try:
                return restoring.restore(db, settings, body, stream, heartbeats, total.share(index), freeze, True)
            finally:
                body.close()

        return restore

    jobs = [job(index) for index in range(len(artifact.streams))]
    read = restore_around(db, settings, s3, artifact, heartbeats, jobs, len(jobs))  # its key is the main archive's
    return artifact.size_bytes + sum(read)
