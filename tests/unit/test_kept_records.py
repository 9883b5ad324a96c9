"""Which entries ferry's per-Migration records keep: the newest by the time their stamps name, the one written kept."""

from __future__ import annotations

from datetime import UTC, datetime

from activities.postgres.kept_records import UNREADABLE, newest, written_at


def _at(entry: dict[str, str]) -> str:
    return entry["at"]


def test_a_stamp_is_read_as_the_time_it_names_in_every_form_ferry_wrote_with_its_offset() -> None:
    moment = datetime(2026, 5, 6, 10, 0, 0, 123456, tzinfo=UTC)
    assert written_at("2026-05-06T10:00:00.123456Z") == moment
    assert written_at("2026-05-06 10:00:00.123456+00") == moment, "an older ferry's, DateStyle ISO, in UTC"
    assert written_at("2026-05-06 06:00:00.123456-04") == moment, "the same, in America/New_York"
    assert written_at("2026-05-06 15:30:00.123456+05:30") == moment


def test_a_stamp_that_names_no_offset_or_is_no_time_is_unreadable() -> None:
    assert written_at("06/05/2026 06:00:00.123456 EDT") == UNREADABLE, "DateStyle SQL: the zone is an abbreviation"
    assert written_at("06.05.2026 06:00:00.123456 EDT") == UNREADABLE, "DateStyle German"
    assert written_at("Wed May 06 06:00:00.123456 2026 EDT") == UNREADABLE, "DateStyle Postgres"
    assert written_at("2026-05-06 10:00:00") == UNREADABLE, "no offset: which zone?"
    assert written_at("") == UNREADABLE
    assert written_at(None) == UNREADABLE


def test_the_newest_by_time_are_kept_not_those_whose_text_sorts_last() -> None:
    entries = {
        "utc": {"at": "2026-05-06 09:00:00+00"},
        "new-york": {"at": "2026-05-06 06:00:00-04"},  # an hour after "utc", though its text sorts first
        "sql": {"at": "06/05/2026 06:30:00 EDT"},
        "written": {"at": "2026-05-06T10:01:00.000000Z"},
    }
    assert list(newest(entries, _at, 3, "written")) == ["utc", "new-york", "written"]
    assert list(newest(entries, _at, 2, "written")) == ["new-york", "written"]


def test_the_entry_written_is_kept_whatever_its_stamp_says() -> None:
    """Its stamp may name a time before the others' (the server's clock stepped back): it is the newest all the same."""
    entries = {
        "earlier": {"at": "2026-05-06T10:00:00.000000Z"},
        "written": {"at": "2026-05-06T09:00:00.000000Z"},
    }
    assert list(newest(entries, _at, 1, "written")) == ["written"]
    assert list(newest(entries, _at, 32, "written")) == ["earlier", "written"]


def test_fewer_entries_than_kept_all_stay() -> None:
    entries = {name: {"at": f"2026-05-06T10:0{minute}:00.000000Z"} for minute, name in enumerate("abc")}
    assert list(newest(entries, _at, 4, "c")) == ["a", "b", "c"]
