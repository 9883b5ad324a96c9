"""The gate every activity passes: no side effect unless a live Migration asked for exactly this run.

The worker holds cluster-wide powers and Temporal accepts any workflow start from whoever
reaches its frontend, so a workflow's input proves nothing. ferry's workflows attach a
claim (ferry/api/integrity.py) to each activity they schedule; before any activity runs,
this gate reads the Migration the claim names and lets the activity through only when

- the claim is signed with the workers' claim key (--claim-key) for this run and this
  activity: the headers of an activity are whatever its scheduler says, and anyone who can
  reach Temporal can run a workflow of their own, on a worker of their own, that schedules
  ferry's activities on ferry's task queue with a claim they made up (only the signature
  is beyond them; without a key, claims go unsigned and this check is off),
- the run is one of that Migration's own (its saga, its undo or its retention cleanup, by ID,
  each ID of its own workflow type),
- the Migration exists with the claim's UID,
- a run of its undo or its retention cleanup acts only once its deletion was asked for
  (the watcher starts them then, and only then),
- the digest of its live spec equals the claim's (the plan it was started with), and
- the Migration has not finished in another run of the same workflow: a closed run reset
  (`temporal workflow reset`), or one started by hand under its ID once it closed, does
  nothing at all, not even a status write (`_finished_by_another_run`).

Otherwise the activity fails at once, non-retryable, before it reads a Secret or changes
anything. Two exceptions keep legitimate runs whole when their Migration goes away under
them (a finalizer removed by hand, a deletion given up at its deadline): if the run had
already passed the gate once (`vouched`), its undos go on, with the check that guards
switch-traffic's undo, so it takes back what it did, and so do its status writes (which
write only to an object with the claim's UID, and report the Migration gone, which makes
the run undo what it started). A run that never found its
Migration acts on nothing. A Migration being deleted without ferry's finalizer (its deletion
came between the workflow's start and the watcher's first write) lets its run take back
what it did, and nothing more. One read of the Migration per activity attempt is the price;
status writes, the most frequent calls, skip it once their run has passed the gate: they
check the UID themselves (their write is conditional on it), and the plan cannot change
under a UID (the API server refuses it). The read is not wasted on them either: its
resourceVersion is what the run's first status write is conditional on
(activities/known_versions.py), instead of a read of its own.

The reads run on the worker's activity threads, one per slot, which the activity itself
takes only after the gate: never on asyncio's default executor, whose few threads
(the CPU count plus 4) made fifty Migrations' first status writes queue behind each
other's reads.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import hmac
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.converter import default as default_converter
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from activities.known_versions import KnownVersions
from ferry.api.integrity import (
    CLAIM_HEADER,
    NOT_BACKED,
    Claim,
    claim_of,
    digest,
    is_undo,
    signature,
    workflow_types,
)
from ferry.api.migration import FINALIZER, FINISHED_PHASES, GROUP, PLURAL, VERSION, MigrationSpec
from ferry.api.saga import DriverOperation, KubeActivity, MigrationRef, undo_workflow_id, workflow_id
from worker.headers import AddsHeaders

log = logging.getLogger("ferry.worker.gate")

VOUCHED_ATTRIBUTE = "backed_by_migration"
"""A workflow whose instance has this attribute true has passed the gate once (see workflows/saga.py)."""

ReadMigration = Callable[[MigrationRef], dict[str, Any] | None]
FINISHED = frozenset(phase.value for phase in FINISHED_PHASES)


def read_migration(api: k8s.ApiClient) -> ReadMigration:
    """One read of the Migration a claim names, as the API server holds it; None when it does not exist."""
    custom = k8s.CustomObjectsApi(api)

    def read(ref: MigrationRef) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, ref.namespace, PLURAL, ref.name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    return read


def refusal(message: str) -> ApplicationError:
    return ApplicationError(
        f"refused: {message}. Nothing was done. Migrations run only through the Migration resource "
        "(kubectl apply); a workflow started by hand, or with an input that is not the Migration's, acts on nothing",
        type=NOT_BACKED,
        non_retryable=True,
    )


# --- the workflow side: a claim on every activity ---------------------------------------------


def _to_payload(claim: Claim) -> Payload:
    return default_converter().payload_converter.to_payload(claim.model_dump(mode="json"))


def _from_headers(headers: Any) -> Claim | None:
    payload: Payload | None = headers.get(CLAIM_HEADER) if headers else None
    if payload is None:
        return None
    try:
        return Claim.model_validate(default_converter().payload_converter.from_payload(payload, dict))
    except (ValidationError, ValueError, TypeError):
        return None


class _Claiming(AddsHeaders):
    def __init__(self, next: WorkflowOutboundInterceptor, claim: list[Claim | None], key: bytes | None) -> None:
        super().__init__(next)
        self._claim = claim
        self._key = key

    def add(self, headers: Mapping[str, Payload], activity: str) -> Mapping[str, Payload]:
        claim = self._claim[0]
        if claim is None:
            return headers
        vouched = bool(getattr(workflow.instance(), VOUCHED_ATTRIBUTE, False))
        claim = claim.model_copy(update={"vouched": vouched})
        if self._key is not None:
            info = workflow.info()
            signed = signature(self._key, claim, info.workflow_id, info.run_id, activity)
            claim = claim.model_copy(update={"signature": signed})
        return {**headers, CLAIM_HEADER: _to_payload(claim)}


class _ClaimingWorkflow(WorkflowInboundInterceptor):
    key: bytes | None = None
    """The workers' claim key (a subclass per worker sets it: see MigrationGate.workflow_interceptor_class)."""

    def __init__(self, next: WorkflowInboundInterceptor) -> None:
        super().__init__(next)
        self._claim: list[Claim | None] = [None]

    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_Claiming(outbound, self._claim, self.key))

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        self._claim[0] = claim_of(input.args[0]) if input.args else None
        return await self.next.execute_workflow(input)


