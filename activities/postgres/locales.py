"""A database's encoding and default collation, which the target's must match (encoding) or should (collation).

ferry copies a database as it is. Its encoding is not one of the things a move may
change: the restore (or the replication) would convert the text into the target's
encoding, failing on any character that encoding lacks, and verify compares text byte
for byte in each server's own encoding (see checksums), so a target in another encoding
fails verify as soon as one value is not plain ASCII. Found by verify, that costs the
whole freeze and a rollback, so the precheck refuses it first.

The default collation and character classification (LC_COLLATE, LC_CTYPE, and the
locale provider with its ICU or builtin locale) may differ on purpose, say to move to
ICU with a new major version: the rows are the same and verify reads text in collation
"C". But every text column without a COLLATE of its own follows the database's, so the
application's ORDER BY, its comparisons, upper() and lower(), and the indexes built on
them (rebuilt by the restore) follow the target's rules from then on. The precheck says
so in a warning, not a refusal.

The row of pg_database is read as JSON, so one query serves every server version: the
provider arrived in PostgreSQL 15 (before, every database is libc's), its ICU locale is
daticulocale in 15 and 16 and datlocale from 17 on, and ICU rules came in 16.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from activities.postgres.connection import Connection
from activities.secrets import DatabaseConnection

DATABASE = """
select pg_catalog.pg_encoding_to_char(d.encoding), pg_catalog.to_jsonb(d)
from pg_catalog.pg_database d where d.datname = pg_catalog.current_database()
"""
PROVIDERS = {"c": "libc", "i": "icu", "b": "builtin"}
"""pg_database.datlocprovider's codes."""


@dataclasses.dataclass(frozen=True)
class DatabaseLocale:
    """How a database stores text (its encoding) and sorts and classifies it by default."""

    encoding: str
    provider: str = "libc"
    collate: str = ""
    ctype: str = ""
    locale: str | None = None
    """The ICU or builtin locale; None for libc."""
    icu_rules: str | None = None

    @classmethod
    def of(cls, encoding: str, row: Mapping[str, Any]) -> DatabaseLocale:
        """From pg_database's row as JSON (whatever columns the server's version has)."""
        provider = PROVIDERS.get(str(row.get("datlocprovider") or "c"), str(row.get("datlocprovider")))
        locale = row.get("datlocale") or row.get("daticulocale")
        return cls(
            encoding=encoding,
            provider=provider,
            collate=str(row.get("datcollate") or ""),
            ctype=str(row.get("datctype") or ""),
            locale=str(locale) if locale and provider != "libc" else None,
            icu_rules=str(row["daticurules"]) if row.get("daticurules") else None,
        )

    @property
    def collation(self) -> tuple[str, str, str, str | None, str | None]:
        """What decides how text sorts and classifies, with the spellings of one locale made alike."""
        return (self.provider, _spelled(self.collate), _spelled(self.ctype), self.locale and _spelled(self.locale),
                self.icu_rules)  # fmt: skip

    def describe_collation(self) -> str:
        """E.g. `libc, LC_COLLATE en_US.utf8, LC_CTYPE en_US.utf8`, or `icu locale und, ...`."""
        words = [self.provider if self.locale is None else f"{self.provider} locale {self.locale}"]
        if self.icu_rules:
            words.append(f"ICU rules {self.icu_rules!r}")
        words.append(f"LC_COLLATE {self.collate}, LC_CTYPE {self.ctype}")
        return ", ".join(words)

    def create_clause(self) -> str:
        """The options of CREATE DATABASE that give a database this encoding and collation."""
        words = [f"ENCODING {_quoted(self.encoding)}", f"LOCALE_PROVIDER {self.provider}"]
        if self.locale is not None:
            words.append(f"{self.provider.upper()}_LOCALE {_quoted(self.locale)}")
        if self.icu_rules:
            words.append(f"ICU_RULES {_quoted(self.icu_rules)}")
        words += [f"LC_COLLATE {_quoted(self.collate)}", f"LC_CTYPE {_quoted(self.ctype)}", "TEMPLATE template0"]
        return " ".join(words)


def read(conn: Connection) -> DatabaseLocale:
    row = conn.execute(DATABASE).fetchone()
    assert row is not None
    encoding, database = row
    return DatabaseLocale.of(str(encoding), database)


def encoding_problem(
    source: DatabaseLocale, target: DatabaseLocale, source_db: DatabaseConnection, target_db: DatabaseConnection
) -> str | None:
    """Why the target cannot take the source's text as it is, if its encoding is another."""
    if source.encoding == target.encoding:
        return None
    return (
        f"{target_db.describe()} is in encoding {target.encoding}, {source_db.describe()} in {source.encoding}. ferry "
        f"copies a database as it is: the restore would convert its text to {target.encoding} (or stop at a character "
        f"{target.encoding} lacks), and verify compares text byte for byte, so it would fail after the freeze and roll "
        f"back. Point Secret {target_db.secret} at a database in {source.encoding} (CREATE DATABASE ... "
        f"{source.create_clause()}), or convert the source's encoding before you move it."
    )


def collation_warning(
    source: DatabaseLocale, target: DatabaseLocale, source_db: DatabaseConnection, target_db: DatabaseConnection
) -> str | None:
    """A warning when the target sorts or classifies text by other rules than the source does."""
    if source.collation == target.collation:
        return None
    return (
        f"{target_db.describe()} sorts and classifies text by other rules than {source_db.describe()}: "
        f"{target.describe_collation()}, against {source.describe_collation()}. Every text column without a "
        "COLLATE of its own follows its database's, so after the move the application's ORDER BY, comparisons, "
        "upper() and lower(), and the indexes on them follow the target's. If that is not meant, point Secret "
        f"{target_db.secret} at a database created with the source's (CREATE DATABASE ... {source.create_clause()})."
    )


def _spelled(name: str) -> str:
    """One spelling of a locale's name: en_US.UTF-8 and en_US.utf8 are one locale, as are C and POSIX."""
    name = name.strip()
    if name.upper() == "POSIX":
        return "C"
    base, dot, codeset = name.partition(".")
    return base + dot + codeset.lower().replace("-", "") if dot else base


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
