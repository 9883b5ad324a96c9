"""Who may connect to the frozen source: CONNECT taken away at the freeze, and given back exactly as it was.

default_transaction_read_only is only a default: a client may open a transaction with
BEGIN READ WRITE, or SET the default back off, and write. So the freeze also revokes
CONNECT on the database from PUBLIC and from every role holding it, except the role
ferry connects as: once their sessions are ended, they cannot come back. What the
fence cannot stop: superusers (privileges do not apply to them), ferry's own role,
and the roles that are members of it (they hold its CONNECT). The freeze names them
(`can_connect`); check_frozen catches what they write.

The database's ACL before the freeze is recorded in the database itself, in the
marker ferry.connect_before, exactly as pg_database.datacl holds it (aclitem[] text, or
`default` when the database has no ACL and PostgreSQL's defaults apply), in the
transaction that freezes. The undo makes the CONNECT entries what the record says:
grants what is missing (as the recorded grantor), revokes what was not there. Effective
privileges after the undo are exactly those before; a database that had no ACL gets
its defaults spelled out, which PostgreSQL treats the same.
"""

from __future__ import annotations

from typing import NamedTuple

import psycopg
from psycopg import sql
from temporalio import activity

from activities.postgres.connection import Connection

DEFAULT = "default"
"""The recorded ACL of a database without one (pg_database.datacl is NULL): PostgreSQL's defaults."""
PUBLIC = "PUBLIC"
PASSES = 3
"""Rounds of granting and revoking before the undo settles for what it could restore (see `restore`)."""


class Grant(NamedTuple):
    """One CONNECT entry of a database's ACL."""

    grantor: str
    grantee: str
    """A role's name, or PUBLIC."""
    grantable: bool


def current(conn: Connection) -> str:
    """The database's ACL as text, `default` when it has none; what `restore` takes back to."""
    row = conn.execute(
        "select coalesce(datacl::text, %s) from pg_database where datname = current_database()", (DEFAULT,)
    ).fetchone()
    assert row is not None
    return str(row[0])


def revoke(conn: Connection) -> list[str]:
    """Revokes CONNECT from everyone but the current user; returns from whom. Safe to run again.

    CASCADE also revokes what a role granted on with its grant option. Should the
    current user have been able to connect only through PUBLIC or another role, it gets
    CONNECT of its own, which the undo takes away again (it is not in the record).
    """
    me = _current_user(conn)
    revoked = sorted({grant.grantee for grant in _connect_grants(conn, current(conn)) if grant.grantee != me})
    for grantee in revoked:
        conn.execute(sql.SQL("revoke connect on database {} from {} cascade").format(_database(conn), _role(grantee)))
    if not _holds_connect(conn):
        conn.execute(sql.SQL("grant connect on database {} to current_user").format(_database(conn)))
    return revoked


def unrestorable(conn: Connection) -> list[Grant]:
    """The database's CONNECT entries that `restore` could not give back as the current user: granted by a role other
    than the owner (with the grant option the owner gave it) that the current user may not act as (SET ROLE needs a
    superuser, or membership of the role, with its SET option since PostgreSQL 16). The freeze's REVOKE ... CASCADE
    takes them away all the same, so the undo would leave those grantees unable to connect."""
    row = conn.execute(
        "select rolsuper, current_setting('server_version_num')::int >= 160000 from pg_roles "
        "where rolname = current_user"
    ).fetchone()
    if row is None or row[0]:
        return []
    option = "SET" if row[1] else "MEMBER"
    owner = _owner(conn)
    found = []
    for grant in _connect_grants(conn, current(conn)):
        if grant.grantor == owner:
            continue
        acts_as = conn.execute("select pg_has_role(current_user, %s, %s)", (grant.grantor, option)).fetchone()
        if not (acts_as and acts_as[0]):
            found.append(grant)
    return found


def can_connect(conn: Connection) -> list[str]:
    """Roles other than the current user that may still log into the database: superusers and holders of CONNECT."""
    rows = conn.execute(
        "select rolname from pg_roles where rolcanlogin and rolname <> current_user "
        "and has_database_privilege(oid, current_database(), 'CONNECT') order by 1"
    ).fetchall()
    return [row[0] for row in rows]


