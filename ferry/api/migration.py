"""The Migration custom resource (ferry.dev/v1alpha1): spec, status and their vocabulary.

These models are the single source of truth for the API: the CRD manifest under
deploy/crd/ is generated from them (`ferry crd`), and a test fails when it drifts.
Field names are snake_case in Python and camelCase in the resource, as Kubernetes
conventions want. Nothing here has side effects, so workflow code may import it.
"""

from __future__ import annotations

import contextlib
import enum
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from ferry.api.quantity import quantity_bytes

GROUP = "ferry.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Migration"
PLURAL = "migrations"
SINGULAR = "migration"
SHORT_NAMES = ("mig",)

FINALIZER = f"{GROUP}/migration"
"""Held on every Migration while ferry still has work to do for it (undo, retention cleanup)."""

SECRET_FINALIZER_PREFIX = f"{GROUP}/in-use-"
"""Start of the finalizer a Migration puts on each Secret it names (`secret_finalizer`), like the pvc-protection of
Kubernetes: a Secret deleted while its Migration may still need it (an undo, the retention cleanup) stays readable
until the Migration is released."""


def secret_finalizer(uid: str) -> str:
    """The finalizer of the Migration with this uid on the Secrets it names: one per Migration, so a Secret two
    Migrations name is held until both are released. 43 characters after the prefix, within the 63 of a name."""
    return f"{SECRET_FINALIZER_PREFIX}{uid}"


SOURCE_FIELD = "spec.source.statefulSet"
"""A field the API server selects Migrations by (the CRD's selectableFields): the Migrations of one source, listed
without reading every Migration of the namespace."""

WORKFLOW_ANNOTATION = f"watcher.{GROUP}/workflow"
"""The ID of the Migration's workflow, written by the watcher once that workflow exists. With status.workflow
(which the saga writes at its first status mirror) it tells any watcher, without asking Temporal, that the
workflow need not be started again, even while no worker runs it yet."""

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MIGRATION_LABEL = f"{GROUP}/migration"
"""Label on every object ferry creates, naming the Migration it was made for: for people, not for ferry."""
MIGRATION_UID_LABEL = f"{GROUP}/migration-uid"
"""Label on every object ferry creates, holding the uid of the Migration that owns it: ferry acts on
an object only when this is its own Migration's uid. A Migration re-created under the same name
has a new uid, so it never takes over (or undoes) what an earlier one made."""
STATEFULSET_LABEL = f"{GROUP}/statefulset"
"""Pod label of a target StatefulSet; the stable Service selects it after switch-traffic."""

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"

MAX_NAME = 63
"""Longest Migration name: ferry puts it in a label on what it creates, and label values hold 63."""
DAY = 24 * 3600
MAX_STEP_SECONDS = 7 * DAY
"""Longest per-attempt timeout of a step; Temporal's timers and Python's timedelta stay far from overflow."""
MAX_APPROVAL_SECONDS = 30 * DAY
"""Longest wait for an approval."""
MAX_SOAK_SECONDS = 7 * DAY
"""Longest soak before scale-down-old."""
MAX_REPLICAS = 100
MAX_PREFIX_BYTES = 512
"""Longest snapshot prefix, in bytes of UTF-8 (S3 counts a key's length in bytes, up to 1024)."""


