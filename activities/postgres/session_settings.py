"""The settings a database's sessions get from the catalog, which a migration does not carry, and the statements that
give them to the target.

`ALTER DATABASE shop SET ...`, `ALTER ROLE app IN DATABASE shop SET ...` and `ALTER ROLE
app SET ...` live in pg_db_role_setting, outside the database's contents: pg_dump writes
them only with --create, which ferry does not use (see restoring), and replication does
not carry them either. A source whose sessions run serializable by default, in another
timezone or with another search_path would hand its clients a target that does not, and
nothing would fail: the application would just behave otherwise. So the precheck
compares them and names each one the target lacks or sets otherwise, with the statement
that gives it; it applies none itself (a setting can change what the restore and verify
do, and the roles may not exist on the target's server yet).

Compared are the database's own settings, those of every role in it, and the settings
everywhere of the roles that use it: its owner and the login roles that may connect to
it (on a source this Migration froze already, which took CONNECT from the others, only
its owner's and ferry's: the precheck runs before the freeze). ferry's own markers
(`ferry.*`, see database_settings) are not the application's; on such a frozen source,
default_transaction_read_only is what the freeze recorded before, not the freeze's.

Values of custom settings (those with a dot in their name, `app.jwt_secret` say) are not
shown: applications keep secrets in them, and a warning becomes an Event anyone who may
read the namespace's Events reads. Their statements say where to read the value.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from activities.events import MAX_MESSAGE
from activities.postgres import database_settings
from activities.postgres.connection import Connection
from activities.postgres.database_settings import FROZEN_BY, READ_ONLY, READ_ONLY_BEFORE, UNSET

MARKER_PREFIX = "ferry."
LIST_QUOTED = frozenset(
    {
        "local_preload_libraries",
        "search_path",
        "session_preload_libraries",
        "shared_preload_libraries",
        "temp_tablespaces",
        "unix_socket_directories",
    }
)
"""Settings whose values the catalog keeps as a list of double-quoted names (GUC_LIST_QUOTE), as pg_dump knows them:
their statement gives each element as a literal of its own (`SET search_path = '$user', 'public'`)."""
SETTINGS = """
select r.rolname, s.setdatabase <> 0, s.setconfig
from pg_db_role_setting s
cross join (select oid, datdba from pg_database where datname = current_database()) d
left join pg_roles r on r.oid = s.setrole
where (s.setdatabase = d.oid and (s.setrole = 0 or r.oid is not null))
or (s.setdatabase = 0 and r.oid is not null and (%(every_role)s or r.oid = d.datdba
    or (r.rolcanlogin and has_database_privilege(r.oid, d.oid, 'CONNECT'))))
