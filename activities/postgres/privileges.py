"""Privileges and owners: what the restore leaves out, and what that makes of the target.

Every restore of ferry runs with --no-owner --no-privileges (see restoring): roles live
outside the database, and the target's server need not have the source's. So every
restored object belongs to the target Secret's user and has PostgreSQL's default
privileges, and nothing fails. What a DBA would not expect of that:

- a function the source keeps from PUBLIC (REVOKE EXECUTE ... FROM PUBLIC, as a SECURITY
  DEFINER function should have it) may be run by every role that may connect to the
  target, since EXECUTE to PUBLIC is the default;
- a SECURITY DEFINER function runs as the target's user, its new owner, not as its owner
  on the source;
- the grants to other roles (SELECT to a reporting role, say), the revokes of other
  defaults and ALTER DEFAULT PRIVILEGES are not there;
- objects of other roles change owner.

The precheck reads them on the source (`read`, one query) and says in one warning what
will differ and what to do (`warning`). For the first, ferry can spell out the REVOKE,
since PUBLIC exists on every server, and the target's user may run it, since it owns the
routines. ferry could run it itself after the restore, and may one day: it only takes
away what the source did not give either. It does not today, and the warning says so:
the restore would then carry some privileges and not others, in mode Snapshot's restore
and mode Online's schema copy alike, and verify, which compares no privileges, would not
notice one left out.
"""

from __future__ import annotations

import dataclasses

from activities.events import MAX_MESSAGE
from activities.postgres import schema
from activities.postgres.connection import Connection
from activities.secrets import DatabaseConnection

