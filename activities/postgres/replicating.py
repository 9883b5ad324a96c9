"""The PostgreSQL driver's activities of mode Online: postgresql.replicate, .catch_up, and their undos.

replicate copies the schema into the target (schema_copy), publishes the source, makes
the replication slot, subscribes the target with the initial copy of every table, and
waits until every table is copied and the target is less than spec.driver.maxLag behind.
The source takes writes all along. catch_up runs once the freeze has stopped them: it
reads where the source's WAL ends, waits until the target has confirmed everything up to
there, copies the sequences (see sequences), refreshes on the target the materialized
views the source has populated (see materialized_views) and ends the replication. The undos end the
replication too, and undo_replicate empties the target of what replicate put there.

Ending the replication (`_end`) is one idempotent sequence, the same in catch_up and in
both undos: record the subscription in the publication's record, drop the subscription
on the target without touching the source (see subscription), drop this replication's
slots on the source (the subscription's and any table synchronization slot the record
names), then, in one transaction, give tables their replica identity back (those no
other publication still needs: see replica_identity) and drop the publication, with the
record. Interrupted anywhere, it finds what is left the next time, so no slot survives a
completed undo: a slot left behind would keep the source's WAL forever. Where it ends the
replication for good (catch-up, the undos), it first records so on the source, and a
late attempt of replicate, scheduled before that, makes nothing after it (see
replication_ended).

Like the other driver activities, they read the Secrets when they start, and are defined
with `no_thread_cancel_exception`: a cancellation reaches them through `Heartbeats`,
which stops the query a session waits for (creating the slot; see connection.Session) or
kills pg_dump and pg_restore; the waits look at the cancellation between two polls, and
each poll waits at most connection.POLL_ANSWER for a server's answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
from kubernetes import client as k8s
from temporalio import activity

from activities.heartbeats import Heartbeats
from activities.postgres import (
    ahead,
    checksums,
    freezing,
    materialized_views,
    replica_identity,
    replication,
    replication_ended,
    restoring,
    schema_copy,
    sequences,
    subscription,
    unwritten,
)
from activities.postgres.activities import WRITABLE, owner, read_both
from activities.postgres.attempts import Attempt
from activities.postgres.connection import Connection, answering_within, connect, privileged
from activities.postgres.identity import Pins
from activities.secrets import DatabaseConnection, Secrets, retried_until_readable, secrets_from
from activities.serving import TargetTraffic
from activities.settings import DataActivitySettings
from ferry.api.errors import InvalidSpec, ReplicationBroken
from ferry.api.migration import DriverSpec, DriverType
from ferry.api.quantity import quantity_bytes
from ferry.api.saga import (
    AheadComparison,
    CatchUpInput,
    CatchUpResult,
    DriverOperation,
    EndReplicationInput,
    EndReplicationResult,
    MigrationRef,
    ReplicateInput,
    ReplicateResult,
    driver_activity,
)

PREPARED_WAIT = 10.0
"""Seconds replicate waits for the prepared transactions it finds before making the slot (see _wait_for_prepared)."""
GRACE_FLOOR = 15.0
"""Seconds, at least, that an episode of trouble survives without a troubled look (see Stall)."""


def _name(operation: DriverOperation) -> str:
    return driver_activity(DriverType.POSTGRESQL.value, operation)


class Stall:
    """Tells a broken replication from a troubled moment: broken is something wrong for longer than `limit` seconds,
    without a break, while the position stood still; not "nothing moved for that long, and something was wrong once".

    Trouble, at a look: the workers' errors (pg_stat_subscription_stats) rose since the previous look (failing), or
    the replication does not stream: no apply worker runs, or no walsender streams from the slot (the watch also
    counts the subscription disabled and the target unreachable). An apply worker that cannot connect to the source,
    or cannot start streaming from its slot, fails before the statistics count anything, and tries again every few
    seconds forever; a healthy replication that has nothing to apply still streams, so it is never in trouble.

    An episode of trouble begins at a troubled look. It ends when the position moves (something was applied), or
    at a look that finds nothing wrong, or cannot tell (`unknown`: the watch cannot reach the source), more than
    `grace` seconds after the last troubled look; time without any look ends nothing (looks may be far apart: a
    long --replication-poll-interval, a connection slow to fail). Broken: a look that finds trouble in an episode
    that began more than `limit` seconds ago. Measured from the position's last move instead, a healthy migration
    would roll back: on an idle source (no writes, so the slot's confirmed position stands still for hours, e.g.
    over a weekend's approval wait) one look catching the target's Pod restarting, the apply worker reconnecting,
    or one error the worker recovered from, would find "nothing moved" long past the limit.

    The grace is max(limit / 2, 15 s, twice the interval between looks). It must bridge the healthy-looking gaps of
    a crash loop: PostgreSQL starts a failed apply worker again after wal_retrieve_retry_interval (5 s by default),
    and looks between two failures may find it running with no new error; with a look every
    --replication-poll-interval (1 s by default), 15 s is three retry intervals, room for a worker slow to connect
    and fail again, and a look every more than 7.5 s sees a new error at nearly every look. Half the limit bridges
    slower loops when the limit is longer (a raised retry interval, a table's copy that fails after a while), and
    makes a broken verdict need trouble seen in every half of the limit; two blips further apart than that stay two
    episodes. The price: failures recurring less often than the grace (a table whose copy fails every few minutes)
    are episodes of their own and never broken; the step's timeout (spec.timeouts) still bounds that wait.
    """

    def __init__(self, limit: float, interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        """`interval`: the seconds between two looks (--replication-poll-interval)."""
        self._limit = limit
        self.grace = max(limit / 2, GRACE_FLOOR, 2 * interval)
        """Seconds after the last troubled look from which a look that finds nothing wrong ends the episode."""
        self._clock = clock
        self._position: object = None
        self._errors: int | None = None
        self._began: float | None = None
        """When the current episode of trouble began (None: none yet since the position last moved)."""
        self._last = 0.0
        """When a look last found trouble."""
        self.episodes = 0
        """Episodes of trouble begun so far: a watch keeps what it saw per episode."""
        self.failing = False
        """Whether the workers' errors rose during the current episode (else it is in trouble not streaming)."""

    def seconds(self, position: object, errors: int, streaming: bool = True) -> float | None:
        """How long the replication has been in trouble, once this look finds trouble and its episode began more than
        the limit ago; else None.

        `position` is what moves when something is applied; `errors` the workers' failures counted so far;
        `streaming` False when this look found it not streaming (or, in the watch, anything else wrong).
        """
        now = self._clock()
        rose = self._errors is not None and errors > self._errors
        self._errors = errors
        if position != self._position:
            self._position, self._began, self.failing = position, None, False
            return None
        if not rose and streaming:
            self.unknown()
            return None
        if self._began is None:
            self._began, self.failing = now, False
            self.episodes += 1
        self._last = now
        self.failing = self.failing or rose
        wrong = now - self._began
        return wrong if wrong > self._limit else None

    def unknown(self) -> None:
        """A look that found nothing wrong, or could not tell: it ends the episode once `grace` has passed since the
        last troubled look."""
        if self._began is not None and self._clock() - self._last > self.grace:
            self._began, self.failing = None, False


def _broken(db: DatabaseConnection, stalled: float, errors: int, failing: bool, doing: str) -> ReplicationBroken:
    if not failing:
        return ReplicationBroken(
            f"the target {db.describe()} has applied nothing while {doing}, and its subscription is not streaming "
            f"from the source, for {stalled:.0f}s now: no apply worker runs on the target (pg_stat_subscription), or "
            "no walsender streams from the replication slot on the source (pg_replication_slots.active). The usual "
            "causes: the target's server cannot connect to the source (network, pg_hba.conf, a changed password), or "
            "the source refuses to stream from the slot; the target server's log names it. Roll back (the source "
            "keeps every write), fix the cause, and migrate again."
        )
    return ReplicationBroken(
        f"the target {db.describe()} has applied nothing while {doing}, and its replication workers have kept "
        f"failing for {stalled:.0f}s ({errors} failures so far, pg_stat_subscription_stats). The usual cause is a "
        "schema change on the source (logical replication does not carry DDL: a column the target lacks), or a row "
        "the target refuses; the target server's log names it. Roll back (the source keeps every write), undo the "
        "cause or apply the same change where needed, and migrate again."
    )


class ReplicationActivities:
    """Mode Online of the PostgreSQL data driver, reading connections from the Secrets the Migration names."""

    def __init__(
        self, api_client: k8s.ApiClient | None, settings: DataActivitySettings, *, secrets: Secrets | None = None
    ) -> None:
        """`secrets` replaces the Kubernetes Secrets read through `api_client`, e.g. in a benchmark."""
        self._secrets = secrets_from(api_client, secrets)
        self._pins = Pins(self._secrets, api_client if secrets is None else None)
        self._traffic = TargetTraffic(api_client)
        self._settings = settings

    # --- replicate ---------------------------------------------------------------------------

    @activity.defn(name=_name(DriverOperation.REPLICATE), no_thread_cancel_exception=True)
    def replicate(self, input: ReplicateInput) -> ReplicateResult:
        """Copies the schema, replicates every table into the target, and returns once the target is nearly caught up.

        Idempotent: everything it makes is named after the Migration's uid. A retry that
        finds the subscription goes on waiting with it (never a second slot or
        subscription); one that finds the subscription without its slot ends that
        replication and starts again; one that finds none starts from an empty target
        (see restoring.prepare_target: an earlier attempt's schema is removed first).
        An attempt scheduled before the activity that ended the replication for good (an
        undo, catch-up) is late: it fails with ReplicationEnded and makes nothing, or, when
        that activity came while it held the Migration's lock, fails at its next query of the
        source, its session ended, having made nothing (see `_start`). A source that another
        Migration replicates is refused (InvalidSpec) before anything is made, and again in
        the transaction that would publish it (see replication.refuse_others), unless this
        Migration's replication was under way already (its publication or subscription found):
        that one goes on, even when it starts again after losing its slot.
        """
        ref, driver = input.ref, input.driver
        source, target = self._databases(ref, driver.source_secret, driver.target_secret)
        name = replication.name(ref.uid)
        with (
            Heartbeats(self._settings.heartbeat_interval) as heartbeats,
            self._connect(source) as src,
            self._connect(target) as tgt,
        ):
            full, found, schema_copied = self._start(src, tgt, source, target, ref, driver, heartbeats)
            progress, lag = self._wait_until_close(
                src, tgt, target, name, found, quantity_bytes(driver.max_lag), heartbeats
            )
            compared = self._compare_ahead(src, tgt, source, target, name, found, heartbeats)
        activity.logger.info(
            "replicating %s into %s: %d tables copied, %d bytes behind; %d tables found equal before the freeze",
            source.describe(), target.describe(), progress.ready, lag, len(compared.tables) if compared else 0,
        )  # fmt: skip
        return ReplicateResult(
            publication=name,
            subscription=name,
            tables=progress.tables,
            tables_synced=progress.ready,
            lag_bytes=lag,
            replica_identity_full=full,
            schema_copied=schema_copied,
            ahead=compared,
        )

    def _start(
        self, src: Connection, tgt: Connection, source: DatabaseConnection, target: DatabaseConnection,
        ref: MigrationRef, driver: DriverSpec, heartbeats: Heartbeats,
    ) -> tuple[list[str], subscription.Subscription, bool]:  # fmt: skip
        """Makes what the replication lacks: the target's schema (on an emptied target), the publication, the slot and
        the subscription. Returns the tables given FULL, the subscription, and whether the schema was copied.

        All of it runs under the Migration's lock on the source (see replication_ended), from the check that nothing
        ended the replication: an activity ending it (catch-up, an undo) takes the lock, which ends this session, so
        an attempt it wrote off meanwhile fails at its next query of the source. The target is emptied in a
        transaction holding the lock there too, which asks the source again before it commits: a late attempt never
        empties a target that caught up and that catch-up left for verify.
        """
        name = replication.name(ref.uid)
        between_tries = self._between_tries(heartbeats)
        with replication_ended.holding(src, ref.uid, between_tries):
            # Refused before anything is made, the target included (checked again where the slot is made).
            replication_ended.refuse_if_ended(src, source, ref.uid, "replicate")
            _lacking_identity(src, source, driver.allow_replica_identity_full)
            found = subscription.find(tgt, name)
            # This Migration's replication under way (an earlier attempt published, or subscribed) goes on whatever
            # else publishes the source, also when it starts again below, after it lost its slot: its refusal is
            # decided here, before the target is touched. A new one is refused, and asked again where it publishes.
            under_way = found is not None or replication.exists(src, name)
            if not under_way:
                replication.refuse_others(src, name, source.describe())
            if found is not None and not replication.has_slot(src, name):
                activity.logger.warning("subscription %s has lost its slot on the source: starting again", name)
                self._end(src, tgt, source, target, ref, heartbeats)
                found = None
            schema_copied = found is None
            if found is None:
                with privileged(target, "end other sessions, drop and create schemas"), tgt.transaction():
                    replication_ended.hold_in_transaction(tgt, ref.uid, between_tries)
                    retry = self._lock_retry(heartbeats, "emptying the target for the schema")
                    restoring.prepare_target(tgt, target, owner(ref), retry=retry)
                    # Raises as well when the source's session, and with it the lock, was ended meanwhile.
                    replication_ended.refuse_if_ended(src, source, ref.uid, "empty the target")
                size = schema_copy.copy(source, target, self._settings, heartbeats)
                activity.logger.info(
                    "copied the schema of %s into %s (%d bytes)", source.describe(), target.describe(), size
                )
            full, found = self._create(
                src, tgt, source, target, ref, found, driver.allow_replica_identity_full, heartbeats,
                refuse_others=not under_way,
            )  # fmt: skip
        return full, found, schema_copied

    def _compare_ahead(
        self, src: Connection, tgt: Connection, source: DatabaseConnection, target: DatabaseConnection, name: str,
        found: subscription.Subscription, heartbeats: Heartbeats,
    ) -> AheadComparison | None:  # fmt: skip
        """Compares the largest tables while the source still takes writes, so verify need not (see ahead).

        None when it could not: verify then compares every table, writes stopped.
        """
        try:
            source_marks = ahead.marks(src)
            lsn = replication.position(src)
            self._wait_until_applied(src, tgt, target, name, found, lsn, heartbeats)
            target_marks = ahead.marks(tgt)
            wanted = ahead.largest(source_marks)
            source_tables, target_tables = read_both(
                lambda db: connect(db, self._settings, **checksums.SESSION),
                source,
                target,
                heartbeats,
                lambda conn, row_hash, done: checksums.fingerprints(
                    conn, done, wanted.__contains__, large_objects=False, row_hash=row_hash
                ),
                lambda side: lambda tables, _rows: heartbeats.note(**{f"ahead_{side}_tables": tables}),
            )
        except psycopg.Error as error:
            activity.logger.warning("could not compare the tables before the freeze; verify will: %s", error)
            return None
        return ahead.compare(source_marks, target_marks, source_tables, target_tables)

    def _create(
        self, src: Connection, tgt: Connection, source: DatabaseConnection, target: DatabaseConnection,
        ref: MigrationRef, found: subscription.Subscription | None, allow_full: bool, heartbeats: Heartbeats, *,
        refuse_others: bool,
    ) -> tuple[list[str], subscription.Subscription]:  # fmt: skip
        """Publishes the source, makes the slot and the subscription (or enables it): what of them is missing. Returns
        the tables given FULL, and the subscription. With `refuse_others` (a replication not under way when the
        attempt started), refused with InvalidSpec, nothing published, when another Migration's publication is on the
        source (see replica_identity.publish).

        The caller holds the Migration's lock on the source (`_start`). Refused with ReplicationEnded, before anything
        is made, once an activity scheduled after this attempt ended the replication (see replication_ended), which
        the end records only once it has taken that lock; the subscription commits on the target only after the
        source said again, through the session holding the lock, that nothing ended the replication.
        """
        name = replication.name(ref.uid)
        between_tries = self._between_tries(heartbeats)
        replication_ended.refuse_if_ended(src, source, ref.uid, "publish the source and make a replication slot")
        full = self._publish(src, source, name, ref, allow_full, heartbeats, refuse_others=refuse_others)
        with privileged(target, "create a subscription"), tgt.transaction():
            replication_ended.hold_in_transaction(tgt, ref.uid, between_tries)
            if found is None:
                found = subscription.create(tgt, name, source, self._settings)
            elif not found.enabled:
                subscription.enable(tgt, name)
            # Raises as well when the source's session, and with it the lock, was ended meanwhile.
            replication_ended.refuse_if_ended(src, source, ref.uid, "create the subscription")
        self._record_subscription(src, tgt, name, found, heartbeats)
        return full, found

    def _publish(
        self, src: Connection, db: DatabaseConnection, name: str, ref: MigrationRef, allow_full: bool,
        heartbeats: Heartbeats, *, refuse_others: bool,
    ) -> list[str]:  # fmt: skip
        """The publication (with ferry's record) and the replica identities its tables need, in one transaction (see
        replica_identity.publish), then the slot; returns the tables whose identity the end gives back (those given
        FULL, and any another Migration's end handed over: see replica_identity)."""
        with privileged(db, "publish the tables and create a replication slot"):
            row = src.execute("select rolsuper from pg_roles where rolname = current_user").fetchone()
            retry = self._lock_retry(heartbeats, "publishing the source's tables with the replica identities they need")
            record = replica_identity.publish(
                src, name, owner(ref), every_table=bool(row and row[0]), where=db.describe(),
                lacking=lambda: _lacking_identity(src, db, allow_full), refuse_others=refuse_others, retry=retry,
            )  # fmt: skip
            if not replication.has_slot(src, name):
                self._wait_for_prepared(src, db, heartbeats)
            try:  # creating the slot waits for the source's running transactions; a cancellation stops it (connection)
                if replication.create_slot(src, name):
                    activity.logger.info("created replication slot %s on %s", name, db.describe())
            except psycopg.errors.QueryCanceled:
                heartbeats.raise_if_cancelled("creating the replication slot")
                raise
        return sorted(record.replica_identity)

    def _wait_for_prepared(self, src: Connection, db: DatabaseConnection, heartbeats: Heartbeats) -> None:
        """Waits up to PREPARED_WAIT seconds for the server's prepared transactions to end; raises naming those left.

        A logical slot is ready only once every transaction running on the server when it is
        created has ended, prepared ones of any database included: one that its coordinator
        never commits would hold create_slot until the step's timeout, saying nothing. Those
        prepared after the first look are young, and create_slot waits for them.
        """
        with answering_within(src):
            first = {transaction.gid for transaction in freezing.prepared(src, every_database=True)}
        deadline = time.monotonic() + PREPARED_WAIT
        while first:
            with answering_within(src):
                left = [t for t in freezing.prepared(src, every_database=True) if t.gid in first]
            if not left:
                return
            if time.monotonic() > deadline:
                where = ", ".join(f"{t.describe()} in database {t.database}" for t in left)
                raise freezing.PreparedTransactionsPending(
                    f"the replication slot cannot be made on the server of {db.describe()} while prepared "
                    f"transactions (PREPARE TRANSACTION) are pending there, in any database: a slot waits until "
                    f"every transaction running when it is made has ended. Still pending after {PREPARED_WAIT:g}s: "
                    f"{where}. Have their coordinator (an XA/JTA transaction manager) commit or roll them back (or, "
                    "knowing the outcome, COMMIT PREPARED or ROLLBACK PREPARED them as a superuser or their owner); "
                    "the step is retried."
                )
            heartbeats.raise_if_cancelled("waiting for prepared transactions to end")
            time.sleep(self._settings.replication_poll_interval)

    def _record_subscription(
        self, src: Connection, tgt: Connection, name: str, found: subscription.Subscription, heartbeats: Heartbeats
    ) -> None:
        """Keeps the subscription's oid and the target's identifier in the record: they name its sync slots."""
        retry = self._lock_retry(heartbeats, "recording the subscription in ferry's record of the publication")
        replication.record_subscription(src, name, found.oid, subscription.system_identifier(tgt), retry)

    def _wait_until_close(
        self, src: Connection, tgt: Connection, target: DatabaseConnection, name: str,
        found: subscription.Subscription, threshold: int, heartbeats: Heartbeats,
    ) -> tuple[subscription.Progress, int]:  # fmt: skip
        """Polls until every table is copied and the lag is at most `threshold` bytes; returns both."""
        stall = Stall(self._settings.replication_stall_timeout, self._settings.replication_poll_interval)
        while True:
            with answering_within(tgt), answering_within(src):
                progress = subscription.progress(tgt, found)
                behind = replication.lag(src, name)
            if behind is None:
                raise RuntimeError(
                    f"the replication slot {name} is gone from the source; the next attempt starts again"
                )
            lag = behind.bytes
            heartbeats.progress(tables=progress.tables, tables_synced=progress.ready, lag_bytes=lag)
            if progress.ready == progress.tables and lag <= threshold:
                return progress, lag
            streaming = behind.streaming and progress.worker
            stalled = stall.seconds((progress.ready, behind.confirmed), progress.errors, streaming)
            if stalled is not None:
                raise _broken(
                    target, stalled, progress.errors, stall.failing, "copying the tables and following the source"
                )
            self._pause(heartbeats, "waiting for the replication")

    # --- catch_up ----------------------------------------------------------------------------

    @activity.defn(name=_name(DriverOperation.CATCH_UP), no_thread_cancel_exception=True)
    def catch_up(self, input: CatchUpInput) -> CatchUpResult:
        """With the source frozen: waits until the target has every change, copies the sequences, ends the replication.

        Idempotent: the position waited for is read anew (a later one is as good); the
        sequences are set again from the frozen source; ending the replication finds
        what is left of it. A retry that finds no subscription follows an attempt that
        ended it, which it does only after the target had caught up; verify compares
        every row anyway.
        """
        ref = input.ref
        source, target = self._databases(ref, input.driver.source_secret, input.driver.target_secret)
        name = replication.name(ref.uid)
        with (
            Heartbeats(self._settings.heartbeat_interval) as heartbeats,
            self._connect(source) as src,
            self._connect(target) as tgt,
        ):
            frozen = replication.position(src)
            found = subscription.find(tgt, name)
            applied, waited = None, 0.0
            if found is None:
                activity.logger.warning(
                    "no subscription %s on %s: an earlier attempt ended the replication once the target had caught up",
                    name, target.describe(),
                )  # fmt: skip
            else:
                if not found.enabled:
                    subscription.enable(tgt, name)
                started = time.monotonic()
                applied = self._wait_until_applied(src, tgt, target, name, found, frozen, heartbeats)
                waited = time.monotonic() - started
            # Under verify's lock, refused once verify marked the target: a late attempt (its worker stood still past
            # its heartbeat timeout) would set a live target's sequences back to the frozen source's, and its clients'
            # next inserts would take numbers already used.
            with privileged(target, "set the sequences"), tgt.transaction():
                unwritten.refuse_if_verified(tgt, target, "set the target's sequences from the source's")
                copied = sequences.copy(src, tgt)
            refreshed = self._refresh_materialized_views(src, tgt, target, heartbeats)
            self._end(src, tgt, source, target, ref, heartbeats, ended_by="catch-up")
        activity.logger.info(
            "%s has every change up to %s (it waited %.1fs); set %d sequences; refreshed %d materialized views; "
            "the replication ended",
            target.describe(), frozen, waited, copied, len(refreshed),
        )  # fmt: skip
        return CatchUpResult(frozen_lsn=frozen, applied_lsn=applied, sequences=copied, waited_seconds=round(waited, 3))

    def _refresh_materialized_views(
        self, src: Connection, tgt: Connection, target: DatabaseConnection, heartbeats: Heartbeats
    ) -> list[str]:
        """Fills on the target the materialized views the source has populated (see materialized_views)."""
        wanted = materialized_views.populated(src)
        if not wanted:
            return []
        # A refresh is one statement, as long as its query: a cancellation stops it (connection).
        with privileged(target, "refresh materialized views"):
            try:
                refreshed = materialized_views.refresh(
                    tgt, wanted, lambda view: heartbeats.progress(refreshing_materialized_view=view)
                )
            except psycopg.errors.QueryCanceled:
                heartbeats.raise_if_cancelled("refreshing the materialized views")
                raise
        heartbeats.progress(materialized_views_refreshed=len(refreshed))
        return refreshed

    def _wait_until_applied(
        self, src: Connection, tgt: Connection, target: DatabaseConnection, name: str,
        found: subscription.Subscription, lsn: str, heartbeats: Heartbeats,
    ) -> str:  # fmt: skip
        """Polls until the slot's consumer confirmed `lsn`; returns what it confirmed."""
        stall = Stall(self._settings.replication_stall_timeout, self._settings.replication_poll_interval)
        while True:
            with answering_within(src):
                left = replication.still_to_apply(src, name, lsn)
            if left is None:
                raise ReplicationBroken(
                    f"the replication slot {name} is gone from the source, so the target cannot get the last changes. "
                    "Roll back (the source keeps every write) and migrate again."
                )
            heartbeats.progress(frozen_lsn=lsn, lsn_to_apply_bytes=left.bytes)
            if left.bytes == 0:
                return left.confirmed
            with answering_within(tgt):
                progress = subscription.progress(tgt, found)
            streaming = left.streaming and progress.worker
            stalled = stall.seconds(left.confirmed, progress.errors, streaming)
            if stalled is not None:
                raise _broken(target, stalled, progress.errors, stall.failing, "applying the last changes")
            self._pause(heartbeats, "waiting for the target to catch up")

    # --- the undos ---------------------------------------------------------------------------

    @activity.defn(name=_name(DriverOperation.UNDO_REPLICATE), no_thread_cancel_exception=True)
    def undo_replicate(self, input: EndReplicationInput) -> EndReplicationResult:
        """Ends the replication (see `_end`), then empties the target of the schema and rows replicate put there.

        Idempotent, and safe after a replicate that never ran or half ran: each part finds
        what is there by name, and the target is emptied only while it holds this
        Migration's marker, and, once verify marked it, only if it took no writes since
        (WritesOnTarget otherwise, with nothing dropped: see restoring.remove).
        """
        with retried_until_readable("the undo of replicate"):
            source, target = self._databases(input.ref, input.driver.source_secret, input.driver.target_secret)
        self._traffic.refuse_while_served(input.ref, f"ending the replication into and emptying {target.describe()}")
        with (
            Heartbeats(self._settings.heartbeat_interval) as heartbeats,
            self._connect(source) as src,
            self._connect(target) as tgt,
        ):
            ended = self._end(src, tgt, source, target, input.ref, heartbeats, ended_by="undo_replicate")
            with privileged(target, "end other sessions, lock tables, drop schemas and change the database's settings"):
                retry = self._lock_retry(heartbeats, "emptying the target")
                end_others = lambda c: freezing.end_sessions(  # noqa: E731
                    c, self._settings.session_end_timeout, lambda n: heartbeats.progress(sessions_ended=n)
                )
                emptied = restoring.remove(
                    tgt, target, owner(input.ref), retry=retry, end_sessions=end_others, attempt=Attempt.current()
                )
        activity.logger.info("undid replicate: replication %s, target %s", _done(ended), _done(emptied, "emptied"))
        return EndReplicationResult(ended=ended, emptied=emptied)

    @activity.defn(name=_name(DriverOperation.UNDO_CATCH_UP), no_thread_cancel_exception=True)
    def undo_catch_up(self, input: EndReplicationInput) -> EndReplicationResult:
        """Ends the replication, whatever catch-up got to (see `_end`); replicate's undo then empties the target.

        Idempotent: nothing left of the replication means nothing to do.
        """
        with retried_until_readable("the undo of catch-up"):
            source, target = self._databases(input.ref, input.driver.source_secret, input.driver.target_secret)
        with (
            Heartbeats(self._settings.heartbeat_interval) as heartbeats,
            self._connect(source) as src,
            self._connect(target) as tgt,
        ):
            ended = self._end(src, tgt, source, target, input.ref, heartbeats, ended_by="undo_catch_up")
        activity.logger.info("undid catch-up: replication %s", _done(ended))
        return EndReplicationResult(ended=ended)

    def _end(
        self, src: Connection, tgt: Connection, source: DatabaseConnection, target: DatabaseConnection,
        ref: MigrationRef, heartbeats: Heartbeats, *, ended_by: str | None = None,
    ) -> bool:  # fmt: skip
        """Ends this Migration's replication, in an order that leaves an interrupted end something to find; True when
        anything of it was there.

        With `ended_by` (the activity ending it for good, not replicate starting again), first records on the source
        that it has ended, so that no late attempt of replicate makes any of it again (see replication_ended), and
        holds the Migration's lock on both sides until it has ended.
        """
        if ended_by is None:
            return self._end_now(src, tgt, source, target, replication.name(ref.uid), heartbeats)
        between_tries = self._between_tries(heartbeats, ending=True)
        with (
            replication_ended.holding(src, ref.uid, between_tries, ending=True),
            replication_ended.holding(tgt, ref.uid, between_tries, ending=True),
        ):
            recording = self._lock_retry(heartbeats, "record the end of the replication")
            replication_ended.record(src, source, ref.uid, owner(ref), ended_by, recording)
            return self._end_now(src, tgt, source, target, replication.name(ref.uid), heartbeats)

    def _end_now(
        self, src: Connection, tgt: Connection, source: DatabaseConnection, target: DatabaseConnection, name: str,
        heartbeats: Heartbeats,
    ) -> bool:  # fmt: skip
        record = replication.read_record(src, name)
        found = subscription.find(tgt, name)
        ended = False
        if found is not None:
            if record is not None:
                with privileged(source, "keep ferry's record on the publication"):
                    self._record_subscription(src, tgt, name, found, heartbeats)
                record = replication.read_record(src, name)
            with privileged(target, "drop the subscription"):
                subscription.drop(tgt, name)
            ended = True
        with privileged(source, "drop replication slots and the publication"):
            leftover = replication.slots(src, name, record)
            if leftover:
                replication.drop_slots(src, leftover, lambda: heartbeats.progress(dropping_slots=leftover))
                ended = True
            retry = self._lock_retry(heartbeats, "giving back replica identities and dropping the publication")
            given = replica_identity.unpublish(src, name, retry)
            if given is not None:
                _log_given_back(source, given)
                ended = True
        return ended

    # --- shared ------------------------------------------------------------------------------

    def _lock_retry(self, heartbeats: Heartbeats, doing: str) -> replication.Retry:
        """What a change to the source's tables does when it let go of a lock it waited for: says so, pauses, and
        raises once the activity is cancelled."""

        return replication.lock_retry(heartbeats, doing, self._settings.replication_poll_interval)

    def _between_tries(self, heartbeats: Heartbeats, *, ending: bool = False) -> Callable[[], None]:
        """What waiting for the Migration's lock does between two tries: heartbeats what it waits for (and raises once
        the activity is cancelled). `ending`: the caller ends the replication, and waits only while the sessions of
        late attempts of replicate holding the lock are being ended; replicate also waits for an activity ending the
        replication (see replication_ended.holding)."""
        waiting_for = (
            "the lock of a late attempt of replicate, whose session is being ended"
            if ending
            else "the Migration's lock, held by an activity ending the replication (catch-up, an undo) or by a late "
            "attempt of replicate"
        )

        def between() -> None:
            heartbeats.progress(waiting_for=waiting_for)
            heartbeats.raise_if_cancelled(f"waiting for {waiting_for}")

        return between

    def _pause(self, heartbeats: Heartbeats, doing: str) -> None:
        activity.wait_for_cancelled_sync(self._settings.replication_poll_interval)
        heartbeats.raise_if_cancelled(doing)

    def _databases(
        self, ref: MigrationRef, source_secret: str, target_secret: str
    ) -> tuple[DatabaseConnection, DatabaseConnection]:
        return (
            self._pins.database(ref, source_secret, "spec.driver.sourceSecret"),
            self._pins.database(ref, target_secret, "spec.driver.targetSecret"),
        )

    def _connect(self, db: DatabaseConnection) -> Connection:
        return connect(db, self._settings, **WRITABLE)


def _log_given_back(db: DatabaseConnection, given: replica_identity.GivenBack) -> None:
    """Says what the end did with the replica identities its record named (see replica_identity)."""
    if given.restored:
        activity.logger.info("gave back their replica identity to %s", ", ".join(given.restored))
    for table, heir in sorted(given.handed_over.items()):
        activity.logger.info(
            "left %s REPLICA IDENTITY FULL: publication %s of another Migration still publishes it, and the end of "
            "that replication gives its identity back",
            table, heir,
        )  # fmt: skip
    for kept in given.kept:
        activity.logger.warning(
            "left %s of %s REPLICA IDENTITY FULL: publication %s, not ferry's (or whose record this user may not "
            "write), still publishes its updates or deletes, which need it. Once none does, give it back: %s",
            kept.table, db.describe(), ", ".join(kept.publications), kept.restore_statement(),
        )  # fmt: skip


def _lacking_identity(conn: Connection, db: DatabaseConnection, allow_full: bool) -> dict[str, str]:
    """The tables replicate must give REPLICA IDENTITY FULL; InvalidSpec when there are some and the spec says no."""
    lacking = replica_identity.lacking_identity(conn)
    if lacking and not allow_full:
        raise InvalidSpec(
            f"these tables of {db.describe()} have no primary key and no replica identity, so the source would "
            f"refuse their updates and deletes while replicating: {', '.join(lacking)}. Give them one, or set "
            "spec.driver.allowReplicaIdentityFull: true."
        )
    return lacking


def _done(happened: bool, what: str = "ended") -> str:
    return what if happened else "already gone"
