"""A Migration object from the API server, read once into ferry.api's typed model, whatever its spec says."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from ferry.api.migration import FINALIZER, Migration, Phase
from tests import samples

METADATA = {
    "name": "orders-db-to-16",
    "namespace": "shop",
    "uid": "0b7c",
    "generation": 3,
    "resourceVersion": "4711",
    "creationTimestamp": "2026-11-22T12:00:00Z",
    "finalizers": [FINALIZER, "example.com/other"],
    "annotations": {"ferry.dev/approve": "alice"},
    "labels": {"team": "payments"},
}


def listed(**changes: Any) -> dict[str, Any]:
    raw = samples.migration("orders-db-to-16")
    raw["metadata"] = dict(METADATA)
    raw.update(changes)
    return raw


def test_metadata_is_typed_with_times_as_datetimes() -> None:
    migration = Migration.parse(listed())

    metadata = migration.metadata
    assert (metadata.namespace, metadata.name, metadata.uid) == ("shop", "orders-db-to-16", "0b7c")
    assert (metadata.generation, metadata.resource_version) == (3, "4711")
    assert metadata.creation_timestamp == datetime(2026, 11, 22, 12, tzinfo=UTC)
    assert metadata.deletion_timestamp is None
    assert metadata.finalizers == [FINALIZER, "example.com/other"]
    assert metadata.annotations == {"ferry.dev/approve": "alice"}
    assert migration.spec is not None
    assert migration.spec.target.image == "postgres:16"


def test_a_migration_without_status_reads_as_an_empty_unfinished_status() -> None:
    migration = Migration.parse(listed())

    assert migration.status.phase is None
    assert migration.status.workflow is None
    assert not migration.finished
    assert migration.status_problem is None


def test_the_status_is_typed() -> None:
    status = {
        "phase": "Succeeded",
        "workflow": {"namespace": "default", "id": "migration/shop/orders-db-to-16/0b7c"},
        "controls": {"acknowledged": {"ferry.dev/approve": "alice"}},
        "steps": [{"name": "verify", "state": "Succeeded", "startedAt": "2026-11-22T12:01:02.5Z"}],
    }

    migration = Migration.parse(listed(status=status))

    assert migration.status.phase is Phase.SUCCEEDED
    assert migration.finished
    assert migration.status.steps[0].started_at == datetime(2026, 11, 22, 12, 1, 2, 500000, tzinfo=UTC)
    assert migration.status.controls is not None
    assert migration.status.controls.acknowledged == {"ferry.dev/approve": "alice"}


def test_a_deletion_timestamp_is_an_aware_datetime() -> None:
    metadata = {**METADATA, "deletionTimestamp": "2026-11-22T12:30:00Z"}

    migration = Migration.parse(listed(metadata=metadata))

    assert migration.metadata.deletion_timestamp == datetime(2026, 11, 22, 12, 30, tzinfo=UTC)


def test_a_spec_an_older_crd_let_through_is_kept_as_its_problems_not_raised() -> None:
    raw = listed()
    del raw["spec"]["target"]["image"]
    raw["spec"]["target"]["replicas"] = 0

    migration = Migration.parse(raw)

    assert migration.spec is None
    assert migration.spec_problem is not None
    assert "spec.target.image: Field required" in migration.spec_problem
    assert "spec.target.replicas: Input should be greater than or equal to 1" in migration.spec_problem
    assert migration.metadata.finalizers == [FINALIZER, "example.com/other"]  # still enough to let it go


def test_a_status_that_does_not_parse_keeps_the_fields_that_do_and_says_why() -> None:
    deletion = {"message": "rolling back", "waitingSince": "2026-11-25T10:00:00Z", "deadline": "2026-11-25T10:30:00Z"}
    migration = Migration.parse(
        listed(status={"phase": "Exploded", "deletion": deletion, "controls": {"acknowledged": {"ferry.dev/x": "y"}}})
    )

    assert migration.status.phase is None
    assert migration.status_problem is not None
    assert migration.status_problem.startswith("status.phase: Input should be")
    assert migration.status.deletion is not None, "the deletion's deadline still counts"
    assert migration.status.deletion.deadline.isoformat() == "2026-11-25T10:30:00+00:00"
    assert migration.status.controls is not None
    assert migration.status.controls.acknowledged == {"ferry.dev/x": "y"}


def test_a_status_that_is_not_an_object_reads_as_empty() -> None:
    migration = Migration.parse(listed(status="gone wrong"))

    assert migration.status.phase is None
    assert migration.status_problem is not None


def test_an_object_without_the_metadata_every_object_has_is_refused() -> None:
    raw = listed()
    del raw["metadata"]["uid"]

    with pytest.raises(ValidationError):
        Migration.parse(raw)


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("storageSize", "8Ei", "'8Ei' is more than 1Ei"),  # 2^63 bytes: no integer the API server takes
        ("storageSize", "9999999Pi", "'9999999Pi' is more than 1Ei"),
    ],
)
def test_a_size_beyond_what_the_status_can_hold_is_refused_naming_it(field: str, value: str, problem: str) -> None:
    raw = listed()
    raw["spec"]["target"][field] = value

    migration = Migration.parse(raw)

    assert migration.spec is None
    assert migration.spec_problem is not None
    assert problem in migration.spec_problem


def test_sizes_in_exa_and_exbi_up_to_the_limit_are_read_as_such() -> None:
    raw = listed()
    raw["spec"]["target"]["storageSize"] = "1Ei"

    migration = Migration.parse(raw)

    assert migration.spec is not None, migration.spec_problem


def test_a_snapshot_prefix_longer_than_512_bytes_of_utf8_is_refused_though_shorter_in_characters() -> None:
    raw = listed()
    raw["spec"]["snapshot"]["prefix"] = "\u20ac" * 200 + "/"  # 201 characters, 601 bytes

    migration = Migration.parse(raw)

    assert migration.spec is None
    assert migration.spec_problem is not None
    assert "the prefix is 601 bytes in UTF-8, more than 512" in migration.spec_problem
