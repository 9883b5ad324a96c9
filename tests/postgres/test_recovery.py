"""The README's recovery instructions work as written: its SQL block unfreezes a source that ferry left frozen."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from pathlib import Path

import psycopg
import pytest

from devstack.stack.install import Binaries
from devstack.stack.postgres import PostgresEndpoint
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import application_role, connect, connect_privileges, database_settings

README = Path(__file__).parent.parent.parent / "README.md"


def readme_unfreeze_sql() -> str:
    """The SQL block of the README's section Recovery that unfreezes a source, as a reader would copy it."""
    recovery = README.read_text().split("\n## Recovery\n", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"```sql\n(.*?)```", recovery, flags=re.DOTALL) if "$unfreeze$" in b]
    assert len(blocks) == 1, "the section Recovery has one SQL block that unfreezes a source"
    return textwrap.dedent(blocks[0])


def psql(binaries: Binaries, endpoint: PostgresEndpoint, script: str) -> str:
    """Runs a script as `psql -d DATABASE` would, stopping at the first error."""
    result = subprocess.run(
        [str(binaries.postgres_bindir / "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-f", "-"],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PGHOST": endpoint.host,
            "PGPORT": str(endpoint.port),
            "PGUSER": endpoint.user,
            "PGPASSWORD": endpoint.password,
            "PGDATABASE": endpoint.database,
        },
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("acl", ["default", "explicit grants"])
def test_the_readme_sql_block_unfreezes_the_source_from_a_session_of_the_frozen_database(
    steps: Steps, databases: Databases, binaries: Binaries, acl: str
) -> None:
    source = databases.source
    with connect(source) as conn:
        conn.execute("create table public.orders (id int primary key)")
    with application_role(source) as app:
        if acl == "explicit grants":
            with connect(source) as conn:
                conn.execute(f"revoke connect on database {source.database} from public")
                conn.execute(f"grant connect on database {source.database} to {app.user}")
        privileges_before = connect_privileges(source)
        steps.freeze()  # and suppose its undo kept failing: the Migration ended Failed
        with connect(source) as opened_during_the_freeze:
            output = psql(binaries, source, readme_unfreeze_sql())

            with pytest.raises(psycopg.OperationalError):
                opened_during_the_freeze.execute("select 1")
        assert "read_only_sessions_ended" in output
        assert database_settings(source) == []
        assert connect_privileges(source) == privileges_before
        with connect(app) as conn:
            conn.execute("insert into public.orders values (1)")
