"""Everything that can be checked before a Migration changes anything, with every problem reported at once.

Without it, a missing target database, a user that may not freeze, or a pg_dump too old
for the source was noticed only by the step that needed it: after the source had been
frozen and snapshotted. precheck looks at all of it first and reads only (the one write
is a tiny object put under the Migration's prefix and deleted at once, to prove that
the bucket takes writes, encrypted as the spec asks). It also refuses an http:// S3
endpoint the spec does not explicitly allow, which the API server refuses too: a run's
input may predate that rule. It lists every problem it finds in one PrecheckFailed, one
sentence each saying what to fix, so that one round of fixing is enough.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import psycopg
from botocore.exceptions import BotoCoreError, ClientError
from psycopg import sql

from activities import s3 as snapshot_store
from activities.postgres import (
    database_settings,
    freezing,
    grants,
    locales,
    maintenance,
    privileges,
    replication_checks,
    restoring,
    schema,
    session_settings,
    slot_wal,
    tablespaces,
    throughput,
    tls,
    tools,
)
from activities.postgres.connection import Connection, connect, identity_of, in_recovery, said
from activities.postgres.database_settings import (
    CONNECT_BEFORE,
    FROZEN_ATTEMPT,
    FROZEN_BY,
    READ_ONLY,
    READ_ONLY_BEFORE,
    RESTORED_BY,
    UNFROZEN_BY,
    VERIFIED_MARK,
)
from activities.postgres.freezing import is_on
from activities.postgres.replication_checks import listed
from activities.s3 import S3NotAnswering
from activities.secrets import DatabaseConnection, S3Credentials, Secrets
from activities.settings import DataActivitySettings
from ferry.api.errors import DatabaseUnreachable, PermanentError, PrecheckFailed
from ferry.api.migration import CheckedDatabases, DatabaseIdentity, DriverMode, DriverSpec, Throughput
from ferry.api.saga import PrecheckInput, PrecheckResult, precheck_key
from ferry.api.scrubbing import EXCERPT_LIMIT, scrub

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger("ferry.activities.precheck")
PROBE = b"ferry precheck: written and deleted at once\n"
TRACK_COUNTS = "track_counts"
"""The setting that makes the statistics count rows written, which the freeze's fence and verify's mark read."""
SIZE_MARGIN = 1.5
"""The target's volumes must hold this many times the source's data: indexes are rebuilt, WAL is written."""
PREPARED_STALE = 60
"""Seconds after which a prepared transaction counts as abandoned by its coordinator (which ends one in seconds)."""
SESSION = {"default_transaction_read_only": "on"}
"""precheck only reads: its sessions could not write even by mistake."""
SERVER = """
select split_part(current_setting('server_version'), ' ', 1), current_setting('server_version_num')::int / 10000,
    pg_database_size(current_database()),
    (select rolsuper or rolbypassrls from pg_roles where rolname = current_user),
    (select case when r.rolsuper then current_setting('max_connections')::int else least(
        current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int,
        case when r.rolconnlimit >= 0 then r.rolconnlimit else 2147483647 end,
        case when d.datconnlimit >= 0 then d.datconnlimit else 2147483647 end
    ) end from pg_roles r, pg_database d where r.rolname = current_user and d.datname = current_database())
"""
ROW_SECURITY = """
select n.nspname || '.' || c.relname, c.relforcerowsecurity,
    c.relforcerowsecurity or not pg_has_role(current_user, c.relowner, 'USAGE')
from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.relrowsecurity and n.nspname !~ '^pg_' and n.nspname <> 'information_schema'
order by 1
"""
"""Tables with row-level security: whether it is forced on their owners too, and whether it applies to the current
user (unless that user bypasses it: a superuser, or a role with BYPASSRLS)."""
AMBIGUOUS_NAMES = """
select key, string_agg(quoted, ' and ' order by quoted) from (
    select n.nspname || '.' || c.relname, format('%I.%I', n.nspname, c.relname)
    from pg_class c join pg_namespace n on n.oid = c.relnamespace
    where n.nspname !~ '^pg_' and n.nspname <> 'information_schema'
    union all
    select n.nspname || '.' || c.relname || '.' || a.attname, format('%I.%I.%I', n.nspname, c.relname, a.attname)
    from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace
    where a.attnum > 0 and not a.attisdropped and n.nspname !~ '^pg_' and n.nspname <> 'information_schema'
) named (key, quoted)
group by key having count(*) > 1 order by key
"""
"""Objects whose names, joined with dots, are the same (schema "a" with table "b.c", schema "a.b" with table "c"):
verify and the write checks name tables and columns that way, and would take one for the other."""
MAY = """
select r.rolsuper, pg_has_role(current_user, d.datdba, 'USAGE'), pg_get_userbyid(d.datdba),
    r.rolsuper or pg_has_role(current_user, 'pg_signal_backend', 'USAGE')
from pg_roles r, pg_database d where r.rolname = current_user and d.datname = current_database()
"""


OTHER_DATABASES = """
select datname from pg_database
where datallowconn and not datistemplate and datname not in (current_database(), 'postgres')
order by datname
"""
"""The databases of the source's server besides the one migrated that a client may use (not the templates, nor the
maintenance database `postgres` every server has)."""
OTHER_DATABASES_SHOWN = 5


class Problems(list[str]):
    """The problems found so far, one sentence (or a few) each."""

    @contextlib.contextmanager
    def catching(self) -> Iterator[None]:
        """Records a permanent failure's message as a problem instead of letting it end the precheck."""
        try:
            yield
        except PermanentError as error:
            self.append(str(error))


