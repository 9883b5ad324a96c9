"""Sample Migration objects for tests, as plain dicts the way kubectl would send them."""

from __future__ import annotations

import copy
from typing import Any


def migration(name: str = "orders-db-to-16", **spec_overrides: Any) -> dict[str, Any]:
    """A valid Migration; keyword arguments replace top-level spec fields."""
    spec: dict[str, Any] = {
        "source": {"statefulSet": "orders-db", "service": "orders-db"},
        "target": {"statefulSet": "orders-db-16", "image": "postgres:16", "storageSize": "1Gi"},
        "driver": {"type": "postgresql", "sourceSecret": "orders-db-source", "targetSecret": "orders-db-target"},
        "snapshot": {"bucket": "ferry-snapshots", "credentialsSecret": "snapshot-credentials"},
    }
    spec.update(copy.deepcopy(spec_overrides))
    return {"apiVersion": "ferry.dev/v1alpha1", "kind": "Migration", "metadata": {"name": name}, "spec": spec}
