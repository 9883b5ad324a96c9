"""Connection details and credentials from the Kubernetes Secrets a Migration names, kept out of every record.

Workflow inputs carry only Secret names; the activities read the values here, at the
moment they connect. The values never go into a Temporal payload, a log line, an
Event or the status: the types below leave the password out of their repr, and
`redact` scrubs it from any text that came back from a server or a tool before that
text becomes part of an error message (which the saga shows in status and Events).

A database Secret may also say how to secure the connection: `sslmode` (libpq's) and
`ca.crt`, the PEM certificate of the CA that signed the server's certificate (the key
cert-manager writes). With a CA the default is verify-full, which checks the certificate
and the host name; without one, libpq's own default, prefer. Both are read and checked
here, so that a typo is refused by the precheck, naming the Secret and the key, instead
of surfacing as a connection error.

The Secrets a Migration names are protected while ferry may still need them, the way
Kubernetes protects a claim a Pod uses: the precheck puts the Migration's own finalizer
(`secret_finalizer`) on each (SecretProtection), and the watcher takes it off when it
releases the Migration (watcher/deletion.py), or sees it go. A Secret deleted meanwhile,
e.g. with its Migration by `kubectl delete -k`, stays readable until then, so the undos
can still connect. A precheck attempt that runs late (its worker stood still past the
heartbeat timeout) may mark the Secrets after that release: so it reads the Migration
after marking them, and if the Migration is gone or no longer held by ferry, it takes its
mark off again and fails for good. Either its read sees that, or the deletion comes after
the mark and the watcher, seeing the Migration go, takes the mark off.

An undo that cannot read a Secret all the same (a run that passed its precheck before
ferry did this, a finalizer removed by hand) fails with SecretUnreadable, which is
retried: the rollback waits for a person to create the Secret again instead of stopping
at its first attempt with the source frozen.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from activities import kube_calls
from activities.api_refusals import server_message
from ferry.api.errors import InvalidSpec, MissingSecret, PermissionDenied
from ferry.api.migration import FINALIZER, GROUP, PLURAL, VERSION, DatabaseIdentity, secret_finalizer
from ferry.api.saga import MigrationRef

DATABASE_KEYS = ("host", "port", "username", "password", "database")
PORT_MAX = 65535
SSLMODE_KEY = "sslmode"
CA_KEY = "ca.crt"
DATABASE_TLS_KEYS = (SSLMODE_KEY, CA_KEY)
"""Optional keys of a database Secret."""
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
"""libpq's sslmode values, from no TLS to a verified certificate and host name."""
VERIFYING_MODES = ("verify-ca", "verify-full")
PEM_CERTIFICATE = "-----BEGIN CERTIFICATE-----"
REPLICATION_KEYS = ("replicationHost", "replicationPort")
"""Optional keys of a source Secret: where the target's server reaches the source for logical replication (mode
Online), when that is not where the worker reaches it, e.g. the source's Service in the cluster."""
S3_KEYS = ("accessKeyId", "secretAccessKey")
REDACTED = "[redacted]"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
"""A Secret's finalizers merge under this patch (their patch strategy is merge): one finalizer is added or removed
without a read, and the others, another Migration's or another controller's, stay as they are."""
MIGRATION_UNHELD = "MigrationUnheld"
"""Type of the non-retryable failure of a precheck that marked the Secrets of a Migration nothing holds for ferry any
more (gone, created again, or being deleted without ferry's finalizer): it took its mark off again."""


class SecretUnreadable(Exception):
    """An undo could not read a Secret the Migration names. Not a PermanentError, so retried: a person can create
    the Secret again, and the rollback goes on from there instead of stopping with the source frozen."""


