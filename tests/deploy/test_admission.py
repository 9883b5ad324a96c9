"""deploy/admission on the real API server: who may give a control, which images and S3 endpoints a plan may name,
and (deploy/admission/finalizer) ferry's finalizer on every new Migration.

The local stack applies deploy/admission as a cluster running ferry has it (devstack/stack/admission.py). Users
are impersonated (`kubectl --as`) with the roles a test binds them in its namespace, so every refusal here is the
API server's own, as the person sees it. No watcher or worker runs (the watcher's writes are made by its code);
tests/operator/test_authorized_controls.py follows controls the whole way, to the status.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from ferry.api.migration import FINALIZER
from ferry.api.saga import MigrationRef, Signal
from ferry.clients import kubernetes_client
from ferry.kubectl.controls import who_from_username
from tests import samples
from tests.cluster import created_finalizers, eventually, without_finalizer_at_create
from tests.conftest import Kubectl, grant
from tests.deploy.conftest import ServiceAccountKubeconfig
from tests.deploy.files import DEPLOY, SYSTEM_NAMESPACE, documents, find
from watcher.kube import Kube
from watcher.patching import MigrationWriter

NAME = "orders-db-to-16"
OTHER = "example.com/backup-first"
"""Another controller's finalizer."""
CONTROLS = [signal.value for signal in Signal]
GRANTS = "(the ClusterRole ferry-operator grants every control, ferry-approver approve)"
ALLOWLISTS = DEPLOY / "admission" / "allowlists.yaml"
POLICY_SEES = 60.0
"""Seconds the API server may take to act on a changed allowlist (its admission plugin reads them from an informer)."""


