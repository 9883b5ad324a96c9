"""`ferry codec-server` as the Web UI and the temporal CLI meet it: a real process, spoken to over HTTP.

The server runs with a bearer token, one allowed Web UI origin and a small request bound,
and every request is what a browser or the CLI would send: the protocol's JSON, CORS
preflights, an Authorization header or none.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads

from devstack.stack.readiness import LOOPBACK, free_port, http_ok
from ferry.codec.encryption import ENCODING, KEY_ID, EncryptionCodec
from ferry.codec.keys import load_keys
from tests.processes import FerryProcess, start_ferry, wait_until

TOKEN = "codec-token-5e1d"
UI = "http://127.0.0.1:8233"
"""The one Web UI origin the server allows."""
STARTED = 120.0
"""Seconds the server may take to answer /healthz: a Python process starting on a busy machine."""


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("codec-keys")
    (folder / "k1").write_text(base64.b64encode(os.urandom(32)).decode())
    (folder / "current").write_text("k1")
    return folder


@pytest.fixture(scope="module")
def server(keys: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The codec server's URL; it wants TOKEN, allows UI, and takes at most 1 MiB a request."""
    url = f"http://{LOOPBACK}:{free_port()}"
    process: FerryProcess = start_ferry(
        "codec-server", f"--codec-server-address={url.removeprefix('http://')}", "--codec-server-max-request-mib=1",
        log_path=tmp_path_factory.mktemp("logs") / "codec-server.log",
        FERRY_CODEC_KEYS=str(keys), FERRY_CODEC_SERVER_TOKEN=TOKEN, FERRY_CODEC_SERVER_CORS_ORIGINS=UI,
    )  # fmt: skip
    try:
        wait_until("the codec server to answer /healthz", lambda: _answers(f"{url}/healthz"), STARTED, process)
        yield url
    finally:
        process.stop()


def _answers(url: str) -> bool:
    try:
        return http_ok(url)
    except OSError:  # not listening yet
        return False


def _call(url: str, method: str = "POST", body: bytes = b"", **headers: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body if method == "POST" else None, method=method)
    for name, value in headers.items():
        request.add_header(name.replace("_", "-"), value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def _body(*payloads: Payload) -> bytes:
    return json_format.MessageToJson(Payloads(payloads=payloads)).encode()


def _payloads(body: bytes) -> list[Payload]:
    return list(json_format.Parse(body, Payloads()).payloads)


PLAIN = Payload(metadata={"encoding": b"json/plain"}, data=b'{"sourceSecret": "orders-db-source"}')


def test_without_the_bearer_token_the_server_refuses_and_with_it_it_encrypts_and_decrypts(server: str) -> None:
    refused, headers, said = _call(f"{server}/decode", body=_body(PLAIN))
    wrong, _, _ = _call(f"{server}/decode", body=_body(PLAIN), Authorization="Bearer not-the-token")

    encoded_status, _, encoded = _call(f"{server}/encode", body=_body(PLAIN), Authorization=f"Bearer {TOKEN}")
    decoded_status, _, decoded = _call(
        f"{server}/default/decode", body=encoded, Authorization=f"Bearer {TOKEN}", X_Namespace="default"
    )

    assert (refused, wrong) == (401, 401)
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert b"Authorization: Bearer TOKEN" in said
    assert (encoded_status, decoded_status) == (200, 200)
    (sealed,) = _payloads(encoded)
    assert sealed.metadata["encoding"] == ENCODING
    assert sealed.metadata[KEY_ID] == b"k1"
    assert b"orders-db-source" not in sealed.data
    assert _payloads(decoded) == [PLAIN]


def test_a_preflight_is_answered_for_the_web_uis_origin_only(server: str) -> None:
    asked = {"Access_Control_Request_Method": "POST", "Access_Control_Request_Headers": "content-type,x-namespace"}

    allowed, allowed_headers, _ = _call(f"{server}/decode", "OPTIONS", Origin=UI, **asked)
    other, other_headers, said = _call(f"{server}/decode", "OPTIONS", Origin="https://elsewhere.example", **asked)
    posted, posted_headers, _ = _call(
        f"{server}/decode", body=_body(PLAIN), Origin="https://elsewhere.example", Authorization=f"Bearer {TOKEN}"
    )

    assert allowed == 204
    assert allowed_headers["Access-Control-Allow-Origin"] == UI
    assert "POST" in allowed_headers["Access-Control-Allow-Methods"]
    assert {"content-type", "x-namespace", "authorization"} <= {
        name.strip().lower() for name in allowed_headers["Access-Control-Allow-Headers"].split(",")
    }
    assert other == 403
    assert "Access-Control-Allow-Origin" not in other_headers
    assert b"https://elsewhere.example is not allowed" in said
    assert posted == 403
    assert "Access-Control-Allow-Origin" not in posted_headers


def test_the_web_uis_origin_is_allowed_to_read_the_answer_of_a_decode(server: str) -> None:
    status, headers, _ = _call(f"{server}/decode", body=_body(PLAIN), Origin=UI, Authorization=f"Bearer {TOKEN}")

    assert status == 200
    assert headers["Access-Control-Allow-Origin"] == UI


def test_a_request_over_the_bound_is_refused_before_it_is_read_whole(server: str) -> None:
    big = Payload(metadata={"encoding": b"binary/plain"}, data=os.urandom(1024 * 1024))

    status, _, said = _call(f"{server}/encode", body=_body(big), Authorization=f"Bearer {TOKEN}")

    assert status == 413
    assert b"larger than 1 MiB" in said


async def test_a_payload_of_a_key_the_server_does_not_have_is_refused_naming_that_key(server: str, keys: Path) -> None:
    ring = load_keys(keys)
    other = type(ring)(current="retired-2024", keys={"retired-2024": os.urandom(32)}, source="elsewhere")
    (sealed,) = await EncryptionCodec(other).encode([PLAIN])

    status, _, said = _call(f"{server}/decode", body=_body(sealed), Authorization=f"Bearer {TOKEN}")
    malformed, _, _ = _call(f"{server}/decode", body=b"{not json", Authorization=f"Bearer {TOKEN}")

    assert status == 422
    assert "codec key 'retired-2024', which is not among the keys" in said.decode()
    assert malformed == 400


def test_health_needs_no_token(server: str) -> None:
    status, _, body = _call(f"{server}/healthz", "GET")

    assert (status, json.dumps(body.decode())) == (200, '"ok"')
