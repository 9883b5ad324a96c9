"""The Migration CRD, generated from the models, is what the real API server enforces."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from ferry.api import crd
from tests import samples
from tests.conftest import CRD_MANIFEST, Kubectl

SAMPLE = CRD_MANIFEST.parent.parent / "samples" / "migration.yaml"


def _apply(kubectl: Kubectl, namespace: str, obj: dict[str, Any]) -> Any:
    return kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(obj), check=False)


def test_committed_crd_matches_the_models() -> None:
    assert CRD_MANIFEST.read_text() == crd.manifest_yaml(), "run `make generate` and commit deploy/crd"


def test_a_valid_migration_is_accepted_with_defaults_filled_in(
    kubectl: Kubectl, migration_crd: str, namespace: str
) -> None:
    applied = _apply(kubectl, namespace, samples.migration())
    assert applied.returncode == 0, applied.stderr

    stored = yaml.safe_load(kubectl("get", "migration", "orders-db-to-16", "-n", namespace, "-o", "yaml").stdout)

    spec = stored["spec"]
    assert spec["failurePolicy"] == "RollBack"
    assert spec["approval"] == {"required": False, "onDeadline": "RollBack"}
    assert spec["target"]["replicas"] == 1
    assert spec["snapshot"]["retention"] == {"afterSuccess": "DeleteWithMigration", "afterRollback": "Delete"}
    assert spec["timeouts"]["snapshot"] == 3600
    assert "resources" not in spec["target"]


def test_kubectl_get_shows_the_printer_columns(kubectl: Kubectl, migration_crd: str, namespace: str) -> None:
    _apply(kubectl, namespace, samples.migration())

    header = kubectl("get", "mig", "-n", namespace).stdout.splitlines()[0].split()

    assert header == ["NAME", "PHASE", "STEP", "PROGRESS", "AGE", "MESSAGE"]


SNAPSHOT = {"bucket": "ferry-snapshots", "credentialsSecret": "snapshot-credentials"}

INVALID = {
    "a malformed storage size": (
        {"target": {"statefulSet": "orders-db-16", "image": "postgres:16", "storageSize": "20 gigs"}},
        ["spec.target.storageSize"],
    ),
    "zero target replicas": (
        {"target": {"statefulSet": "orders-db-16", "image": "postgres:16", "storageSize": "1Gi", "replicas": 0}},
        ["spec.target.replicas", "should be greater than or equal to 1"],
    ),
    "a target named like the source": (
        {"target": {"statefulSet": "orders-db", "image": "postgres:16", "storageSize": "1Gi"}},
        ["spec.target.statefulSet", "must differ from spec.source.statefulSet"],
    ),
    "the same secret for source and target": (
        {"driver": {"sourceSecret": "db", "targetSecret": "db"}},
        ["spec.driver.targetSecret", "cannot be migrated into itself"],
    ),
    "a missing bucket": (
        {"snapshot": {"credentialsSecret": "snapshot-credentials"}},
        ["spec.snapshot.bucket", "Required value"],
    ),
    "an unknown failure policy": (
        {"failurePolicy": "Shrug"},
        ["spec.failurePolicy", 'Unsupported value: "Shrug"'],
    ),
    "an approval deadline without required approval": (
        {"approval": {"required": False, "deadlineSeconds": 60}},
        ["spec.approval.deadlineSeconds", "only applies with spec.approval.required: true"],
    ),
    "a step timeout beyond 7 days": (
        {"timeouts": {"migrate": 99999999999999}},
        ["spec.timeouts.migrate", "should be less than or equal to 604800"],
    ),
    "an approval deadline beyond 30 days": (
        {"approval": {"required": True, "deadlineSeconds": 99999999999999}},
        ["spec.approval.deadlineSeconds", "should be less than or equal to 2592000"],
    ),
    "a soak beyond 7 days": (
        {"soakSeconds": 604801},
        ["spec.soakSeconds", "should be less than or equal to 604800"],
    ),
    "more than 100 target replicas": (
        {"target": {"statefulSet": "orders-db-16", "image": "postgres:16", "storageSize": "1Gi", "replicas": 101}},
        ["spec.target.replicas", "should be less than or equal to 100"],
    ),
    "a zero storage size": (
        {"target": {"statefulSet": "orders-db-16", "image": "postgres:16", "storageSize": "0"}},
        ["spec.target.storageSize", "must be a positive quantity"],
    ),
    "a zero storage size with a unit": (
        {"target": {"statefulSet": "orders-db-16", "image": "postgres:16", "storageSize": "0.0Gi"}},
        ["spec.target.storageSize", "must be a positive quantity"],
    ),
    "a storage size beyond 1Ei": (
        {"target": {"statefulSet": "orders-db-16", "image": "postgres:16", "storageSize": "8Ei"}},
        ["spec.target.storageSize", "must be a positive quantity of at most 1Ei"],
    ),
    "a snapshot prefix of more than 512 bytes in fewer characters": (
        {"snapshot": {**SNAPSHOT, "prefix": "\u20ac" * 200 + "/"}},
        ["spec.snapshot.prefix", "must be at most 512 bytes in UTF-8"],
    ),
    "a plain http S3 endpoint not explicitly allowed": (
        {"snapshot": {**SNAPSHOT, "endpoint": "http://minio.storage:9000"}},
        ["spec.snapshot.endpoint", "set spec.snapshot.allowInsecureEndpoint: true for a network path you trust"],
    ),
    "a KMS key for encryption with S3's own keys": (
        {"snapshot": {**SNAPSHOT, "serverSideEncryption": {"type": "AES256", "kmsKeyId": "alias/ferry"}}},
        ["spec.snapshot.serverSideEncryption.kmsKeyId", "only applies with type: aws:kms"],
    ),
    "a region that is no host label": (
        {"snapshot": {**SNAPSHOT, "region": "eu west 1"}},
        ["spec.snapshot.region", "should match"],
    ),
    "a KMS key with a line break": (
        {
            "snapshot": {
                **SNAPSHOT,
                "serverSideEncryption": {"type": "aws:kms", "kmsKeyId": "alias/ferry\nX-Amz-Acl: x"},
            }
        },
        ["spec.snapshot.serverSideEncryption.kmsKeyId", "should match"],
    ),
    "an unknown kind of encryption": (
        {"snapshot": {**SNAPSHOT, "serverSideEncryption": {"type": "rot13"}}},
        ["spec.snapshot.serverSideEncryption.type", 'Unsupported value: "rot13"'],
    ),
}


@pytest.mark.parametrize("case", INVALID.keys())
def test_the_api_server_rejects_an_invalid_spec_naming_the_field(
    case: str, kubectl: Kubectl, migration_crd: str, namespace: str
) -> None:
    overrides, expected = INVALID[case]

    rejected = _apply(kubectl, namespace, samples.migration("invalid", **overrides))

    assert rejected.returncode != 0
    for fragment in expected:
        assert fragment in rejected.stderr
    assert "NotFound" in kubectl("get", "migration", "invalid", "-n", namespace, check=False).stderr


def test_a_name_too_long_for_a_label_is_refused_at_admission(
    kubectl: Kubectl, migration_crd: str, namespace: str
) -> None:
    name = "orders-db-to-16-" + "x" * 48  # 64 characters: a valid object name, too long for a label value

    rejected = _apply(kubectl, namespace, samples.migration(name))

    assert rejected.returncode != 0
    assert "metadata.name must be at most 63 characters" in rejected.stderr
    assert "NotFound" in kubectl("get", "migration", name, "-n", namespace, check=False).stderr
    assert _apply(kubectl, namespace, samples.migration(name[:63])).returncode == 0, "63 characters fit"


def test_the_commented_sample_in_deploy_is_accepted(kubectl: Kubectl, migration_crd: str, namespace: str) -> None:
    applied = kubectl("apply", "-n", namespace, "-f", str(SAMPLE), check=False)

    assert applied.returncode == 0, applied.stderr
    stored = yaml.safe_load(kubectl("get", "migration", "orders-db-to-18", "-n", namespace, "-o", "yaml").stdout)
    assert stored["spec"]["approval"]["deadlineSeconds"] == 86400


def test_the_plan_cannot_change_after_creation(kubectl: Kubectl, migration_crd: str, namespace: str) -> None:
    _apply(kubectl, namespace, samples.migration())

    changed = kubectl(
        "patch", "migration", "orders-db-to-16", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"target": {"image": "postgres:17"}}}),
        check=False,
    )  # fmt: skip

    assert changed.returncode != 0
    assert "spec.target" in changed.stderr
    assert "cannot change after creation" in changed.stderr


def test_control_fields_may_change_after_creation(kubectl: Kubectl, migration_crd: str, namespace: str) -> None:
    _apply(kubectl, namespace, samples.migration())

    kubectl("patch", "migration", "orders-db-to-16", "-n", namespace, "--type=merge", "-p", '{"spec":{"paused":true}}')

    paused = kubectl("get", "migration", "orders-db-to-16", "-n", namespace, "-o", "jsonpath={.spec.paused}")
    assert paused.stdout == "true"


def _pause(kubectl: Kubectl, namespace: str, paused: bool) -> Any:
    patch = json.dumps({"spec": {"paused": paused}})
    return kubectl("patch", "migration", "orders-db-to-16", "-n", namespace, "--type=merge", "-p", patch, check=False)


@pytest.mark.parametrize("phase", ["Succeeded", "RolledBack", "Failed"])
def test_spec_paused_cannot_change_once_the_migration_has_finished(
    kubectl: Kubectl, migration_crd: str, namespace: str, phase: str
) -> None:
    """No run is left to take it in: the change would leave observedGeneration behind for good, and every
    `kubectl wait --for=condition=...` on the Migration would hang."""
    _apply(kubectl, namespace, samples.migration())
    assert _pause(kubectl, namespace, True).returncode == 0, "while running, it may change"
    kubectl(
        "patch", "migration", "orders-db-to-16", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": phase}}),
    )  # fmt: skip

    refused = _pause(kubectl, namespace, False)

    assert refused.returncode != 0
    assert "spec.paused cannot change once the Migration has finished" in refused.stderr
    assert _pause(kubectl, namespace, True).returncode == 0, "the same value is no change"
    annotated = kubectl(
        "annotate", "migration", "orders-db-to-16", "-n", namespace, "example.com/note=kept", check=False
    )
    assert annotated.returncode == 0, annotated.stderr


@pytest.mark.parametrize(
    "snapshot",
    [
        {**SNAPSHOT, "endpoint": "https://s3.example.com"},
        {**SNAPSHOT, "endpoint": "http://minio.storage:9000", "allowInsecureEndpoint": True},
        {**SNAPSHOT, "serverSideEncryption": {"type": "aws:kms", "kmsKeyId": "alias/ferry"}},
        {**SNAPSHOT, "serverSideEncryption": {"type": "AES256"}},
    ],
    ids=["https", "http explicitly allowed", "aws:kms with a key", "AES256"],
)
def test_a_secured_snapshot_spec_is_accepted(
    snapshot: dict[str, Any], kubectl: Kubectl, migration_crd: str, namespace: str
) -> None:
    manifest = json.dumps(samples.migration(snapshot=snapshot))

    applied = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=manifest, check=False)

    assert applied.returncode == 0, applied.stderr
