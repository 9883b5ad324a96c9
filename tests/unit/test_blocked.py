"""Why a target StatefulSet has no Ready Pod, in words: the creates the API server refused, what its Pods wait for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kubernetes import client as k8s

from activities.blocked import refused_creates, waiting_on

MADE = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


def _event(message: str, *, at: datetime, reason: str = "FailedCreate", new_style: bool = False) -> k8s.CoreV1Event:
    involved = k8s.V1ObjectReference(kind="StatefulSet", name="orders-db-18")
    if new_style:  # events.k8s.io: eventTime and a series, no lastTimestamp
        series = k8s.CoreV1EventSeries(count=3, last_observed_time=at)
        return k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(name="e"), involved_object=involved, reason=reason, message=message,
            event_time=at - timedelta(minutes=1), series=series,
        )  # fmt: skip
    return k8s.CoreV1Event(
        metadata=k8s.V1ObjectMeta(name="e"), involved_object=involved, reason=reason, message=message, last_timestamp=at
    )


def test_the_creates_refused_since_the_target_was_made_are_named_newest_first_each_once() -> None:
    quota = 'create Pod orders-db-18-0 in StatefulSet orders-db-18 failed error: pods "orders-db-18-0" is forbidden'
    events = [
        _event("create Pod before ferry made it", at=MADE - timedelta(minutes=5)),
        _event(quota, at=MADE + timedelta(seconds=10)),
        _event(quota, at=MADE + timedelta(seconds=40)),
        _event("create Claim data-orders-db-18-0 failed", at=MADE + timedelta(seconds=50), new_style=True),
        _event("Pod orders-db-18-0 created", at=MADE + timedelta(seconds=1), reason="SuccessfulCreate"),
    ]

    assert refused_creates(events, MADE) == ["create Claim data-orders-db-18-0 failed", quota]


def test_a_refusal_the_controller_got_past_is_not_one_any_more() -> None:
    """A webhook that timed out once, a quota freed by a Pod that was terminating: the create went through after.
    A claim created in the same second as its Pod was refused says nothing of the Pod."""
    pod = "create Pod orders-db-18-0 in StatefulSet orders-db-18"
    events = [
        _event(f"{pod} failed error: webhook timed out", at=MADE + timedelta(seconds=5)),
        _event(f"{pod} successful", at=MADE + timedelta(seconds=9), reason="SuccessfulCreate"),
    ]

    assert refused_creates(events, MADE) == []
    later = [
        _event("create Claim data-orders-db-18-1 Pod orders-db-18-1 in StatefulSet orders-db-18 success",
               at=MADE + timedelta(seconds=20), reason="SuccessfulCreate"),
        _event("create Pod orders-db-18-1 in StatefulSet orders-db-18 failed error: exceeded quota",
               at=MADE + timedelta(seconds=20)),
    ]  # fmt: skip
    assert refused_creates([*events, *later], MADE) == [
        "create Pod orders-db-18-1 in StatefulSet orders-db-18 failed error: exceeded quota"
    ]


def test_pods_say_what_they_wait_for_a_node_or_a_container_that_does_not_start() -> None:
    unscheduled = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="orders-db-18-1"),
        status=k8s.V1PodStatus(
            conditions=[k8s.V1PodCondition(
                type="PodScheduled", status="False", reason="Unschedulable",
                message="0/3 nodes are available: 3 Insufficient memory.",
            )]
        ),
    )  # fmt: skip
    pulling = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="orders-db-18-0"),
        status=k8s.V1PodStatus(
            container_statuses=[k8s.V1ContainerStatus(
                name="postgres", image="postgres:18", image_id="", ready=False, restart_count=0,
                state=k8s.V1ContainerState(waiting=k8s.V1ContainerStateWaiting(
                    reason="ImagePullBackOff", message='Back-off pulling image "postgres:18"',
                )),
            )]
        ),
    )  # fmt: skip
    starting = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="orders-db-18-2"),
        status=k8s.V1PodStatus(
            container_statuses=[k8s.V1ContainerStatus(
                name="postgres", image="postgres:18", image_id="", ready=False, restart_count=0,
                state=k8s.V1ContainerState(waiting=k8s.V1ContainerStateWaiting(reason="ContainerCreating")),
            )]
        ),
    )  # fmt: skip

    assert waiting_on([unscheduled, starting, pulling]) == [
        'container postgres of Pod orders-db-18-0 waits: ImagePullBackOff (Back-off pulling image "postgres:18")',
        "Pod orders-db-18-1 is not scheduled (Unschedulable: 0/3 nodes are available: 3 Insufficient memory.)",
    ]
