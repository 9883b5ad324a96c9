"""A TLS-terminating TCP proxy, for testing clients against TLS and mutual TLS where the server has neither.

The Temporal dev server (`temporal server start-dev`) has no TLS options, so the tests put
this in front of it: it accepts TLS on a loopback port with a certificate from the test's
CA (requiring a client certificate from that CA for mutual TLS, when given one), and
forwards the decrypted bytes to the plaintext server. It speaks no gRPC itself; it
offers HTTP/2 in ALPN, as a gRPC server does.

Plain threads and blocking sockets, not asyncio: a handshake that fails then ends with
OpenSSL's alert on the wire, as a real server's does, where asyncio drops the connection
without one. A thread per connection is plenty for a test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

from devstack.stack.readiness import LOOPBACK


@dataclasses.dataclass
class Seen:
    """What the proxy saw of its clients."""

    handshakes: int = 0
    """TLS handshakes that succeeded."""
    refused: list[str] = dataclasses.field(default_factory=list)
    """Why each failed handshake failed, as OpenSSL says it."""
    client_subjects: list[str] = dataclasses.field(default_factory=list)
    """The common name of each client certificate presented, in order."""


def server_context(certificate: Path, key: Path, *, client_ca: Path | None = None) -> ssl.SSLContext:
    """TLS with `certificate`; with `client_ca`, a client certificate signed by it is required (mutual TLS).

    Mutual TLS is offered up to TLS 1.2 only: there the server refuses a client without a
    certificate during the handshake, so the client hears it as an alert, as from a Go
    server (Temporal's) in TLS 1.3. OpenSSL in TLS 1.3 would refuse only after the client
    thinks the handshake done, which a client reports as a closed connection instead.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certificate, key)
    context.set_alpn_protocols(["h2"])
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


@contextlib.contextmanager
def tls_proxy(upstream: str, context: ssl.SSLContext) -> Iterator[tuple[str, Seen]]:
    """Serves TLS on a free loopback port, forwarding to `upstream` (host:port); yields (its host:port, Seen)."""
    host, port = upstream.rsplit(":", 1)
    seen = Seen()
    listening = socket.create_server((LOOPBACK, 0))
    open_sockets: set[socket.socket] = set()
    lock = threading.Lock()

    def pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def serve(raw: socket.socket) -> None:
        raw.settimeout(10)  # for the handshake
        try:
            client = context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError) as error:
            seen.refused.append(str(error))
            raw.close()
            return
        client.settimeout(None)
        seen.handshakes += 1
        peer = client.getpeercert()
        if peer:
            seen.client_subjects += [value for rdn in peer["subject"] for name, value in rdn if name == "commonName"]
        try:
            server = socket.create_connection((host, int(port)), timeout=10)
        except OSError:
            client.close()
            return
        server.settimeout(None)
        with lock:
            open_sockets.update((client, server))
        back = threading.Thread(target=pump, args=(server, client), daemon=True)
        back.start()
        pump(client, server)
        back.join()
        for end in (client, server):
            end.close()
        with lock:
            open_sockets.difference_update((client, server))

    def accept() -> None:
        while True:
            try:
                raw, _ = listening.accept()
            except OSError:
                return  # closed: the proxy stops
            threading.Thread(target=serve, args=(raw,), name="tls-proxy-connection", daemon=True).start()

    acceptor = threading.Thread(target=accept, name="tls-proxy", daemon=True)
    acceptor.start()
    try:
        yield f"{LOOPBACK}:{listening.getsockname()[1]}", seen
    finally:
        with contextlib.suppress(OSError):
            listening.shutdown(socket.SHUT_RDWR)  # wakes the accept
        listening.close()
        acceptor.join(timeout=10)
        with lock:
            for end in open_sockets:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
