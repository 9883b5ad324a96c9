"""A write to the target while verify reads it is never taken into verify's mark.

Until traffic moves, the target is ferry's alone; but a job scheduled on the target's
server, or a client sent there early, can write to it. verify ends the target's sessions
before its first read and again before its mark; a write in between, to a table it had
already compared, would otherwise be in the mark without ever having been compared with
the source. Every later check (the seal before switch-traffic, check_unwritten before
traffic goes back, the undos' vouching) counts from the mark, so that row would pass for
the source's data: a rollback would send traffic back and empty the target with it.
"""

from __future__ import annotations

from typing import Any

import pytest

from activities.postgres import verifying
from activities.postgres.unwritten import TargetWrittenDuringVerify
from ferry.api.errors import VerificationMismatch
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import connect, verified_mark


def _writes_once_compared(monkeypatch: pytest.MonkeyPatch, databases: Databases, statement: str) -> None:
    """Runs `statement` on the target, as another client, once verify's first comparison is done (every table read),
    before its mark."""
    compare = verifying.compare
    written = False

    def then_write(*args: Any, **kwargs: Any) -> verifying.Comparison:
        nonlocal written
        comparison = compare(*args, **kwargs)
        if not written:
            written = True
            with connect(databases.target) as conn:
                conn.execute(statement)
        return comparison

    monkeypatch.setattr(verifying, "compare", then_write)


def test_a_row_written_to_the_target_while_verify_read_it_fails_verify_and_marks_nothing(
    restored: Steps, databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    _writes_once_compared(monkeypatch, databases, "insert into audit.log (order_id, note) values (1, 'a cron job')")

    with pytest.raises(TargetWrittenDuringVerify, match="1 row was inserted, updated or deleted"):
        restored.verify()
    assert verified_mark(databases.target) is None

    # The next attempt reads every table again, and sees the row the source lacks.
    with pytest.raises(VerificationMismatch, match=r"audit\.log"):
        restored.verify()
    assert verified_mark(databases.target) is None


def test_a_write_that_left_the_targets_rows_as_they_were_still_fails_that_attempt_alone(
    restored: Steps, databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    _writes_once_compared(monkeypatch, databases, "update shop.customers set email = email where id = 1")

    with pytest.raises(TargetWrittenDuringVerify, match="while verify compared it"):
        restored.verify()

    result = restored.verify()
    assert result.target_fence is not None
    assert verified_mark(databases.target) is not None
