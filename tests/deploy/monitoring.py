"""Stand-ins for the Prometheus Operator's PrometheusRule and ServiceMonitor CRDs, which this stack does not install.

Each schema has the fields of the real one that ferry's objects use, with the real patterns and
no unknown fields allowed, so the API server checks the objects' shape as the real CRDs would;
neither can check PromQL or whether a target exists.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.cluster import crd_established
from tests.conftest import Kubectl

_DURATION = {"type": "string", "pattern": "^(0|(([0-9]+)(h|m|s|ms))+)$"}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}


def _crd(kind: str, plural: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "required": ["spec"], "properties": {"spec": spec}}},
            }],
        },
    }  # fmt: skip


PROMETHEUS_RULE_CRD = _crd("PrometheusRule", "prometheusrules", {
    "type": "object",
    "required": ["groups"],
    "properties": {"groups": {
        "type": "array", "minItems": 1,
        "items": {
            "type": "object",
            "required": ["name", "rules"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "interval": _DURATION,
                "rules": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "required": ["expr"],
                    "properties": {
                        "alert": {"type": "string"},
                        "record": {"type": "string"},
                        "expr": {"x-kubernetes-int-or-string": True},
                        "for": _DURATION,
                        "labels": _LABELS,
                        "annotations": _LABELS,
                    },
                }},
            },
        },
    }},
})  # fmt: skip

SERVICE_MONITOR_CRD = _crd("ServiceMonitor", "servicemonitors", {
    "type": "object",
    "required": ["selector"],
    "properties": {
        "selector": {"type": "object", "properties": {"matchLabels": _LABELS}},
        "endpoints": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "port": {"type": "string"},
                "path": {"type": "string"},
                "interval": _DURATION,
                "honorLabels": {"type": "boolean"},
            },
        }},
    },
})  # fmt: skip


@contextmanager
def installed(kubectl: Kubectl, *crds: dict[str, Any]) -> Iterator[None]:
    """The CRDs applied for real and Established; deleted afterwards."""
    for crd in crds:
        kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(crd))
        name = crd["metadata"]["name"]
        crd_established(lambda name=name: kubectl("get", f"crd/{name}", "-o", "json").stdout, name)
    try:
        yield
    finally:
        for crd in crds:
            kubectl("delete", "crd", crd["metadata"]["name"], "--ignore-not-found")
