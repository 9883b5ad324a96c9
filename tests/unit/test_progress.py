"""What a running data step says of its progress in status.progress, and how often it says it, on a clock of the
test's own."""

from __future__ import annotations

import dataclasses
import io
import logging
from datetime import UTC, datetime

import pytest
from kubernetes import client as k8s
from temporalio.testing import ActivityEnvironment

from activities.progress import WINDOW, Meter, duration, rows, size, summary
from activities.progress_status import ProgressWriter
from devstack.stack.readiness import free_port
from ferry.api.saga import MigrationRef
from ferry.kubectl import progress as display

MIB = 2**20
REF = MigrationRef(namespace="shop", name="orders-db-to-16", uid="0b7c")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_migrate_says_bytes_of_the_total_throughput_and_time_left() -> None:
    meter = Meter("migrate", interval=5, now=0)
    meter.update(10, bytes_done=380 * MIB, bytes_total=1229 * MIB)

    figures = meter.figures(10)

    assert figures.bytes_per_second == 38 * MIB
    assert figures.seconds_left == 22
    assert figures.summary == "migrate: 380 MiB of 1.2 GiB, 38 MiB/s, ~22s left"


def test_a_snapshot_has_no_total_beforehand_so_no_time_left() -> None:
    meter = Meter("snapshot", interval=5, now=0)
    meter.update(4, bytes_done=6 * MIB)

    figures = meter.figures(4)

    assert figures.seconds_left is None
    assert figures.summary == "snapshot: 6.0 MiB, 1.5 MiB/s"


def test_verify_counts_rows_of_an_estimate() -> None:
    meter = Meter("verify", interval=5, now=0)
    meter.update(0, rows_done=0, rows_total=600_000)
    meter.update(4, rows_done=120_000)

    assert meter.figures(4).summary == "verify: 120k of 600k rows, 30k rows/s, ~16s left"


def test_the_throughput_follows_the_last_seconds_not_the_whole_attempt() -> None:
    meter = Meter("migrate", interval=5, now=0)
    for second in range(0, 61):
        # 10 MiB/s for a minute, except the last 20 s at 1 MiB/s
        done = second * 10 * MIB if second <= 40 else 400 * MIB + (second - 40) * MIB
        meter.update(second, bytes_done=done, bytes_total=1000 * MIB)

    rate = meter.figures(60).bytes_per_second

    assert rate is not None
    window_rate = (420 - (400 - 10 * (WINDOW - 20))) * MIB / WINDOW
    assert rate == pytest.approx(window_rate)
    assert rate < 5 * MIB < (420 / 60) * MIB, "slower than the attempt's average"


def test_no_throughput_in_the_first_second_and_no_time_left_without_one() -> None:
    meter = Meter("migrate", interval=5, now=0)
    meter.update(0.5, bytes_done=MIB, bytes_total=10 * MIB)

    figures = meter.figures(0.5)

    assert (figures.bytes_per_second, figures.seconds_left) == (None, None)
    assert figures.summary == "migrate: 1.0 MiB of 10 MiB"


def test_at_most_one_write_per_interval_and_none_while_it_would_say_the_same() -> None:
    meter = Meter("migrate", interval=5, now=0)
    assert meter.due(0) is None, "nothing counted yet"

    meter.update(1, bytes_done=MIB, bytes_total=100 * MIB)
    first = meter.due(1)
    assert first is not None
    meter.written(first, 1)

    meter.update(2, bytes_done=2 * MIB)
    assert meter.due(2) is None, "a write 1 s ago"
    assert meter.due(5.9) is None
    second = meter.due(6)
    assert second is not None
    assert second.reading.bytes_done == 2 * MIB
    meter.written(second, 6)

    stalled = meter.due(40)
    assert stalled is not None, "nothing moved, but the throughput over the last seconds fell"
    assert stalled.summary == "migrate: 2.0 MiB of 100 MiB, 0 B/s"
    meter.written(stalled, 40)
    assert meter.due(50) is None, "it would say the same"
    meter.update(51, bytes_done=3 * MIB)
    assert meter.due(51) is not None


