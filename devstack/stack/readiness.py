"""Waiting for a component to come up, and saying clearly when it did not.

Ports are chosen free on loopback and remembered per state folder, so a stack that
is stopped and started again keeps its addresses (and its kubeconfig) when it can.
"""

from __future__ import annotations

import json
import random
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from devstack.stack.errors import StartError
from devstack.stack.logtail import cause_lines
from devstack.stack.processes import ManagedProcess

LOOPBACK = "127.0.0.1"


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def listening_range() -> tuple[int, int]:
    """Ports for servers: below the kernel's ephemeral range (or above it), never inside it.

    A port inside the ephemeral range can be taken by any outgoing connection between the
    moment it is found free and the moment its server binds it (the chaos run saw its codec
    server refused this way); outside it, only another listener can take it.
    """
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    if low > 16000:
        return 15000, low - 1
    if high < 64000:
        return high + 1, 65535
    return 0, 0


def free_port() -> int:
    low, high = listening_range()
    if high:
        for _ in range(500):
            port = random.randint(low, high)
            if port_is_free(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


class PortBook:
    """Named loopback ports of one state folder, kept across restarts while they stay free."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.previous: dict[str, int] = json.loads(path.read_text()) if path.exists() else {}
        self.current: dict[str, int] = {}

    def port(self, name: str) -> int:
        if name not in self.current:
            wanted = self.previous.get(name)
            taken = set(self.current.values())
            if wanted is None or wanted in taken or not port_is_free(wanted):
                wanted = free_port()
                while wanted in taken:
                    wanted = free_port()
            self.current[name] = wanted
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({**self.previous, **self.current}, indent=1))
        return self.current[name]


def wait_until(
    what: str,
    check: Callable[[], bool],
    *,
    timeout: float,
    process: ManagedProcess | None = None,
    interval: float = 0.2,
) -> None:
    """Polls `check` until it returns True; raises StartError naming `what` otherwise.

    Exceptions from `check` count as "not yet" and the last one is reported. When the
    component's process exits meanwhile, the wait ends at once; either way the error
    carries the last meaningful lines of its log and the log's path.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        if process is not None:
            process.check_alive()
        try:
            if check():
                return
        except Exception as error:  # noqa: BLE001 - any failure means "not ready yet"
            last_error = error
        if time.monotonic() >= deadline:
            detail = f" (last error: {_one_line(last_error)})" if last_error else ""
            raise StartError(
                f"{what} was not ready after {timeout:.0f}s{detail}",
                component=process.name if process else None,
                cause=cause_lines(process.log_path) if process else (),
                log_path=process.log_path if process else None,
            )
        time.sleep(interval)


def _one_line(error: BaseException, width: int = 160) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= width else text[: width - 1] + "…"


def http_ok(url: str, *, context: ssl.SSLContext | None = None, expect: bytes | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            body = response.read()
            return response.status == 200 and (expect is None or expect in body)
    except urllib.error.HTTPError:
        return False


def tcp_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        return probe.connect_ex((LOOPBACK, port)) == 0
