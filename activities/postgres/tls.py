"""TLS of ferry's database connections: the Secret's sslmode and CA, as libpq takes them, and its refusals.

libpq reads a CA only from a file (sslrootcert), for psycopg's sessions and for the
pg_dump and pg_restore children alike, so the Secret's CA is written to a private
temporary file (mode 0600, `ca_file`) for as long as a connection is being made and
removed afterwards: libpq reads it during the handshake only. The children get the mode
and the file in PGSSLMODE and PGSSLROOTCERT, beside the rest of their connection. Those
tools may come with a libpq built without TLS, which refuses any sslmode that requires it:
`lacks_tls` lets the precheck find that out before anything changes.

A certificate that does not verify, or a server and a Secret that disagree on whether
to encrypt, will not change on retry: `refusal` turns libpq's words for these into
TlsMismatch, which says what to change in the Secret or on the server.

A Secret without either key gets libpq's prefer, which encrypts only when the server
offers TLS, falls back to plain text without a word, and verifies nothing. That works,
so nothing refuses it; the precheck reads what its own sessions got (`encryption`) and
warns of a database reached in plain text, or encrypted without verifying the server
(`warning`), with what to put into the Secret.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from activities.secrets import CA_KEY, SSLMODE_KEY, VERIFYING_MODES, DatabaseConnection
from ferry.api.errors import TlsMismatch

if TYPE_CHECKING:  # connection.py imports this module
    from activities.postgres.connection import Connection

NOT_VERIFIED = ("certificate verify failed", "signature failure", "does not match host name")
"""libpq's words when the server's certificate does not verify: no chain to the CA (or a CA of the same name with
another key: OpenSSL's "provider signature failure"), or not for the host name."""
ENCRYPTION_REQUIRED = "no encryption"
"""The end of the server's "no pg_hba.conf entry ..." when its rules accept only encrypted (hostssl) connections."""
ENCRYPTION_MISSING = "server does not support ssl"
"""libpq's words when the Secret asks for TLS from a server without it."""
NOT_COMPILED_IN = "ssl support is not compiled in"
"""libpq's words when it was built without TLS (pg_dump's and pg_restore's may be) and is asked for it."""
REQUIRING_MODES = ("require", "verify-ca", "verify-full")
"""The sslmodes a libpq without TLS refuses; it takes disable, allow and prefer."""
ENCRYPTION = """
select coalesce((select ssl from pg_stat_ssl where pid = pg_backend_pid()), false), current_setting('ssl') = 'on'
"""
"""Whether the current session is encrypted, and whether its server offers TLS at all."""


@dataclasses.dataclass(frozen=True)
class Encryption:
    """What one of the precheck's sessions got."""

    encrypted: bool
    offered: bool
    """Whether the server offers TLS (ssl = on): without it, no sslmode of the Secret's can encrypt."""


@contextlib.contextmanager
def ca_file(db: DatabaseConnection) -> Iterator[Path | None]:
    """The Secret's CA in a file only this process's user may read, removed on the way out; None without a CA."""
    if db.ca_certificate is None:
        yield None
        return
    descriptor, name = tempfile.mkstemp(prefix="ferry-ca-", suffix=".crt")
    path = Path(name)
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(db.ca_certificate + "\n")
        yield path
    finally:
        path.unlink(missing_ok=True)


def parameters(db: DatabaseConnection, ca: Path | None) -> dict[str, str]:
    """libpq's sslmode and sslrootcert for a connection to `db`, its CA written to `ca`."""
    found = {"sslmode": db.tls_mode()}
    if ca is not None:
        found["sslrootcert"] = str(ca)
    return found


def environment(db: DatabaseConnection, ca: Path | None) -> dict[str, str]:
    """The same, as the environment variables of pg_dump and pg_restore."""
    return {f"PG{name.upper()}": value for name, value in parameters(db, ca).items()}


def lacks_tls(pg_dump: Path) -> bool:
    """Whether `pg_dump` (and so pg_restore beside it, on the same libpq) was built without TLS.

    It is asked to connect through a Unix socket in a folder that does not exist, with
    sslmode require: a libpq without TLS refuses the sslmode before it tries, and nothing
    is reached either way.
    """
    try:
        said = subprocess.run(
            [str(pg_dump), "--dbname=host=/nonexistent/ferry-tls-probe sslmode=require", "--schema-only"],
            capture_output=True, stdin=subprocess.DEVNULL, text=True, timeout=30, env={"LC_MESSAGES": "C"},
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False  # the version check reports a tool that does not run
    return NOT_COMPILED_IN in said.stderr.lower()


def refusal(db: DatabaseConnection, message: str) -> TlsMismatch | None:
    """The error to raise when libpq's `message` (scrubbed) says that TLS failed; None when it says something else."""
    lowered = message.lower()
    where = f"Secret {db.secret}"
    if any(words in lowered for words in NOT_VERIFIED):
        return TlsMismatch(
            f"could not verify the server certificate of {db.describe()} (sslmode {db.tls_mode()}): {message}. "
            f"Put the PEM certificate of the CA that signed the server's certificate into key '{CA_KEY}' of {where}, "
            "and make key 'host' a name the certificate holds (verify-full checks it); the next attempt reads them "
            "again."
        )
    if ENCRYPTION_REQUIRED in lowered and "pg_hba.conf" in lowered:
        return TlsMismatch(
            f"{db.describe()} has no pg_hba.conf rule that lets ferry in without encryption, and sslmode "
            f"{db.tls_mode()} did not encrypt: {message}. Set key '{SSLMODE_KEY}' of {where} to verify-full with "
            f"the server's CA in key '{CA_KEY}' (or require, which checks no host name), or remove the key."
        )
    if NOT_COMPILED_IN in lowered:
        return TlsMismatch(
            f"the worker's pg_dump and pg_restore were built without TLS, and {db.describe()} is to be reached with "
            f"sslmode {db.tls_mode()}: {message}. Give the worker PostgreSQL client tools built with OpenSSL "
            "(--postgres-bindir)."
        )
    if ENCRYPTION_MISSING in lowered:
        return TlsMismatch(
            f"{db.describe()} does not offer TLS, and sslmode {db.tls_mode()} requires it: {message}. Turn on ssl "
            f"on the server, or, if the network path is trusted, set key '{SSLMODE_KEY}' of {where} to prefer."
        )
    return None


def encryption(conn: Connection) -> Encryption:
    """What the session `conn` got, as its server sees it."""
    row = conn.execute(ENCRYPTION).fetchone()
    assert row is not None
    return Encryption(encrypted=bool(row[0]), offered=bool(row[1]))


def warning(db: DatabaseConnection, found: Encryption | None) -> str | None:
    """A warning for a session with `db` in plain text, or encrypted without verifying the server; None for one
    that verified it (or when nothing was found)."""
    if found is None:
        return None
    mode = db.tls_mode()
    if found.encrypted:
        if mode in VERIFYING_MODES:
            return None
        return (
            f"ferry's sessions with {db.describe()} are encrypted but do not verify the server (sslmode {mode}): "
            f"whoever can intercept them can pose as the server. {_verifying(db)}."
        )
    defaulted = db.sslmode is None and mode == "prefer"
    default = ", libpq's default, which falls back to plain text without a word" if defaulted else ""
    off = "" if found.offered else "Its server does not offer TLS (ssl is off): give it a certificate and turn ssl on. "
    return (
        f"ferry's sessions with {db.describe()} are not encrypted (sslmode {mode}{default}): what the migration "
        f"reads and writes there crosses the network in plain text. {off}{_verifying(db)}: then ferry's sessions, "
        "pg_dump's and pg_restore's included, verify the server and never go on in plain text."
    )


def _verifying(db: DatabaseConnection) -> str:
    """What to change in `db`'s Secret for verify-full."""
    ca = f"the PEM certificate of the CA that signed the server's certificate into key '{CA_KEY}' of Secret {db.secret}"
    if db.ca_certificate is not None:
        return f"Set key '{SSLMODE_KEY}' of Secret {db.secret} to verify-full, or remove it (the default with a CA)"
    if db.sslmode is None:
        return f"Put {ca} (with it and no key '{SSLMODE_KEY}', ferry uses verify-full)"
    return f"Put {ca}, and set its key '{SSLMODE_KEY}' to verify-full"
