"""Mode Online's watch over the replication while the saga waits before the freeze: postgresql.watch_replication.

replicate returns once the target is nearly caught up; the freeze comes later, once a
person approves or resumes, which may be days. All that time the application writes to
the source, and the source's replication slot keeps every change the target has not
confirmed. A replication that breaks then (a deploy adds a column and writes it, the
target's Pod is down, its disk is full) keeps the slot where it is, and with
max_slot_wal_keep_size -1 (PostgreSQL's default) the source's pg_wal grows until its
disk fills and the live source stops. replicate's and catch-up's stall detection
(replicating.Stall) runs only inside those activities; this one runs beside the saga's
wait, which cancels it when the wait ends (workflows/saga.py).

Each look reads the slot's lag on the source and, on the target, whether the
subscription is enabled, whether its apply worker runs, and how often its workers have
failed. Something wrong (a failure counted, the subscription disabled, no apply worker,
the target unreachable, no walsender streaming from the slot) at every look, or at looks
close enough to make one episode of trouble (see replicating.Stall), for longer than
--replication-stall-timeout while the target confirms nothing fails the activity with
ReplicationBroken, naming what went wrong in that episode; one bad look on an idle
source, whose slot stands still for hours, does not. The slot or the subscription gone
fails it at once. A source that cannot be reached is waited for: nothing can be told
about the slot then. A side that stops answering in the middle of a look (a stopped
process, a frozen cgroup, storage that hangs; TCP keepalives do not notice) fails the
look within LOOK_TIMEOUT and a few seconds, as a side that cannot be reached: the watch
never blocks on a look, heartbeating, while the slot keeps the source's WAL. The activity
changes nothing, so it is idempotent; a retry (after a lost worker) watches afresh.

The precheck warns of the same danger before anything starts (see slot_wal).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from kubernetes import client as k8s
from temporalio import activity

from activities.heartbeats import Heartbeats
from activities.postgres import replication, subscription
from activities.postgres.connection import Connection, answering_within, connect
from activities.postgres.identity import Pins
from activities.postgres.replicating import Stall
from activities.secrets import DatabaseConnection, Secrets, secrets_from
from activities.settings import DataActivitySettings
from ferry.api.errors import DatabaseUnreachable, ReplicationBroken
from ferry.api.migration import DriverType
from ferry.api.saga import DriverOperation, WatchReplicationInput, driver_activity

READING = {"default_transaction_read_only": "on"}
"""The watch only reads: its sessions could not write even by mistake."""
LOOK_TIMEOUT = 30.0
"""Seconds a look's query may take. A look reads a few catalog rows, in milliseconds; one still unanswered after
this never will be, and a watch blocked on it would heartbeat as if all were well for as long as its attempt's
timeout (a day), while the slot keeps the source's WAL. The server ends a query at this bound (statement_timeout); a
server that stopped answering (a stopped process, a frozen cgroup, storage that hangs) cannot, and ferry gives its
session up GIVE_UP_AFTER later (connection.answering_within)."""
GIVE_UP_AFTER = 5.0
"""Seconds past LOOK_TIMEOUT ferry waits before giving a silent session up: a live server's own statement_timeout
comes first, and says what it was doing."""
APPLY_WORKERS = "select count(*) from pg_stat_subscription where subid = %s and relid is null and pid is not null"
"""The subscription's apply worker (table synchronization workers have a relid)."""
FAILING, DISABLED, UNREACHABLE, NO_WORKER = "failing", "disabled", "unreachable", "no apply worker"
"""What a look finds wrong on the target, by kind."""
NOT_STREAMING = "not streaming"
"""What a look finds wrong on the source: no walsender streams from the slot, though the target looks fine."""


