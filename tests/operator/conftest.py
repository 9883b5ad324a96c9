"""What the operator tests share: a small source table, and waiting for a Migration's phase."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest

from devstack.stack.stack import StackInfo
from ferry.api.saga import MigrationRef
from tests.conftest import Kubectl
from tests.end_to_end import Databases, apply_migration, eventually, migration_manifest

MIGRATION_DONE = 600
"""Seconds a whole migration may take here: real components, on a machine that may be cold and busy."""


@pytest.fixture
def orders(databases: Databases) -> int:
    """A small orders table in the source database; returns its row count."""
    with psycopg.connect(databases.source.dsn) as conn:
        conn.execute("create table orders (id bigserial primary key, total numeric not null)")
        conn.execute("insert into orders (total) select n * 1.5 from generate_series(1, 500) as n")
    return 500


async def migration_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    result = await asyncio.to_thread(kubectl, "get", "migration", name, "-n", namespace, "-o", "json")
    status: dict[str, Any] = json.loads(result.stdout).get("status") or {}
    return status


async def wait_phase(kubectl: Kubectl, ref: MigrationRef, phase: str, within: float = MIGRATION_DONE) -> dict[str, Any]:
    """The Migration's status once its phase is `phase`; fails naming the last status seen at the deadline."""
    last: dict[str, Any] = {}

    async def reached() -> bool:
        last.update(status=await migration_status(kubectl, ref.namespace, ref.name))
        return bool(last["status"].get("phase") == phase)

    await eventually(f"phase {phase}", reached, within=within, seen=lambda: json.dumps(last.get("status")))
    return await migration_status(kubectl, ref.namespace, ref.name)


async def at_approval_gate(kubectl: Kubectl, namespace: str, stack: StackInfo, bucket: str) -> MigrationRef:
    """A Migration that requires approval, waiting at its gate before freeze (the source still takes writes)."""
    ref = apply_migration(kubectl, namespace, migration_manifest(stack, bucket, approval={"required": True}))
    await wait_phase(kubectl, ref, "AwaitingApproval")
    return ref
