"""Failures that retrying cannot fix are named errors (non-retryable in the saga) that say what to do, and no secret."""

from __future__ import annotations

import dataclasses

import pytest
from kubernetes import client as k8s

from activities.secrets import SecretUnreadable
from devstack.stack.readiness import free_port
from devstack.stack.stack import StackInfo
from ferry.api.errors import (
    NON_RETRYABLE_TYPES,
    BadCredentials,
    BucketMissing,
    DatabaseUnreachable,
    InvalidSpec,
    MissingSecret,
    PermanentError,
)
from ferry.api.migration import DriverSpec
from tests.end_to_end import SOURCE_SECRET, TARGET_SECRET, Databases
from tests.postgres.conftest import Steps, create_secret

BROKEN = "broken-db"


def _connection(databases: Databases, **changes: str) -> dict[str, str]:
    source = databases.source
    data = {
        "host": source.host,
        "port": str(source.port),
        "username": source.user,
        "password": source.password,
        "database": source.database,
    }
    return {key: value for key, value in {**data, **changes}.items() if value}


def _with_source(steps: Steps, secret: str) -> Steps:
    return dataclasses.replace(steps, driver=DriverSpec(source_secret=secret, target_secret=TARGET_SECRET))


def test_a_wrong_password_fails_with_bad_credentials_naming_the_secret_but_not_the_password(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    wrong = "not-the-password-3f9a"
    create_secret(kube_api, namespace, BROKEN, _connection(databases, password=wrong))

    with pytest.raises(BadCredentials) as raised:
        _with_source(steps, BROKEN).freeze()

    message = str(raised.value)
    assert f"Secret {namespace}/{BROKEN}" in message
    assert "password authentication failed" in message
    assert wrong not in message
    assert databases.source.password not in message
    assert "BadCredentials" in NON_RETRYABLE_TYPES


def test_an_unreachable_database_fails_with_database_unreachable_after_a_few_attempts(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    closed = free_port()
    create_secret(kube_api, namespace, BROKEN, _connection(databases, port=str(closed)))

    with pytest.raises(DatabaseUnreachable) as raised:
        _with_source(steps, BROKEN).snapshot()

    assert str(raised.value).startswith(
        f"could not connect to database '{databases.source.database}' on 127.0.0.1:{closed} "
        f"(user 'postgres', Secret {namespace}/{BROKEN}) in 2 attempts: "
    )
    assert "Check that the database is running" in str(raised.value)
    assert "DatabaseUnreachable" in NON_RETRYABLE_TYPES


def test_a_database_that_does_not_exist_is_an_invalid_spec(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    create_secret(kube_api, namespace, BROKEN, _connection(databases, database="no_such_db"))

    with pytest.raises(InvalidSpec, match=rf"Create it, or fix the key 'database' in Secret {namespace}/{BROKEN}"):
        _with_source(steps, BROKEN).freeze()


def test_a_missing_secret_key_fails_with_missing_secret_naming_the_key(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    create_secret(kube_api, namespace, BROKEN, _connection(databases, password=""))

    with pytest.raises(MissingSecret) as raised:
        _with_source(steps, BROKEN).freeze()

    assert str(raised.value) == (
        f"spec.driver.sourceSecret: Secret {namespace}/{BROKEN} has no key 'password'. "
        "Add it; the Secret needs host, port, username, password, database."
    )


def test_a_missing_secret_fails_with_missing_secret(steps: Steps, namespace: str) -> None:
    with pytest.raises(MissingSecret, match=rf"Secret {namespace}/nowhere does not exist. Create it with the keys"):
        _with_source(steps, "nowhere").freeze()


def test_an_undo_that_cannot_read_its_secret_fails_to_be_retried_naming_the_secret_to_create(
    steps: Steps, namespace: str
) -> None:
    """A forward step stops at a missing Secret (above); an undo is tried again, so that the rollback waits for the
    Secret instead of ending with the source frozen. SecretUnreadable is no PermanentError: retry policies retry it."""
    with pytest.raises(SecretUnreadable, match=rf"Secret {namespace}/nowhere does not exist. Create it") as raised:
        _with_source(steps, "nowhere").undo_freeze()

    assert "the unfreeze needs it and tries again" in str(raised.value)
    assert not isinstance(raised.value, PermanentError)


def test_a_missing_bucket_fails_with_bucket_missing(steps: Steps, databases: Databases) -> None:
    gone = dataclasses.replace(steps, snapshot_spec=steps.snapshot_spec.model_copy(update={"bucket": "no-such-bucket"}))

    with pytest.raises(BucketMissing, match=r"bucket 'no-such-bucket' does not exist. Create it"):
        gone.snapshot()

    assert "BucketMissing" in NON_RETRYABLE_TYPES


def test_a_wrong_s3_secret_key_fails_with_bad_credentials(
    steps: Steps, stack: StackInfo, kube_api: k8s.ApiClient, namespace: str
) -> None:
    assert stack.s3_access_key is not None
    create_secret(kube_api, namespace, "wrong-s3", {"accessKeyId": stack.s3_access_key, "secretAccessKey": "nope"})
    wrong = dataclasses.replace(
        steps, snapshot_spec=steps.snapshot_spec.model_copy(update={"credentials_secret": "wrong-s3"})
    )

    with pytest.raises(BadCredentials, match=rf"S3 refused the credentials in Secret {namespace}/wrong-s3"):
        wrong.snapshot()


def test_the_source_secret_is_read_from_the_migrations_namespace(steps: Steps) -> None:
    assert steps.driver.source_secret == SOURCE_SECRET
    elsewhere = dataclasses.replace(steps, ref=steps.ref.model_copy(update={"namespace": "default"}))

    with pytest.raises(MissingSecret, match=rf"Secret default/{SOURCE_SECRET} does not exist"):
        elsewhere.freeze()
