"""The saga's steps on Kubernetes objects, each next to its undo: provision, switch-traffic, scale-down-old.

| step            | module          | undo                 |
|-----------------|-----------------|----------------------|
| provision       | provisioning.py | undo_provision       |
| switch_traffic  | traffic.py      | undo_switch_traffic  |
| scale_down_old  | scaling.py      | undo_scale_down_old  |

Every activity can run again after a crash at any point and reach the same end: what
it must remember across attempts lives in the cluster (records with the Migration's
uid on the objects it changes, the uid label on those it creates), never in the
worker. Every undo is safe whether its step did all, part or none of its work, and
acts only on what its own Migration (by uid, see ownership.py) did. Writes to objects
ferry does not own are conditional on the resourceVersion they were computed from
(see kube_calls), so a concurrent change is re-read, never overwritten, and carry the
writing activity's fence, so a late attempt never writes over a later action of its
Migration (fences.py; provision, whose objects the undo deletes, checks the fence its
undo leaves on the source). Refusals by
the API server end a step as a sentence, not retried (api_refusals.py).
"""

from __future__ import annotations

from activities.provisioning import Provisioning
from activities.scaling import Scaling
from activities.traffic import TrafficSwitching


class ClusterActivities(Provisioning, TrafficSwitching, Scaling):
    """Kubernetes-side activities, sharing one API client (see cluster_api.ClusterApi).

    The three parts share one namespace: their helpers' names must not repeat (a test checks).
    """
