"""PostgreSQL instances from Debian's packages, one data folder each, TCP on loopback only.

The server refuses to run as root, so when ferry runs as root the instances run as
the `postgres` system user that Debian's package creates; their folders must then be
reachable by that user, which is checked up front with a message saying what to do.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
from pathlib import Path

from devstack.stack.errors import StartError
from devstack.stack.install import Binaries
from devstack.stack.processes import ManagedProcess
from devstack.stack.readiness import LOOPBACK, PortBook, wait_until

SUPERUSER = "postgres"
SERVICE_USER_WHEN_ROOT = "postgres"


@dataclasses.dataclass(frozen=True)
class PostgresEndpoint:
    """How to reach one instance as its superuser."""

    host: str
    port: int
    user: str
    password: str
    database: str = "postgres"

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"


@dataclasses.dataclass
class PostgresInstance:
    """One named instance (the stack has `source` and `target`)."""

    name: str
    binaries: Binaries
    folder: Path
    ports: PortBook
    logs: Path
    process: ManagedProcess | None = None

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def endpoint(self) -> PostgresEndpoint:
        return PostgresEndpoint(LOOPBACK, self.ports.port(f"postgres-{self.name}"), SUPERUSER, self._password())

    def _password(self) -> str:
        path = self.folder / "password"
        if not path.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(24))
            path.chmod(0o600)
        return path.read_text().strip()

    def _tool(self, name: str) -> str:
        return str(self.binaries.postgres_bindir / name)

    def _run_as(self) -> str | None:
        return SERVICE_USER_WHEN_ROOT if os.geteuid() == 0 else None

    def _initialize(self, user: str | None) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        if self.data.exists():
            shutil.rmtree(self.data)  # a half-done initdb from an interrupted start
        self.data.mkdir(parents=True, mode=0o700)
        pwfile = self.folder / "initdb-password"
        pwfile.write_text(self._password() + "\n")
        if user is not None:
            account = pwd.getpwnam(user)
            for path in (self.data, pwfile):
                os.chown(path, account.pw_uid, account.pw_gid)
        try:
            result = subprocess.run(
                [
                    self._tool("initdb"),
                    f"--pgdata={self.data}",
                    f"--username={SUPERUSER}",
                    f"--pwfile={pwfile}",
                    "--auth-host=scram-sha-256",
                    "--auth-local=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C.UTF-8",
                ],
                capture_output=True,
                text=True,
                user=user,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise StartError(f"initdb for PostgreSQL instance {self.name!r} failed:\n{result.stderr[-2000:]}")

    def start(self) -> ManagedProcess:
        user = self._run_as()
        self.folder.mkdir(parents=True, exist_ok=True)
        if user is not None:
            _check_reachable(self.folder, user)
        self._initialize(user)
        self.process = ManagedProcess(
            name=f"postgres-{self.name}",
            argv=[
                self._tool("postgres"),
                "-D",
                str(self.data),
                "-c",
                f"port={self.ports.port(f'postgres-{self.name}')}",
                "-c",
                f"listen_addresses={LOOPBACK}",
                # No Unix sockets: their paths have a short length limit, and TCP is what
                # ferry's activities use anyway.
                "-c",
                "unix_socket_directories=",
                "-c",
                "max_connections=200",
            ],
            user=user,
            stop_signal=signal.SIGINT,  # "fast" shutdown: roll back open transactions, then stop
            log_path=self.logs / f"postgres-{self.name}.log",
        )
        self.process.start()
        return self.process

    def wait(self, timeout: float) -> None:
        port = str(self.ports.port(f"postgres-{self.name}"))

        def accepting() -> bool:
            probe = subprocess.run(
                [self._tool("pg_isready"), "-h", LOOPBACK, "-p", port, "-U", SUPERUSER, "-t", "2"],
                capture_output=True,
            )
            return probe.returncode == 0

        wait_until(f"PostgreSQL instance {self.name!r}", accepting, timeout=timeout, process=self.process)


def _check_reachable(folder: Path, user: str) -> None:
    """Fails early when `user` could not traverse to `folder` (e.g. it is under /root)."""
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        raise StartError(
            f"PostgreSQL cannot run as root and there is no {user!r} user to run it as. "
            "Install Debian's postgresql package (it creates the user) or run ferry as a normal user."
        ) from None
    for parent in reversed(folder.resolve().parents):
        mode = parent.stat()
        if mode.st_uid == account.pw_uid:
            continue
        if not mode.st_mode & stat.S_IXOTH:
            raise StartError(
                f"PostgreSQL runs as user {user!r} because ferry runs as root, and that user "
                f"cannot enter {parent} (mode {stat.filemode(mode.st_mode)}). Choose a state folder "
                "outside it with --state-dir (for example under /var/tmp)."
            )
