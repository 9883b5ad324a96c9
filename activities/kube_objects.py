"""The objects provision creates, built from the source as plain manifests.

Pure functions from what was read to what is applied, so the rules read in one place:
what is copied from the source, which labels the target's objects carry (the owning
Migration's uid, see ownership.py; and on Pods none that the stable Service or any other
Service selecting the source's Pods uses, so none can send them traffic before
switch-traffic), and which requests are refused.
Manifests are plain dicts, as the API server sends and server-side apply takes them;
objects are read as raw JSON (see kube_calls).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from activities.ownership import object_labels
from ferry.api.errors import InvalidSpec
from ferry.api.migration import MIGRATION_LABEL, MIGRATION_UID_LABEL, STATEFULSET_LABEL, TargetSpec
from ferry.api.saga import MigrationRef

MAX_LABEL_VALUE = 63
PER_POD_LABELS = frozenset({"apps.kubernetes.io/pod-index"})
"""Labels the StatefulSet controller gives each Pod whose values the target's Pods share with the source's."""


def is_pod_of(stateful_set: str, pod: str) -> bool:
    """Whether `pod` is named like a Pod of `stateful_set`: `<stateful_set>-<ordinal>`."""
    prefix = f"{stateful_set}-"
    return pod.startswith(prefix) and pod[len(prefix) :].isdigit()


def pod_named_by(host: str, namespace: str) -> tuple[str, str] | None:
    """(StatefulSet, governing Service) of the Pod whose stable DNS name `host` is, in `namespace`:
    `<statefulset>-<ordinal>.<service>`, optionally followed by `.<namespace>`, `.svc` and the cluster's domain; None
    for any other host (an IP address, a Service, a name outside the namespace)."""
    labels = host.lower().rstrip(".").split(".")
    if len(labels) < 2 or (len(labels) > 2 and labels[2] != namespace) or (len(labels) > 3 and labels[3] != "svc"):
        return None
    pod, service = labels[0], labels[1]
    stateful_set, _, ordinal = pod.rpartition("-")
    if not stateful_set or not ordinal.isdigit():
        return None
    return stateful_set, service


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def target_pod_labels(ref: MigrationRef, target: str) -> dict[str, str]:
    """Labels that mark the target's Pods and claims; the stable Service selects the first after the switch."""
    if len(ref.name) > MAX_LABEL_VALUE:
        # The CRD refuses such names at admission; this guards Migrations created before it did.
        raise InvalidSpec(
            f"metadata.name: ferry labels the objects it creates with the Migration's name, which must then be "
            f"at most {MAX_LABEL_VALUE} characters; re-create Migration {ref} with a shorter name."
        )
    return {STATEFULSET_LABEL: target, MIGRATION_LABEL: ref.name, MIGRATION_UID_LABEL: ref.uid}