# --- the activity side: the check -------------------------------------------------------------


class _Gate(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, gate: MigrationGate) -> None:
        super().__init__(next)
        self._gate = gate

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        claim = _from_headers(input.headers)
        if claim is None:
            raise self._refuse(info, "the call carries no claim of a Migration (it was not scheduled by ferry's saga)")
        key = self._gate.key
        if key is not None and not hmac.compare_digest(
            claim.signature.encode(),  # bytes: compare_digest raises on a str that is not ASCII
            signature(key, claim, info.workflow_id or "", info.workflow_run_id or "", info.activity_type).encode(),
        ):
            raise self._refuse(
                info,
                "the call's claim is not signed with the workers' claim key (--claim-key): it was not scheduled by "
                "ferry's saga on a worker of this deployment",
            )
        ref = claim.ref
        types = workflow_types(ref).get(info.workflow_id or "")
        if types is None:
            raise self._refuse(info, f"run {info.workflow_id} is not a run of Migration {ref} ({workflow_id(ref)})")
        if info.workflow_type not in types:
            raise self._refuse(
                info,
                f"run {info.workflow_id} is of workflow type {info.workflow_type}, and under that ID Migration {ref} "
                f"runs only {' or '.join(sorted(types))}",
            )
        for argument in input.args:
            called_for = getattr(argument, "ref", None)
            if isinstance(called_for, MigrationRef) and called_for != ref:
                raise self._refuse(info, f"the call is about Migration {called_for}, its run about {ref}")
        run = (info.workflow_run_id or "", claim.digest)
        if info.activity_type == KubeActivity.MIRROR_STATUS and run[0] and self._gate.passed.seen(run):
            return await self.next.execute_activity(input)
        live = await asyncio.get_running_loop().run_in_executor(self._gate.executor, self._gate.read, ref)
        uid = (live or {}).get("metadata", {}).get("uid")
        if uid != ref.uid:
            if claim.vouched and _takes_back(info.activity_type):
                log.info("Migration %s is gone; its run passed the gate before, so %s goes on", ref, info.activity_type)
                return await self.next.execute_activity(input)
            what = "does not exist" if live is None else f"is another object now (uid {uid})"
            raise self._refuse(info, f"Migration {ref} with uid {ref.uid} {what}")
        assert live is not None
        closed = _finished_by_another_run(live, ref, info.workflow_id or "", info.workflow_run_id or "")
        if closed is not None:
            raise self._refuse(info, f"Migration {ref} {closed}")
        if info.workflow_id != workflow_id(ref) and not _being_deleted(live):
            raise self._refuse(
                info,
                f"run {info.workflow_id} undoes or cleans up after Migration {ref}, which ferry does only once the "
                "Migration is being deleted, and it is not",
            )
        if _unheld_deletion(live) and not _takes_back(info.activity_type):
            raise self._refuse(
                info,
                f"Migration {ref} is being deleted and ferry's finalizer does not hold it: no step may run, only undos",
            )
        try:
            spec = MigrationSpec.model_validate(live.get("spec") or {})
        except ValidationError as error:
            raise self._refuse(info, f"Migration {ref}'s spec does not parse ({error.error_count()} errors)") from None
        if digest(spec, claim.scope) != claim.digest:
            raise self._refuse(
                info,
                f"the run's input is not Migration {ref}'s spec (the {claim.scope.value} differs from the live "
                "object's)",
            )
        if run[0]:
            self._gate.passed.add(run)
        if self._gate.versions is not None:
            self._gate.versions.learn(live)
        return await self.next.execute_activity(input)

    @staticmethod
    def _refuse(info: activity.Info, why: str) -> ApplicationError:
        log.warning("refused activity %s of workflow %s: %s", info.activity_type, info.workflow_id, why)
        return refusal(why)


