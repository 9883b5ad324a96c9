"""Inputs and results of the migration workflow, its signals and every activity it calls.

One input model per call, so fields can be added without breaking running histories.
Activity names are constants here: the workflow calls activities by name, the worker
registers implementations under the same names, and tests register fakes under them.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Annotated

from pydantic import AfterValidator, Field

from ferry.api.migration import (
    AfterRollback,
    AfterSuccess,
    ApiModel,
    CheckedDatabases,
    DriverSpec,
    EventType,
    MigrationSpec,
    MigrationStatus,
    Phase,
    SnapshotSpec,
    SnapshotStatus,
    Throughput,
)

TASK_QUEUE = "ferry"
"""The default task queue of ferry's workers."""
WATCHES_SUFFIX = "-watches"
"""What the task queue of a run's watches adds to the run's own (see `watches_task_queue`)."""


def watches_task_queue(task_queue: str) -> str:
    """The task queue of the watches of runs on `task_queue`: activities that run beside the saga's waits (awaiting
    approval, paused, soaking: days, maybe) for as long as they last. Workers serve it with slots and threads of
    their own (--max-concurrent-watches), so a waiting Migration never holds one of the slots its own and other
    Migrations' steps and undos need."""
    return f"{task_queue}{WATCHES_SUFFIX}"


WORKFLOW_NAME = "MigrationV2"
"""The saga's workflow type. Version 1 ("Migration") runs only to finish what it started: see workflows/legacy.py."""
WORKFLOW_NAME_V1 = "Migration"
"""The saga's workflow type of version 1, which runs only to finish what it started (workflows/legacy.py)."""
CLEANUP_WORKFLOW_NAME = "MigrationRetentionCleanup"
UNDO_WORKFLOW_NAME = "MigrationUndo"
"""Undoes a Migration whose run succeeded after its deletion was asked for (see the watcher's deletion)."""


MAX_GENERATION = 2**53 - 1
"""The largest Migration generation a workflow input or a control takes. The API server counts a Migration's
metadata.generation up by one per spec change, so no real one comes near it (one change per microsecond would take
285 years); it is the largest integer a JSON reader using doubles (the Temporal Web UI) holds exactly, and it is far
below 2^63, so status.observedGeneration, an int64, stays a value the API server accepts."""


def _a_generation(value: int) -> int:
    if not 0 <= value <= MAX_GENERATION:
        raise ValueError(
            f"a Migration's generation is from 0 to 2^53 - 1 ({MAX_GENERATION}), as metadata.generation counts the "
            f"Migration's spec changes; {value} is none"
        )
    return value


Generation = Annotated[int, AfterValidator(_a_generation)]
"""A Migration's metadata.generation, as a workflow input or a control carries it."""


class MigrationRef(ApiModel):
    """Which Migration object a call is about."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def workflow_id(ref: MigrationRef) -> str:
    """The one workflow ID of a Migration object; a re-created object (new UID) gets a new one."""
    return f"migration/{ref.namespace}/{ref.name}/{ref.uid}"


def cleanup_workflow_id(ref: MigrationRef) -> str:
    return f"cleanup/{ref.namespace}/{ref.name}/{ref.uid}"


def undo_workflow_id(ref: MigrationRef) -> str:
    return f"undo/{ref.namespace}/{ref.name}/{ref.uid}"


# --- workflow ------------------------------------------------------------------------------


class MigrationInput(ApiModel):
    ref: MigrationRef
    generation: Generation
    spec: MigrationSpec


class MigrationResult(ApiModel):
    phase: Phase
    message: str
    snapshot: SnapshotStatus | None = None


class Signal(enum.StrEnum):
    """Signals the workflow accepts; tctl and the temporal CLI send them by these names."""

    APPROVE = "approve"
    PAUSE = "pause"
    RESUME = "resume"
    RETRY = "retry"
    ROLLBACK = "rollback"


PROGRESS_QUERY = "progress"

HEARTBEAT_TIMEOUT_SECONDS = 30
"""Every step's heartbeat timeout: a step that sends no heartbeat for this long is timed out (its worker counts as
lost). The worker's heartbeat and poll intervals are at most half of it (activities/settings.py)."""


def _cut(limit: int) -> AfterValidator:
    """Keeps at most `limit` characters, marking a cut with an ellipsis: never refuses the request."""
    return AfterValidator(lambda text: text if len(text) <= limit else text[: limit - 1] + "…")


