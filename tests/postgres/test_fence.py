"""The write fence: the freeze keeps clients out, and check_frozen notices any write that got past it.

After the freeze, only superusers and members of ferry's role can connect to the source,
and they could still write by asking for a read-write transaction. check_frozen, run
before traffic moves, compares the source with the mark the freeze took and fails
with WritesAfterFreeze when anything was written, whatever way it was written; and it
must not cry wolf over what a frozen database legitimately sees (ANALYZE, VACUUM,
pg_dump, ferry's own queries, writes to other databases of the same server).
"""

from __future__ import annotations

import dataclasses
import subprocess
import uuid

import psycopg
import pytest

from activities.postgres import fencing, schema
from devstack.stack.install import Binaries
from devstack.stack.stack import StackInfo
from ferry.api.errors import WritesAfterFreeze
from ferry.api.saga import FreezeResult
from tests.cluster import eventually
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import Connection, application_role, connect, contents, create_shop, subscription_to_nowhere


@pytest.fixture
def source(databases: Databases) -> Databases:
    """A small shop on the source: tables, sequences, a view and a function."""
    create_shop(databases.source, customers=100, orders=1_000)
    return databases


def _rows_written(conn: Connection, table: str) -> int:
    """n_tup_ins + n_tup_upd + n_tup_del of a table, as the shared statistics know it now."""
    conn.execute("select pg_stat_clear_snapshot()")
    row = conn.execute(
        "select n_tup_ins + n_tup_upd + n_tup_del from pg_stat_user_tables where relid = %s::regclass", (table,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_an_application_writing_is_cut_off_at_the_freeze_and_cannot_reconnect_until_the_undo(
    steps: Steps, source: Databases
) -> None:
    with application_role(source.source) as app:
        with connect(app) as writer:
            writer.execute("insert into audit.log (order_id, note) values (3, 'before the freeze')")

            frozen = steps.freeze()

            with pytest.raises(psycopg.OperationalError):
                writer.execute("insert into audit.log (order_id, note) values (3, 'after the freeze')")
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            connect(app)
        assert frozen.revoked_connect == ["PUBLIC"]  # the app could connect through PUBLIC, as with a new database
        assert app.user not in frozen.can_still_connect

        steps.check_frozen(frozen.fence)
        steps.undo_freeze()

        with connect(app) as writer:
            writer.execute("insert into audit.log (order_id, note) values (3, 'after the undo')")
    with connect(source.source) as conn:
        notes = [row[0] for row in conn.execute("select note from audit.log where order_id = 3 order by id")]
    assert notes == ["checked 1", "before the freeze", "after the undo"]


def test_a_session_held_open_across_the_freeze_is_ended_even_one_that_turned_read_only_off(
    steps: Steps, source: Databases
) -> None:
    with connect(source.source) as held:
        held.execute("set default_transaction_read_only = off")

        frozen = steps.freeze()

        with pytest.raises(psycopg.OperationalError):
            held.execute("insert into audit.log (order_id, note) values (3, 'too late')")
    assert frozen.sessions_ended == 1
    steps.check_frozen(frozen.fence)


@pytest.mark.parametrize(
    "statements",
    [
        pytest.param(
            ["begin read write", "insert into audit.log (order_id, note) values (3, 'x')", "commit"], id="begin"
        ),
        pytest.param(["set default_transaction_read_only = off", "update shop.customers set email = email"], id="set"),
    ],
)
def test_a_superuser_writing_after_the_freeze_is_caught_by_check_frozen(
    steps: Steps, source: Databases, statements: list[str]
) -> None:
    frozen = steps.freeze()
    with connect(source.source) as superuser:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            superuser.execute("insert into audit.log (order_id, note) values (3, 'x')")  # the default is read-only
        for statement in statements:
            superuser.execute(statement)

        with pytest.raises(WritesAfterFreeze) as raised:
            steps.check_frozen(frozen.fence, before="switch-traffic")

    message = str(raised.value)
    assert "changed after the freeze, before switch-traffic" in message
    assert "inserted, updated or deleted" in message
    assert "the Migration must not go on: roll back" in message
    assert "customer" not in message, "no row values in messages"


def test_a_transaction_prepared_after_the_freeze_and_still_pending_is_caught_by_check_frozen(
    steps: Steps, source: Databases
) -> None:
    """A prepared transaction's rows are counted only when it ends: pending at the check, it shows in no counter,
    yet its coordinator may commit it on the source after traffic moved, a write the target lacks."""
    gid = f"xa-{uuid.uuid4().hex[:8]}"
    frozen = steps.freeze()
    try:
        with connect(source.source) as superuser:
            superuser.execute("begin read write")
            superuser.execute("update shop.customers set email = email where id = 1")  # no sequence moves
            superuser.execute(f"prepare transaction '{gid}'")

        with pytest.raises(WritesAfterFreeze) as raised:
            steps.check_frozen(frozen.fence)

        message = str(raised.value)
        assert f"still pending: '{gid}' (owner postgres, prepared " in message
        assert "the Migration must not go on: roll back" in message
    finally:
        with connect(source.source) as conn:
            if conn.execute("select from pg_prepared_xacts where gid = %s", (gid,)).fetchone() is not None:
                conn.execute(f"rollback prepared '{gid}'")
    with pytest.raises(WritesAfterFreeze, match="1 row was inserted"):  # once ended, its row counts like any other
        steps.check_frozen(frozen.fence)


def test_a_write_whose_statistics_the_session_has_not_flushed_yet_is_caught(steps: Steps, source: Databases) -> None:
    """A backend flushes its statistics at most once a second; check_frozen ends it, which flushes them."""
    frozen = steps.freeze()
    with connect(source.source, default_transaction_read_only="off") as writer, connect(source.source) as observer:
        writer.execute("insert into audit.log (order_id, note) values (3, 'first')")
        eventually("the first write to reach the shared statistics", lambda: _rows_written(observer, "audit.log") > 0)
        counted = _rows_written(observer, "audit.log")
        writer.execute("insert into audit.log (order_id, note) values (3, 'second')")
        assert _rows_written(observer, "audit.log") == counted, "the second write is not in the shared statistics yet"
        as_if_marked_after_the_first = frozen.fence.model_copy(update={"writes": frozen.fence.writes + 1})

        with pytest.raises(WritesAfterFreeze, match=r"1 row was inserted, updated or deleted"):
            steps.check_frozen(as_if_marked_after_the_first)


@pytest.mark.parametrize(
    ("write", "caught"),
    [
        pytest.param("select nextval('audit.ticket_seq')", "sequences moved", id="nextval"),
        pytest.param("truncate audit.log", "tables or the schema changed", id="truncate"),
        pytest.param("create table public.late (id int)", "tables or the schema changed", id="ddl"),
        pytest.param("select lo_from_bytea(0, 'late')", "inserted, updated or deleted", id="large-object"),
    ],
)
def test_writes_that_touch_no_row_counter_are_caught_too(
    steps: Steps, source: Databases, write: str, caught: str
) -> None:
    frozen = steps.freeze()
    with connect(source.source) as superuser:
        superuser.execute(f"begin read write; {write}; commit")

    with pytest.raises(WritesAfterFreeze, match=caught):
        steps.check_frozen(frozen.fence)


@pytest.mark.parametrize(
    "write",
    [
        pytest.param("select setval('audit.spare_seq', 5000, false)", id="setval-not-called"),
        pytest.param("alter sequence audit.spare_seq restart with 5000", id="restart"),
    ],
)
def test_a_sequence_set_to_hand_out_another_value_next_is_caught_though_it_hands_out_none(
    steps: Steps, source: Databases, write: str
) -> None:
    """A sequence that has handed out no value since it was created reads the same to pg_sequence_last_value
    whatever value it is set to hand out first."""
    with connect(source.source) as superuser:
        superuser.execute("create sequence audit.spare_seq")
    frozen = steps.freeze()
    with connect(source.source) as superuser:
        superuser.execute(f"begin read write; {write}; commit")

    with pytest.raises(WritesAfterFreeze, match="sequences moved"):
        steps.check_frozen(frozen.fence)


def test_a_mark_an_older_worker_took_still_compares_with_a_sequence_set_to_start_again(
    steps: Steps, source: Databases
) -> None:
    """A worker upgraded mid-run: its mark holds the fingerprint of last values alone (no `sequences_next`), in which
    a sequence set with setval(..., false), as pg_restore leaves one, reads as unused. Read the same way, nothing
    moved."""
    with connect(source.source) as superuser:
        superuser.execute("create sequence audit.spare_seq; select setval('audit.spare_seq', 5000, false)")
    frozen = steps.freeze()
    assert frozen.fence is not None
    with connect(source.source) as conn:  # as an older worker read them: pg_sequence_last_value alone
        rows = conn.execute(schema.SEQUENCE_VALUES).fetchall()
    last_values = {f"value of sequence {ns}.{name}": "not used yet" if value is None else str(value)
                   for ns, name, value, _ in rows}  # fmt: skip
    taken_by_an_older_worker = frozen.fence.model_copy(
        update={"sequences": fencing._digest(last_values), "sequences_next": None}
    )
    # Workers of a few commits read such a sequence as it stands (`next value 5000`) and kept no sequences_next.
    taken_by_a_newer_one = frozen.fence.model_copy(
        update={"sequences": frozen.fence.sequences_next, "sequences_next": None}
    )

    steps.check_frozen(taken_by_an_older_worker)
    steps.check_frozen(taken_by_a_newer_one)
    steps.check_frozen(frozen.fence)
    with connect(source.source) as superuser:
        superuser.execute("begin read write; select setval('audit.spare_seq', 6000, false); commit")
    for mark in (taken_by_a_newer_one, frozen.fence):  # an older worker's mark cannot tell: it never could
        with pytest.raises(WritesAfterFreeze, match="sequences moved"):
            steps.check_frozen(mark)


def test_statistics_reset_after_the_freeze_fails_the_check_since_nothing_can_be_vouched_for(
    steps: Steps, source: Databases
) -> None:
    frozen = steps.freeze()
    with connect(source.source) as superuser:
        superuser.execute("select pg_stat_reset()")

    with pytest.raises(WritesAfterFreeze, match=r"statistics were reset since the freeze"):
        steps.check_frozen(frozen.fence)


def test_what_a_frozen_source_legitimately_sees_does_not_fail_the_check(
    steps: Steps, source: Databases, stack: StackInfo, binaries: Binaries
) -> None:
    """ANALYZE and VACUUM (as autovacuum runs them), reads, pg_dump (by hand and by the snapshot), verify,
    ALTER DATABASE (as ferry writes its markers), a retried freeze, writes to other databases of the server."""
    endpoint = source.source
    before = contents(endpoint)
    frozen = steps.freeze()
    with connect(endpoint) as superuser:
        superuser.execute("analyze")
        superuser.execute("vacuum (analyze) shop.orders")
        superuser.execute("select count(*) from shop.orders join shop.customers on customers.id = customer_id")
        superuser.execute(
            f"begin read write; alter database {endpoint.database} set ferry.note = 'x'; "
            f"alter database {endpoint.database} reset ferry.note; commit"
        )
    again = steps.freeze()  # retried after a lost result
    subprocess.run(
        [str(binaries.postgres_bindir / "pg_dump"), "--format=custom", f"--dbname={endpoint.dsn}"],
        check=True,
        capture_output=True,
    )
    artifact = steps.snapshot()
    steps.migrate(artifact)
    steps.verify()
    with connect(dataclasses.replace(endpoint, database="postgres")) as elsewhere:  # moves the server's WAL and xids
        elsewhere.execute(
            f"begin; create table {endpoint.database}_neighbour (id int); insert into {endpoint.database}_neighbour "
            f"values (1); drop table {endpoint.database}_neighbour; commit"
        )

    first = steps.check_frozen(frozen.fence, before="switch-traffic")
    steps.check_frozen(frozen.fence, before="scale-down-old")

    assert again.fence == first.fence == frozen.fence
    assert contents(source.source) == before


def test_check_frozen_ends_the_sessions_it_finds(steps: Steps, source: Databases) -> None:
    frozen: FreezeResult = steps.freeze()
    with connect(source.source) as reader:
        reader.execute("select 1")

        result = steps.check_frozen(frozen.fence)

        with pytest.raises(psycopg.OperationalError):
            reader.execute("select 1")
    assert result.sessions_ended == 1


def test_check_frozen_of_a_source_someone_unfroze_fails(steps: Steps, source: Databases) -> None:
    frozen = steps.freeze()
    steps.undo_freeze()

    with pytest.raises(WritesAfterFreeze, match=r"no longer frozen by this Migration"):
        steps.check_frozen(frozen.fence)


def test_a_subscription_a_superuser_enabled_after_the_freeze_is_caught_by_check_frozen(
    steps: Steps, source: Databases
) -> None:
    """The freeze refuses a source with enabled subscriptions, whose apply workers write with no read-only check; a
    superuser may still make one afterwards. Its rows may not be counted yet when the check looks, so the enabled
    subscription itself fails the check. The publisher is a port nobody listens on: enabled is all it takes."""
    frozen = steps.freeze()
    with subscription_to_nowhere(source.source) as name:
        with connect(source.source, default_transaction_read_only="off") as superuser:
            superuser.execute(f"alter subscription {name} enable")

        with pytest.raises(WritesAfterFreeze, match=f"its subscriptions {name} are enabled, and their apply workers"):
            steps.check_frozen(frozen.fence)
    steps.undo_freeze()
