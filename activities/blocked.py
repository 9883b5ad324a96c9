"""Why a StatefulSet ferry made has no Ready Pod yet: what the cluster refused it, and what its Pods wait for.

provision waits until the target StatefulSet is Ready; left at that, a ResourceQuota, a
LimitRange, Pod Security admission or a webhook refusing the target's Pods, or a Pod no
node can take, showed as a step running for its whole timeout, five times, then a
rollback saying only "activity StartToClose timeout". The StatefulSet controller records
each refused create as a `FailedCreate` Event on the StatefulSet; the scheduler and the
kubelet say in the Pod's status what it waits for. Read here, from objects the caller
listed: pure functions, tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

SHOWN = 3
"""At most this many reasons go into one message."""


def refused_creates(events: Iterable[Any], since: datetime) -> list[str]:
    """The messages of the StatefulSet controller's `FailedCreate` Events (a create of a Pod or a claim the API server
    refused) last seen at or after `since`, newest first, each once, but for those of an object the controller has
    created since (its `SuccessfulCreate` for the same Pod or claim, as late or later): a refusal that passed (a quota
    freed, a webhook that timed out once) is not one any more. The controller creates a Pod's claims first, so a
    claim made in the same second as its Pod was refused says nothing of the Pod."""
    refused: list[tuple[datetime, str, str]] = []
    created: dict[str, datetime] = {}
    for event in events:
        seen = _last_seen(event)
        if seen is None or not event.message:
            continue
        message = " ".join(event.message.split())
        if event.reason == "SuccessfulCreate":
            what = _created_object(message)
            created[what] = max(seen, created.get(what, seen))
        elif event.reason == "FailedCreate" and seen >= since:
            refused.append((seen, _created_object(message), message))
    refused.sort(key=lambda item: item[0], reverse=True)
    still = [message for seen, what, message in refused if what not in created or created[what] < seen]
    return list(dict.fromkeys(still))[:SHOWN]


def _created_object(message: str) -> str:
    """What a create Event of the StatefulSet controller is about: `create Pod orders-db-18-0` or `create Claim
    data-orders-db-18-0`, from its message's first three words."""
    return " ".join(message.split()[:3])


def waiting_on(pods: Iterable[Any]) -> list[str]:
    """What each Pod that is not Ready waits for, in words: a node (the scheduler's reason), or a container that
    does not start (its waiting reason: ImagePullBackOff, CrashLoopBackOff, CreateContainerConfigError...)."""
    found: list[str] = []
    for pod in sorted(pods, key=lambda pod: pod.metadata.name):
        status = pod.status
        if status is None:
            continue
        name = pod.metadata.name
        for condition in status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False":
                found.append(f"Pod {name} is not scheduled ({condition.reason}: {_words(condition.message)})")
        for container in [*(status.init_container_statuses or []), *(status.container_statuses or [])]:
            waiting = container.state.waiting if container.state else None
            if waiting is not None and waiting.reason not in (None, "ContainerCreating", "PodInitializing"):
                found.append(
                    f"container {container.name} of Pod {name} waits: {waiting.reason}"
                    + (f" ({_words(waiting.message)})" if waiting.message else "")
                )
    return found[:SHOWN]


def _last_seen(event: Any) -> datetime | None:
    """When an Event last happened: core/v1's lastTimestamp, else its series' or its own eventTime (events.k8s.io)."""
    series = getattr(event, "series", None)
    seen: datetime | None = event.last_timestamp or (series.last_observed_time if series else None) or event.event_time
    return seen


def _words(message: str | None) -> str:
    return " ".join((message or "no message").split())
