"""What a worker knows of the versions its own status writes of Migrations produced, or its gate read; what that
saves is in tests/activities/test_mirror_status.py."""

from __future__ import annotations

from typing import Any

from activities.known_versions import KnownVersion, KnownVersions


def _migration(uid: str, resource_version: str, **status: Any) -> dict[str, Any]:
    """A Migration as the API server answers a write of its status."""
    return {"metadata": {"name": "orders-db-to-16", "uid": uid, "resourceVersion": resource_version}, "status": status}


def test_a_written_migration_is_known_by_its_uid_with_its_steps_attempts_and_whether_progress_shows() -> None:
    versions = KnownVersions()

    versions.remember(
        _migration("uid-1", "41", steps=[{"name": "snapshot", "attempts": 2}, {"name": "migrate"}], progress={})
    )

    assert versions.get("uid-1") == KnownVersion("41", {"snapshot": 2, "migrate": 0}, shows_progress=True)
    assert versions.get("uid-2") is None, "another object under the same name is not known"


def test_a_failed_write_forgets_the_version_it_carried_but_not_a_newer_one_another_write_left() -> None:
    versions = KnownVersions()
    versions.remember(_migration("uid-1", "41"))
    versions.remember(_migration("uid-1", "42"))

    versions.forget("uid-1", "41")
    assert versions.get("uid-1") == KnownVersion("42", {}, shows_progress=False)

    versions.forget("uid-1", "42")
    assert versions.get("uid-1") is None


def test_past_its_limit_the_migration_written_longest_ago_is_forgotten() -> None:
    versions = KnownVersions(limit=2)
    for uid in ("uid-1", "uid-2", "uid-1", "uid-3"):
        versions.remember(_migration(uid, "7"))

    assert [uid for uid in ("uid-1", "uid-2", "uid-3") if versions.get(uid) is not None] == ["uid-1", "uid-3"]


def test_a_read_teaches_a_version_only_of_a_migration_no_write_has_told_about() -> None:
    versions = KnownVersions()
    versions.learn(_migration("uid-1", "40"))
    assert versions.get("uid-1") == KnownVersion("40", {}, shows_progress=False)

    versions.remember(_migration("uid-1", "42"))
    versions.learn(_migration("uid-1", "41"))  # sent before the write's answer came: maybe older, it cannot tell

    assert versions.get("uid-1") == KnownVersion("42", {}, shows_progress=False)
