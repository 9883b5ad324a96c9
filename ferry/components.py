"""What the worker and the watcher both need: where Temporal and Kubernetes are, the task queue, observability.

Each component's settings (worker/settings.py, watcher/settings.py) extend this class, so
the knobs they share are declared once, with one default and one description.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, FilePath
from pydantic.dataclasses import dataclass

from ferry.api.saga import TASK_QUEUE
from ferry.clients import TemporalSettings
from ferry.configuration.knobs import SETTINGS, Group, Knob
from ferry.observability.settings import ObservabilitySettings


@dataclass(frozen=True, config=SETTINGS)
class ComponentSettings:
    """The knobs of both components."""

    temporal: Annotated[TemporalSettings, Group("Temporal", prefix="temporal-")] = Field(
        default_factory=TemporalSettings
    )
    task_queue: Annotated[str, Knob(section="Temporal")] = TASK_QUEUE
    """Task queue of the migration workflows: the watcher starts them on it and the worker polls it, so both
    need the same."""
    kubeconfig: Annotated[FilePath | None, Knob(also_env=("KUBECONFIG",), section="Kubernetes")] = None
    """kubeconfig of the cluster whose Migrations ferry handles (default: in-cluster configuration, else
    ~/.kube/config)."""
    observability: Annotated[ObservabilitySettings, Group("observability")] = Field(
        default_factory=ObservabilitySettings
    )
