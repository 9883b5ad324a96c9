"""The stack's payload encryption: a codec key made once per state folder, and `ferry codec-server` for the Web UI.

The key lives in the state folder, laid out as a Kubernetes Secret is mounted (a file per
key id and `current`), so the worker and the watcher of `make up` read it exactly as they
do in a cluster, and a stack started again on the same folder still reads what it wrote.
The codec server lets the stack's Web UI, whose origin it allows, show decoded payloads.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import sys
from pathlib import Path

from devstack.stack.processes import ManagedProcess
from devstack.stack.readiness import LOOPBACK, PortBook, http_ok, wait_until
from ferry.codec.keys import CURRENT, KEY_BYTES

KEY_ID = "devstack-1"
"""The id of the key a new state folder gets."""


def ensure_keys(folder: Path) -> Path:
    """The state folder's key folder, with a new random key the first time; only its owner may read it."""
    if not (folder / CURRENT).exists():
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = folder / KEY_ID
        key.write_text(base64.b64encode(os.urandom(KEY_BYTES)).decode() + "\n")
        key.chmod(0o600)
        (folder / CURRENT).write_text(KEY_ID + "\n")
    return folder


@dataclasses.dataclass
class CodecServer:
    """`ferry codec-server` on loopback with the state folder's keys, answering the given Web UI origins."""

    keys: Path
    ports: PortBook
    logs: Path
    process: ManagedProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.port('codec-server')}"

    def start(self, ui_origins: list[str]) -> ManagedProcess:
        argv = [
            sys.executable, "-m", "ferry.cli", "codec-server", f"--codec-keys={self.keys}",
            f"--codec-server-address={LOOPBACK}:{self.ports.port('codec-server')}",
            f"--codec-server-cors-origins={','.join(ui_origins)}", "--log-format=text",
        ]  # fmt: skip
        # Only the flags above configure it: none of the caller's FERRY_ variables (a token, say) leaks in.
        environment = {name: value for name, value in os.environ.items() if not name.startswith("FERRY_")}
        self.process = ManagedProcess(
            name="codec-server", argv=argv, log_path=self.logs / "codec-server.log", env=environment
        )
        self.process.start()
        return self.process

    def wait(self, timeout: float) -> None:
        wait_until("codec server", lambda: http_ok(f"{self.endpoint}/healthz"), timeout=timeout, process=self.process)