SHOWN = 3
"""Examples named per kind of difference (fewer when the warning would not fit an Event's message)."""
ROLES_SHOWN = 4
"""Roles named per kind of difference."""
NAMED = 20
"""Routines kept from PUBLIC named in the REVOKE statement (fewer when they would not fit)."""
REVOKE_STATEMENT = "REVOKE EXECUTE ON ROUTINE {} FROM PUBLIC"
"""One statement for them all: ROUTINE takes functions, procedures and aggregates alike (PostgreSQL 11 and later)."""
LEFT_OVER = " (and {} more: pg_dump's REVOKE ... FROM PUBLIC lines name them)"
"""Said of the routines kept from PUBLIC that the statement could not name."""
EXECUTABLE, DEFINER, GRANT, REVOKE, DEFAULT, OWNER = "executable", "definer", "grant", "revoke", "default", "owner"
"""Kinds of difference: a routine kept from PUBLIC, a SECURITY DEFINER routine, a grant beyond the defaults, a
default taken away (other than EXECUTE from PUBLIC), an ALTER DEFAULT PRIVILEGES, an object's owner."""
OBJECTS = f"""
select 'schema', quote_ident(n.nspname), n.nspowner, n.nspacl, acldefault('n', n.nspowner), n.nspname = 'public'
from pg_namespace n
where {schema.USER} and {schema.NOT_EXTENSION_MEMBER.format(catalog="'pg_namespace'", oid="n.oid")}
union all
select case c.relkind when 'S' then 'sequence' when 'v' then 'view' when 'm' then 'materialized view'
        when 'f' then 'foreign table' else 'table' end,
    c.oid::regclass::text, c.relowner, c.relacl,
    acldefault(case c.relkind when 'S' then 's' else 'r' end::"char", c.relowner), false
from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.relkind in ('r', 'p', 'v', 'm', 'S', 'f') and {schema.USER}
and {schema.NOT_EXTENSION_MEMBER.format(catalog="'pg_class'", oid="c.oid")}
union all
select 'column', c.oid::regclass::text || '.' || quote_ident(a.attname), c.relowner, a.attacl,
    acldefault('c', c.relowner), false
from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace
where a.attacl is not null and a.attnum > 0 and not a.attisdropped and {schema.USER}
and {schema.NOT_EXTENSION_MEMBER.format(catalog="'pg_class'", oid="c.oid")}
union all
select case p.prokind when 'p' then 'procedure' else 'function' end, p.oid::regprocedure::text, p.proowner, p.proacl,
    acldefault('f', p.proowner), false
from pg_proc p join pg_namespace n on n.oid = p.pronamespace
where {schema.USER} and {schema.NOT_EXTENSION_MEMBER.format(catalog="'pg_proc'", oid="p.oid")}
union all
select case t.typtype when 'd' then 'domain' else 'type' end, t.oid::regtype::text, t.typowner, t.typacl,
    acldefault('T', t.typowner), false
from pg_type t join pg_namespace n on n.oid = t.typnamespace
where t.typtype in ('b', 'd', 'e', 'r', 'c') and {schema.USER}
and (t.typtype <> 'c' or exists (select from pg_class r where r.oid = t.typrelid and r.relkind = 'c'))
and not exists (select from pg_type e where e.typarray = t.oid)
and {schema.NOT_EXTENSION_MEMBER.format(catalog="'pg_type'", oid="t.oid")}
"""
"""The user objects with an owner and privileges of their own: (kind, name as SQL writes it, owner, ACL, the ACL
PostgreSQL gives it by default, whether it is the schema public). Indexes go with their tables, array types with
their elements, row types with their relations."""
ROUTINES = f"""
select p.oid::regprocedure::text, pg_get_userbyid(p.proowner), p.prosecdef,
    p.proacl is not null and not exists (
        select from aclexplode(p.proacl) a where a.grantee = 0 and a.privilege_type = 'EXECUTE'
    )
from pg_proc p join pg_namespace n on n.oid = p.pronamespace
where (p.prosecdef or p.proacl is not null) and {schema.USER}
and {schema.NOT_EXTENSION_MEMBER.format(catalog="'pg_proc'", oid="p.oid")}
"""
"""The user routines that are SECURITY DEFINER or have privileges of their own: (signature, owner, SECURITY
DEFINER, kept from PUBLIC)."""
PRIVILEGES = f"""
with objects (kind, name, owner, acl, fallback, public_schema) as ({OBJECTS}),
differing (kind, name, grantee, granted, privileges) as (
    select o.kind, o.name, e.grantee, e.granted,
        case when count(*) > 1 and count(*) = min(every.privileges) then 'ALL'
            else string_agg(e.privilege_type, ', ' order by e.privilege_type) end
    from objects o
    cross join lateral (select count(*) from aclexplode(o.fallback) d where d.grantee = o.owner) every (privileges)
    cross join lateral (
        select a.grantee, a.privilege_type, true from aclexplode(o.acl) a
        where not exists (
            select from aclexplode(o.fallback) d where d.grantee = a.grantee and d.privilege_type = a.privilege_type
        )
        union all
        select d.grantee, d.privilege_type, false from aclexplode(o.fallback) d
        where not exists (
            select from aclexplode(o.acl) a where a.grantee = d.grantee and a.privilege_type = d.privilege_type
        )
    ) e (grantee, privilege_type, granted)
    where o.acl is not null and e.grantee <> o.owner and not (o.public_schema and e.grantee = 0)
    group by o.kind, o.name, e.grantee, e.granted
),
routines (name, owner, definer, kept) as ({ROUTINES}),
found (finding, role, example, first) as (
    select '{EXECUTABLE}', '', name, definer from routines where kept
    union all
    select '{DEFINER}', owner, name, kept from routines where definer
    union all
    select case when granted then '{GRANT}' else '{REVOKE}' end,
        case when grantee = 0 then 'PUBLIC' else pg_get_userbyid(grantee) end,
        privileges || ' on ' || kind || ' ' || name, false
    from differing
    where granted or grantee <> 0 or kind not in ('function', 'procedure')
    union all
    select '{DEFAULT}', pg_get_userbyid(a.defaclrole),
        case a.defaclobjtype when 'r' then 'tables' when 'S' then 'sequences' when 'f' then 'functions'
            when 'T' then 'types' when 'n' then 'schemas' else a.defaclobjtype::text end
        || coalesce(' in schema ' || quote_ident(n.nspname), ''), false
    from pg_default_acl a left join pg_namespace n on n.oid = a.defaclnamespace
    union all
    select '{OWNER}', pg_get_userbyid(owner), kind || ' ' || name, false
    from objects where kind <> 'column' and not public_schema
)
select finding, role, count(*), count(*) filter (where first),
    (array_agg(example order by first desc, example))[
        1:case finding when '{EXECUTABLE}' then %(named)s else %(shown)s end
    ]
from found group by finding, role order by finding, role
"""
"""Per kind of difference and role (the routine's owner, the grantee, the role whose default privileges, the
object's owner; none for the routines kept from PUBLIC, whoever owns them): how many, how many of those come first
(SECURITY DEFINER routines kept from PUBLIC), and the first few of them, those first."""


@dataclasses.dataclass(frozen=True)
class Found:
    """Differences of one kind for one role (see PRIVILEGES)."""

    finding: str
    role: str
    count: int
    first: int
    """How many of them are SECURITY DEFINER routines kept from PUBLIC."""
    examples: tuple[str, ...]
    """The first SHOWN (NAMED of the routines kept from PUBLIC), those first."""


def read(conn: Connection) -> tuple[Found, ...]:
    """What of the source's privileges and owners the restore leaves out, whoever the target's user will be."""
    return tuple(
        Found(str(finding), str(role), int(count), int(first), tuple(str(example) for example in examples))
        for finding, role, count, first, examples in conn.execute(
            PRIVILEGES, {"shown": SHOWN, "named": NAMED}
        ).fetchall()
    )