def _as(kubectl: Kubectl, user: str, *args: str, groups: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """kubectl as another user (the admin impersonates it); returns the result, failed or not."""
    return kubectl(f"--as={user}", *(f"--as-group={group}" for group in groups), *args, check=False)


def _annotate(kubectl: Kubectl, namespace: str, user: str, *annotations: str) -> subprocess.CompletedProcess[str]:
    return _as(kubectl, user, "annotate", "--overwrite", "migration", NAME, "-n", namespace, *annotations)


def _refusal(result: subprocess.CompletedProcess[str], policy: str = "ferry-controls") -> str:
    """The policy's own message in kubectl's one-line error; fails when the request went through or RBAC refused it."""
    assert result.returncode != 0, f"the request went through: {result.stdout}"
    prefix, found, message = result.stderr.strip().partition(f"ValidatingAdmissionPolicy '{policy}' with binding ")
    assert found, result.stderr
    assert prefix.startswith("Error from server (Forbidden): "), result.stderr
    return message.split(" denied request: ", 1)[1]


def _annotations(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    migration = json.loads(kubectl("get", "migration", NAME, "-n", namespace, "-o", "json").stdout)
    found: dict[str, str] = migration["metadata"].get("annotations") or {}
    return {key: value for key, value in found.items() if key.startswith("ferry.dev/")}


@pytest.fixture
def migration(kubectl: Kubectl, migration_crd: str, control_roles: None, namespace: str) -> str:
    """A Migration in the test's namespace, created by the admin; nothing runs it, the policy needs no workflow."""
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(samples.migration(NAME)))
    return NAME


@pytest.fixture
def patcher(kubectl: Kubectl, namespace: str) -> str:
    """dave, who may read and patch Migrations in the namespace, and nothing more."""
    role = "migration-patcher"
    kubectl("create", "role", role, "--verb=get,patch", "--resource=migrations.ferry.dev", "-n", namespace)
    kubectl("create", "rolebinding", role, f"--role={role}", "--user=dave", "-n", namespace)
    return "dave"


def test_the_stacks_policies_are_deploys_and_type_check_against_the_migration_schema(
    kubectl: Kubectl, migration_crd: str
) -> None:
    for name in ("ferry-controls", "ferry-plan", "ferry-secrets", "ferry-named-objects"):
        policy = json.loads(kubectl("get", "validatingadmissionpolicy", name, "-o", "json").stdout)
        binding = json.loads(kubectl("get", "validatingadmissionpolicybinding", name, "-o", "json").stdout)

        assert policy["spec"]["validations"] == find(documents(DEPLOY / "admission"), "ValidatingAdmissionPolicy",
                                                     name)["spec"]["validations"]  # fmt: skip
        assert binding["spec"]["policyName"] == name
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert not policy["status"].get("typeChecking", {}).get("expressionWarnings"), policy["status"]


def test_the_stacks_finalizer_policy_is_deploys_and_type_checks_against_the_migration_schema(
    kubectl: Kubectl, migration_crd: str
) -> None:
    policy = json.loads(kubectl("get", "mutatingadmissionpolicy", "ferry-finalizer", "-o", "json").stdout)
    binding = json.loads(kubectl("get", "mutatingadmissionpolicybinding", "ferry-finalizer", "-o", "json").stdout)
    files = documents(DEPLOY / "admission" / "finalizer")

    assert policy["spec"]["mutations"] == find(files, "MutatingAdmissionPolicy", "ferry-finalizer")["spec"]["mutations"]
    wanted = find(files, "MutatingAdmissionPolicyBinding", "ferry-finalizer")["spec"]
    assert binding["spec"]["policyName"] == wanted["policyName"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == wanted["matchResources"]["namespaceSelector"]
    assert not (policy.get("status") or {}).get("typeChecking", {}).get("expressionWarnings"), policy.get("status")


def _created_finalizers(kube_api: k8s.ApiClient, namespace: str, finalizers: list[str] | None) -> list[str]:
    """The finalizers a Migration created with `finalizers` would have (a server-side dry run: nothing is kept)."""
    manifest = samples.migration(NAME)
    if finalizers is not None:
        manifest["metadata"]["finalizers"] = finalizers
    return created_finalizers(kube_api, namespace, manifest)


@pytest.mark.finalizer_at_create
def test_the_api_server_creates_every_migration_holding_ferrys_finalizer_once_unless_its_namespace_opts_out(
    migration_crd: str, namespace: str, kube_api: k8s.ApiClient
) -> None:
    assert _created_finalizers(kube_api, namespace, None) == [FINALIZER]
    assert _created_finalizers(kube_api, namespace, []) == [FINALIZER]
    assert _created_finalizers(kube_api, namespace, [OTHER]) == [OTHER, FINALIZER]
    assert _created_finalizers(kube_api, namespace, [FINALIZER, OTHER]) == [FINALIZER, OTHER]

    without_finalizer_at_create(kube_api, namespace, samples.migration(NAME))

    assert _created_finalizers(kube_api, namespace, None) == []
    assert _created_finalizers(kube_api, namespace, [OTHER]) == [OTHER]


@pytest.mark.finalizer_at_create
def test_the_finalizer_policy_only_acts_on_creates(
    kubectl: Kubectl, migration_crd: str, namespace: str, kube_api: k8s.ApiClient
) -> None:
    """Removing ferry's finalizer (the watcher does, once a deletion's undo is done) must not bring it back."""
    custom = k8s.CustomObjectsApi(kube_api)
    created = custom.create_namespaced_custom_object(
        "ferry.dev", "v1alpha1", namespace, "migrations", samples.migration(NAME)
    )
    assert created["metadata"]["finalizers"] == [FINALIZER]

    patched = custom.patch_namespaced_custom_object(
        "ferry.dev", "v1alpha1", namespace, "migrations", NAME, {"metadata": {"finalizers": None}}
    )

    assert not patched["metadata"].get("finalizers")


def test_the_controls_of_the_policy_and_its_roles_are_the_sagas_signals() -> None:
    policy = find(documents(DEPLOY / "admission"), "ValidatingAdmissionPolicy", "ferry-controls")
    (listed,) = [variable for variable in policy["spec"]["variables"] if variable["name"] == "controls"]
    roles = documents(DEPLOY / "rbac" / "control_roles.yaml")
    operator = find(roles, "ClusterRole", "ferry-operator")["rules"][0]["verbs"]
    approver = find(roles, "ClusterRole", "ferry-approver")["rules"][0]["verbs"]

    # An authorizer check costs about a third of what one expression may spend: one check per expression, so a
    # validation of its own for each control and one for spec.paused.
    checks = [
        re.findall(r"\.check\(([^)]*)\)", validation["expression"]) for validation in policy["spec"]["validations"]
    ]

    assert sorted(yaml.safe_load(listed["expression"])) == sorted(CONTROLS)
    assert all(len(found) <= 1 for found in checks), checks
    assert sorted(found[0] for found in checks if found) == sorted(
        [*(f"'{c}'" for c in CONTROLS), "variables.pausing[0]"]
    )
    assert set(operator) - {"get", "list", "watch", "patch"} == set(CONTROLS)
    assert set(approver) - {"get", "list", "watch", "patch"} == {"approve"}


def test_a_user_who_may_only_patch_is_refused_every_control_with_the_verb_it_needs(
    kubectl: Kubectl, namespace: str, migration: str, patcher: str
) -> None:
    for control in CONTROLS:
        refused = _annotate(kubectl, namespace, patcher, f"ferry.dev/{control}={patcher}: please")

        assert _refusal(refused) == (
            f'user "dave" may not {control} Migration {namespace}/{NAME}: ferry.dev/{control}="dave: please" '
            f'needs the RBAC verb "{control}" on migrations.ferry.dev {GRANTS}'
        )
    # The same user's other writes go through: the refusals are the policy's, not RBAC's.
    assert _as(kubectl, patcher, "label", "migration", NAME, "-n", namespace, "team=orders").returncode == 0
    assert _annotations(kubectl, namespace) == {}


def test_an_approver_approves_but_may_neither_roll_back_nor_pause_and_an_operator_may(
    kubectl: Kubectl, namespace: str, migration: str
) -> None:
    grant(kubectl, namespace, "ferry-approver", user="alice")
    grant(kubectl, namespace, "ferry-operator", user="olga")

    assert _annotate(kubectl, namespace, "alice", "ferry.dev/approve=alice: change 4711").returncode == 0
    rollback = _annotate(kubectl, namespace, "alice", "ferry.dev/rollback=alice")
    pause = _as(kubectl, "alice", "patch", "migration", NAME, "-n", namespace, "--type=merge",
                "-p", '{"spec":{"paused":true}}')  # fmt: skip
    both = _annotate(kubectl, namespace, "alice", "ferry.dev/approve=alice: again", "ferry.dev/retry=alice")

    assert _refusal(rollback) == (
        f'user "alice" may not rollback Migration {namespace}/{NAME}: ferry.dev/rollback="alice" '
        f'needs the RBAC verb "rollback" on migrations.ferry.dev {GRANTS}'
    )
    assert _refusal(pause) == (
        f'user "alice" may not pause Migration {namespace}/{NAME}: changing spec.paused to true needs the RBAC verb '
        '"pause" on migrations.ferry.dev (the ClusterRole ferry-operator grants it)'
    )
    assert _refusal(both) == (
        f'user "alice" may not retry Migration {namespace}/{NAME}: ferry.dev/retry="alice" '
        f'needs the RBAC verb "retry" on migrations.ferry.dev {GRANTS}'
    )
    assert _annotations(kubectl, namespace) == {"ferry.dev/approve": "alice: change 4711"}

    for paused in ("true", "false"):
        patched = _as(kubectl, "olga", "patch", "migration", NAME, "-n", namespace, "--type=merge",
                      "-p", f'{{"spec":{{"paused":{paused}}}}}')  # fmt: skip
        assert patched.returncode == 0, patched.stderr
    assert _annotate(kubectl, namespace, "olga", "ferry.dev/rollback=olga: slow queries").returncode == 0


def test_every_control_goes_in_one_request_when_the_user_may_give_each_and_else_the_first_missing_verb_is_named(
    kubectl: Kubectl, namespace: str, migration: str
) -> None:
    """Each control is its own authorizer check, and one CEL expression may afford only two: they must not add up."""
    grant(kubectl, namespace, "ferry-operator", user="olga")
    every_but_rollback = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "every-control-but-rollback", "namespace": namespace},
        "rules": [{"apiGroups": ["ferry.dev"], "resources": ["migrations"],
                   "verbs": ["get", "patch", *(control for control in CONTROLS if control != "rollback")]}],
    }  # fmt: skip
    kubectl("apply", "-f", "-", stdin=json.dumps(every_but_rollback))
    kubectl("create", "rolebinding", "rita", "--role=every-control-but-rollback", "--user=rita", "-n", namespace)

    def give_all(user: str) -> subprocess.CompletedProcess[str]:
        """Every control's annotation and a pause by spec.paused, in one request: the most checks one can take."""
        change = {"metadata": {"annotations": {f"ferry.dev/{control}": f"{user}: all at once" for control in CONTROLS}},
                  "spec": {"paused": True}}  # fmt: skip
        return _as(kubectl, user, "patch", "migration", NAME, "-n", namespace, "--type=merge", "-p", json.dumps(change))

    refused = give_all("rita")

    assert _refusal(refused) == (
        f'user "rita" may not rollback Migration {namespace}/{NAME}: ferry.dev/rollback="rita: all at once" '
        f'needs the RBAC verb "rollback" on migrations.ferry.dev {GRANTS}'
    )
    assert _annotations(kubectl, namespace) == {}
    given = give_all("olga")
    assert given.returncode == 0, given.stderr
    assert _annotations(kubectl, namespace) == {f"ferry.dev/{control}": "olga: all at once" for control in CONTROLS}
    assert kubectl("get", "migration", NAME, "-n", namespace, "-o", "jsonpath={.spec.paused}").stdout == "true"


