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

The same locale names need not sort alike either: the rules are the collation library's
(glibc, ICU), and change with its version (glibc 2.28 reordered much of Unicode). Since
PostgreSQL 15 each database records the version its default collation was made with
(datcollversion), and each collation's library reports its own
(pg_collation_actual_version). Where the source's and the target's differ (one side
having none counts), the precheck warns: the restore builds every index anew, by the
target's rules, so the indexes are sound, but the application's ORDER BY, comparisons
and the range partitions bounded by text follow the new rules. It compares the
collations the source's columns use too (COLLATE "de-x-icu", say), each with the one of
its name on the target (pg_dump names a built-in collation) or, for one made with CREATE
COLLATION, of its provider and locale. A collation the target's server surely lacks (a
built-in one it has not, or any of ICU's on a server built without ICU) would stop the
restore, after the freeze, so the precheck refuses it.

The row of pg_database is read as JSON, so one query serves every server version: the
provider arrived in PostgreSQL 15 (before, every database is libc's), its ICU locale is
daticulocale in 15 and 16 and datlocale from 17 on, and ICU rules came in 16; likewise a
row of pg_collation (its ICU locale is colliculocale in 15 and 16, colllocale from 17 on).
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
"""pg_database.datlocprovider's (and pg_collation.collprovider's) codes."""
SHOWN = 5
"""Collations, and columns per collation, named in one message."""
LOCALE_OF = "coalesce(to_jsonb(co) ->> 'colllocale', to_jsonb(co) ->> 'colliculocale', co.collcollate)"
"""A collation's locale, whatever the server's version (see the module's docstring)."""
USED_COLLATIONS = f"""
select n.nspname, co.collname, co.collprovider, {LOCALE_OF}, pg_catalog.pg_collation_actual_version(co.oid),
    array_agg(cn.nspname || '.' || c.relname || '.' || a.attname order by cn.nspname, c.relname, a.attnum)
from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace cn on cn.oid = c.relnamespace
join pg_collation co on co.oid = a.attcollation join pg_namespace n on n.oid = co.collnamespace
where a.attnum > 0 and not a.attisdropped and c.relkind in ('r', 'p', 'm', 'f')
and cn.nspname !~ '^pg_' and cn.nspname <> 'information_schema'
and (co.collprovider = 'i' or (co.collprovider = 'c' and co.collcollate not in ('C', 'POSIX')))
group by n.nspname, co.collname, co.collprovider, co.oid
order by 1, 2
"""
"""The versioned collations the source's user columns use, other than the database's default (provider 'd'): those
of ICU and libc's other than C and POSIX, whose rules never change (as the builtin provider's do not)."""
ON_TARGET = f"""
select n.nspname, co.collname, co.collprovider, {LOCALE_OF}, pg_catalog.pg_collation_actual_version(co.oid)
from pg_collation co join pg_namespace n on n.oid = co.collnamespace
where (n.nspname = 'pg_catalog' and co.collname::text = any(%(names)s::text[]))
or co.collprovider::text || ':' || {LOCALE_OF} = any(%(locales)s::text[])
"""
"""The target's collations that stand for the source's: of the same name in pg_catalog, or of the same provider and
locale (the versions only of these, so that a server with hundreds of ICU collations asks its library a few times)."""
HAS_ICU = """
select pg_catalog.pg_collation_actual_version(oid) is not null from pg_catalog.pg_collation where collprovider = 'i'
limit 1
"""
"""Whether the server has ICU: built with it, every ICU collation has a version; built without, since PostgreSQL 16 it
still has one, `unicode`, with none (and using it fails), and before 16 none."""


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
    version: str | None = None
    """The version of the collation library the default collation was made with (datcollversion); None for C."""
    versioned: bool = False
    """Whether the server records that version (PostgreSQL 15 and later)."""

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
            version=str(row["datcollversion"]) if row.get("datcollversion") else None,
            versioned="datcollversion" in row,
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


@dataclasses.dataclass(frozen=True)
class UsedCollation:
    """A collation the source's columns use, and what its library's version is there."""

    schema: str
    name: str
    provider: str
    """pg_collation.collprovider's code."""
    locale: str
    version: str | None
    columns: tuple[str, ...]

    @property
    def qualified(self) -> str:
        return f'{self.schema}."{self.name}"'

    @property
    def built_in(self) -> bool:
        """Whether it is one of the server's own (initdb made it): pg_dump names it, and does not create it."""
        return self.schema == "pg_catalog"

    @property
    def key(self) -> str:
        return f"{self.provider}:{self.locale}"

    def describe(self) -> str:
        more = f" and {len(self.columns) - SHOWN} more" if len(self.columns) > SHOWN else ""
        used = ", ".join(self.columns[:SHOWN]) + more
        return f"{self.qualified} ({PROVIDERS.get(self.provider, self.provider)} locale {self.locale}; {used})"


def used_collations(conn: Connection) -> tuple[UsedCollation, ...]:
    """The versioned collations the user columns of the database of `conn` use, besides its default."""
    return tuple(
        UsedCollation(str(schema), str(name), str(provider), str(locale or ""), version, tuple(columns))
        for schema, name, provider, locale, version, columns in conn.execute(USED_COLLATIONS).fetchall()
    )


@dataclasses.dataclass(frozen=True)
class CollationsOnTarget:
    """The target's versions of the source's collations."""

    versions: dict[str, tuple[UsedCollation, str | None]]
    """Per collation of the source (its qualified name): it, and the version of the target's that stands for it."""
    missing: tuple[UsedCollation, ...]
    """Those the target's server has no collation for."""
    icu: bool = True
    """Whether the target's server was built with ICU (PostgreSQL can be built without)."""

    def certain_failures(self) -> list[UsedCollation]:
        """The missing ones the restore would stop at: a built-in one (pg_dump names it), or any of ICU's on a server
        without ICU (CREATE COLLATION refuses the provider); a libc locale may just be missing from its catalog."""
        return [one for one in self.missing if one.built_in or (one.provider == "i" and not self.icu)]


def on_target(conn: Connection, used: tuple[UsedCollation, ...]) -> CollationsOnTarget:
    """What the target's server (`conn`) has for each of the source's `used` collations."""
    rows = conn.execute(
        ON_TARGET, {"names": [one.name for one in used if one.built_in], "locales": [one.key for one in used]}
    ).fetchall()
    icu = conn.execute(HAS_ICU).fetchone()
    by_name = {str(name): version for schema, name, _, _, version in rows if schema == "pg_catalog"}
    by_locale = {f"{provider}:{locale}": version for _, _, provider, locale, version in rows}
    versions: dict[str, tuple[UsedCollation, str | None]] = {}
    missing = []
    for one in used:
        if one.provider == "i" and not (icu and icu[0]):
            missing.append(one)
        elif one.built_in and one.name in by_name:
            versions[one.qualified] = (one, by_name[one.name])
        elif not one.built_in and one.key in by_locale:
            versions[one.qualified] = (one, by_locale[one.key])
        else:
            missing.append(one)
    return CollationsOnTarget(versions, tuple(missing), bool(icu and icu[0]))


def missing_problem(found: CollationsOnTarget, target_db: DatabaseConnection) -> str | None:
    """Why the restore would stop: the source's columns use built-in collations the target's server lacks."""
    lacking = found.certain_failures()
    if not lacking:
        return None
    return (
        f"the source's columns use collations that the server of {target_db.describe()} does not have: "
        f"{_listed([one.describe() for one in lacking])}. The restore names (or creates) them, and would stop at the "
        "first, after the freeze. Give the target a server that has them (ICU's need a PostgreSQL built with ICU; "
        "libc's, the locale installed before initdb, or SELECT pg_import_system_collations('pg_catalog') once it is), "
        "or change "
        "those columns on the source to a collation the target has (ALTER TABLE ... ALTER COLUMN ... TYPE ... "
        "COLLATE ...)."
    )


def version_warning(
    source: DatabaseLocale,
    target: DatabaseLocale,
    found: CollationsOnTarget | None,
    source_db: DatabaseConnection,
    target_db: DatabaseConnection,
) -> str | None:
    """A warning when the collation library's versions differ between the source and the target, for the databases'
    default collations or those the source's columns use, or when ferry could not compare one of the latter."""
    differing = []
    if source.versioned and target.versioned and source.version != target.version:
        differing.append(
            f"the default collation of database {source_db.database!r} was made with version "
            f"{_version(source.version)} of its library on the source, that of {target_db.database!r} on the target "
            f"with {_version(target.version)}"
        )
    changed = [(one, theirs) for one, theirs in (found.versions.values() if found else []) if one.version != theirs]
    if changed:
        differing.append(
            "the columns' collations "
            + _listed(
                [f"{one.describe()}: {_version(one.version)} against {_version(theirs)}" for one, theirs in changed]
            )
        )
    unmatched = [one for one in found.missing if one not in found.certain_failures()] if found else []
    words = []
    if differing:
        words.append(
            f"text may sort differently on the target: {'; and '.join(differing)}. A collation library's rules change "
            "with its version (glibc 2.28 reordered much of Unicode), whatever the locale's name. The restore builds "
            "every index anew by the target's rules, so the indexes need no REINDEX and the rows are the same (verify "
            "compares them byte for byte); what may change is what the rules decide: the order of the application's "
            "ORDER BY on text, its comparisons and ranges on text (<, BETWEEN, LIKE through an index), and which "
            "range partition a text key falls in (a row the target's rules put outside its partition stops the "
            "restore, after the freeze). Check those against the target's server, or keep a library of the source's "
            "version there."
        )
    if unmatched:
        listed = _listed([one.describe() for one in unmatched])
        words.append(
            f"{'The' if words else 'the'} target's server lists no collation of the provider and locale of {listed}, "
            "which the restore creates (CREATE COLLATION): it stops, after the freeze, if that server does not know "
            "the locale. Make sure it does (locale -a on its host, or ICU's locales)."
        )
    return " ".join(words) if words else None


def _version(version: str | None) -> str:
    return version if version is not None else "none (no version recorded)"


def _listed(items: list[str]) -> str:
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more


def _spelled(name: str) -> str:
    """One spelling of a locale's name: en_US.UTF-8 and en_US.utf8 are one locale, as are C and POSIX."""
    name = name.strip()
    if name.upper() == "POSIX":
        return "C"
    base, dot, codeset = name.partition(".")
    return base + dot + codeset.lower().replace("-", "") if dot else base


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