@dataclasses.dataclass(frozen=True)
class Server:
    """What precheck learned of one database."""

    version: str
    major: int
    size: int
    extensions: frozenset[str]
    """Installed ones on the source; available ones on the target."""
    locale: locales.DatabaseLocale
    """Its encoding and default collation (locales.py)."""
    bypasses_rls: bool = True
    """Whether the Secret's user reads every row whatever row-level security says."""
    forced_rls: tuple[str, ...] = ()
    """Tables whose row-level security applies to their owners too (FORCE ROW LEVEL SECURITY)."""
    other_databases: tuple[str, ...] = ()
    """The source server's other databases a client may use (OTHER_DATABASES)."""
    identity: DatabaseIdentity | None = None
    """Which database the Secret reached (identity.py)."""
    sessions: int = 1 << 31
    """The most sessions the Secret's user may have in the database at once (max_connections, less those reserved
    for superusers, and the role's and the database's connection limits)."""
    extension_tables: tuple[ExtensionTable, ...] = ()
    """The source's tables of extensions that hold rows nothing copies (configuration tables' rows of their own only in
    mode Online): the target must make them with the same rows (`_extension_tables_on_target`)."""
    held_elsewhere: tuple[maintenance.Held, ...] = ()
    """What the source server's `postgres` and templates hold, which stays behind (maintenance.py)."""
    settings_of_sessions: session_settings.SessionSettings | None = None
    """The settings the database's sessions get from the catalog, which nothing carries (session_settings.py)."""
    collations: tuple[locales.UsedCollation, ...] = ()
    """The source's: the versioned collations its columns use (locales.py)."""
    tablespaces: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """The source's: its relations outside the database's default tablespace, per tablespace (tablespaces.py)."""
    privileges_left_out: tuple[privileges.Found, ...] = ()
    """The source's: the privileges and owners the restore leaves out (privileges.py)."""
    encryption: tls.Encryption | None = None
    """Whether the precheck's session was encrypted, and whether its server offers TLS (tls.py)."""


@dataclasses.dataclass(frozen=True)
class ExtensionTable:
    extension: str
    schema: str
    """The extension's schema, where pg_dump's CREATE EXTENSION puts it on the target."""
    namespace: str
    name: str
    condition: str
    """Of a configuration table: the condition of the rows of its own (mode Online); empty for the others."""
    rows: int
    """How many rows (under `condition`) it holds on the source; -1 when ferry may not read it."""
    digest: str
    """A digest of those rows, in any order (ROWS_DIGEST); empty when ferry may not read it."""

    @property
    def qualified(self) -> str:
        return f"{self.namespace}.{self.name}"

    def qualified_identifier(self, conn: Connection) -> str:
        return sql.Identifier(self.namespace, self.name).as_string(conn)

    def rows_query(self) -> sql.Composed:
        return sql.SQL(ROWS_DIGEST).format(
            table=sql.Identifier(self.namespace, self.name), where=sql.SQL(self.condition)
        )


ROWS_DIGEST = (
    "select count(*), coalesce(sum(('x' || substr(md5(t::text), 1, 15))::bit(60)::bigint::numeric), 0)::text "
    "from {table} as t {where}"
)
"""How many rows a table holds, and a digest of them in any order (the sum of a hash of each row, so that a queue
of millions of rows needs no memory for it): the same rows read the same on 15 and 18."""