def test_a_control_signed_with_another_name_is_refused_naming_the_signature_the_user_must_give(
    kubectl: Kubectl, namespace: str, migration: str
) -> None:
    grant(kubectl, namespace, "ferry-operator", user="olga")

    forged = _annotate(kubectl, namespace, "olga", "ferry.dev/rollback=bob: he said so")
    malformed = _annotate(kubectl, namespace, "olga", "ferry.dev/rollback=not valid!")

    assert _refusal(forged) == (
        'user "olga" may not sign ferry.dev/rollback="bob: he said so" with another name: a control is signed with '
        'the name of the user who gives it, here "olga" (as kubectl ferry signs it)'
    )
    assert 'may not sign ferry.dev/rollback="not valid!" with another name' in _refusal(malformed)
    assert _annotations(kubectl, namespace) == {}


@pytest.mark.parametrize(
    "username",
    [
        "alice@example.com",
        "system:serviceaccount:ci:deployer",
        "https://idp.example.com#Zoe Smith",
        "--weird..name__",
        "::",
        "x" * 70 + ":suffix",
    ],
)
def test_the_policy_takes_exactly_the_signature_kubectl_ferry_makes_of_a_user_name(
    kubectl: Kubectl, namespace: str, migration: str, username: str
) -> None:
    who = who_from_username(username)
    as_admin = ("system:masters",)  # every verb: only the signature is in question

    def pause(value: str) -> subprocess.CompletedProcess[str]:
        return _as(kubectl, username, "annotate", "--overwrite", "--dry-run=server", "migration", NAME,
                   "-n", namespace, f"ferry.dev/pause={value}", groups=as_admin)  # fmt: skip

    signed = pause(f"{who}: for maintenance")
    assert signed.returncode == 0, signed.stderr
    for other in (who + "x", who[:-1] or "x", username):
        if other != who:
            assert "may not sign ferry.dev/pause" in _refusal(pause(other)), other


