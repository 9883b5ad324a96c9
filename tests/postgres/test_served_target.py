"""Nothing empties a target that a Service sends the clients to, whatever led there.

On the way back the undo of switch-traffic points the stable Service back at the source
before anything empties the target. That order is not the only way there: a run reset to
a point before switch-traffic (`temporal workflow reset`) rolls back without knowing it
switched, a person or a GitOps controller may point a Service at the target. The undos
of migrate, of the snapshot that restored and of replicate would then empty a database
the clients read and write, if it took no writes since verify (a quiet night). Each
looks for itself: while a Service selects the target's Pods by ferry's label, it refuses
(TargetServesTraffic, tried again) and the target keeps everything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.exceptions import ApplicationError

from activities import records
from activities.ownership import object_labels
from ferry.api.migration import STATEFULSET_LABEL
from ferry.api.saga import MigrationRef
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import contents, create_shop
from tests.postgres.online import OnlineSteps

TARGET = "orders-db-18"
STABLE = "orders-db"


@pytest.fixture
def served(kube_api: k8s.ApiClient, ref: MigrationRef) -> Iterator[Callable[..., None]]:
    """The Migration's target StatefulSet (its uid label, no Pods) and the stable Service; the callable points the
    Service at the target (True, as switch-traffic leaves it, or `by_hand`, with no record of a switch) or back at
    the source (False)."""
    apps, core = k8s.AppsV1Api(kube_api), k8s.CoreV1Api(kube_api)
    pods = {STATEFULSET_LABEL: TARGET}
    apps.create_namespaced_stateful_set(
        ref.namespace,
        k8s.V1StatefulSet(
            metadata=k8s.V1ObjectMeta(name=TARGET, labels=object_labels(ref)),
            spec=k8s.V1StatefulSetSpec(
                replicas=0,
                service_name=TARGET,
                selector=k8s.V1LabelSelector(match_labels=pods),
                template=k8s.V1PodTemplateSpec(
                    metadata=k8s.V1ObjectMeta(labels=pods),
                    spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="postgres", image="postgres:18")]),
                ),
            ),
        ),
    )
    core.create_namespaced_service(
        ref.namespace,
        k8s.V1Service(
            metadata=k8s.V1ObjectMeta(name=STABLE),
            spec=k8s.V1ServiceSpec(selector={"app": STABLE}, ports=[k8s.V1ServicePort(port=5432)]),
        ),
    )

    def point(at_target: bool, by_hand: bool = False) -> None:
        selector = pods if at_target else {"app": STABLE}
        switched = at_target and not by_hand  # as switch-traffic leaves it: with this Migration's record
        record = {records.PREVIOUS_SELECTOR_ANNOTATION: records.encode_selector(ref, {"app": STABLE})}
        core.replace_namespaced_service(
            STABLE,
            ref.namespace,
            k8s.V1Service(
                metadata=k8s.V1ObjectMeta(name=STABLE, annotations=record if switched else None),
                spec=k8s.V1ServiceSpec(selector=selector, ports=[k8s.V1ServicePort(port=5432)]),
            ),
        )

    yield point
    core.delete_namespaced_service(STABLE, ref.namespace)
    apps.delete_namespaced_stateful_set(TARGET, ref.namespace)


def _refused(undo: Callable[[], Any]) -> ApplicationError:
    with pytest.raises(ApplicationError) as raised:
        undo()
    assert raised.value.type == "TargetServesTraffic"
    assert not raised.value.non_retryable, "once the Service is pointed back, a retry goes on"
    assert "still sends its traffic to StatefulSet" in str(raised.value)
    return raised.value


@pytest.mark.parametrize("restored_by", ["migrate", "the snapshot"])
def test_the_undo_that_empties_the_target_refuses_while_a_service_sends_the_clients_there(
    steps: Steps, databases: Databases, served: Callable[..., None], restored_by: str
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    steps.freeze()
    if restored_by == "migrate":
        steps.migrate(steps.snapshot())
        undo: Callable[[], Any] = steps.undo_migrate
    else:
        steps.snapshot(restore=True)
        undo = steps.undo_snapshot
    steps.verify()
    served(True)
    before = contents(databases.target)

    _refused(undo)

    assert contents(databases.target) == before, "the target the clients use keeps every row"
    served(False)
    undo()
    assert contents(databases.target) != before, "pointed back at the source, the target is emptied as before"


def test_the_undo_of_replicate_refuses_while_a_service_sends_the_clients_there(
    online: OnlineSteps, databases: Databases, served: Callable[..., None]
) -> None:
    create_shop(databases.source, customers=100, orders=1_000)
    online.replicate()
    served(True)
    before = contents(databases.target)

    _refused(online.undo_replicate)

    assert contents(databases.target) == before
    served(False)
    ended = online.undo_replicate()
    assert ended.emptied


def test_a_service_pointed_at_the_target_by_hand_before_any_switch_does_not_keep_the_source_frozen(
    steps: Steps, databases: Databases, served: Callable[..., None]
) -> None:
    """Only traffic this Migration moved holds the undo (its record is on the Service): a Service someone else points
    at the target (a metrics Service, say) while the clients are still on the source would otherwise hold the way
    back, and the source frozen with it. provision's undo still refuses to delete a target any Service selects."""
    create_shop(databases.source, customers=10, orders=10)
    steps.freeze()
    steps.migrate(steps.snapshot())
    served(True, by_hand=True)

    assert steps.undo_migrate().removed
