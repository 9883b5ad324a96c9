"""The precheck's warning (mode Online) when the source keeps WAL for a replication slot without bound.

With max_slot_wal_keep_size -1, PostgreSQL's default, a slot whose consumer stops
confirming keeps every change from then on: a replication that breaks while the source
takes writes (a column added on the source and written, the target down or its disk
full) grows the source's pg_wal until its disk fills and the live source stops. ferry
watches the replication while it waits before the freeze (see watching) and rolls back
when it breaks, but only a bound protects the source when ferry cannot act (its worker
down for longer than the disk lasts). Not a problem that stops the migration: a warning,
recorded as an Event on the Migration.
"""

from __future__ import annotations

import logging

import psycopg

from activities.postgres.connection import connect
from activities.secrets import DatabaseConnection
from activities.settings import DataActivitySettings
from ferry.api.errors import PermanentError

log = logging.getLogger("ferry.activities.precheck")
REASON = "UnboundedSlotWal"
"""The reason of the Warning Event that carries the warning."""


def unbounded_wal(source: DatabaseConnection, settings: DataActivitySettings) -> str | None:
    """The warning, when the source's server has max_slot_wal_keep_size -1; None otherwise, or when it cannot tell
    (the precheck's own checks report a source they cannot read)."""
    try:
        with connect(source, settings, default_transaction_read_only="on") as conn:
            row = conn.execute("select current_setting('max_slot_wal_keep_size')").fetchone()
    except (PermanentError, psycopg.Error) as error:
        log.warning("could not read max_slot_wal_keep_size of %s: %s", source.describe(), error)
        return None
    if row is None or str(row[0]).strip() != "-1":
        return None
    return (
        f"the server of {source.describe()} has max_slot_wal_keep_size = -1: the replication slot of mode Online keeps "
        "every change the target has not confirmed, so a replication that breaks (a column added on the source and "
        "written, the target down or its disk full) would keep the source's WAL until its disk fills and it stops "
        "taking writes. ferry watches the replication while the migration waits before the freeze and rolls back "
        "when it breaks, but a bound protects the source even when ferry cannot act: set max_slot_wal_keep_size to "
        "the WAL the source's disk can spare, e.g. ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'; SELECT "
        "pg_reload_conf()."
    )