def _cut_id(limit: int) -> AfterValidator:
    """Keeps at most `limit` characters, the last ones a digest of the whole, so that two long IDs stay two."""

    def cut(text: str) -> str:
        if len(text) <= limit:
            return text
        digest = hashlib.sha256(text.encode()).hexdigest()[:32]
        return f"{text[: limit - len(digest) - 1]}…{digest}"

    return AfterValidator(cut)


CONTROL_BY_LIMIT = 256
CONTROL_REASON_LIMIT = 1024
CONTROL_ID_LIMIT = 1024
"""Longer than any ID the watcher makes (the control's annotation, `=`, and its value of at most about 340)."""


class ControlRequest(ApiModel):
    """Payload of every signal: who asked, and why. All fields are optional.

    Texts are cut to a few hundred characters: a control sent by hand (`temporal workflow update`, tctl) carrying a
    megabyte in `by` went into every later status write, which the API server then refused for good, and into every
    mirror in the run's history, which Temporal ends at its size limit. The watcher's own limits are narrower."""

    by: Annotated[str, _cut(CONTROL_BY_LIMIT)] = Field(
        default="", description="Who asked, e.g. a user name; shown in status and events."
    )
    reason: Annotated[str, _cut(CONTROL_REASON_LIMIT)] = Field(default="", description="Why, in a few words.")
    generation: Generation | None = Field(
        default=None,
        description="The Migration generation that carried the request (the watcher's); at most 2^53 - 1. A signal "
        "carrying a larger one, or a negative one, is dropped: the saga keeps the largest it saw as "
        "status.observedGeneration, which the watcher compares with the Migration's to see spec.paused change.",
    )
    request_id: Annotated[str, _cut_id(CONTROL_ID_LIMIT)] = Field(
        default="",
        description="Identifies one request: a signal sent twice with the same non-empty id is acted on once.",
    )
    of_spec: bool = Field(
        default=False,
        description="Set by the watcher for a change of spec.paused: the state the spec of `generation` asks for, "
        "not a command. The saga takes it in where it cannot apply (already so, rolling back), so that "
        "observedGeneration catches up with the spec.",
    )


# --- Kubernetes activities -----------------------------------------------------------------


class KubeActivity(enum.StrEnum):
    """Names of the Kubernetes-side activities; each step's undo is named after it."""

    CHECK_CLUSTER = "check_cluster"
    PROVISION = "provision"
    UNDO_PROVISION = "undo_provision"
    SWITCH_TRAFFIC = "switch_traffic"
    UNDO_SWITCH_TRAFFIC = "undo_switch_traffic"
    SCALE_DOWN_OLD = "scale_down_old"
    UNDO_SCALE_DOWN_OLD = "undo_scale_down_old"
    MIRROR_STATUS = "mirror_status"


class EventRecord(ApiModel):
    """A Kubernetes Event to record against the Migration, once."""

    type: EventType
    reason: str
    message: str
    key: str = Field(description="Unique per transition, so a retried recording does not duplicate the Event.")


class MirrorStatusInput(ApiModel):
    ref: MigrationRef
    status: MigrationStatus
    event: EventRecord | None = Field(default=None, description="The Event of the transition `status` shows.")
    earlier_events: list[EventRecord] = Field(
        default_factory=list,
        description="Events of earlier transitions whose own writes this one replaces, oldest first.",
    )


class MirrorStatusResult(ApiModel):
    found: bool = Field(description="False when the Migration no longer exists; nothing was written.")
    conflicts: int = Field(default=0, description="Unused since status is applied server-side; kept for old histories.")
    run_id: str | None = Field(
        default=None,
        description="The run whose write this was (None from older workers): a run made by a reset replays its earlier "
        "run's results, which vouch for that run, not for it.",
    )


class ProvisionInput(ApiModel):
    ref: MigrationRef
    spec: MigrationSpec


class ProvisionResult(ApiModel):
    stateful_set: str
    service: str
    ready_replicas: int


class UndoProvisionInput(ApiModel):
    ref: MigrationRef
    stateful_set: str


class SwitchTrafficInput(ApiModel):
    ref: MigrationRef
    service: str
    target_stateful_set: str


class SwitchTrafficResult(ApiModel):
    previous_selector: dict[str, str]
    endpoints: list[str] = Field(description="Pods the Service's EndpointSlices list after the switch.")


class UndoSwitchTrafficInput(ApiModel):
    ref: MigrationRef
    service: str
    previous_selector: dict[str, str] | None = Field(
        default=None,
        description="The selector before the switch; None: read what switch-traffic recorded on the Service.",
    )
    source_stateful_set: str


