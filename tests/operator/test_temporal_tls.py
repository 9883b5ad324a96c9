"""ferry reaches Temporal over TLS and mutual TLS, and a handshake that fails is a startup error saying what to fix.

The Temporal dev server has no TLS of its own (`temporal server start-dev --help` lists no
such option), so the stack's server sits behind a TLS-terminating proxy (tests/tls_proxy.py)
with a certificate for 127.0.0.1 and localhost from a CA made here; for mutual TLS the
proxy also requires a client certificate from that CA. Retrying never fixes a certificate
that does not verify or a missing client certificate, so the component stops at once
with one line, instead of waiting for Temporal as it does for one that is down.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest

from devstack.stack.pki import ClientIdentity, Pki
from devstack.stack.readiness import LOOPBACK, free_port
from devstack.stack.stack import StackInfo
from ferry.clients import TemporalSettings
from ferry.startup import StartupError, wait_for_temporal
from tests.processes import start_ferry
from tests.tls_proxy import Seen, server_context, tls_proxy

WORKER = ClientIdentity("ferry-worker", "ferry-worker")
FRONTEND_NAMES = [LOOPBACK, "localhost"]
REFUSED_WITHIN = 30.0
"""Seconds a failed handshake may take to become a StartupError; waiting for Temporal would go on for ever."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """The CA of Temporal's frontend certificate and of ferry's client certificate."""
    return Pki(tmp_path_factory.mktemp("temporal-pki"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA that signed nothing Temporal presents."""
    other = Pki(tmp_path_factory.mktemp("other-pki"))
    other.ensure_ca()
    return other.ca_cert


@pytest.fixture
def tls_temporal(stack: StackInfo, pki: Pki) -> Iterator[tuple[str, Seen]]:
    """The stack's Temporal behind TLS: (address, what the proxy saw)."""
    assert stack.temporal_address is not None
    certificate, key = pki.serving("temporal-frontend", FRONTEND_NAMES)
    with tls_proxy(stack.temporal_address, server_context(certificate, key)) as served:
        yield served


@pytest.fixture
def mtls_temporal(stack: StackInfo, pki: Pki) -> Iterator[tuple[str, Seen]]:
    """The stack's Temporal behind mutual TLS: a client certificate from the stack's CA is required."""
    assert stack.temporal_address is not None
    certificate, key = pki.serving("temporal-frontend", FRONTEND_NAMES)
    with tls_proxy(stack.temporal_address, server_context(certificate, key, client_ca=pki.ca_cert)) as served:
        yield served


async def _connect(settings: TemporalSettings) -> object:
    return await asyncio.wait_for(
        wait_for_temporal(settings, asyncio.Event(), identity="tls-test", runtime=None, interceptors=()),
        REFUSED_WITHIN,
    )


async def test_with_the_ca_that_signed_the_frontends_certificate_ferry_works_over_tls(
    stack: StackInfo, pki: Pki, tls_temporal: tuple[str, Seen]
) -> None:
    address, seen = tls_temporal
    namespace = stack.temporal_namespace or "default"
    settings = TemporalSettings(address=address, namespace=namespace, tls_ca=pki.ca_cert)

    client = await wait_for_temporal(settings, asyncio.Event(), identity="tls-test", runtime=None, interceptors=())

    assert client is not None
    described = await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=namespace))
    assert described.namespace_info.name == namespace
    assert [run async for run in client.list_workflows("WorkflowId = 'no-such-run'")] == []
    assert seen.handshakes >= 1, "the calls went through the TLS proxy"


async def test_a_ca_that_did_not_sign_the_frontends_certificate_is_a_startup_error(
    other_ca: Path, tls_temporal: tuple[str, Seen]
) -> None:
    address, _ = tls_temporal

    with pytest.raises(StartupError) as raised:
        await _connect(TemporalSettings(address=address, tls_ca=other_ca))

    message = str(raised.value)
    assert message.startswith(
        f"the certificate of Temporal at {address} could not be verified with the CA in --temporal-tls-ca "
        f"({other_ca}): InvalidCertificate("
    )
    assert "Point --temporal-tls-ca (FERRY_TEMPORAL_TLS_CA) at the CA that signed the frontend's certificate" in message


async def test_mutual_tls_refuses_ferry_without_a_client_certificate_and_takes_it_with_one(
    pki: Pki, mtls_temporal: tuple[str, Seen]
) -> None:
    address, seen = mtls_temporal

    with pytest.raises(StartupError) as raised:
        await _connect(TemporalSettings(address=address, tls_ca=pki.ca_cert))
    certificate, key = pki.client(WORKER)
    client = await _connect(TemporalSettings(address=address, tls_ca=pki.ca_cert, tls_cert=certificate, tls_key=key))

    assert str(raised.value).startswith(
        f"Temporal at {address} refused the TLS handshake (AlertReceived(HandshakeFailure)): it wants a client "
        "certificate (mutual TLS). Set --temporal-tls-cert and --temporal-tls-key"
    )
    assert client is not None
    assert seen.client_subjects == ["ferry-worker"]


def test_the_worker_with_a_wrong_ca_exits_at_once_saying_why_in_one_line(
    stack: StackInfo, other_ca: Path, tls_temporal: tuple[str, Seen], tmp_path: Path
) -> None:
    address, _ = tls_temporal
    process = start_ferry(
        "worker", log_path=tmp_path / "worker.log", FERRY_TEMPORAL_ADDRESS=address,
        FERRY_TEMPORAL_TLS_CA=str(other_ca), FERRY_KUBECONFIG=str(stack.kubeconfig),
        FERRY_HEALTH_ADDRESS=f"{LOOPBACK}:{free_port()}",
    )  # fmt: skip

    try:
        code = process.popen.wait(REFUSED_WITHIN + 30)  # its own start takes a few seconds more
    except subprocess.TimeoutExpired:
        process.stop(signal.SIGKILL)
        raise AssertionError(f"the worker did not stop:\n{process.log()}") from None

    log = process.log()
    assert code == 1, log
    assert "Traceback" not in log
    last = json.loads(log.splitlines()[-1])
    assert last["level"] == "ERROR"
    assert last["message"].startswith(f"the certificate of Temporal at {address} could not be verified")
    assert "is not reachable" not in log, "a certificate that does not verify is not waited out"
