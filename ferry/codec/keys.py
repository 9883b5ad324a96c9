"""The codec's keys: every key by its id, and which one encrypts; read from a folder or from one file.

Two layouts, so that a Kubernetes Secret works as it is mounted and a file works anywhere:

- a folder, such as a Secret mounted as a volume: one file per key, named by the key's
  id and holding the base64 of its 32 bytes, and a file `current` holding the id of the
  key that encrypts. Entries whose name starts with a dot (the `..data` links Kubernetes
  adds) are not keys.
- a YAML or JSON file: `{current: ID, keys: {ID: BASE64, ...}}`.

Every key stays usable for decrypting; only `current` encrypts. That is what makes a
rotation safe: add the new key, make it current, and keep the old one for as long as a
history written with it is kept.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import AfterValidator

from ferry.codec.errors import KeySourceError

KEY_BYTES = 32
"""AES-256: a key is 32 random bytes."""
CURRENT = "current"
"""In a key folder, the file naming the key that encrypts; in a key file, the field that does."""
KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""A key id: what a Secret's data keys allow, short enough to repeat in every payload's metadata."""
HOW_TO_MAKE = "make one with `openssl rand -base64 32`"


@dataclasses.dataclass(frozen=True)
class KeyRing:
    """Every codec key by id, and the id of the one new payloads are encrypted with."""

    current: str
    """The id of the key that encrypts."""
    keys: Mapping[str, bytes] = dataclasses.field(repr=False)
    """Every key by id, the current one included: any of them decrypts. Never printed."""
    source: str
    """Where the keys were read from, for messages."""

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(sorted(self.keys))


def load_keys(path: Path) -> KeyRing:
    """The keys of a key folder or key file; a KeySourceError says what is wrong with it and how to fix it."""
    if path.is_dir():
        current, encoded = _from_folder(path)
    elif path.is_file():
        current, encoded = _from_file(path)
    else:
        raise KeySourceError(f"{path} does not exist: point it at a key folder (a mounted Secret) or a key file")
    if not encoded:
        raise KeySourceError(f"{path} holds no key: add one (an id and the base64 of 32 random bytes; {HOW_TO_MAKE})")
    keys = {key_id: _key(path, key_id, text) for key_id, text in encoded.items()}
    if not current:
        raise KeySourceError(
            f"{path} does not say which key encrypts: set {CURRENT!r} to one of {', '.join(sorted(keys))}"
        )
    if current not in keys:
        raise KeySourceError(
            f"{path}: the current key {current!r} is not among its keys ({', '.join(sorted(keys))}): "
            "add that key, or name one that is there"
        )
    return KeyRing(current=current, keys=keys, source=str(path))


def _from_folder(folder: Path) -> tuple[str, dict[str, str]]:
    entries = {
        entry.name: entry.read_text()
        for entry in sorted(folder.iterdir())
        if not entry.name.startswith(".") and entry.is_file()
    }
    current = entries.pop(CURRENT, "").strip()
    return current, entries


def _from_file(file: Path) -> tuple[str, dict[str, str]]:
    try:
        content = yaml.safe_load(file.read_text())
    except yaml.YAMLError as error:
        raise KeySourceError(f"{file} is not YAML or JSON: {' '.join(str(error).split())}") from None
    if not isinstance(content, dict) or not isinstance(content.get("keys"), dict):
        raise KeySourceError(f"{file} should be a mapping {{current: ID, keys: {{ID: BASE64, ...}}}}")
    current = content.get(CURRENT)
    if current is not None and not isinstance(current, str):
        raise KeySourceError(f"{file}: {CURRENT!r} should be a key id (a string)")
    return (current or "").strip(), {str(key_id): str(text) for key_id, text in content["keys"].items()}


def _key(source: Path, key_id: str, text: str) -> bytes:
    if not KEY_ID.fullmatch(key_id):
        raise KeySourceError(
            f"{source}: {key_id!r} is not a usable key id: use 1 to 64 letters, digits, '.', '_' or '-'"
        )
    try:
        key = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise KeySourceError(f"{source}: key {key_id!r} is not the base64 of {KEY_BYTES} bytes; {HOW_TO_MAKE}")
    return key


def loadable_keys(path: Path) -> Path:
    """Checks that the keys load when the settings do, so a bad key source is one line naming its flag."""
    try:
        load_keys(path)
    except KeySourceError as error:
        raise ValueError(str(error)) from None
    return path


CodecKeys = Annotated[Path, AfterValidator(loadable_keys)]
"""A settings field holding a key folder or key file whose keys load."""