class ScaleDownOldInput(ApiModel):
    ref: MigrationRef
    stateful_set: str
    service: str | None = None
    """The stable Service switch-traffic pointed at the target: the source is scaled down only while it still does.
    None in calls scheduled by a saga from before the check."""
    target_stateful_set: str | None = None


class ScaleDownOldResult(ApiModel):
    previous_replicas: int


class UndoScaleDownOldInput(ApiModel):
    ref: MigrationRef
    stateful_set: str
    replicas: int | None = Field(
        default=None,
        description="Replicas before the scale-down; None: read what scale-down-old recorded on the StatefulSet.",
    )


# --- data-driver activities ----------------------------------------------------------------


class DriverOperation(enum.StrEnum):
    """What every data driver implements; the activity name is `<driver>.<operation>`."""

    PRECHECK = "precheck"
    FREEZE = "freeze"
    UNDO_FREEZE = "undo_freeze"
    CHECK_FROZEN = "check_frozen"
    SNAPSHOT = "snapshot"
    MIGRATE = "migrate"
    UNDO_MIGRATE = "undo_migrate"
    UNDO_SNAPSHOT = "undo_snapshot"
    VERIFY = "verify"
    CHECK_UNWRITTEN = "check_unwritten"
    REPLICATE = "replicate"
    UNDO_REPLICATE = "undo_replicate"
    CATCH_UP = "catch_up"
    UNDO_CATCH_UP = "undo_catch_up"
    WATCH_REPLICATION = "watch_replication"


def driver_activity(driver: str, operation: DriverOperation) -> str:
    """Name of a data-driver activity, e.g. `postgresql.freeze`."""
    return f"{driver}.{operation.value}"


class SnapshotStoreActivity(enum.StrEnum):
    """Driver-independent activities on the snapshot object in S3."""

    UNDO_SNAPSHOT = "undo_snapshot"
    DELETE_SNAPSHOT = "delete_snapshot"


class PrecheckInput(ApiModel):
    """Everything checked before anything changes: both databases, the tools, the snapshot bucket."""

    ref: MigrationRef
    driver: DriverSpec
    snapshot: SnapshotSpec
    target_storage_bytes: int | None = Field(
        default=None, description="Size of each target volume: the source's data must fit with room to spare."
    )
    measure: bool = Field(default=False, description="Measure the rates of a small real transfer, for the plan.")
    stable_service: str | None = Field(
        default=None,
        description="spec.source.service, which switch-traffic points at the target: the source Secret must not "
        "reach the source through it.",
    )
    target_may_wait: bool = Field(
        default=False,
        description="A target database that does not answer yet is no problem: its server may be the target "
        "StatefulSet provision is about to create. Its checks then wait for the check after provision "
        "(target_deferred in the result).",
    )
    target_replicas: int = Field(
        default=1, ge=1, description="spec.target.replicas: every one of them gets the clients, one gets the data."
    )
    after_provision: bool = Field(
        default=False,
        description="The check after provision: the source must still be the database the first precheck recorded "
        "(status.databases), which stays recorded; only the target's is added.",
    )


class PrecheckResult(ApiModel):
    """What the checks found when nothing stood in the way."""

    source_version: str = Field(description="The source server's version, e.g. 15.18.")
    target_version: str | None = Field(
        default=None, description="The target server's version; None while its checks wait (target_deferred)."
    )
    target_deferred: bool = Field(
        default=False,
        description="The target database did not answer (the input allowed it): nothing of it was checked, and the "
        "saga checks it all again once provision has created the target, before anything is copied.",
    )
    tools_version: str = Field(description="Version of the pg_dump/pg_restore the worker will use.")
    source_size_bytes: int = Field(description="Size of the source database.")
    throughput: Throughput | None = Field(default=None, description="Measured when the input asked for it.")
    target_storage_bytes: int | None = Field(default=None, description="As the input gave it.")
    warnings: list[str] = Field(
        default_factory=list,
        description="What does not stop the migration but a person should know, each recorded as a Warning Event.",
    )
    databases: CheckedDatabases | None = Field(
        default=None, description="Which databases the Secrets named, recorded in status.databases for later steps."
    )


class FreezeInput(ApiModel):
    ref: MigrationRef
    driver: DriverSpec


