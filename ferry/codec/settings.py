"""The settings of `ferry codec-server`: its keys, where it listens, whom it answers."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, SecretStr
from pydantic.dataclasses import dataclass

from ferry.codec.keys import CodecKeys
from ferry.configuration.knobs import SETTINGS, Knob
from ferry.observability.settings import HostPort

MIB = 1024 * 1024


def _comma_separated(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def _origin(origin: str) -> str:
    if not re.fullmatch(r"https?://[^/\s*]+", origin):
        raise ValueError(
            f"{origin!r} is not an origin: give scheme, host and port only, e.g. https://temporal.example.com"
        )
    return origin


@dataclass(frozen=True, config=SETTINGS)
class CodecServerSettings:
    """Everything `ferry codec-server` needs; each field is a flag and a FERRY_ variable."""

    keys: Annotated[CodecKeys, Knob(flag="codec-keys")]
    """The codec keys: a folder (a mounted Secret: a file per key id holding its base64, and `current`) or a YAML
    file {current: ID, keys: {ID: BASE64}}; the same keys as the worker's and the watcher's."""
    address: Annotated[HostPort, Knob(flag="codec-server-address")] = "127.0.0.1:8081"
    """Serve POST /encode and /decode (also under /NAMESPACE/) and GET /healthz on http://ADDRESS; put TLS in front
    of it anywhere but on loopback."""
    cors_origins: Annotated[
        tuple[Annotated[str, AfterValidator(_origin)], ...],
        BeforeValidator(_comma_separated),
        Knob(flag="codec-server-cors-origins"),
    ] = ()
    """Origins of the Web UIs whose browsers may call the server, comma-separated, e.g.
    https://temporal.example.com; a request from any other origin is refused (default: none, for the CLI only)."""
    token: Annotated[SecretStr | None, Knob(flag="codec-server-token", secret=True)] = None
    """Answer only requests carrying `Authorization: Bearer TOKEN` (the CLI's --codec-auth); pass it from a Secret
    (default: no token, so keep the server where only its users reach it)."""
    max_request_size: Annotated[
        int, Knob(flag="codec-server-max-request-mib", unit=MIB, unit_name="MiB"), Field(ge=MIB)
    ] = 4 * MIB
    """Largest request body accepted; a larger one is refused with 413 (Temporal's own limit on a payload is 2 MiB)."""
    log_format: Literal["json", "text"] = "json"
    """json: one object per line; text: for a terminal."""
