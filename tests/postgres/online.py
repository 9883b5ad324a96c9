"""Mode Online's steps for one Migration, called the way the saga calls them, and what is left of a replication.

`leftovers` is what a person would look for after a rollback: ferry's replication slots
and publications on the source, its subscriptions on the target. Slots live in the
instance, not in a database, so they are counted for the test's source database by
pg_replication_slots.database.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.postgres.activities import PostgresActivities
from activities.postgres.replicating import ReplicationActivities
from activities.postgres.replication import name
from devstack.stack.postgres import PostgresEndpoint
from ferry.api.migration import DriverSpec, SnapshotSpec
from ferry.api.saga import (
    AheadComparison,
    CatchUpInput,
    CatchUpResult,
    CheckFrozenInput,
    EndReplicationInput,
    EndReplicationResult,
    FreezeInput,
    FreezeResult,
    MigrationRef,
    PrecheckInput,
    PrecheckResult,
    ReplicateInput,
    ReplicateResult,
    UndoFreezeInput,
    VerifyInput,
    VerifyResult,
)
from tests.end_to_end import Databases
from tests.postgres.data import connect


@dataclasses.dataclass
class OnlineSteps:
    """The driver's steps of mode Online for one Migration."""

    env: ActivityEnvironment
    postgres: PostgresActivities
    replication: ReplicationActivities
    ref: MigrationRef
    driver: DriverSpec
    snapshot_spec: SnapshotSpec

    @property
    def name(self) -> str:
        """The publication's, the slot's and the subscription's name."""
        return name(self.ref.uid)

    def precheck(self, **changes: Any) -> PrecheckResult:
        call = PrecheckInput(ref=self.ref, driver=self.driver, snapshot=self.snapshot_spec, **changes)
        return self.env.run(self.postgres.precheck, call)

    def replicate(self) -> ReplicateResult:
        return self.env.run(self.replication.replicate, ReplicateInput(ref=self.ref, driver=self.driver))

    def freeze(self) -> FreezeResult:
        return self.env.run(self.postgres.freeze, FreezeInput(ref=self.ref, driver=self.driver))

    def undo_freeze(self) -> None:
        self.env.run(self.postgres.undo_freeze, UndoFreezeInput(ref=self.ref, driver=self.driver))

    def catch_up(self) -> CatchUpResult:
        return self.env.run(self.replication.catch_up, CatchUpInput(ref=self.ref, driver=self.driver))

    def verify(self, ahead: AheadComparison | None = None) -> VerifyResult:
        """verify; `ahead` is what replicate compared before the freeze, as the saga passes it in mode Online."""
        return self.env.run(self.postgres.verify, VerifyInput(ref=self.ref, driver=self.driver, ahead=ahead))

    def check_frozen(self, frozen: FreezeResult) -> None:
        assert frozen.fence is not None
        call = CheckFrozenInput(ref=self.ref, driver=self.driver, fence=frozen.fence, before="switch-traffic")
        self.env.run(self.postgres.check_frozen, call)

    def undo_catch_up(self) -> EndReplicationResult:
        return self.env.run(self.replication.undo_catch_up, EndReplicationInput(ref=self.ref, driver=self.driver))

    def undo_replicate(self) -> EndReplicationResult:
        return self.env.run(self.replication.undo_replicate, EndReplicationInput(ref=self.ref, driver=self.driver))


def slots(source: PostgresEndpoint) -> list[str]:
    """Every replication slot of the source's database (the subscription's and table synchronization ones)."""
    with connect(source) as conn:
        rows = conn.execute(
            "select slot_name from pg_replication_slots where database = current_database() order by 1"
        ).fetchall()
    return [row[0] for row in rows]


def leftovers(databases: Databases) -> dict[str, list[str]]:
    """What is left of any replication: slots and publications on the source, subscriptions on the target."""
    with connect(databases.source) as conn:
        publications = [row[0] for row in conn.execute("select pubname from pg_publication order by 1")]
    with connect(databases.target) as conn:
        subscriptions = [
            row[0]
            for row in conn.execute(
                "select subname from pg_subscription s join pg_database d on d.oid = s.subdbid "
                "where d.datname = current_database() order by 1"
            )
        ]
    return {"slots": slots(databases.source), "publications": publications, "subscriptions": subscriptions}


NOTHING = {"slots": [], "publications": [], "subscriptions": []}
"""What `leftovers` finds where no replication is."""


def replica_identity(endpoint: PostgresEndpoint, table: str) -> str:
    with connect(endpoint) as conn:
        row = conn.execute("select relreplident from pg_class where oid = to_regclass(%s)", (table,)).fetchone()
    assert row is not None
    return str(row[0])
