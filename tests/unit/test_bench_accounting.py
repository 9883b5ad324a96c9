"""The fleet benchmark's CPU account: who used the machine in the seconds after the apply."""

from __future__ import annotations

import os

import pytest

from scripts.bench_fleet import CpuAccount

TICK = os.sysconf("SC_CLK_TCK")


def test_each_process_is_charged_what_it_used_between_the_two_moments() -> None:
    before = {1: ("kube-apiserver", 10 * TICK), 2: ("worker-a", 3 * TICK)}
    after = {1: ("kube-apiserver", 14 * TICK), 2: ("worker-a", 4 * TICK)}

    account = CpuAccount.between(((0, 0), (150, 200)), (before, after))

    assert account.by_process == {"kube-apiserver": 4.0, "worker-a": 1.0}
    assert account.busy == pytest.approx(0.75)


def test_a_process_born_in_between_is_charged_all_it_used() -> None:
    account = CpuAccount.between(((0, 0), (1, 1)), ({}, {7: ("pg_dump", 2 * TICK)}))

    assert account.by_process == {"pg_dump": 2.0}


def test_a_kernel_thread_that_renamed_itself_is_charged_only_what_it_used_since() -> None:
    before = {9: ("kworker/u8:1-events", 500 * TICK)}
    after = {9: ("kworker/u8:1-ext4-rsv-conversion", 501 * TICK)}

    account = CpuAccount.between(((0, 0), (1, 1)), (before, after))

    assert account.by_process == {"kworker/u8:1-ext4-rsv-conversion": 1.0}


def test_a_reused_pid_is_a_new_process() -> None:
    before = {5: ("psql", 40 * TICK)}
    after = {5: ("pg_restore", 3 * TICK)}

    account = CpuAccount.between(((0, 0), (1, 1)), (before, after))

    assert account.by_process == {"pg_restore": 3.0}
