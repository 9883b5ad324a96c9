"""The PostgreSQL driver's activities, as the saga calls them: postgresql.precheck, .freeze, .check_frozen, ...

precheck, freeze and undo_freeze, check_frozen, snapshot, migrate and undo_migrate,
verify, check_unwritten: each step's work is in the module named for it, and this class
wires them to the Secrets, the settings and the heartbeats.

Each reads the Secrets it needs when it starts, so inputs carry only their names, and
each can run again after a crash at any point (its docstring says how). They are
synchronous (the worker runs them in a thread pool) and are defined with
`no_thread_cancel_exception`: a cancellation reaches them through `Heartbeats`,
which stops the blocking work so the activity can clean up and raise CancelledError.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

import psycopg
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from activities import kube_objects, records
from activities import s3 as snapshot_store
from activities.events import record_event
from activities.heartbeats import Heartbeats
from activities.known_versions import KnownVersions
from activities.postgres import (
    ahead,
    analyzing,
    checksums,
    database_settings,
    dumping,
    fencing,
    freezing,
    grants,
    prechecks,
    replication,
    restore_script,
    restoring,
    schema,
    snapshot_attempts,
    streams,
    unwritten,
    verifying,
)
from activities.postgres.attempts import Attempt
from activities.postgres.connection import (
    CANCEL_TIMEOUT,
    Connection,
    answering_within,
    connect,
    connect_primary,
    privileged,
    said,
)
from activities.postgres.identity import Pins
from activities.progress_status import ProgressWriter
from activities.secrets import DatabaseConnection, SecretProtection, Secrets, retried_until_readable, secrets_from
from activities.serving import TargetTraffic
from activities.settings import DataActivitySettings
from activities.snapshots import SnapshotStoreActivities
from activities.status import REPORTING_COMPONENT
from ferry.api.errors import (
    BadCredentials,
    DatabaseUnreachable,
    Overtaken,
    TargetNotVerified,
    TlsMismatch,
    VerificationMismatch,
    WritesAfterFreeze,
    WritesOnTarget,
)
from ferry.api.migration import MIGRATION_UID_LABEL, DriverSpec, DriverType, EventType, StepName, named_secrets
from ferry.api.saga import (
    AheadComparison,
    CheckFrozenInput,
    CheckFrozenResult,
    CheckUnwrittenInput,
    CheckUnwrittenResult,
    DriverOperation,
    FenceMark,
    FreezeInput,
    FreezeResult,
    MigrateInput,
    MigrateResult,
    MigrationRef,
    PrecheckInput,
    PrecheckResult,
    SnapshotInput,
    SnapshotResult,
    SnapshotStream,
    TableAhead,
    UndoFreezeInput,
    UndoMigrateInput,
    UndoMigrateResult,
    UndoSnapshotInput,
    UndoSnapshotResult,
    VerifyInput,
    VerifyResult,
    driver_activity,
    stream_key,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

DRIVER = DriverType.POSTGRESQL.value
WRITABLE = {"default_transaction_read_only": "off"}
"""Session settings of ferry's own writing sessions: the source may be frozen, and they must still write."""
LOCK_PAUSE = 0.5
"""Seconds an undo emptying the target pauses between two tries to take the locks it needs (see replication)."""
CLEAR_LOCK_TIMEOUT = "10s"
"""How long emptying a target after a failed restore in streams waits for the killed restores' sessions to let go."""
READING = {"default_transaction_read_only": "on"}
"""Session settings of sessions that only read a live database: they could not write even by mistake."""


def _name(operation: DriverOperation) -> str:
    return driver_activity(DRIVER, operation)


def owner(ref: MigrationRef) -> str:
    """How a database's markers name the Migration; the UID tells a re-created Migration from the old one."""
    return f"{ref.namespace}/{ref.name}/{ref.uid}"