def services_selecting(labels: Mapping[str, str], selectors: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The names of the Services (`selectors`: each one's selector by name) that select Pods labelled `labels`.

    Only Services selecting by at least one of `labels` count: one selecting by the
    controller's per-Pod labels alone selects every StatefulSet's Pods, and no label
    ferry leaves out would keep it off the target's.
    """
    return sorted(
        name
        for name, selector in selectors.items()
        if any(key in labels for key in selector)
        and all(labels.get(key) == value for key, value in selector.items() if key not in PER_POD_LABELS)
    )


def target_stateful_set(
    source: dict[str, Any],
    service: dict[str, Any],
    ref: MigrationRef,
    target: TargetSpec,
    selectors: Mapping[str, Mapping[str, str]],
) -> dict[str, Any]:
    """The target StatefulSet: the source's Pod template with the new image, resources and storage.

    Its Pods carry the source template's labels but those the stable Service (`service`)
    selects by and those any Service of `selectors` (every Service's selector in the
    namespace, by name) selecting the source's Pods selects by: until switch-traffic
    points the stable Service at them, no Service may send them traffic (a read-only
    Service, the source's governing headless one). ferry's own labels stay. No
    ownerReference points at the Migration: the target must outlive it.
    """
    source_spec = source["spec"]
    template = copy.deepcopy(source_spec["template"])
    pod_spec = template["spec"]
    _set_image_and_resources(pod_spec["containers"], source["metadata"]["name"], target)

    own = target_pod_labels(ref, target.stateful_set)
    source_template_metadata = template.get("metadata") or {}
    source_labels: dict[str, str] = source_template_metadata.get("labels") or {}
    left_out = set(service["spec"].get("selector") or {})
    for name in services_selecting(source_labels, selectors):
        left_out.update(selectors[name])
    pod_labels = {key: value for key, value in source_labels.items() if key not in left_out}
    pod_metadata: dict[str, Any] = {"labels": {**pod_labels, **own}}
    if source_template_metadata.get("annotations"):
        pod_metadata["annotations"] = source_template_metadata["annotations"]

    spec: dict[str, Any] = {
        "replicas": target.replicas,
        "serviceName": target.stateful_set,
        "selector": {"matchLabels": {STATEFULSET_LABEL: target.stateful_set}},
        "template": {"metadata": pod_metadata, "spec": pod_spec},
        "volumeClaimTemplates": _claim_templates(source, own, target),
    }
    for copied in ("podManagementPolicy", "updateStrategy"):
        if copied in source_spec:
            spec[copied] = copy.deepcopy(source_spec[copied])
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": target.stateful_set, "namespace": ref.namespace, "labels": object_labels(ref)},
        "spec": spec,
    }


def headless_service(service: dict[str, Any], ref: MigrationRef, target: TargetSpec) -> dict[str, Any]:
    """The target's governing Service: headless, selecting only the target's Pods, on the stable Service's ports."""
    ports = [
        {key: port[key] for key in ("name", "port", "targetPort", "protocol") if key in port}
        for port in service["spec"].get("ports") or []
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": target.stateful_set, "namespace": ref.namespace, "labels": object_labels(ref)},
        "spec": {"clusterIP": "None", "selector": {STATEFULSET_LABEL: target.stateful_set}, "ports": ports},
    }


def _set_image_and_resources(containers: list[dict[str, Any]], source: str, target: TargetSpec) -> None:
    names = [container["name"] for container in containers]
    wanted = target.container or names[0]
    if wanted not in names:
        raise InvalidSpec(
            f"spec.target.container: the Pod template of StatefulSet {source} has no container {wanted!r} "
            f"(it has {', '.join(names)}); re-create the Migration naming one of those."
        )
    container = containers[names.index(wanted)]
    container["image"] = target.image
    if target.resources is not None:
        resources = {"requests": dict(target.resources.requests), "limits": dict(target.resources.limits)}
        container["resources"] = {key: value for key, value in resources.items() if value}


UNCOPIED_CLAIM_FIELDS = ("volumeName", "selector", "dataSource", "dataSourceRef")
"""Fields of the source's claim templates the target's leave out: its volumes are new and empty, made by their
StorageClass. A volumeName or a selector would bind them to existing volumes (someone's Available one, whose data
undo_provision's deletion of the claim then releases, and deletes under reclaimPolicy Delete); a data source would
fill them from a snapshot or another claim before the restore."""


def _claim_templates(source: dict[str, Any], own_labels: dict[str, str], target: TargetSpec) -> list[dict[str, Any]]:
    claims = source["spec"].get("volumeClaimTemplates") or []
    if not claims:
        raise InvalidSpec(
            f"spec.source.statefulSet: StatefulSet {source['metadata']['name']} has no volumeClaimTemplates, "
            "and ferry gives the target the source's volumes with the new class and size. "
            "Migrate only StatefulSets that keep their data in volumeClaimTemplates."
        )
    templates = []
    for claim in claims:
        metadata = claim.get("metadata") or {}
        spec = copy.deepcopy(claim["spec"])
        for bound in UNCOPIED_CLAIM_FIELDS:
            spec.pop(bound, None)
        if target.storage_class_name is not None:
            spec["storageClassName"] = target.storage_class_name
        spec.setdefault("resources", {}).setdefault("requests", {})["storage"] = target.storage_size
        claim_metadata: dict[str, Any] = {
            "name": metadata["name"],
            "labels": {**(metadata.get("labels") or {}), **own_labels},
        }
        if metadata.get("annotations"):
            claim_metadata["annotations"] = metadata["annotations"]
        templates.append(
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": claim_metadata, "spec": spec}
        )
    return templates
