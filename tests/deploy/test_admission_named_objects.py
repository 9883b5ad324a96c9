"""deploy/admission/named_objects.yaml on the real API server: whoever creates a Migration may themselves do to
what it names what it would have ferry do.

ferry's worker reads the Secrets a Migration names, copies its source's Pod template into a StatefulSet of the
Migration's image, points its Service at that and scales the source down, all with its own RBAC. So a user who
may create Migrations in a namespace but not read its Secrets, nor change its StatefulSets and Services, must not
get that done by naming them. Users are impersonated (`kubectl --as`) with Roles a test binds them in its
namespace, by name where RBAC allows it, so every refusal here is the API server's own. Creates are server-side
dry runs: admission runs, nothing is kept. The local stack applies deploy/admission (devstack/stack/admission.py).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests import samples
from tests.conftest import Kubectl, grant

POLICY = "ferry-named-objects"
NAME = "orders-db-to-16"
SOURCE = "orders-db"
"""The sample's source StatefulSet and its stable Service."""
SECRETS = {
    "spec.driver.sourceSecret": "orders-db-source",
    "spec.driver.targetSecret": "orders-db-target",
    "spec.snapshot.credentialsSecret": "snapshot-credentials",
}
"""The Secrets the sample names, by the field naming each."""
ASK_ONE = "; ask for that permission or let someone who has it create the Migration"

Rule = dict[str, Any]


def _rule(group: str, resource: str, verbs: list[str], names: list[str] | None = None) -> Rule:
    rule: Rule = {"apiGroups": [group], "resources": [resource], "verbs": verbs}
    if names is not None:
        rule["resourceNames"] = names
    return rule


CREATE_MIGRATIONS = _rule("ferry.dev", "migrations", ["create"])
NEEDED = {
    "secrets": _rule("", "secrets", ["get"], list(SECRETS.values())),
    "source": _rule("apps", "statefulsets", ["patch"], [SOURCE]),
    "service": _rule("", "services", ["patch"], [SOURCE]),
    "create": _rule("apps", "statefulsets", ["create"]),
}
"""What creating the sample needs beyond creating Migrations, each by name where RBAC allows it."""


def _allow(kubectl: Kubectl, namespace: str, user: str, *rules: Rule) -> None:
    """Binds `user` a Role of these rules (and `create` on Migrations) in the namespace, replacing an earlier one."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": f"{user}-creates", "namespace": namespace},
        "rules": [CREATE_MIGRATIONS, *rules],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{user}-creates", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{user}-creates"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [role, binding]}))  # fmt: skip


def _create(
    kubectl: Kubectl, namespace: str, user: str, manifest: dict[str, Any], groups: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """A server-side dry run of `user` creating the Migration; returns the result, failed or not."""
    return kubectl(f"--as={user}", *(f"--as-group={group}" for group in groups), "create", "--dry-run=server",
                   "-n", namespace, "-f", "-", stdin=json.dumps(manifest), check=False)  # fmt: skip


def _refusal(result: subprocess.CompletedProcess[str]) -> str:
    """The policy's own message in kubectl's one-line error; fails when the request went through or RBAC refused it."""
    assert result.returncode != 0, f"the request went through: {result.stdout}"
    prefix, found, message = result.stderr.strip().partition(f"ValidatingAdmissionPolicy '{POLICY}' with binding ")
    assert found, result.stderr
    assert prefix.startswith("Error from server (Forbidden): "), result.stderr
    return message.split(" denied request: ", 1)[1]


def _admitted(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr


def test_the_policy_judges_only_the_creation_of_a_migration_never_its_updates_or_status(
    kubectl: Kubectl, migration_crd: str
) -> None:
    """The CRD fixes spec.source, spec.driver and spec.snapshot at creation, so an update cannot name anything new;
    and ferry's own writes (the watcher's finalizer, both components' status) must never depend on this policy."""
    policy = json.loads(kubectl("get", "validatingadmissionpolicy", POLICY, "-o", "json").stdout)
    binding = json.loads(kubectl("get", "validatingadmissionpolicybinding", POLICY, "-o", "json").stdout)

    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": ["ferry.dev"], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["migrations"],
         "scope": "*"}
    ]  # fmt: skip
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["policyName"] == POLICY
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_a_creator_who_may_not_get_a_named_secret_is_refused_naming_it_until_granted_it(
    kubectl: Kubectl, migration_crd: str, namespace: str
) -> None:
    others = [name for name in SECRETS.values() if name != "orders-db-source"]
    _allow(kubectl, namespace, "carol", NEEDED["source"], NEEDED["service"], NEEDED["create"],
           _rule("", "secrets", ["get"], others))  # fmt: skip
    # The source's credentials also named as the snapshot's: one Secret, both fields, one permission.
    shared = samples.migration(
        "shared", snapshot={"bucket": "ferry-snapshots", "credentialsSecret": "orders-db-source"}
    )

    refused = _create(kubectl, namespace, "carol", samples.migration(NAME))
    refused_shared = _create(kubectl, namespace, "carol", shared)

    assert _refusal(refused) == (
        f'user "carol" may not create Migration {namespace}/{NAME}: you may not get Secret '
        f"{namespace}/orders-db-source (spec.driver.sourceSecret), which this Migration would have ferry read{ASK_ONE}"
    )
    assert _refusal(refused_shared) == (
        f'user "carol" may not create Migration {namespace}/shared: you may not get Secret '
        f"{namespace}/orders-db-source (spec.driver.sourceSecret, spec.snapshot.credentialsSecret), which this "
        f"Migration would have ferry read{ASK_ONE}"
    )

    _allow(kubectl, namespace, "carol", *NEEDED.values())
    _admitted(_create(kubectl, namespace, "carol", samples.migration(NAME)))
    _admitted(_create(kubectl, namespace, "carol", shared))