class PostgresActivities:
    """The PostgreSQL data driver, reading connections from the Secrets the Migration names."""

    def __init__(
        self,
        api_client: k8s.ApiClient | None,
        settings: DataActivitySettings,
        *,
        secrets: Secrets | None = None,
        versions: KnownVersions | None = None,
    ) -> None:
        """`secrets` replaces the Kubernetes Secrets read through `api_client`, e.g. in a benchmark.

        `api_client` also writes the progress of snapshot, migrate and verify into the Migration's status; without
        one, no progress is written. `versions` is the worker's one cache of the versions its status writes produced,
        shared with mirror_status (see activities/known_versions.py); without it, these activities keep one of their
        own.
        """
        self._secrets = secrets_from(api_client, secrets)
        self._protection = SecretProtection(api_client) if api_client is not None and secrets is None else None
        self._api = api_client
        self._settings = settings
        self._store = SnapshotStoreActivities(api_client, settings, secrets=self._secrets)
        self._versions = versions if versions is not None else KnownVersions()
        self._pins = Pins(self._secrets, api_client if secrets is None else None, self._versions)
        self._traffic = TargetTraffic(api_client)

    # --- precheck ----------------------------------------------------------------------------

    @activity.defn(name=_name(DriverOperation.PRECHECK), no_thread_cancel_exception=True)
    def precheck(self, input: PrecheckInput) -> PrecheckResult:
        """Checks, before anything changes, everything the later steps need; reports every problem at once.

        Idempotent: it reads only, but for a tiny object it writes under the Migration's
        prefix and deletes at once (see prechecks), and for the Migration's finalizer it puts
        on the Secrets it names, once (see SecretProtection): from here on, they stay until
        the watcher releases the Migration or sees it go (a Migration gone already has it
        taken off again, and fails MigrationUnheld). Raises PrecheckFailed listing the problems.
        """
        if self._protection is not None:
            secrets = named_secrets(input.driver, input.snapshot)
            self._protection.protect(input.ref, secrets)
        pinned = None
        with Heartbeats(self._settings.heartbeat_interval):
            if input.after_provision:
                # The steps since the first precheck acted on the source it recorded: a Secret that names another
                # database now fails here (DatabaseReplaced, retried), and the record of the source stays as it was.
                pinned = self._database(input.ref, input.driver.source_secret, "spec.driver.sourceSecret")
                with self._connect(pinned, **prechecks.SESSION):
                    pass
            result = prechecks.precheck(self._secrets, self._settings, input, owner(input.ref))
        if result.databases is not None:
            kept = pinned.identity if pinned is not None and pinned.identity is not None else result.databases.source
            self._pins.record(input.ref, result.databases.model_copy(update={"source": kept}))
        for warning in result.warnings:  # keyed by what it says: another attempt's other warnings shift no key
            self._warn(input.ref, warning, f"precheck.warning.{hashlib.sha256(warning.encode()).hexdigest()[:12]}")
        activity.logger.info(
            "precheck passed: source %s (%d bytes), target %s, pg_dump/pg_restore %s",
            result.source_version,
            result.source_size_bytes,
            result.target_version,
            result.tools_version,
        )
        return result

    def _warn(self, ref: MigrationRef, warning: str, key: str) -> None:
        """A warning of the precheck, in the worker's log and as a Warning Event on the Migration (once per key)."""
        activity.logger.warning("%s", warning)
        if self._api is not None:
            record_event(
                k8s.CoreV1Api(self._api),
                ref,
                type=EventType.WARNING,
                reason="PrecheckWarning",
                message=warning,
                key=key,
                component=REPORTING_COMPONENT,
                instance=socket.gethostname(),
            )

    # --- freeze ------------------------------------------------------------------------------

    @activity.defn(name=_name(DriverOperation.FREEZE), no_thread_cancel_exception=True)
    def freeze(self, input: FreezeInput) -> FreezeResult:
        """Makes the source read-only, keeps other roles out, ends its other sessions, and marks where writes stand.

        Idempotent: the setting and the ACL before the freeze are recorded in the source,
        in the transaction that freezes it, and a retry reads them from there (see
        freezing); ending sessions and taking the mark may be repeated at will. A freeze
        that fails or is cancelled after that transaction undoes itself, since the saga
        undoes only steps that completed: so does one that finds prepared transactions
        once the sessions are ended (PreparedTransactionsPending, retried; see freezing),
        or enabled subscriptions, whose apply workers it cannot stop (InvalidSpec).
        """
        db = self._database(input.ref, input.driver.source_secret, "spec.driver.sourceSecret")
        with (
            Heartbeats(self._settings.heartbeat_interval) as heartbeats,
            self._connect_primary(db) as conn,  # a standby: ServerInRecovery, retried
        ):
            with privileged(db, "change the database's settings and its CONNECT grants"):
                frozen = freezing.freeze(conn, db, owner(input.ref), Attempt.current())
            heartbeats.progress(frozen=True)
            try:
                fence, ended = self._mark(conn, db, heartbeats, input.ref)
                freezing.refuse_prepared(conn, db)
                freezing.refuse_subscriptions(conn, db)
                unfenced = grants.can_connect(conn)
                heartbeats.raise_if_cancelled("freezing the source")
            except BaseException:
                self._undo_quietly(db, input.ref, frozen.previous, heartbeats)
                raise
        activity.logger.info(
            "froze %s (%s was %s; CONNECT revoked from %s); ended %d sessions; %d rows written before the freeze",
            db.describe(),
            database_settings.READ_ONLY,
            frozen.previous,
            ", ".join(frozen.revoked) or "nobody",
            ended,
            fence.writes,
        )
        if unfenced:
            activity.logger.warning(
                "these roles can still connect to the frozen %s and write; check_frozen would notice: %s",
                db.describe(),
                ", ".join(unfenced),
            )
        return FreezeResult(
            previous_setting=frozen.previous,
            sessions_ended=ended,
            fence=fence,
            revoked_connect=frozen.revoked,
            can_still_connect=unfenced,
        )

    @activity.defn(name=_name(DriverOperation.UNDO_FREEZE), no_thread_cancel_exception=True)
    def undo_freeze(self, input: UndoFreezeInput) -> None:
        """Puts the source's setting and CONNECT grants back as they were, and ends the sessions opened meanwhile.

        Works without the freeze's result: what to restore is read from the markers the
        freeze left in the database. Idempotent: the markers are removed last, after the
        setting and grants are back and the read-only sessions ended; a run that finds
        no marker of this Migration has nothing to do.

        It acts on the primary only (a standby is refused, ServerInRecovery, retried), and
        returns once every standby streaming from it has replayed the unfreeze, or after a
        bound (at most freezing.STANDBY_WAIT, with a warning naming the standbys behind): a
        failover right after the commit must not promote a standby still frozen under a
        Migration that says RolledBack, and a standby that is stuck must not hold the
        rollback up for ever (see freezing.wait_for_standbys). A retry waits again.

        A late attempt (its worker stood still past its heartbeat timeout, then went on) that
        finds the source frozen again by an attempt scheduled after its own, a later cycle's
        freeze, refuses (Overtaken) and leaves that freeze as it is (see freezing.restore).
        """
        db = self._database_to_undo(input.ref, input.driver.source_secret, "spec.driver.sourceSecret", "the unfreeze")
        with (
            Heartbeats(self._settings.heartbeat_interval) as heartbeats,
            self._connect_primary(db) as conn,
        ):
            self._undo(conn, db, input.ref, input.previous_setting, heartbeats)

            def between_polls(behind: list[str]) -> None:
                heartbeats.progress(standbys_behind=behind)
                heartbeats.raise_if_cancelled("waiting for the standbys to replay the unfreeze")

            attempt = activity.info().start_to_close_timeout
            bound = min(freezing.STANDBY_WAIT, attempt.total_seconds() / 4) if attempt else freezing.STANDBY_WAIT
            with answering_within(conn):
                freezing.wait_for_standbys(conn, db, bound, between_polls)

    def _undo(
        self,
        conn: Connection,
        db: DatabaseConnection,
        ref: MigrationRef,
        expected: str | None,
        heartbeats: Heartbeats,
    ) -> None:
        with privileged(db, "change the database's settings and its CONNECT grants"):
            restored = freezing.restore(conn, db, owner(ref), expected, Attempt.current())
        if restored is None:
            activity.logger.info("%s is not frozen by Migration %s: nothing to undo", db.describe(), ref)
            return
        ended = self._end_sessions(conn, db, heartbeats, ref)
        with privileged(db, "change the database's settings"):
            freezing.forget(conn, owner(ref))
        activity.logger.info(
            "unfroze %s (%s and CONNECT back to %s); ended %d read-only sessions",
            db.describe(),
            database_settings.READ_ONLY,
            restored,
            ended,
        )

    def _undo_quietly(self, db: DatabaseConnection, ref: MigrationRef, expected: str, heartbeats: Heartbeats) -> None:
        """Undoes a freeze that did not complete, on a connection of its own (the freeze's may be what broke). Not when
        a later attempt froze since (Overtaken, see freezing.restore): the saga goes on from that freeze."""
        try:
            with self._connect(db) as conn:
                self._undo(conn, db, ref, expected, heartbeats)
        except Overtaken as error:
            activity.logger.warning("left the freeze in place: %s", error)
        except Exception as error:  # noqa: BLE001 - the freeze's own failure is what to report
            activity.logger.warning("could not undo the partial freeze of %s: %s", db.describe(), error)

    @contextlib.contextmanager
    def _cleared_on_failure(self, db: DatabaseConnection, ref: MigrationRef) -> Iterator[None]:
        """Empties the target of this Migration's restore, and unmarks it, when the block fails or is cancelled: a
        restore in streams commits piece by piece (see streams), and a target must not keep a partial one. A target
        marked complete is another attempt's finished restore, and is kept (see restoring.remove). Nor when a later
        attempt overtook this one (Overtaken, see snapshot_attempts): it has prepared the target since, and what the
        target holds is its restore, under way or done."""
        try:
            yield
        except Overtaken:
            raise
        except BaseException:
            self._clear_quietly(db, ref)
            raise

    def _clear_quietly(self, db: DatabaseConnection, ref: MigrationRef) -> None:
        """Best effort, once: should it fail, the target stays marked incomplete, and the next attempt or the undo
        empties it."""
        once = dataclasses.replace(self._settings, connect_attempts=1)
        try:
            with connect(db, once, **WRITABLE, lock_timeout=CLEAR_LOCK_TIMEOUT) as conn:
                emptied = restoring.remove(conn, db, owner(ref), only_incomplete=True)
            if emptied:
                activity.logger.info("emptied %s of the partial restore of Migration %s", db.describe(), ref)
        except Exception as error:  # noqa: BLE001 - the step's own failure is what to report
            activity.logger.warning(
                "could not empty %s of a partial restore (it stays marked incomplete; the next attempt or the undo "
                "empties it): %s",
                db.describe(),
                error,
            )

    def _end_sessions(
        self, conn: Connection, db: DatabaseConnection, heartbeats: Heartbeats, ref: MigrationRef | None = None
    ) -> int:
        with privileged(db, "end other sessions"):
            spared = _own_slots(conn, ref)
            return freezing.end_sessions(conn, self._settings.session_end_timeout, _rounds(heartbeats), spared)

    def _mark(
        self, conn: Connection, db: DatabaseConnection, heartbeats: Heartbeats, ref: MigrationRef | None = None
    ) -> tuple[FenceMark, int]:
        with privileged(db, "end other sessions and read every sequence"):
            spared = _own_slots(conn, ref)
            return fencing.mark(conn, self._settings.session_end_timeout, _rounds(heartbeats), spared)

    # --- check_frozen ------------------------------------------------------------------------

    @activity.defn(name=_name(DriverOperation.CHECK_FROZEN), no_thread_cancel_exception=True)
    def check_frozen(self, input: CheckFrozenInput) -> CheckFrozenResult:
        """Fails with WritesAfterFreeze if the source was written after the freeze; ends its sessions first.

        Before switch-traffic (it guards scale-down-old too), traffic being about to move,
        it then seals verify's mark on the target, so that no verify marks it again (see
        unwritten.seal). Idempotent: it ends sessions of a frozen database (which only
        flushes their statistics and makes them reconnect) and reads; see fencing for why
        the comparison with the freeze's mark is exact enough; a sealed mark stays as it is.
        """
        db = self._database(input.ref, input.driver.source_secret, "spec.driver.sourceSecret")
        with Heartbeats(self._settings.heartbeat_interval) as heartbeats:
            # On the primary: a standby counts none of the writes it replays (ServerInRecovery, retried).
            with self._connect_primary(db) as conn:
                holder = freezing.frozen_by(conn)
                present, ended = self._mark(conn, db, heartbeats, input.ref)
                found = fencing.changes(input.fence, present)
                found.extend(fencing.pending(conn))
                subscribing = freezing.enabled_subscriptions(conn)
                if subscribing:  # enabled since the freeze, by a superuser: what their workers apply may not count yet
                    found.append(
                        f"its subscriptions {', '.join(subscribing)} are enabled, and their apply workers write to it "
                        "whatever the freeze says"
                    )
                if holder != owner(input.ref):
                    found.insert(
                        0, f"it is no longer frozen by this Migration (ferry.frozen_by is {holder or 'unset'})"
                    )
                unfenced = grants.can_connect(conn) if found else []
            if found:
                who = f" ({', '.join(unfenced)} can connect despite the freeze)" if unfenced else ""
                raise WritesAfterFreeze(
                    f"{db.describe()} changed after the freeze, before {input.before}: {'; '.join(found)}. The "
                    "target may lack these writes, so the Migration must not go on: roll back (traffic stays with or "
                    f"returns to the source, which keeps its writes), find the client that writes despite the "
                    f"freeze{who}, and migrate again."
                )
            activity.logger.info("%s is as frozen as the freeze left it; ended %d sessions", db.describe(), ended)
            if input.before == StepName.SWITCH_TRAFFIC:
                self._seal(input.ref, input.driver, heartbeats)
            elif input.before == StepName.SCALE_DOWN_OLD:
                self._still_verified(input.ref, input.driver)
        return CheckFrozenResult(sessions_ended=ended, fence=present)

    def _still_verified(self, ref: MigrationRef, driver: DriverSpec) -> None:
        """Before the source is scaled down: the target the clients now use is still the database verify marked.

        A target that lost its volume and came back empty (a claim deleted with its Pod, say) is another server, which
        its first session finds (DatabaseReplaced), or an emptied database without the mark (TargetNotVerified): the
        source stays up, and the run does not say Succeeded over a copy that is gone. Read only: the target serves
        the clients, so none of its sessions is ended. A target that does not answer now (restarting), or refuses the
        Secret's credentials or TLS (its owners rotated them during the soak), passes, with a warning, as the source's
        scale-down changes nothing on it: the clients are on the target already, and failing here would roll the
        traffic back over a target that may hold their writes."""
        target = self._database(ref, driver.target_secret, "spec.driver.targetSecret")
        try:
            with self._connect(target, default_transaction_read_only="on") as conn:
                mark = unwritten.read_mark(conn)
        except (DatabaseUnreachable, BadCredentials, TlsMismatch, psycopg.OperationalError) as error:
            activity.logger.warning(
                "could not look at %s for verify's mark before the scale-down (%s): going on", target.describe(), error
            )
            return
        if mark is None or mark.migration != owner(ref):
            holds = (
                f"no mark of verify of Migration {ref} any more"
                if mark is None
                else f"the mark of verify of Migration {mark.migration}, not of Migration {ref}"
            )
            raise TargetNotVerified(
                f"{target.describe()}, which the clients use since switch-traffic, holds {holds}: it lost what verify "
                "compared (emptied, or restored over). The source is not scaled down "
                "and keeps its data: stop the clients' writes to the target, see what it holds, and bring the source's "
                "rows back to it, or roll back once the target's own writes are safe."
            )

    def _seal(self, ref: MigrationRef, driver: DriverSpec, heartbeats: Heartbeats) -> None:
        """Seals verify's mark on the target: traffic may move to it once this check passed (see unwritten.seal).

        A reachable target without this Migration's mark fails the check (TargetNotVerified): traffic never goes to a
        target nothing says holds the source's data. So does a target that does not answer, retryably
        (TargetUnsealed): it may have lost its volume and come back empty, which its Pods' readiness does not show;
        the seal's session is what finds it (its identity differs from the one the precheck pinned: DatabaseReplaced).
        A step whose check failed at every attempt moved no traffic, and the check before its undo asks the stable
        Service instead of the target (`_no_traffic_moved`; workflows/saga.py, NO_TRAFFIC_MOVED)."""
        target = self._database(ref, driver.target_secret, "spec.driver.targetSecret")
        try:
            with self._connect(target) as conn, privileged(target, "end other sessions and keep ferry's markers"):
                waiting = lambda: heartbeats.raise_if_cancelled("sealing verify's mark")  # noqa: E731

                def unchanged(mark: FenceMark) -> None:
                    with answering_within(conn):
                        settled = unwritten.settle(conn, waiting)
                    with privileged(target, "read every sequence"):
                        present = fencing.read(conn)
                    found = fencing.changes(mark, present, since="verify compared it")
                    if found:
                        raise TargetNotVerified(
                            f"{target.describe()} is not as verify left it: {'; '.join(found)}"
                            + ("" if settled else " (some of its sessions may not have said all they wrote yet)")
                            + ". A crash of its server since (which empties unlogged tables and drops the statistics "
                            "that would show writes), or writes by someone else, and verify's comparison no longer "
                            "holds: the clients are not sent there, and nothing changed. Roll back, and migrate again."
                        )

                sealed = unwritten.seal(conn, owner(ref), Attempt.current(), waiting, unchanged)
        except (DatabaseUnreachable, psycopg.OperationalError) as error:
            raise unwritten.TargetUnsealed(
                f"{target.describe()} did not answer to have verify's mark sealed ({error}), so nothing says it still "
                "holds what verify compared: the clients are not sent there. The check is tried again at the next "
                "attempt; if the target stays silent, the Migration rolls back (nothing moved to the target)."
            ) from error
        if not sealed:
            raise TargetNotVerified(
                f"{target.describe()} holds no mark of verify of Migration {ref}, so nothing says it holds what verify "
                "compared: an undo emptied it since (a run reset to before switch-traffic, say), or the mark was "
                "removed by hand. The clients are not sent there and nothing changed: roll back, and migrate again."
            )
        activity.logger.info("sealed verify's mark on %s: no verify marks it again", target.describe())

    # --- snapshot ----------------------------------------------------------------------------

    @activity.defn(name=_name(DriverOperation.SNAPSHOT), no_thread_cancel_exception=True)
    def snapshot(self, input: SnapshotInput) -> SnapshotResult:
        """Streams a pg_dump of the source into s3://bucket/key; returns its SHA-256 and size.

        With `input.restore` (mode Snapshot), the same stream goes into a pg_restore of
        the target at the same time, in one transaction that commits only once pg_dump
        exited cleanly and the whole object is in S3 (see restoring): then migrate has
        nothing left to restore, and this step's undo (undo_snapshot) empties the target.

        Idempotent: the key is the same for every attempt, so a retry replaces the
        object; it first aborts the unfinished multipart uploads of that key that a dead
        attempt left behind, and a restoring retry first empties what an earlier attempt
        of this Migration restored. A failed or cancelled attempt aborts its own upload
        and kills its pg_restore before it commits. Every object names the attempt that
        wrote it, and a late attempt (the saga wrote it off and went on) that finds a
        later attempt's object is refused (Overtaken) before it deletes anything, or
        before it completes an upload, having aborted its own (see snapshot_attempts).
        While it runs, status.progress shows the bytes dumped (no total: the dump's size is
        not known beforehand).

        With spec.driver.parallelism (or the worker's --snapshot-streams) above one, a source
        large enough with two tables or more goes in parallel streams, each an object of
        its own beside the key, and the target is marked incomplete until the last piece
        committed (see streams).
        """
        db = self._database(input.ref, input.driver.source_secret, "spec.driver.sourceSecret")
        target = None
        if input.restore:
            target = self._database(input.ref, input.driver.target_secret, "spec.driver.targetSecret")
        spec, bucket, key = input.snapshot, input.snapshot.bucket, input.key
        snapshot_store.require_own_snapshot(input.ref, spec, bucket, key, "write the snapshot to")
        mine = Attempt.current()
        location = f"s3://{bucket}/{key}"
        credentials = self._secrets.s3_credentials(input.ref.namespace, spec.credentials_secret)
        wanted = self._settings.streams_for(input.driver.parallelism)
        if input.driver.parallelism and input.driver.parallelism > wanted:
            activity.logger.warning(
                "spec.driver.parallelism asks for %d streams; this worker runs at most %d (--snapshot-max-streams)",
                input.driver.parallelism,
                wanted,
            )
        with (
            Heartbeats(self._settings.heartbeat_interval) as heartbeats,
            self._progress(input.ref, StepName.SNAPSHOT) as progress,
        ):
            # Refused credentials, a missing database or a standby fail here, clearly, before the target is touched.
            with self._connect_primary(db) as conn:
                estimate = dumping.database_size(conn)
                groups = []
                if wanted > 1 and estimate >= self._settings.parallel_min_size:
                    groups = streams.plan(conn, wanted)
            if len(groups) < 2:
                groups = []  # one table, or one stream: nothing to share
            s3 = snapshot_store.client(spec, credentials, self._settings)
            with snapshot_store.permanent_failures(s3, bucket, credentials):
                # Before anything is deleted, and before the target is touched: objects a later attempt wrote are the
                # snapshot the saga keeps, and this one is late (see snapshot_attempts).
                found = [key, *snapshot_store.stream_objects(s3, bucket, key)]
                snapshot_attempts.refuse_if_overtaken(s3, bucket, found, mine, main=key, done="changed nothing")
                aborted = snapshot_store.abort_incomplete_uploads(s3, bucket, key)
                aborted += snapshot_store.remove_streams(s3, bucket, key)
                if aborted:
                    activity.logger.info("removed %d unfinished uploads or streams of %s", aborted, location)
            freeze = None
            if target is not None:
                with self._connect(target) as conn:
                    with privileged(target, "end other sessions, drop and create schemas"):
                        retry = replication.lock_retry(heartbeats, "emptying the target for the restore", LOCK_PAUSE)
                        restoring.prepare_target(conn, target, owner(input.ref), complete=not groups, retry=retry)
                    freeze = self._freezable(input.ref, input.driver, conn.info.server_version)
            with snapshot_store.permanent_failures(s3, bucket, credentials):
                if groups:
                    with self._cleared_on_failure(target, input.ref) if target else contextlib.nullcontext():
                        result = self._snapshot_in_streams(
                            input, db, target, s3, heartbeats, progress, estimate, groups, freeze, mine
                        )
                else:
                    with (
                        restoring.Restore(target, self._settings, heartbeats, location, freeze)
                        if target
                        else contextlib.nullcontext() as restore,
                        self._connect_primary(db) as holder,
                        streams.exported_snapshot(holder) as checked,
                    ):
                        # pg_dump connects on its own, with no check of which server it reached: it reads the
                        # snapshot of a session that passed them, which no other server (a standby, another Pod
                        # behind the host's name) can import.
                        sha256, size = dumping.dump_to_s3(
                            db, self._settings, s3, bucket, key, heartbeats, estimate, progress, restore,
                            options=[f"--snapshot={checked}"], metadata=snapshot_attempts.metadata(mine),
                            check=snapshot_attempts.before_completing(s3, bucket, key, key, mine),
                        )  # fmt: skip
                        _check_stored(s3, bucket, key, size)
                        if restore is not None:
                            restore.commit()  # the whole stream is in S3 and pg_dump exited cleanly
                    result = SnapshotResult(bucket=bucket, key=key, sha256=sha256, size_bytes=size)
            if target is not None:
                # Sessions of their own: one kept open through a long dump could be closed as idle by the server
                # (idle_session_timeout) or a proxy, and fail a step whose restore had committed.
                self._analyze(target, heartbeats)
        activity.logger.info(
            "snapshot of %s: %s, %d bytes in %d objects, sha256 %s%s",
            db.describe(),
            location,
            result.total_bytes,
            1 + len(result.streams),
            result.sha256,
            f"; restored into {target.describe()}" if target else "",
        )
        return result.model_copy(update={"restored": target is not None})

    def _snapshot_in_streams(
        self,
        input: SnapshotInput,
        db: DatabaseConnection,
        target: DatabaseConnection | None,
        s3: S3Client,
        heartbeats: Heartbeats,
        progress: ProgressWriter,
        estimate: int,
        groups: list[list[streams.Table]],
        freeze: frozenset[bytes] | None,
        mine: Attempt,
    ) -> SnapshotResult:
        """The snapshot in parallel streams (see streams), restored into `target` (prepared, marked incomplete) if
        given, which is marked complete at the end (the caller empties and unmarks it if this fails). Each object
        names `mine`, this attempt, and none replaces a later attempt's (see snapshot_attempts)."""
        bucket, key = input.snapshot.bucket, input.key
        total = streams.Total(progress)
        shared = streams.stream_settings(self._settings, len(groups))
        streamed = sum(table.size for group in groups for table in group)
        with self._connect_primary(db) as holder, streams.exported_snapshot(holder) as name:
            sha256, size = dumping.dump_to_s3(
                db,
                self._settings,
                s3,
                bucket,
                key,
                heartbeats,
                max(0, estimate - streamed),
                total.share(0),
                options=streams.main_options(name, groups),
                metadata=snapshot_attempts.metadata(mine),
                check=snapshot_attempts.before_completing(s3, bucket, key, key, mine),
            )
            _check_stored(s3, bucket, key, size)
            main = SnapshotResult(bucket=bucket, key=key, sha256=sha256, size_bytes=size)

            def job(index: int, group: list[streams.Table]) -> Callable[[Heartbeats], SnapshotStream]:
                at, part = stream_key(key, index), sum(table.size for table in group)
                activity.logger.info(
                    "snapshot stream %d of %d: %d tables, %d bytes in the database (%s%s)",
                    index,
                    len(groups),
                    len(group),
                    part,
                    ", ".join(table.name for table in group[:3]),
                    ", ..." if len(group) > 3 else "",
                )

                def run(beats: Heartbeats) -> SnapshotStream:
                    location = f"s3://{bucket}/{at}"
                    with (
                        restoring.Restore(target, self._settings, beats, location, freeze, truncate=True)
                        if target
                        else contextlib.nullcontext() as restore
                    ):
                        options = streams.stream_options(name, group)
                        sha, bytes_ = dumping.dump_to_s3(
                            db, shared, s3, bucket, at, beats, part, total.share(index), restore, options,
                            snapshot_attempts.metadata(mine),
                            snapshot_attempts.before_completing(s3, bucket, key, at, mine),
                        )  # fmt: skip
                        _check_stored(s3, bucket, at, bytes_)
                        if restore is not None:
                            restore.commit()
                    return SnapshotStream(key=at, sha256=sha, size_bytes=bytes_, tables=len(group))

                return run

            jobs = [job(index, group) for index, group in enumerate(groups, start=1)]
            if target is None:
                done = streams.Group(heartbeats).run(jobs)
            else:
                done = streams.restore_around(target, self._settings, s3, main, heartbeats, jobs, len(jobs))
        if target is not None:
            with self._connect(target) as conn, privileged(target, "change the database's settings"):
                restoring.mark_complete(conn, target, owner(input.ref))
        return main.model_copy(update={"streams": done})

    @activity.defn(name=_name(DriverOperation.UNDO_SNAPSHOT), no_thread_cancel_exception=True)
    def undo_snapshot(self, input: UndoSnapshotInput) -> UndoSnapshotResult:
        """Undoes a snapshot that also restored into the target: empties the target of this Migration's restore (as
        undo_migrate does), then aborts the snapshot's uploads and deletes its object unless retention keeps it.

        Idempotent, and right without the snapshot's result: the target's marker and the
        deterministic key say what any attempt did.
        """
        if input.driver is not None:
            self.undo_migrate(UndoMigrateInput(ref=input.ref, driver=input.driver))
        return self._store.undo_snapshot(input)

    # --- migrate -----------------------------------------------------------------------------

    @activity.defn(name=_name(DriverOperation.MIGRATE), no_thread_cancel_exception=True)
    def migrate(self, input: MigrateInput) -> MigrateResult:
        """Restores the snapshot into the target, checking its SHA-256; all or nothing.

        When the snapshot step restored it already (`artifact.restored`) and the target
        still holds that restore, there is nothing to do. Otherwise it reads the object
        back from S3. Idempotent: the restore is one transaction, and a retry first drops
        whatever an earlier attempt of this Migration committed (see restoring). While it
        runs, status.progress shows the bytes restored of the snapshot's size. A snapshot in
        parallel streams is restored the same way, its streams at once (see streams).
        """
        db = self._database(input.ref, input.driver.target_secret, "spec.driver.targetSecret")
        artifact = input.artifact
        snapshot_store.require_own_snapshot(input.ref, input.snapshot, artifact.bucket, artifact.key, "restore")
        # Heartbeats from the start: connecting may take a few tries, longer than the heartbeat timeout.
        with (
            Heartbeats(self._settings.heartbeat_interval) as heartbeats,
            self._connect(db) as conn,  # one session reads the target and prepares it with what it read
        ):
            found = restoring.find(conn)
            if artifact.restored and found.holds_restore(owner(input.ref)):
                tables = restoring.count_tables(conn)
                activity.logger.info(
                    "%s holds %s already, restored while the snapshot was taken: %d tables",
                    db.describe(),
                    artifact.location,
                    tables,
                )
                return MigrateResult(tables=tables, bytes_restored=artifact.total_bytes, during_snapshot=True)
            credentials = self._secrets.s3_credentials(input.ref.namespace, input.snapshot.credentials_secret)
            with self._progress(input.ref, StepName.MIGRATE) as progress:
                with privileged(db, "end other sessions, drop and create schemas"):
                    retry = replication.lock_retry(heartbeats, "emptying the target for the restore", LOCK_PAUSE)
                    restoring.prepare_target(
                        conn, db, owner(input.ref), found, complete=not artifact.streams, retry=retry
                    )
                freeze = self._freezable(input.ref, input.driver, conn.info.server_version)
                s3 = snapshot_store.client(input.snapshot, credentials, self._settings)
                with snapshot_store.permanent_failures(s3, artifact.bucket, credentials):
                    if artifact.streams:
                        with self._cleared_on_failure(db, input.ref):
                            read = streams.restore_from_store(
                                db, self._settings, s3, artifact, heartbeats, progress, freeze
                            )
                            with self._connect(db) as marking, privileged(db, "change the database's settings"):
                                restoring.mark_complete(marking, db, owner(input.ref))
                    else:
                        body = restoring.open_snapshot(s3, artifact)
                        try:
                            read = restoring.restore(db, self._settings, body, artifact, heartbeats, progress, freeze)
                        finally:
                            body.close()
                self._analyze(db, heartbeats)  # new sessions, as in snapshot: the first sat idle meanwhile
                with self._connect(db) as after:
                    tables = restoring.count_tables(after)
        activity.logger.info("restored %s into %s: %d bytes, %d tables", artifact.location, db.describe(), read, tables)
        return MigrateResult(tables=tables, bytes_restored=read)

    def _analyze(self, db: DatabaseConnection, heartbeats: Heartbeats) -> None:
        """The restored target's planner statistics (see analyzing), in sessions of their own."""
        once = dataclasses.replace(self._settings, connect_attempts=1)  # the extra sessions are not needed
        analyzing.analyze(
            lambda: self._connect(db), lambda: connect(db, once), heartbeats, self._settings.analyze_sessions
        )

    def _freezable(self, ref: MigrationRef, driver: DriverSpec, server_version: int) -> frozenset[bytes] | None:
        """The source's tables whose rows a restore into a target of `server_version` loads frozen, or None when the
        restore cannot go through psql (see restore_script)."""
        if not restore_script.usable(self._settings.postgres_bindir, server_version):
            return None
        source = self._database(ref, driver.source_secret, "spec.driver.sourceSecret")
        with self._connect(source) as conn:
            return restore_script.freezable(conn)

    @activity.defn(name=_name(DriverOperation.UNDO_MIGRATE), no_thread_cancel_exception=True)
    def undo_migrate(self, input: UndoMigrateInput) -> UndoMigrateResult:
        """Empties the target of what this Migration's migrate restored, and removes its markers (and verify's mark).

        A target whose marker ferry.restored_by names nobody or another Migration is left
        untouched. A target verify marked is emptied only if it took no writes since (it may
        have taken traffic): its other sessions are ended and it is compared with the mark
        first, under locks held until the drop commits; else WritesOnTarget, and nothing is
        dropped (see unwritten.vouch). Idempotent, and safe after a migrate that never ran or
        half ran: the removal is one transaction, and its last act removes the marker it
        looks for. A target verify never marked is ferry's alone: its other client sessions are
        ended first, so that no lock of theirs holds the drop up (see target_sessions). It
        heartbeats throughout: a lock another session still holds is waited for a second at a
        time (replication.briefly_locked), the transaction tried again in between.
        """
        db = self._database_to_undo(
            input.ref, input.driver.target_secret, "spec.driver.targetSecret", "emptying the target"
        )
        doing = "emptying the target"
        self._traffic.refuse_while_served(input.ref, f"emptying {db.describe()}")
        # A DROP SCHEMA of many tables, or a large object's unlink, is long: a cancellation stops it (connection).
        with Heartbeats(self._settings.heartbeat_interval) as heartbeats, self._connect(db) as conn:
            retry = replication.lock_retry(heartbeats, doing, LOCK_PAUSE)
            try:
                with privileged(db, "end other sessions, lock tables, drop schemas and change the database's settings"):
                    end_others = lambda c: self._end_sessions(c, db, heartbeats)  # noqa: E731
                    removed = restoring.remove(
                        conn, db, owner(input.ref), retry=retry, end_sessions=end_others, attempt=Attempt.current()
                    )
            except psycopg.errors.QueryCanceled:
                heartbeats.raise_if_cancelled(doing)
                raise
        if removed:
            activity.logger.info("emptied %s of what Migration %s restored", db.describe(), input.ref)
        return UndoMigrateResult(removed=removed)

    # --- verify ------------------------------------------------------------------------------

    @activity.defn(name=_name(DriverOperation.VERIFY), no_thread_cancel_exception=True)
    def verify(self, input: VerifyInput) -> VerifyResult:
        """Compares source and target (every table's rows, the schema object by object, sequences, large objects),
        then marks where the target's writes stand before traffic moves to it.

        Idempotent: it reads both sides at once, each on its own connection; then it
        ends the target's other sessions (the target is ferry's own until traffic moves)
        and records the target's mark in the target (ferry.verified_mark), with this
        attempt, replacing the mark of an earlier attempt. A late attempt (a later one
        marked the target, or the check before switch-traffic sealed the mark) is refused
        with TargetVerified before it ends any session (see unwritten.marking). See
        unwritten for why the mark is exact. While it reads, status.progress shows the
        rows compared on both sides, of twice the source's estimate (its statistics),
        when it has one. The source is read on its primary: a standby, which may lag, is
        refused (ServerInRecovery, retried).
        """
        source = self._database(input.ref, input.driver.source_secret, "spec.driver.sourceSecret")
        target = self._database(input.ref, input.driver.target_secret, "spec.driver.targetSecret")
        with (
            Heartbeats(self._settings.heartbeat_interval) as heartbeats,
            self._progress(input.ref, StepName.VERIFY) as progress,
        ):

            def session(db: DatabaseConnection) -> Connection:
                """The source's on its primary (ServerInRecovery, retried): a standby may lag, and hold older rows."""
                opening = self._connect_primary if db is source else self._connect
                return opening(db, **checksums.SESSION)

            with session(source) as conn:  # first, so that a standby is refused before anything reads it
                estimate = checksums.estimated_rows(conn)
            with self._connect(target) as guard:
                try:
                    # LOCK is held from before the first read of the target until its mark is recorded, and the
                    # target's other sessions (a late restore's) are ended first: a written-off snapshot or migrate
                    # attempt that resumes now waits for the mark, then refuses (refuse_if_verified), instead of
                    # emptying or appending to the target between the comparison and the mark.
                    with self._marking(guard, target, input.ref, heartbeats):
                        self._end_sessions(guard, target, heartbeats)
                        with privileged(target, "read every sequence"):
                            before = fencing.read(guard)
                        return self._verify(
                            input, source, target, guard, session, estimate, heartbeats, progress, before
                        )
                except psycopg.OperationalError:
                    if not guard.broken:
                        raise
                    raise unwritten.VerifyGuardLost(
                        f"verify's session on {target.describe()}, which kept restores off the target from its first "
                        "read until its mark, was ended: by a later attempt of verify, which then marks the target "
                        "itself, or on the server. This attempt marked nothing; an attempt that is still the saga's "
                        "compares again."
                    ) from None

    def _verify(
        self, input: VerifyInput, source: DatabaseConnection, target: DatabaseConnection, guard: Connection,
        session: Callable[[DatabaseConnection], Connection], estimate: int | None, heartbeats: Heartbeats,
        progress: ProgressWriter, before: FenceMark,
    ) -> VerifyResult:  # fmt: skip
        """verify's comparison and mark, `guard` holding LOCK on the target in the marking transaction; `before` is
        where the target's writes stood once its other sessions had ended, before the first read."""
        compared = self._compared_ahead(source, guard, input.ahead)
        if estimate is not None:  # both sides read the rows of every table not compared ahead
            estimate = 2 * max(0, estimate - sum(table.rows for table in compared.values()))
        progress.update(rows_done=0, rows_total=estimate)
        counter = _Counter(heartbeats, progress)
        try:
            source_side, target_side = read_both(
                session,
                source,
                target,
                heartbeats,
                lambda conn, row_hash, done: verifying.read(conn, row_hash, done, frozenset(compared)),
                counter.side,
            )
        except psycopg.errors.InsufficientPrivilege as error:  # row-level security, see checksums.SESSION
            raise BadCredentials(
                f"the users in Secrets {source.secret} and {target.secret} may not read every row of "
                f"{source.describe()} and {target.describe()}: {said(source, error)}. Verify compares every "
                "row of every table, and compares none when some would be hidden from it: give the users "
                "BYPASSRLS (or use superusers), then retry the step or create the Migration again."
            ) from None
        source_side = self._reprint_views(target, source_side, target_side)
        comparison = verifying.compare(source_side, target_side, compared)
        if comparison.difference:
            raise VerificationMismatch(
                f"{comparison.difference}. The target does not hold the source's data: roll back, find out why, "
                "and migrate again."
            )
        fence = self._mark_target(guard, target, input.ref, heartbeats, before)
        activity.logger.info(
            "verified %d tables and %d schema objects: source and target are the same; %d rows written to the target",
            len(comparison.checks),
            comparison.objects,
            fence.writes,
        )
        tables = verifying.listed(comparison.checks)
        return VerifyResult(
            tables=tables,
            tables_compared=len(comparison.checks) if len(tables) < len(comparison.checks) else None,
            objects=comparison.objects,
            target_fence=fence,
        )

    def _compared_ahead(
        self, source: DatabaseConnection, guard: Connection, compared: AheadComparison | None
    ) -> dict[str, TableAhead]:
        """The tables replicate compared before the freeze that neither side has written since (see ahead); `guard`
        is verify's marking session on the target, whose other sessions it ended (their counts are flushed when they
        exit)."""
        if compared is None or not compared.tables:
            return {}
        target_marks = ahead.marks(guard)
        with self._connect_primary(source) as conn:  # a standby counts none of its writes
            source_marks = ahead.marks(conn)
        vouched = ahead.vouched(compared, source_marks, target_marks)
        activity.logger.info(
            "%d of the %d tables compared before the freeze were not written since: not read again",
            len(vouched),
            len(compared.tables),
        )
        return vouched

    def _mark_target(
        self, guard: Connection, db: DatabaseConnection, ref: MigrationRef, heartbeats: Heartbeats, before: FenceMark
    ) -> FenceMark:
        """The target's mark, once its other sessions are gone, kept in the target for undos without results; in the
        marking transaction open on `guard`, which was refused to a late attempt (see unwritten.marking).

        Refused (TargetWrittenDuringVerify, nothing recorded) when the target was written while verify read it,
        since `before`: a write to a table already read would be in the mark without having been compared, and
        every later check (the seal, check_unwritten, the undos' vouching) would count it as the source's data."""
        fence, ended = self._mark(guard, db, heartbeats)
        if written := fencing.changes(before, fence, since="verify began reading it"):
            raise unwritten.TargetWrittenDuringVerify(
                f"{db.describe()} was written while verify compared it with the source, by a client other than "
                f"ferry (a job scheduled on the target, a client sent there early): {'; '.join(written)}. Nothing "
                "was marked; the next attempt compares again, and fails if the target no longer holds the source's "
                "data. Find what writes to the target and stop it: until traffic moves, the target is ferry's alone."
            )
        with privileged(db, "keep ferry's markers"):
            unwritten.record(guard, db, owner(ref), fence, Attempt.current())
        activity.logger.info("marked where %s's writes stand; ended %d sessions first", db.describe(), ended)
        return fence

    @contextlib.contextmanager
    def _marking(
        self, conn: Connection, db: DatabaseConnection, ref: MigrationRef, heartbeats: Heartbeats
    ) -> Iterator[None]:
        """unwritten.marking: a transaction in which this attempt of verify may end the target's sessions, or
        TargetVerified before it ends any."""
        waiting = lambda: heartbeats.raise_if_cancelled("waiting to mark the target")  # noqa: E731
        with (
            privileged(db, "end other sessions and keep ferry's markers"),
            unwritten.marking(conn, db, owner(ref), waiting),
        ):
            yield

    # --- check_unwritten ---------------------------------------------------------------------

    @activity.defn(name=_name(DriverOperation.CHECK_UNWRITTEN), no_thread_cancel_exception=True)
    def check_unwritten(self, input: CheckUnwrittenInput) -> CheckUnwrittenResult:
        """Fails with WritesOnTarget if the target was written since verify marked it; ends no session.

        Runs before traffic goes back to the source. The mark is the input's, or (for an
        undo without verify's result) the one verify recorded in the target; a target
        with no mark of this Migration was never verified, so ferry moved no traffic to
        it: nothing to compare. Idempotent: it only reads, in read-only sessions (see
        unwritten for what it can and cannot see).

        First it reaches the source, which must be the database the precheck pinned
        (identity.py): a source that came back from scale-down-old's undo with its volumes
        lost or replaced (a new initdb, another system identifier) fails the check with
        DatabaseReplaced, retried (or, the database missing there, InvalidSpec), so traffic
        stays on the target, and nothing after this check (the undos that empty the target)
        takes the only copy left. A source that does not answer fails it the same way
        (DatabaseUnreachable, retried by the undos): traffic goes back only to a source that
        serves.
        """
        # Heartbeats from the start: the tries to connect, and the Kubernetes reads, may outlast the heartbeat timeout.
        with Heartbeats(self._settings.heartbeat_interval):
            source = self._database_to_undo(
                input.ref, input.driver.source_secret, "spec.driver.sourceSecret", "the check before traffic goes back"
            )
            with self._connect(source, **READING):
                pass  # the database the precheck pinned, else DatabaseReplaced (retried): see above
            if input.source_only:
                return CheckUnwrittenResult(compared=False)
            if self._no_traffic_moved(input):
                return CheckUnwrittenResult(compared=False, no_traffic_moved=True)
            db = self._database_to_undo(
                input.ref, input.driver.target_secret, "spec.driver.targetSecret", "the check before traffic goes back"
            )
        with Heartbeats(self._settings.heartbeat_interval) as heartbeats, self._connect(db, **READING) as conn:
            mark = input.fence or unwritten.recorded(conn, owner(input.ref))
            if mark is None:
                activity.logger.warning(
                    "%s holds no mark of Migration %s: verify never marked it, so ferry moved no traffic to it; "
                    "nothing to compare, traffic may go back",
                    db.describe(),
                    input.ref,
                )
                return CheckUnwrittenResult(compared=False)
            with answering_within(conn):
                settled = unwritten.settle(conn, lambda: heartbeats.raise_if_cancelled("checking the target"))
            with privileged(db, "read every sequence"):
                present = fencing.read(conn)
        if not settled:
            activity.logger.info("%s: some sessions may not have flushed their statistics yet", db.describe())
        found = fencing.changes(mark, present, since="verify marked it, before traffic moved")
        if found:
            raise WritesOnTarget(
                f"{db.describe()} took writes since traffic moved to it: {'; '.join(found)}. Switching traffic back "
                "to the source would lose them (the source does not have them, and the rollback would then empty "
                "the target), so the rollback stops here and traffic stays on the target, which holds everything. "
                "Either keep the target: the migration is done but for scaling the source down, which you may do "
                "by hand, then delete the Migration (the target stays). Or copy those writes back to the source by "
                "hand, then finish the rollback by hand, as the README's recovery section says."
            )
        activity.logger.info("%s took no writes since traffic moved to it: traffic may go back", db.describe())
        return CheckUnwrittenResult(compared=True, fence=present)

    def _no_traffic_moved(self, input: CheckUnwrittenInput) -> bool:
        """Whether the stable Service shows that this Migration never moved the traffic (asked only when this run never
        called switch-traffic's activity: `input.service`): no record of a switch by it (switch-traffic writes one in
        the same write as the selector; a reset's earlier run would have left it) and a selector that does not select
        the target's Pods. False whenever that cannot be read: then the target is compared, as ever."""
        if input.service is None or input.target_stateful_set is None or self._api is None:
            return False
        ref = input.ref
        try:
            service = k8s.CoreV1Api(self._api).read_namespaced_service(input.service, ref.namespace)
        except ApiException as error:
            activity.logger.info("could not read Service %s/%s (%s)", ref.namespace, input.service, error)
            return False
        record = records.selector_record(service.metadata.annotations or {})
        if record is not None and not record.is_of_another(ref):
            return False
        selector = (service.spec.selector if service.spec else None) or {}
        try:
            if self._serves_the_target(ref, input.service, selector, input.target_stateful_set):
                return False
        except ApiException as error:
            activity.logger.info("could not list the target's Pods or the Service's endpoints (%s)", error)
            return False
        activity.logger.info(
            "Service %s/%s carries no record of a switch by Migration %s and does not select the target's Pods: no "
            "traffic moved, so the target is not compared",
            ref.namespace,
            input.service,
            ref,
        )
        return True

    def _serves_the_target(self, ref: MigrationRef, service: str, selector: dict[str, str], target: str) -> bool:
        """Whether the Service `service`, of selector `selector`, sends traffic to the target's Pods now: its selector
        matches the labels one of them carries, or one of its EndpointSlices lists one."""
        assert self._api is not None
        core, discovery = k8s.CoreV1Api(self._api), k8s.DiscoveryV1Api(self._api)
        own = kube_objects.label_selector({MIGRATION_UID_LABEL: ref.uid})
        pods = core.list_namespaced_pod(ref.namespace, label_selector=own).items
        labels = [pod.metadata.labels or {} for pod in pods if kube_objects.is_pod_of(target, pod.metadata.name)]
        labels.append(kube_objects.target_pod_labels(ref, target))  # as provision labels them, Pods or none
        if any(kube_objects.services_selecting(found, {service: selector}) for found in labels):
            return True
        slices = discovery.list_namespaced_endpoint_slice(
            ref.namespace, label_selector=f"kubernetes.io/service-name={service}"
        ).items
        listed = {
            endpoint.target_ref.name
            for found in slices
            for endpoint in found.endpoints or []
            if endpoint.target_ref is not None and endpoint.target_ref.kind == "Pod"
        }
        return any(kube_objects.is_pod_of(target, name) for name in listed)

    def _reprint_views(
        self, target: DatabaseConnection, source_side: verifying.Side, target_side: verifying.Side
    ) -> verifying.Side:
        """The source side with each view query that reads otherwise on the target printed by the target's server.

        Only when some query differs, as it does between PostgreSQL 15 and 16 or later (see
        schema): between servers of one major, nothing is printed again and no session opens.
        """
        differing = verifying.queries_to_reprint(source_side, target_side)
        if not differing:
            return source_side
        with self._connect(target, **checksums.SESSION) as conn:
            return verifying.with_reprinted(source_side, schema.reprinted(conn, differing))

    # --- shared ------------------------------------------------------------------------------

    def _database(self, ref: MigrationRef, secret: str, field: str) -> DatabaseConnection:
        """The database Secret at `field`, as read now, with the identity its sessions must find (identity.py)."""
        return self._pins.database(ref, secret, field)

    def _database_to_undo(self, ref: MigrationRef, secret: str, field: str, what: str) -> DatabaseConnection:
        """The connection an undo (or the check before one) needs: a Secret it cannot read is retried (see
        retried_until_readable), not the end of the rollback."""
        with retried_until_readable(what):
            return self._database(ref, secret, field)

    def _connect(self, db: DatabaseConnection, **session: str) -> Connection:
        return connect(db, self._settings, **(session or WRITABLE))

    def _connect_primary(self, db: DatabaseConnection, **session: str) -> Connection:
        """`_connect`, refusing a standby (connection.connect_primary)."""
        return connect_primary(db, self._settings, **(session or WRITABLE))

    def _progress(self, ref: MigrationRef, step: StepName) -> ProgressWriter:
        return ProgressWriter(self._api, ref, step.value, self._settings.progress_interval, versions=self._versions)


