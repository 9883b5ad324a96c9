"""Starting the worker or the watcher: wait for Temporal, and turn what cannot be waited for into one line.

Temporal may come up after ferry (a cluster starting, a compose file, an outage): the
component keeps trying, with backoff, and says so once. What waiting cannot fix (a
kubeconfig that does not load, a port already taken, a TLS handshake that fails) is a
StartupError: the `ferry` command prints its message, one line, and exits non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client, Interceptor
from temporalio.exceptions import TemporalError
from temporalio.runtime import Runtime

from ferry.clients import TemporalSettings, connect_temporal, kubernetes_client
from ferry.observability.metrics import prometheus_runtime

log = logging.getLogger("ferry.startup")

FIRST_RETRY = 1.0
"""Seconds before the second attempt to reach Temporal; each later wait doubles, up to LAST_RETRY."""
LAST_RETRY = 30.0


class StartupError(Exception):
    """The component cannot start; the message says why, in one line."""


async def wait_for_temporal(
    settings: TemporalSettings,
    stop: asyncio.Event,
    *,
    identity: str,
    runtime: Runtime | None,
    interceptors: Sequence[Interceptor],
) -> Client | None:
    """A client once Temporal answers, trying again with backoff meanwhile; None if `stop` is set first."""
    started = time.monotonic()
    delay = FIRST_RETRY
    waiting = False
    while not stop.is_set():
        connecting = asyncio.ensure_future(
            connect_temporal(settings, identity=identity, runtime=runtime, interceptors=interceptors)
        )
        try:
            client = await _unless_stopped(connecting, stop)
        except RuntimeError as error:  # the SDK's "Failed client connect: ..." for a server it cannot reach
            refused = tls_failure(settings, error)
            if refused is not None:  # it answered, and its TLS and ours disagree: waiting changes nothing
                raise refused from error
            if not waiting:
                log.warning(
                    "Temporal at %s is not reachable (%s); trying again with backoff, up to %.0fs apart, until it is",
                    settings.address,
                    reason(error),
                    LAST_RETRY,
                )
                waiting = True
            else:
                log.debug("Temporal at %s is still not reachable: %s", settings.address, reason(error))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
            delay = min(delay * 2, LAST_RETRY)
            continue
        except TemporalError as error:  # it answered, and refused: e.g. a wrong API key
            raise StartupError(f"Temporal at {settings.address} refused the connection: {error}") from error
        except ValueError as error:  # the SDK's "invalid target URL: ..." for an address it cannot parse
            raise StartupError(f"cannot connect to Temporal at {settings.address!r}: {error}") from error
        if client is None:
            break
        waited = f" after {time.monotonic() - started:.0f}s" if waiting else ""
        log.info("connected to Temporal at %s (namespace %s)%s", settings.address, settings.namespace, waited)
        return client
    log.info("stopped while waiting for Temporal at %s", settings.address)
    return None


async def _unless_stopped(connecting: asyncio.Future[Client], stop: asyncio.Event) -> Client | None:
    stopping = asyncio.ensure_future(stop.wait())
    either: set[asyncio.Future[Any]] = {connecting, stopping}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if connecting.done():
        return connecting.result()
    connecting.cancel()
    with contextlib.suppress(asyncio.CancelledError, RuntimeError):
        await connecting
    return None


def reason(error: RuntimeError) -> str:
    """The innermost cause the SDK's transport error quotes, e.g. "Connection refused"."""
    quoted = re.findall(r'(?:message|error): "([^"]+)"', str(error))
    return quoted[-1] if quoted else str(error)


_TLS_ERROR = re.compile(r"\b(InvalidCertificate|AlertReceived)\(\w+\)|\bInvalidMessage\(InvalidContentType\)")
"""How the SDK's TLS library (rustls) names a failed handshake: a certificate it does not trust (e.g.
InvalidCertificate(UnknownIssuer)), a refusal from the server (AlertReceived(CertificateRequired)), or an answer
that is no TLS (InvalidMessage(InvalidContentType))."""


def tls_failure(settings: TemporalSettings, error: RuntimeError) -> StartupError | None:
    """The StartupError for a TLS handshake with Temporal that failed, saying which setting to fix; else None."""
    found = _TLS_ERROR.search(str(error))
    if found is None:
        return None
    detail = found.group(0)
    kind = detail.split("(", 1)[0]
    address = settings.address
    if kind == "InvalidCertificate":
        trusted = f"the CA in --temporal-tls-ca ({settings.tls_ca})" if settings.tls_ca else "the system's CAs"
        return StartupError(
            f"the certificate of Temporal at {address} could not be verified with {trusted}: {detail}. Point "
            "--temporal-tls-ca (FERRY_TEMPORAL_TLS_CA) at the CA that signed the frontend's certificate, and "
            "--temporal-address at a name that certificate holds"
        )
    if kind == "AlertReceived":
        if settings.tls_cert is None:
            return StartupError(
                f"Temporal at {address} refused the TLS handshake ({detail}): it wants a client certificate (mutual "
                "TLS). Set --temporal-tls-cert and --temporal-tls-key (FERRY_TEMPORAL_TLS_CERT, _KEY) to a "
                "certificate signed by a CA the frontend trusts"
            )
        return StartupError(
            f"Temporal at {address} refused the TLS handshake ({detail}) with the client certificate "
            f"{settings.tls_cert}: give one signed by a CA the frontend trusts for clients"
        )
    return StartupError(
        f"Temporal at {address} does not answer TLS ({detail}): point --temporal-address at its TLS port, or "
        "connect without TLS (no --temporal-tls-* and no --temporal-api-key)"
    )


UNREACHABLE = ("code: Unavailable", "tcp connect error", "Connection refused", "transport error")


def unreachable(error: RuntimeError) -> bool:
    """Whether the SDK's error says the server could not be reached (rather than that it refused something)."""
    text = str(error)
    return any(sign in text for sign in UNREACHABLE)


def metrics_runtime(address: str | None, component: str) -> Runtime | None:
    """The Temporal runtime serving Prometheus metrics at `address`; None when metrics are off."""
    if address is None:
        return None
    try:
        return prometheus_runtime(address, component)
    except (ValueError, RuntimeError) as error:  # e.g. "Failed starting Prometheus exporter: Address already in use"
        raise StartupError(f"cannot serve metrics on {address}: {str(error).split(': ', 1)[-1]}") from error


def kubernetes_api(kubeconfig: Path | None, *, connections: int) -> k8s.ApiClient:
    """The Kubernetes API client, or a StartupError saying why the configuration does not load."""
    try:
        return kubernetes_client(kubeconfig, connections=connections)
    except Exception as error:  # the loader fails in many ways (YAML, missing keys, files): each is a cause
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster configuration or ~/.kube/config"
        cause = " ".join(str(error).split()) or type(error).__name__
        raise StartupError(f"cannot load the Kubernetes configuration ({where}): {cause}") from error