class ApiModel(BaseModel):
    """Base of every API type: camelCase in the resource, snake_case in Python, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
        frozen=True,
        extra="ignore",
        use_enum_values=False,
    )


def _utc_if_zoneless(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


Time = Annotated[datetime, AfterValidator(_utc_if_zoneless)]
"""A moment as the resource holds it. The saga, the watcher and the API server always write one with its zone; one
without (a status edited by hand, `2026-11-25T10:00:00`) is read as UTC, as Kubernetes writes its times. Refusing it
instead (pydantic's AwareDatetime) would drop the whole top-level status field that holds it (`_salvaged`): all of
status.steps, and with them the success a deletion must not undo, or status.deletion and its deadline. Kept naive, it
raised TypeError at the first comparison with an aware time, and the watcher's pass failed at every try: the
Migration was never let go."""

Name = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)]
SecretName = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
Quantity = Annotated[str, Field(pattern=QUANTITY)]


MAX_QUANTITY = "1Ei"
"""Largest size a Migration may name (2^60 bytes): sizes are written into the status as integers, and the API server
takes no integer of 2^63 or more."""


def _positive_quantity(value: str) -> str:
    number = re.match(r"^[0-9.]+", value)
    if number is None or float(number.group()) <= 0:
        raise ValueError(f"{value!r} is not a positive quantity")
    if quantity_bytes(value) > quantity_bytes(MAX_QUANTITY):
        raise ValueError(f"{value!r} is more than {MAX_QUANTITY}")
    return value


def _prefix_bytes(value: str) -> str:
    if len(value.encode()) > MAX_PREFIX_BYTES:
        raise ValueError(f"the prefix is {len(value.encode())} bytes in UTF-8, more than {MAX_PREFIX_BYTES}")
    return value


PositiveQuantity = Annotated[
    str,
    Field(
        pattern=QUANTITY,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    # The pattern is checked too, but CEL rules run on values that fail it: guard quantity().
                    "rule": (
                        "!isQuantity(self) || (quantity(self).isGreaterThan(quantity('0')) && "
                        f"!quantity(self).isGreaterThan(quantity('{MAX_QUANTITY}')))"
                    ),
                    "message": f"must be a positive quantity of at most {MAX_QUANTITY}, e.g. 20Gi",
                }
            ]
        },
    ),
    AfterValidator(_positive_quantity),
]
"""A Kubernetes quantity greater than zero and at most MAX_QUANTITY, e.g. 20Gi; the API server checks it with CEL's
quantity library."""


class StepName(enum.StrEnum):
    """The saga's steps, of both modes; STEP_ORDER and ONLINE_STEP_ORDER say in which order each mode runs them."""

    PRECHECK = "precheck"
    PROVISION = "provision"
    FREEZE = "freeze"
    SNAPSHOT = "snapshot"
    MIGRATE = "migrate"
    VERIFY = "verify"
    SWITCH_TRAFFIC = "switch-traffic"
    SCALE_DOWN_OLD = "scale-down-old"
    REPLICATE = "replicate"
    CATCH_UP = "catch-up"


STEP_ORDER: tuple[StepName, ...] = (
    StepName.PRECHECK,
    StepName.PROVISION,
    StepName.FREEZE,
    StepName.SNAPSHOT,
    StepName.MIGRATE,
    StepName.VERIFY,
    StepName.SWITCH_TRAFFIC,
    StepName.SCALE_DOWN_OLD,
)
"""The steps of mode Snapshot (the default), in the order they run: the copy is made while writes are stopped."""

ONLINE_STEP_ORDER: tuple[StepName, ...] = (
    StepName.PRECHECK,
    StepName.PROVISION,
    StepName.SNAPSHOT,
    StepName.REPLICATE,
    StepName.FREEZE,
    StepName.CATCH_UP,
    StepName.VERIFY,
    StepName.SWITCH_TRAFFIC,
    StepName.SCALE_DOWN_OLD,
)
"""The steps of mode Online, in the order they run: the copy is made by logical replication while the source takes
writes, and only its last bytes are applied while writes are stopped."""


class Phase(enum.StrEnum):
    """Where a Migration stands, as `kubectl get migrations` shows it."""

    PENDING = "Pending"
    RUNNING = "Running"
    AWAITING_APPROVAL = "AwaitingApproval"
    PAUSED = "Paused"
    ROLLING_BACK = "RollingBack"
    SUCCEEDED = "Succeeded"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"
    ABANDONED = "Abandoned"
    PLANNED = "Planned"
    """A dry run (spec.dryRun) finished its checks and wrote status.plan; nothing was changed."""

    @property
    def finished(self) -> bool:
        return self in FINISHED_PHASES


FINISHED_PHASES = frozenset({Phase.SUCCEEDED, Phase.ROLLED_BACK, Phase.FAILED, Phase.ABANDONED, Phase.PLANNED})


class StepState(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    RETRYING = "Retrying"
    """An attempt failed; the saga waits before the next one (lastError says why)."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    COMPENSATING = "Compensating"
    COMPENSATED = "Compensated"
    COMPENSATION_FAILED = "CompensationFailed"
    INTERRUPTED = "Interrupted"
    """The run stopped while this step or its undo was under way (Running, Retrying, Compensating), and nothing
    recorded how that ended: terminated from outside, or lost by Temporal. What it did may be done, in part or in
    full, or not at all. Written by the watcher alone, with phase Abandoned (watcher/patching.py); undone on
    deletion as a Running step is (it may have had effects)."""


UNDER_WAY = frozenset({StepState.RUNNING, StepState.RETRYING, StepState.COMPENSATING})
"""States a step holds only while a run goes on: a run that stops without a word leaves them for good, and the watcher
marks them INTERRUPTED when it marks the Migration Abandoned."""


class FailurePolicy(enum.StrEnum):
    """What happens when a step fails for good."""

    ROLL_BACK = "RollBack"
    """Undo the completed steps at once."""
    PAUSE = "Pause"
    """Stop in phase Paused and wait for a person to retry the step or roll back."""


class DeadlinePolicy(enum.StrEnum):
    """What happens when the approval deadline passes without an approval."""

    ROLL_BACK = "RollBack"
    PROCEED = "Proceed"


class AfterSuccess(enum.StrEnum):
    """What happens to the snapshot in S3 once the migration succeeded."""

    KEEP = "Keep"
    """Keep it; deleting it is up to the bucket's lifecycle rules."""
    DELETE = "Delete"
    """Delete it as soon as the migration succeeded."""
    DELETE_WITH_MIGRATION = "DeleteWithMigration"
    """Keep it until the Migration resource is deleted."""


class AfterRollback(enum.StrEnum):
    """What happens to the snapshot in S3 after a rollback."""

    KEEP = "Keep"
    DELETE = "Delete"


# --- spec ----------------------------------------------------------------------------------


class SourceSpec(ApiModel):
    """The deployment being moved away from, in the Migration's namespace."""

    stateful_set: Name = Field(description="Name of the source StatefulSet.")
    service: Name = Field(
        description="The stable Service clients use. switch-traffic points its selector at the target's Pods."
    )


class ResourceRequirements(ApiModel):
    """Compute resources for the target's containers, as in a Pod spec."""

    requests: dict[str, Quantity] = Field(default_factory=dict, description="Minimum resources, e.g. cpu: 500m.")
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Maximum resources, e.g. memory: 2Gi.")


class TargetSpec(ApiModel):
    """The new deployment: the source's Pod template with these changes."""

    stateful_set: Annotated[str, Field(max_length=52, pattern=DNS_LABEL)] = Field(
        description="Name of the target StatefulSet (at most 52 characters, so its Pods' labels stay valid). "
        "Its headless Service gets the same name."
    )
    image: str = Field(min_length=1, description="Container image of the target, e.g. postgres:18.")
    container: Name | None = Field(
        default=None,
        description="Which container of the source's Pod template gets the new image (default: the first).",
    )
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS, description="Replicas of the target StatefulSet.")
    storage_class_name: Name | None = Field(
        default=None,
        description="StorageClass of the target's volumes (default: the source's, else the cluster default).",
    )
    storage_size: PositiveQuantity = Field(description="Size of each target volume, greater than zero, e.g. 20Gi.")
    resources: ResourceRequirements | None = Field(
        default=None, description="Resources of the target container (default: the source's)."
    )


class DriverType(enum.StrEnum):
    POSTGRESQL = "postgresql"


class DriverMode(enum.StrEnum):
    """How the data is copied, and so how long the source refuses writes."""

    SNAPSHOT = "Snapshot"
    """Freeze the source, dump it to S3, restore the dump into the target: writes stop for the whole copy."""
    ONLINE = "Online"
    """Copy by logical replication while the source takes writes; writes stop only while the last changes are
    applied and verify compares both sides."""


def step_order(mode: DriverMode) -> tuple[StepName, ...]:
    """The steps a Migration of `mode` runs, in order."""
    return ONLINE_STEP_ORDER if mode is DriverMode.ONLINE else STEP_ORDER


class DriverSpec(ApiModel):
    """How to reach the data: Secrets with keys host, port, username, password and database."""

    type: DriverType = Field(default=DriverType.POSTGRESQL, description="The data driver.")
    source_secret: SecretName = Field(
        description="Secret holding the connection to the source database. Mode Online also reads the optional keys "
        "replicationHost and replicationPort: where the target's server reaches the source (default: host and port)."
    )
    target_secret: SecretName = Field(description="Secret holding the connection to the target database.")
    mode: DriverMode = Field(
        default=DriverMode.SNAPSHOT,
        description="Snapshot: copy while the source is frozen. Online: copy by logical replication while the source "
        "takes writes, then freeze only to apply the last changes and verify (see the README's table of steps).",
    )
    allow_replica_identity_full: bool = Field(
        default=False,
        description="Online: tables without a primary key or replica identity get REPLICA IDENTITY FULL while "
        "replicating (restored afterwards) instead of being refused by the precheck.",
    )
    max_lag: PositiveQuantity = Field(
        default="16Mi",
        description="Online: replicate ends once the target is at most this far behind the source, in bytes of WAL "
        "(a quantity, e.g. 16Mi); catch-up applies the rest while writes are stopped.",
    )
    parallelism: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Snapshot: streams that dump and restore the largest tables' rows at once, each into an object "
        "of its own, with the indexes built by as many sessions (1: one stream, one object). Default: the worker's "
        "--snapshot-streams, which follows its CPU count; at most the worker's --snapshot-max-streams (8 unless its "
        "operator says otherwise). A small source (under the worker's "
        "--snapshot-parallel-min-mib) or one with a single table uses one stream.",
    )


