"""The payload codec without a server: what it stores, what it refuses, which keys it reads and how it says so."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.exceptions import ApplicationError

from ferry import cli
from ferry.clients import TemporalSettings, data_converter
from ferry.codec.encryption import ENCODING, KEY_ID, EncryptionCodec
from ferry.codec.errors import KeySourceError, TamperedPayload, UnknownKey
from ferry.codec.events import decode_events, sealed_payloads
from ferry.codec.keys import KeyRing, load_keys
from ferry.configuration.arguments import from_arguments
from ferry.kubectl import cli as plugin
from ferry.kubectl import history, temporal
from watcher.settings import WatcherSettings
from worker.settings import WorkerSettings

MARKER = "orders-db-secret-7f3a"
"""A string that must never be readable in what the codec stores."""


def _key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def _ring(current: str, *others: str) -> KeyRing:
    keys = {key_id: os.urandom(32) for key_id in (current, *others)}
    return KeyRing(current=current, keys=keys, source="test keys")


def _json(value: object) -> Payload:
    return Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(value).encode())


def _secret_folder(folder: Path, keys: dict[str, str], current: str) -> Path:
    """A folder laid out as Kubernetes mounts a Secret: files are links into a hidden timestamped folder."""
    data = folder / "..2026_11_23_10_00_00.000000001"
    data.mkdir(parents=True)
    for name, value in {**keys, "current": current}.items():
        (data / name).write_text(value)
    (folder / "..data").symlink_to(data.name)
    for name in (*keys, "current"):
        (folder / name).symlink_to(f"..data/{name}")
    return folder


# --- what is stored, and what comes back ----------------------------------------------------------


async def test_a_payload_round_trips_and_what_is_stored_shows_neither_its_data_nor_its_encoding() -> None:
    codec = EncryptionCodec(_ring("k1"))
    original = _json({"sourceSecret": MARKER})

    (stored,) = await codec.encode([original])
    (again,) = await codec.encode([original])
    (decoded,) = await codec.decode([stored])

    assert MARKER.encode() not in stored.SerializeToString()
    assert b"json/plain" not in stored.SerializeToString()
    assert dict(stored.metadata) == {"encoding": ENCODING, KEY_ID: b"k1"}
    assert stored.data != again.data, "each payload gets a fresh nonce"
    assert decoded == original


async def test_a_payload_that_is_not_encrypted_passes_through_decode_unchanged() -> None:
    plain = _json({"written": "before encryption was turned on"})

    assert await EncryptionCodec(_ring("k1")).decode([plain]) == [plain]


async def test_a_changed_byte_fails_with_an_error_naming_the_key_instead_of_garbage() -> None:
    codec = EncryptionCodec(_ring("k1"))
    (stored,) = await codec.encode([_json(MARKER)])
    changed = bytearray(stored.data)
    changed[20] ^= 0x01
    stored.data = bytes(changed)

    with pytest.raises(TamperedPayload) as raised:
        await codec.decode([stored])

    assert "encrypted with codec key 'k1' does not authenticate: it was altered" in str(raised.value)


async def test_a_payload_relabelled_with_another_known_key_id_does_not_decrypt() -> None:
    codec = EncryptionCodec(_ring("k1", "k2"))
    (stored,) = await codec.encode([_json(MARKER)])
    stored.metadata[KEY_ID] = b"k2"

    with pytest.raises(TamperedPayload, match="codec key 'k2' does not authenticate"):
        await codec.decode([stored])


async def test_a_payload_of_a_key_no_longer_known_names_that_key_and_the_known_ones() -> None:
    (stored,) = await EncryptionCodec(_ring("2025-01")).encode([_json(MARKER)])

    with pytest.raises(UnknownKey) as raised:
        await EncryptionCodec(_ring("2026-01", "2025-06")).decode([stored])

    assert raised.value.key_id == "2025-01"
    message = str(raised.value)
    assert "encrypted with codec key '2025-01', which is not among the keys of test keys (2025-06, 2026-01)" in message
    assert "add that key back" in message


async def test_after_a_rotation_old_payloads_still_decode_and_new_ones_use_the_new_key() -> None:
    before = _ring("2025-01")
    rotated = KeyRing(current="2026-01", keys={**before.keys, "2026-01": os.urandom(32)}, source="rotated")
    (old,) = await EncryptionCodec(before).encode([_json("written before")])

    (new,) = await EncryptionCodec(rotated).encode([_json("written after")])
    decoded = await EncryptionCodec(rotated).decode([old, new])

    assert new.metadata[KEY_ID] == b"2026-01"
    assert [json.loads(payload.data) for payload in decoded] == ["written before", "written after"]


# --- failures: messages and stack traces are payloads too -------------------------------------------


async def test_with_a_codec_a_failure_keeps_its_message_and_stack_trace_only_encrypted() -> None:
    converter = data_converter(EncryptionCodec(_ring("k1")))
    failure = Failure()
    try:
        raise ApplicationError(f"Secret shop/{MARKER} does not exist", type="MissingSecret", non_retryable=True)
    except ApplicationError as error:
        await converter.encode_failure(error, failure)

    stored = failure.SerializeToString()
    decoded = await converter.decode_failure(failure)

    assert MARKER.encode() not in stored
    assert failure.message == "Encoded failure"
    assert isinstance(decoded, ApplicationError)
    assert decoded.message == f"Secret shop/{MARKER} does not exist"
    assert decoded.type == "MissingSecret"


async def test_with_a_codec_a_failure_is_scrubbed_before_it_is_encrypted_its_causes_too() -> None:
    converter = data_converter(EncryptionCodec(_ring("k1")))
    duplicate = f'duplicate key value violates unique constraint "customers_email_key"\nDETAIL:  Key (email)=({MARKER})'
    failure = Failure()
    try:
        try:
            raise RuntimeError(duplicate)
        except RuntimeError as cause:
            raise ApplicationError("restore failed", type="RestoreFailed") from cause
    except ApplicationError as error:
        await converter.encode_failure(error, failure)

    stored = failure.SerializeToString()
    decoded = await converter.decode_failure(failure)

    assert (failure.message, failure.cause.message) == ("Encoded failure", "Encoded failure")
    assert b"customers_email_key" not in stored
    assert isinstance(decoded, ApplicationError)
    assert decoded.message == "restore failed"
    assert isinstance(decoded.__cause__, ApplicationError)
    assert decoded.__cause__.message == 'duplicate key value violates unique constraint "customers_email_key"'
    assert decoded.__cause__.type == "RuntimeError"


def test_without_keys_the_converter_is_the_one_ferry_always_used() -> None:
    assert data_converter().payload_codec is None
    assert TemporalSettings().codec() is None


async def test_a_history_read_raw_is_decoded_for_the_plugin_failure_messages_and_controls_included() -> None:
    codec = EncryptionCodec(_ring("k1"))
    converter = data_converter(codec)
    failure = Failure()
    await converter.encode_failure(ApplicationError(f"Secret shop/{MARKER} does not exist"), failure)
    scheduled, failed, signalled = HistoryEvent(event_id=5), HistoryEvent(event_id=7), HistoryEvent(event_id=9)
    scheduled.event_type = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    scheduled.activity_task_scheduled_event_attributes.activity_type.name = "postgresql.precheck"
    failed.event_type = EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
    failed.activity_task_failed_event_attributes.scheduled_event_id = 5
    failed.activity_task_failed_event_attributes.failure.CopyFrom(failure)
    signalled.event_type = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    signalled.workflow_execution_signaled_event_attributes.signal_name = "approve"
    signalled.workflow_execution_signaled_event_attributes.input.CopyFrom(
        Payloads(payloads=await codec.encode([_json({"by": "carol"})]))
    )
    events = [scheduled, failed, signalled]
    unread = history.rows(events)

    assert sealed_payloads(events) == 2
    await decode_events(codec, events)
    read = history.rows(events)

    assert [row.detail for row in unread] == ["Encoded failure", ""]
    assert [row.detail for row in read] == [f"Secret shop/{MARKER} does not exist", "by carol"]
    assert sealed_payloads(events) == 0


# --- where the keys come from -------------------------------------------------------------------


def test_keys_load_from_a_mounted_secret_folder_its_hidden_entries_aside(tmp_path: Path) -> None:
    old, new = _key(), _key()
    folder = _secret_folder(tmp_path / "codec-keys", {"2025-01": old, "2026-01": new + "\n"}, "2026-01\n")

    ring = load_keys(folder)

    assert ring.current == "2026-01"
    assert ring.ids == ("2025-01", "2026-01")
    assert ring.keys["2025-01"] == base64.b64decode(old)
    assert old not in repr(ring)
    assert str(ring.keys["2025-01"]) not in repr(ring)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_keys_load_from_a_yaml_or_json_file(tmp_path: Path, suffix: str) -> None:
    key = _key()
    file = tmp_path / f"keys{suffix}"
    file.write_text(json.dumps({"current": "k1", "keys": {"k1": key, "k0": _key()}}))

    ring = load_keys(file)

    assert (ring.current, ring.ids, ring.keys["k1"]) == ("k1", ("k0", "k1"), base64.b64decode(key))


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, "holds no key: add one (an id and the base64 of 32 random bytes; make one with `openssl rand -base64"),
        ({"k1": "KEY"}, "does not say which key encrypts: set 'current' to one of k1"),
        ({"k1": "KEY", "current": "k2"}, "the current key 'k2' is not among its keys (k1)"),
        ({"k1": "not base64!", "current": "k1"}, "key 'k1' is not the base64 of 32 bytes"),
        ({"k1": base64.b64encode(b"short").decode(), "current": "k1"}, "key 'k1' is not the base64 of 32 bytes"),
        ({"k 1": "KEY", "current": "k 1"}, "'k 1' is not a usable key id"),
    ],
)
def test_a_key_folder_that_cannot_be_used_says_what_to_fix(
    tmp_path: Path, files: dict[str, str], expected: str
) -> None:
    folder = tmp_path / "keys"
    folder.mkdir()
    key = _key()
    for name, value in files.items():
        (folder / name).write_text(value.replace("KEY", key))

    with pytest.raises(KeySourceError) as raised:
        load_keys(folder)

    assert expected in str(raised.value)
    assert key not in str(raised.value)


def test_a_key_source_that_does_not_exist_or_is_not_a_mapping_says_so(tmp_path: Path) -> None:
    (tmp_path / "list.yaml").write_text("- k1\n")

    with pytest.raises(KeySourceError, match="does not exist: point it at a key folder"):
        load_keys(tmp_path / "nowhere")
    with pytest.raises(KeySourceError, match=r"should be a mapping \{current: ID, keys:"):
        load_keys(tmp_path / "list.yaml")


# --- every component is given the same keys the same way -----------------------------------------


def test_the_worker_the_watcher_and_the_plugins_history_read_the_keys_from_ferry_codec_keys(tmp_path: Path) -> None:
    folder = _secret_folder(tmp_path / "codec-keys", {"k1": _key()}, "k1")
    environ = {"FERRY_CODEC_KEYS": str(folder)}

    for command, settings in (("worker", WorkerSettings), ("watcher", WatcherSettings)):
        loaded = from_arguments(settings, cli.build_parser().parse_args([command]), environ)
        assert loaded.temporal.codec_keys == folder, command
        assert loaded.temporal.codec().keys.current == "k1", command
    args = plugin.build_parser().parse_args(["history", "orders", "--temporal-address=localhost:7233"])
    given = temporal.settings_from(args, environ, None)
    assert given is not None
    assert given.codec_keys == folder


def test_a_component_given_keys_it_cannot_use_stops_with_one_line_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["worker", f"--codec-keys={tmp_path}"])

    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"ferry worker: --codec-keys (FERRY_CODEC_KEYS): {tmp_path} holds no key: add one (an id and the base64 of "
        f"32 random bytes; make one with `openssl rand -base64 32`) (got '{tmp_path}' from --codec-keys)"
    ]
