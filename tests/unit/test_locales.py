"""A database's encoding and default collation, read from pg_database's row whatever columns its server version has."""

from __future__ import annotations

import pytest

from activities.postgres.locales import DatabaseLocale, collation_warning, encoding_problem
from activities.secrets import DatabaseConnection

LIBC_14 = {"datcollate": "en_US.UTF-8", "datctype": "en_US.UTF-8"}
"""PostgreSQL 14 and older: no provider column, every database is libc's."""
LIBC_18 = {"datlocprovider": "c", "datcollate": "en_US.utf8", "datctype": "en_US.utf8", "datlocale": None}
ICU_15 = {"datlocprovider": "i", "datcollate": "C", "datctype": "C", "daticulocale": "und"}
ICU_18 = {"datlocprovider": "i", "datcollate": "C", "datctype": "C", "datlocale": "und", "daticurules": None}
BUILTIN_18 = {"datlocprovider": "b", "datcollate": "C.UTF-8", "datctype": "C.UTF-8", "datlocale": "C.UTF-8"}


def _db(name: str) -> DatabaseConnection:
    return DatabaseConnection(
        secret=f"shop/{name}", host=f"{name}-0.{name}", port=5432, username="app", password="x", database="orders"
    )


def test_every_version_spells_the_same_libc_locale_alike() -> None:
    assert DatabaseLocale.of("UTF8", LIBC_14).collation == DatabaseLocale.of("UTF8", LIBC_18).collation
    described = DatabaseLocale.of("UTF8", LIBC_14).describe_collation()
    assert described == "libc, LC_COLLATE en_US.UTF-8, LC_CTYPE en_US.UTF-8"


def test_the_icu_locale_is_read_from_either_column_of_its_version() -> None:
    before_17, since_17 = DatabaseLocale.of("UTF8", ICU_15), DatabaseLocale.of("UTF8", ICU_18)

    assert before_17 == since_17
    assert since_17.describe_collation() == "icu locale und, LC_COLLATE C, LC_CTYPE C"
    assert since_17.create_clause() == (
        "ENCODING 'UTF8' LOCALE_PROVIDER icu ICU_LOCALE 'und' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    )


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (LIBC_18, ICU_18),  # a move to ICU with the new major version
        (ICU_18, {**ICU_18, "daticurules": "&a < b"}),
        (LIBC_18, {**LIBC_18, "datctype": "C"}),
        (LIBC_18, BUILTIN_18),
        ({"datcollate": "C", "datctype": "C"}, {"datcollate": "C.UTF-8", "datctype": "C.UTF-8"}),
    ],
)
def test_other_rules_for_text_are_warned_of_and_not_refused(source: dict[str, str], target: dict[str, str]) -> None:
    source_locale, target_locale = DatabaseLocale.of("UTF8", source), DatabaseLocale.of("UTF8", target)

    warning = collation_warning(source_locale, target_locale, _db("orders-db"), _db("orders-db-18"))

    assert warning is not None
    assert f"{target_locale.describe_collation()}, against {source_locale.describe_collation()}" in warning
    assert encoding_problem(source_locale, target_locale, _db("orders-db"), _db("orders-db-18")) is None


def test_c_and_posix_are_one_locale() -> None:
    posix = DatabaseLocale.of("UTF8", {"datcollate": "POSIX", "datctype": "POSIX"})
    plain = DatabaseLocale.of("UTF8", {"datcollate": "C", "datctype": "C"})

    assert collation_warning(posix, plain, _db("a"), _db("b")) is None


def test_another_encoding_is_refused_whatever_the_collation() -> None:
    source, target = DatabaseLocale.of("SQL_ASCII", LIBC_14), DatabaseLocale.of("UTF8", LIBC_14)

    problem = encoding_problem(source, target, _db("orders-db"), _db("orders-db-18"))

    assert problem is not None
    assert "is in encoding UTF8" in problem
    assert "in SQL_ASCII." in problem
    assert "Point Secret shop/orders-db-18 at a database in SQL_ASCII (CREATE DATABASE ... ENCODING 'SQL_ASCII'" in (
        problem
    )


def test_a_quote_in_a_locale_name_stays_inside_its_literal() -> None:
    odd = DatabaseLocale.of("UTF8", {"datcollate": "x'y", "datctype": "C"})

    assert "LC_COLLATE 'x''y'" in odd.create_clause()
