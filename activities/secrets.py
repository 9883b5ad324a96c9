"""Connection details and credentials from the Kubernetes Secrets a Migration names, kept out of every record.

Workflow inputs carry only Secret names; the activities read the values here, at the
moment they connect. The values never go into a Temporal payload, a log line, an
Event or the status: the types below leave the password out of their repr, and
`redact` scrubs it from any text that came back from a server or a tool before that
text becomes part of an error message (which the saga shows in status and Events).
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Protocol

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from activities import kube_calls
from ferry.api.errors import InvalidSpec, MissingSecret

DATABASE_KEYS = ("host", "port", "username", "password", "database")
S3_KEYS = ("accessKeyId", "secretAccessKey")
REDACTED = "[redacted]"


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

    def describe(self) -> str:
        return f"database {self.database!r} on {self.host}:{self.port} (user {self.username!r}, Secret {self.secret})"

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
        data = self._read(namespace, name, field, DATABASE_KEYS)
        try:
            port = int(data["port"])
        except ValueError:
            raise InvalidSpec(
                f"{field}: key 'port' of Secret {namespace}/{name} is not a port number; set it to the database's "
                "TCP port, e.g. 5432."
            ) from None
        return DatabaseConnection(
            host=data["host"],
            port=port,
            username=data["username"],
            password=data["password"],
            database=data["database"],
            secret=f"{namespace}/{name}",
        )

    def s3_credentials(self, namespace: str, name: str) -> S3Credentials:
        data = self._read(namespace, name, "spec.snapshot.credentialsSecret", S3_KEYS)
        return S3Credentials(
            access_key_id=data["accessKeyId"],
            secret_access_key=data["secretAccessKey"],
            secret=f"{namespace}/{name}",
        )

    def _read(self, namespace: str, name: str, field: str, keys: tuple[str, ...]) -> dict[str, str]:
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
        return {key: base64.b64decode(encoded[key]).decode() for key in keys}


def secrets_from(api_client: k8s.ApiClient | None, fixed: Secrets | None) -> Secrets:
    """`fixed` when given (a benchmark's own connections), else the Secrets read through `api_client`."""
    if fixed is not None:
        return fixed
    assert api_client is not None, "without fixed secrets, the activities read them through an API client"
    return SecretReader(api_client)
