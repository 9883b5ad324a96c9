"""Which activity an attempt belongs to, and who holds an advisory lock: what the guards against late attempts share.

An attempt whose worker stood still (SIGSTOP, a frozen VM) or lost Temporal past its
heartbeat timeout is written off, and the saga goes on with another activity; the
attempt, going on later, must not undo what the saga did since. The guards that stop it
record, where they act, which activity acted (`Attempt`, kept as JSON in a database
setting: replication_ended on the source, unwritten's mark on the target), and a late
attempt finds there an activity scheduled after its own (`Attempt.before`). The work and
its guard take an advisory lock, and a holder of it that stands still would hold it for
ever, so the guards end the sessions holding it (`holders`): they are ferry's own, of
attempts the saga wrote off.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from temporalio import activity

from activities.postgres.connection import Connection

HOLDERS = """
select pid from pg_locks
where locktype = 'advisory' and objsubid = 1 and granted and pid <> pg_backend_pid()
and database = (select oid from pg_database where datname = current_database())
and classid = ((%(key)s >> 32) & 4294967295)::oid and objid = (%(key)s & 4294967295)::oid
"""
"""The other sessions of this database holding the advisory lock `key` (a bigint's is classid:objid, objsubid 1)."""


@dataclasses.dataclass(frozen=True)
class Attempt:
    """Which activity an attempt belongs to, as Temporal scheduled it; each of the saga's retries is one of its own."""

    run: str
    """The workflow run that scheduled it."""
    activity: str
    """Its activity id: the run's sequence number of the command that scheduled it (the SDK's default)."""
    scheduled: datetime
    """When Temporal scheduled it (its first attempt)."""
    number: int | None = None
    """Temporal's attempt of that activity: 1, but for the retries of version 1 of the saga, which leaves them to
    Temporal (one activity id, one schedule time); None where a record written before it was kept is read."""

    @staticmethod
    def current() -> Attempt:
        info = activity.info()
        return Attempt(
            run=info.workflow_run_id or "",
            activity=info.activity_id,
            scheduled=info.scheduled_time,
            number=info.attempt,
        )

    def before(self, other: Attempt) -> bool:
        """Whether this attempt's activity was scheduled before `other`'s: by the run's sequence when both are of one
        run (exact), by Temporal's attempt within one activity, else by the Temporal server's clock (a reset's new run
        schedules later than the run it replaces). An attempt number not recorded orders nothing."""
        if self.run == other.run and self.activity == other.activity:
            return self.number is not None and other.number is not None and self.number < other.number
        if self.run == other.run and self.activity.isdigit() and other.activity.isdigit():
            return int(self.activity) < int(other.activity)
        return self.scheduled < other.scheduled

    def as_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {"run": self.run, "activity": self.activity, "scheduled": self.scheduled.isoformat()}
        if self.number is not None:
            value["number"] = self.number
        return value

    @staticmethod
    def from_json(value: Any) -> Attempt:
        """The attempt `as_json` wrote; raises KeyError, TypeError or ValueError when `value` is not one."""
        if not isinstance(value, dict):
            raise TypeError(f"an attempt is a JSON object, not {value!r}")
        number = value.get("number")
        if number is not None and not isinstance(number, int):
            raise TypeError(f"an attempt's number is not a number: {number!r}")
        scheduled = datetime.fromisoformat(value["scheduled"])
        if scheduled.tzinfo is None:
            raise ValueError(f"an attempt's time names no time zone: {value['scheduled']!r}")
        return Attempt(run=str(value["run"]), activity=str(value["activity"]), scheduled=scheduled, number=number)

    def describe(self) -> str:
        number = f", attempt {self.number}" if self.number is not None else ""
        return f"activity {self.activity} of workflow run {self.run}{number}, scheduled at {self.scheduled.isoformat()}"


def holders(conn: Connection, key: int) -> list[int]:
    """The other sessions of `conn`'s database that hold the advisory lock `key`."""
    return [int(pid) for (pid,) in conn.execute(HOLDERS, {"key": key}).fetchall()]
