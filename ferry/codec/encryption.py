"""The payload codec: AES-256-GCM with the current key, the key's id in the payload's metadata.

Each payload (its metadata and data, serialized whole) is sealed with a fresh 96-bit nonce;
the ciphertext carries GCM's tag, so a changed byte fails decryption instead of yielding
garbage. The key id travels in clear beside it, so decryption picks the key that sealed it,
whatever key is current by then, and is also bound into the tag (as associated data): a
payload relabelled with another id does not decrypt.

A payload that is not sealed (a history written before encryption was turned on, a run
started by hand without a codec) passes through decode unchanged, so turning encryption on
does not strand the runs under way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from ferry.codec.errors import TamperedPayload, UnknownKey
from ferry.codec.keys import KeyRing

ENCODING = b"binary/encrypted"
"""The encoding of a sealed payload: the name the Web UI and the temporal CLI know for encrypted data."""
KEY_ID = "encryption-key-id"
"""The metadata field naming the key that sealed the payload."""
NONCE_BYTES = 12


class EncryptionCodec(PayloadCodec):
    """Seals payloads with the key ring's current key; opens them with whichever of its keys sealed them."""

    def __init__(self, keys: KeyRing) -> None:
        self.keys = keys
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keys.keys.items()}

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.seal(payload) for payload in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.open(payload) for payload in payloads]

    def seal(self, payload: Payload) -> Payload:
        key_id = self.keys.current
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[key_id].encrypt(nonce, payload.SerializeToString(), key_id.encode())
        return Payload(metadata={"encoding": ENCODING, KEY_ID: key_id.encode()}, data=nonce + sealed)

    def open(self, payload: Payload) -> Payload:
        if not is_sealed(payload):
            return payload
        key_id = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            known = ", ".join(self.keys.ids)
            raise UnknownKey(
                f"a payload is encrypted with codec key {key_id!r}, which is not among the keys of "
                f"{self.keys.source} ({known}): add that key back (after a rotation, keep an old key as long as "
                "Temporal keeps a history written with it)",
                key_id,
            )
        nonce, sealed = payload.data[:NONCE_BYTES], payload.data[NONCE_BYTES:]
        try:
            opened = cipher.decrypt(nonce, sealed, key_id.encode())
        except (InvalidTag, ValueError):  # ValueError: too short to hold a nonce
            raise TamperedPayload(
                f"a payload encrypted with codec key {key_id!r} does not authenticate: it was altered after it "
                f"was written, or key {key_id!r} of {self.keys.source} is not the key that sealed it (was the id "
                "reused for a new key? give every new key a new id)"
            ) from None
        return Payload.FromString(opened)


def is_sealed(payload: Payload) -> bool:
    """Whether the payload is one this codec sealed (and so needs a key to read)."""
    return payload.metadata.get("encoding") == ENCODING