def restore(conn: Connection, recorded: str) -> list[str]:
    """Makes the database's CONNECT entries those of `recorded`; returns the entries it could not restore.

    Grants whose grantor is not the database owner are made as that grantor (SET ROLE),
    which needs a superuser; an entry naming a role dropped meanwhile cannot come back.
    Both are logged and returned, and the rest is restored.
    """
    wanted, unknown = _parse(conn, recorded)
    owner = _owner(conn)
    for _ in range(PASSES):
        present = set(_connect_grants(conn, current(conn)))
        extra, missing = present - wanted, wanted - present
        if not extra and not missing:
            return unknown
        for grant in sorted(extra):
            _as_grantor(conn, grant, owner, "revoke connect on database {} from {} cascade")
        for grant in sorted(missing, key=lambda grant: (grant.grantor != owner, grant)):
            statement = "grant connect on database {} to {} with grant option" if grant.grantable else None
            _as_grantor(conn, grant, owner, statement or "grant connect on database {} to {}")
    left = set(_connect_grants(conn, current(conn))) ^ wanted
    if left:
        activity.logger.warning("could not restore these CONNECT grants exactly: %s", sorted(left))
    return unknown + [f"{grant.grantee} (granted by {grant.grantor})" for grant in sorted(left)]


def _as_grantor(conn: Connection, grant: Grant, owner: str, statement: str) -> None:
    """Runs `statement` (with the database and grantee filled in) as the grant's grantor."""
    query = sql.SQL(statement).format(_database(conn), _role(grant.grantee))
    try:
        with conn.transaction():  # a savepoint: one grant that cannot be made does not undo the others
            if grant.grantor != owner:
                conn.execute(sql.SQL("set local role {}").format(sql.Identifier(grant.grantor)))
            conn.execute(query)
            conn.execute("reset role")
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.InvalidGrantOperation) as error:
        activity.logger.warning("could not %s as %s: %s", query.as_string(conn), grant.grantor, error)


def _parse(conn: Connection, recorded: str) -> tuple[set[Grant], list[str]]:
    """The CONNECT entries of a recorded ACL, and the recorded entries naming roles that no longer exist."""
    if recorded == DEFAULT:
        return set(_connect_grants(conn, DEFAULT)), []
    grants: set[Grant] = set()
    unknown: list[str] = []
    for (item,) in conn.execute("select unnest(%s::text[])", (recorded,)).fetchall():
        try:
            with conn.transaction():
                grants |= set(_connect_grants(conn, "{" + _quote(item) + "}"))
        except psycopg.errors.UndefinedObject:
            activity.logger.warning("the recorded grant %s names a role that no longer exists; skipped", item)
            unknown.append(item)
    return grants, unknown


def _connect_grants(conn: Connection, acl: str) -> list[Grant]:
    source = (
        "acldefault('d', (select datdba from pg_database where datname = current_database()))"
        if acl == DEFAULT
        else "%s::aclitem[]"
    )
    rows = conn.execute(
        f"select pg_get_userbyid(a.grantor), case when a.grantee = 0 then 'PUBLIC' else pg_get_userbyid(a.grantee) "
        f"end, a.is_grantable from aclexplode({source}) a where a.privilege_type = 'CONNECT'",
        () if acl == DEFAULT else (acl,),
    ).fetchall()
    return [Grant(grantor, grantee, grantable) for grantor, grantee, grantable in rows]


def _quote(item: str) -> str:
    """An array element in double quotes, so that an aclitem with quoted names survives the round trip."""
    return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _holds_connect(conn: Connection) -> bool:
    row = conn.execute("select has_database_privilege(current_database(), 'CONNECT')").fetchone()
    return bool(row and row[0])


def _current_user(conn: Connection) -> str:
    row = conn.execute("select current_user").fetchone()
    assert row is not None
    return str(row[0])


def _owner(conn: Connection) -> str:
    row = conn.execute("select pg_get_userbyid(datdba) from pg_database where datname = current_database()").fetchone()
    assert row is not None
    return str(row[0])


def _database(conn: Connection) -> sql.Identifier:
    return sql.Identifier(conn.info.dbname)


def _role(name: str) -> sql.Composable:
    return sql.SQL(PUBLIC) if name == PUBLIC else sql.Identifier(name)
