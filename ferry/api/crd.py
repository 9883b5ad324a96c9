"""Generates the Migration CRD manifest from the pydantic models.

The API server needs a structural schema: no $ref, no anyOf for optional fields,
list semantics spelled out. This module turns the models' JSON Schema into that, and
adds what JSON Schema cannot say: CEL rules (an immutable plan, cross-field checks),
printer columns and the status subresource. `ferry crd` prints the result; the copy
in deploy/crd/ must equal it, which a test checks.
"""

from __future__ import annotations

from typing import Any

import yaml

from ferry.api import migration as api

_KEEP = {
    "type",
    "description",
    "properties",
    "required",
    "items",
    "enum",
    "default",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "format",
    "additionalProperties",
    "x-kubernetes-validations",
}

_LIST_MAP_KEYS = {("status", "conditions"): "type", ("status", "steps"): "name"}
"""Lists whose items are identified by a key: server-side apply merges them by it."""


def _structural(schema: dict[str, Any], defs: dict[str, Any], *, optional: bool = False) -> dict[str, Any]:
    """`optional`: the field may be absent (None in Python), so it gets no default."""
    if "$ref" in schema:
        resolved = dict(defs[schema["$ref"].rsplit("/", 1)[1]])
        resolved.update({k: v for k, v in schema.items() if k != "$ref"})
        return _structural(resolved, defs, optional=optional)
    if "anyOf" in schema:
        # Optional[X] is anyOf [X, null]: the field is simply not required.
        options = [option for option in schema["anyOf"] if option.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {schema['anyOf']} in a structural schema")
        merged = {k: v for k, v in schema.items() if k != "anyOf"}
        merged.update(options[0])
        if merged.get("default", "absent") is None:
            del merged["default"]
        return _structural(merged, defs, optional=True)
    if "const" in schema:
        schema = {**schema, "enum": [schema["const"]]}
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in _KEEP:
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs)
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" in out and "default" not in out and not optional:
        # An object whose fields all have defaults gets `{}` as its default, so the API
        # server fills in the nested defaults and `kubectl get -o yaml` shows the full plan.
        required = set(out.get("required", []))
        if not required:
            out["default"] = {}
    return out


def _immutability_rules() -> list[dict[str, str]]:
    rules = []
    for field in api.IMMUTABLE_SPEC_FIELDS:
        rules.append(
            {
                "rule": f"has(self.{field}) == has(oldSelf.{field}) "
                f"&& (!has(self.{field}) || self.{field} == oldSelf.{field})",
                "message": f"spec.{field} is part of the migration plan and cannot change after creation; "
                "create a new Migration instead",
                "fieldPath": f".{field}",
            }
        )
    return rules


_SPEC_RULES = [
    {
        "rule": "self.target.statefulSet != self.source.statefulSet",
        "message": "spec.target.statefulSet must differ from spec.source.statefulSet",
        "fieldPath": ".target.statefulSet",
    },
    {
        "rule": "self.driver.sourceSecret != self.driver.targetSecret",
        "message": "spec.driver.targetSecret must differ from spec.driver.sourceSecret: "
        "a database cannot be migrated into itself",
        "fieldPath": ".driver.targetSecret",
    },
    {
        "rule": "!has(self.approval) || !has(self.approval.deadlineSeconds) || self.approval.required",
        "message": "spec.approval.deadlineSeconds only applies with spec.approval.required: true",
        "fieldPath": ".approval.deadlineSeconds",
    },
    {
        # The precheck refuses it too: a run's input may come from before this rule.
        "rule": "!has(self.snapshot.endpoint) || !self.snapshot.endpoint.startsWith('http://') "
        "|| (has(self.snapshot.allowInsecureEndpoint) && self.snapshot.allowInsecureEndpoint)",
        "message": "spec.snapshot.endpoint is http://, which sends the snapshot and the S3 credentials unencrypted: "
        "use https://, or set spec.snapshot.allowInsecureEndpoint: true for a network path you trust",
        "fieldPath": ".snapshot.endpoint",
    },
    {
        "rule": "!has(self.snapshot.serverSideEncryption) || !has(self.snapshot.serverSideEncryption.kmsKeyId) "
        "|| self.snapshot.serverSideEncryption.type == 'aws:kms'",
        "message": "spec.snapshot.serverSideEncryption.kmsKeyId only applies with type: aws:kms",
        "fieldPath": ".snapshot.serverSideEncryption.kmsKeyId",
    },
]


_ROOT_RULES = [
    {
        # Only spec.paused may change (the rules above), and only while a run can take it in: once the Migration has
        # finished, a change would leave observedGeneration behind metadata.generation for good, and `kubectl wait`
        # reads a condition of an older generation as not met. The status of an update of the object is its old one.
        "rule": "!has(oldSelf.status) || !has(oldSelf.status.phase) || !(oldSelf.status.phase in ["
        + ", ".join(f"'{phase.value}'" for phase in sorted(api.FINISHED_PHASES))
        + "]) || (has(self.spec.paused) && self.spec.paused) == (has(oldSelf.spec.paused) && oldSelf.spec.paused)",
        "message": "spec.paused cannot change once the Migration has finished: no run is left to pause or resume",
        "fieldPath": ".spec.paused",
    },
    {
        # At the root, CEL may read metadata.name (and generateName): the one place to bound it.
        "rule": f"size(self.metadata.name) <= {api.MAX_NAME}",
        "message": f"metadata.name must be at most {api.MAX_NAME} characters: ferry puts the Migration's name "
        "in a label on the objects it creates",
    },
]


def _mark_list_maps(schema: dict[str, Any]) -> None:
    for (section, field), key in _LIST_MAP_KEYS.items():
        node = schema["properties"][section]["properties"][field]
        node["x-kubernetes-list-type"] = "map"
        node["x-kubernetes-list-map-keys"] = [key]


def open_api_schema() -> dict[str, Any]:
    """The structural openAPIV3Schema of ferry.dev/v1alpha1 Migration."""
    spec_schema = api.MigrationSpec.model_json_schema(by_alias=True, mode="validation")
    status_schema = api.MigrationStatus.model_json_schema(by_alias=True, mode="serialization")
    spec = _structural(spec_schema, spec_schema.get("$defs", {}))
    status = _structural(status_schema, status_schema.get("$defs", {}))
    spec.pop("default", None)
    status.pop("default", None)
    spec["x-kubernetes-validations"] = _immutability_rules() + _SPEC_RULES
    schema: dict[str, Any] = {
        "type": "object",
        "description": "A durable, reversible migration of a stateful service, run as a Temporal saga.",
        "x-kubernetes-validations": _ROOT_RULES,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    _mark_list_maps(schema)
    return schema


def manifest() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
                "categories": ["ferry"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "selectableFields": [{"jsonPath": f".{api.SOURCE_FIELD}"}],
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Step", "type": "string", "jsonPath": ".status.currentStep"},
                        {"name": "Progress", "type": "string", "jsonPath": ".status.progress.summary"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                        {"name": "Message", "type": "string", "jsonPath": ".status.message"},
                    ],
                    "schema": {"openAPIV3Schema": open_api_schema()},
                }
            ],
        },
    }


def manifest_yaml() -> str:
    header = "# Generated from ferry/api/migration.py by `ferry crd`; do not edit by hand.\n"
    return header + yaml.safe_dump(manifest(), sort_keys=False, width=120)