def precheck(secrets: Secrets, settings: DataActivitySettings, input: PrecheckInput, owner: str) -> PrecheckResult:
    """Checks everything; raises PrecheckFailed listing every problem found."""
    problems = Problems()
    ref, driver = input.ref, input.driver
    source_db = target_db = credentials = None
    with problems.catching():
        source_db = secrets.database(ref.namespace, driver.source_secret, "spec.driver.sourceSecret")
    with problems.catching():
        target_db = secrets.database(ref.namespace, driver.target_secret, "spec.driver.targetSecret")
    with problems.catching():
        credentials = secrets.s3_credentials(ref.namespace, input.snapshot.credentials_secret)
    if source_db and input.stable_service and _through_service(source_db.host, input.stable_service, ref.namespace):
        problems.append(
            f"Secret {source_db.secret} reaches the source through {source_db.host}, the stable Service "
            f"{ref.namespace}/{input.stable_service} (spec.source.service), which switch-traffic points at the target: "
            "from then on ferry's checks of the source (before scale-down-old, and a rollback's) would reach the "
            "target. Set its host to the source itself: its primary Pod through the StatefulSet's headless Service "
            "(<pod>.<serviceName>), or a Service of its own that selects only the source's Pods."
        )
    online = driver.mode is DriverMode.ONLINE
    source = _source(source_db, settings, owner, online, problems) if source_db else None
    waiting = target_db is not None and input.target_may_wait and _not_answering(target_db, settings)
    target = _target(target_db, settings, owner, problems) if target_db and not waiting else None
    tools_version = _tools(settings, source, target, problems)
    if tools_version is not None:
        _tools_tls(settings, [db for db in (source_db, target_db) if db], problems)
    if source and target and source.forced_rls and not target.bypasses_rls:
        assert target_db is not None
        problems.append(
            f"the source's tables {listed(source.forced_rls)} force row-level security even on their owners, and the "
            f"restore keeps that: the user in Secret {target_db.secret}, who would own them on {target_db.describe()}, "
            "is neither a superuser nor has BYPASSRLS, so verify could not read every row of them, after the freeze. "
            f"As a superuser, ALTER ROLE {target_db.username} BYPASSRLS, or use a superuser."
        )
    if source and target_db and target:
        _extension_tables_on_target(target_db, settings, source.extension_tables, problems)
    if source and target:
        missing = sorted(source.extensions - target.extensions)
        if missing:
            assert target_db is not None
            problems.append(
                f"the source uses extensions that the target's server (PostgreSQL {target.version}) does not have: "
                f"{', '.join(missing)}. Install them on the server of {target_db.describe()} (its "
                "pg_available_extensions lists what it has), or drop them from the source if nothing there needs them."
            )
    collations_found = None
    if source_db and target_db and source and target:
        encoding = locales.encoding_problem(source.locale, target.locale, source_db, target_db)
        if encoding:
            problems.append(encoding)
        collations_found = _collations_on_target(target_db, settings, source.collations, problems)
    if source_db and target_db and source and target and driver.mode is DriverMode.ONLINE:
        replication_checks.check(source_db, target_db, settings, driver, ref.uid, problems)
    if source and input.target_storage_bytes is not None and source.size * SIZE_MARGIN > input.target_storage_bytes:
        problems.append(
            f"the source's data ({_gib(source.size)}) does not fit the target's volumes "
            f"({_gib(input.target_storage_bytes)}) with the room a restore needs ({SIZE_MARGIN:g} times the data). "
            "Raise spec.target.storageSize (create the Migration again)."
        )
    if source and driver.mode is DriverMode.SNAPSHOT and source.size > settings.max_object_size:
        problems.append(
            f"the source's data ({_gib(source.size)}) is larger than one object of the snapshot store may be "
            f"({_gib(settings.max_object_size)}, the worker's --snapshot-max-object-size-gib). Its dump may come "
            "out smaller, but ferry does not freeze a source whose snapshot may not fit. Migrate it in mode Online "
            "(spec.driver.mode), or raise the worker's limit if the store takes larger objects."
        )
    if source and target and source_db and target_db and driver.mode is DriverMode.SNAPSHOT:
        _sessions_for_streams(settings, driver, source.size, [(source, source_db), (target, target_db)], problems)
    sample = b""
    read_rate = write_rate = upload_rate = 0.0
    if input.measure and source_db and target_db and source and target:
        try:
            with connect(source_db, settings, **SESSION) as conn:
                sample, read_rate = throughput.read_sample(conn)
            with connect(target_db, settings, **SESSION) as conn:
                write_rate = throughput.write_rate(conn, sample)
        except (PermanentError, psycopg.Error) as error:  # a plan without rates is still a plan
            log.warning("could not measure the databases' rates for the plan: %s", error)
    if input.snapshot.insecure:
        problems.append(_insecure(input.snapshot.endpoint))
    elif credentials:
        upload_rate = _bucket(input, owner, credentials, settings, problems, sample)
    if problems:
        raise PrecheckFailed(_report(problems))
    assert source is not None
    assert target is not None or waiting
    assert source_db is not None
    assert target_db is not None
    assert tools_version is not None
    unbounded = slot_wal.unbounded_wal(source_db, settings) if source_db and driver.mode is DriverMode.ONLINE else None
    collations = locales.collation_warning(source.locale, target.locale, source_db, target_db) if target else None
    versions = (
        locales.version_warning(source.locale, target.locale, collations_found, source_db, target_db)
        if target
        else None
    )
    settings_left = (
        session_settings.warnings(source.settings_of_sessions, target.settings_of_sessions)
        if target and source.settings_of_sessions and target.settings_of_sessions
        else []
    )
    deferred = _checked_after_provision(target_db) if waiting else None
    replicas = _replicas(target_db, input.target_replicas) if input.target_replicas > 1 else None
    return PrecheckResult(
        source_version=source.version,
        target_version=target.version if target else None,
        target_deferred=waiting,
        tools_version=tools_version,
        source_size_bytes=source.size,
        target_storage_bytes=input.target_storage_bytes,
        throughput=Throughput(
            source_read=read_rate, target_write=write_rate, upload=upload_rate, sample_bytes=len(sample)
        )
        if input.measure
        else None,
        warnings=[
            warning
            for warning in (
                deferred,
                replicas,
                unbounded,
                _other_databases(source_db, source),
                *maintenance.warnings(source_db, source.held_elsewhere),
                collations,
                versions,
                *settings_left,
                tablespaces.warning(source_db, target_db, source.tablespaces),
                privileges.warning(source_db, target_db, source.privileges_left_out),
                tls.warning(source_db, source.encryption),
                tls.warning(target_db, target.encryption) if target else None,
            )
            if warning
        ],
        databases=CheckedDatabases(source=source.identity, target=target.identity if target else None),
    )


def _not_answering(db: DatabaseConnection, settings: DataActivitySettings) -> bool:
    """Whether the database's server does not answer at all (no address, no listener, no reply): the target
    StatefulSet that serves it may be yet to be created. A server that answers, refusing or not, is checked now."""
    try:
        with connect(db, settings, **SESSION):
            return False
    except DatabaseUnreachable:
        return True
    except PermanentError:
        return False