@pytest.mark.parametrize(
    ("left_out", "refused"),
    [
        (
            "source",
            "patch StatefulSet {ns}/orders-db (spec.source.statefulSet), which this Migration would have ferry copy, "
            "with its Pod template (ServiceAccount, Secret mounts), and scale down",
        ),
        (
            "service",
            "patch Service {ns}/orders-db (spec.source.service), which this Migration would have ferry point at the "
            "target",
        ),
        (
            "create",
            "create StatefulSets in namespace {ns}, as this Migration would have ferry create StatefulSet "
            "{ns}/orders-db-16 (spec.target.statefulSet)",
        ),
    ],
)
def test_a_creator_who_may_not_change_the_source_or_its_service_or_create_statefulsets_is_refused_naming_it(
    kubectl: Kubectl, migration_crd: str, namespace: str, left_out: str, refused: str
) -> None:
    _allow(kubectl, namespace, "dan", *(rule for key, rule in NEEDED.items() if key != left_out))

    result = _create(kubectl, namespace, "dan", samples.migration(NAME))

    assert _refusal(result) == (
        f'user "dan" may not create Migration {namespace}/{NAME}: you may not {refused.format(ns=namespace)}{ASK_ONE}'
    )


def test_a_creator_with_every_permission_by_name_is_admitted_and_refused_another_teams_objects_one_by_one(
    kubectl: Kubectl, migration_crd: str, namespace: str
) -> None:
    """The API server reports the first permission missing, in the order of the policy's validations."""
    _allow(kubectl, namespace, "erin", *NEEDED.values())
    # Another team's database in the same namespace, which erin may not touch.
    theirs = samples.migration(
        "payments",
        source={"statefulSet": "payments-db", "service": "payments"},
        driver={"type": "postgresql", "sourceSecret": "payments-db", "targetSecret": "orders-db-target"},
    )
    refused = f'user "erin" may not create Migration {namespace}/payments: you may not '
    granted = [*NEEDED.values()]

    _admitted(_create(kubectl, namespace, "erin", samples.migration(NAME)))
    assert _refusal(_create(kubectl, namespace, "erin", theirs)) == (
        f"{refused}get Secret {namespace}/payments-db (spec.driver.sourceSecret), which this Migration would have "
        f"ferry read{ASK_ONE}"
    )
    for rule, next_refused in (
        (_rule("", "secrets", ["get"], ["payments-db"]), "patch StatefulSet "),
        (_rule("apps", "statefulsets", ["patch"], ["payments-db"]), "patch Service "),
    ):
        granted.append(rule)
        _allow(kubectl, namespace, "erin", *granted)
        assert _refusal(_create(kubectl, namespace, "erin", theirs)).startswith(refused + next_refused)
    _allow(kubectl, namespace, "erin", *granted, _rule("", "services", ["patch"], ["payments"]))
    _admitted(_create(kubectl, namespace, "erin", theirs))


def test_update_does_as_well_as_patch_reading_does_not_and_a_namespace_or_cluster_admin_needs_nothing_more(
    kubectl: Kubectl, migration_crd: str, namespace: str
) -> None:
    updates = [_rule("apps", "statefulsets", ["update"], [SOURCE]), _rule("", "services", ["update"], [SOURCE])]
    reads = [_rule("apps", "statefulsets", ["get", "list", "watch"]), _rule("", "services", ["get", "list", "watch"])]
    _allow(kubectl, namespace, "frank", NEEDED["secrets"], NEEDED["create"], *updates)
    _allow(kubectl, namespace, "ivan", NEEDED["secrets"], NEEDED["create"], *reads)
    grant(kubectl, namespace, "admin", user="gina")
    _allow(kubectl, namespace, "gina")

    _admitted(_create(kubectl, namespace, "frank", samples.migration(NAME)))
    assert "you may not patch StatefulSet" in _refusal(_create(kubectl, namespace, "ivan", samples.migration(NAME)))
    _admitted(_create(kubectl, namespace, "gina", samples.migration(NAME)))
    _admitted(_create(kubectl, namespace, "root", samples.migration(NAME), groups=("system:masters",)))


def test_controls_on_an_existing_migration_need_none_of_it_while_the_same_users_create_is_refused(
    kubectl: Kubectl, migration_crd: str, control_roles: None, namespace: str
) -> None:
    """The policy judges who creates a Migration, not who steers it: an operator without any right over the
    database's objects still gives a control, labels the Migration, pauses it and takes the control back."""
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(samples.migration(NAME)))
    grant(kubectl, namespace, "ferry-operator", user="olga")
    _allow(kubectl, namespace, "olga")

    for args in (
        ("annotate", "--overwrite", "migration", NAME, "ferry.dev/pause=olga: maintenance"),
        ("label", "migration", NAME, "team=orders"),
        ("patch", "migration", NAME, "--type=merge", "-p", '{"spec":{"paused":true}}'),
        ("annotate", "migration", NAME, "ferry.dev/pause-"),
    ):
        steered = kubectl("--as=olga", "-n", namespace, *args, check=False)
        assert steered.returncode == 0, steered.stderr

    assert "you may not get Secret" in _refusal(_create(kubectl, namespace, "olga", samples.migration("another")))