def warning(source: DatabaseConnection, target: DatabaseConnection, found: tuple[Found, ...]) -> str | None:
    """What will differ on the target, and what to do about it; None when nothing will. The owners, SECURITY DEFINER
    routines and grants of a role named as the target's user are left out: that role owns everything there."""
    found = tuple(f for f in found if f.role != target.username or f.finding in (EXECUTABLE, DEFAULT))
    if not found:
        return None
    wanted = min(SHOWN, sum(f.count for f in _of(found, EXECUTABLE)))
    text = ""
    for shown in range(SHOWN, -1, -1):  # fewer examples, until the REVOKE statement names the first routines
        text, statements = _composed(source, target, found, shown)
        if len(text) <= MAX_MESSAGE and (statements >= wanted or not shown):
            return text
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def _composed(
    source: DatabaseConnection, target: DatabaseConnection, found: tuple[Found, ...], shown: int
) -> tuple[str, int]:
    """The warning with at most `shown` examples per kind, and as many routines in the REVOKE statement as then fit
    one Event's message; how many that is."""
    user = repr(target.username)
    executable, definer = _of(found, EXECUTABLE), _of(found, DEFINER)
    granted, revoked, defaults, owned = _of(found, GRANT), _of(found, REVOKE), _of(found, DEFAULT), _of(found, OWNER)
    parts = []
    if executable:
        first = sum(f.first for f in executable)
        parts.append(
            f"{_count(executable, 'routine')} whose EXECUTE the source revoked from PUBLIC"
            f"{f' ({first} SECURITY DEFINER)' if first else ''} may be run by any role that connects"
        )
    if definer:
        parts.append(
            f"{_count(definer, 'SECURITY DEFINER routine')} {_verb(definer, 'runs', 'run')} as {user}, not as "
            f"{_verb(definer, 'its owner', 'their owners')} ({_roles(definer)}){_examples(definer, shown)}"
        )
    if granted or revoked:
        grants = f"{_count(granted, 'grant')} to {_roles(granted)}" if granted else ""
        revokes = f"{_count(revoked, 'revoke')} from {_roles(revoked)}" if revoked else ""
        missing = " and ".join(words for words in (grants, revokes) if words)
        parts.append(f"{missing} {_verb(granted + revoked, 'is', 'are')} missing{_examples(granted + revoked, shown)}")
    if defaults:
        parts.append(
            f"{_count(defaults, 'ALTER DEFAULT PRIVILEGES')} of {_roles(defaults)} {_verb(defaults, 'is', 'are')} "
            "missing"
        )
    if owned:
        parts.append(
            f"{_count(owned, 'object')} of {_roles(owned)} {_verb(owned, 'changes', 'change')} owner"
            f"{_examples(owned, shown)}"
        )
    listed = "; ".join(f"({number}) {part}" for number, part in enumerate(parts, 1))
    head = (
        f"the restore leaves out owners and privileges (--no-owner --no-privileges): on the target (Secret "
        f"{target.secret}) every object of database {source.database!r} belongs to {user}, with default privileges: "
        f"{listed}. ferry re-applies none of it."
    )
    rest = (
        f"Re-apply {'the rest' if executable else 'them'} with the GRANT, REVOKE, ALTER DEFAULT PRIVILEGES and "
        "OWNER TO lines of the source's `pg_dump --schema-only` (the roles must exist there)."
        if definer or granted or revoked or defaults or owned
        else ""
    )
    if not executable:
        return f"{head} {rest}", 0
    run = f"As soon as the target is restored (switch-traffic does not wait), run there as {user}:"
    names = [name for f in executable for name in f.examples]
    total = sum(f.count for f in executable)
    for named in range(len(names), 0, -1):  # as many as fit
        left = LEFT_OVER.format(total - named) if total > named else ""
        text = f"{head} {run} {REVOKE_STATEMENT.format(', '.join(names[:named]))}{left}. {rest}".rstrip()
        if len(text) <= MAX_MESSAGE:
            return text, named
    return f"{head} {run} pg_dump's REVOKE ... FROM PUBLIC lines for them. {rest}".rstrip(), 0


def _of(found: tuple[Found, ...], finding: str) -> tuple[Found, ...]:
    return tuple(f for f in found if f.finding == finding)


def _count(found: tuple[Found, ...], what: str) -> str:
    total = sum(f.count for f in found)
    return f"{total} {what}{'s' if total != 1 and not what.endswith('S') else ''}"


def _verb(found: tuple[Found, ...], one: str, many: str) -> str:
    return one if sum(f.count for f in found) == 1 else many


def _roles(found: tuple[Found, ...]) -> str:
    """The roles of `found`, the most often named first."""
    counts: dict[str, int] = {}
    for f in found:
        counts[f.role] = counts.get(f.role, 0) + f.count
    names = sorted(counts, key=lambda role: (-counts[role], role))
    more = f" and {len(names) - ROLES_SHOWN} more" if len(names) > ROLES_SHOWN else ""
    return ", ".join(names[:ROLES_SHOWN]) + more


def _examples(found: tuple[Found, ...], shown: int) -> str:
    """Up to `shown` examples of `found`, in parentheses."""
    examples = [example for f in found for example in f.examples][:shown]
    if not examples:
        return ""
    more = ", ..." if sum(f.count for f in found) > len(examples) else ""
    return f" ({', '.join(examples)}{more})"
