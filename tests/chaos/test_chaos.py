"""A chaos run in the test suite: small by default, sized by FERRY_CHAOS_* for the long runs (`-m chaos`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from devstack.stack.install import Binaries
from devstack.stack.stack import StackInfo
from tests.chaos.harness import ChaosPlan, ChaosRun, cleanup, own_temporal
from tests.conftest import make_state_dir

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(3600)]


@pytest.fixture
def temporal_dir() -> Iterator[Path]:
    """The state folder of the run's own Temporal server (its SQLite database and log), removed afterwards."""
    folder = make_state_dir("ferry-chaos-temporal-")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_under_kills_rollbacks_and_deletions_every_migration_ends_done_or_undone_with_nothing_left(
    stack: StackInfo,
    binaries: Binaries,
    kube_api: k8s.ApiClient,
    migration_crd: str,
    temporal_dir: Path,
    tmp_path: Path,
) -> None:
    plan = ChaosPlan.from_environment()
    with own_temporal(temporal_dir, binaries) as temporal:
        run = ChaosRun(stack, temporal, kube_api, plan, tmp_path)
        try:
            report = run.run()
            print(f"\n{report.table()}")
        finally:
            print(f"\nlogs of ferry's processes: {tmp_path}")
            cleanup(run)

    assert report.problems == []
    assert sum(report.kills.values()) >= plan.kills