class ReplicationWatch:
    """Watches a Migration's replication (mode Online), reading connections from the Secrets the Migration names."""

    def __init__(
        self,
        api_client: k8s.ApiClient | None,
        settings: DataActivitySettings,
        *,
        secrets: Secrets | None = None,
        look_timeout: float = LOOK_TIMEOUT,
    ) -> None:
        """`secrets` replaces the Kubernetes Secrets read through `api_client`, e.g. in a benchmark; `look_timeout`
        replaces LOOK_TIMEOUT, e.g. in a test."""
        self._secrets = secrets_from(api_client, secrets)
        self._pins = Pins(self._secrets, api_client if secrets is None else None)
        self._settings = settings
        self._look_timeout = look_timeout

    @activity.defn(
        name=driver_activity(DriverType.POSTGRESQL.value, DriverOperation.WATCH_REPLICATION),
        no_thread_cancel_exception=True,
    )
    def watch_replication(self, input: WatchReplicationInput) -> None:
        """Looks at the replication every --replication-poll-interval seconds until cancelled; raises
        ReplicationBroken once it is broken. Heartbeats the lag (bytes the target has not confirmed) with each look.

        Idempotent: it only reads.
        """
        ref, driver = input.ref, input.driver
        source = self._pins.database(ref, driver.source_secret, "spec.driver.sourceSecret")
        target = self._pins.database(ref, driver.target_secret, "spec.driver.targetSecret")
        look = Look(source, target, replication.name(ref.uid), self._settings, self._look_timeout)
        with Heartbeats(self._settings.heartbeat_interval) as heartbeats, look:
            while True:
                look.once(heartbeats)
                activity.wait_for_cancelled_sync(self._settings.replication_poll_interval)
                heartbeats.raise_if_cancelled("watching the replication")