@dataclasses.dataclass(frozen=True)
class DatabaseConnection:
    """One database, as a database Secret describes it."""

    host: str
    port: int
    username: str
    password: str = dataclasses.field(repr=False)
    database: str
    secret: str
    """namespace/name of the Secret, for messages."""
    sslmode: str | None = None
    """libpq's sslmode, from the Secret's key 'sslmode'; None for the default (see `tls_mode`)."""
    ca_certificate: str | None = dataclasses.field(default=None, repr=False)
    """PEM certificate(s) of the CA that signed the server's certificate, from the Secret's key 'ca.crt'."""
    replication_host: str | None = None
    """Where the target's server reaches this database for logical replication (default: host)."""
    replication_port: int | None = None
    """The port there (default: port)."""
    identity: DatabaseIdentity | None = None
    """The database the precheck found under this Secret (activities/postgres/identity.py): every session checks it
    reaches that one. None before the precheck has recorded it, or for a Migration from before it did."""

    def describe(self) -> str:
        return f"database {self.database!r} on {self.host}:{self.port} (user {self.username!r}, Secret {self.secret})"

    def tls_mode(self) -> str:
        """The sslmode to connect with: the Secret's, else verify-full with a CA, else prefer (libpq's default)."""
        if self.sslmode:
            return self.sslmode
        return "verify-full" if self.ca_certificate else "prefer"

    def redact(self, text: str) -> str:
        """`text` without the password, e.g. an error message from the server or from pg_dump."""
        return text.replace(self.password, REDACTED) if self.password else text


@dataclasses.dataclass(frozen=True)
class S3Credentials:
    """The snapshot bucket's credentials, as the S3 Secret holds them."""

    access_key_id: str
    secret_access_key: str = dataclasses.field(repr=False)
    secret: str
    """namespace/name of the Secret, for messages."""


class Secrets(Protocol):
    """Where activities get connections from: the Kubernetes Secrets (SecretReader), or fixed ones in a benchmark."""

    def database(self, namespace: str, name: str, field: str) -> DatabaseConnection: ...

    def s3_credentials(self, namespace: str, name: str) -> S3Credentials: ...