class FenceMark(ApiModel):
    """Where a database's writes stood at a moment ferry chose; a later check compares the present with it.

    The freeze takes one of the source (check_frozen compares), verify one of the target
    before traffic moves to it (check_unwritten compares before traffic goes back).
    """

    writes: int = Field(description="Rows inserted, updated or deleted in user tables and large objects so far.")
    stats_reset: str | None = Field(
        default=None, description="When the database's and the server's statistics were last reset."
    )
    catalog: str = Field(description="Fingerprint of the user relations' storage and of the schema.")
    sequences: str | None = Field(
        default=None, description="Fingerprint of every sequence's last value (None: not recorded, not compared)."
    )
    sequences_next: str | None = Field(
        default=None,
        description="Fingerprint of where every sequence stands, the value a sequence that handed out none since it "
        "was set (setval(..., false), ALTER SEQUENCE RESTART) hands out next included, which `sequences` reads as "
        "unused (None: taken by an older worker, not compared).",
    )


class FreezeResult(ApiModel):
    previous_setting: str = Field(description="The source's write setting before the freeze, restored by the undo.")
    sessions_ended: int = 0
    fence: FenceMark | None = Field(default=None, description="The write position at the freeze (None before 0.2).")
    revoked_connect: list[str] = Field(
        default_factory=list, description="Roles (or PUBLIC) whose CONNECT on the source the freeze revoked."
    )
    can_still_connect: list[str] = Field(
        default_factory=list,
        description="Roles the fence cannot keep out (superusers, members of ferry's role); check_frozen watches them.",
    )


class UndoFreezeInput(ApiModel):
    ref: MigrationRef
    driver: DriverSpec
    previous_setting: str | None = Field(
        default=None, description="What the freeze returned; None: the undo reads what the freeze recorded."
    )


class CheckFrozenInput(ApiModel):
    """Before traffic moves (and before the source goes away): has anything been written since the freeze?"""

    ref: MigrationRef
    driver: DriverSpec
    fence: FenceMark
    before: str = Field(description="The step about to run, for messages.")


class CheckFrozenResult(ApiModel):
    sessions_ended: int = Field(default=0, description="Sessions found in the frozen source and ended.")
    fence: FenceMark | None = Field(default=None, description="The source as the check found it: equal to the mark.")


class SnapshotInput(ApiModel):
    ref: MigrationRef
    driver: DriverSpec
    snapshot: SnapshotSpec
    key: str = Field(description="Object key, deterministic per Migration, so a retry replaces, never duplicates.")
    restore: bool = Field(
        default=False,
        description="Also restore the dump into the target while it is uploaded (mode Snapshot); the restore commits "
        "only once the whole object is stored.",
    )


class SnapshotStream(ApiModel):
    """One object of a snapshot taken in parallel streams: the rows of some of the source's tables."""

    key: str = Field(description="Its key, beside the snapshot's (see `stream_key`).")
    sha256: str
    size_bytes: int
    tables: int = Field(description="How many tables' rows it holds.")


class SnapshotResult(ApiModel):
    bucket: str
    key: str
    sha256: str
    size_bytes: int
    restored: bool = Field(
        default=False, description="The target holds this snapshot, restored while it was uploaded (committed)."
    )
    streams: list[SnapshotStream] = Field(
        default_factory=list,
        description="When the snapshot was taken in parallel streams: the objects holding the rows of the largest "
        "tables, whose rows the object at `key` (schema, sequences, large objects, the other tables) then lacks. "
        "Empty for a snapshot in one object.",
    )

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def total_bytes(self) -> int:
        """The size of all its objects."""
        return self.size_bytes + sum(stream.size_bytes for stream in self.streams)

    def stream(self, index: int) -> SnapshotResult:
        """Its stream `index` as an object of its own, to be read back and checked like one."""
        found = self.streams[index]
        return SnapshotResult(bucket=self.bucket, key=found.key, sha256=found.sha256, size_bytes=found.size_bytes)


class UndoSnapshotInput(ApiModel):
    ref: MigrationRef
    snapshot: SnapshotSpec
    artifact: SnapshotResult | None = Field(
        default=None, description="What the snapshot returned; None when it did not finish (then `key` is used)."
    )
    key: str = Field(default="", description="The snapshot's deterministic key, for a snapshot that did not finish.")
    keep: bool = Field(description="Retention says to keep the object; the undo then leaves it.")
    driver: DriverSpec | None = Field(
        default=None,
        description="The data driver's spec, when the snapshot step also restored into the target: its undo (the "
        "driver's undo_snapshot) then empties the target too.",
    )


