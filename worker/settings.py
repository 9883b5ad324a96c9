"""The worker's settings: one typed object, filled from flags and FERRY_ variables (ferry/configuration)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, SecretStr
from pydantic.dataclasses import dataclass

from activities.settings import DataActivitySettings, KubeActivitySettings
from ferry.components import ComponentSettings
from ferry.configuration.knobs import SETTINGS, Group, Knob

CLAIM_KEY_LENGTH = 32


def _long_enough(key: SecretStr | None) -> SecretStr | None:
    if key is not None and len(key.get_secret_value()) < CLAIM_KEY_LENGTH:
        raise ValueError(
            f"the claim key must be at least {CLAIM_KEY_LENGTH} characters, e.g. the output of `openssl rand -hex 32`"
        )
    return key


@dataclass(frozen=True, config=SETTINGS)
class WorkerSettings(ComponentSettings):
    """Everything `ferry worker` needs; each field is a flag and a FERRY_ variable."""

    runs: Literal["everything", "workflows", "activities"] = "everything"
    """What this process polls for: `everything` (one process does it all); `workflows`, the saga's workflow tasks
    and their status writes, with no step or undo; or `activities`, the steps and undos and nothing else. Split, a
    status write never waits for the CPU behind data steps (docs/architecture.md, "Scaling the worker")."""
    max_concurrent_activities: Annotated[int, Field(ge=1, le=1000)] = 20
    """Activities this worker runs at once; each long one (a snapshot, a restore) holds a thread."""
    max_concurrent_status_writes: Annotated[int, Field(ge=1, le=1000)] = 50
    """Status writes (local activities, each an apply of a Migration's status, after a read when needed) this worker
    runs at once, in threads of their own: they never wait behind the activities above."""
    max_concurrent_watches: Annotated[int, Field(ge=1, le=1000)] = 100
    """Watches this worker runs at once, in slots and threads of their own on the task queue `<task-queue>-watches`:
    mode Online's watch of the replication runs beside its Migration's wait before the freeze (awaiting approval,
    paused, soaking), for as long as the wait, with a thread and two mostly idle database sessions. A waiting
    Migration holds one of these, never one of the activity slots above. Not used with `--runs workflows`."""
    max_concurrent_workflow_tasks: Annotated[int, Field(ge=2, le=10000)] = 100
    """Workflow tasks this worker runs at once (each a few milliseconds of the saga's code, replaying what it has not
    cached); at least 2, as the SDK requires."""
    graceful_shutdown: Annotated[float, Field(ge=0, le=3600)] = 30.0
    """Seconds running activities may finish after SIGTERM before they are cancelled, at most an hour. Keep it under
    the pod's terminationGracePeriodSeconds (60 in deploy/manager/worker.yaml and the chart's
    worker.terminationGracePeriodSeconds), with time to spare for the cancelled activities to stop their tools and
    report: the kubelet kills the worker at the end of that period, whatever this says."""
    claim_key: Annotated[SecretStr | None, AfterValidator(_long_enough), Knob(secret=True)] = None
    """A secret of at least 32 characters that every worker process of this deployment shares (pass it from a
    Secret). The saga signs the claim each activity carries with it, and the gate refuses a call whose claim is not
    signed with it: without it, anyone who can run a workflow in the Temporal namespace could schedule ferry's
    activities with a claim of their own making (worker/gate.py). Unset: claims are not signed, and a warning says so
    at startup."""
    kube_activities: Annotated[KubeActivitySettings, Group("Kubernetes")] = Field(default_factory=KubeActivitySettings)
    data_activities: Annotated[DataActivitySettings, Group("PostgreSQL and snapshots")] = Field(
        default_factory=DataActivitySettings
    )
