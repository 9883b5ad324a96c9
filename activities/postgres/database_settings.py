"""Settings of a database (ALTER DATABASE ... SET): what the freeze changes, and where ferry keeps its markers.

What an activity must remember across attempts lives in the database it is about, as
settings of that database in the catalog pg_db_role_setting, beside the one the freeze
changes:

- `ferry.frozen_by`, `ferry.read_only_before` and `ferry.connect_before` on a frozen
  source: which Migration froze it, its own default_transaction_read_only before
  (UNSET when it had none), and its ACL before CONNECT was revoked (see grants);
  `ferry.frozen_attempt` beside them: which activity of that Migration froze it last,
  so that a late attempt of its undo does not unfreeze a later cycle's freeze (see
  freezing; a freeze by an older ferry has none);
- `ferry.restored_by` on a target: which Migration restored into it, so that a retry
  may clean out what an earlier attempt restored;
- `ferry.verified_mark` on a target: where its writes stood when verify had compared
  it with the source, before traffic moved to it (see unwritten), so that an undo with
  no step results can still tell whether the target took writes since; with the attempt
  of verify that took it, and the seal of the check before switch-traffic, so that a
  late attempt of verify neither ends the target's sessions nor marks it again;
- `ferry.unfrozen_by` on a source: which activity last undid each Migration's freeze, so
  that a late attempt of the freeze does not freeze the source again after its undo
  (see freezing);
- `ferry.replication_ended` on a source of mode Online: which Migrations' replications
  were ended for good, and by which activity, so that a late attempt of replicate
  creates nothing after the end (see replication_ended).

PostgreSQL accepts such dotted placeholder settings (extensions use them); they cost
nothing, and no snapshot carries them, because pg_dump writes a database's settings
only with --create, which ferry does not use. Several changes in one transaction
commit together. Since PostgreSQL 15 only a superuser may set them, unless granted
SET ON PARAMETER for each (precheck says so).
"""

from __future__ import annotations

from psycopg import sql

from activities.postgres.connection import MARKERS, Connection

READ_ONLY = "default_transaction_read_only"
(
    FROZEN_BY,
    READ_ONLY_BEFORE,
    CONNECT_BEFORE,
    RESTORED_BY,
    VERIFIED_MARK,
    REPLICATION_ENDED,
    UNFROZEN_BY,
    FROZEN_ATTEMPT,
) = MARKERS
UNSET = "unset"
"""The recorded previous value of a setting the database did not have: undo resets it."""


def read(conn: Connection) -> dict[str, str]:
    """The database's own settings (not those of a role), as `name: value`."""
    row = conn.execute(
        "select setconfig from pg_db_role_setting where setrole = 0 "
        "and setdatabase = (select oid from pg_database where datname = current_database())"
    ).fetchone()
    entries: list[str] = row[0] if row is not None and row[0] is not None else []
    return dict(entry.split("=", 1) for entry in entries)


def change(conn: Connection, name: str, value: str | None) -> None:
    """Sets `name` for new sessions of the database; None removes it."""
    database = sql.Identifier(conn.info.dbname)
    if value is None:
        conn.execute(sql.SQL("alter database {} reset {}").format(database, sql.SQL(name)))
    else:
        conn.execute(sql.SQL("alter database {} set {} = {}").format(database, sql.SQL(name), sql.Literal(value)))


def role_overrides(conn: Connection, name: str) -> dict[str, str]:
    """Roles with their own value of `name` here (or everywhere), which takes precedence over the database's."""
    rows = conn.execute(
        "select r.rolname, s.setconfig from pg_db_role_setting s join pg_roles r on r.oid = s.setrole "
        "where s.setdatabase in (0, (select oid from pg_database where datname = current_database()))"
    ).fetchall()
    overrides: dict[str, str] = {}
    for role, entries in rows:
        for entry in entries or []:
            key, _, value = entry.partition("=")
            if key == name:
                overrides[role] = value
    return overrides