class RetentionSpec(ApiModel):
    """How long the snapshot object is kept."""

    after_success: AfterSuccess = Field(default=AfterSuccess.DELETE_WITH_MIGRATION)
    after_rollback: AfterRollback = Field(default=AfterRollback.DELETE)


class EncryptionType(enum.StrEnum):
    """How S3 encrypts the snapshot at rest (its x-amz-server-side-encryption header)."""

    AES256 = "AES256"
    """With keys S3 manages (SSE-S3)."""
    AWS_KMS = "aws:kms"
    """With a KMS key (SSE-KMS): kmsKeyId, or the bucket's default KMS key."""


# Refused by the API server only (the CRD's schema), not by the models: a workflow input or an object stored before
# these patterns must still parse, so that its run, its undo and its cleanup go on.
REGION = r"^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$"
"""What botocore accepts as a region name (a host label), which it refuses at every S3 client otherwise."""
NO_SPACE = r"^\S+$"
"""No whitespace: a KMS key ID, ARN or alias goes into an HTTP header of every write."""


class ServerSideEncryption(ApiModel):
    """Encryption at rest that ferry asks S3 for on every object it writes."""

    type: EncryptionType = Field(description="AES256 (keys S3 manages) or aws:kms (a KMS key).")
    kms_key_id: Annotated[str, Field(min_length=1, max_length=2048, json_schema_extra={"pattern": NO_SPACE})] | None = (
        Field(
            default=None,
            description="ID, ARN or alias of the KMS key, with type aws:kms only (default: the bucket's KMS key).",
        )
    )


