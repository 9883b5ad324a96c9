"""The local stack's audit policy: Secrets always; Migration status writes, with their bodies, only when asked."""

from __future__ import annotations

from typing import Any

import yaml

from devstack.stack.kube import audit_policy


def _audited(policy: str) -> list[tuple[str, list[str]]]:
    """(level, resources) of each rule, in the order the API server tries them."""
    rules: list[dict[str, Any]] = yaml.safe_load(policy)["rules"]
    return [(rule["level"], [r for group in rule.get("resources", []) for r in group["resources"]]) for rule in rules]


def test_by_default_only_secrets_are_audited() -> None:
    assert _audited(audit_policy()) == [("Metadata", ["secrets"]), ("None", [])]


def test_a_benchmark_stack_also_audits_status_writes_with_what_they_wrote() -> None:
    policy = yaml.safe_load(audit_policy(status_writes=True))

    assert _audited(audit_policy(status_writes=True)) == [
        ("Metadata", ["secrets"]),
        ("Request", ["migrations/status"]),
        ("None", []),
    ]
    assert policy["rules"][1]["verbs"] == ["patch", "update"]
    assert policy["omitStages"] == ["RequestReceived"]
