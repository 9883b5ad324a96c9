"""The worker's settings: one typed object, filled from flags and FERRY_ variables (ferry/configuration)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from activities.settings import DataActivitySettings, KubeActivitySettings
from ferry.components import ComponentSettings
from ferry.configuration.knobs import SETTINGS, Group


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
    max_concurrent_workflow_tasks: Annotated[int, Field(ge=2, le=10000)] = 100
    """Workflow tasks this worker runs at once (each a few milliseconds of the saga's code, replaying what it has not
    cached); at least 2, as the SDK requires."""
    graceful_shutdown: Annotated[float, Field(ge=0, le=3600)] = 30.0
    """Seconds running activities may finish after SIGTERM before they are cancelled, at most an hour. Keep it under
    the pod's terminationGracePeriodSeconds (60 in deploy/manager/worker.yaml and the chart's
    worker.terminationGracePeriodSeconds), with time to spare for the cancelled activities to stop their tools and
    report: the kubelet kills the worker at the end of that period, whatever this says."""
    kube_activities: Annotated[KubeActivitySettings, Group("Kubernetes")] = Field(default_factory=KubeActivitySettings)
    data_activities: Annotated[DataActivitySettings, Group("PostgreSQL and snapshots")] = Field(
        default_factory=DataActivitySettings
    )
