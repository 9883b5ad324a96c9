"""Mode Online's first act: the source's schema, without its data, restored into the target.

Logical replication carries rows, not tables: the target must already have every table
(and, for verify, every index, constraint, view, function and sequence) before the
subscription copies the rows. pg_dump --schema-only of the worker's newest tools writes
it, pg_restore restores it in one transaction, without owners, privileges and tablespaces,
as migrate does. The dump is small (no data), so it is read whole before pg_restore starts.
Publications and subscriptions of the source are left out: they belong to the source.
"""

from __future__ import annotations

from activities.heartbeats import Heartbeats
from activities.postgres import tablespaces, tls
from activities.postgres.tools import Tool, conninfo, find_bindir
from activities.secrets import DatabaseConnection
from activities.settings import DataActivitySettings
from ferry.api.errors import BadCredentials


def copy(
    source: DatabaseConnection, target: DatabaseConnection, settings: DataActivitySettings, heartbeats: Heartbeats
) -> int:
    """Restores the source's schema into the (empty) target; returns the size of the dump in bytes."""
    bindir = find_bindir(settings.postgres_bindir)
    dump_argv = [
        str(bindir / "pg_dump"),
        f"--dbname={conninfo(source, settings)}",
        "--schema-only",
        "--format=custom",
        "--no-publications",
        "--no-subscriptions",
        "--no-password",
    ]
    with Tool(dump_argv, source, settings, reads=False, writes=True) as dump:
        heartbeats.on_cancel(dump.kill)
        schema = dump.stdout.read()
        code = dump.wait()
        heartbeats.raise_if_cancelled("dumping the source's schema")
        if code != 0:
            failure = dump.failure(code)
            refused = tls.refusal(source, failure)
            if refused is not None:
                raise refused
            if "permission denied" in failure:
                raise BadCredentials(
                    f"the user in Secret {source.secret} may not read the schema of {source.describe()}: {failure}. "
                    "Use the database owner or a superuser."
                )
            raise RuntimeError(f"could not dump the schema of {source.describe()}: {failure}")
    restore_argv = [
        str(bindir / "pg_restore"),
        f"--dbname={conninfo(target, settings)}",
        "--format=custom",
        "--single-transaction",
        "--no-owner",
        "--no-privileges",
        tablespaces.RESTORE_OPTION,
        "--no-password",
    ]
    with Tool(restore_argv, target, settings, reads=True, writes=False) as restore:
        heartbeats.on_cancel(restore.kill)
        try:
            restore.stdin.write(schema)
            restore.stdin.close()
        except BrokenPipeError:
            pass  # it stopped reading: its exit code says why
        code = restore.wait()
        heartbeats.raise_if_cancelled("restoring the source's schema")
        if code != 0:
            raise restore.error(code, f"restore the schema into {target.describe()}")
    heartbeats.progress(schema_bytes=len(schema))
    return len(schema)
