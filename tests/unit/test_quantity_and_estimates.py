"""Sizes from Kubernetes quantities, and the plan's estimates from the precheck's measured rates."""

from __future__ import annotations

import pytest

from ferry.api.migration import Throughput
from ferry.api.quantity import quantity_bytes
from ferry.api.saga import PrecheckResult
from workflows.plan import estimate

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("quantity", "size"),
    [
        ("20Gi", 20 * 2**30),
        ("1.5G", 1_500_000_000),
        ("512Mi", 2**29),
        ("100", 100),
        ("1e3", 1000),
        ("500m", 1),
        ("1Ei", 2**60),
        ("2E", 2 * 10**18),  # exbi and exa, not exponents
    ],
)
def test_a_quantity_is_the_number_of_bytes_it_stands_for(quantity: str, size: int) -> None:
    assert quantity_bytes(quantity) == size


@pytest.mark.parametrize("quantity", ["", "Gi", "20Gb", "twenty"])
def test_what_is_not_a_quantity_is_refused_naming_it(quantity: str) -> None:
    with pytest.raises(ValueError, match=repr(quantity)):
        quantity_bytes(quantity)


def _checked(**rates: float) -> PrecheckResult:
    throughput = Throughput(**{"source_read": 1.0, "target_write": 1.0, "upload": 1.0, "sample_bytes": 1, **rates})
    return PrecheckResult(
        source_version="15", target_version="18", tools_version="18", source_size_bytes=100, throughput=throughput
    )


def test_the_slowest_of_reading_uploading_and_restoring_sets_the_snapshots_estimate_and_migrate_takes_none() -> None:
    uploading_slowest = estimate(_checked(source_read=50.0, upload=10.0, target_write=20.0))
    restoring_slowest = estimate(_checked(source_read=50.0, upload=20.0, target_write=5.0))

    assert uploading_slowest is not None
    assert restoring_slowest is not None
    assert (uploading_slowest.snapshot_seconds, uploading_slowest.migrate_seconds) == (10.0, 0.0)
    assert (restoring_slowest.snapshot_seconds, restoring_slowest.migrate_seconds) == (20.0, 0.0)
    assert uploading_slowest.verify_seconds == 2.0
    assert uploading_slowest.write_downtime_seconds == 10.0 + 2.0 + 5.0


@pytest.mark.parametrize("unknown", ["source_read", "target_write", "upload"])
def test_no_estimate_is_made_when_a_rate_could_not_be_measured(unknown: str) -> None:
    assert estimate(_checked(**{unknown: 0.0})) is None
