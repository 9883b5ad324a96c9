"""What the activity tests look at in the cluster, and how they set up the work of an earlier or older run."""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from activities import kube_calls, kube_objects
from ferry.api.migration import MIGRATION_UID_LABEL, MigrationSpec
from ferry.api.saga import MigrationRef
from tests.cluster import SOURCE, eventually, ready_replicas


def claims_of(kube_api: k8s.ApiClient, namespace: str, stateful_set: str) -> list[Any]:
    """The volume claims of a StatefulSet's Pods, by their names `<template>-<stateful_set>-<ordinal>`."""
    claims = k8s.CoreV1Api(kube_api).list_namespaced_persistent_volume_claim(namespace).items
    prefix = f"data-{stateful_set}-"
    return sorted(
        (c for c in claims if c.metadata.name.startswith(prefix) and c.metadata.name[len(prefix) :].isdigit()),
        key=lambda c: c.metadata.name,
    )


def absent(read: Any, name: str, namespace: str) -> bool:
    try:
        read(name, namespace)
    except ApiException as error:
        return bool(error.status == 404)
    return False


def target_objects(kube_api: k8s.ApiClient, namespace: str, target: str) -> dict[str, Any]:
    """Identity and state of a target's StatefulSet, Service and claims: equal before and after means untouched."""
    apps, core = k8s.AppsV1Api(kube_api), k8s.CoreV1Api(kube_api)
    stateful_set = apps.read_namespaced_stateful_set(target, namespace).metadata
    service = core.read_namespaced_service(target, namespace).metadata
    return {
        "statefulset": (stateful_set.uid, stateful_set.resource_version, stateful_set.deletion_timestamp),
        "service": (service.uid, service.resource_version, service.deletion_timestamp),
        "claims": [
            (c.metadata.name, c.metadata.uid, c.metadata.deletion_timestamp)
            for c in claims_of(kube_api, namespace, target)
        ],
    }


def stable_service(kube_api: k8s.ApiClient, namespace: str) -> k8s.V1Service:
    return k8s.CoreV1Api(kube_api).read_namespaced_service(SOURCE, namespace)


def source_stateful_set(kube_api: k8s.ApiClient, namespace: str) -> k8s.V1StatefulSet:
    return k8s.AppsV1Api(kube_api).read_namespaced_stateful_set(SOURCE, namespace)


def provision_as_an_older_ferry(kube_api: k8s.ApiClient, ref: MigrationRef, spec: MigrationSpec) -> None:
    """The target as a ferry from before the uid label made it: the same objects, labelled by name only."""
    apps, core = k8s.AppsV1Api(kube_api), k8s.CoreV1Api(kube_api)
    source = kube_calls.read_json(apps.read_namespaced_stateful_set, SOURCE, ref.namespace)
    service = kube_calls.read_json(core.read_namespaced_service, SOURCE, ref.namespace)
    services = core.list_namespaced_service(ref.namespace).items
    selectors = {s.metadata.name: s.spec.selector for s in services if s.spec.selector}
    manifest = kube_objects.target_stateful_set(source, service, ref, spec.target, selectors)
    stateful_set = _without_uid(manifest)
    headless = _without_uid(kube_objects.headless_service(service, ref, spec.target))
    kube_calls.apply(core.patch_namespaced_service, headless, "ferry")
    kube_calls.apply(apps.patch_namespaced_stateful_set, stateful_set, "ferry")
    target = spec.target.stateful_set
    eventually("the older ferry's target to be Ready", lambda: ready_replicas(kube_api, ref.namespace, target) == 2)


def _without_uid(manifest: Any) -> Any:
    if isinstance(manifest, dict):
        return {key: _without_uid(value) for key, value in manifest.items() if key != MIGRATION_UID_LABEL}
    if isinstance(manifest, list):
        return [_without_uid(item) for item in manifest]
    return manifest
