"""Running pg_dump and pg_restore as child processes, with the connection in their environment.

The password reaches the child in PGPASSWORD, and the rest of the connection in PGHOST,
PGPORT, PGUSER and PGDATABASE: nothing secret is on a command line, where `ps` shows
it. The command line carries only `conninfo`: the database name, quoted so that it is
never read as a connection string, and the parameters that bound every wait
(connect_timeout, TCP keepalives, tcp_user_timeout), which have no environment variables.
TLS is in PGSSLMODE and PGSSLROOTCERT, a private copy of the Secret's CA that lives as long
as the child (tls.py).

The child's environment is built from nothing (see `environment`): it inherits none of
the worker's variables, which hold the worker's own credentials (FERRY_TEMPORAL_API_KEY,
cloud credentials) and PG* settings meant for nobody but the worker. A thread reads its
stderr, keeping the tail, so a chatty tool never blocks on a full pipe; that tail is
scrubbed of the password and of every value the server quoted (ferry.api.scrubbing)
before it becomes part of a message.

Each child runs in a session, and so a process group, of its own, and `Tool.kill` ends the
whole group: pg_restore --jobs forks a worker per job, each with a session of its own on
the server, and a kill of the leader alone left them running: they held its stderr open
(so leaving the Tool waited for them) and, once a lock they waited for was free, committed
their COPY into the target of a restore that had been cancelled. A child in a group of its
own gets none of the signals sent to the worker's (a terminal's Ctrl-C, a `kill` of the
worker's group): the worker stops it itself. On SIGTERM the worker shuts down, and once its
graceful shutdown is over Temporal cancels the activities still running, whose Heartbeats
kill their tools (activities/heartbeats.py); a tool that outlives a worker killed outright
ends with it in its container (the worker is its PID 1, and the kernel kills every other
process there when it ends), and one fed or read through a pipe ends anyway at the pipe's
end, rolling back what it had not committed.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from types import TracebackType
from typing import IO

from psycopg.conninfo import make_conninfo

from activities.postgres import tls
from activities.postgres.connection import APPLICATION_NAME, parameters
from activities.secrets import DatabaseConnection
from activities.settings import DataActivitySettings
from ferry.api.errors import InvalidSpec
from ferry.api.scrubbing import EXCERPT_LIMIT, scrub

TOOLS = ("pg_dump", "pg_restore")
DEBIAN_FOLDERS = Path("/usr/lib/postgresql")
STDERR_LINES = 20
OUT_OF_LOCKS = ("out of shared memory", "max_locks_per_transaction")
"""What the server says when one transaction needs more locks than its lock table holds (its hint names the setting)."""


def lock_table_refusal(db: DatabaseConnection, said: str) -> InvalidSpec | None:
    """A permanent failure for a tool's transaction that the server's lock table could not hold (`said` says what
    failed, as the server told it); None for any other failure. Another attempt would fail the same way."""
    if not all(words in said for words in OUT_OF_LOCKS):
        return None
    return InvalidSpec(
        f"{said}. The restore creates the database's tables, indexes and large objects in one transaction, and the "
        f"lock table of the server of {db.describe()} is too small for them: another attempt would fail the same "
        "way. Raise max_locks_per_transaction on that server (a restart; the target's Pods take the source's "
        "settings unless they are changed), then create the Migration again."
    )


MESSAGES = {"LC_MESSAGES": "C"}
"""The tools' messages in English whatever the worker's locale: ferry reads them ("permission denied")."""


def find_bindir(configured: Path | None) -> Path:
    """The folder with pg_dump and pg_restore: the configured one, else the newest this machine has.

    Without --postgres-bindir, the candidates are every folder on the PATH that holds both
    tools and Debian's /usr/lib/postgresql/<major>/bin, and the one whose pg_dump reports the
    highest major version wins (on a tie, the first: the PATH's in its order, then Debian's).
    The newest, not the first found: pg_dump dumps servers of its own major and older ones but
    refuses newer ones, and pg_restore reads the archives of its own and older pg_dumps, so
    the newest tools serve every pair of servers the older ones serve. The worker's image and
    the local stack name their folder (FERRY_POSTGRES_BINDIR in the Dockerfile; the stack's
    PostgreSQL 18 tools, which are in neither place, in devstack and the tests) rather than
    rely on this search.
    """
    if configured is not None:
        if all(os.access(configured / tool, os.X_OK) for tool in TOOLS):
            return configured
        raise RuntimeError(
            f"found no pg_dump and pg_restore in {configured}: point --postgres-bindir (FERRY_POSTGRES_BINDIR) "
            "at the folder of the PostgreSQL client tools"
        )
    found = [(_major_or_none(folder), folder) for folder in candidates()]
    usable = [(found_major, folder) for found_major, folder in found if found_major is not None]
    if not usable:
        raise RuntimeError(
            f"found no pg_dump and pg_restore on the PATH or in {DEBIAN_FOLDERS}/*/bin: install the PostgreSQL "
            "client tools on the worker or point --postgres-bindir (FERRY_POSTGRES_BINDIR) at their folder"
        )
    newest = max(found_major for found_major, _ in usable)
    return next(folder for found_major, folder in usable if found_major == newest)


def candidates() -> list[Path]:
    """Every folder holding pg_dump and pg_restore: those on the PATH in its order, then Debian's, each once."""
    on_path = [Path(entry) for entry in os.environ.get("PATH", "").split(os.pathsep) if entry]
    numbered = [path for path in DEBIAN_FOLDERS.glob("*/bin") if path.parent.name.isdigit()]
    debian = sorted(numbered, key=lambda path: int(path.parent.name), reverse=True)
    folders: list[Path] = []
    seen: set[Path] = set()
    for folder in [*on_path, *debian]:
        if all(os.access(folder / tool, os.X_OK) for tool in TOOLS) and folder.resolve() not in seen:
            seen.add(folder.resolve())
            folders.append(folder)
    return folders