async def test_removing_a_control_and_the_watchers_own_writes_need_no_control_verb(
    kubectl: Kubectl, namespace: str, migration: str, patcher: str,
    service_account_kubeconfig: ServiceAccountKubeconfig,
) -> None:  # fmt: skip
    grant(kubectl, namespace, "ferry-approver", user="alice")
    assert _annotate(kubectl, namespace, "alice", "ferry.dev/approve=alice").returncode == 0
    uid = kubectl("get", "migration", NAME, "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout
    ref = MigrationRef(namespace=namespace, name=NAME, uid=uid)

    # Every write of watcher/patching.py, by its code, as the ServiceAccount deploy/rbac makes for it (no control verb).
    with contextlib.closing(kubernetes_client(service_account_kubeconfig("ferry-watcher"))) as api:
        kube = Kube(api, "test")
        writer = MigrationWriter(kube)
        seen = await kube.read_migration(ref)
        assert seen is not None
        await writer.hold(seen, "migration/x/y/z")
        await writer.acknowledge(ref, "ferry.dev/approve", "alice", "approved by alice")
        finalized = await kube.read_migration(ref)
        assert finalized is not None
        assert finalized.metadata.finalizers == [FINALIZER]
        await writer.remove_finalizer(finalized)

    removed = _as(kubectl, patcher, "annotate", "migration", NAME, "-n", namespace, "ferry.dev/approve-")
    assert removed.returncode == 0, removed.stderr
    assert _annotations(kubectl, namespace) == {}
    final = json.loads(kubectl("get", "migration", NAME, "-n", namespace, "-o", "json").stdout)
    assert final["metadata"]["annotations"]["watcher.ferry.dev/workflow"] == "migration/x/y/z"
    assert final["status"]["controls"]["acknowledged"] == {"ferry.dev/approve": "alice"}
    assert not final["metadata"].get("finalizers")


# --- the allowlists -------------------------------------------------------------------------------


def _create(kubectl: Kubectl, namespace: str, name: str, image: str, endpoint: str | None) -> Any:
    """A server-side dry run of creating a Migration (admission runs, nothing is kept)."""
    snapshot = {"bucket": "ferry-snapshots", "credentialsSecret": "snapshot-credentials"}
    if endpoint is not None:
        snapshot["endpoint"] = endpoint
    target = {"statefulSet": "orders-db-16", "image": image, "storageSize": "1Gi"}
    manifest = samples.migration(name, target=target, snapshot=snapshot)
    return kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", stdin=json.dumps(manifest), check=False)


Allowlists = Callable[[dict[str, str] | None], None]


@pytest.fixture
def allowlists(kubectl: Kubectl, migration_crd: str, namespace: str) -> Iterator[Allowlists]:
    """Sets the data of ConfigMap ferry-system/ferry-allowlists (None: deletes it); deploy's is restored afterwards.

    Each change returns once the policy acts on it, judged by a probe image that only the old lists allowed.
    """
    shipped = yaml.safe_load(ALLOWLISTS.read_text())

    def probe() -> Any:
        return _create(kubectl, namespace, "probe", "probe.example.com/postgres:16", "https://probe.example.com")

    def change(data: dict[str, str] | None) -> None:
        if data is None:
            kubectl("delete", "-f", str(ALLOWLISTS))
        else:
            kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps({**shipped, "data": data}))
        eventually("the policy to refuse the probe Migration", lambda: probe().returncode != 0, POLICY_SEES)

    yield change
    kubectl("apply", "--server-side", "-f", str(ALLOWLISTS))
    eventually("the policy to allow anything again", lambda: probe().returncode == 0, POLICY_SEES)


