"""A snapshot's upload parts: planned from the source's size, grown when the dump outgrows them, memory bounded."""

from __future__ import annotations

from activities.parts import MAX_PART, MAX_PARTS, MIB, PartPlan, plan

GIB = 1024 * MIB
TIB = 1024 * GIB


def _plan(estimate: int, **changes: int) -> PartPlan:
    return plan(estimate, **{"smallest": 16 * MIB, "concurrency": 4, "memory": 256 * MIB, **changes})


def test_a_small_source_gets_the_workers_part_size() -> None:
    assert _plan(GIB).first_part == 16 * MIB


def test_a_large_source_fills_at_most_half_of_the_parts_at_first() -> None:
    parts = _plan(500 * GIB)

    assert parts.first_part % MIB == 0
    assert parts.first_part * (MAX_PARTS // 2) >= 500 * GIB
    assert parts.part_size(MAX_PARTS // 2) == parts.first_part


def test_the_part_size_doubles_each_time_half_of_the_free_parts_are_used() -> None:
    parts = _plan(GIB)

    assert [parts.part_size(n) // MIB for n in (1, 5000, 5001, 7500, 7501, 8750, 8751)] == [16, 16, 32, 32, 64, 64, 128]
    assert parts.part_size(MAX_PARTS) == MAX_PART


def test_sixteen_mib_parts_that_grow_hold_700_gib_instead_of_160() -> None:
    assert _plan(0).capacity() > 700 * GIB


def test_a_dump_several_times_its_sources_size_still_fits_its_plan() -> None:
    for estimate in (GIB, 100 * GIB, TIB, 5 * TIB):
        parts = _plan(estimate)
        assert parts.first_part <= MAX_PART
        assert parts.capacity() >= 4 * estimate, estimate


def test_parts_in_flight_shrink_as_parts_grow_and_never_reach_zero() -> None:
    parts = _plan(GIB)

    assert parts.in_flight(16 * MIB) == 4
    assert parts.in_flight(64 * MIB) == 3  # 256 MiB: three uploading and the one being read
    assert parts.in_flight(200 * MIB) == 1
    assert parts.in_flight(MAX_PART) == 1


def test_memory_stays_within_the_budget_or_two_parts() -> None:
    parts = _plan(GIB)
    for size in (5 * MIB, 16 * MIB, 50 * MIB, 100 * MIB, GIB, MAX_PART):
        held = (parts.in_flight(size) + 1) * size
        assert held <= max(parts.memory, 2 * size), size
