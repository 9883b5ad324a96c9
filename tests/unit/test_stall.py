"""Mode Online's stall detection (replicating.Stall), on a clock of the test's own.

Broken means something has been wrong for longer than the limit, without a break, while
nothing was applied: not that nothing was applied for that long and something was wrong
once. An idle source writes no WAL, so the slot's confirmed position stands still for
hours (a weekend's approval wait); one look that catches the target's Pod restarting,
the apply worker reconnecting, or one error it recovers from must not roll back a
healthy migration.
"""

from __future__ import annotations

import pytest

from activities.postgres.replicating import Stall

LIMIT = 60.0
"""--replication-stall-timeout's default."""
POLL = 1.0
"""--replication-poll-interval's default: a look every second."""
HOURS = 3 * 3600.0
POSITION = "0/3000148"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Looks:
    """A replication looked at every `interval` seconds (POLL by default) by a Stall on the test's clock."""

    def __init__(self, limit: float = LIMIT, interval: float = POLL) -> None:
        self.clock = Clock()
        self.interval = interval
        self.stall = Stall(limit, interval, clock=self.clock)
        self.errors = 0

    def look(self, *, rose: bool = False, streaming: bool = True, position: str = POSITION) -> float | None:
        """One look, `interval` seconds after the previous one; `rose`: the workers failed once more since then."""
        self.clock.now += self.interval
        self.errors += rose
        return self.stall.seconds(position, self.errors, streaming)

    def healthy_for(self, seconds: float, position: str = POSITION) -> None:
        for _ in range(round(seconds / POLL)):
            assert self.look(position=position) is None, "a healthy replication is never broken"

    def troubled_for(self, seconds: float, *, rose: bool = False, streaming: bool = False) -> list[float | None]:
        return [self.look(rose=rose, streaming=streaming) for _ in range(round(seconds / POLL))]


troubles = pytest.mark.parametrize(
    ("rose", "streaming"), [(False, False), (True, True)], ids=["not streaming", "errors rose"]
)


@pytest.fixture
def idle() -> Looks:
    """A healthy replication of an idle source: its position has stood still for hours."""
    looks = Looks()
    looks.healthy_for(HOURS)
    return looks


def test_a_streaming_replication_with_nothing_to_apply_is_never_broken(idle: Looks) -> None:
    idle.healthy_for(HOURS)


@troubles
def test_one_troubled_look_on_an_idle_source_is_not_broken(idle: Looks, rose: bool, streaming: bool) -> None:
    """The target's Pod restarted for 5 s, the apply worker was reconnecting, or it failed once and recovered."""
    assert idle.look(rose=rose, streaming=streaming) is None
    idle.healthy_for(HOURS)


@troubles
def test_a_few_seconds_of_trouble_on_an_idle_source_are_not_broken(idle: Looks, rose: bool, streaming: bool) -> None:
    assert idle.troubled_for(5, rose=rose, streaming=streaming) == [None] * 5
    idle.healthy_for(HOURS)


def test_not_streaming_for_longer_than_the_limit_is_broken_and_not_failing(idle: Looks) -> None:
    seen = idle.troubled_for(LIMIT + 2)

    assert seen[: int(LIMIT) + 1] == [None] * (int(LIMIT) + 1), "not while the trouble is at most the limit old"
    assert seen[int(LIMIT) + 1] == LIMIT + POLL, "how long it has been wrong, not how long the position stood still"
    assert not idle.stall.failing, "no error was counted: it stalled not streaming"


def test_errors_rising_at_every_look_for_longer_than_the_limit_are_broken_and_failing(idle: Looks) -> None:
    seen = idle.troubled_for(LIMIT + 2, rose=True, streaming=True)

    assert seen[: int(LIMIT)] == [None] * int(LIMIT)
    assert seen[-1] is not None
    assert idle.stall.failing


def test_a_crash_loop_whose_errors_rise_only_every_fifth_look_is_broken_after_the_limit(idle: Looks) -> None:
    """PostgreSQL starts a failed apply worker again after wal_retrieve_retry_interval (5 s): between two failures it
    looks healthy, running and with no new error."""
    seen = [idle.look(rose=number % 5 == 0) for number in range(int(LIMIT) + 10)]

    assert seen[: int(LIMIT)] == [None] * int(LIMIT), "not before the limit"
    assert any(stalled is not None for stalled in seen[int(LIMIT) :]), "broken within a crash loop's period after it"
    assert idle.stall.failing


def test_a_crash_loop_whose_worker_is_mostly_gone_is_broken_after_the_limit_as_failing(idle: Looks) -> None:
    """A failed worker's absence explains nothing by itself: its counted failures say why."""
    seen = [idle.look(rose=number % 5 == 0, streaming=number % 5 == 1) for number in range(int(LIMIT) + 10)]

    assert any(stalled is not None for stalled in seen)
    assert idle.stall.failing


def test_the_grace_is_half_the_limit_at_least_fifteen_seconds_and_two_intervals() -> None:
    assert Stall(60).grace == 30
    assert Stall(600).grace == 300
    assert Stall(10).grace == 15
    assert Stall(60, interval=45).grace == 90, "and twice the interval between looks"


def test_short_episodes_apart_by_more_than_the_grace_are_not_one_long_one(idle: Looks) -> None:
    grace = idle.stall.grace
    assert idle.troubled_for(LIMIT - 20) == [None] * int(LIMIT - 20)
    idle.healthy_for(grace + POLL)
    assert idle.troubled_for(LIMIT - 20, rose=True) == [None] * int(LIMIT - 20), (
        "the trouble began more than the limit ago, but not without a break"
    )
    idle.healthy_for(grace + POLL)
    assert idle.troubled_for(LIMIT + 2)[-1] is not None, "an episode of its own that lasts, is broken"
    assert not idle.stall.failing, "this episode counted no error: the earlier one's do not make it failing"


def test_a_look_that_cannot_tell_ends_an_episode_once_the_grace_has_passed(idle: Looks) -> None:
    """The watch cannot look at the slot while the source is unreachable: nothing says the target stayed wrong."""
    assert idle.look(streaming=False) is None
    idle.clock.now += HOURS
    idle.stall.unknown()
    assert idle.look(streaming=False) is None


def test_looks_far_apart_that_all_find_trouble_are_one_episode() -> None:
    """Looks a long poll interval apart (or slow to connect): no look found anything right in between, so the trouble
    lasted; the grace covers two intervals, so a look that finds nothing wrong in between does not end it either."""
    looks = Looks(interval=45)
    assert looks.stall.grace == 90
    assert looks.look() is None, "the first look: where the position stands"
    assert looks.look(streaming=False) is None
    assert looks.look() is None, "a look that found nothing wrong, within the grace"
    assert looks.look(streaming=False) == 90, "broken: wrong for longer than the 60 s limit"


def test_the_position_moving_ends_an_episode(idle: Looks) -> None:
    assert idle.troubled_for(LIMIT - 10) == [None] * int(LIMIT - 10)
    assert idle.look(streaming=False, position="0/3000200") is None, "something was applied"
    assert idle.troubled_for(LIMIT - 10) == [None] * int(LIMIT - 10), "the trouble began again at the move"
    assert idle.troubled_for(15)[-1] is not None


def test_errors_rising_while_the_position_moves_are_not_broken() -> None:
    looks = Looks()
    for number in range(int(LIMIT) * 3):
        assert looks.look(rose=True, position=f"0/{number:X}") is None