def _replicas(db: DatabaseConnection, replicas: int) -> str:
    return (
        f"spec.target.replicas is {replicas}: ferry restores into one database, {db.describe()} (Secret {db.secret}), "
        f"and switch-traffic points the clients' Service at all {replicas} of the target's Pods. The others hold the "
        "data only if the target's image replicates it from that one (a failover manager); otherwise clients reach "
        "empty databases. Unless it does, migrate to 1 replica and scale the target up once replication is set up."
    )


def _checked_after_provision(db: DatabaseConnection) -> str:
    return (
        f"the target database does not answer yet ({db.describe()}, Secret {db.secret}): nothing of it was checked. "
        "If provision's target StatefulSet serves it, that is expected: it is checked, all of it, once provision has "
        "created the target, before the freeze (mode Online: before replicate), and the Migration rolls back if it "
        "still does not answer then. If the Secret should name a server that runs already, fix its host and port."
    )


def _through_service(host: str, service: str, namespace: str) -> bool:
    """Whether `host` is the DNS name of the Service `service` of `namespace`, short or qualified
    (`orders-db`, `orders-db.shop`, `orders-db.shop.svc`, `orders-db.shop.svc.cluster.local`)."""
    labels = host.lower().rstrip(".").split(".")
    return labels[0] == service and (len(labels) == 1 or (labels[1] == namespace and labels[2:3] in ([], ["svc"])))


def _collations_on_target(
    db: DatabaseConnection,
    settings: DataActivitySettings,
    used: tuple[locales.UsedCollation, ...],
    problems: Problems,
) -> locales.CollationsOnTarget | None:
    """What the target's server has for the collations the source's columns use; refuses built-in ones it lacks."""
    if not used:
        return None
    with problems.catching(), connect(db, settings, **SESSION) as conn:
        found = locales.on_target(conn, used)
        missing = locales.missing_problem(found, db)
        if missing:
            problems.append(missing)
        return found
    return None


def _other_databases(db: DatabaseConnection | None, source: Server) -> str | None:
    """A warning naming the source server's other databases: scale-down-old stops them with the one migrated."""
    if db is None or not source.other_databases:
        return None
    names = source.other_databases
    shown = ", ".join(names[:OTHER_DATABASES_SHOWN]) + (
        f" and {len(names) - OTHER_DATABASES_SHOWN} more" if len(names) > OTHER_DATABASES_SHOWN else ""
    )
    return (
        f"the server of {db.describe()} also holds the databases {shown}. ferry moves only {db.database!r}, but "
        "scale-down-old stops the whole source StatefulSet, so they stop serving with it (a rollback starts it "
        "again). Unless nothing uses them, move them first or give them a server of their own."
    )


def _sessions_for_streams(
    settings: DataActivitySettings,
    driver: DriverSpec,
    size: int,
    sides: list[tuple[Server, DatabaseConnection]],
    problems: Problems,
) -> None:
    """A snapshot in N streams (see streams) holds N + 1 sessions on each side at once: the exported snapshot and N
    pg_dumps on the source; N restores, then pg_restore --jobs N and its leader, on the target."""
    streams = settings.streams_for(driver.parallelism)
    if streams < 2 or size < settings.parallel_min_size:
        return
    for server, db in sides:
        if server.sessions < streams + 1:
            chosen = "spec.driver.parallelism" if driver.parallelism else "the worker's --snapshot-streams"
            problems.append(
                f"a snapshot in {streams} streams ({chosen}) needs {streams + 1} sessions at once on "
                f"{db.describe()}, and the user in Secret {db.secret} may have {server.sessions} there "
                "(max_connections less the superusers' reserve, and the role's and the database's connection "
                f"limits). Set spec.driver.parallelism to {max(1, server.sessions - 1)} or less, or raise the limit."
            )


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def _source(
    db: DatabaseConnection, settings: DataActivitySettings, owner: str, online: bool, problems: Problems
) -> Server | None:
    with problems.catching(), connect(db, settings, **SESSION) as conn:
        server = _server(conn, "select extname from pg_extension")
        _may_change(conn, db, "freeze", problems)
        settings_now = database_settings.read(conn)
        frozen_by = settings_now.get(FROZEN_BY)
        if frozen_by is not None and frozen_by != owner:
            problems.append(
                f"{db.describe()} is frozen by Migration {frozen_by}. Wait until that Migration finished or rolled "
                "back, or unfreeze it by hand as the README's section Recovery says."
            )
        _counted(conn, db, "the freeze's check that nothing is written to the frozen source", problems)
        _primary(conn, db, problems)
        _prepared(conn, db, online, problems)
        _subscriptions(conn, db, problems)
        extension_tables = _extension_tables(conn, online)
        _invalid_indexes(conn, db, problems)
        stuck = grants.unrestorable(conn)
        if stuck:
            given = ", ".join(f"{grant.grantee} (granted by {grant.grantor})" for grant in stuck)
            grantors = ", ".join(sorted({grant.grantor for grant in stuck}))
            problems.append(
                f"CONNECT on {db.describe()} was granted to {given} by roles the user in Secret {db.secret} may not "
                "act as: the freeze takes those grants away, and its undo could not give them back, so those roles "
                "could not connect after a rollback. As the owner, GRANT CONNECT to them yourself (then REVOKE the "
                f"others' grants ... GRANTED BY {grantors}), or GRANT {grantors} TO {db.username}, or use a superuser."
            )
        tables = conn.execute(ROW_SECURITY).fetchall()
        hidden = [name for name, _, applies in tables if applies and not server.bypasses_rls]
        if hidden:
            problems.append(
                f"row-level security would hide rows of {listed(hidden)} from the user in Secret {db.secret} on "
                f"{db.describe()}, and the snapshot and verify read every row (they would stop, after the freeze). "
                f"As a superuser, ALTER ROLE {db.username} BYPASSRLS, or use a superuser."
            )
        for _, ambiguous in conn.execute(AMBIGUOUS_NAMES).fetchall():
            problems.append(
                f"{ambiguous} on {db.describe()} have one name once joined with dots, which is how verify and the "
                "checks of writes tell tables and columns apart: one could pass for the other. Rename one of them."
            )
        server = dataclasses.replace(
            server,
            forced_rls=tuple(name for name, forced, _ in tables if forced),
            other_databases=tuple(name for (name,) in conn.execute(OTHER_DATABASES)),
            extension_tables=extension_tables,
            held_elsewhere=maintenance.read(conn, db, settings, **SESSION),
            settings_of_sessions=session_settings.read(conn, every_role=False),
            collations=locales.used_collations(conn),
            tablespaces=tablespaces.placed(conn),
            privileges_left_out=privileges.read(conn),
        )
        escaping = {r: v for r, v in database_settings.role_overrides(conn, READ_ONLY).items() if not is_on(v)}
        if escaping:
            problems.append(
                f"these roles set {READ_ONLY} themselves, so the freeze could not stop their writes to "
                f"{db.describe()}: {', '.join(sorted(escaping))}. Remove that with ALTER ROLE ... RESET {READ_ONLY}."
            )
        return server
    return None


