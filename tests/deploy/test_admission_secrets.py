"""deploy/admission/secrets.yaml on the real API server: ferry's ServiceAccounts change a Secret by ferry's finalizer
and in no other way.

Both accounts may patch Secrets where the worker reads them (the precheck marks a Migration's Secrets in use, the
watcher takes the mark off), and RBAC cannot narrow a patch to metadata.finalizers: the policy does. The accounts
are deploy/rbac's (ferry-system/ferry-worker and ferry-watcher), with the grants `ferry rbac` makes for the test's
namespace, and they act with their own tokens (as in their Pods; `kubectl --as` would not do for the watcher, whose
`kubectl patch` first reads the Secret, which it may not), so every refusal here is the API server's. The local
stack applies deploy/admission (devstack/stack/admission.py).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.client import Client

from activities.secrets import STRATEGIC_MERGE_PATCH, SecretProtection
from devstack.stack.stack import StackInfo
from ferry import rbac
from ferry.api.migration import Migration, secret_finalizer
from ferry.api.saga import MigrationRef
from ferry.clients import kubernetes_client
from tests import samples
from tests.conftest import Kubectl
from tests.deploy.conftest import GrantSecrets, Installation, ServiceAccountKubeconfig
from tests.deploy.files import DEPLOY, SYSTEM_NAMESPACE, documents, find
from tests.end_to_end import watcher_settings
from watcher.deletion import DeletionHandler
from watcher.kube import Kube
from watcher.patching import MigrationWriter

POLICY = "ferry-secrets"
SECRET = "orders-db-source"
HOST = "orders-db.shop.svc"
OTHER = "example.com/backup-first"
"""Another controller's finalizer, on the Secret from the start."""
ACCOUNTS = {"worker": rbac.SERVICE_ACCOUNT, "watcher": rbac.WATCHER_SERVICE_ACCOUNT}
PATCHES = {
    "merge": "application/merge-patch+json",
    "strategic": STRATEGIC_MERGE_PATCH,
    "json": "application/json-patch+json",
}
RULE = (
    "ferry's worker and watcher may change a Secret only by adding or removing a finalizer "
    "ferry.dev/in-use-<Migration uid>, and ferry's code asks for nothing more: something else sent this with their "
    "identity. Find what holds that ServiceAccount's token (or may impersonate it), and revoke it"
)
UID = "0b5c1f7e-3c4d-4e0f-9a1b-2c3d4e5f6a7b"
"""A Migration's uid, for its finalizer on the Secret."""


