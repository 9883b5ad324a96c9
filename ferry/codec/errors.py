"""What can go wrong with codec keys and encrypted payloads; every message says what to do, none holds a key."""

from __future__ import annotations


class CodecError(Exception):
    """The root of the codec's errors: keys that cannot be used, or a payload that cannot be decrypted."""


class KeySourceError(CodecError):
    """The key file or folder cannot be read as codec keys; the message names the file and the fix."""


class UnknownKey(CodecError):
    """A payload was encrypted with a key this process does not have (e.g. one dropped too early after a rotation)."""

    def __init__(self, message: str, key_id: str) -> None:
        super().__init__(message)
        self.key_id = key_id


class TamperedPayload(CodecError):
    """A payload does not authenticate under the key its metadata names: it was altered, or the key differs."""
