"""Liveness and readiness over HTTP, for Kubernetes probes: GET /healthz and GET /readyz.

/healthz answers 200 while the process's event loop runs. /readyz answers 200 once the
component is connected and working (the worker polls its task queue; the watcher is
connected, leading or standing by), 503 before. The probes are served from the start,
while the component still waits for Temporal, so Kubernetes sees it alive but not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable

from ferry.startup import StartupError

log = logging.getLogger("ferry.health")


async def _serve(ready: Callable[[], bool], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request = await asyncio.wait_for(reader.readline(), timeout=5)
        parts = request.decode(errors="replace").split()
        path = parts[1] if len(parts) > 1 else ""
        if path == "/healthz":
            status, body = "200 OK", "ok"
        elif path == "/readyz":
            status, body = ("200 OK", "ready") if ready() else ("503 Service Unavailable", "not ready")
        else:
            status, body = "404 Not Found", "try /healthz or /readyz"
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n{body}".encode()
        )
        await writer.drain()
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def serving(address: str | None, ready: Callable[[], bool]) -> AsyncIterator[None]:
    """Serves the probes on host:port while the block runs; does nothing when `address` is None."""
    if address is None:
        yield
        return
    host, _, port = address.rpartition(":")
    try:
        server = await asyncio.start_server(lambda r, w: _serve(ready, r, w), host or "0.0.0.0", int(port))
    except OSError as error:
        # asyncio words a bind error its own way; the errno says it plainly. A name that does not
        # resolve has a negative errno, which only the resolver's own text explains.
        cause = os.strerror(error.errno) if error.errno and error.errno > 0 else (error.strerror or str(error))
        raise StartupError(f"cannot answer health probes on {address}: {cause}") from error
    log.info("health probes on http://%s/healthz and /readyz", address)
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()
