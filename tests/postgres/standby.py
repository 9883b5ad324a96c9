"""A primary and its physical streaming standby, servers of a test's own, as a failover manager runs them.

A source in a StatefulSet with a failover manager (Patroni, say) is a primary and standbys
that replay its WAL. They share its system identifier and its databases' oids, so the
identity ferry pins each Secret to cannot tell them apart, and a switchover makes the old
primary a standby of the new one. The stack's source is a single server, so these tests
make a pair of their own from the stack's PostgreSQL 15 binaries: initdb for the primary,
pg_basebackup for the standby, pg_ctl for the switchover. Each listens on loopback only,
on a free port; when the tests run as root, the servers run as the `postgres` user
(PostgreSQL refuses root), as the stack's do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from psycopg import sql

from devstack.stack.postgres import SUPERUSER, PostgresEndpoint
from devstack.stack.postgres_home import ServiceUser
from devstack.stack.processes import as_user
from devstack.stack.readiness import LOOPBACK, free_port
from tests.cluster import eventually
from tests.postgres.data import connect

SETTINGS = """
# Written by ferry's tests: a primary and its streaming standby, on loopback.
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
wal_level = replica
max_wal_senders = 10
hot_standby = on
fsync = off
"""
"""Both servers' postgresql.conf (pg_basebackup copies it); each gets its port on pg_ctl's command line. fsync off:
every stop in these tests is clean, and they need no durability through a crash of the machine."""

STEP_TIMEOUT = 60
"""Seconds pg_ctl waits for a server to start, stop or be promoted."""


@dataclasses.dataclass(frozen=True)
class Server:
    """One server of the pair: its data folder, its port, and pg_ctl to start, stop and promote it."""

    name: str
    """Like the Pod it stands for (pod-0, pod-1); also its application_name as a standby, in pg_stat_replication."""
    folder: Path
    """The pair's folder: this server's data is `folder/name`, its log `folder/name.log`."""
    port: int
    bindir: Path
    password: str
    """The superuser's; pg_basebackup copies it to the standby."""
    user: ServiceUser | None
    """The account the server runs as when the tests run as root."""

    @property
    def data(self) -> Path:
        return self.folder / self.name

    @property
    def log(self) -> Path:
        return self.folder / f"{self.name}.log"

    def endpoint(self, database: str = "postgres") -> PostgresEndpoint:
        return PostgresEndpoint(LOOPBACK, self.port, SUPERUSER, self.password, database)

    def start(self) -> None:
        self._pg_ctl("start", "-l", str(self.log), "-o", f"-c port={self.port}")

    def stop(self, mode: str = "fast") -> None:
        """A clean stop by default ("fast": open transactions rolled back, a shutdown checkpoint, every standby sent
        all of the WAL first), as a failover manager's switchover stops the old primary."""
        self._pg_ctl("stop", "-m", mode)

    def promote(self) -> None:
        self._pg_ctl("promote")

    def follow(self, primary: Server) -> None:
        """Makes this stopped server a standby of `primary` at its next start (standby.signal, primary_conninfo)."""
        conninfo = (
            f"host={LOOPBACK} port={primary.port} user={SUPERUSER} password={primary.password} "
            f"application_name={self.name}"
        )
        with (self.data / "postgresql.auto.conf").open("a") as conf:  # the last line of a setting wins
            conf.write(f"primary_conninfo = '{conninfo}'\n")
        signal = self.data / "standby.signal"
        signal.touch()
        self.own(signal)

    def lsn(self, query: str) -> str:
        """A WAL position this server reports, e.g. `pg_current_wal_lsn()` or `pg_last_wal_replay_lsn()`."""
        with connect(self.endpoint()) as conn:
            row = conn.execute(sql.SQL("select {}::text").format(sql.SQL(query))).fetchone()
        assert row is not None
        assert row[0] is not None, f"{self.name}: {query} is null"
        return str(row[0])

    def replayed(self, lsn: str) -> bool:
        """Whether this standby has replayed the WAL up to `lsn`."""
        with connect(self.endpoint()) as conn:
            row = conn.execute("select pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()
        return row is not None and row[0] is True

    @contextlib.contextmanager
    def replay_paused(self) -> Iterator[None]:
        """This standby goes on streaming, and writing what it receives, but replays nothing until the block ends."""
        with connect(self.endpoint()) as conn:
            conn.execute("select pg_wal_replay_pause()")
        try:
            yield
        finally:
            with connect(self.endpoint()) as conn:
                conn.execute("select pg_wal_replay_resume()")

    def streaming_standbys(self) -> list[str]:
        """The standbys streaming from this server, by application_name."""
        with connect(self.endpoint()) as conn:
            rows = conn.execute(
                "select application_name from pg_stat_replication where state = 'streaming' order by 1"
            ).fetchall()
        return [row[0] for row in rows]

    def run(self, tool: str, *args: str, env: dict[str, str] | None = None) -> None:
        """Runs one of the server's programs as its user; fails with what it said and the end of the server's log."""
        result = subprocess.run(
            [str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            cwd=self.folder,
            env={**os.environ, **(env or {})},
            **as_user(self.user.name if self.user else None),
        )
        if result.returncode != 0:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise AssertionError(f"{self.name}: {tool} {' '.join(args)} failed: {result.stderr}\n{log}")

    def _pg_ctl(self, action: str, *args: str) -> None:
        self.run("pg_ctl", action, "-D", str(self.data), "-w", "-t", str(STEP_TIMEOUT), *args)

    def own(self, path: Path) -> None:
        """Gives `path` to the server's user, so that the server may read it."""
        if self.user is not None:
            self.user.own(path)


@dataclasses.dataclass
class Pair:
    """The pair as it stands: which server is the primary and which streams from it."""

    primary: Server
    standby: Server

    def switchover(self) -> None:
        """A failover manager's clean switchover: stops the primary, promotes the standby, and starts the old primary
        as a standby of the new one; returns once it streams from there."""
        old, new = self.primary, self.standby
        old.stop()  # the standby has all of the WAL: a clean stop sends it everything before it ends
        new.promote()
        old.follow(new)
        old.start()
        self.primary, self.standby = new, old
        self.wait_streaming()

    def wait_streaming(self) -> None:
        eventually(
            f"{self.standby.name} streaming from {self.primary.name}",
            lambda: self.primary.streaming_standbys() == [self.standby.name],
            timeout=STEP_TIMEOUT,
        )

    def wait_replayed(self) -> None:
        """Waits until the standby has replayed all the primary has written so far."""
        written = self.primary.lsn("pg_current_wal_lsn()")
        eventually(
            f"{self.standby.name} replaying {self.primary.name}'s WAL up to {written}",
            lambda: self.standby.replayed(written),
            timeout=STEP_TIMEOUT,
        )


@contextlib.contextmanager
def streaming_pair(bindir: Path, prepare: Callable[[Server], None]) -> Iterator[Pair]:
    """pod-0, a primary, and pod-1 streaming from it; `prepare` gets pod-0 before pod-1 is copied from it. Both are
    stopped and their folder removed on the way out."""
    user = ServiceUser.when_root()
    folder = Path(tempfile.mkdtemp(prefix="ferry-pair-", dir="/var/tmp"))  # where the server's user can enter
    if user is not None:
        user.own(folder)
    password = secrets.token_urlsafe(24)
    primary = Server("pod-0", folder, free_port(), bindir, password, user)
    standby = Server("pod-1", folder, free_port(), bindir, password, user)
    try:
        _initialize(primary)
        primary.start()
        prepare(primary)
        primary.run(
            "pg_basebackup",
            f"--host={LOOPBACK}",
            f"--port={primary.port}",
            f"--username={SUPERUSER}",
            f"--pgdata={standby.data}",
            "--wal-method=stream",
            "--checkpoint=fast",
            env={"PGPASSWORD": password},
        )
        standby.follow(primary)
        standby.start()
        pair = Pair(primary, standby)
        pair.wait_streaming()
        yield pair
    finally:
        for server in (primary, standby):
            if (server.data / "postmaster.pid").exists():
                with contextlib.suppress(AssertionError):
                    server.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


def _initialize(server: Server) -> None:
    pwfile = server.folder / "initdb-password"
    descriptor = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(server.password + "\n")
    server.own(pwfile)
    try:
        server.run(
            "initdb",
            f"--pgdata={server.data}",
            f"--username={SUPERUSER}",
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
        )
    finally:
        pwfile.unlink(missing_ok=True)
    with (server.data / "postgresql.conf").open("a") as conf:
        conf.write(SETTINGS)
