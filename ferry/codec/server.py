"""`ferry codec-server`: the codec over HTTP, for the Temporal Web UI and CLI, which cannot hold ferry's keys.

Both speak Temporal's codec server protocol: POST /encode or /decode with a JSON body
`{"payloads": [...]}` (each payload in protobuf's JSON form, its bytes in base64), and the
same shape back. The CLI may put the namespace in the path (`--codec-endpoint
http://host/{namespace}`), the UI sends it as `X-Namespace`; every namespace is served with
the same keys, so it is only logged.

The UI calls from the person's browser, so the UI's origin must be allowed (CORS): a
preflight from an origin not listed, or a request carrying such an Origin, is refused.
With a token set, every request but a preflight and /healthz needs `Authorization: Bearer
TOKEN`. Request bodies are bounded, so one request cannot take the server's memory.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads

from ferry.codec.encryption import EncryptionCodec
from ferry.codec.errors import CodecError
from ferry.codec.keys import load_keys
from ferry.codec.settings import CodecServerSettings
from ferry.startup import StartupError

log = logging.getLogger("ferry.codec")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Transform = Callable[[Sequence[Payload]], Awaitable[list[Payload]]]

PREFLIGHT_MAX_AGE = "600"
"""Seconds a browser may reuse a preflight's answer."""


def application(codec: EncryptionCodec, settings: CodecServerSettings) -> web.Application:
    """The codec server's routes, behind its CORS and token checks."""
    app = web.Application(
        client_max_size=settings.max_request_size, middlewares=[_cors(settings.cors_origins), _bearer(settings)]
    )
    for prefix in ("", "/{namespace}"):
        app.router.add_post(f"{prefix}/encode", _endpoint(codec.encode, settings))
        app.router.add_post(f"{prefix}/decode", _endpoint(codec.decode, settings))
    app.router.add_get("/healthz", _healthz)
    return app


def _cors(origins: tuple[str, ...]) -> Middleware:
    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is not None and origin not in origins:
            log.warning("refused a request from origin %s, which --codec-server-cors-origins does not list", origin)
            return web.Response(status=403, text=f"origin {origin} is not allowed (--codec-server-cors-origins)\n")
        if request.method == "OPTIONS":
            wanted = request.headers.get("Access-Control-Request-Method")
            if origin is None or wanted is None:
                return web.Response(status=400, text="OPTIONS here is a CORS preflight: send Origin and "
                                    "Access-Control-Request-Method\n")  # fmt: skip
            response: web.StreamResponse = web.Response(status=204)
            response.headers.update({
                "Access-Control-Allow-Methods": "POST, OPTIONS",
                "Access-Control-Allow-Headers": "Authorization, Content-Type, X-Namespace",
                "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
            })  # fmt: skip
        else:
            try:
                response = await handler(request)
            except web.HTTPException as error:  # no route, wrong method: answered with the CORS headers too
                response = web.Response(status=error.status, text=f"{error.reason}\n")
        response.headers["Server"] = "ferry"  # rather than aiohttp's name and version
        if origin is not None:
            response.headers.update({
                "Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true", "Vary": "Origin",
            })  # fmt: skip
        return response

    return cors


def _bearer(settings: CodecServerSettings) -> Middleware:
    expected = f"Bearer {settings.token.get_secret_value()}".encode() if settings.token else None

    @web.middleware
    async def bearer(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is not None and request.path != "/healthz":
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                log.warning("refused a request to %s without the codec server's bearer token", request.path)
                return web.Response(
                    status=401,
                    text="this codec server wants `Authorization: Bearer TOKEN` (temporal --codec-auth)\n",
                    headers={"WWW-Authenticate": 'Bearer realm="ferry codec server"'},
                )
        return await handler(request)

    return bearer


def _endpoint(transform: Transform, settings: CodecServerSettings) -> Handler:
    async def endpoint(request: web.Request) -> web.StreamResponse:
        namespace = request.match_info.get("namespace") or request.headers.get("X-Namespace", "")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            limit = settings.max_request_size // (1024 * 1024)
            return web.Response(status=413, text=f"the request is larger than {limit} MiB "
                                f"(--codec-server-max-request-mib)\n")  # fmt: skip
        try:
            payloads = json_format.Parse(body, Payloads())
        except (json_format.ParseError, UnicodeDecodeError) as error:
            return web.Response(status=400, text=f'the body is not {{"payloads": [...]}} as JSON: {error}\n')
        try:
            done = await transform(payloads.payloads)
        except CodecError as error:
            log.warning("%s for namespace %s: %s", request.path, namespace or "(not named)", error)
            return web.Response(status=422, text=f"{error}\n")
        log.debug("%s of %d payloads for namespace %s", request.path, len(done), namespace or "(not named)")
        return web.json_response(json_format.MessageToDict(Payloads(payloads=done)))

    return endpoint


async def _healthz(request: web.Request) -> web.StreamResponse:
    return web.Response(text="ok")


async def serve(settings: CodecServerSettings, stop: asyncio.Event) -> None:
    """Serves the codec until `stop` is set; a StartupError says why it could not start."""
    keys = load_keys(settings.keys)
    runner = web.AppRunner(application(EncryptionCodec(keys), settings), access_log=None)
    await runner.setup()
    host, _, port = settings.address.rpartition(":")
    try:
        await web.TCPSite(runner, host or "0.0.0.0", int(port)).start()
    except OSError as error:
        await runner.cleanup()
        cause = os.strerror(error.errno) if error.errno and error.errno > 0 else (error.strerror or str(error))
        raise StartupError(f"cannot serve the codec on {settings.address}: {cause}") from error
    origins = ", ".join(settings.cors_origins) or "none (the CLI only)"
    log.info(
        "codec server on http://%s (keys %s, current %s; CORS origins: %s; bearer token %s)",
        settings.address, keys.source, keys.current, origins, "required" if settings.token else "not required",
    )  # fmt: skip
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