class UndoSnapshotResult(ApiModel):
    deleted: bool = Field(description="Whether the object (or any unfinished upload of it) is gone now.")


class MigrateInput(ApiModel):
    ref: MigrationRef
    driver: DriverSpec
    snapshot: SnapshotSpec
    artifact: SnapshotResult


class MigrateResult(ApiModel):
    tables: int = 0
    bytes_restored: int = 0
    during_snapshot: bool = Field(
        default=False, description="The snapshot step restored the target while uploading; nothing was read back."
    )


class UndoMigrateInput(ApiModel):
    """Removes what migrate restored into the target, recognized by ferry's marker; nothing else."""

    ref: MigrationRef
    driver: DriverSpec


class UndoMigrateResult(ApiModel):
    removed: bool = Field(description="Whether the target held this Migration's restore, now removed.")


class TableAhead(ApiModel):
    """A table found equal on both sides before the freeze, and where each side's writes to it stood then."""

    table: str
    rows: int
    checksum: str
    source_writes: int = Field(description="Rows inserted, updated or deleted in the source's table so far.")
    source_file: int = Field(description="The source table's relfilenode (TRUNCATE and rewrites change it).")
    target_writes: int
    target_file: int
    source_columns: str | None = Field(
        default=None,
        description="Digest of the source table's columns as its catalog holds them (names, types, defaults, the "
        "value a fast default gives the rows written before it): DDL moves it where no row or file does. None in a "
        "record made before it was kept: verify then reads the table again.",
    )
    target_columns: str | None = None


class AheadComparison(ApiModel):
    """Mode Online: the tables replicate compared before the freeze, so verify need not read them again.

    verify compares again, writes stopped, every table written on either side since (its
    counters or storage moved), and every table not in here (see activities/postgres/ahead.py).
    """

    tables: list[TableAhead] = Field(default_factory=list)
    source_stats_reset: str = Field(description="When the source's statistics were last reset (database, server).")
    target_stats_reset: str


class VerifyInput(ApiModel):
    ref: MigrationRef
    driver: DriverSpec
    ahead: AheadComparison | None = Field(
        default=None, description="Online: what replicate compared before the freeze (None: compare everything)."
    )


class TableCheck(ApiModel):
    table: str
    source_rows: int
    target_rows: int
    source_checksum: str
    target_checksum: str
    ahead: bool = Field(
        default=False, description="Compared before the freeze, and neither side written since (mode Online)."
    )

    @property
    def equal(self) -> bool:
        return self.source_rows == self.target_rows and self.source_checksum == self.target_checksum


class VerifyResult(ApiModel):
    tables: list[TableCheck] = Field(
        description="The tables, populated materialized views and (as `large objects`) the large objects compared: "
        "every one that differs, and the others up to a bound (tables_compared counts them all)."
    )
    tables_compared: int | None = Field(
        default=None, description="How many were compared, listed or not (None: every one is listed)."
    )
    objects: int = Field(default=0, description="Schema objects and sequences compared besides the rows.")
    target_fence: FenceMark | None = Field(
        default=None,
        description="Where the target's writes stood after verify, before traffic moves to it (None: not taken).",
    )


class CheckUnwrittenInput(ApiModel):
    """Before traffic goes back to the source: has the target been written since verify marked it?"""

    ref: MigrationRef
    driver: DriverSpec
    fence: FenceMark | None = Field(
        default=None, description="Verify's mark of the target; None: read the mark verify recorded in the target."
    )
    source_only: bool = Field(
        default=False,
        description="Only that the source answers as the database the precheck recorded: the check before an undo "
        "that empties the target, which compares the target with verify's mark itself. A target that does not answer "
        "then (often why the rollback runs) does not stop the way back to the source.",
    )
    service: str | None = Field(
        default=None,
        description="The stable Service, given when this run never called switch-traffic's activity: if it carries no "
        "record of a switch by this Migration and does not select the target's Pods, no traffic moved, and the target "
        "is not asked (it may not answer).",
    )
    target_stateful_set: str | None = Field(default=None, description="spec.target.statefulSet, with `service`.")


class CheckUnwrittenResult(ApiModel):
    compared: bool = Field(description="False when the target holds no mark of this Migration: nothing to compare.")
    fence: FenceMark | None = Field(default=None, description="The target as the check found it: equal to the mark.")
    no_traffic_moved: bool = Field(
        default=False, description="The stable Service shows that this Migration never moved the traffic (`service`)."
    )