"""
"""Each row: the role (null for the database's own settings), whether only in this database, its `name=value`s."""
ROLES = "select rolname from pg_roles"
KNOWN = "select lower(name) from pg_settings"
SIMPLE_NAME = re.compile(r"[a-z_][a-z0-9_$]*")


@dataclasses.dataclass(frozen=True)
class Scope:
    """Whose settings: the database's (role None), or a role's in the database (`in_database`) or everywhere."""

    role: str | None = None
    in_database: bool = True


@dataclasses.dataclass(frozen=True)
class SessionSettings:
    """What one server keeps for the sessions of one of its databases."""

    database: str
    settings: Mapping[Scope, Mapping[str, tuple[str, str]]]
    """Per scope, by lower-cased name: the name as the catalog spells it, and its value."""
    roles: frozenset[str] = frozenset()
    """The server's roles (read on the target: a role's statement needs the role there)."""
    known: frozenset[str] = frozenset()
    """The lower-cased names of the server's settings (read on the target: a newer major drops and renames some)."""


def read(conn: Connection, *, every_role: bool) -> SessionSettings:
    """The settings of the current database's sessions, without ferry's markers; with `every_role`, every role's
    settings everywhere and what the target's comparison needs besides, else only those of the roles that use it."""
    found: dict[Scope, dict[str, tuple[str, str]]] = {}
    for role, in_database, entries in conn.execute(SETTINGS, {"every_role": every_role}).fetchall():
        scope = Scope(str(role) if role is not None else None, bool(in_database))
        for entry in entries or []:
            name, _, value = str(entry).partition("=")
            if not name.lower().startswith(MARKER_PREFIX):
                found.setdefault(scope, {})[name.lower()] = (name, value)
    own = database_settings.read(conn)
    if FROZEN_BY in own:  # frozen by this Migration (the precheck refuses any other's freeze)
        before = own.get(READ_ONLY_BEFORE)
        unfrozen = {key: entry for key, entry in found.pop(Scope(), {}).items() if key != READ_ONLY}
        if before is not None and before != UNSET:
            unfrozen[READ_ONLY] = (READ_ONLY, before)
        if unfrozen:
            found[Scope()] = unfrozen
    if not every_role:
        return SessionSettings(conn.info.dbname, found)
    roles = frozenset(str(name) for (name,) in conn.execute(ROLES).fetchall())
    known = frozenset(str(name) for (name,) in conn.execute(KNOWN).fetchall())
    return SessionSettings(conn.info.dbname, found, roles, known)


def warnings(source: SessionSettings, target: SessionSettings) -> list[str]:
    """One warning for the database, and one per role, whose settings on the source the target lacks or sets
    otherwise, each with the statements that give them to the target."""
    differing: dict[str | None, list[tuple[Scope, str, str, str | None]]] = {}
    order = sorted(source.settings, key=lambda scope: (scope.role is not None, scope.role or "", not scope.in_database))
    for scope in order:
        there = target.settings.get(scope, {})
        for key, (name, value) in sorted(source.settings[scope].items()):
            theirs = there.get(key)
            if theirs is None or theirs[1] != value:
                differing.setdefault(scope.role, []).append((scope, name, value, theirs and theirs[1]))
    return [warning for role, settings in differing.items() for warning in _warning(role, settings, source, target)]


def _warning(
    role: str | None,
    settings: list[tuple[Scope, str, str, str | None]],
    source: SessionSettings,
    target: SessionSettings,
) -> list[str]:
    """The warning for the database's settings (`role` None) or a role's; split in parts where the statements would
    not fit one Event's message, each part whole statements."""
    statements, otherwise, unknown, withheld = [], [], [], False
    for scope, name, value, theirs in settings:
        custom = "." in name
        if not custom and name.lower() not in target.known:
            unknown.append(f"{name} = {value}")
            continue
        withheld = withheld or custom
        statements.append(_statement(scope, target.database, name, None if custom else value))
        if theirs is not None:
            otherwise.append(f"{name} = {'…' if custom else theirs}")
    if role is None:
        whose = f"database {source.database!r} has settings of its own on the source (ALTER DATABASE ... SET)"
        who = "as the database's owner or a superuser"
    else:
        whose = (
            f"role {role} has settings on the source for its sessions in database {source.database!r} "
            "(ALTER ROLE ... IN DATABASE ... SET, or ALTER ROLE ... SET)"
        )
        who = "as a superuser (or a role with CREATEROLE)"
    head = (
        f"{whose} that the target's database {target.database!r} lacks or sets otherwise. pg_dump carries them only "
        "with --create, which ferry does not use, and ferry applies none itself, so the target's sessions would run "
        "without them."
    )
    words = []
    if role is not None and role not in target.roles:
        words.append(f"Role {role} does not exist on the target's server: create it first.")
    if otherwise:
        words.append(f"The target has {', '.join(otherwise)}.")
    if withheld:
        words.append(
            "Values of custom settings are not shown (they may be secrets): read them on the source "
            "(SELECT setconfig FROM pg_db_role_setting)."
        )
    if unknown:
        words.append(
            f"The target's server does not know {', '.join(unknown)} (a newer major renamed or dropped it): set what "
            "replaced it, if anything."
        )
    tail = " ".join(words)
    run = f"Before traffic moves to the target, run there {who}:"
    parts = _parts(statements, MAX_MESSAGE - len(head) - len(run) - len(tail) - len(" (part 10 of 10)") - 4)
    return [
        " ".join(
            word
            for word in (
                head if len(parts) == 1 else f"{head} (part {number} of {len(parts)})",
                f"{run} {'; '.join(part)}." if part else "",
                tail,
            )
            if word
        )
        for number, part in enumerate(parts, 1)
    ]


def _parts(statements: list[str], room: int) -> list[list[str]]:
    """`statements` in groups whose joined length fits `room` (a statement longer than that alone); one empty group
    when there are none."""
    parts: list[list[str]] = [[]]
    for statement in statements:
        if parts[-1] and len("; ".join([*parts[-1], statement])) > room:
            parts.append([])
        parts[-1].append(statement)
    return parts


def _statement(scope: Scope, database: str, name: str, value: str | None) -> str:
    """The statement that gives `name` its `value` in `scope` of `database` (None: a placeholder for the value)."""
    if scope.role is None:
        head = f"ALTER DATABASE {_identifier(database)}"
    elif scope.in_database:
        head = f"ALTER ROLE {_identifier(scope.role)} IN DATABASE {_identifier(database)}"
    else:
        head = f"ALTER ROLE {_identifier(scope.role)}"
    return f"{head} SET {_name(name)} = {'<its value on the source>' if value is None else _value(name, value)}"


def _value(name: str, value: str) -> str:
    """`value` as the catalog keeps it, written as a statement's literal(s)."""
    if name.lower() in LIST_QUOTED:
        return ", ".join(_literal(element) for element in split_list(value))
    return _literal(value)


def split_list(value: str) -> list[str]:
    """The elements of a list setting as the catalog keeps it (`"$user", public`), as PostgreSQL's SplitGUCList
    splits them: separated by commas, each either double-quoted (a doubled quote inside is one) or bare."""
    elements: list[str] = []
    rest = value.strip()
    while rest:
        if rest.startswith('"'):
            element, index = [], 1
            while index < len(rest):
                if rest[index] == '"':
                    if rest[index + 1 : index + 2] == '"':
                        element.append('"')
                        index += 2
                        continue
                    break
                element.append(rest[index])
                index += 1
            elements.append("".join(element))
            rest = rest[index + 1 :].lstrip()
        else:
            element_text, _, _ = rest.partition(",")
            elements.append(element_text.strip())
            rest = rest[len(element_text) :]
        rest = rest[1:].lstrip() if rest.startswith(",") else rest.lstrip()
    return elements


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _name(name: str) -> str:
    """A setting's name in lower case (PostgreSQL compares them so), each part quoted only where it must be."""
    return ".".join(part if SIMPLE_NAME.fullmatch(part) else _identifier(part) for part in name.lower().split("."))


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