R = TypeVar("R")


def _check_stored(s3: S3Client, bucket: str, key: str, size: int) -> None:
    """Fails unless s3://bucket/key holds the `size` bytes just uploaded."""
    stored = s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
    if stored != size:
        raise RuntimeError(f"s3://{bucket}/{key} holds {stored} bytes after uploading {size}")


def read_both(
    connect: Callable[[DatabaseConnection], Connection],
    source: DatabaseConnection,
    target: DatabaseConnection,
    heartbeats: Heartbeats,
    read: Callable[[Connection, checksums.RowHash, Callable[[int, int], None]], R],
    counter: Callable[[str], Callable[[int, int], None]],
) -> tuple[R, R]:
    """`read` of both sides at the same time, on a connection each (opened by `connect`), for verify and its ahead,
    with the row hash both servers compute alike (see checksums.agreed); `counter(side)` is what each side's read
    calls with the tables and rows it has read."""
    with contextlib.ExitStack() as stack:
        # Opened here, in the activity's thread: a cancellation stops them, the probe's and the reads' calls alike.
        connections = [stack.enter_context(connect(db)) for db in (source, target)]

        def cancel_queries() -> None:
            for conn in connections:
                with contextlib.suppress(psycopg.Error):  # a server that does not answer: its session's stop ends it
                    conn.cancel_safe(timeout=CANCEL_TIMEOUT)

        with concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="verify") as pool:
            try:
                row_hash = checksums.agreed(*connections)
                activity.logger.info("comparing rows by their %s on both sides", row_hash.name)
                futures = [
                    pool.submit(read, conn, row_hash, counter(side))
                    for side, conn in zip(("source", "target"), connections, strict=True)
                ]
                return futures[0].result(), futures[1].result()
            except psycopg.errors.QueryCanceled:
                heartbeats.raise_if_cancelled("comparing source and target")
                raise
            except BaseException:
                cancel_queries()  # no need to finish the other side
                raise


class _Counter:
    """What verify's two sides have read so far: tables for the heartbeats, the rows of both for status.progress."""

    def __init__(self, heartbeats: Heartbeats, progress: ProgressWriter) -> None:
        self._heartbeats = heartbeats
        self._progress = progress
        self._rows: dict[str, int] = {}
        self._lock = threading.Lock()

    def side(self, side: str) -> Callable[[int, int], None]:
        def done(tables: int, rows: int) -> None:
            self._heartbeats.note(**{f"{side}_tables": tables})
            with self._lock:
                self._rows[side] = rows
                both = sum(self._rows.values())
            self._progress.update(rows_done=both)

        return done


def _own_slots(conn: Connection, ref: MigrationRef | None) -> list[str]:
    """The replication slots of `ref`'s replication (mode Online) on this server, whose walsenders stay."""
    if ref is None:
        return []
    slot = replication.name(ref.uid)
    return replication.slots(conn, slot, replication.read_record(conn, slot))


def _rounds(heartbeats: Heartbeats) -> Callable[[int], None]:
    return lambda ended: heartbeats.progress(sessions_ended=ended)
