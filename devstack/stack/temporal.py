"""The Temporal dev server from the temporal CLI: persisted to a file, Web UI on (decoding through the codec server)."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

from devstack.stack.install import Binaries
from devstack.stack.processes import ManagedProcess, go_environment
from devstack.stack.readiness import LOOPBACK, PortBook, http_ok, wait_until
from ferry.api import search_attributes

NAMESPACE = "default"


DATABASE_FILE = "temporal.db"
"""The server's SQLite file, in its folder."""
SQLITE_PRAGMAS = ("journal_mode=wal", "synchronous=normal")
"""How the dev server keeps its SQLite file: a write-ahead log, synced at checkpoints."""


@dataclasses.dataclass
class TemporalDevServer:
    """`temporal server start-dev` with ferry's search attributes registered."""

    binaries: Binaries
    folder: Path
    ports: PortBook
    logs: Path
    codec_endpoint: str | None = None
    """The codec server the Web UI sends payloads to for decoding (from the person's browser)."""
    process: ManagedProcess | None = None

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.ports.port('temporal')}"

    @property
    def ui_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.port('temporal-ui')}"

    @property
    def ui_origins(self) -> list[str]:
        """The origins a browser shows the Web UI under: as the stack prints it, and as a person may type it."""
        return [self.ui_url, f"http://localhost:{self.ports.port('temporal-ui')}"]

    def start(self) -> ManagedProcess:
        self.folder.mkdir(parents=True, exist_ok=True)
        argv = [
            str(self.binaries.temporal),
            "server",
            "start-dev",
            f"--ip={LOOPBACK}",
            f"--port={self.ports.port('temporal')}",
            f"--ui-port={self.ports.port('temporal-ui')}",
            f"--http-port={self.ports.port('temporal-http')}",
            f"--metrics-port={self.ports.port('temporal-metrics')}",
            f"--db-filename={self.folder / DATABASE_FILE}",
            # SQLite's default journal (a rollback file made, synced and removed per transaction, and
            # readers shut out while one commits) made this server the burst's limit: 77 workflow starts
            # a second against 175 with a write-ahead log (scripts/bench_watcher.py --count 500). A
            # killed server keeps every commit; only a crash of the machine may lose the last ones.
            *(f"--sqlite-pragma={pragma}" for pragma in SQLITE_PRAGMAS),
            "--ui-disable-news-fetch",  # the stack runs offline
            "--log-level=warn",
        ]
        if self.codec_endpoint:
            argv.append(f"--ui-codec-endpoint={self.codec_endpoint}")
        for key in search_attributes.ALL:
            argv.append(f"--search-attribute={key.name}=Keyword")
        self.process = ManagedProcess(
            name="temporal", argv=argv, log_path=self.logs / "temporal.log", env=go_environment()
        )
        self.process.start()
        return self.process

    def wait(self, timeout: float) -> None:
        wait_until("Temporal dev server", self._search_attributes_registered, timeout=timeout, process=self.process)
        wait_until("Temporal Web UI", lambda: http_ok(self.ui_url), timeout=timeout, process=self.process)

    def _search_attributes_registered(self) -> bool:
        listed = subprocess.run(
            [
                str(self.binaries.temporal),
                "operator",
                "search-attribute",
                "list",
                f"--address={self.address}",
                f"--namespace={NAMESPACE}",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return listed.returncode == 0 and all(key.name in listed.stdout for key in search_attributes.ALL)
