"""What "done" means for each wait: a StatefulSet Ready or scaled away, Pods gone, traffic moved.

Pure functions of objects read with the client's models (attributes in snake_case),
each returning the `Progress` that `waiting.wait_for` heartbeats.
"""

from __future__ import annotations

from typing import Any

from activities.kube_objects import is_pod_of
from activities.waiting import Progress


def stateful_set_ready(stateful_set: Any, *, all_updated: bool) -> Progress:
    """Ready: the controller saw the latest spec and every desired replica is ready (and updated, if asked)."""
    metadata, status = stateful_set.metadata, stateful_set.status
    desired = stateful_set.spec.replicas if stateful_set.spec.replicas is not None else 1
    ready = (status and status.ready_replicas) or 0
    updated = (status and status.updated_replicas) or 0
    current = (status and status.replicas) or 0
    observed = ((status and status.observed_generation) or 0) >= (metadata.generation or 0)
    done = observed and ready == desired and current == desired and (updated == desired or not all_updated)
    return Progress(
        done=done,
        waiting_for=f"StatefulSet {metadata.namespace}/{metadata.name} Ready",
        counts={"ready": ready, "desired": desired, "updated": updated},
    )


def stateful_set_scaled_away(stateful_set: Any, pods: list[Any]) -> Progress:
    """Scaled to zero: the controller saw replicas 0 and none of its Pods is left, not even a terminating one."""
    metadata, status = stateful_set.metadata, stateful_set.status
    current = (status and status.replicas) or 0
    observed = ((status and status.observed_generation) or 0) >= (metadata.generation or 0)
    return Progress(
        done=observed and current == 0 and not pods,
        waiting_for=f"StatefulSet {metadata.namespace}/{metadata.name} scaled to 0",
        counts={"replicas": current, "pods": len(pods)},
    )


def gone(what: str, remaining: list[Any]) -> Progress:
    """No object is left of those a deletion is waiting for."""
    return Progress(done=not remaining, waiting_for=f"{what} to be gone", counts={"remaining": len(remaining)})


def endpoints_only_of(
    slices: list[Any],
    stateful_set: str,
    *,
    service: str,
    require_ready: bool,
    tolerated: frozenset[str] = frozenset(),
) -> Progress:
    """The Service's EndpointSlices list Pods of `stateful_set` and, besides them, only Pods named in `tolerated`.

    With `require_ready`, at least one such Pod of `stateful_set` must be listed and every
    one ready; without, an empty list also counts (traffic is off everything else).
    `tolerated` are Pods the Service's selector matches and always matched (a restored
    selector's exporter or pooler): waiting for them to go would never end.
    """
    pods: set[str] = set()
    others = also = not_ready = 0
    for endpoint_slice in slices:
        for endpoint in endpoint_slice.endpoints or []:
            ref = endpoint.target_ref
            name = ref.name if ref is not None and ref.kind == "Pod" else None
            if name is not None and name in tolerated and not is_pod_of(stateful_set, name):
                also += 1
                continue
            if name is None or not is_pod_of(stateful_set, name):
                others += 1
                continue
            pods.add(name)
            # An unknown readiness (None) counts as ready, as the EndpointSlice API asks consumers to read it. `serving`
            # too: a Service that publishes not-ready addresses has every endpoint `ready`, and only `serving` says
            # whether its Pod is Ready.
            conditions = endpoint.conditions
            if conditions is not None and (conditions.ready is False or conditions.serving is False):
                not_ready += 1
    done = others == 0 and (not require_ready or (bool(pods) and not_ready == 0))
    besides = " (and Pods its selector always matched)" if tolerated else ""
    return Progress(
        done=done,
        waiting_for=f"Service {service} to list only Pods of StatefulSet {stateful_set}{besides}",
        counts={"pods": len(pods), "not_ready": not_ready, "others": others, "also_selected": also},
        names=tuple(sorted(pods)),
    )
