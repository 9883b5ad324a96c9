"""Databases for the driver's tests, built server-side, and ways to look at them as a user would.

`create_shop` builds a database with what a migration must carry: several schemas,
sequences, identity columns, indexes, foreign keys, unique and check constraints,
JSON, JSONB and bytea columns, a view and a function. `contents` fingerprints every
table independently of ferry's own checksums, to show that something did not change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from activities.postgres.connection import MARKERS, Session
from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.postgres_home import OUTSIDE_PARENT, ServiceUser
from devstack.stack.readiness import free_port

Connection = psycopg.Connection[tuple[Any, ...]]

SHOP = """
create schema shop;
create schema audit;
create table shop.customers (
    id bigint generated always as identity primary key,
    email text not null unique,
    profile jsonb not null default '{{}}',
    created_at timestamptz not null
);
create table shop.orders (
    id bigserial primary key,
    customer_id bigint not null references shop.customers (id),
    total numeric(12, 2) not null check (total >= 0),
    items json not null,
    receipt bytea,
    placed_at timestamptz not null,
    legacy_flag boolean
);
alter table shop.orders drop column legacy_flag;
create index orders_by_customer on shop.orders (customer_id, placed_at);
create index customers_by_profile on shop.customers using gin (profile);
create sequence audit.ticket_seq start 1000 increment 7;
create table audit.log (
    id bigint primary key default nextval('audit.ticket_seq'),
    order_id bigint not null references shop.orders (id) on delete cascade,
    note text not null,
    unique (order_id, note)
);
create view shop.big_orders as select id, customer_id, total from shop.orders where total > 900;
create function shop.order_count(customer bigint) returns bigint language sql stable
    as $$ select count(*) from shop.orders where customer_id = customer $$;

insert into shop.customers (email, profile, created_at)
select 'customer' || i || '@example.com',
       jsonb_build_object('tier', i % 3, 'tags', jsonb_build_array('a' || i % 7, 'b' || i % 11), 'name', 'Zoë ' || i),
       timestamptz '2024-01-01 00:00:00+00' + i * interval '1 minute'
from generate_series(1, {customers}) as i;
insert into shop.orders (customer_id, total, items, receipt, placed_at)
select 1 + i % {customers},
       (i % 100000) / 100.0,
       json_build_array(json_build_object('sku', 'sku-' || i % 500, 'qty', 1 + i % 4)),
       case when i % 10 = 0 then null else decode(md5(i::text), 'hex') end,
       timestamptz '2024-02-01 00:00:00+00' + i * interval '1 second'
