"""A client writing all through a migration loses nothing the server acknowledged: the freeze refuses, never drops."""

from __future__ import annotations

import threading
import time

import psycopg

from devstack.stack.postgres import PostgresEndpoint
from tests.cluster import eventually
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import connect, create_shop


class Writer:
    """Inserts one row after another on its own connection, reconnecting when its session is ended.

    It records which inserts the server acknowledged (the autocommit insert returned),
    which it refused as read-only, and which are in doubt (the session ended under it).
    """

    def __init__(self, endpoint: PostgresEndpoint) -> None:
        self.endpoint = endpoint
        self.acknowledged: list[tuple[int, float]] = []
        self.refused: list[tuple[int, float, str | None]] = []
        self.in_doubt: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="writer", daemon=True)

    def run(self) -> None:
        conn: psycopg.Connection[tuple[object, ...]] | None = None
        number = 0
        while not self.stop.is_set():
            if conn is None:
                try:
                    conn = connect(self.endpoint)
                except psycopg.OperationalError:
                    time.sleep(0.01)
                    continue
            number += 1
            try:
                conn.execute("insert into shop.events (id) values (%s)", (number,))
            except psycopg.errors.ReadOnlySqlTransaction as error:
                self.refused.append((number, time.monotonic(), error.sqlstate))
                time.sleep(0.002)
            except psycopg.OperationalError:
                self.in_doubt.append(number)
                conn.close()
                conn = None
            else:
                self.acknowledged.append((number, time.monotonic()))
        if conn is not None:
            conn.close()

    def acknowledged_between(self, start: float, end: float) -> list[int]:
        return [number for number, at in self.acknowledged if start <= at <= end]


def test_every_write_the_source_acknowledged_is_in_the_target_and_later_writes_were_refused(
    steps: Steps, databases: Databases
) -> None:
    create_shop(databases.source, customers=1_000, orders=20_000)
    with connect(databases.source) as conn:
        conn.execute("create table shop.events (id int primary key, at timestamptz not null default now())")
    writer = Writer(databases.source)
    writer.thread.start()
    try:
        eventually("the writer to get going", lambda: len(writer.acknowledged) > 100)

        freeze_started = time.monotonic()
        frozen = steps.freeze()
        frozen_at = time.monotonic()
        eventually("the writer to be refused", lambda: len(writer.refused) > 10)
        artifact = steps.snapshot()
        steps.migrate(artifact)
        steps.verify()
        steps.check_frozen(frozen.fence, before="switch-traffic")  # the refused attempts wrote nothing: no false alarm
        undo_started = time.monotonic()
        steps.undo_freeze(frozen.previous_setting)
        acknowledged_before_undo = len(writer.acknowledged)
        eventually("writes to resume", lambda: len(writer.acknowledged) > acknowledged_before_undo + 10)
    finally:
        writer.stop.set()
        writer.thread.join(10)

    with connect(databases.target) as conn:
        in_target = {row[0] for row in conn.execute("select id from shop.events")}
    acknowledged_before = {number for number, at in writer.acknowledged if at < undo_started}
    refused = {number for number, _, _ in writer.refused}
    assert acknowledged_before, "the writer wrote before the freeze"
    assert acknowledged_before <= in_target, "every acknowledged insert reached the target"
    assert in_target <= acknowledged_before | set(writer.in_doubt), "nothing refused reached the target"
    assert writer.acknowledged_between(frozen_at, undo_started) == [], "no write was acknowledged while frozen"
    assert {state for _, at, state in writer.refused if at >= freeze_started} == {"25006"}  # read_only_sql_transaction
    assert not refused & in_target
    assert writer.in_doubt, "the freeze ended the writer's session"