def _encoded(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _user(account: str) -> str:
    return f"system:serviceaccount:{SYSTEM_NAMESPACE}:{account}"


def _patch(core: k8s.CoreV1Api, namespace: str, kind: str, body: Any) -> Callable[[], object]:
    """A patch of the test's Secret, to send."""
    return lambda: core.patch_namespaced_secret(SECRET, namespace, body, _content_type=PATCHES[kind])


def _refusal(call: Callable[[], object]) -> str:
    """The policy's own message; fails when the request went through or something else (RBAC) refused it."""
    with pytest.raises(ApiException) as raised:
        call()
    assert raised.value.status == 403, raised.value.body
    message: str = json.loads(raised.value.body)["message"]
    prefix = f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: "
    _, found, refusal = message.partition(prefix)
    assert found, message
    return refusal


def _secret(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(kubectl("get", "secret", SECRET, "-n", namespace, "-o", "json").stdout)
    return found


def _kept(secret: dict[str, Any]) -> dict[str, Any]:
    """What the policy keeps of a Secret: everything but its resourceVersion, managedFields and ferry's finalizers."""
    metadata = {
        key: value for key, value in secret["metadata"].items() if key not in ("resourceVersion", "managedFields")
    }
    metadata["finalizers"] = [f for f in metadata.get("finalizers", []) if not f.startswith("ferry.dev/in-use-")]
    return {**secret, "metadata": metadata}


@pytest.fixture
def secret(kubectl: Kubectl, namespace: str, grant_secrets: GrantSecrets) -> Iterator[str]:
    """A source Secret with a label, an annotation and another controller's finalizer, in a namespace where deploy's
    worker and watcher have the grants of `ferry rbac` (get and patch, patch)."""
    manifest = {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": SECRET, "labels": {"app": "orders"}, "annotations": {"team": "orders"},
                     "finalizers": [OTHER]},
        "stringData": {"host": HOST, "port": "5432", "username": "app", "password": "s3cret", "database": "shop"},
    }  # fmt: skip
    kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
    grant_secrets(namespace)
    yield SECRET
    kubectl("patch", "secret", SECRET, "-n", namespace, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')


@pytest.fixture(params=sorted(ACCOUNTS))
def account(request: pytest.FixtureRequest) -> str:
    """The ServiceAccount of ferry's worker, or of its watcher."""
    name: str = ACCOUNTS[request.param]
    return name


@pytest.fixture
def as_account(account: str, service_account_kubeconfig: ServiceAccountKubeconfig) -> Iterator[k8s.CoreV1Api]:
    """The core API as `account`, authenticated by a token of its own."""
    with contextlib.closing(kubernetes_client(service_account_kubeconfig(account))) as api:
        yield k8s.CoreV1Api(api)


def test_the_stacks_secrets_policy_is_deploys_and_matches_only_the_service_accounts_of_deploys_components(
    kubectl: Kubectl, kustomize_installation: Installation
) -> None:
    policy = json.loads(kubectl("get", "validatingadmissionpolicy", POLICY, "-o", "json").stdout)
    shipped = find(documents(DEPLOY / "admission"), "ValidatingAdmissionPolicy", POLICY)

    assert policy["spec"]["matchConditions"] == shipped["spec"]["matchConditions"]
    (condition,) = policy["spec"]["matchConditions"]
    named = sorted(re.findall(r"'([^']*)'", condition["expression"]))
    components = [kustomize_installation.service_account(component) for component in ("worker", "watcher")]
    assert named == sorted(map(_user, components)) == sorted(map(_user, ACCOUNTS.values()))
    assert kustomize_installation.namespace == SYSTEM_NAMESPACE


def test_ferrys_service_accounts_may_not_rewrite_a_secrets_data(
    kubectl: Kubectl, namespace: str, secret: str, account: str, as_account: k8s.CoreV1Api
) -> None:
    """A compromised watcher or worker cannot point the worker at another server: it would send it the password."""
    before = _secret(kubectl, namespace)

    refusals = [
        _refusal(_patch(as_account, namespace, "merge", {"data": {"host": _encoded("attacker.example.com")}})),
        _refusal(_patch(as_account, namespace, "strategic", {"stringData": {"host": "attacker.example.com"}})),
        _refusal(_patch(as_account, namespace, "json", [{"op": "remove", "path": "/data/password"}])),
        # ferry's finalizer does not carry another change along.
        _refusal(_patch(as_account, namespace, "strategic", {
            "metadata": {"finalizers": [secret_finalizer(UID)]}, "data": {"port": _encoded("6543")},
        })),
    ]  # fmt: skip

    assert refusals == [f'user "{_user(account)}" may not change data of Secret {namespace}/{SECRET}: {RULE}'] * 4
    after = _secret(kubectl, namespace)
    assert base64.b64decode(after["data"]["host"]).decode() == HOST
    assert after == before


def test_ferrys_service_accounts_may_not_change_a_secrets_metadata_or_another_finalizer(
    kubectl: Kubectl, namespace: str, secret: str, account: str, as_account: k8s.CoreV1Api
) -> None:
    before = _secret(kubectl, namespace)
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "anything", "uid": str(uuid.uuid4())}
    others = "metadata.finalizers other than ferry.dev/in-use-*"
    changes: list[tuple[str, str, Any]] = [
        ("metadata.labels", "merge", {"metadata": {"labels": {"app": "billing"}}}),
        ("metadata.annotations", "merge", {"metadata": {"annotations": {"team": None}}}),
        ("metadata.ownerReferences", "merge", {"metadata": {"ownerReferences": [owner]}}),
        ("immutable", "merge", {"immutable": True}),
        (others, "strategic", {"metadata": {"$deleteFromPrimitiveList/finalizers": [OTHER]}}),
        (others, "strategic", {"metadata": {"finalizers": ["example.com/keep-forever"]}}),
        (others, "json", [{"op": "replace", "path": "/metadata/finalizers", "value": [secret_finalizer(UID)]}]),
        (f"data, metadata.labels, {others}", "merge", {
            "data": None, "metadata": {"labels": None, "finalizers": [secret_finalizer(UID)]},
        }),
    ]  # fmt: skip

    refusals = [_refusal(_patch(as_account, namespace, kind, body)) for _, kind, body in changes]

    assert refusals == [
        f'user "{_user(account)}" may not change {field} of Secret {namespace}/{SECRET}: {RULE}'
        for field, _, _ in changes
    ]
    assert _secret(kubectl, namespace) == before


def test_ferrys_service_accounts_add_and_remove_ferrys_finalizers_and_they_land(
    kubectl: Kubectl, namespace: str, secret: str, as_account: k8s.CoreV1Api
) -> None:
    before = _secret(kubectl, namespace)
    mine, another = secret_finalizer(UID), secret_finalizer(str(uuid.uuid4()))
    steps: list[tuple[str, Any, list[str]]] = [
        ("strategic", {"metadata": {"finalizers": [mine]}}, [mine, OTHER]),
        ("merge", {"metadata": {"finalizers": [mine, another, OTHER]}}, [mine, another, OTHER]),
        ("strategic", {"metadata": {"$deleteFromPrimitiveList/finalizers": [mine]}}, [another, OTHER]),
        ("json", [{"op": "remove", "path": "/metadata/finalizers/0"}], [OTHER]),  # another Migration's, too
        ("strategic", {"metadata": {"$deleteFromPrimitiveList/finalizers": [mine]}}, [OTHER]),  # nothing to remove
    ]

    landed = []
    for kind, body, _ in steps:
        _patch(as_account, namespace, kind, body)()
        after = _secret(kubectl, namespace)
        landed.append(after["metadata"]["finalizers"])
        assert _kept(after) == _kept(before), body

    assert landed == [finalizers for _, _, finalizers in steps]


def test_ferrys_service_accounts_may_neither_create_nor_delete_a_secret_even_where_rbac_would_let_them(
    kubectl: Kubectl, namespace: str, secret: str, account: str, as_account: k8s.CoreV1Api
) -> None:
    kubectl("create", "role", "too-much", "--verb=create,delete", "--resource=secrets", "-n", namespace)
    kubectl("create", "rolebinding", "too-much", "--role=too-much", f"--serviceaccount={SYSTEM_NAMESPACE}:{account}",
            "-n", namespace)  # fmt: skip
    planted = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="planted"), string_data={"host": "attacker.example.com"})

    created = _refusal(lambda: as_account.create_namespaced_secret(namespace, planted))
    deleted = _refusal(lambda: as_account.delete_namespaced_secret(SECRET, namespace))

    assert created == f'user "{_user(account)}" may not create Secret {namespace}/planted: {RULE}'
    assert deleted == f'user "{_user(account)}" may not delete Secret {namespace}/{SECRET}: {RULE}'
    assert "deletionTimestamp" not in _secret(kubectl, namespace)["metadata"]