def _finished_by_another_run(live: dict[str, Any], ref: MigrationRef, workflow: str, run: str) -> str | None:
    """Why a run may not act for a Migration whose status shows it finished in another run, if it does: a run of a
    closed workflow reset (`temporal workflow reset`), or one started by hand under its ID once it had closed, or a
    run of the saga once the undo of its deletion finished it. Replaying a finished run's history up to some point,
    such a run would act on a world that has moved on (the traffic switched, the source scaled down, the target
    emptied by a rollback), and its status writes would put a phase over the one the Migration ended in. The status
    is the Migration's record: it stays. The undo itself starts after the saga finished, so a saga's run closes
    nothing for it."""
    status = live.get("status") or {}
    shown = status.get("workflow") or {}
    phase, finisher = status.get("phase"), shown.get("id")
    closing = {workflow} | ({undo_workflow_id(ref)} if workflow == workflow_id(ref) else set())
    if phase not in FINISHED or finisher not in closing or not shown.get("runId") or shown["runId"] == run:
        return None
    return (
        f"finished ({phase}) in run {shown['runId']} of workflow {finisher}, and run {run} of {workflow} came after "
        "it (a reset, or a start by hand): a finished Migration's history is closed, and no later run acts for it. "
        "To migrate again, apply a new Migration"
    )


def _being_deleted(live: dict[str, Any]) -> bool:
    """The watcher starts the undo and the retention cleanup of a Migration (their own workflow IDs) only once its
    deletion was asked for: a run of either while it lives was started by someone else, and must not take back a
    migration that is done and serving."""
    return (live.get("metadata") or {}).get("deletionTimestamp") is not None


def _unheld_deletion(live: dict[str, Any]) -> bool:
    """Deleted while ferry's finalizer is not on it: the watcher starts a run before it adds the finalizer, so a
    deletion between the two (with another finalizer keeping the object) leaves a run nothing holds the Migration
    for. The watcher cancels such a run when it sees the deletion; until then, or should no watcher run, the gate
    keeps it from doing anything but take back what it did."""
    metadata = live.get("metadata") or {}
    return metadata.get("deletionTimestamp") is not None and FINALIZER not in (metadata.get("finalizers") or [])


def _takes_back(activity_type: str) -> bool:
    """Undos, the check before traffic goes back (an undo's guard), and status writes."""
    operation = activity_type.rsplit(".", 1)[-1]
    return (
        is_undo(activity_type)
        or operation == DriverOperation.CHECK_UNWRITTEN
        or activity_type == KubeActivity.MIRROR_STATUS
    )


class PassedRuns:
    """The runs (by run ID and plan digest) that passed the gate lately, newest last, at most `size`."""

    def __init__(self, size: int = 10_000) -> None:
        self._runs: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self._size = size

    def seen(self, run: tuple[str, str]) -> bool:
        if run in self._runs:
            self._runs.move_to_end(run)
            return True
        return False

    def add(self, run: tuple[str, str]) -> None:
        self._runs[run] = None
        self._runs.move_to_end(run)
        while len(self._runs) > self._size:
            self._runs.popitem(last=False)


class MigrationGate(Interceptor):
    """Claims on the workflow side, checks on the activity side: see the module's docstring."""

    def __init__(
        self,
        read: ReadMigration,
        *,
        executor: concurrent.futures.Executor | None = None,
        versions: KnownVersions | None = None,
        key: bytes | None = None,
    ) -> None:
        """`executor` runs the reads: the worker's activity executor, a thread per slot (None: asyncio's default,
        for tests only); `versions`, the worker's status writers' cache, learns each read's version."""
        self.read = read
        self.key = key
        """The claim key: claims are signed with it, and a call whose claim is not is refused. None: unsigned."""
        self._claiming: type[WorkflowInboundInterceptor] = type(
            "_SignedClaimingWorkflow", (_ClaimingWorkflow,), {"key": key}
        )
        self.passed = PassedRuns()
        self.executor = executor
        self.versions = versions

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Gate(next, self)

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return self._claiming