from generate_series(1, {orders}) as i;
insert into audit.log (order_id, note) select i * 3, 'checked ' || i from generate_series(1, {orders} / 6) as i;
analyze;
"""


def connect(endpoint: PostgresEndpoint, **session: str) -> Connection:
    """An autocommit session on the endpoint's database; `session` sets parameters, e.g. for writing when frozen.

    Its `with` block only closes it, so a block around a session the server ends (the freeze ends
    sessions) cannot fail on the way out.
    """
    options = " ".join(f"-c {name}={value}" for name, value in session.items())
    return Session.connect(endpoint.dsn, autocommit=True, options=options, connect_timeout=5)


@contextlib.contextmanager
def subscription_to_nowhere(endpoint: PostgresEndpoint) -> Iterator[str]:
    """A subscription of the endpoint's database to a publisher nobody listens as (a free port), created disabled;
    yields its name, to enable with ALTER SUBSCRIPTION. Made and dropped in read-write sessions, so a frozen
    database takes them; dropped on the way out without touching any publisher (its slot name is cleared first)."""
    name = f"feed_{uuid.uuid4().hex[:8]}"
    with connect(endpoint, default_transaction_read_only="off") as conn:
        conn.execute(
            f"create subscription {name} connection 'host=127.0.0.1 port={free_port()} dbname=shop' publication "
            f"shop with (connect = false, slot_name = '{name}', enabled = false)"
        )
    try:
        yield name
    finally:
        with connect(endpoint, default_transaction_read_only="off") as conn:
            conn.execute(f"alter subscription {name} disable")
            conn.execute(f"alter subscription {name} set (slot_name = none)")
            conn.execute(f"drop subscription {name}")


def create_shop(endpoint: PostgresEndpoint, *, customers: int = 20_000, orders: int = 300_000) -> None:
    with connect(endpoint) as conn:
        conn.execute(SHOP.format(customers=customers, orders=orders))


def create_bulky(endpoint: PostgresEndpoint, *, rows: int) -> None:
    """A table of incompressible bytes (64 per row), so the snapshot has as many upload parts as needed."""
    with connect(endpoint) as conn:
        conn.execute("create table public.blobs (id int primary key, payload bytea not null)")
        conn.execute(
            "insert into public.blobs select i, decode(md5(i::text) || md5((-i)::text) || md5((i * 7)::text) "
            "|| md5((i * 13)::text), 'hex') from generate_series(1, %s) as i",
            (rows,),
        )


def tables(conn: Connection) -> list[str]:
    rows = conn.execute(
        "select n.nspname || '.' || c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace "
        "where c.relkind = 'r' and n.nspname !~ '^pg_' and n.nspname <> 'information_schema' order by 1"
    ).fetchall()
    return [row[0] for row in rows]


def contents(endpoint: PostgresEndpoint) -> dict[str, tuple[int, str]]:
    """Each table's row count and the md5 of its rows' text, sorted: equal exactly when the rows are."""
    result: dict[str, tuple[int, str]] = {}
    with connect(endpoint) as conn:
        for table in tables(conn):
            schema, name = table.split(".", 1)
            query = sql.SQL(
                "select count(*), coalesce(md5(string_agg(t::text, '|' order by t::text)), '') from {} as t"
            ).format(sql.Identifier(schema, name))
            row = conn.execute(query).fetchone()
            assert row is not None
            result[table] = (row[0], row[1])
    return result


def other_sessions(endpoint: PostgresEndpoint) -> int:
    """Sessions on the endpoint's database other than the one asking."""
    with connect(endpoint) as conn:
        row = conn.execute(
            "select count(*) from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else -1


def with_statistics(endpoint: PostgresEndpoint) -> list[str]:
    """The shop's relations the planner has statistics of (only ANALYZE makes them; a partitioned table's are its
    whole tree's, `inherited`)."""
    with connect(endpoint) as conn:
        rows = conn.execute(
            "select distinct schemaname || '.' || tablename from pg_stats where schemaname in ('shop', 'audit') "
            "order by 1"
        ).fetchall()
    return [row[0] for row in rows]


KEPT_RECORDS = ("ferry.unfrozen_by=",)
"""ferry's records that stay in a source once every step is undone, so that a late attempt of a step refuses to act
(see activities/postgres/freezing.py); `database_settings` leaves them out unless asked."""


def database_settings(endpoint: PostgresEndpoint, *, records: bool = False) -> list[str]:
    """The database's own settings (ALTER DATABASE ... SET), e.g. ['default_transaction_read_only=on']; with
    `records`, ferry's KEPT_RECORDS too."""
    with connect(endpoint) as conn:
        row = conn.execute(
            "select setconfig from pg_db_role_setting where setrole = 0 "
            "and setdatabase = (select oid from pg_database where datname = current_database())"
        ).fetchone()
    found = sorted(row[0]) if row is not None and row[0] else []
    return found if records else [entry for entry in found if not entry.startswith(KEPT_RECORDS)]


def set_on_database(endpoint: PostgresEndpoint, setting: str, value: str) -> None:
    """ALTER DATABASE ... SET: every new session of the database has `setting` at `value`, ferry's among them."""
    with connect(endpoint) as conn:
        conn.execute(
            sql.SQL("alter database {} set {} = {}").format(
                sql.Identifier(endpoint.database), sql.SQL(setting), sql.Literal(value)
            )
        )


def verified_mark(endpoint: PostgresEndpoint) -> dict[str, object] | None:
    """verify's mark in the database (the setting ferry.verified_mark, as JSON); None when it has none."""
    for entry in database_settings(endpoint):
        name, _, value = entry.partition("=")
        if name == "ferry.verified_mark":
            found: dict[str, object] = json.loads(value)
            return found
    return None


def as_new(endpoint: PostgresEndpoint) -> bool:
    """Whether the database is as CREATE DATABASE makes it: public alone, plpgsql alone, no large object, no setting."""
    with connect(endpoint) as conn:
        schemas = [
            row[0] for row in conn.execute("select nspname from pg_namespace where nspname !~ '^pg_' order by 1")
        ]
        extensions = [row[0] for row in conn.execute("select extname from pg_extension")]
        large_objects = conn.execute("select count(*) from pg_largeobject_metadata").fetchone()
        in_public = conn.execute("select count(*) from pg_class where relnamespace = 'public'::regnamespace").fetchone()
    return (schemas, extensions, large_objects, in_public, database_settings(endpoint)) == (
        ["information_schema", "public"],
        ["plpgsql"],
        (0,),
        (0,),
        [],
    )


def new_session_is_read_only(endpoint: PostgresEndpoint) -> bool:
    with connect(endpoint) as conn:
        row = conn.execute("show transaction_read_only").fetchone()
    return row is not None and row[0] == "on"


@contextlib.contextmanager
def application_role(endpoint: PostgresEndpoint) -> Iterator[PostgresEndpoint]:
    """A login role that is not a superuser and may read and write every table of the database, as an app's would.

    Yields how that role connects. It may connect through PUBLIC's CONNECT, as with any new
    database; on the way out its sessions are ended, its privileges dropped, and the role too.
    """
    role, password = f"app_{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(12)
    with connect(endpoint) as conn:
        conn.execute(sql.SQL("create role {} login password {}").format(sql.Identifier(role), sql.Literal(password)))
        for schema in conn.execute(
            "select nspname from pg_namespace where nspname !~ '^pg_' and nspname <> 'information_schema'"
        ).fetchall():
            name = sql.Identifier(schema[0])
            conn.execute(sql.SQL("grant usage on schema {} to {}").format(name, sql.Identifier(role)))
            conn.execute(
                sql.SQL("grant select, insert, update, delete on all tables in schema {} to {}").format(
                    name, sql.Identifier(role)
                )
            )
            conn.execute(
                sql.SQL("grant usage, select on all sequences in schema {} to {}").format(name, sql.Identifier(role))
            )
    try:
        yield dataclasses.replace(endpoint, user=role, password=password)
    finally:
        with connect(endpoint, default_transaction_read_only="off") as conn:  # the test may have left it frozen
            conn.execute("select pg_terminate_backend(pid, 10000) from pg_stat_activity where usename = %s", (role,))
            conn.execute(sql.SQL("drop owned by {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("drop role {}").format(sql.Identifier(role)))


def connect_privileges(endpoint: PostgresEndpoint) -> set[tuple[str, str, bool]]:
    """Who may connect to the database by its ACL, as (grantor, grantee, grantable); the defaults spelled out."""
    with connect(endpoint) as conn:
        rows = conn.execute(
            "select pg_get_userbyid(a.grantor), case when a.grantee = 0 then 'PUBLIC' else pg_get_userbyid(a.grantee) "
            "end, a.is_grantable from pg_database d, aclexplode(coalesce(d.datacl, acldefault('d', d.datdba))) a "
            "where d.datname = current_database() and a.privilege_type = 'CONNECT'"
        ).fetchall()
    return {(grantor, grantee, grantable) for grantor, grantee, grantable in rows}


def connection_of(endpoint: PostgresEndpoint) -> dict[str, str]:
    """The keys of a database Secret for an endpoint."""
    return {
        "host": endpoint.host,
        "port": str(endpoint.port),
        "username": endpoint.user,
        "password": endpoint.password,
        "database": endpoint.database,
    }


@contextlib.contextmanager
def database_owner(endpoint: PostgresEndpoint, *, may_set_markers: bool = True) -> Iterator[PostgresEndpoint]:
    """A login role, no superuser, made owner of the database, with pg_signal_backend; yields how it connects.

    `may_set_markers` grants it SET on ferry's markers, as the README asks (PostgreSQL 15
    lets only superusers set custom parameters otherwise). On the way out the database
    goes back to postgres and the role is dropped.
    """
    owner, password = f"owner_{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(12)
    role = sql.Identifier(owner)
    database = sql.Identifier(endpoint.database)
    with connect(endpoint) as conn:
        conn.execute(sql.SQL("create role {} login password {}").format(role, sql.Literal(password)))
        conn.execute(sql.SQL("grant pg_signal_backend to {}").format(role))
        if may_set_markers:
            markers = sql.SQL(", ").join(sql.SQL(marker) for marker in MARKERS)
            conn.execute(sql.SQL("grant set on parameter {} to {}").format(markers, role))
        conn.execute(sql.SQL("alter database {} owner to {}").format(database, role))
    try:
        yield dataclasses.replace(endpoint, user=owner, password=password)
    finally:
        with connect(endpoint, default_transaction_read_only="off") as conn:
            conn.execute(sql.SQL("alter database {} owner to postgres").format(database))
            conn.execute(sql.SQL("drop owned by {}").format(role))
            conn.execute(sql.SQL("drop role {}").format(role))


def end_copies(endpoint: PostgresEndpoint, like: str = "copy %") -> int:
    """Ends the sessions on the endpoint's database running a query `like` this (pg_dump's COPY ... TO stdout, by
    default); returns how many, as a server restart or a proxy's cut would end them."""
    with connect(endpoint) as conn:
        row = conn.execute(
            "select count(pg_terminate_backend(pid)) from pg_stat_activity "
            "where datname = current_database() and pid <> pg_backend_pid() and query ilike %s",
            (like,),
        ).fetchone()
    return int(row[0]) if row else 0


@contextlib.contextmanager
def tablespace(endpoint: PostgresEndpoint) -> Iterator[str]:
    """A tablespace of the endpoint's server, in a folder of its own that the server's user owns; yields its name.

    The stack's servers run on this machine, so the folder is one of its temporary ones.
    On the way out, what the endpoint's database put there goes back to its default
    tablespace (frozen or not), and the tablespace and its folder are removed.
    """
    name = f"space_{uuid.uuid4().hex[:8]}"
    user = ServiceUser.when_root()  # the servers run as postgres when the tests run as root, and enter /var/tmp
    folder = Path(tempfile.mkdtemp(prefix="ferry-tablespace-", dir=OUTSIDE_PARENT if user is not None else None))
    if user is not None:
        user.own(folder)
    with connect(endpoint) as conn:
        conn.execute(sql.SQL("create tablespace {} location {}").format(sql.Identifier(name), sql.Literal(str(folder))))
    try:
        yield name
    finally:
        with connect(endpoint, default_transaction_read_only="off") as conn:
            for kind in ("table", "index", "materialized view"):
                conn.execute(
                    sql.SQL("alter {} all in tablespace {} set tablespace pg_default").format(
                        sql.SQL(kind), sql.Identifier(name)
                    )
                )
            conn.execute(sql.SQL("drop tablespace {}").format(sql.Identifier(name)))
        shutil.rmtree(folder, ignore_errors=True)


def tablespaces_of(endpoint: PostgresEndpoint) -> dict[str, str]:
    """Each user relation's tablespace, by name (`pg_default` for the database's default one, whatever it is)."""
    with connect(endpoint) as conn:
        rows = conn.execute(
            "select n.nspname || '.' || c.relname, coalesce(t.spcname, 'pg_default') from pg_class c "
            "join pg_namespace n on n.oid = c.relnamespace left join pg_tablespace t on t.oid = c.reltablespace "
            "where c.relkind in ('r', 'p', 'i', 'I', 'm') and n.nspname !~ '^pg_' and n.nspname <> 'information_schema'"
        ).fetchall()
    return dict(rows)