class ReplicateInput(ApiModel):
    """Mode Online: copy the schema, then replicate the source into the target until the lag is small."""

    ref: MigrationRef
    driver: DriverSpec


class ReplicateResult(ApiModel):
    publication: str = Field(description="The publication on the source.")
    subscription: str = Field(description="The subscription on the target; its replication slot has the same name.")
    tables: int = Field(description="Tables the subscription copies.")
    tables_synced: int = Field(description="Tables whose initial copy had finished (all of them, on success).")
    lag_bytes: int = Field(description="Bytes of the source's WAL the target had not yet confirmed, at the end.")
    replica_identity_full: list[str] = Field(
        default_factory=list, description="Tables given REPLICA IDENTITY FULL for the replication (restored after)."
    )
    schema_copied: bool = Field(
        default=True, description="False when a retry found its subscription and went on with it."
    )
    ahead: AheadComparison | None = Field(
        default=None, description="The tables compared before the freeze (None: none, verify compares every table)."
    )


class EndReplicationInput(ApiModel):
    """Ends this Migration's replication: subscription, slots, publication, replica identities; the undo of replicate
    also empties the target of the schema it copied."""

    ref: MigrationRef
    driver: DriverSpec


class EndReplicationResult(ApiModel):
    ended: bool = Field(description="Whether anything of this Migration's replication was there, now removed.")
    emptied: bool = Field(default=False, description="Whether the target held this Migration's copy, now removed.")


class WatchReplicationInput(ApiModel):
    """Mode Online, while the saga waits before the freeze: watch the replication until cancelled, and fail with
    ReplicationBroken once it is broken (the source's slot would keep its WAL until its disk fills)."""

    ref: MigrationRef
    driver: DriverSpec


class CatchUpInput(ApiModel):
    """Mode Online, writes stopped: wait until the target has every change, copy the sequences, end the replication."""

    ref: MigrationRef
    driver: DriverSpec


class CatchUpResult(ApiModel):
    frozen_lsn: str = Field(description="The source's WAL position read after the freeze.")
    applied_lsn: str | None = Field(
        default=None,
        description="What the target had confirmed when catch-up stopped waiting; None when a retry found the "
        "replication already ended by an earlier attempt.",
    )
    sequences: int = Field(description="Sequences set on the target from the source's values.")
    waited_seconds: float = Field(default=0.0, description="How long the target took to apply the last changes.")


class UndoMigrationInput(ApiModel):
    """Undo, in reverse, every step of a Migration whose run ended Succeeded, from what the steps recorded."""

    ref: MigrationRef
    generation: Generation
    spec: MigrationSpec
    reason: str
    status: MigrationStatus | None = Field(default=None, description="The Migration's status when the undo began.")


class ControlOutcome(ApiModel):
    """What the saga did with a control sent as an update."""

    control: str
    message: str = Field(description="What the saga did, in a sentence, e.g. 'pausing before freeze'.")


class DeleteSnapshotInput(ApiModel):
    """Retention cleanup, run by the workflow after success or by the watcher on deletion."""

    ref: MigrationRef
    snapshot: SnapshotSpec
    artifact: SnapshotResult


def snapshot_key(ref: MigrationRef, spec: SnapshotSpec) -> str:
    """The object key of a Migration's snapshot: the same for every attempt."""
    return f"{spec.prefix}{ref.namespace}/{ref.name}/{ref.uid}/snapshot.dump"


def precheck_key(ref: MigrationRef, spec: SnapshotSpec) -> str:
    """The key of the object the precheck writes to try the bucket, and deletes at once: beside the snapshot's, the
    same for every attempt, so that the snapshot's undo and its retention cleanup delete it too (a worker killed
    between the write and the delete leaves it)."""
    return f"{spec.prefix}{ref.namespace}/{ref.name}/{ref.uid}/precheck"


def stream_prefix(key: str) -> str:
    """What the keys of the parallel streams of the snapshot at `key` begin with, and no other key of any snapshot."""
    return f"{key.removesuffix('.dump')}.tables-"


def stream_key(key: str, index: int) -> str:
    """The key of stream `index` (from 1) of the snapshot at `key`: beside it, the same for every attempt."""
    return f"{stream_prefix(key)}{index}.dump"


def keep_after_success(policy: AfterSuccess) -> bool:
    return policy is not AfterSuccess.DELETE


def keep_after_rollback(policy: AfterRollback) -> bool:
    return policy is AfterRollback.KEEP
