"""Decoding a history fetched as Temporal stores it: every sealed payload opened, every encoded failure spelled out.

The SDK decodes what a client asks for by name (a result, a heartbeat, a query's answer),
but history events come back as stored. The kubectl plugin reads failure messages and
controls from them, so it decodes them here first: each payload the codec sealed is opened
in place, and a failure whose message and stack trace were moved into its encoded
attributes (so that they are encrypted too) gets them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.converter import PayloadCodec, PayloadConverter

from ferry.codec.encryption import is_sealed


def messages(root: Message) -> Iterator[Message]:
    """`root` and every message inside it, depth first (map values and repeated fields included)."""
    yield root
    for field, value in root.ListFields():
        kind = field.message_type
        if kind is None:
            continue
        if kind.GetOptions().map_entry:
            if kind.fields_by_name["value"].type != FieldDescriptor.TYPE_MESSAGE:
                continue
            items: Iterable[Any] = value.values()
        elif field.is_repeated:
            items = value
        else:
            items = (value,)
        for item in items:
            yield from messages(item)


def sealed_payloads(events: Iterable[HistoryEvent]) -> int:
    """How many payloads of these events are sealed: to warn a reader who has no key."""
    return sum(1 for event in events for found in messages(event) if isinstance(found, Payload) and is_sealed(found))


async def decode_events(codec: PayloadCodec, events: Iterable[HistoryEvent]) -> None:
    """Opens, in place, every payload of the events that the codec sealed, then restores encoded failure messages."""
    for event in events:
        found = list(messages(event))
        for payload in (item for item in found if isinstance(item, Payload) and is_sealed(item)):
            (opened,) = await codec.decode([payload])
            payload.CopyFrom(opened)
        for failure in (item for item in found if isinstance(item, Failure)):
            _spell_out(failure)


def _spell_out(failure: Failure) -> None:
    """Moves an encoded failure's message and stack trace back into their fields, as the SDK does when it decodes."""
    if not failure.HasField("encoded_attributes") or is_sealed(failure.encoded_attributes):
        return
    attributes = PayloadConverter.default.from_payloads([failure.encoded_attributes])[0]
    if isinstance(attributes, dict):
        failure.message = str(attributes.get("message") or failure.message)
        failure.stack_trace = str(attributes.get("stack_trace") or failure.stack_trace)
        failure.ClearField("encoded_attributes")