def _major_or_none(folder: Path) -> int | None:
    """The major version of the folder's pg_dump, or None when it does not tell (then it is no candidate)."""
    try:
        return major(version(folder, TOOLS[0]))
    except RuntimeError:
        return None


def version(bindir: Path, tool: str) -> str:
    """The version `tool --version` reports, e.g. 15.18; raises RuntimeError when it cannot tell."""
    try:
        said = subprocess.run(
            [str(bindir / tool), "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            env=MESSAGES,
            start_new_session=True,  # as every child of the worker's (see Tool)
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise RuntimeError(f"could not run {bindir / tool} --version: {error}") from None
    found = re.search(r"\(PostgreSQL\)\s+(\d+(?:\.\d+)?)", said)
    if found is None:
        raise RuntimeError(f"{bindir / tool} --version said {said.strip()!r}, which names no PostgreSQL version")
    return found.group(1)


def major(version: str) -> int:
    """The major version of a version string such as 15.18 or 18."""
    return int(version.split(".")[0])


def conninfo(db: DatabaseConnection, settings: DataActivitySettings) -> str:
    """The tools' --dbname: the database and the bounded waits; host, user and password come from the environment."""
    return make_conninfo(dbname=db.database, **parameters(settings))


def environment(db: DatabaseConnection, settings: DataActivitySettings) -> dict[str, str]:
    """Everything a tool's process gets in its environment: the connection, and English messages.

    Nothing else, and nothing of the worker's. The tools need no PATH (they are started
    by their full path and start nothing themselves), no HOME (PGPASSWORD makes a
    .pgpass unnecessary; libpq finds the user's home from the password database should
    it look for certificates), no TZ (COPY writes timestamps with their offset) and no
    LANG (the session's encoding is the database's). What the worker's own environment
    held stays out of reach of a tool, and of anything a tool might run or print.
    """
    return {
        **MESSAGES,
        "PGHOST": db.host,
        "PGPORT": str(db.port),
        "PGUSER": db.username,
        "PGPASSWORD": db.password,
        "PGDATABASE": db.database,
        "PGAPPNAME": APPLICATION_NAME,
        "PGCONNECT_TIMEOUT": str(settings.connect_timeout),
    }


class Tool:
    """One running pg_dump or pg_restore; as a context manager, it is killed and reaped on the way out."""

    def __init__(
        self, argv: list[str], db: DatabaseConnection, settings: DataActivitySettings, *, reads: bool, writes: bool
    ) -> None:
        self.name = Path(argv[0]).name
        self._db = db
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._files = contextlib.ExitStack()
        """What the child reads while it runs, removed once it has exited: the Secret's CA."""
        self._reaping = threading.Lock()
        """Held while the child's group is signalled and while the child is reaped: its pid names its group only
        until it is reaped (then the number may go to another process)."""
        ca = self._files.enter_context(tls.ca_file(db))
        try:
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if reads else subprocess.DEVNULL,
                stdout=subprocess.PIPE if writes else subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env={**environment(db, settings), **tls.environment(db, ca)},
                start_new_session=True,  # its own group, which `kill` ends whole (see the module's docstring)
            )
        except BaseException:
            self._files.close()
            raise
        self._reader = threading.Thread(target=self._read_stderr, name=f"{self.name}-stderr", daemon=True)
        self._reader.start()

    @property
    def stdin(self) -> IO[bytes]:
        assert self._process.stdin is not None
        return self._process.stdin

    @property
    def stdout(self) -> IO[bytes]:
        assert self._process.stdout is not None
        return self._process.stdout

    def kill(self) -> None:
        """Stops the tool at once, with every process it started (pg_restore's workers); the server then rolls back
        their open transactions. Callable from any thread, also once the tool has exited."""
        with self._reaping:
            if self._process.returncode is None:  # not reaped yet: its pid still names its group
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._process.pid, signal.SIGKILL)

    def exit_code(self) -> int:
        """Waits for the tool to exit and returns its code; `wait` also reaps what reads its stderr."""
        return self._reap()

    def wait(self) -> int:
        code = self._reap()
        self._reader.join()
        assert self._process.stderr is not None
        self._process.stderr.close()
        self._files.close()
        return code

    def failure(self, code: int) -> str:
        """What the tool said before it exited with `code`: no password, no value the server quoted, one line."""
        said = scrub(self._db.redact("\n".join(self._stderr)), EXCERPT_LIMIT) or "(no output)"
        return f"{self.name} exited with code {code}: {said}"

    def error(self, code: int, doing: str) -> Exception:
        """What to raise for its exit with `code`: TlsMismatch when TLS failed, else a RuntimeError saying it could
        not do what it was `doing` and what it said."""
        failure = self.failure(code)
        said = f"could not {doing}: {failure}"
        return tls.refusal(self._db, failure) or lock_table_refusal(self._db, said) or RuntimeError(said)

    def __enter__(self) -> Tool:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.kill()  # running or not: nothing of its group outlives the block
        for pipe in (self._process.stdin, self._process.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self.wait()

    def _reap(self) -> int:
        """Waits for the tool to exit, ends what it left running in its group, and reaps it; returns its exit code.

        A leader that died alone (killed by someone else, or it crashed) would leave its workers restoring, and the
        stderr pipe open. Its exit is awaited without reaping it (WNOWAIT), so that its pid names its group until
        the group is killed."""
        if self._process.returncode is None:
            with contextlib.suppress(ChildProcessError):  # reaped by another thread meanwhile
                os.waitid(os.P_PID, self._process.pid, os.WEXITED | os.WNOWAIT)
            self.kill()
        with self._reaping:
            return self._process.wait()

    def _read_stderr(self) -> None:
        assert self._process.stderr is not None
        for raw in self._process.stderr:
            self._stderr.append(raw.decode(errors="replace").rstrip())