class SecretReader:
    """Reads the Secrets a Migration names, in the Migration's namespace."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._core = k8s.CoreV1Api(api_client)

    def database(self, namespace: str, name: str, field: str) -> DatabaseConnection:
        """The connection a database Secret describes; `field` names where the Migration refers to it."""
        data = self._read(namespace, name, field, DATABASE_KEYS, (*DATABASE_TLS_KEYS, *REPLICATION_KEYS))
        port = _port(data["port"], "port", f"{namespace}/{name}", field, "set it to the database's TCP port, e.g. 5432")
        sslmode, ca = data.get(SSLMODE_KEY, "").strip() or None, data.get(CA_KEY, "").strip() or None
        _check_tls(field, f"{namespace}/{name}", sslmode, ca)
        return DatabaseConnection(
            host=data["host"],
            port=port,
            username=data["username"],
            password=data["password"],
            database=data["database"],
            secret=f"{namespace}/{name}",
            sslmode=sslmode,
            ca_certificate=ca,
            replication_host=data.get("replicationHost") or None,
            replication_port=_replication_port(data.get("replicationPort"), f"{namespace}/{name}", field),
        )

    def s3_credentials(self, namespace: str, name: str) -> S3Credentials:
        data = self._read(namespace, name, "spec.snapshot.credentialsSecret", S3_KEYS)
        return S3Credentials(
            access_key_id=data["accessKeyId"],
            secret_access_key=data["secretAccessKey"],
            secret=f"{namespace}/{name}",
        )

    def _read(
        self, namespace: str, name: str, field: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()
    ) -> dict[str, str]:
        """The values of `keys`, which must be there, and of those of `optional` that are."""
        try:
            secret = self._core.read_namespaced_secret(name, namespace)
        except ApiException as error:
            if kube_calls.is_not_found(error):
                raise MissingSecret(
                    f"{field}: Secret {namespace}/{name} does not exist. Create it with the keys {', '.join(keys)}."
                ) from None
            if error.status == 403:
                raise MissingSecret(
                    f"{field}: ferry's worker may not read Secret {namespace}/{name}: it reads Secrets only in the "
                    f"namespaces it is given. Add {namespace} to them (the chart's worker.secretNamespaces, or "
                    f"`ferry rbac --secret-namespaces` for deploy/rbac/worker_secrets.yaml) and apply."
                ) from None
            # Only the status line: an API error's body is not something to carry into a record.
            raise RuntimeError(f"could not read Secret {namespace}/{name}: {error.status} {error.reason}") from None
        encoded: dict[str, str] = secret.data or {}
        missing = [key for key in keys if key not in encoded]
        if missing:
            raise MissingSecret(
                f"{field}: Secret {namespace}/{name} has no key {', '.join(repr(key) for key in missing)}. "
                f"Add {'it' if len(missing) == 1 else 'them'}; the Secret needs {', '.join(keys)}."
            )
        return {key: base64.b64decode(encoded[key]).decode() for key in (*keys, *optional) if key in encoded}


@contextlib.contextmanager
def retried_until_readable(what: str) -> Iterator[None]:
    """Turns a Secret that cannot be read (MissingSecret) into SecretUnreadable, which is retried, inside `what`,
    an undo or the check before one: there it is no reason to stop the rollback for good."""
    try:
        yield
    except MissingSecret as error:
        raise SecretUnreadable(
            f"{error} {what} needs it and tries again until it can read it; the rollback waits for it."
        ) from None


class SecretProtection:
    """Puts the Migration's finalizer on the Secrets it names, so that none goes while ferry may still need it."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)

    def protect(self, ref: MigrationRef, secrets: Mapping[str, str]) -> None:
        """Adds `secret_finalizer(ref.uid)` to each Secret of `secrets` (name to the field naming it), then makes sure
        the Migration is still there for the watcher to release them.

        Idempotent: the finalizer merges into the Secret's list, once. A Secret that does not exist is left to the
        precheck, which names the keys it needs; one being deleted cannot take a new finalizer and is refused here.

        Then one read of the Migration. If it is gone, another object (created again under the name), or being
        deleted without ferry's finalizer, no release of the watcher's may come after this mark (a late attempt of
        the precheck, say, after the watcher let the Migration go): the mark is taken off again, and the precheck
        fails for good (MIGRATION_UNHELD). Otherwise the Migration goes only later, and the watcher takes the mark
        off then, when it releases the Migration or sees it go.
        """
        finalizer = secret_finalizer(ref.uid)
        for name, field in secrets.items():
            patch = {"metadata": {"finalizers": [finalizer]}}
            try:
                self._core.patch_namespaced_secret(name, ref.namespace, patch, _content_type=STRATEGIC_MERGE_PATCH)
            except ApiException as error:
                if kube_calls.is_not_found(error):
                    continue
                raise _not_protected(error, ref.namespace, name, field) from None
        unheld = self._unheld(ref)
        if unheld is not None:
            raise self._unprotect(ref, secrets, unheld)

    def _unheld(self, ref: MigrationRef) -> str | None:
        """Why nothing holds the Migration for ferry any more, or None while something does."""
        try:
            found: dict[str, Any] = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, ref.namespace, PLURAL, ref.name
            )
        except ApiException as error:
            if kube_calls.is_not_found(error):
                return f"Migration {ref.namespace}/{ref.name} no longer exists"
            raise
        metadata = found.get("metadata") or {}
        if metadata.get("uid") != ref.uid:
            return (
                f"Migration {ref.namespace}/{ref.name} is another object now (created again, uid {metadata.get('uid')})"
            )
        if metadata.get("deletionTimestamp") and FINALIZER not in (metadata.get("finalizers") or []):
            return (
                f"Migration {ref.namespace}/{ref.name} is being deleted, and ferry's finalizer {FINALIZER} does not "
                "hold it"
            )
        return None

    def _unprotect(self, ref: MigrationRef, secrets: Mapping[str, str], unheld: str) -> ApplicationError:
        """Takes the mark `protect` put on the Secrets off again; the failure to raise, saying why."""
        finalizer = secret_finalizer(ref.uid)
        patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": [finalizer]}}
        kept: dict[str, str] = {}
        for name in secrets:
            try:
                self._core.patch_namespaced_secret(name, ref.namespace, patch, _content_type=STRATEGIC_MERGE_PATCH)
            except ApiException as error:
                if not kube_calls.is_not_found(error):
                    kept[name] = f"{error.status} {error.reason}"
        left = ""
        if kept:
            listed = ", ".join(f"{name} ({why})" for name, why in kept.items())
            left = (
                f"; it could not take it off Secret {listed}: remove it by hand, e.g. kubectl patch secret "
                f"{next(iter(kept))} -n {ref.namespace} -p "
                f'\'{{"metadata":{{"$deleteFromPrimitiveList/finalizers":["{finalizer}"]}}}}\''
            )
        return ApplicationError(
            f"{unheld}: ferry no longer holds it, so nothing is to be done for it. The precheck took the finalizer "
            f"{finalizer} it had just put on its Secrets off again{left}, and did nothing else",
            type=MIGRATION_UNHELD,
            non_retryable=True,
        )