def test_a_new_migration_names_only_images_and_endpoints_in_non_empty_allowlists(
    kubectl: Kubectl, namespace: str, migration: str, allowlists: Allowlists
) -> None:
    allowlists({
        "allowedImages": "registry.example.com/postgres:16*\npostgres:16\n",
        "allowedSnapshotEndpoints": "https://s3.example.com\n",
    })  # fmt: skip
    lists = f"of ConfigMap {SYSTEM_NAMESPACE}/ferry-allowlists"

    allowed = [
        _create(kubectl, namespace, "exact", "postgres:16", "https://s3.example.com"),
        _create(kubectl, namespace, "prefixed", "registry.example.com/postgres:16.4", "https://s3.example.com"),
    ]
    image = _create(kubectl, namespace, "image", "postgres:17", "https://s3.example.com")
    endpoint = _create(kubectl, namespace, "endpoint", "postgres:16", "https://s3.elsewhere.example.com")
    unset = _create(kubectl, namespace, "unset", "postgres:16", None)

    assert [result.returncode for result in allowed] == [0, 0], [result.stderr for result in allowed]
    assert _refusal(image, "ferry-plan") == (
        f'user "ferry-admin" may not create Migration {namespace}/image: spec.target.image "postgres:17" is not in '
        f"allowedImages {lists} (registry.example.com/postgres:16*, postgres:16)"
    )
    assert _refusal(endpoint, "ferry-plan") == (
        f'user "ferry-admin" may not create Migration {namespace}/endpoint: spec.snapshot.endpoint '
        f'"https://s3.elsewhere.example.com" is not in allowedSnapshotEndpoints {lists} (https://s3.example.com)'
    )
    assert _refusal(unset, "ferry-plan") == (
        f'user "ferry-admin" may not create Migration {namespace}/unset: spec.snapshot.endpoint is not set (AWS S3 '
        f"of the region), which is not in allowedSnapshotEndpoints {lists} (https://s3.example.com)"
    )
    # The Migration created before, whose endpoint the lists no longer allow, still takes every write.
    kubectl("annotate", "migration", NAME, "-n", namespace, "ferry.dev/pause=ferry-admin")


def test_without_its_allowlists_no_migration_can_be_created_and_existing_ones_still_change(
    kubectl: Kubectl, namespace: str, migration: str, allowlists: Allowlists
) -> None:
    allowlists(None)

    created = _create(kubectl, namespace, "another", "postgres:16", None)

    assert created.returncode != 0
    assert "no params found for policy binding with `Deny` parameterNotFoundAction" in created.stderr
    kubectl("annotate", "migration", NAME, "-n", namespace, "ferry.dev/pause=ferry-admin")