def _target(db: DatabaseConnection, settings: DataActivitySettings, owner: str, problems: Problems) -> Server | None:
    with problems.catching(), connect(db, settings, **SESSION) as conn:
        server = _server(conn, "select name from pg_available_extensions")
        _may_change(conn, db, "restore into", problems)
        _counted(conn, db, "the check that nothing is written to the target before traffic goes back", problems)
        why = restoring.refusal(restoring.find(conn), db, owner)
        if why is not None:
            problems.append(why)
        return dataclasses.replace(server, settings_of_sessions=session_settings.read(conn, every_role=True))
    return None


def _prepared(conn: Connection, db: DatabaseConnection, online: bool, problems: Problems) -> None:
    """Refuses a source with prepared transactions older than PREPARED_STALE: their coordinator seems gone.

    The freeze could not complete while they are pending (see freezing), nor, in mode Online,
    replicate make its slot while any database of the server has one. Younger ones are a
    coordinator between its two phases, as an XA application has them all the time.
    """
    stale = [t for t in freezing.prepared(conn, every_database=online) if t.age > PREPARED_STALE]
    if stale:
        where = ", ".join(
            t.describe() + ("" if t.database == db.database else f" in database {t.database}") for t in stale
        )
        problems.append(
            f"prepared transactions (PREPARE TRANSACTION) have been pending on {db.describe()} for more than "
            f"{PREPARED_STALE}s: {where}. Nothing can copy their rows, and the freeze would end its attempts with "
            "PreparedTransactionsPending while they are there"
            + (", as would replicate's replication slot" if online else "")
            + ". Have their coordinator (an XA/JTA transaction manager) commit or roll them back (or, knowing the "
            "outcome, COMMIT PREPARED or ROLLBACK PREPARED them as a superuser or their owner)."
        )


def _primary(conn: Connection, db: DatabaseConnection, problems: Problems) -> None:
    """Refuses a source Secret that reaches a standby: the freeze and every check of the frozen source must reach
    the primary, and refuse a standby (ServerInRecovery), each attempt of the freeze again."""
    if in_recovery(conn):
        problems.append(
            f"Secret {db.secret} reaches a standby: {db.describe()} is in recovery (a physical replica). The freeze "
            "and the checks of the frozen source must reach the primary, where the writes are made and counted. "
            "Point the Secret at the primary (the failover manager's Service for it, or the primary's Pod)."
        )


EXTENSION_TABLES = """
select e.extname, x.nspname, n.nspname, c.relname, u.condition is not null, coalesce(u.condition, '')
from pg_depend d
join pg_extension e on d.refclassid = 'pg_extension'::regclass and d.refobjid = e.oid
join pg_namespace x on x.oid = e.extnamespace
join pg_class c on d.classid = 'pg_class'::regclass and d.objid = c.oid
join pg_namespace n on n.oid = c.relnamespace
left join lateral (
    select coalesce(y.condition, '') as condition
    from unnest(e.extconfig, e.extcondition) as y(relation, condition) where y.relation = c.oid
) u on true
where d.deptype = 'e' and c.relkind in ('r', 'p')
order by 1, 3, 4
"""
"""Tables that belong to an extension: (extension, its schema, the table's schema and name, whether it is one of the
extension's configuration tables, the condition of the rows of its own that pg_dump copies, e.g. `WHERE srid >
998999`)."""


