"""The target StatefulSet ferry builds from the source's: new, empty volumes whatever the source's claims said."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from activities import kube_objects
from ferry.api.migration import MigrationSpec
from ferry.api.saga import MigrationRef
from tests import samples

pytestmark = pytest.mark.unit

SPEC = MigrationSpec.model_validate(samples.migration("orders-db-to-18")["spec"])
REF = MigrationRef(namespace="shop", name="orders-db-to-18", uid=str(uuid.uuid4()))


def _source(claim_spec: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": "orders-db"}
    return {
        "metadata": {"name": SPEC.source.stateful_set, "namespace": "shop"},
        "spec": {
            "replicas": 1,
            "serviceName": SPEC.source.stateful_set,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "postgres", "image": "p:15"}]},
            },
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": claim_spec}],
        },
    }


def test_the_targets_claims_bind_no_existing_volume_and_start_from_no_data_source() -> None:
    """A selector could bind the target's claim to someone's Available volume, which undo_provision's deletion of the
    claim would release (and delete, under reclaimPolicy Delete); a data source would fill it before the restore."""
    claim = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
        "volumeName": "pv-orders-0",
        "selector": {"matchLabels": {"tier": "gold"}},
        "dataSource": {"kind": "VolumeSnapshot", "name": "nightly", "apiGroup": "snapshot.storage.k8s.io"},
        "dataSourceRef": {"kind": "VolumeSnapshot", "name": "nightly", "apiGroup": "snapshot.storage.k8s.io"},
    }
    service = {"metadata": {"name": SPEC.source.service}, "spec": {"selector": {"app": "orders-db"}}}

    target = kube_objects.target_stateful_set(_source(claim), service, REF, SPEC.target, {})

    (template,) = target["spec"]["volumeClaimTemplates"]
    assert set(template["spec"]) <= {"accessModes", "resources", "storageClassName"}
    assert "accessModes" in template["spec"]
    assert template["spec"]["resources"]["requests"]["storage"] == SPEC.target.storage_size