def test_sizes_counts_and_durations_read_short() -> None:
    assert [size(n) for n in (950, 1536, 412 * MIB, 1.2 * 2**30)] == ["950 B", "1.5 KiB", "412 MiB", "1.2 GiB"]
    assert [rows(n) for n in (950, 12_345, 1_200_000)] == ["950", "12k", "1.2M"]
    assert [duration(s) for s in (21, 185, 3725)] == ["21s", "3m05s", "1h02m"]


def test_a_later_attempt_says_which() -> None:
    meter = Meter("migrate", interval=5, now=0)
    meter.update(2, bytes_done=MIB)

    figures = meter.figures(2)

    assert summary(dataclasses.replace(figures, attempt=2)) == "migrate (attempt 2): 1.0 MiB, 512 KiB/s"


def test_an_api_server_that_does_not_answer_costs_one_warning_and_never_fails_the_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nobody = k8s.Configuration()
    nobody.host = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    clock = Clock()

    def step() -> int:
        with ProgressWriter(k8s.ApiClient(nobody), REF, "migrate", interval=0.05, clock=clock) as progress:
            for done in range(1, 12):
                clock.now += 1
                progress.update(bytes_done=done * MIB, bytes_total=12 * MIB)
                # Let the writer try a few times; each try fails at once (connection refused).
                progress._stop.wait(0.02)
        return progress.writes

    with caplog.at_level(logging.WARNING):
        writes = ActivityEnvironment().run(step)

    assert writes == 0
    ours = [r for r in caplog.records if r.name.startswith("temporalio")]  # urllib3 warns of its own retries
    warnings = [r.getMessage() for r in ours if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "could not write the progress of Migration shop/orders-db-to-16" in warnings[0]


# --- what people see -----------------------------------------------------------------------

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
MIGRATING = {
    "phase": "Running",
    "currentStep": "migrate",
    "message": "migrate: running (attempt 1)",
    "steps": [
        {"name": "snapshot", "state": "Succeeded", "attempts": 1},
        {"name": "migrate", "state": "Running", "attempts": 1, "startedAt": "2026-11-22T11:59:50Z"},
    ],
}


def _with_progress(done: int, text: str, **fields: object) -> dict[str, object]:
    progress = {"step": "migrate", "attempt": 1, "bytesDone": done, "bytesTotal": 100 * MIB, "summary": text}
    return {**MIGRATING, "progress": {**progress, **fields}}


def test_the_running_step_shows_its_progress_with_a_bar() -> None:
    status = _with_progress(25 * MIB, "migrate: 25 MiB of 100 MiB, 5.0 MiB/s, ~15s left")

    shown = display.step_lines(status, None, T0)

    assert shown[1].endswith("[######..................]  25% 25 MiB of 100 MiB, 5.0 MiB/s, ~15s left")


def test_progress_of_another_step_or_an_earlier_attempt_is_not_shown() -> None:
    for stale in ({"step": "snapshot"}, {"attempt": 2}):
        status = _with_progress(25 * MIB, "old news", **stale)

        assert "old news" not in "\n".join(display.step_lines(status, None, T0))


def test_without_a_terminal_each_new_progress_is_one_line_and_an_unchanged_one_none() -> None:
    out = io.StringIO()
    shown = display.Display(out, interactive=False)

    shown.render(_with_progress(10 * MIB, "migrate: 10 MiB of 100 MiB"), None, T0)
    shown.render(_with_progress(10 * MIB, "migrate: 10 MiB of 100 MiB"), None, T0)
    shown.render(_with_progress(60 * MIB, "migrate: 60 MiB of 100 MiB, 10 MiB/s, ~4s left"), None, T0)

    progress_lines = [line for line in out.getvalue().splitlines() if "MiB of" in line]
    assert progress_lines == [
        "12:00:00   migrate: 10 MiB of 100 MiB",
        "12:00:00   migrate: 60 MiB of 100 MiB, 10 MiB/s, ~4s left",
    ]