def _extension_tables(conn: Connection, online: bool) -> tuple[ExtensionTable, ...]:
    """The tables of the source's extensions whose rows only the target's CREATE EXTENSION would give the target:
    pg_dump dumps no table of an extension but the rows of its configuration tables that their condition selects,
    mode Online replicates none, and verify compares user tables only. A table added to an extension by hand (ALTER
    EXTENSION ... ADD TABLE), or by the extension at run time (older pgmq adds each queue's table), would reach the
    target empty, the Migration saying Succeeded; one the extension fills itself (a data extension's tables) comes
    as full. Which is which, the target says (`_extension_tables_on_target`)."""
    found: list[ExtensionTable] = []
    for extension, schema_of, namespace, name, configuration, condition in conn.execute(EXTENSION_TABLES).fetchall():
        if configuration and not online:
            continue  # pg_dump copies the rows of its own
        table = ExtensionTable(extension, schema_of, namespace, name, condition if configuration else "", -1, "")
        try:
            with conn.transaction():
                row = conn.execute(table.rows_query()).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            row = None  # cannot tell: as if it held rows nothing else gives the target
        if row is not None and int(row[0]) == 0:
            continue
        if row is not None:
            table = dataclasses.replace(table, rows=int(row[0]), digest=str(row[1]))
        found.append(table)
    return tuple(found)


def _extension_tables_on_target(
    db: DatabaseConnection, settings: DataActivitySettings, tables: tuple[ExtensionTable, ...], problems: Problems
) -> None:
    """Refuses the source's tables of extensions (`_extension_tables`) that the target's CREATE EXTENSION, as the
    restore runs it, would not make with the same rows: tried on the target, each extension in a savepoint, all in a
    transaction rolled back."""
    if not tables:
        return
    made: dict[str, tuple[int, str] | None] = {}
    """Per table: what the target's extension makes (rows, digest); None when it makes no such table."""
    failed: dict[str, str] = {}
    """Per extension: why the target could not make it."""
    try:
        # Its one session that may write, in a transaction always rolled back: the target is left as it was.
        with connect(db, settings, default_transaction_read_only="off") as conn, conn.transaction(force_rollback=True):
            for extension, schema_of in dict.fromkeys((t.extension, t.schema) for t in tables):
                try:
                    with conn.transaction():
                        conn.execute(sql.SQL("create schema if not exists {}").format(sql.Identifier(schema_of)))
                        conn.execute(
                            sql.SQL("create extension if not exists {} with schema {} cascade").format(
                                sql.Identifier(extension), sql.Identifier(schema_of)
                            )
                        )
                except psycopg.Error as error:
                    failed[extension] = said(db, error)
            for table in tables:
                if table.extension in failed:
                    continue
                exists = conn.execute("select to_regclass(%s)", (table.qualified_identifier(conn),)).fetchone()
                if exists is None or exists[0] is None:
                    made[table.qualified] = None
                    continue
                row = conn.execute(table.rows_query()).fetchone()
                made[table.qualified] = (int(row[0]), str(row[1])) if row is not None else None
    except psycopg.Error as error:
        log.info("could not try the source's extensions on %s: %s", db.describe(), error)
    for table in tables:
        got = made.get(table.qualified, False)
        if table.digest and isinstance(got, tuple) and got[1] == table.digest:
            continue  # the extension makes it with the same rows on the target
        problems.append(_lacking(table, got, failed.get(table.extension)))


def _lacking(table: ExtensionTable, made: tuple[int, str] | bool | None, failure: str | None) -> str:
    """Why the target would lack rows of `table`, a table of an extension, and what to do."""
    held = f"holds {table.rows} rows" if table.rows >= 0 else "may hold rows (ferry may not read it)"
    which = (
        "a configuration table's rows of its own (mode Online replicates no table of an extension)"
        if table.condition
        else "no table of an extension is copied (pg_dump leaves them to CREATE EXTENSION) or compared by verify"
    )
    start = f"{table.qualified} on the source belongs to extension {table.extension} and {held}, but"
    if made is None:
        return (
            f"{start} the target's CREATE EXTENSION does not make it, and {which}, so the target would lack it. "
            f"Detach it on the source (ALTER EXTENSION {table.extension} DROP TABLE {table.qualified}: it stays, "
            "and is then copied and compared like any table), or empty it."
        )
    if isinstance(made, tuple):
        return (
            f"{start} the target's CREATE EXTENSION makes it with other rows ({made[0]}), and {which}, so the "
            "source's would be lost." + (" Migrate in mode Snapshot, which copies them." if table.condition else
            " Make its rows what the extension makes (keep a copy of yours to put back after the migration).")
        )  # fmt: skip
    why = f": {failure}" if failure else ""
    return (
        f"{start} ferry could not try the target's CREATE EXTENSION of {table.extension}{why}; {which}, so the "
        "target could lack those rows. Give the Secret's user on the target what the restore needs to create the "
        "extension (the restore runs the same CREATE EXTENSION)."
    )


INVALID_INDEXES = f"""
select n.nspname || '.' || c.relname
from pg_index i join pg_class c on c.oid = i.indexrelid join pg_namespace n on n.oid = c.relnamespace
join pg_class t on t.oid = i.indrelid
where not i.indisvalid and t.relkind <> 'p' and {schema.USER}
order by 1
"""
"""Invalid indexes pg_dump leaves out: those of a partitioned table (CREATE INDEX ON ONLY, partitions still to attach)
it dumps as they are."""


