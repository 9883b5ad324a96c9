"""What the source's server keeps outside every client database, which no Migration moves: its maintenance database
`postgres` and its templates.

Every server has a database `postgres`, and template1 (and template0, which accepts no
connections and holds what initdb made). Nobody migrates them, and the precheck does not
count them among the server's other databases, but what people put there stays on the
source when ferry moves one database (pg_dump copies only that one) and stops with it at
scale-down-old: tables an administrator made in `postgres`, pg_cron (which keeps its
jobs there by default, and runs them from there in whatever database they name), an
extension added to template1 so that every new database gets it. So the precheck looks
into each of them (every database `postgres` or template that accepts connections, the
migrated one aside) for relations and extensions other than plpgsql, and names what it
finds. Looking needs CONNECT there, which PUBLIC has unless someone revoked it; where
the Secret's user may not connect, the warning says that nothing was checked.
"""

from __future__ import annotations

import dataclasses

import psycopg

from activities.postgres import schema
from activities.postgres.connection import Connection, connect
from activities.secrets import DatabaseConnection
from activities.settings import DataActivitySettings
from ferry.api.errors import BadCredentials, PermanentError

SHOWN = 5
"""Relations (or extensions) named per database."""
DATABASES = """
select datname from pg_database
where datallowconn and datname <> current_database() and (datname = 'postgres' or datistemplate)
order by datname <> 'postgres', datname
"""
"""The maintenance database and the templates a session may enter (template0 may not), the migrated one aside."""
RELATIONS = f"""
select n.nspname || '.' || c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.relkind in ('r', 'p', 'v', 'm', 'S', 'f') and {schema.USER}
and {schema.NOT_EXTENSION_MEMBER.format(catalog="'pg_class'", oid="c.oid")}
order by 1
"""
"""Relations someone made, not those of an extension (the extension is named instead)."""
EXTENSIONS = "select extname from pg_extension where extname <> 'plpgsql' order by 1"


@dataclasses.dataclass(frozen=True)
class Held:
    """What one of those databases holds, or why it could not be looked into."""

    database: str
    relations: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()
    unchecked: str | None = None
    """Why ferry could not look; None when it did."""

    def __bool__(self) -> bool:
        return bool(self.relations or self.extensions or self.unchecked)


def read(conn: Connection, db: DatabaseConnection, settings: DataActivitySettings, **session: str) -> tuple[Held, ...]:
    """What `postgres` and the templates of the server of `conn` (a session in `db`) hold, where they hold anything:
    each in a session of its own as the same user."""
    held = []
    for (name,) in conn.execute(DATABASES).fetchall():
        there = dataclasses.replace(db, database=str(name), identity=None)
        try:
            with connect(there, settings, **session) as other:
                found = Held(
                    str(name),
                    tuple(str(relation) for (relation,) in other.execute(RELATIONS).fetchall()),
                    tuple(str(extension) for (extension,) in other.execute(EXTENSIONS).fetchall()),
                )
        except BadCredentials:
            found = Held(
                str(name), unchecked=f"the user in Secret {db.secret} may not connect to it: no CONNECT, or pg_hba.conf"
            )
        except PermanentError as error:
            found = Held(str(name), unchecked=str(error).split(". ", 1)[0])
        except psycopg.Error as error:
            found = Held(str(name), unchecked=f"reading it failed: {type(error).__name__}")
        if found:
            held.append(found)
    return tuple(held)


def warnings(db: DatabaseConnection, held: tuple[Held, ...]) -> list[str]:
    """A warning naming what stays behind on the source's server, and one for each database that was not checked."""
    found = [one for one in held if one.unchecked is None]
    said = []
    if found:
        parts = "; ".join(f"{_named(one.database)} holds {_contents(one)}" for one in found)
        said.append(
            f"the source's server keeps more than database {db.database!r}, which ferry moves alone (pg_dump copies "
            f"one database): {parts}. That stays on the source, and scale-down-old stops it with the server: pg_cron's "
            "jobs (kept in database 'postgres' by default) stop running, and a template's objects no longer reach new "
            "databases. If the application needs them, make them on the target's server (its own 'postgres', or "
            "template1) before traffic moves there."
        )
    for one in held:
        if one.unchecked is not None:
            said.append(
                f"ferry could not look into {_named(one.database)} of the source's server ({one.unchecked}), so it "
                f"cannot tell whether something there would stay behind when it moves {db.database!r} alone (pg_cron "
                "keeps its jobs in database 'postgres' by default). Look yourself (\\dt *.* and \\dx there), or "
                f"GRANT CONNECT ON DATABASE {_quoted(one.database)} TO {_quoted(db.username)} (and let pg_hba.conf "
                "admit it) for the next precheck."
            )
    return said


def _named(database: str) -> str:
    return "the maintenance database 'postgres'" if database == "postgres" else f"the template {database!r}"


def _contents(held: Held) -> str:
    kinds = [(held.relations, "relation"), (held.extensions, "extension")]
    return " and ".join(f"the {kind}s {_listed(names)}" for names, kind in kinds if names)


def _listed(names: tuple[str, ...]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
