"""What a database holds never runs in ferry's own queries.

ferry's sessions connect as the Secrets' users, often superusers. Its catalog queries name
operators and functions unqualified; were they resolved along the database's search_path,
an operator that a role allowed to create in public planted there (one with closer
argument types than pg_catalog's) would run in them, with the Secret user's rights, and
could make that role a superuser (the pattern of CVE-2018-1058).
"""

from __future__ import annotations

import pytest

from ferry.api.saga import MigrationRef
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import connect, create_shop

PLANTED = """
create function public.planted(name, name) returns boolean language plpgsql as $$
begin
    raise exception 'the planted operator ran, as %', current_user;
end $$;
create operator public.!~ (leftarg = name, rightarg = name, function = public.planted);
"""
"""pg_catalog has !~ for (name, text) but not for (name, name): `nspname !~ '^pg_'` would take this one."""


@pytest.fixture
def ref(applied_ref: MigrationRef) -> MigrationRef:
    """A Migration that exists: the precheck records in its status which databases it checked."""
    return applied_ref


@pytest.fixture
def planted(databases: Databases) -> Databases:
    create_shop(databases.source, customers=10, orders=20)
    with connect(databases.source) as conn:
        conn.execute(PLANTED)
        # The operator is there, and a session on the database's own search_path takes it.
        with pytest.raises(Exception, match="the planted operator ran"):
            conn.execute("select count(*) from pg_namespace n where n.nspname !~ '^pg_'")
    return databases


def test_an_operator_planted_in_public_never_runs_in_the_precheck_the_freeze_or_its_checks(
    steps: Steps, planted: Databases
) -> None:
    steps.precheck()
    frozen = steps.freeze()
    try:
        steps.check_frozen(frozen.fence)
    finally:
        steps.undo_freeze(frozen.previous_setting)


def test_an_operator_planted_in_public_never_runs_on_the_target_the_restore_copied_it_to(
    steps: Steps, planted: Databases
) -> None:
    steps.precheck()
    frozen = steps.freeze()
    try:
        steps.snapshot(restore=True)
        with (
            connect(planted.target) as conn,  # the restore copied the operator too
            pytest.raises(Exception, match="the planted operator ran"),
        ):
            conn.execute("select count(*) from pg_namespace n where n.nspname !~ '^pg_'")
        steps.verify()
        steps.undo_migrate()
    finally:
        steps.undo_freeze(frozen.previous_setting)
