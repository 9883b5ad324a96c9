"""Temporal for the plugin: where it is (optional for status, needed for history) and what the plugin reads there.

The flags and variables are the worker's and the watcher's own (`--temporal-address`,
FERRY_TEMPORAL_ADDRESS, TLS, API key, `--codec-keys`), declared once in
ferry.clients.TemporalSettings. Only an address someone gave counts: the plugin never
guesses one. With codec keys, what the plugin reads is decrypted here; without them, an
encrypted history still gives its steps and times, but not its messages.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field
from pydantic.dataclasses import dataclass
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from ferry.api.saga import KubeActivity
from ferry.clients import TemporalSettings, connect_temporal
from ferry.codec.encryption import is_sealed
from ferry.codec.errors import CodecError
from ferry.codec.events import decode_events
from ferry.configuration.knobs import SETTINGS, Group, options
from ferry.configuration.loading import SettingsError, load
from ferry.kubectl.errors import PluginError


@dataclass(frozen=True, config=SETTINGS)
class TemporalAccess:
    """How the plugin reaches Temporal: the knobs of the worker and the watcher."""

    temporal: Annotated[TemporalSettings, Group("Temporal (progress for status, history)", prefix="temporal-")] = Field(
        default_factory=TemporalSettings
    )


_ADDRESS = next(option for option in options(TemporalAccess) if option.path == ("temporal", "address"))
_NAMESPACE = next(option for option in options(TemporalAccess) if option.path == ("temporal", "namespace"))


def _given(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    return {option.dest: getattr(args, option.dest) for option in options(TemporalAccess) if hasattr(args, option.dest)}


def settings_from(
    args: argparse.Namespace, environ: Mapping[str, str], workflow_namespace: str | None
) -> TemporalSettings | None:
    """The Temporal settings from the flags and variables; None when no address was given.

    The Temporal namespace defaults to the one the Migration's status names.
    """
    given = _given(args, environ)
    if _ADDRESS.dest not in given and not any(environ.get(name) for name in _ADDRESS.env):
        return None
    if workflow_namespace and _NAMESPACE.dest not in given and not any(environ.get(n) for n in _NAMESPACE.env):
        given[_NAMESPACE.dest] = workflow_namespace
    try:
        return load(TemporalAccess, given, environ).temporal
    except SettingsError as error:
        raise PluginError(str(error)) from None


NO_ADDRESS = (
    "no Temporal address: pass --temporal-address HOST:PORT or set FERRY_TEMPORAL_ADDRESS "
    "(the address ferry's worker and watcher use)"
)


async def connect(settings: TemporalSettings) -> Client:
    try:
        return await connect_temporal(settings)
    except (RPCError, RuntimeError, OSError) as error:
        why = " ".join(str(error).split())
        raise PluginError(
            f"cannot reach Temporal at {settings.address} (namespace {settings.namespace}): {why}"
        ) from None


async def heartbeat(client: Client, workflow_id: str) -> dict[str, Any] | None:
    """The latest heartbeat details of the workflow's running step activity, if any (best effort)."""
    try:
        description = await client.get_workflow_handle(workflow_id).describe()
    except RPCError:
        return None
    for pending in description.raw_description.pending_activities:
        if pending.activity_type.name != KubeActivity.MIRROR_STATUS and pending.heartbeat_details.payloads:
            details = pending.heartbeat_details.payloads
            if client.data_converter.payload_codec is None and any(is_sealed(payload) for payload in details):
                return None  # encrypted, and no key to read it: the status shows no progress
            try:
                values = await client.data_converter.decode(details)
            except CodecError as error:
                raise PluginError(f"cannot read the running step's progress: {error}") from None
            if values and isinstance(values[0], dict):
                return values[0]
    return None


async def history_events(client: Client, workflow_id: str) -> list[HistoryEvent]:
    """Every event of the workflow's latest run, decrypted when the client has codec keys; or a PluginError saying
    why there is none."""
    handle: WorkflowHandle[Any, Any] = client.get_workflow_handle(workflow_id)
    try:
        events = [event async for event in handle.fetch_history_events()]
    except RPCError as error:
        raise PluginError(f"Temporal has no history of workflow {handle.id}: {error.message}") from None
    codec = client.data_converter.payload_codec
    if codec is not None:
        try:
            await decode_events(codec, events)
        except CodecError as error:
            raise PluginError(f"cannot decrypt the history of workflow {handle.id}: {error}") from None
    return events