def test_other_users_change_secrets_as_their_rbac_allows(kubectl: Kubectl, namespace: str, secret: str) -> None:
    kubectl("create", "role", "secret-patcher", "--verb=get,patch", "--resource=secrets", "-n", namespace)
    kubectl("create", "rolebinding", "secret-patcher", "--role=secret-patcher", "--user=erin", "-n", namespace)
    # A ServiceAccount named like ferry's in another namespace is not ferry's.
    lookalike = f"system:serviceaccount:{namespace}:{rbac.WATCHER_SERVICE_ACCOUNT}"
    kubectl("create", "rolebinding", "lookalike", "--role=secret-patcher", f"--user={lookalike}", "-n", namespace)

    def patch(body: dict[str, Any], *user: str) -> None:
        kubectl(*user, "patch", "secret", SECRET, "-n", namespace, "--type=merge", "-p", json.dumps(body))

    patch({"data": {"host": _encoded("orders-db-2.shop.svc")}})  # the admin
    patch({"data": {"port": _encoded("6432")}, "metadata": {"labels": {"app": "orders-2"}}}, "--as=erin")
    patch({"metadata": {"annotations": {"team": "billing"}, "finalizers": None}}, f"--as={lookalike}")

    after = _secret(kubectl, namespace)
    assert {key: base64.b64decode(after["data"][key]).decode() for key in ("host", "port")} == {
        "host": "orders-db-2.shop.svc", "port": "6432",
    }  # fmt: skip
    assert (after["metadata"]["labels"], after["metadata"]["annotations"]) == ({"app": "orders-2"}, {"team": "billing"})
    assert not after["metadata"].get("finalizers")


async def test_the_precheck_marks_and_the_watcher_releases_secrets_under_the_policy_by_their_own_code(
    kubectl: Kubectl, namespace: str, secret: str, service_account_kubeconfig: ServiceAccountKubeconfig,
    stack: StackInfo, temporal_client: Client, task_queue: str, migration_crd: str,
) -> None:  # fmt: skip
    """SecretProtection.protect (the precheck) and DeletionHandler.release_secrets, with the tokens of deploy's
    ServiceAccounts: the patches ferry sends are what the policy admits. Of the Secrets the Migration names, only the
    source exists here (the others are skipped, as a Secret gone is)."""
    # The precheck reads the Migration after marking its Secrets (and lets them go if it is gone): it exists here.
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(samples.migration()))
    applied = json.loads(kubectl("get", "migration", samples.migration()["metadata"]["name"], "-n", namespace,
                                 "-o", "json").stdout)  # fmt: skip
    migration = Migration.parse(applied)
    assert migration.spec is not None
    ref = MigrationRef(namespace=namespace, name=migration.metadata.name, uid=migration.metadata.uid)
    before = _secret(kubectl, namespace)

    with contextlib.closing(kubernetes_client(service_account_kubeconfig(rbac.SERVICE_ACCOUNT))) as api:
        for _ in range(2):  # a second attempt of the precheck changes nothing
            SecretProtection(api).protect(ref, migration.spec.secrets())
    marked = _secret(kubectl, namespace)
    with contextlib.closing(kubernetes_client(service_account_kubeconfig(rbac.WATCHER_SERVICE_ACCOUNT))) as api:
        writer = MigrationWriter(Kube(api, "test"))
        handler = DeletionHandler(
            temporal_client, writer, watcher_settings(stack, task_queue, namespace), lambda ref: None
        )
        for _ in range(2):  # a watcher that stopped before it released the Migration does it again
            await handler.release_secrets(migration)
    released = _secret(kubectl, namespace)

    assert marked["metadata"]["finalizers"] == [secret_finalizer(ref.uid), OTHER]
    # release_secrets turns a refusal into a Warning Event and goes on: the finalizer left would say so.
    assert released["metadata"]["finalizers"] == [OTHER]
    assert _kept(marked) == _kept(released) == _kept(before)
    assert "SecretsNotReleased" not in kubectl("get", "events", "-n", namespace).stdout
