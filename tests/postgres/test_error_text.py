"""A restore that fails on a row names the constraint and the table, and nowhere quotes the row.

The restore's error quotes the row it could not load twice (DETAIL: Failing row contains ...,
CONTEXT: COPY ..., line 1: "..."). The whole migration runs through ferry's real worker,
on the stack's Temporal, PostgreSQL, S3 and API server; the row reaches none of the
Migration's status, its Events, the workflow's history and the worker's log. A database
error no activity caught leaves the worker's interceptor just as scrubbed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput

from devstack.stack.postgres import PostgresEndpoint
from tests.end_to_end import Databases, Ready, readable_history
from tests.postgres.data import connect
from worker.interceptors import LogContextInterceptor

SAGA_TIMEOUT = 240
ROW_VALUES = ("alice-7f3c@secret.example", "card 4111-1111-1111-1111")
"""What the one row the restore refuses holds: values only people allowed to read the table may see."""


def _create_a_row_the_restore_refuses(source: PostgresEndpoint) -> None:
    """A customer whose domain was blocked after the row was written, by a CHECK that reads another table.

    PostgreSQL checks a CHECK constraint only when a row is written, so the source keeps the
    row. The restore loads blocked_domains first (pg_restore loads table data in name order)
    and then checks every customer again: this one fails, as such constraints do on restore.
    """
    email, note = ROW_VALUES
    with connect(source) as conn:
        conn.execute("create table public.blocked_domains (domain text primary key)")
        conn.execute(
            "create function public.email_allowed(email text) returns boolean language sql as $$ "
            "select not exists (select from public.blocked_domains where domain = split_part(email, '@', 2)) $$"
        )
        conn.execute(
            "create table public.customers (id int primary key, email text not null, note text, "
            "constraint customers_email_allowed check (public.email_allowed(email)))"
        )
        conn.execute("insert into public.customers values (1, %s, %s), (2, 'bob@ok.example', null)", (email, note))
        conn.execute("insert into public.blocked_domains values ('secret.example')")


async def test_a_restore_refusing_a_row_names_the_constraint_and_quotes_the_row_in_no_status_event_or_history(
    caplog: pytest.LogCaptureFixture, databases: Databases, ready: Ready
) -> None:
    caplog.set_level(logging.INFO)
    _create_a_row_the_restore_refuses(databases.source)
    manifest = ready.manifest()
    ref = ready.apply(manifest)

    handle = await ready.start(ref, manifest)
    with pytest.raises(WorkflowFailureError):
        await asyncio.wait_for(handle.result(), SAGA_TIMEOUT)

    migration = ready.migration(ref.name)
    status = migration["status"]
    # In mode Snapshot the snapshot step restores the target from its own dump stream.
    restoring = next(step for step in status["steps"] if step["name"] == "snapshot")
    assert status["phase"] == "RolledBack"
    # What a person acts on is there: the tool, the table and the constraint. The target is the newest PostgreSQL,
    # so psql ran pg_restore's script (activities/postgres/restore_script.py).
    assert "psql exited with code 3" in restoring["lastError"]
    assert (
        'new row for relation "customers" violates check constraint "customers_email_allowed"'
        in (restoring["lastError"])
    )
    records = {
        "Migration": json.dumps(migration),
        "Events": ready.events(),
        "workflow history": readable_history((await handle.fetch_history()).to_json()),
        "worker's log": caplog.text,
    }
    assert "customers_email_allowed" in records["Events"]
    assert "customers_email_allowed" in records["workflow history"]
    assert "Completing activity as failed" in records["worker's log"]
    for record_name, text in records.items():
        for value in ROW_VALUES:
            assert value not in text, f"the row's value {value!r} is in the {record_name}"
        assert "Failing row contains (1" not in text, f"the failing row is in the {record_name}"


class _InsertingADuplicate(ActivityInboundInterceptor):
    """An activity's work that runs into a unique constraint of the real database, and catches nothing."""

    def __init__(self, endpoint: PostgresEndpoint) -> None:
        self._endpoint = endpoint

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        with connect(self._endpoint) as conn:
            conn.execute("create table public.customers (id int primary key, email text unique)")
            conn.execute("insert into public.customers values (1, %s)", (ROW_VALUES[0],))
            conn.execute("insert into public.customers values (2, %s)", (ROW_VALUES[0],))
        return None


async def test_a_database_error_no_activity_caught_leaves_it_with_its_type_and_sqlstate_and_no_row(
    databases: Databases,
) -> None:
    intercepted = LogContextInterceptor().intercept_activity(_InsertingADuplicate(databases.source))
    work = ExecuteActivityInput(fn=lambda: None, args=[], executor=None, headers={})

    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(intercepted.execute_activity, work)

    assert raised.value.type == "UniqueViolation"
    assert raised.value.message == (
        'duplicate key value violates unique constraint "customers_email_key" (SQLSTATE 23505)'
    )
    assert raised.value.__traceback__ is not None, "the stack stays for whoever debugs it"
