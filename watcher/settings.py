"""The watcher's settings: one typed object, filled from flags and FERRY_ variables (ferry/configuration)."""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Annotated, Self

from pydantic import BeforeValidator, Field, model_validator
from pydantic.dataclasses import dataclass

from ferry.components import ComponentSettings
from ferry.configuration.knobs import SETTINGS, Group, Knob


@dataclass(frozen=True, config=SETTINGS)
class LeaseSettings:
    """Leader election between watcher replicas, through a coordination.k8s.io Lease."""

    name: str = "ferry-watcher"
    """Name of the Lease that elects the active watcher."""
    namespace: str = "default"
    """Namespace of that Lease (deploy/ uses the watcher's own namespace)."""
    duration: Annotated[float, Field(gt=0, le=3600)] = 15.0
    """Seconds a leader's claim lasts without renewal; another replica takes over after it (at most an hour). The
    Lease holds whole seconds: a fraction is rounded up, never down to less than the renew deadline."""
    renew_deadline: Annotated[float, Field(gt=0)] = 10.0
    """Seconds a leader keeps trying to renew before it steps down (less than the duration)."""
    retry_period: Annotated[float, Field(gt=0)] = 2.0
    """Seconds between two attempts to acquire or renew (less than the renew deadline)."""
    identity: Annotated[str, Knob(flag="identity")] = dataclasses.field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}"
    )
    """This replica's name in the Lease (default: the host name and the process ID)."""

    @model_validator(mode="after")
    def _timings_in_order(self) -> Self:
        if not self.retry_period < self.renew_deadline < self.duration:
            raise ValueError(
                "leader election needs --lease-retry-period < --lease-renew-deadline < --lease-duration, got "
                f"{self.retry_period} < {self.renew_deadline} < {self.duration}"
            )
        return self


def _comma_separated(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


@dataclass(frozen=True, config=SETTINGS)
class WatcherSettings(ComponentSettings):
    """Everything `ferry watcher` needs; each field is a flag and a FERRY_ variable."""

    namespaces: Annotated[tuple[str, ...], BeforeValidator(_comma_separated)] = ()
    """Namespaces to watch, comma-separated; empty watches all (default: all)."""
    lease: Annotated[LeaseSettings, Group("leader election", prefix="lease-")] = Field(default_factory=LeaseSettings)
    resync_interval: Annotated[float, Field(gt=0, le=86400)] = 30.0
    """Seconds between two resyncs: one query to Temporal for runs terminated or timed out from outside (their
    Migrations become Abandoned). Nothing is relisted: the watch resumes from its resourceVersion. At most a day."""
    lost_runs_interval: Annotated[float, Field(gt=0, le=86400)] = 300.0
    """Seconds between two looks for runs Temporal lost while they ran (`temporal workflow delete`, a Temporal rebuilt
    empty), whose Migrations become Abandoned: that resync's query lists the Running runs of the task queue too (a
    page per thousand), and each unfinished Migration whose run it does not list costs a describe. At most a day."""
    deletion_timeout: Annotated[float, Field(gt=0, le=30 * 86400)] = 1800.0
    """Seconds a deleted Migration waits for its undo or cleanup before ferry releases its finalizer anyway (more than
    0, at most 30 days). A running run is asked to roll back first, whatever this says; a deadline another watcher
    replica set counts 2 minutes more (clocks of two machines may disagree)."""
    concurrency: Annotated[int, Field(ge=1, le=1000)] = 16
    """Migrations handled at once (the events of one Migration are always handled in order)."""
    record_start_after: Annotated[float, Field(gt=0, le=3600)] = 10.0
    """Seconds after starting the workflow of a Migration that held ferry's finalizer already (set as it was
    created, by deploy/admission/finalizer) before the watcher records the start in its annotation, if no status
    names the run by then. The saga's first status write usually does, and then the watcher writes nothing."""
