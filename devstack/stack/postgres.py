"""PostgreSQL instances, one data folder each, TCP on loopback only.

Each instance runs the server of its own folder of binaries: the stack's `source` is
Debian's PostgreSQL 15 and its `target` PostgreSQL 18 (install.py finds both), so that a
migration really crosses major versions. The server refuses to run as root, so when ferry
runs as root the instances run as the `postgres` system user that Debian's package
creates, and their data goes where that user can reach it (postgres_home.py). Each
instance's password and log stay in the state folder, which ferry's own user reads.

An instance given `ServerTls` serves TLS with that certificate and accepts nothing else
(only hostssl lines in its pg_hba.conf), for the tests of ferry's verified connections.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from devstack.stack.errors import StartError
from devstack.stack.logtail import cause_lines
from devstack.stack.postgres_home import DataHome, ServiceUser
from devstack.stack.processes import ManagedProcess, as_user
from devstack.stack.readiness import LOOPBACK, PortBook, wait_until

SUPERUSER = "postgres"
LOGICAL_REPLICATION = ("-c", "wal_level=logical", "-c", "max_replication_slots=10", "-c", "max_wal_senders=10")
"""Server settings of the `source` instance, so that Migrations of mode Online can replicate from it. The `target`
keeps the default wal_level (replica), which tests use to see the precheck refuse a source without logical."""
TWO_PHASE_COMMIT = ("-c", "max_prepared_transactions=10")
"""Server settings of both instances: PREPARE TRANSACTION works (the default, 0, refuses it), as for an application
whose XA/JTA transaction manager commits in two phases; tests prepare transactions across the freeze. The stack starts
its servers with these options every time, so a data folder kept from an earlier run gets them too."""


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


@dataclasses.dataclass(frozen=True)
class ServerTls:
    """ssl=on with this certificate and key (PEM), and only encrypted connections accepted."""

    certificate: Path
    key: Path


ONLY_TLS = """\
# Written by ferry's devstack: TLS or nothing, on loopback.
hostssl all all 127.0.0.1/32 scram-sha-256
hostssl all all ::1/128 scram-sha-256
"""


@dataclasses.dataclass
class PostgresInstance:
    """One named instance (the stack has `source` and `target`)."""

    name: str
    bindir: Path
    """The server's own programs: postgres, initdb, pg_isready."""
    folder: Path
    """In the state folder: the password, and the data folder or a link to it."""
    ports: PortBook
    logs: Path
    home: DataHome
    """Where the data folder is (postgres_home.choose has made it ready)."""
    user: ServiceUser | None = None
    """The account the server runs as, when ferry runs as root."""
    process: ManagedProcess | None = None
    tls: ServerTls | None = None
    """Serve TLS only, with this certificate; None: the stack's usual instance, without TLS."""
    settings: tuple[str, ...] = ()
    """More server settings, `name=value` each, after the stack's own (a test's instance with a smaller lock table)."""

    @property
    def data(self) -> Path:
        """The data folder, as the server is given it."""
        return self.home.folder / self.name / "data"

    @property
    def log_path(self) -> Path:
        return self.logs / f"postgres-{self.name}.log"

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
        return str(self.bindir / name)

    def _initialize(self) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        if self.data.exists():
            shutil.rmtree(self.data)  # a half-done initdb from an interrupted start
        self.data.mkdir(mode=0o700)
        # Beside the data, where the server's user can read it (the state folder may be closed to it).
        pwfile = self.data.parent / "initdb-password"
        descriptor = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(self._password() + "\n")
        if self.user is not None:
            for path in (self.data, pwfile):
                self.user.own(path)
        argv = [
            self._tool("initdb"),
            f"--pgdata={self.data}",
            f"--username={SUPERUSER}",
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.log_path.open("ab") as log:
                log.write(f"\n--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
                log.flush()
                result = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.data.parent,
                    **as_user(self.user.name if self.user else None),
                )
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise StartError(
                f"postgres-{self.name}: initdb exited with code {result.returncode}",
                component=f"postgres-{self.name}",
                cause=cause_lines(self.log_path),
                log_path=self.log_path,
            )

    def start(self) -> ManagedProcess:
        self._initialize()
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
                *TWO_PHASE_COMMIT,
                *self._tls_settings(),
                *(LOGICAL_REPLICATION if self.name == "source" else ()),
                *(option for setting in self.settings for option in ("-c", setting)),
            ],
            user=self.user.name if self.user else None,
            cwd=self.data.parent,  # ferry's own folder may be closed to the server's user
            stop_signal=signal.SIGINT,  # "fast" shutdown: roll back open transactions, then stop
            log_path=self.log_path,
        )
        self.process.start()
        return self.process

    def _tls_settings(self) -> list[str]:
        """The server's TLS options, its certificate, key and pg_hba.conf copied where its user alone reads them."""
        if self.tls is None:
            return []
        folder = self.data.parent / "tls"
        folder.mkdir(mode=0o700, exist_ok=True)
        files = {"server.crt": self.tls.certificate.read_bytes(), "server.key": self.tls.key.read_bytes()}
        files["pg_hba.conf"] = ONLY_TLS.encode()
        for name, content in files.items():
            (folder / name).write_bytes(content)
            (folder / name).chmod(0o600)  # the server refuses a key others may read
        if self.user is not None:
            for path in (folder, *(folder / name for name in files)):
                self.user.own(path)
        settings = {
            "ssl": "on",
            "ssl_cert_file": folder / "server.crt",
            "ssl_key_file": folder / "server.key",
            "hba_file": folder / "pg_hba.conf",
            "log_connections": "on",  # each connection's line says whether it is encrypted
        }
        return [argument for name, value in settings.items() for argument in ("-c", f"{name}={value}")]

    def wait(self, timeout: float) -> None:
        port = str(self.ports.port(f"postgres-{self.name}"))

        def accepting() -> bool:
            probe = subprocess.run(
                [self._tool("pg_isready"), "-h", LOOPBACK, "-p", port, "-U", SUPERUSER, "-t", "2"],
                capture_output=True,
            )
            return probe.returncode == 0

        wait_until(f"PostgreSQL instance {self.name!r}", accepting, timeout=timeout, process=self.process)
