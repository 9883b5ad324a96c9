"""Error text from servers and tools keeps what a person acts on and loses every value it quoted.

The texts are what the real tools print: pg_restore 15 and psycopg 3 against PostgreSQL 15,
the Kubernetes API server's Status messages, kubernetes' ApiException.
"""

from __future__ import annotations

import psycopg
import pytest
from kubernetes.client.exceptions import ApiException
from temporalio.api.failure.v1 import Failure
from temporalio.exceptions import ApplicationError

from ferry.api.scrubbing import EXCERPT_LIMIT, MESSAGE_LIMIT, api_server_said, scrub
from ferry.clients import data_converter

SECRET = "alice-7f3c@secret.example"

RESTORE_REFUSED_A_ROW = (
    'pg_restore: error: COPY failed for table "customers": ERROR:  new row for relation "customers" violates '
    'check constraint "customers_email_allowed"\n'
    f"DETAIL:  Failing row contains (1, {SECRET}, card 4111).\n"
    f'CONTEXT:  COPY customers, line 1: "1\t{SECRET}\tcard 4111"'
)
DUPLICATE_KEY = (
    f'duplicate key value violates unique constraint "customers_email_key"\nDETAIL:  Key (email)=({SECRET}) already '
    "exists."
)
MISSING_REFERENCE = (
    'insert or update on table "orders" violates foreign key constraint "orders_customer_id_fkey"\n'
    f'DETAIL:  Key (customer_id, email)=(42, {SECRET}) is not present in table "customers".'
)
BAD_INPUT = f"invalid input syntax for type integer: \"{SECRET}\"\nLINE 1: select '{SECRET}'::int\n               ^"
DUMP_REFUSED = (
    'pg_dump: error: Dumping the contents of table "orders" failed: PQgetResult() failed.\n'
    "pg_dump: detail: Error message from server: ERROR:  permission denied for table orders\n"
    f"pg_dump: detail: Command was: COPY public.orders (id, note) TO stdout; -- {SECRET}"
)
FUNCTION_FAILED = (
    'pg_restore: error: could not execute query: ERROR:  relation "blocked_domains" does not exist\n'
    "LINE 1:  select not exists (select from blocked_domains where domain...\n"
    "                                        ^\n"
    f"QUERY:   select not exists (select from blocked_domains where domain = '{SECRET}')\n"
    "  and true\n"
    f'CONTEXT:  SQL function "email_allowed" during inlining\nCOPY customers, line 1: "1\t{SECRET}"\n'
    "Command was: ALTER TABLE public.customers VALIDATE CONSTRAINT customers_email_allowed;"
)
INVALID_OBJECT = (
    'StatefulSet.apps "orders-db-16" is invalid: [spec.template.spec.containers[0].env[0].value: Invalid value: '
    f'"{SECRET}": must be no more than 63 characters, metadata.labels: Invalid value: map[string]string{{"owner":'
    f'"{SECRET}: x"}}: bad label, spec.template.spec.restartPolicy: Unsupported value: "{SECRET}": supported '
    'values: "Always"]'
)


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (
            RESTORE_REFUSED_A_ROW,
            'pg_restore: error: COPY failed for table "customers": ERROR: new row for relation "customers" violates '
            'check constraint "customers_email_allowed"',
        ),
        (DUPLICATE_KEY, 'duplicate key value violates unique constraint "customers_email_key"'),
        (
            MISSING_REFERENCE,
            'insert or update on table "orders" violates foreign key constraint "orders_customer_id_fkey"',
        ),
        (BAD_INPUT, 'invalid input syntax for type integer: "…"'),
        (
            DUMP_REFUSED,
            'pg_dump: error: Dumping the contents of table "orders" failed: PQgetResult() failed. | '
            "pg_dump: detail: Error message from server: ERROR: permission denied for table orders",
        ),
        (
            FUNCTION_FAILED,
            'pg_restore: error: could not execute query: ERROR: relation "blocked_domains" does not exist',
        ),
        (
            INVALID_OBJECT,
            'StatefulSet.apps "orders-db-16" is invalid: [spec.template.spec.containers[0].env[0].value: Invalid '
            'value: "…": must be no more than 63 characters, metadata.labels: Invalid value: "…": bad label, '
            'spec.template.spec.restartPolicy: Unsupported value: "…": supported values: "…"]',
        ),
    ],
    ids=["failing-row", "duplicate-key", "missing-reference", "bad-input", "dump", "query", "invalid-object"],
)
def test_what_a_server_or_tool_said_keeps_the_names_and_the_gist_and_loses_the_values(text: str, kept: str) -> None:
    scrubbed = scrub(text)

    assert scrubbed == kept
    assert SECRET not in scrubbed
    assert scrub(scrubbed) == scrubbed, "scrubbing twice changes nothing"


