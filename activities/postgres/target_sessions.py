"""The target's other sessions, ended before ferry empties a target no traffic can use, and named when they block it.

Emptying the target drops its schemas (DROP SCHEMA ... CASCADE), which waits for every lock
another session holds on anything in them: a client left in a transaction after one SELECT (a
GUI, a psql in another window), a job, a restore of an attempt the saga wrote off. Unbounded,
that wait held the snapshot step, with the source frozen, until its start-to-close timeout,
heartbeating all along, then the rollback behind it; the undo, waiting a second at a time,
tried again for ever.

Until verify marks it, the target is ferry's alone: no traffic is sent to it before
switch-traffic, which comes after the mark, and no client but ferry's has business there. So
where a target carries no mark (restoring.prepare_target, and restoring.remove in an undo),
its other client sessions are ended (`end_others`) in the transaction that then drops
everything, once that transaction holds unwritten.LOCK and found no mark: verify cannot mark it
before the transaction ends. Each statement then waits at most replication.LOCK_WAIT for a
lock; a session that came back meanwhile and took one is ended at the next try, and the
sessions holding locks there are named (application, address, user) in the log and the
heartbeat of each try (`naming_holders`), so that a client that keeps coming back can be found.

A target verify marked may be taking traffic: its sessions are the application's, and only
unwritten.vouch ends them, once traffic has left it. Sessions of superusers are ended only by a
superuser (PostgreSQL allows no one else): a user of pg_signal_backend leaves them, and names
them if they block.
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio import activity

from activities.postgres.connection import Connection

END_WAIT_MS = 5000
"""Milliseconds pg_terminate_backend waits for an ended session to be gone (its transaction rolled back)."""
WHO = """
coalesce(nullif(a.application_name, ''), 'no application_name') || ' from '
    || case when a.client_port = -1 then 'a local socket' else coalesce(host(a.client_addr), 'an address not shown') end
    || ' as ' || coalesce(a.usename, 'no user') || ' (pid ' || a.pid || ')'
"""
"""A session as `end_others` and `holders` name it: application, client address, user and pid. Without
pg_read_all_stats, a user is not shown the address of another role's session."""
OTHERS = f"""
select a.pid, {WHO} from pg_stat_activity a
where a.datname = current_database() and a.pid <> pg_backend_pid()
and (a.backend_type = 'client backend' or (a.backend_type is null and a.usesysid is not null))
and (
    (select rolsuper from pg_roles where rolname = current_user)
    or not coalesce((select rolsuper from pg_roles r where r.oid = a.usesysid), false)
)
order by a.pid
"""
"""The other client sessions of the database that the current user may end. Without pg_read_all_stats, the type of
another role's session is not shown: a session of a role (background processes have none) counts as a client's."""
HOLDERS = f"""
select distinct {WHO} from pg_locks l join pg_stat_activity a on a.pid = l.pid
where l.granted and a.pid <> pg_backend_pid() and a.datname = current_database()
and l.database = (select oid from pg_database where datname = current_database())
order by 1
"""
"""The other sessions of the database holding a lock on something in it (a relation, an object, an advisory lock)."""
NAMED = 5
"""Sessions a try names at most."""


def end_others(conn: Connection) -> list[str]:
    """Ends every other client session of `conn`'s database that its user may end, each awaited until it is gone (at
    most END_WAIT_MS): its open transaction rolled back, its locks released. Returns who they were."""
    ended = []
    for pid, who in conn.execute(OTHERS).fetchall():
        row = conn.execute("select pg_terminate_backend(%s, %s)", (pid, END_WAIT_MS)).fetchone()
        if row is not None and row[0]:
            ended.append(str(who))
    if ended:
        activity.logger.warning(
            "ended %d other sessions of the target, which no client may use before traffic moves to it: %s",
            len(ended),
            ", ".join(ended[:NAMED]),
        )
    return ended


def holders(conn: Connection) -> list[str]:
    """The other sessions holding a lock in `conn`'s database now, named."""
    conn.execute("select pg_stat_clear_snapshot()")  # within a transaction, pg_stat_activity is read once otherwise
    return [str(row[0]) for row in conn.execute(HOLDERS).fetchall()]


def naming_holders(conn: Connection, retry: Callable[[str], None]) -> Callable[[str], None]:
    """replication.briefly_locked's `retry` that first adds to the server's words who holds locks there now."""

    def named(why: str) -> None:
        found = holders(conn)
        if found:
            shown = ", ".join(found[:NAMED]) + (f" and {len(found) - NAMED} more" if len(found) > NAMED else "")
            why = f"{why}; sessions holding locks there: {shown}"
        retry(why)

    return named
