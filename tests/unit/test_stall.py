"""Mode Online's stall detection: a replication that applies nothing fails only when it fails or does not stream."""

from __future__ import annotations

import time

from activities.postgres.replicating import Stall


def test_a_replication_that_does_not_stream_counts_as_stalled_without_any_error_counted() -> None:
    stall = Stall(0.05)
    assert stall.seconds("0/1", 0, streaming=False) is None
    time.sleep(0.1)
    stalled = stall.seconds("0/1", 0, streaming=False)
    assert stalled is not None
    assert stalled > 0.05


def test_a_streaming_replication_with_nothing_to_apply_never_counts_as_stalled() -> None:
    stall = Stall(0.05)
    stall.seconds("0/1", 0, streaming=True)
    time.sleep(0.1)
    assert stall.seconds("0/1", 0, streaming=True) is None


def test_errors_counted_while_nothing_moves_count_as_stalled_and_a_move_starts_again() -> None:
    stall = Stall(0.05)
    stall.seconds("0/1", 3)
    time.sleep(0.1)
    assert stall.seconds("0/1", 4) is not None
    assert stall.seconds("0/2", 4) is None, "the position moved"