def _not_protected(error: ApiException, namespace: str, name: str, field: str) -> Exception:
    if error.status == 403:
        return PermissionDenied(
            f"{field}: ferry's worker may read Secret {namespace}/{name} but not mark it in use (patch): the grant of "
            f"`ferry rbac` (or the chart's worker secret access) gives both; render and apply it again."
        )
    if error.status == 422:
        return MissingSecret(
            f"{field}: Secret {namespace}/{name} is being deleted ({server_message(error)}). Wait until it is gone, "
            "create it again, then create the Migration again."
        )
    return RuntimeError(f"could not mark Secret {namespace}/{name} in use: {error.status} {error.reason}")


def _replication_port(value: str | None, secret: str, field: str) -> int | None:
    if not value:
        return None
    advice = "set it to the port where the target's server reaches the source, or remove it to use key 'port'"
    return _port(value, "replicationPort", secret, field, advice)


def _port(value: str, key: str, secret: str, field: str, advice: str) -> int:
    """A TCP port from a Secret's key, 1 to 65535; the value itself is never shown (it is in a Secret)."""
    try:
        port = int(value.strip())
    except ValueError:
        port = 0
    if not 1 <= port <= PORT_MAX:
        raise InvalidSpec(f"{field}: key '{key}' of Secret {secret} is not a TCP port (1 to {PORT_MAX}); {advice}.")
    return port


def _check_tls(field: str, secret: str, sslmode: str | None, ca: str | None) -> None:
    """Refuses an sslmode libpq does not know, a verifying one without a CA, and a CA that is not PEM."""
    if sslmode is not None and sslmode not in SSL_MODES:
        raise InvalidSpec(
            f"{field}: key '{SSLMODE_KEY}' of Secret {secret} is {sslmode!r}, which is no sslmode. Use one of "
            f"{', '.join(SSL_MODES)} (verify-full, with the server's CA in key '{CA_KEY}', checks its certificate and "
            "host name), or remove the key for the default: verify-full with a CA, else prefer."
        )
    if sslmode in VERIFYING_MODES and ca is None:
        raise InvalidSpec(
            f"{field}: key '{SSLMODE_KEY}' of Secret {secret} is {sslmode}, but the Secret has no key '{CA_KEY}' to "
            f"verify the server's certificate with. Add the PEM certificate of the CA that signed it as '{CA_KEY}'."
        )
    if ca is not None and PEM_CERTIFICATE not in ca:
        raise InvalidSpec(
            f"{field}: key '{CA_KEY}' of Secret {secret} holds no PEM certificate (no '{PEM_CERTIFICATE}' line). "
            "Put there the certificate of the CA that signed the database server's certificate, PEM-encoded."
        )


def secrets_from(api_client: k8s.ApiClient | None, fixed: Secrets | None) -> Secrets:
    """`fixed` when given (a benchmark's own connections), else the Secrets read through `api_client`."""
    if fixed is not None:
        return fixed
    assert api_client is not None, "without fixed secrets, the activities read them through an API client"
    return SecretReader(api_client)