def _invalid_indexes(conn: Connection, db: DatabaseConnection, problems: Problems) -> None:
    """Refuses a source with invalid indexes (a CREATE INDEX CONCURRENTLY or REINDEX CONCURRENTLY that failed):
    pg_dump leaves them out, so verify would find them missing on the target, after the write downtime, every
    time."""
    invalid = [name for (name,) in conn.execute(INVALID_INDEXES).fetchall()]
    if invalid:
        problems.append(
            f"the indexes {listed(invalid)} on {db.describe()} are invalid (a CREATE INDEX CONCURRENTLY or REINDEX "
            "CONCURRENTLY that failed): pg_dump leaves them out, so verify would find them missing on the target, "
            "after the write downtime. DROP INDEX CONCURRENTLY them, or REINDEX INDEX CONCURRENTLY them once what "
            "failed them (duplicate keys, say) is fixed."
        )


def _subscriptions(conn: Connection, db: DatabaseConnection, problems: Problems) -> None:
    """Refuses a source with enabled subscriptions: the freeze would undo itself for them (see freezing)."""
    enabled = freezing.enabled_subscriptions(conn)
    if enabled:
        problems.append(
            f"{freezing.subscribing(db, enabled)} after it, and the freeze refuses. {freezing.DISABLE_SUBSCRIPTIONS}."
        )


def _counted(conn: Connection, db: DatabaseConnection, check: str, problems: Problems) -> None:
    """Refuses a database whose writes the statistics would not count: ferry's write checks rest on those counts."""
    row = conn.execute("select current_setting('track_counts')").fetchone()
    off = [] if row is not None and is_on(str(row[0])) else [f"for {db.describe()} itself (server or database)"]
    overrides = database_settings.role_overrides(conn, TRACK_COUNTS)
    roles = sorted(role for role, value in overrides.items() if not is_on(value))
    if roles:
        off.append(f"for the roles {', '.join(roles)}")
    if off:
        problems.append(
            f"{TRACK_COUNTS} is off {' and '.join(off)}, so the statistics do not count the rows written, and "
            f"{check} would see nothing. Turn it on (ALTER SYSTEM SET {TRACK_COUNTS} = on and reload, or "
            f"ALTER DATABASE / ALTER ROLE ... RESET {TRACK_COUNTS}); it is on by default."
        )


def _server(conn: Connection, extensions: str) -> Server:
    row = conn.execute(SERVER).fetchone()
    assert row is not None
    version, major, size, bypasses_rls, sessions = row
    names = frozenset(name for (name,) in conn.execute(extensions))
    return Server(
        version=str(version),
        major=int(major),
        size=int(size),
        extensions=names,
        bypasses_rls=bool(bypasses_rls),
        sessions=int(sessions),
        identity=identity_of(conn),
        locale=locales.read(conn),
        encryption=tls.encryption(conn),
    )


def _may_change(conn: Connection, db: DatabaseConnection, what: str, problems: Problems) -> None:
    """The Secret's user must own the database or be a superuser, and may end others' sessions."""
    row = conn.execute(MAY).fetchone()
    assert row is not None
    superuser, owns, database_owner, may_signal = row
    if not (superuser or owns):
        problems.append(
            f"the user in Secret {db.secret} may not {what} {db.describe()}: it is neither the database's owner "
            f"({database_owner}) nor a superuser. Use the owner's credentials, or make the user the owner "
            "(ALTER DATABASE ... OWNER TO ...)."
        )
    markers = (
        [FROZEN_BY, READ_ONLY_BEFORE, CONNECT_BEFORE, UNFROZEN_BY, FROZEN_ATTEMPT]
        if what == "freeze"
        else [RESTORED_BY, VERIFIED_MARK]
    )
    unsettable = [marker for marker in markers if not superuser and not _may_set(conn, marker)]
    if unsettable:
        problems.append(
            f"the user in Secret {db.secret} may not keep ferry's markers in {db.describe()}: since PostgreSQL 15 "
            f"only superusers may set custom parameters. As a superuser, GRANT SET ON PARAMETER "
            f"{', '.join(unsettable)} TO {db.username}, or use a superuser."
        )
    if not may_signal:
        who = "the freeze must do" if what == "freeze" else "verify does before it marks the target"
        problems.append(
            f"the user in Secret {db.secret} may not end other sessions of {db.describe()}, which {who}. "
            "GRANT pg_signal_backend TO that user."
        )


def _may_set(conn: Connection, parameter: str) -> bool:
    """Whether the current user may set `parameter` for a database; before PostgreSQL 15 anyone could."""
    version = conn.execute("select current_setting('server_version_num')::int").fetchone()
    if version is None or version[0] < 150000:
        return True
    row = conn.execute("select has_parameter_privilege(current_user, %s, 'SET')", (parameter,)).fetchone()
    return bool(row and row[0])