def test_sections_that_quote_data_go_even_inside_one_line() -> None:
    one_line = (
        'ERROR: duplicate key value violates unique constraint "users_email_key" '
        f'DETAIL: Key (email)=({SECRET}) already exists | CONTEXT: COPY users, line 3: "3\t{SECRET}"'
    )

    assert scrub(one_line) == 'ERROR: duplicate key value violates unique constraint "users_email_key"'


def test_key_values_rows_and_byte_sequences_left_in_a_kept_line_are_withheld() -> None:
    assert scrub(f"could not create unique index: Key (a, b)=(1, {SECRET}) is duplicated.") == (
        "could not create unique index: Key (a, b)=(…) is duplicated."
    )
    assert scrub(f"check failed, Failing row contains (7, {SECRET}).") == "check failed, Failing row contains (…)."
    assert scrub('invalid byte sequence for encoding "UTF8": 0xe2 0x28 0xa1') == (
        'invalid byte sequence for encoding "UTF8": 0x…'
    )
    assert scrub(f'value "{SECRET}" is out of range for type integer') == 'value "…" is out of range for type integer'


def test_names_of_objects_users_and_hosts_stay() -> None:
    said = (
        'connection to server at "10.0.0.7", port 5432 failed: FATAL:  password authentication failed for user '
        '"orders"\n\tIs the server running on that host?'
    )

    assert scrub(said) == (
        'connection to server at "10.0.0.7", port 5432 failed: FATAL: password authentication failed for user '
        '"orders" | Is the server running on that host?'
    )


def test_a_long_text_is_cut_to_the_limit_it_is_given() -> None:
    assert len(scrub("x " * 10_000)) == MESSAGE_LIMIT
    assert scrub("x " * 10_000, EXCERPT_LIMIT).endswith("…")
    assert len(scrub("x " * 10_000, EXCERPT_LIMIT)) == EXCERPT_LIMIT


def test_the_api_servers_sentence_is_its_status_message_without_the_values_it_refused() -> None:
    body = '{"kind": "Status", "reason": "Invalid", "message": "' + INVALID_OBJECT.replace('"', '\\"') + '"}'

    said = api_server_said(422, "Unprocessable Entity", body)

    assert said.startswith('StatefulSet.apps "orders-db-16" is invalid: [spec.template.spec.containers[0].env[0]')
    assert SECRET not in said
    assert api_server_said(503, "Service Unavailable", "<html>not json</html>") == "Service Unavailable"
    assert api_server_said(500, None, None) == "HTTP 500"


def _recorded(exception: BaseException) -> Failure:
    """The failure Temporal records for `exception`, through ferry's data converter."""
    converter = data_converter()
    failure = Failure()
    converter.failure_converter.to_failure(exception, converter.payload_converter, failure)
    return failure


def test_temporal_records_a_database_error_with_its_sqlstate_and_without_its_detail() -> None:
    failure = _recorded(psycopg.errors.UniqueViolation(DUPLICATE_KEY))

    assert failure.message == 'duplicate key value violates unique constraint "customers_email_key" (SQLSTATE 23505)'
    assert failure.application_failure_info.type == "UniqueViolation"


def test_temporal_records_an_api_servers_answer_as_its_sentence_not_as_an_http_dump() -> None:
    error = ApiException(status=422, reason="Unprocessable Entity")
    error.body = '{"kind": "Status", "message": "' + INVALID_OBJECT.replace('"', '\\"') + '"}'
    error.headers = {"Audit-Id": "0b6c"}

    failure = _recorded(error)

    assert failure.message.startswith('the Kubernetes API server answered 422: StatefulSet.apps "orders-db-16"')
    assert SECRET not in failure.message
    assert "Audit-Id" not in failure.message


def test_every_failure_of_a_chain_is_scrubbed_on_its_way_into_the_history() -> None:
    try:
        try:
            raise psycopg.errors.CheckViolation(RESTORE_REFUSED_A_ROW)
        except psycopg.Error as error:
            raise ApplicationError(f"could not restore: {error}", type="RestoreFailed") from error
    except ApplicationError as raised:
        failure = _recorded(raised)

    assert failure.message.startswith('could not restore: pg_restore: error: COPY failed for table "customers"')
    assert failure.cause.message.endswith('violates check constraint "customers_email_allowed" (SQLSTATE 23514)')
    assert SECRET not in str(failure)