class Look:
    """What the watch knows between two looks: its sessions, the slot's last position, and what went wrong."""

    def __init__(
        self,
        source: DatabaseConnection,
        target: DatabaseConnection,
        name: str,
        settings: DataActivitySettings,
        timeout: float = LOOK_TIMEOUT,
    ) -> None:
        self._source, self._target, self._name, self._settings = source, target, name, settings
        self._session = {**READING, "statement_timeout": str(round(timeout * 1000))}
        self._give_up = timeout + GIVE_UP_AFTER
        self._stall = Stall(settings.replication_stall_timeout, settings.replication_poll_interval)
        self._src: Connection | None = None
        self._tgt: Connection | None = None
        self._found: subscription.Subscription | None = None
        self._confirmed: str | None = None
        self._lag = 0
        self._counted: int | None = None
        """Failures the target's statistics counted, as last read (None before the first read)."""
        self._troubles = 0
        """Looks that found something wrong (reported as failures, with those the target counted)."""
        self._seen: dict[str, str] = {}
        """What the looks found wrong in the current episode of trouble (see Stall), by kind, as a person reads it."""

    def __enter__(self) -> Look:
        return self

    def __exit__(self, *_: object) -> None:
        self._close_source()
        self._close_target()

    def once(self, heartbeats: Heartbeats) -> None:
        """One look: raises ReplicationBroken when the replication is broken, else heartbeats what it saw."""
        try:
            src = self._source_session()
            with answering_within(src, self._give_up):
                behind = replication.lag(src, self._name)
        except (psycopg.Error, DatabaseUnreachable) as error:
            self._close_source()
            activity.logger.warning("could not look at the source's slot %s: %s", self._name, error)
            heartbeats.progress(source_unreachable=str(error).strip()[:200])
            self._stall.unknown()  # nothing can be told of the slot, nor so of the trouble
            return
        if behind is None:
            raise self._gone(f"the replication slot {self._name} is gone from the source {self._source.describe()}")
        self._lag, self._confirmed = behind.bytes, behind.confirmed
        found = self._look_at_target() or self._look_at_slot(behind)
        episodes = self._stall.episodes
        stalled = self._stall.seconds(self._confirmed, self._counted or 0, streaming=found is None)
        if self._stall.episodes != episodes:
            self._seen.clear()  # what an earlier episode saw is not why this one went wrong
        trouble = None
        if found is not None:
            kind, trouble = found
            self._troubles += 1
            self._seen[kind] = trouble
        failures = (self._counted or 0) + self._troubles
        heartbeats.progress(lag_bytes=self._lag, confirmed_lsn=self._confirmed, failures=failures, trouble=trouble)
        if stalled is not None:
            raise self._broken(stalled, failures)

    def _look_at_target(self) -> tuple[str, str] | None:
        """What is wrong on the target, if anything (its kind, and what a person reads); keeps the failures its
        statistics counted."""
        try:
            tgt = self._target_session()
            with answering_within(tgt, self._give_up):
                found = subscription.find(tgt, self._name)
                if found is None:
                    raise self._gone(f"the subscription {self._name} is gone from the target {self._target.describe()}")
                counted = subscription.progress(tgt, found).errors
                row = tgt.execute(APPLY_WORKERS, (found.oid,)).fetchone()
                workers = int(row[0]) if row else 0
        except (psycopg.Error, DatabaseUnreachable) as error:
            self._close_target()
            return UNREACHABLE, (
                f"ferry cannot reach the target {self._target.describe()} ({str(error).strip()[:300]}): its Pod may "
                "be down, or its disk full"
            )
        rising = self._counted is not None and counted > self._counted
        self._counted = counted
        if not found.enabled:
            return (
                DISABLED,
                f"the subscription {self._name} on the target is disabled (by hand, or by disable_on_error)",
            )
        if rising:
            return FAILING, (
                f"its workers keep failing to apply the source's changes ({counted} failures so far, "
                "pg_stat_subscription_stats): the usual cause is a schema change on the source (logical replication "
                "does not carry DDL: a column the target lacks), or a row the target refuses; the target server's "
                "log names it"
            )
        if workers == 0:
            return NO_WORKER, (
                f"no apply worker runs for the subscription {self._name} on the target (pg_stat_subscription): it "
                "keeps exiting, or the target lacks max_logical_replication_workers; the target server's log says why"
            )
        return None

    def _look_at_slot(self, behind: replication.Behind) -> tuple[str, str] | None:
        """What is wrong with the slot on the source, when the target looked fine: an apply worker that hangs
        connecting to the source is listed in pg_stat_subscription, and counts no failure."""
        if behind.streaming:
            return None
        return NOT_STREAMING, (
            f"no walsender streams from the replication slot {self._name} on the source (pg_replication_slots.active): "
            "the target's server cannot connect to the source, or the source refuses to stream from the slot; the "
            "target server's log says why"
        )

    def _broken(self, stalled: float, failures: int) -> ReplicationBroken:
        return ReplicationBroken(
            f"the replication of {self._source.describe()} into {self._target.describe()} broke while the migration "
            f"waited before the freeze: {self._worst()}. Something has been wrong for {stalled:.0f}s without a "
            f"break, and the target has confirmed nothing meanwhile ({failures} failed looks and apply attempts). "
            f"{self._growing()} Roll back (the rollback drops the slot; the source keeps every write), fix the cause, "
            "and migrate again."
        )

    def _worst(self) -> str:
        """What the looks found wrong, the most telling first: a crashing worker's failures explain its absence."""
        kinds = (FAILING, DISABLED, UNREACHABLE, NO_WORKER, NOT_STREAMING)
        return "; ".join(self._seen[kind] for kind in kinds if kind in self._seen)

    def _gone(self, what: str) -> ReplicationBroken:
        return ReplicationBroken(
            f"{what} while the migration waited before the freeze (dropped by hand, or invalidated), so the target "
            "can no longer follow the source. Roll back (the source keeps every write) and migrate again."
        )

    def _growing(self) -> str:
        return (
            f"The source's replication slot {self._name} keeps every change the target has not confirmed ({self._lag} "
            "bytes of WAL now), so the source's pg_wal grows with every write until its disk fills."
        )

    def _source_session(self) -> Connection:
        if self._src is None:
            self._src = connect(self._source, self._settings, **self._session)
        return self._src

    def _target_session(self) -> Connection:
        if self._tgt is None:
            self._tgt = connect(self._target, self._settings, **self._session)
        return self._tgt

    def _close_source(self) -> None:
        if self._src is not None:
            with _quietly():
                self._src.close()
            self._src = None

    def _close_target(self) -> None:
        if self._tgt is not None:
            with _quietly():
                self._tgt.close()
            self._tgt = None


@contextlib.contextmanager
def _quietly() -> Iterator[None]:
    """Closing a session that already failed may fail again; it is gone either way."""
    with contextlib.suppress(psycopg.Error, OSError):
        yield