def _tools(
    settings: DataActivitySettings, source: Server | None, target: Server | None, problems: Problems
) -> str | None:
    """The version of the worker's pg_dump and pg_restore, when they can dump the source and restore into the target."""
    try:
        bindir = tools.find_bindir(settings.postgres_bindir)
        versions = {tool: tools.version(bindir, tool) for tool in tools.TOOLS}
    except RuntimeError as error:
        problems.append(f"{error}.")
        return None
    oldest = min(versions.values(), key=tools.major)
    needed = max((server.major for server in (source, target) if server), default=0)
    if tools.major(oldest) < needed:
        servers = ", ".join(
            f"{side} {server.version}" for side, server in (("source", source), ("target", target)) if server
        )
        problems.append(
            f"the worker's pg_dump and pg_restore in {bindir} are version {oldest}, older than the servers "
            f"({servers}); pg_dump refuses a newer server. Give the worker the PostgreSQL {needed} client tools "
            "or newer (--postgres-bindir)."
        )
    return oldest


def _tools_tls(settings: DataActivitySettings, dbs: list[DatabaseConnection], problems: Problems) -> None:
    """pg_dump and pg_restore must speak TLS when a Secret requires it: their libpq may be built without."""
    requiring = [db for db in dbs if db.tls_mode() in tls.REQUIRING_MODES]
    bindir = tools.find_bindir(settings.postgres_bindir)
    if requiring and tls.lacks_tls(bindir / "pg_dump"):
        asked = ", ".join(f"Secret {db.secret} asks for sslmode {db.tls_mode()}" for db in requiring)
        problems.append(
            f"the worker's pg_dump and pg_restore in {bindir} were built without TLS, and {asked}. Give the "
            "worker PostgreSQL client tools built with OpenSSL (--postgres-bindir)."
        )


def _bucket(
    input: PrecheckInput,
    owner: str,
    credentials: S3Credentials,
    settings: DataActivitySettings,
    problems: Problems,
    sample: bytes = b"",
) -> float:
    """Writes a small object under the Migration's prefix and deletes it; returns the bytes per second of the write.

    The object is as large as the sample when there is one (the plan's upload rate), else a tiny probe; never the
    sample's rows (see throughput), and at precheck_key, which the snapshot's undo and retention cleanup delete too."""
    spec = input.snapshot
    key = precheck_key(input.ref, spec)
    s3 = snapshot_store.client(spec, credentials, settings)
    body = throughput.upload_body(len(sample)) if sample else PROBE
    try:
        with snapshot_store.permanent_failures(s3, spec.bucket, credentials):
            started = time.monotonic()
            s3.put_object(Bucket=spec.bucket, Key=key, Body=body)
            elapsed = time.monotonic() - started
            try:
                _may_use(s3, spec.bucket, key, credentials, problems)
            finally:
                snapshot_store.delete_every_version(s3, spec.bucket, key)
            return throughput.rate(len(body), elapsed)
    except PermanentError as error:
        problems.append(str(error))
    except (S3NotAnswering, BotoCoreError, ClientError) as error:
        said = scrub(str(error), EXCERPT_LIMIT)
        problems.append(
            f"could not write to bucket {spec.bucket!r} at {s3.meta.endpoint_url}: {said}. Check spec.snapshot "
            "(endpoint, region, bucket) and that the worker reaches the endpoint."
        )
    return 0.0


def _may_use(s3: S3Client, bucket: str, key: str, credentials: S3Credentials, problems: Problems) -> None:
    """Refuses credentials that may write the object at `key` but not do the rest of what the steps do with it: that
    would fail after the freeze, and a rollback could not delete what the snapshot left. Each use: the permission it
    needs, why, and the request that tries it."""
    uses: tuple[tuple[str, str, Callable[[], object]], ...] = (
        ("s3:GetObject", "migrate and verify read the snapshot back",
         lambda: s3.get_object(Bucket=bucket, Key=key)["Body"].read()),
        ("s3:ListBucket", "the undo and the retention cleanup find the snapshot's streams",
         lambda: s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)),
        ("s3:ListBucketMultipartUploads", "each attempt of the snapshot first aborts the uploads an earlier one left",
         lambda: s3.list_multipart_uploads(Bucket=bucket, Prefix=key, MaxUploads=1)),
    )  # fmt: skip
    refused = []
    for permission, why, request in uses:
        try:
            request()
        except ClientError as error:
            if snapshot_store.error_code(error) not in snapshot_store.REFUSED:
                raise
            refused.append(f"{permission} ({why})")
    if refused:
        problems.append(
            f"the credentials in Secret {credentials.secret} may write to bucket {bucket!r} but were refused "
            f"{', '.join(refused)}. Allow them in the bucket's or the user's policy, under spec.snapshot.prefix."
        )


def _insecure(endpoint: str | None) -> str:
    """Why an http:// endpoint is refused; the bucket is not tried, so the credentials are never sent to it."""
    return (
        f"spec.snapshot.endpoint {endpoint} is plain http: the snapshot (the whole database) and the S3 credentials "
        "would cross the network unencrypted. Use an https:// endpoint, or, for a network path you trust, set "
        "spec.snapshot.allowInsecureEndpoint: true in a new Migration (the snapshot spec cannot change)."
    )


def _report(problems: list[str]) -> str:
    listed = " ".join(f"({number}) {problem}" for number, problem in enumerate(problems, 1))
    many = len(problems) > 1
    return (
        f"precheck found {len(problems)} problem{'s' if many else ''}, and changed nothing: {listed} "
        f"Fix {'them' if many else 'it'}, then retry the step (failurePolicy Pause) or create the Migration again."
    )
