"""Both PostgreSQL instances accept authenticated connections over TCP, each on its own major version."""

from __future__ import annotations

import psycopg
import pytest

from devstack.stack.stack import StackInfo


@pytest.mark.parametrize(("instance", "major"), [("source", 15), ("target", 18)])
def test_postgres_instance_accepts_connections_and_runs_its_major(stack: StackInfo, instance: str, major: int) -> None:
    endpoint = stack.postgres[instance]

    with psycopg.connect(endpoint.dsn, connect_timeout=5) as conn:
        version = conn.execute("show server_version_num").fetchone()

    assert version is not None
    assert int(version[0]) // 10000 == major


def test_postgres_refuses_a_wrong_password(stack: StackInfo) -> None:
    endpoint = stack.postgres["source"]

    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(endpoint.dsn.replace(endpoint.password, "wrong"), connect_timeout=5)
