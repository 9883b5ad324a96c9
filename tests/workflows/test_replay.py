"""Recorded histories still replay: a change to the workflow that breaks determinism fails here.

The histories in histories/ were recorded from test runs of the saga (set
FERRY_RECORD_HISTORIES=1 to record them again, after a deliberate, versioned change).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.migration import MigrationWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_there_are_recorded_histories_to_replay() -> None:
    assert len(HISTORIES) >= 6


@pytest.mark.parametrize("history", HISTORIES, ids=[path.stem for path in HISTORIES])
async def test_recorded_history_replays_without_nondeterminism(history: Path) -> None:
    replayer = Replayer(workflows=[MigrationWorkflow], data_converter=pydantic_data_converter)
    recorded = WorkflowHistory.from_json(f"migration/{history.stem}", history.read_text())  # noqa: ASYNC240

    result = await replayer.replay_workflow(recorded, raise_on_replay_failure=True)

    assert result.replay_failure is None
