"""provision and its undo: the target StatefulSet and its headless Service, made for one Migration, removed only by it.

provision reads and checks everything before its first write, so a refusal leaves the
cluster exactly as it was: the source and its Service exist, the storage class
exists, the target does not already serve the stable Service's traffic, and nothing
under the target's names (StatefulSet, Service, claims) belongs to anyone but this
Migration (ownership.py: by uid). Its writes create what does not exist yet, so of two
Migrations whose checks ran at the same moment, the second to write finds the names taken
and refuses. undo_provision deletes what carries this Migration's
uid, whatever provision got to do (nothing, the Service alone, everything), and
nothing else.

A late attempt of provision (its worker stood still past its timeout, then went on after
the rollback) would create the target again after undo_provision deleted it. The objects
it creates cannot carry a fence, since the undo deletes them, so undo_provision fences
the source StatefulSet (fences.py), found through the Migration of its uid, before it
deletes anything, and provision reads the source's fence right before its applies and
refuses (Overtaken) when a later action of its Migration wrote it. Kubernetes has no
write conditional on another object, so an attempt that stands still between that read
and its applies still gets through: the check narrows the window to those two calls.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import blocked, checks, fences, kube_calls, kube_objects, records, serving
from activities.api_refusals import explain_refusals, server_message
from activities.cluster_api import ClusterApi
from activities.events import record_event
from activities.heartbeats import Heartbeats
from activities.ownership import belongs_to, labels_of, name_of, own_selector, owner
from activities.scaling import refuse_claims_deleted_when_scaled
from activities.status import REPORTING_COMPONENT
from activities.waiting import Progress
from ferry.api.errors import InvalidSpec
from ferry.api.migration import (
    GROUP,
    MIGRATION_LABEL,
    MIGRATION_UID_LABEL,
    PLURAL,
    SOURCE_FIELD,
    STATEFULSET_LABEL,
    VERSION,
    EventType,
    Migration,
    MigrationSpec,
)
from ferry.api.saga import KubeActivity, MigrationRef, ProvisionInput, ProvisionResult, UndoProvisionInput

SERVICE_SELECTS_OTHER_PODS = "ServiceSelectsOtherPods"
"""Reason of the precheck's Warning Event naming the Pods the stable Service selects beside the source's."""
OTHER_PODS_SHOWN = 5
MIGRATIONS_PAGE = 500
"""Migrations per page when a source's Migrations are listed without the API server's selection."""
LOOK_WHY_AFTER = 5.0
"""Seconds provision waits for the target to be Ready before it also looks why not (Events, Pods), at every poll."""
REFUSAL_GRACE = 30.0
"""Seconds into an attempt of provision after which a create the API server refused the target's controller fails
the attempt (TargetRefused): the controller tries again by itself, so a refusal that passes (a quota freed by a Pod
that was terminating) is waited out."""


class TargetRefused(Exception):
    """The API server refuses the target StatefulSet's controller what it needs (a Pod, a claim): a ResourceQuota, a
    LimitRange, Pod Security admission, a webhook. Not a PermanentError: the next attempt waits again, so a cause
    fixed meanwhile lets provision finish; the failure policy decides after the last one."""


class Provisioning(ClusterApi):
    """provision and undo_provision."""

    @activity.defn(name=KubeActivity.PROVISION.value)
    @explain_refusals
    def provision(self, input: ProvisionInput) -> ProvisionResult:
        """Creates the target StatefulSet and its headless Service from the source, and waits until it is Ready.

        Checks everything first and writes nothing when one check fails (InvalidSpec, not
        retried): the source StatefulSet and stable Service exist and the Service has a
        selector; the source is not the target of a Migration that has not finished, nor the
        source of one created before this one that may still undo; the stable Service does
        not already select the target's Pods (a live target, switched by an earlier run); no
        StatefulSet, Service or claim with the target's names exists unless it carries this
        Migration's uid; the StorageClass exists; and the API server accepts both objects in a dry run. Idempotent: both
        objects are created, labelled with the Migration's uid, so a retry finds them its own
        and server-side applies the same manifests again; a name another Migration took after
        the checks is refused (`_create_or_apply`). Refuses (Overtaken,
        writing nothing) when the source carries the fence of a later action of this Migration (see above).
        """
        ref, target = input.ref, input.spec.target.stateful_set
        headless, stateful_set = self._checked_manifests(ref, input.spec)
        self._refuse_if_overtaken(ref, input.spec.source.stateful_set)

        core, apps = self._core, self._apps
        self._create_or_apply(
            ref, "Service", core.read_namespaced_service, core.create_namespaced_service,
            core.patch_namespaced_service, headless,
        )  # fmt: skip
        self._create_or_apply(
            ref, "StatefulSet", apps.read_namespaced_stateful_set, apps.create_namespaced_stateful_set,
            apps.patch_namespaced_stateful_set, stateful_set,
        )  # fmt: skip
        activity.logger.info("applied StatefulSet and Service %s/%s for Migration %s", ref.namespace, target, ref)

        started = time.monotonic()

        def ready_or_why_not() -> Progress:
            stateful_set = self._apps.read_namespaced_stateful_set(target, ref.namespace)
            progress = checks.stateful_set_ready(stateful_set, all_updated=True)
            waited = time.monotonic() - started
            if progress.done or waited < LOOK_WHY_AFTER:
                return progress
            refused, waiting = self._why_not_ready(stateful_set)
            missing = ((stateful_set.status and stateful_set.status.replicas) or 0) < progress.counts["desired"]
            if refused and missing and waited >= REFUSAL_GRACE:
                raise TargetRefused(
                    f"the cluster refuses what StatefulSet {ref.namespace}/{target} needs: {'; '.join(refused)}. Fix "
                    "the cause (a ResourceQuota, a LimitRange, Pod Security admission or a webhook of the namespace), "
                    "or delete the Migration; the next attempt of provision waits again, and after the last one the "
                    "Migration rolls back (nothing but the target exists yet)."
                )
            shown = "; ".join([*refused, *waiting])
            return dataclasses.replace(progress, waiting_for=f"{progress.waiting_for}: {shown}") if shown else progress

        ready = self._wait(ready_or_why_not)
        return ProvisionResult(stateful_set=target, service=target, ready_replicas=ready.counts["ready"])

    def _why_not_ready(self, stateful_set: Any) -> tuple[list[str], list[str]]:
        """(What the API server refused the StatefulSet's controller since ferry made it, what its Pods wait for).
        Best effort: a read that fails (no access to Events, say) leaves its part empty."""
        namespace, uid = stateful_set.metadata.namespace, stateful_set.metadata.uid
        refused: list[str] = []
        waiting: list[str] = []
        try:
            events = self._core.list_namespaced_event(namespace, field_selector=f"involvedObject.uid={uid}").items
            refused = blocked.refused_creates(events, stateful_set.metadata.creation_timestamp)
        except ApiException as error:
            activity.logger.info("could not list the Events of StatefulSet %s (%s)", stateful_set.metadata.name, error)
        try:
            waiting = blocked.waiting_on(self._pods_of(stateful_set))
        except ApiException as error:
            activity.logger.info("could not list the Pods of StatefulSet %s (%s)", stateful_set.metadata.name, error)
        return refused, waiting

    @activity.defn(name=KubeActivity.CHECK_CLUSTER.value)
    @explain_refusals
    def check_cluster(self, input: ProvisionInput) -> None:
        """What provision checks before its first write, run by the precheck: a Migration that cannot work on this
        cluster (a live or foreign target, a missing source or StorageClass) ends before anything changes.

        Names, in a Warning Event, the Pods the stable Service selects beside the source's,
        which switch-traffic takes its traffic from. Reads only otherwise (the API server's
        dry run stores nothing); the Event is recorded once per Migration, so it is idempotent.
        It heartbeats throughout: its calls, each waiting up to a read timeout for a slow API
        server, may outlast the heartbeat timeout together, and the attempt would be taken for
        lost instead of failing with the API server's error.
        """
        with Heartbeats(self._settings.poll_interval):
            self._checked_manifests(input.ref, input.spec)
            self._refuse_secrets_naming_other_pods(input.ref, input.spec)
            self._name_other_pods_selected(input.ref, input.spec)
        activity.logger.info("the cluster has what Migration %s needs", input.ref)

    def _refuse_secrets_naming_other_pods(self, ref: MigrationRef, spec: MigrationSpec) -> None:
        """Refuses a database Secret whose host is a Pod of another StatefulSet than the one its side names (a Secret
        copied from another Migration, say): ferry would copy from, or restore into, that StatefulSet's database while
        switch-traffic sends the clients to the target's Pods, which would hold none of it; a rollback would then
        delete the target, and the copy with it. Only a host that names, by its stable DNS name, a Pod of a StatefulSet
        that exists under that Service is refused: an IP address or any other name is not known to be wrong. A
        Secret that cannot be read is left to the precheck, which says why."""
        sides = (
            (
                "spec.driver.sourceSecret",
                spec.driver.source_secret,
                spec.source.stateful_set,
                "spec.source.statefulSet",
            ),
            (
                "spec.driver.targetSecret",
                spec.driver.target_secret,
                spec.target.stateful_set,
                "spec.target.statefulSet",
            ),
        )
        for field, secret, expected, side in sides:
            host = self._secret_host(ref.namespace, secret)
            named = kube_objects.pod_named_by(host, ref.namespace) if host else None
            if named is None or named[0] == expected:
                continue
            other, service = named
            found = kube_calls.read_json_or_none(self._apps.read_namespaced_stateful_set, other, ref.namespace)
            if found is None or found["spec"].get("serviceName") != service:
                continue
            raise InvalidSpec(
                f"{field}: Secret {ref.namespace}/{secret} reaches its database at {host}, a Pod of StatefulSet "
                f"{other}, not of {expected} ({side}): ferry would work on {other}'s database while switch-traffic "
                f"moves the clients from {spec.source.stateful_set}'s Pods to {spec.target.stateful_set}'s. Set its "
                f"host to a Pod of {expected} (<{expected}-0>.<its serviceName>), or, if {other} is meant, delete the "
                "Migration and create it again naming it. Nothing changed."
            )

    def _secret_host(self, namespace: str, name: str) -> str | None:
        """The `host` of a database Secret; None when it cannot be read or has none."""
        try:
            secret = self._core.read_namespaced_secret(name, namespace)
        except ApiException as error:
            if error.status in (403, 404):
                return None
            raise
        encoded = (secret.data or {}).get("host")
        if not encoded:
            return None
        try:
            return base64.b64decode(encoded).decode().strip() or None
        except (ValueError, UnicodeDecodeError):
            return None

    @activity.defn(name=KubeActivity.UNDO_PROVISION.value)
    @explain_refusals
    def undo_provision(self, input: UndoProvisionInput) -> None:
        """Deletes the target StatefulSet, its headless Service and its claims if they carry this Migration's uid.

        First scales its own target to 0 and waits until the StatefulSet controller has seen
        that, so that it makes no claim after the deletion (see `_stop_making_claims`). Waits
        until the Pods and claims with this uid are gone. Safe whatever provision
        did: absent objects are skipped, and anything under the target's names that is
        not this Migration's (another Migration's, an older ferry's, someone else's) is
        left alone with a warning naming it. A target that some Service still sends
        traffic to (its undo_switch_traffic has not run or failed) is not deleted: the
        activity fails, retryably, saying so. Idempotent: deletions are conditional on
        the object as read (uid and resourceVersion), NotFound counts as deleted, and a
        second run finds nothing of this Migration's left. First it fences the source
        StatefulSet (see above), even when there is nothing to delete.
        """
        ref, target = input.ref, input.stateful_set
        self._fence_source(ref)
        own_target = kube_calls.read_json_or_none(self._apps.read_namespaced_stateful_set, target, ref.namespace)
        if own_target is not None and belongs_to(own_target, ref):
            deleting = f"deleting StatefulSet {ref.namespace}/{target}"
            serving.refuse_while_serving(self._core, self._discovery, ref, target, deleting)
            self._stop_making_claims(ref, own_target)

        read_claim = self._core.read_namespaced_persistent_volume_claim
        deletions: list[tuple[str, Callable[..., Any], Callable[..., Any], str]] = [
            ("StatefulSet", self._apps.read_namespaced_stateful_set, self._apps.delete_namespaced_stateful_set, target),
            ("Service", self._core.read_namespaced_service, self._core.delete_namespaced_service, target),
        ]
        claims = self._core.list_namespaced_persistent_volume_claim(
            ref.namespace, label_selector=f"{STATEFULSET_LABEL}={target}"
        ).items
        for claim in claims:
            delete_claim = self._core.delete_namespaced_persistent_volume_claim
            deletions.append(("PersistentVolumeClaim", read_claim, delete_claim, claim.metadata.name))
        for deletion in deletions:
            kube_calls.retry_on_conflict(functools.partial(self._delete_if_own, ref, *deletion))

        empty_polls = 0

        def pods_and_claims_gone() -> Progress:
            nonlocal empty_polls
            selector = own_selector(ref, **{STATEFULSET_LABEL: target})
            pods = self._core.list_namespaced_pod(ref.namespace, label_selector=selector).items
            claims = self._core.list_namespaced_persistent_volume_claim(ref.namespace, label_selector=selector).items
            # The StatefulSet controller, acting on its cached copy, can create a claim after the listing
            # above (a provision cancelled right after its apply): nobody else would ever delete it.
            for claim in claims:
                if claim.metadata.deletion_timestamp is None:
                    kube_calls.retry_on_conflict(
                        functools.partial(
                            self._delete_if_own,
                            ref,
                            "PersistentVolumeClaim",
                            read_claim,
                            self._core.delete_namespaced_persistent_volume_claim,
                            claim.metadata.name,
                        )
                    )
            # Done at the second empty poll in a row, one poll interval apart: a claim created from a stale cache
            # just before the first one is seen (and deleted) by the second.
            empty_polls = empty_polls + 1 if not pods and not claims else 0
            left = checks.gone(f"Pods and claims of StatefulSet {ref.namespace}/{target}", [*pods, *claims])
            return dataclasses.replace(left, done=empty_polls >= 2)

        self._wait(pods_and_claims_gone)
        activity.logger.info("nothing of Migration %s (uid %s) is left under %s", ref, ref.uid, target)

    def _stop_making_claims(self, ref: MigrationRef, stateful_set: dict[str, Any]) -> None:
        """Scales the target to 0 and waits until the StatefulSet controller has seen it (observedGeneration), before
        anything is deleted.

        The controller creates a Pod's claim as it creates the Pod, acting on its cached copy of
        the StatefulSet, and a claim it creates has no owner: deleted from under a sync still
        under way (a provision cancelled right after its apply, a controller slow under load),
        the StatefulSet leaves a claim and its volume that nobody would ever delete, under the
        target's names. Once the controller has written that it saw replicas 0, every later sync
        of it reads a copy at least that new, which creates nothing; the syncs of one StatefulSet
        never overlap, so the one that made any claim has ended, and the listing below finds it.
        A StatefulSet that changed meanwhile (another object: its uid) is left to the checks
        below; one already gone has nothing more to make.
        """
        metadata = stateful_set["metadata"]
        scale = [
            {"op": "test", "path": "/metadata/uid", "value": metadata["uid"]},
            {"op": "replace", "path": "/spec/replicas", "value": 0},
        ]
        try:
            scaled = self._apps.patch_namespaced_stateful_set(
                metadata["name"], ref.namespace, scale, _content_type=kube_calls.JSON_PATCH
            )
        except ApiException as error:
            if kube_calls.is_not_found(error):
                return
            if error.status == 422:  # a failed test: another object under the name, unless the patch was refused
                read = self._apps.read_namespaced_stateful_set
                now = kube_calls.read_json_or_none(read, metadata["name"], ref.namespace)
                if now is None or now["metadata"]["uid"] != metadata["uid"]:
                    return
            raise
        generation = scaled.metadata.generation or 0

        def seen() -> Progress:
            current = kube_calls.read_or_none(self._apps.read_namespaced_stateful_set, metadata["name"], ref.namespace)
            observed = (current.status.observed_generation or 0) if current is not None and current.status else 0
            return Progress(
                done=current is None or current.metadata.uid != metadata["uid"] or observed >= generation,
                waiting_for=(
                    f"the StatefulSet controller to see StatefulSet {ref.namespace}/{metadata['name']} scaled to 0 "
                    "(so that it makes no claim after the deletion)"
                ),
                counts={"generation": generation, "observed_generation": observed},
            )

        self._wait(seen)

    # --- provision's checks ------------------------------------------------------------------

    def _checked_manifests(self, ref: MigrationRef, spec: MigrationSpec) -> tuple[dict[str, Any], dict[str, Any]]:
        """The headless Service and StatefulSet to apply, once every check passed; nothing is written here."""
        source = self._read_named_in_spec(
            self._apps.read_namespaced_stateful_set, spec.source.stateful_set, ref, "spec.source.statefulSet"
        )
        self._refuse_unfinished_source(ref, source)
        refuse_claims_deleted_when_scaled(source, ref)
        self._refuse_source_another_moves(ref, spec.source.stateful_set)
        service = self._read_named_in_spec(
            self._core.read_namespaced_service, spec.source.service, ref, "spec.source.service"
        )
        if not service["spec"].get("selector"):
            raise InvalidSpec(
                f"spec.source.service: Service {ref.namespace}/{spec.source.service} has no selector, and ferry "
                "moves traffic by changing it. Migrate only StatefulSets whose clients use a Service with a selector."
            )
        self._refuse_service_elsewhere(ref, spec, service, source)
        selectors = self._service_selectors(ref, source)
        stateful_set = kube_objects.target_stateful_set(source, service, ref, spec.target, selectors)
        headless = kube_objects.headless_service(service, ref, spec.target)

        target = spec.target.stateful_set
        existing = kube_calls.read_json_or_none(self._apps.read_namespaced_stateful_set, target, ref.namespace)
        self._refuse_live(ref, service, existing, stateful_set)
        self._refuse_foreign(ref, "StatefulSet", existing, target)
        existing_service = kube_calls.read_json_or_none(self._core.read_namespaced_service, target, ref.namespace)
        self._refuse_foreign(ref, "Service", existing_service, target)
        # The StatefulSet controller would give its Pods existing claims of their claim names: someone else's data.
        for template in stateful_set["spec"]["volumeClaimTemplates"]:
            for ordinal in range(spec.target.replicas):
                name = f"{template['metadata']['name']}-{target}-{ordinal}"
                claim = kube_calls.read_json_or_none(
                    self._core.read_namespaced_persistent_volume_claim, name, ref.namespace
                )
                self._refuse_foreign(ref, "PersistentVolumeClaim", claim, name)
        self._refuse_missing_storage_classes(ref, spec, stateful_set)
        # Last, the API server's own validation and admission, storing nothing: its refusal (422) changes nothing.
        kube_calls.apply(self._core.patch_namespaced_service, headless, self._settings.field_manager, dry_run=True)
        kube_calls.apply(
            self._apps.patch_namespaced_stateful_set, stateful_set, self._settings.field_manager, dry_run=True
        )
        return headless, stateful_set

    def _refuse_service_elsewhere(
        self, ref: MigrationRef, spec: MigrationSpec, service: dict[str, Any], source: dict[str, Any]
    ) -> None:
        """Refuses a stable Service that does not send its traffic to the source.

        switch-traffic takes the Service's traffic from wherever it goes: a Service that
        selects another database's Pods (a mistyped spec.source.service, or one another
        Migration switched to its own target) would have its clients moved to a copy of
        a database they never used. A Service this Migration already switched (its own
        target's selector, with its own target) is its own step's work, not a refusal.
        """
        selector: dict[str, str] = service["spec"]["selector"]
        if self._selects_source(ref.namespace, selector, source):
            return
        if selector == {STATEFULSET_LABEL: spec.target.stateful_set}:
            return  # left to _refuse_live, which tells this Migration's switch from another's
        switched_by = records.switched_by(records.selector_record(kube_calls.annotations_of(service)))
        raise InvalidSpec(
            f"spec.source.service: Service {ref.namespace}/{spec.source.service} does not send its traffic to "
            f"StatefulSet {spec.source.stateful_set}: its selector {selector}{switched_by} selects none of its Pods. "
            "ferry moves that Service's traffic from the source to the target, and changed nothing. Name the Service "
            f"the source's clients use, then delete Migration {ref} and create it again."
        )

    def _refuse_unfinished_source(self, ref: MigrationRef, source: dict[str, Any]) -> None:
        """Refuses a source that another Migration made as its target and that Migration has not finished.

        Until it has, that Migration may still roll back (its Pause, its rollback, its
        deletion), and its rollback empties and deletes its target: this Migration's source,
        taken from under it while it copies, and the way its own rollback would send traffic
        back to. A finished Migration undoes nothing more, so chaining waits for it; unless
        it is being deleted, since a deletion asked for while it ran rolls back even a run
        that succeeded meanwhile (`Migration.may_still_undo`).
        """
        labels = labels_of(source)
        uid, name = labels.get(MIGRATION_UID_LABEL), labels.get(MIGRATION_LABEL)
        if not uid or not name or uid == ref.uid:
            return
        maker = self._read_migration(ref.namespace, name)
        if maker is None:
            return
        migration = Migration.parse(maker)
        if migration.metadata.uid != uid or not migration.may_still_undo:
            return
        if migration.finished:
            wait = f"Wait until Migration {name} is gone and, if StatefulSet {name_of(source)} is still there"
        else:
            wait = f"Wait until Migration {name} is Succeeded"
        raise InvalidSpec(
            f"spec.source.statefulSet: StatefulSet {ref.namespace}/{name_of(source)} is the target of Migration "
            f"{ref.namespace}/{name} (uid {uid}), {_why_it_may_still_undo(migration)}, and its rollback deletes "
            f"that StatefulSet. ferry changed nothing. {wait}, delete Migration {ref} and create it again."
        )

    def _refuse_source_another_moves(self, ref: MigrationRef, source_name: str) -> None:
        """Refuses a source that another Migration, created before this one, moves and may still undo.

        A Migration moves one database, but its scale-down-old stops the source's whole
        server, and its rollback sends the clients back to it: a second Migration of the same
        StatefulSet (another database on that server, or the same one to another target)
        would lose its source while it copies or is frozen, and then could not unfreeze it.
        So one Migration at a time moves a source: the one created first. Of two created in
        the same second, whichever checks once both exist is refused (creation times have
        whole seconds), so the two are never both accepted. A dry run changes nothing and is
        no reason to refuse.
        """
        mine = self._read_migration(ref.namespace, ref.name)
        ours = mine is not None and mine["metadata"].get("uid") == ref.uid
        created = Migration.parse(mine).metadata.creation_timestamp if ours and mine is not None else None
        for raw in self._migrations_of_source(ref.namespace, source_name):
            other = Migration.parse(raw)
            if (
                other.metadata.uid == ref.uid
                or (other.spec is not None and other.spec.dry_run)
                or not other.may_still_undo
                or not other.created_no_later_than(created)
            ):
                continue
            name = other.metadata.name
            if created is not None and other.metadata.creation_timestamp == created:
                when = "created in the same second as this one (creation times have whole seconds, so ferry cannot "
                when += "tell which came first, and refuses both rather than guess)"
                wait = f"Roll back or delete one of the two; once Migration {name} is gone, or has finished,"
            else:
                when = "created before this one"
                wait = f"Wait until Migration {name} {'is gone' if other.finished else 'has finished'}, then"
            raise InvalidSpec(
                f"spec.source.statefulSet: StatefulSet {ref.namespace}/{source_name} is the source of Migration "
                f"{ref.namespace}/{name} (uid {other.metadata.uid}), {when}, {_why_it_may_still_undo(other)}. One "
                "Migration moves a source at a time: its scale-down-old stops that StatefulSet's whole server, this "
                "Migration's database on it too, and its rollback sends the clients back to it. ferry changed "
                f"nothing. {wait} delete Migration {ref} and create it again."
            )

    def _migrations_of_source(self, namespace: str, source_name: str) -> list[dict[str, Any]]:
        """The Migrations of `namespace` whose spec.source.statefulSet is `source_name`, as raw JSON.

        Selected by the API server (the CRD's selectableFields, Kubernetes 1.31 or newer); where
        it cannot select by that field (an older CRD, or 1.30 without the feature), every
        Migration of the namespace is listed, a page at a time, and this side picks them.
        """
        list_migrations = functools.partial(
            self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL
        )
        try:
            listed: dict[str, Any] = list_migrations(field_selector=f"{SOURCE_FIELD}={source_name}")
            return list(listed.get("items", []))
        except ApiException as error:
            if kube_calls.is_not_found(error):
                return []  # no Migration CRD: no Migration either
            if error.status != 400:
                raise
            activity.logger.info(
                "the API server does not select Migrations by %s (%s): listing all of namespace %s",
                SOURCE_FIELD, server_message(error), namespace,
            )  # fmt: skip
        found: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = list_migrations(limit=MIGRATIONS_PAGE, _continue=token)
            found.extend(raw for raw in page.get("items", []) if _source_of(raw) == source_name)
            token = page.get("metadata", {}).get("continue")
            if not token:
                return found

    def _name_other_pods_selected(self, ref: MigrationRef, spec: MigrationSpec) -> None:
        """A Warning Event naming the Pods the stable Service selects beside the source's: they lose its traffic.

        switch-traffic points the Service at the target's Pods alone; an exporter or a pooler
        labelled like the database gets none of its traffic until a rollback points it back.
        Recorded once per Migration (events.py), so the precheck's retries add nothing.
        """
        service, source = spec.source.service, spec.source.stateful_set
        selector = self._core.read_namespaced_service(service, ref.namespace).spec.selector or {}
        pods = self._core.list_namespaced_pod(ref.namespace, label_selector=kube_objects.label_selector(selector))
        others = sorted(
            pod.metadata.name
            for pod in pods.items
            if not kube_objects.is_pod_of(source, pod.metadata.name) and not belongs_to(pod, ref)
        )
        if not others:
            return
        shown = ", ".join(others[:OTHER_PODS_SHOWN]) + (
            f" and {len(others) - OTHER_PODS_SHOWN} more" if len(others) > OTHER_PODS_SHOWN else ""
        )
        message = (
            f"Service {ref.namespace}/{service} also selects Pods that are not StatefulSet {source}'s: {shown}. "
            "switch-traffic points it at the target's Pods alone, so from then on they get none of its traffic "
            "(a rollback gives it back). If they must keep it, give them a Service of their own before the switch."
        )
        activity.logger.warning("%s", message)
        record_event(
            self._core,
            ref,
            type=EventType.WARNING,
            reason=SERVICE_SELECTS_OTHER_PODS,
            message=message,
            key="precheck.service-selects-other-pods",
            component=REPORTING_COMPONENT,
            instance=self._settings.reporting_instance,
        )

    def _service_selectors(self, ref: MigrationRef, source: dict[str, Any]) -> dict[str, dict[str, str]]:
        """Every Service's selector in the namespace, by name; logs those that select the source's Pods.

        Read on every attempt: a Service created between two attempts of provision changes
        the target's Pod labels, and the StatefulSet controller rolls its Pods (empty still).
        """
        selectors = {
            item.metadata.name: dict(item.spec.selector)
            for item in self._core.list_namespaced_service(ref.namespace).items
            if item.spec is not None and item.spec.selector
        }
        labels = ((source["spec"]["template"].get("metadata") or {}).get("labels")) or {}
        selecting = kube_objects.services_selecting(labels, selectors)
        if selecting:
            activity.logger.info(
                "the target's Pods leave out the labels that Services %s select the source's Pods by: %s",
                ", ".join(selecting), ", ".join(sorted({key for name in selecting for key in selectors[name]})),
            )  # fmt: skip
        return selectors

    def _refuse_live(
        self, ref: MigrationRef, service: dict[str, Any], existing: dict[str, Any] | None, manifest: dict[str, Any]
    ) -> None:
        """Refuses when the stable Service was switched to the target's Pods, unless the target is this Migration's.

        switch-traffic selects the target's Pods by ferry's label `STATEFULSET_LABEL=<target>`:
        a stable Service selecting it was switched, by an earlier run, to a live database.
        """
        if existing is not None and belongs_to(existing, ref):
            return
        selector: dict[str, str] = service["spec"]["selector"]
        target, name = manifest["metadata"]["name"], service["metadata"]["name"]
        if selector.get(STATEFULSET_LABEL) != target:
            return
        switched_by = records.switched_by(records.selector_record(kube_calls.annotations_of(service)))
        made_by = f", and StatefulSet {target} belongs to {owner(existing)}" if existing is not None else ""
        raise InvalidSpec(
            f"spec.target.statefulSet: the target {ref.namespace}/{target} already serves traffic: Service "
            f"{ref.namespace}/{name} selects its Pods (selector {selector}{switched_by}){made_by}. ferry changed "
            f"nothing and will not provision over a live database: delete Migration {ref} (the live target stays), "
            "or to migrate again create a Migration with another spec.target.statefulSet."
        )

    def _create_or_apply(
        self,
        ref: MigrationRef,
        kind: str,
        read: Callable[..., Any],
        create: Callable[..., Any],
        patch: Callable[..., Any],
        manifest: dict[str, Any],
    ) -> None:
        """Creates the object when it does not exist, else applies the manifest to it if it is this Migration's.

        A server-side apply creates or takes over alike: two Migrations naming one target,
        whose checks both ran before either wrote, would relabel each other's objects, and
        each undo would then delete the other's. A create is refused (409) when the name is
        taken, so the first Migration to write keeps the target, and the other refuses here
        as its checks would have, having written nothing. An object of this Migration's (an
        earlier attempt made it) gets the same manifest applied again.
        """
        name = manifest["metadata"]["name"]
        existing = kube_calls.read_json_or_none(read, name, ref.namespace)
        if existing is None:
            try:
                create(ref.namespace, manifest, field_manager=self._settings.field_manager)
                return
            except ApiException as error:
                if not kube_calls.is_conflict(error):
                    raise
            existing = kube_calls.read_json_or_none(read, name, ref.namespace)
            if existing is None:
                raise ApplicationError(
                    f"{kind} {ref.namespace}/{name} was created and deleted by someone else while provision created "
                    "it; provision is retried from its checks."
                )
        self._refuse_foreign(ref, kind, existing, name)
        kube_calls.apply(patch, manifest, self._settings.field_manager)

    def _refuse_foreign(self, ref: MigrationRef, kind: str, existing: dict[str, Any] | None, name: str) -> None:
        if existing is None or belongs_to(existing, ref):
            return
        raise InvalidSpec(
            f"spec.target.statefulSet: {kind} {ref.namespace}/{name} already exists and belongs to {owner(existing)}, "
            f"not to Migration {ref} (uid {ref.uid}); ferry takes over nothing and changed nothing. Delete Migration "
            f"{ref} and create it again with another spec.target.statefulSet, or remove that {kind} if it is left over."
        )

    def _refuse_missing_storage_classes(self, ref: MigrationRef, spec: MigrationSpec, manifest: dict[str, Any]) -> None:
        """A claim of a StorageClass that does not exist never binds, and the target would never become Ready."""
        wanted = {template["spec"].get("storageClassName") for template in manifest["spec"]["volumeClaimTemplates"]}
        missing = sorted(name for name in wanted if name and not self._storage_class_exists(name))
        if not missing:
            return
        classes = ", ".join(sorted(item.metadata.name for item in self._storage.list_storage_class().items))
        if spec.target.storage_class_name is not None:
            said = f"spec.target.storageClassName: StorageClass {missing[0]!r} does not exist"
        else:
            said = (
                f"spec.target.storageClassName: the source's volumeClaimTemplates name StorageClass {missing[0]!r}, "
                "which does not exist"
            )
        raise InvalidSpec(
            f"{said}, so the target's volumes could never be provisioned; the cluster has {classes or 'none'}. "
            f"ferry changed nothing: delete Migration {ref} and create it again naming one of those."
        )

    def _storage_class_exists(self, name: str) -> bool:
        try:
            self._storage.read_storage_class(name)
        except ApiException as error:
            if kube_calls.is_not_found(error):
                return False
            raise
        return True

    def _refuse_if_overtaken(self, ref: MigrationRef, source_name: str) -> None:
        """Refuses (Overtaken) once a later action of this Migration fenced the source: an undo_provision, which
        deleted the target this attempt would now create again, or a later step. Read right before the applies, to
        leave a late attempt the least time between this check and its writes (see the module's docstring)."""
        source = self._read_named_in_spec(
            self._apps.read_namespaced_stateful_set, source_name, ref, "spec.source.statefulSet"
        )
        fences.refuse_if_overtaken(source, ref, "create the target")

    # --- undo_provision's parts --------------------------------------------------------------

    def _fence_source(self, ref: MigrationRef) -> None:
        """Writes this undo's fence on the source StatefulSet, which a late provision checks before it creates.

        The source is the Migration's spec.source.statefulSet, read from the Migration of this uid; with no such
        Migration (deleted, or created again under its name) nothing is fenced.
        """
        source_name = self._source_of(ref)
        if source_name is None:
            activity.logger.warning(
                "Migration %s (uid %s) is gone: its source is not fenced against a late provision", ref, ref.uid
            )
            return

        def fence() -> None:
            source = kube_calls.read_json_or_none(self._apps.read_namespaced_stateful_set, source_name, ref.namespace)
            if source is None or fences.is_fenced(source, ref):
                return
            operation = fences.fenced_annotations(source, ref, "remove the target")
            kube_calls.patch_if_unchanged(self._apps.patch_namespaced_stateful_set, source, [operation])

        kube_calls.retry_on_conflict(fence)

    def _delete_if_own(
        self, ref: MigrationRef, kind: str, read: Callable[..., Any], delete: Callable[..., Any], name: str
    ) -> None:
        found = kube_calls.read_json_or_none(read, name, ref.namespace)
        if found is None:
            return
        if not belongs_to(found, ref):
            activity.logger.warning(
                "leaving %s %s/%s: it belongs to %s, not to Migration %s (uid %s)",
                kind, ref.namespace, name, owner(found), ref, ref.uid,
            )  # fmt: skip
            return
        metadata = found["metadata"]
        kube_calls.delete_if_unchanged(delete, name, ref.namespace, metadata["uid"], metadata["resourceVersion"])


def _why_it_may_still_undo(migration: Migration) -> str:
    """Why a Migration another one depends on may still undo what it did (`Migration.may_still_undo`), for refusals."""
    phase = migration.status.phase.value if migration.status.phase else "not set yet"
    if migration.status.history_gone:
        return (
            "which Temporal lost before it finished (phase Abandoned, reason HistoryGone): deleting it undoes what its "
            "steps recorded"
        )
    if migration.finished:
        return (
            f"which is being deleted (phase {phase}): a deletion asked for before it finished rolls it back, even "
            "once it has succeeded"
        )
    return f"which has not finished (phase {phase}): until it has, it may roll back"


def _source_of(raw: dict[str, Any]) -> object:
    """A raw Migration's spec.source.statefulSet, None where it has none."""
    return ((raw.get("spec") or {}).get("source") or {}).get("statefulSet")