class SnapshotSpec(ApiModel):
    """Where the snapshot goes: an S3 bucket, reached with credentials from a Secret."""

    bucket: Annotated[str, Field(min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$")]
    prefix: Annotated[
        str,
        Field(
            max_length=MAX_PREFIX_BYTES,
            pattern=r"^([^/].*/)?$",
            json_schema_extra={
                "x-kubernetes-validations": [
                    {
                        # S3 keys hold 1024 bytes of UTF-8; with the Migration's names and uid the longest is ~700.
                        "rule": f"size(bytes(self)) <= {MAX_PREFIX_BYTES}",
                        "message": f"must be at most {MAX_PREFIX_BYTES} bytes in UTF-8",
                    }
                ]
            },
        ),
        AfterValidator(_prefix_bytes),
    ] = Field(default="", description="Key prefix, empty or ending in '/'.")
    endpoint: Annotated[str, Field(pattern=r"^https?://")] | None = Field(
        default=None,
        description="S3 endpoint URL (default: AWS for the region); http:// only with allowInsecureEndpoint.",
    )
    # Not refused here but by the API server (a CEL rule) and the precheck: an input or an object from before the
    # rule must still parse, so that its run and its cleanup go on.
    allow_insecure_endpoint: bool = Field(
        default=False,
        description="Allow an http:// endpoint: the snapshot and the S3 credentials then cross the network "
        "unencrypted. Only for a network path you trust, e.g. a local test.",
    )
    region: str = Field(
        default="us-east-1",
        min_length=1,
        description="S3 region, a host label: letters, digits and '-', at most 63 characters.",
        json_schema_extra={"pattern": REGION},
    )
    credentials_secret: SecretName = Field(description="Secret with keys accessKeyId and secretAccessKey.")
    server_side_encryption: ServerSideEncryption | None = Field(
        default=None, description="Encryption at rest S3 applies to the snapshot (default: the bucket's)."
    )
    retention: RetentionSpec = Field(default_factory=RetentionSpec)

    @property
    def insecure(self) -> bool:
        """Whether the endpoint is plain http without allowInsecureEndpoint: the precheck refuses it."""
        return self.endpoint is not None and self.endpoint.startswith("http://") and not self.allow_insecure_endpoint


class ApprovalSpec(ApiModel):
    """Whether a person must approve before traffic moves to the target."""

    required: bool = Field(default=False, description="Wait for an approval before switch-traffic.")
    deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_APPROVAL_SECONDS,
        description="How long to wait for the approval, at most 30 days (default: forever).",
    )
    on_deadline: DeadlinePolicy = Field(default=DeadlinePolicy.ROLL_BACK, description="What to do when it passes.")


class StepTimeouts(ApiModel):
    """Seconds each step may take, per attempt: at least 10, at most 7 days (604800)."""

    precheck: int = Field(default=300, ge=10, le=MAX_STEP_SECONDS)
    provision: int = Field(default=900, ge=10, le=MAX_STEP_SECONDS)
    freeze: int = Field(default=120, ge=10, le=MAX_STEP_SECONDS)
    snapshot: int = Field(default=3600, ge=10, le=MAX_STEP_SECONDS)
    migrate: int = Field(default=3600, ge=10, le=MAX_STEP_SECONDS)
    verify: int = Field(default=1800, ge=10, le=MAX_STEP_SECONDS)
    switch_traffic: int = Field(default=300, ge=10, le=MAX_STEP_SECONDS)
    scale_down_old: int = Field(default=600, ge=10, le=MAX_STEP_SECONDS)
    replicate: int = Field(
        default=7200, ge=10, le=MAX_STEP_SECONDS, description="Online: the initial copy of every table, and the lag."
    )
    catch_up: int = Field(
        default=600, ge=10, le=MAX_STEP_SECONDS, description="Online: applying the last changes, writes stopped."
    )

    def for_step(self, step: str) -> int:
        value: int = getattr(self, step.replace("-", "_"))
        return value


IMMUTABLE_SPEC_FIELDS = (
    "source",
    "target",
    "driver",
    "snapshot",
    "approval",
    "failurePolicy",
    "timeouts",
    "soakSeconds",
    "dryRun",
)
"""The plan: fixed at creation (a CEL rule enforces it). Only control fields may change."""


class MigrationSpec(ApiModel):
    """What to move, where to, and how carefully."""

    source: SourceSpec
    target: TargetSpec
    driver: DriverSpec
    snapshot: SnapshotSpec
    approval: ApprovalSpec = Field(default_factory=ApprovalSpec)
    failure_policy: FailurePolicy = Field(default=FailurePolicy.ROLL_BACK)
    timeouts: StepTimeouts = Field(default_factory=StepTimeouts)
    soak_seconds: int = Field(
        default=0,
        ge=0,
        le=MAX_SOAK_SECONDS,
        description="Seconds to watch the target serve traffic before scale-down-old, at most 7 days.",
    )
    dry_run: bool = Field(
        default=False,
        description="true: run only the checks, which change nothing, write status.plan and end in phase Planned.",
    )
    paused: bool = Field(
        default=False, description="Control field: true holds the saga before its next step; false lets it go on."
    )

    def secrets(self) -> dict[str, str]:
        """The Secrets this spec names, each with the field naming it (fixed at creation: see named_secrets)."""
        return named_secrets(self.driver, self.snapshot)


def named_secrets(driver: DriverSpec, snapshot: SnapshotSpec) -> dict[str, str]:
    """The Secrets a Migration names, each with the field that names it first. A spec's driver and snapshot are
    immutable (IMMUTABLE_SPEC_FIELDS), so these never change under a Migration."""
    named = (
        ("spec.driver.sourceSecret", driver.source_secret),
        ("spec.driver.targetSecret", driver.target_secret),
        ("spec.snapshot.credentialsSecret", snapshot.credentials_secret),
    )
    found: dict[str, str] = {}
    for field, name in named:
        found.setdefault(name, field)
    return found


# --- status --------------------------------------------------------------------------------


class StepStatus(ApiModel):
    name: str = Field(description="The step, e.g. provision (see the README's table of steps).")
    state: StepState = StepState.PENDING
    attempts: int = Field(default=0, ge=0, description="How many times the saga started this step.")
    undo_attempts: int = Field(default=0, ge=0, description="How many times the saga started this step's undo.")
    started_at: Time | None = None
    finished_at: Time | None = None
    last_error: str | None = Field(default=None, description="Why the last attempt (or undo attempt) failed.")


class EventType(enum.StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """A Kubernetes condition (type, status, reason, message, observedGeneration, lastTransitionTime)."""

    type: str
    status: ConditionStatus
    reason: Annotated[str, Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")]
    message: str = ""
    observed_generation: int | None = Field(default=None, ge=0)
    last_transition_time: Time


HISTORY_GONE = "HistoryGone"
"""The reason of the conditions of a Migration the watcher marked Abandoned because Temporal has no record of its run,
which had not finished (its history deleted, or Temporal rebuilt empty), and whose steps' records say something may be
left to undo: nothing runs it any more, and its deletion undoes what the steps recorded (watcher/deletion.py), as it
would have without the mark. A Migration marked Abandoned for another reason (terminated from outside) undoes nothing
more, not even when deleted."""


class WorkflowRef(ApiModel):
    """The Temporal run behind this Migration."""

    namespace: str
    id: str
    run_id: str | None = None
    url: str | None = Field(default=None, description="The run in the Temporal Web UI.")


class WriteDowntimeStatus(ApiModel):
    """The write-downtime window: from the start of the step that stops the source's writes until writes flow again,
    to the target (traffic moved) or to the source (the freeze undone)."""

    started_at: Time
    ended_at: Time | None = None
    seconds: float | None = Field(default=None, ge=0, description="Its length, once it has ended.")
    ended_by: str | None = Field(default=None, description="How writes flowed again: traffic moved, or freeze undone.")


class SnapshotStatus(ApiModel):
    location: str = Field(description="s3://bucket/key of the snapshot object, for people.")
    bucket: str | None = Field(default=None, description="Bucket of the snapshot object.")
    key: str | None = Field(default=None, description="Key of the snapshot object.")
    sha256: str
    size_bytes: int = Field(
        ge=0, description="Its size; for a snapshot in parallel streams, with the objects beside it (`.tables-N.dump`)."
    )
    deleted: bool = Field(default=False, description="Whether retention has deleted the object.")


CONTROL_PREFIX = f"{GROUP}/"
"""Annotations `ferry.dev/<control>` are kubectl controls, e.g. `ferry.dev/approve=alice`; the controls are
ferry.api.saga.Signal's values."""


class ControlsStatus(ApiModel):
    """Which kubectl controls (annotations) ferry has already acted on, so none acts twice.

    Written by the watcher only; the saga's status mirror keeps it as it is.
    """

    acknowledged: dict[str, str] = Field(
        default_factory=dict, description="Annotation name to the value ferry acted on (or rejected)."
    )
    taken_off: dict[str, int] = Field(
        default_factory=dict,
        description=(
            "Annotation name to how often a control ferry had acted on was taken off: given again, even with the same "
            "value, it is a new control."
        ),
    )
    message: str | None = Field(default=None, description="What happened to the last control given.")


class DeletionStatus(ApiModel):
    """Why a deleted Migration is still there: ferry holds its finalizer until the undo or cleanup ends.

    Written by the watcher only; the saga's status mirror keeps it as it is.
    """

    message: str
    waiting_since: Time
    deadline: Time = Field(description="When ferry stops waiting and releases the finalizer anyway.")

    @property
    def success_shown_first(self) -> bool:
        """Whether the watcher recorded, while the run closed after its success, that the status showed that success
        before the deletion was asked for (SUCCESS_SHOWN_FIRST): the fact `Migration.success_timing` reads first."""
        return SUCCESS_SHOWN_FIRST in self.message


SUCCESS_SHOWN_FIRST = "its status showed that success before the deletion was asked for"
"""Part of status.deletion's message while a run that succeeded closes, when the status the watcher read showed the
success written before the deletion (`Migration.success_timing`). Its last writes (the retention cleanup's, the one
saying Succeeded) come later, and then the saga's entry in managedFields no longer tells; this record still does,
once the run has closed."""


class DatabaseIdentity(ApiModel):
    """Which database a Secret named when the precheck checked it.

    The server's system identifier (pg_control_system(): set when the cluster was made,
    and kept by a physical replica, so a failover keeps it) and the database's oid there.
    Every later session of the Migration compares the database it reached with this, so a
    Secret edited since to name another database is refused, never acted on.
    """

    system_identifier: str = Field(pattern=r"^[0-9]{1,20}$", description="The server's system identifier.")
    database_oid: int = Field(ge=0, le=4294967295, description="The database's oid on that server.")
    database: str = Field(max_length=63, description="The database's name then, for messages.")


class CheckedDatabases(ApiModel):
    """The databases the precheck checked, as later steps must find them.

    Written by the precheck only (activities/postgres/identity.py); the saga's status mirror keeps it as it is.
    """

    source: DatabaseIdentity | None = None
    target: DatabaseIdentity | None = None


WATCHER_STATUS_FIELDS = ("controls", "deletion")
"""Status fields the watcher owns."""

ACTIVITY_STATUS_FIELDS = ("progress", "databases")
"""Status fields the data activities own (activities/progress_status.py, activities/postgres/identity.py);
everything else in the status is the saga's."""


class Throughput(ApiModel):
    """Rates the precheck measured with small real transfers, in bytes per second."""

    source_read: float = Field(ge=0, description="Rows read from the source (COPY out).")
    target_write: float = Field(ge=0, description="Rows written into the target (COPY in, into a temporary table).")
    upload: float = Field(ge=0, description="An object written to the snapshot bucket (then deleted).")
    sample_bytes: int = Field(ge=0, description="How many bytes each measurement moved.")


class Estimates(ApiModel):
    """Seconds each size-dependent step should take at the measured rates; rough, and only as good as the sample."""

    snapshot_seconds: float = Field(ge=0)
    migrate_seconds: float = Field(ge=0, description="0 in mode Online, which has no migrate step.")
    verify_seconds: float = Field(ge=0)
    replicate_seconds: float | None = Field(
        default=None, ge=0, description="Online: the initial copy of every table (None in mode Snapshot)."
    )
    write_downtime_seconds: float = Field(
        ge=0,
        description="From freeze until traffic has moved. Snapshot: snapshot, migrate and verify, plus a few seconds. "
        "Online: verify, plus a few seconds for catch-up.",
    )
    total_seconds: float = Field(
        ge=0,
        description="The whole run without waits for people or soak, and without the target's start-up time "
        "(provision), which the cluster decides.",
    )


class PlanStatus(ApiModel):
    """What the run will do and what to expect, written once the checks have passed."""

    steps: list[str] = Field(description="The steps that will run, in order.")
    source_version: str
    target_version: str | None = Field(
        default=None,
        description="Unset while the target database is to be checked once provision has created it (it did not "
        "answer before).",
    )
    tools_version: str = Field(description="Version of the pg_dump/pg_restore the worker will use.")
    source_size_bytes: int = Field(ge=0)
    target_storage_bytes: int | None = Field(default=None, ge=0, description="spec.target.storageSize, in bytes.")
    throughput: Throughput | None = None
    estimates: Estimates | None = None


class ReplicationStatus(ApiModel):
    """Mode Online: the logical replication from source to target, as replicate and catch-up last saw it."""

    publication: str = Field(description="The publication on the source (named after the Migration's uid).")
    subscription: str = Field(description="The subscription on the target, and the replication slot on the source.")
    tables: int = Field(ge=0, description="Tables the subscription copies.")
    tables_synced: int = Field(ge=0, description="Tables whose initial copy had finished when replicate ended.")
    lag_bytes: int = Field(
        ge=0, description="Bytes of the source's WAL the target had not applied when replicate ended."
    )
    replica_identity_full: list[str] = Field(
        default_factory=list, description="Tables given REPLICA IDENTITY FULL while replicating (spec.driver)."
    )
    frozen_lsn: str | None = Field(
        default=None, description="The source's WAL position after the freeze: catch-up waited until the target had it."
    )
    applied_lsn: str | None = Field(default=None, description="Where the target had applied to when catch-up ended.")
    sequences: int | None = Field(default=None, ge=0, description="Sequences catch-up set from the source's values.")
    ended: bool = Field(
        default=False, description="Whether the subscription, the slot and the publication are gone (catch-up, undo)."
    )


class ProgressStatus(ApiModel):
    """How far the running data step (snapshot, migrate, verify) is, written by its activity every few seconds.

    Written by that activity only (field manager ferry-progress), and removed when the activity ends, whether it
    succeeded, failed or was cancelled; the saga's status mirror keeps it as it is.
    """

    step: str = Field(description="The step this is about, e.g. migrate.")
    attempt: int | None = Field(default=None, ge=1, description="The saga's attempt of that step (status.steps).")
    bytes_done: int | None = Field(default=None, ge=0, description="Bytes dumped (snapshot) or restored (migrate).")
    bytes_total: int | None = Field(
        default=None, ge=0, description="Bytes there are in all, when known beforehand (migrate: the snapshot's size)."
    )
    rows_done: int | None = Field(default=None, ge=0, description="Rows compared so far (verify, both sides).")
    rows_total: int | None = Field(
        default=None, ge=0, description="Rows there are in all, when known: verify's estimate from the statistics."
    )
    bytes_per_second: float | None = Field(default=None, ge=0, description="Throughput over the last seconds.")
    rows_per_second: float | None = Field(default=None, ge=0, description="Throughput over the last seconds.")
    seconds_left: int | None = Field(
        default=None, ge=0, description="Estimated at the current throughput; only when a total is known."
    )
    updated_at: Time = Field(description="When the activity wrote this.")
    summary: str = Field(description="The same in words, e.g. `migrate: 412 MiB of 1.2 GiB, 38 MiB/s, ~21s left`.")


class MigrationStatus(ApiModel):
    phase: Phase | None = None
    current_step: str | None = Field(
        default=None, description="The step running, or the next one while the saga waits (paused, approval)."
    )
    message: str | None = None
    transitioned_at: Time | None = Field(
        default=None,
        description="When the saga made the transition this status shows, by the workflow's clock.",
    )
    steps: list[StepStatus] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = Field(default=None, ge=0)
    workflow: WorkflowRef | None = None
    snapshot: SnapshotStatus | None = None
    approved_by: str | None = None
    plan: PlanStatus | None = None
    write_downtime: WriteDowntimeStatus | None = None
    replication: ReplicationStatus | None = None
    controls: ControlsStatus | None = None
    deletion: DeletionStatus | None = None
    progress: ProgressStatus | None = None
    databases: CheckedDatabases | None = None

    @property
    def every_step_succeeded(self) -> bool:
        """Whether every step of the run shows Succeeded: the migration was done, whatever the phase says (the saga
        ignores a cancel from then on; its retention cleanup and the write saying Succeeded come after)."""
        return bool(self.steps) and all(step.state is StepState.SUCCEEDED for step in self.steps)

    @property
    def shows_success(self) -> bool:
        """Whether this status shows the run's success: phase Succeeded, or every step Succeeded and no rollback."""
        return self.phase is Phase.SUCCEEDED or (self.every_step_succeeded and self.phase is not Phase.ROLLING_BACK)

    @property
    def succeeded_at(self) -> datetime | None:
        """When the run succeeded, by the saga's clock (Temporal's, workflow.now()): when its last step finished, as
        the steps show every one Succeeded. From then on the saga ignores a cancel and undoes nothing (Stage.FINISHED
        in workflows/controls.py); its retention cleanup (afterSuccess: Delete) and the write saying Succeeded
        (transitionedAt) come after, seconds later or more. Without the steps' times, the Succeeded transition's;
        None when the status shows no success."""
        finished = [step.finished_at for step in self.steps]
        if self.every_step_succeeded and all(moment is not None for moment in finished):
            return max(moment for moment in finished if moment is not None)
        if self.phase is Phase.SUCCEEDED:
            return self.transitioned_at
        return None

    @property
    def history_gone(self) -> bool:
        """Whether the watcher marked this Migration Abandoned because Temporal lost its unfinished run (HISTORY_GONE):
        its deletion still undoes what its steps recorded."""
        return self.phase is Phase.ABANDONED and any(
            condition.type == "Succeeded" and condition.reason == HISTORY_GONE for condition in self.conditions
        )


# --- the object ----------------------------------------------------------------------------


_Part = TypeVar("_Part", bound=ApiModel)

SAGA_FIELD_MANAGER = "ferry-saga"
"""Field manager of the saga's status writes (server-side apply, activities/status.py), as `kubectl get -o yaml
--show-managed-fields` shows it. The watcher's (ferry-watcher) and the data activities' (ferry-progress,
ferry-precheck) are others, each with an entry of its own."""


class ManagedFieldsEntry(ApiModel):
    """One entry of metadata.managedFields, as far as ferry reads it: who wrote, through which subresource, and when.
    The fields it owns (fieldsV1, most of an object's metadata) are not kept."""

    manager: str = ""
    subresource: str = ""
    time: Time | None = None
    """Set by the API server, by its own clock (whole seconds), whenever this manager adds, changes or removes a field
    it owns; not when another manager takes one over, nor when a write changes nothing."""


def _read_entries(entries: tuple[ManagedFieldsEntry, ...]) -> tuple[ManagedFieldsEntry, ...]:
    return tuple(entry for entry in entries if entry.subresource == "status" and entry.manager in READ_MANAGERS)


READ_MANAGERS = frozenset({SAGA_FIELD_MANAGER})
"""The field managers whose entries a parsed Migration keeps (of the status subresource): those ferry reads."""


class ObjectMeta(ApiModel):
    """The metadata of an object, as far as ferry reads it."""

    name: str
    namespace: str = ""
    uid: str
    generation: int = 1
    resource_version: str = ""
    creation_timestamp: Time | None = None
    deletion_timestamp: Time | None = None
    """Set once a deletion was asked for; the object stays while it has finalizers."""
    finalizers: list[str] = Field(default_factory=list)
    annotations: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    managed_fields: Annotated[tuple[ManagedFieldsEntry, ...], AfterValidator(_read_entries)] = ()
    """Only the entries ferry reads (those of READ_MANAGERS on the status subresource), without the fields they own:
    each entry kept costs about a kilobyte, and the watcher may hold ten thousand Migrations whole at once (a list
    after a restart, a burst)."""

    def status_written_at(self, manager: str) -> datetime | None:
        """When `manager` last changed the status fields it owns, by the API server's clock (whole seconds); None
        when it owns none, or the object was read without its managedFields."""
        times = [entry.time for entry in self.managed_fields if entry.manager == manager and entry.time is not None]
        return max(times, default=None)


CLOCK_SKEW_ALLOWANCE = timedelta(minutes=2)
"""How far two clocks ferry compares may disagree. A success is dated by the saga's clock (Temporal's: the steps'
finishedAt, transitionedAt, the run's close time), its deletion by the API server's (deletionTimestamp): a success
counts as after the deletion, which undoes it, only when it is more than this later. Not undoing a success is always
safe (the migration is done and consistent); undoing one nobody asked to undo destroys the migrated database. The
watcher also gives another replica's deletion deadline this much more (watcher/deletion.py)."""


class SuccessTiming(enum.Enum):
    """Where a deleted Migration's success stands to its deletion (`Migration.success_timing`)."""

    UNKNOWN = "unknown"
    """No success shown (nor a run's close time given), or no deletion."""
    SHOWN_FIRST = "shown-first"
    """The status showing the success was written before the deletion, by the API server's clock: no clock of
    another machine enters, so this holds whatever Temporal's clock says."""
    BEFORE = "before"
    """The success came before the deletion (within its whole second), by the clocks."""
    WITHIN_ALLOWANCE = "within-allowance"
    """By the clocks the success came after the deletion, but by CLOCK_SKEW_ALLOWANCE or less: taken as before."""
    AFTER = "after"
    """The success came more than CLOCK_SKEW_ALLOWANCE after the deletion was asked for: the deletion undoes it."""

    @property
    def kept(self) -> bool:
        """Whether the deletion keeps the success (it undoes only one AFTER)."""
        return self in (SuccessTiming.SHOWN_FIRST, SuccessTiming.BEFORE, SuccessTiming.WITHIN_ALLOWANCE)


class Migration(ApiModel):
    """A whole Migration object as read from the API server; `parse` reads one whatever its spec says."""

    api_version: Literal["ferry.dev/v1alpha1"] = "ferry.dev/v1alpha1"
    kind: Literal["Migration"] = "Migration"
    metadata: ObjectMeta
    spec: MigrationSpec | None = None
    """None when the spec does not validate (an older CRD may have let it through): `spec_problem` says why."""
    status: MigrationStatus = Field(default_factory=MigrationStatus)
    spec_problem: str | None = Field(default=None, exclude=True)
    """What is wrong with the spec, one `spec.<field>: <message>` per problem, joined by '; '."""
    status_problem: str | None = Field(default=None, exclude=True)
    """What is wrong with the status, if it does not validate; `status` then holds the fields that do (each of its
    top-level fields on its own), so a phase written by a newer ferry does not hide status.deletion's deadline or
    the controls already acknowledged."""

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Migration:
        """Reads an object from the API server. Metadata must validate (a ValidationError says it does not);
        the spec and the status are read on their own, so a bad one is recorded, not raised."""
        metadata = ObjectMeta.model_validate(raw["metadata"])
        spec, spec_problem = _part(MigrationSpec, raw.get("spec") or {}, "spec")
        raw_status = raw.get("status") or {}
        status, status_problem = _part(MigrationStatus, raw_status, "status")
        return cls(
            metadata=metadata,
            spec=spec,
            status=status or _salvaged(raw_status),
            spec_problem=spec_problem,
            status_problem=status_problem,
        )

    @property
    def finished(self) -> bool:
        return self.status.phase is not None and self.status.phase.finished

    @property
    def may_still_undo(self) -> bool:
        """Whether this Migration may yet undo what it did: it has not finished, or it is being deleted and its status
        does not show a success from before the deletion was asked for (a deletion asked for while it ran undoes even
        a run that succeeded meanwhile: watcher/deletion.py). A Migration whose run Temporal lost before it finished
        (`MigrationStatus.history_gone`) is Abandoned, and yet undone when deleted."""
        if not self.finished or self.status.history_gone:
            return True
        return (
            self.metadata.deletion_timestamp is not None
            and self.status.phase is Phase.SUCCEEDED
            and not self.success_timing().kept
        )

    def success_time(self, closed: datetime | None = None) -> datetime | None:
        """When the run succeeded, by the saga's clock: the earliest of its status's `succeeded_at` and `closed`, the
        close time of a run known to have succeeded (a run closes after its success, by the same clock)."""
        known = [moment for moment in (self.status.succeeded_at, closed) if moment is not None]
        return min(known, default=None)

    def success_timing(self, closed: datetime | None = None) -> SuccessTiming:
        """Where this deleted Migration's success stands to its deletion: the one rule by which the watcher undoes a
        success (only AFTER; watcher/deletion.py) and by which `may_still_undo` says it may.

        First the fact no clock of another machine enters: the status shows the success, and the saga's last change
        of its status fields (its entry in managedFields, SAGA_FIELD_MANAGER) is no later than deletionTimestamp
        (the same second counts as before: never undo a migration someone deleted after it finished), or the watcher
        recorded that so while the run closed (SUCCESS_SHOWN_FIRST). The saga may write its fields again after the
        write that showed the success (its retention cleanup's, the write saying Succeeded, a failed write tried
        again): that makes the entry's time later, never earlier, so it errs only toward the comparison below.
        Otherwise the saga's clock against the API server's, with CLOCK_SKEW_ALLOWANCE in favour of keeping it.
        `closed`: the close time of the run, known to have succeeded, when the status may not show it yet."""
        requested = self.metadata.deletion_timestamp
        if requested is None:
            return SuccessTiming.UNKNOWN
        status = self.status
        if status.shows_success:
            recorded = status.deletion is not None and status.deletion.success_shown_first
            written = self.metadata.status_written_at(SAGA_FIELD_MANAGER)
            if recorded or (written is not None and written <= requested):
                return SuccessTiming.SHOWN_FIRST
        succeeded = self.success_time(closed)
        if succeeded is None:
            return SuccessTiming.UNKNOWN
        if succeeded < requested + timedelta(seconds=1):  # deletionTimestamp has whole seconds
            return SuccessTiming.BEFORE
        if succeeded <= requested + CLOCK_SKEW_ALLOWANCE:
            return SuccessTiming.WITHIN_ALLOWANCE
        return SuccessTiming.AFTER

    def created_no_later_than(self, created: datetime | None) -> bool:
        """Whether this Migration was created before `created`, or in the same second: creation times have whole
        seconds, so of two created in one second neither can tell which came first. When either time is unknown (None:
        a Migration no longer there), the answer is yes: the caller then refuses rather than guesses."""
        mine = self.metadata.creation_timestamp
        return created is None or mine is None or mine <= created


def _salvaged(raw: object) -> MigrationStatus:
    """The top-level fields of a status that does not validate as a whole that validate on their own."""
    if not isinstance(raw, Mapping):
        return MigrationStatus()
    kept = {}
    for key, value in raw.items():
        with contextlib.suppress(ValidationError):
            MigrationStatus.model_validate({key: value})
            kept[key] = value
    try:
        return MigrationStatus.model_validate(kept)
    except ValidationError:
        return MigrationStatus()


def _part(model: type[_Part], raw: object, where: str) -> tuple[_Part | None, str | None]:
    try:
        return model.model_validate(raw), None
    except ValidationError as error:
        return None, "; ".join(f"{where}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
