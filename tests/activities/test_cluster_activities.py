"""ClusterActivities is put together from one part per step and undo; the parts must not hide each other's methods."""

from __future__ import annotations

import itertools

from activities.cluster import ClusterActivities
from activities.cluster_api import ClusterApi


def test_no_part_of_cluster_activities_hides_a_method_of_another() -> None:
    parts = ClusterActivities.__bases__
    own = {part: {name for name in vars(part) if not name.startswith("__")} for part in parts}

    clashes = {(a.__name__, b.__name__): own[a] & own[b] for a, b in itertools.combinations(parts, 2)}

    assert all(issubclass(part, ClusterApi) for part in parts)
    assert not any(clashes.values()), clashes
