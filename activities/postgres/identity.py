"""Which databases a Migration is for: pinned by the precheck, checked by every later session.

Every activity reads the database Secrets again when it starts, so that a rotated password
or a moved host is picked up. But a Secret edited mid-run to name another database (another
`database`, or a host that is another server) would have the freeze, the snapshot, verify
and the undos act on that one: a freeze of a database nobody planned for, a copy of the
wrong data switched to and reported Succeeded, an undo that finds no marker of its own there
and counts as done while the real source stays frozen.

So the precheck records, in the Migration's status (`status.databases`, written under a
field manager of its own, which the saga's status mirror leaves alone), which database each
Secret reached: the server's system identifier and the database's oid. Every later activity
reads that record with its Secrets (`Pins.database`), and every session it opens compares the
database it reached with it (connection.py), raising DatabaseReplaced, retried, on another
one. Pointing the Secret back lets the step, or the undo, go on. A physical replica keeps
the system identifier and oids of its primary, so a failover, like a new password or a new
address, changes nothing. A Migration whose precheck recorded nothing (a ferry from before
this record, or no Kubernetes API to keep it in) is not checked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kubernetes import client as k8s

from activities import kube_calls
from activities.known_versions import KnownVersions
from activities.secrets import DatabaseConnection, Secrets
from ferry.api.migration import GROUP, PLURAL, VERSION, CheckedDatabases
from ferry.api.saga import MigrationRef

FIELD_MANAGER = "ferry-precheck"
"""The field manager of status.databases: not the saga's, whose applies would otherwise remove it."""

SIDES = {"spec.driver.sourceSecret": "source", "spec.driver.targetSecret": "target"}
"""The side of the Migration a database Secret's field names."""


class Pins:
    """Reads and writes the record of the databases a Migration is for, in its status."""

    def __init__(
        self, secrets: Secrets, api_client: k8s.ApiClient | None, versions: KnownVersions | None = None
    ) -> None:
        """`secrets` reads the database Secrets; `api_client` None (no Kubernetes API, or Secrets from elsewhere, as in
        a benchmark) records and checks nothing. `versions`: the worker's cache of the versions its status writes
        produced (known_versions.py), told of the record's write so that the saga's next status write need not read
        again."""
        self._secrets = secrets
        self._custom = k8s.CustomObjectsApi(api_client) if api_client is not None else None
        self._versions = versions

    def record(self, ref: MigrationRef, checked: CheckedDatabases) -> None:
        """Writes what the precheck found into the status of the Migration `ref`, if it is still there."""
        custom = self._custom
        if custom is None:
            return

        def write() -> None:
            migration = self._read(ref)
            if migration is None:
                return  # gone, or created again: the precheck's Secret protection fails it (MigrationUnheld)
            status = {"databases": checked.model_dump(mode="json", by_alias=True, exclude_none=True)}
            applied = kube_calls.migration_status_apply(ref, migration["metadata"]["resourceVersion"], status)
            written: dict[str, Any] = custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, ref.namespace, PLURAL, ref.name, applied, field_manager=FIELD_MANAGER, force=True,
                _content_type=kube_calls.APPLY_PATCH,
            )  # fmt: skip
            if self._versions is not None:
                self._versions.remember(written)

        kube_calls.retry_on_conflict(write)

    def database(self, ref: MigrationRef, secret: str, field: str) -> DatabaseConnection:
        """The database Secret `secret` at `field`, as read now, with the identity the precheck recorded for its side,
        if any: every session opened with it checks it reaches that database."""
        db = self._secrets.database(ref.namespace, secret, field)
        migration = self._read(ref)
        if migration is None:
            return db
        recorded = (migration.get("status") or {}).get("databases")
        checked = CheckedDatabases.model_validate(recorded) if recorded is not None else None
        identity = getattr(checked, SIDES[field]) if checked is not None else None
        return dataclasses.replace(db, identity=identity) if identity is not None else db

    def _read(self, ref: MigrationRef) -> dict[str, Any] | None:
        """The Migration `ref` as raw JSON; None without an API, when it is gone, or when it was created again."""
        if self._custom is None:
            return None
        migration = kube_calls.read_migration(self._custom, ref.namespace, ref.name)
        return migration if migration is not None and migration["metadata"].get("uid") == ref.uid else None
