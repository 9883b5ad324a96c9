"""A late attempt of verify neither ends the target's sessions nor marks it once a later activity marked it.

verify ends by marking the target: it ends every other session of the target, reads where
its writes stand and keeps that in the target (ferry.verified_mark), for the undo of a
finished run, which has no step results. An attempt whose worker stood still (SIGSTOP, a
frozen VM) between its comparison and its marking is written off; the saga's next
attempt verifies and marks, switch-traffic moves the clients to the target and they
write. Going on then, the stalled attempt would end the application's sessions on the
live target and put in a mark that counts those writes: the undo would find nothing
written since, send traffic back to the source and empty the target. So it touches
nothing: its marking session, which holds the lock from its first read, is ended by the
later attempt's marking (VerifyGuardLost), and one that starts late is refused
(TargetVerified). The pause is made by holding the attempt
right after its comparison; its ActivityEnvironment carries the activity's run, id,
schedule time and attempt, as Temporal gives them.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from psycopg import sql

from activities.postgres import unwritten, verifying
from activities.postgres.attempts import Attempt
from activities.postgres.unwritten import VerifyGuardLost
from devstack.stack.postgres import PostgresEndpoint
from devstack.stack.readiness import LOOPBACK
from ferry.api.errors import PermanentError, TargetNotVerified, TargetVerified, WritesOnTarget
from ferry.api.saga import FenceMark, VerifyResult
from tests.end_to_end import Databases
from tests.postgres.conftest import RUN, SCHEDULED, Steps, create_secret, scheduled_as
from tests.postgres.data import connect, contents, create_shop, verified_mark
from tests.postgres.online import OnlineSteps


class Held:
    """verify's attempts, the first of which stands still right after its comparison until `go_on`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.compared = threading.Event()
        self._resume = threading.Event()
        self._first = True
        compare = verifying.compare

        def held(*args: Any, **kwargs: Any) -> verifying.Comparison:
            comparison = compare(*args, **kwargs)
            if self._first:
                self._first = False
                self.compared.set()
                self._resume.wait(120)
            return comparison

        monkeypatch.setattr(verifying, "compare", held)

    def start(self, late: Steps) -> dict[str, BaseException | VerifyResult]:
        """Starts `late`'s verify in a thread of its own; what it ends with is in the result once `go_on` returns."""
        self._ended: dict[str, BaseException | VerifyResult] = {}

        def run() -> None:
            try:
                self._ended["result"] = late.verify()
            except BaseException as error:  # noqa: BLE001 - handed to the test
                self._ended["result"] = error

        self._thread = threading.Thread(target=run)
        self._thread.start()
        assert self.compared.wait(120), "the first attempt compared"
        return self._ended

    def go_on(self) -> BaseException | VerifyResult:
        self._resume.set()
        self._thread.join(120)
        assert not self._thread.is_alive()
        return self._ended["result"]


@pytest.mark.parametrize(
    ("late", "later"),
    [
        pytest.param((20, 1), (21, 1), id="the-saga's-next-attempt"),
        pytest.param((20, 1), (20, 2), id="Temporal's-retry-of-the-activity"),
    ],
)
def test_a_late_verify_after_a_later_attempt_marked_and_clients_wrote_ends_no_session_and_keeps_the_mark(
    restored: Steps, databases: Databases, monkeypatch: pytest.MonkeyPatch, late: tuple[int, int],
    later: tuple[int, int],
) -> None:  # fmt: skip
    """The later attempt is the saga's next one (an activity of its own, scheduled after) or, in version 1 of the saga,
    Temporal's retry of the same activity (its id and schedule time, a higher attempt)."""
    held = Held(monkeypatch)
    first = scheduled_as(restored, late[0], attempt=late[1])
    second = scheduled_as(restored, later[0], attempt=later[1], scheduled=SCHEDULED + timedelta(seconds=later[0]))
    held.start(first)  # compares, then its worker stands still
    second.verify()  # the saga wrote the first off: this one compares and marks
    mark = verified_mark(databases.target)

    with connect(databases.target) as application:  # traffic moved: the clients write, and keep their session
        application.execute("insert into audit.log (order_id, note) values (3, 'written after traffic moved')")
        written = contents(databases.target)

        ended = held.go_on()  # the stalled worker goes on

        # Its marking session, which held the lock from its first read, was ended by the later attempt's marking.
        assert isinstance(ended, VerifyGuardLost), ended
        assert application.execute("select 1").fetchone() == (1,), "the application's session was not ended"
    assert "This attempt marked nothing" in str(ended), ended
    assert verified_mark(databases.target) == mark, "the mark stays the later attempt's"
    assert contents(databases.target) == written
    with pytest.raises(WritesOnTarget, match="1 row was inserted, updated or deleted"):
        restored.check_unwritten(None)  # as the undo of a finished run calls it: the recorded mark


def test_a_late_verify_of_mode_online_ends_no_session_where_it_starts_either(
    online: OnlineSteps, databases: Databases
) -> None:
    """In mode Online verify starts by ending the target's other sessions (to read the tables compared ahead): a late
    attempt that stood still before it is refused there, under the same lock as the marking."""
    create_shop(databases.source, customers=100, orders=1_000)
    replicated = online.replicate()
    online.freeze()
    online.catch_up()
    scheduled_as(online, 20).verify(replicated.ahead)
    mark = _mark(databases)

    with connect(databases.target) as application:
        application.execute("insert into audit.log (order_id, note) values (3, 'written after traffic moved')")

        with pytest.raises(TargetVerified, match=r"a later attempt of verify \(activity 20 of .*\) has marked it"):
            scheduled_as(online, 18).verify(replicated.ahead)

        assert application.execute("select 1").fetchone() == (1,), "the application's session was not ended"
    assert _mark(databases) == mark
    online.undo_freeze()


def test_a_verify_of_a_later_activity_marks_the_target_again(restored: Steps, databases: Databases) -> None:
    """A retry cycle's new verify (failurePolicy Pause) is scheduled after the one that marked: it marks."""
    scheduled_as(restored, 20).verify()
    assert _mark(databases)["attempt"]["activity"] == "20"

    again = scheduled_as(restored, 31).verify()

    mark = _mark(databases)
    assert mark["attempt"] == {
        "run": RUN, "activity": "31", "scheduled": (SCHEDULED + timedelta(seconds=31)).isoformat(), "number": 1,
    }  # fmt: skip
    assert again.target_fence is not None
    assert mark["fence"] == again.target_fence.model_dump(mode="json")


def test_once_traffic_may_move_no_verify_marks_the_target_until_the_undo_emptied_it(
    steps: Steps, databases: Databases
) -> None:
    """The check before switch-traffic seals verify's mark: neither the same activity (the worker that marked, going on
    after its result was lost) nor a reset's new run (scheduled later) marks the live target again."""
    create_shop(databases.source, customers=100, orders=1_000)
    frozen = steps.freeze()
    restored = steps
    restored.migrate(restored.snapshot())
    verified = scheduled_as(restored, 20).verify()
    scheduled_as(restored, 22).check_frozen(frozen.fence, before="switch-traffic")  # traffic moves after it
    sealed = _mark(databases)
    assert verified.target_fence is not None
    assert sealed["fence"] == verified.target_fence.model_dump(mode="json")
    assert sealed["sealed_by"]["activity"] == "22"

    for late in (
        scheduled_as(restored, 20),
        scheduled_as(restored, 5, run="run-2", scheduled=SCHEDULED.replace(year=2027)),
    ):
        with pytest.raises(TargetVerified, match="traffic may have moved to it"):
            late.verify()
        assert verified_mark(databases.target) == sealed

    assert scheduled_as(restored, 30).undo_migrate().removed  # the way back vouches, empties and takes the mark away
    restored.migrate(restored.snapshot())
    scheduled_as(restored, 40).verify()
    assert "sealed_by" not in (verified_mark(databases.target) or {})


def test_a_late_undo_of_migrate_leaves_a_target_that_later_steps_restored_verified_and_sealed(
    steps: Steps, databases: Databases
) -> None:
    """failurePolicy Pause: a first cycle's undo of migrate stands still (SIGSTOP, a frozen VM) past its heartbeat
    timeout; its retry empties the target; a person sends retry, and the second cycle restores, verifies, seals and
    moves the traffic. The first attempt, going on, must not empty that target: it is refused before it ends any
    session, while the saga's own undo, scheduled after the seal, empties it."""
    create_shop(databases.source, customers=100, orders=1_000)
    frozen = steps.freeze()
    steps.migrate(steps.snapshot())
    scheduled_as(steps, 20).verify()
    late = scheduled_as(steps, 21)
    assert scheduled_as(steps, 21, attempt=2).undo_migrate().removed  # the retry of the first cycle's undo

    steps.migrate(steps.snapshot())  # the second cycle
    scheduled_as(steps, 30).verify()
    scheduled_as(steps, 32).check_frozen(frozen.fence, before="switch-traffic")
    served = contents(databases.target)
    mark = verified_mark(databases.target)
    with connect(databases.target) as client:  # a client of the live target, whose session must not be ended
        with pytest.raises(PermanentError, match="late attempt the saga has moved past") as refused:
            late.undo_migrate()
        assert type(refused.value).__name__ == "Overtaken"
        client.execute("select 1")
    assert contents(databases.target) == served
    assert verified_mark(databases.target) == mark

    assert scheduled_as(steps, 40).undo_migrate().removed  # the saga's own way back, after the seal


def test_a_mark_written_by_an_older_ferry_is_read_and_replaced(restored: Steps, databases: Databases) -> None:
    """A mark without the attempt (an older ferry's): its fence is read as before, and a verify marks over it."""
    verified = restored.verify()
    assert verified.target_fence is not None
    _set_mark(databases, {"migration": _owner(restored), "fence": verified.target_fence.model_dump(mode="json")})

    assert restored.check_unwritten(None).fence == verified.target_fence

    scheduled_as(restored, 20).verify()
    assert _mark(databases)["attempt"]["activity"] == "20"


def test_a_late_verify_is_refused_by_the_mark_of_another_migration(restored: Steps, databases: Databases) -> None:
    other = {"migration": "shop/orders-db-to-16/another-uid", "fence": FenceMark(writes=0, catalog="x").model_dump()}
    _set_mark(databases, other)

    with pytest.raises(TargetVerified, match="verify of Migration shop/orders-db-to-16/another-uid has marked it"):
        restored.verify()

    assert verified_mark(databases.target) == other


def _mark(databases: Databases) -> dict[str, Any]:
    """The target's mark, which it must have."""
    mark = verified_mark(databases.target)
    assert mark is not None
    return mark


def _owner(steps: Steps) -> str:
    return f"{steps.ref.namespace}/{steps.ref.name}/{steps.ref.uid}"


def _set_mark(databases: Databases, mark: dict[str, object]) -> None:
    with connect(databases.target) as conn:
        database = sql.Identifier(databases.target.database)
        conn.execute(
            sql.SQL("alter database {} set ferry.verified_mark = {}").format(
                database, sql.Literal(json.dumps(mark, sort_keys=True))
            )
        )


@pytest.mark.unit
def test_attempts_of_one_activity_are_ordered_by_temporals_attempt_when_both_are_known() -> None:
    first = Attempt(run=RUN, activity="20", scheduled=SCHEDULED, number=1)
    assert first.before(dataclasses.replace(first, number=2))
    assert not dataclasses.replace(first, number=2).before(first)
    assert not first.before(first)
    assert not first.before(dataclasses.replace(first, number=None)), "an attempt not recorded orders nothing"
    assert Attempt.from_json(first.as_json()) == first
    assert Attempt.from_json({"run": RUN, "activity": "20", "scheduled": SCHEDULED.isoformat()}).number is None


@pytest.mark.unit
def test_a_mark_is_read_with_what_it_lacks_unknown_and_an_unreadable_seal_as_a_seal() -> None:
    old = unwritten.Mark.parse(json.dumps({"migration": "ns/name/uid", "fence": {"writes": 1, "catalog": "c"}}))
    assert (old.migration, old.attempt, old.sealed_by) == ("ns/name/uid", None, None)
    garbled = unwritten.Mark.parse(json.dumps({"migration": "ns/name/uid", "fence": {}, "sealed_by": "yes"}))
    assert garbled.sealed_by is not None
    assert unwritten.Mark.parse("not json").migration is None


def test_a_late_catch_up_after_verify_marked_leaves_the_live_targets_sequences_alone(
    online: OnlineSteps, databases: Databases
) -> None:
    """catch-up sets the target's sequences from the frozen source's. An attempt whose worker stood still past its
    heartbeat timeout, going on once verify marked the target and the clients wrote to it, would set them back: the
    clients' next inserts would take numbers already used. It is refused, and the sequences stay where they are."""
    create_shop(databases.source, customers=100, orders=1_000)
    replicated = online.replicate()
    online.freeze()
    online.catch_up()
    online.verify(replicated.ahead)
    with connect(databases.target) as application:
        application.execute("insert into audit.log (order_id, note) values (3, 'written after traffic moved')")
    moved = _ticket_seq(databases.target)

    with pytest.raises(TargetVerified, match="refused to set the target's sequences from the source's"):
        scheduled_as(online, 9).catch_up()  # the attempt that stood still

    assert _ticket_seq(databases.target) == moved, "the live target's sequence was not set back"
    online.undo_freeze()


def _ticket_seq(db: PostgresEndpoint) -> tuple[int, bool]:
    with connect(db) as conn:
        row = conn.execute("select last_value, is_called from audit.ticket_seq").fetchone()
    assert row is not None
    return int(row[0]), bool(row[1])


@pytest.mark.parametrize("how", ["emptied by an undo since verify", "never verified"])
def test_the_check_before_switch_traffic_refuses_a_target_without_verifys_mark(
    steps: Steps, databases: Databases, how: str
) -> None:
    """Traffic goes only to a target verify marked for this Migration. A run reset to before switch-traffic (temporal
    workflow reset) after a rollback had emptied the target went on to switch the clients to that empty database."""
    create_shop(databases.source, customers=10, orders=10)
    frozen = steps.freeze()
    steps.migrate(steps.snapshot())
    if how == "emptied by an undo since verify":
        steps.verify()
        steps.undo_migrate()

    with pytest.raises(
        TargetNotVerified, match=r"holds no mark of verify of Migration .*: roll back, and migrate again"
    ):
        steps.check_frozen(frozen.fence, before="switch-traffic")

    assert verified_mark(databases.target) is None, "nothing marked or sealed"
    steps.check_frozen(frozen.fence)  # the source itself is as frozen as ever
    steps.undo_freeze()


def test_the_check_before_scale_down_old_keeps_the_source_when_the_target_lost_what_verify_compared(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """The clients use the target since switch-traffic; if it came back empty (its volume lost with its Pod), the source
    holds the only copy, and is not scaled down. A target that does not answer at that moment does not stop the
    scale-down, which changes nothing on it."""
    create_shop(databases.source, customers=10, orders=10)
    frozen = steps.freeze()
    steps.migrate(steps.snapshot())
    steps.verify()
    steps.check_frozen(frozen.fence, before="switch-traffic")
    steps.check_frozen(frozen.fence, before="scale-down-old")  # as verify left it

    target = databases.target
    silent = _with_target(steps, kube_api, namespace, target, UNREACHABLE_TARGET, host=LOOPBACK, port=_closed_port())
    silent.check_frozen(frozen.fence, before="scale-down-old")
    rotated = _with_target(steps, kube_api, namespace, target, "rotated-target", password="rotated since")
    rotated.check_frozen(frozen.fence, before="scale-down-old")  # the clients are on it: not a reason to roll back

    with connect(target) as conn:  # what an emptied database looks like: no mark
        conn.execute(sql.SQL("alter database {} reset ferry.verified_mark").format(sql.Identifier(target.database)))
    with pytest.raises(TargetNotVerified, match=r"holds no mark of verify of Migration .* any more.*not scaled down"):
        steps.check_frozen(frozen.fence, before="scale-down-old")
    steps.undo_freeze()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        pytest.param(
            "update shop.customers set email = 'x' || email where id = 1", "1 row was inserted, updated", id="write"
        ),
        pytest.param("select pg_stat_reset()", "statistics were reset", id="crash"),  # what a crash does to them
    ],
)
def test_the_check_before_switch_traffic_refuses_a_target_that_is_no_longer_as_verify_left_it(
    steps: Steps, databases: Databases, change: str, said: str
) -> None:
    """A crash of the target's server between verify and the switch empties its unlogged tables and drops the
    statistics that would show writes; a write by someone else changes it. verify's comparison no longer holds, and
    the clients are not sent there."""
    create_shop(databases.source, customers=10, orders=10)
    frozen = steps.freeze()
    steps.migrate(steps.snapshot())
    steps.verify()
    with connect(databases.target) as conn:
        conn.execute(change)

    with pytest.raises(TargetNotVerified, match=rf"is not as verify left it: .*{said}.*the clients are not sent there"):
        steps.check_frozen(frozen.fence, before="switch-traffic")

    assert "sealed_by" not in _mark(databases), "left unsealed"
    steps.undo_freeze()


def test_the_check_before_switch_traffic_fails_retryably_when_the_target_cannot_be_reached(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, namespace: str
) -> None:
    """A target that does not answer may have lost its volume and come back empty, Ready all the same: the clients are
    not sent there until the seal's session has found it as verify left it. The failure is not permanent, so the
    step's next attempt checks again; the rollback, should it come to that, knows that no traffic moved."""
    create_shop(databases.source, customers=10, orders=10)
    frozen = steps.freeze()
    steps.migrate(steps.snapshot())
    scheduled_as(steps, 20).verify()
    unreachable = _with_target(
        steps, kube_api, namespace, databases.target, UNREACHABLE_TARGET, host=LOOPBACK, port=_closed_port()
    )

    with pytest.raises(unwritten.TargetUnsealed, match="did not answer to have verify's mark sealed") as raised:
        scheduled_as(unreachable, 22).check_frozen(frozen.fence, before="switch-traffic")

    assert not isinstance(raised.value, PermanentError), "tried again at the step's next attempt"
    assert "sealed_by" not in _mark(databases), "nothing sealed the mark"
    checked = scheduled_as(steps, 23).check_frozen(frozen.fence, before="switch-traffic")  # the target answers again
    assert checked.fence is not None
    assert _mark(databases)["sealed_by"]["activity"] == "23"
    steps.undo_freeze()


UNREACHABLE_TARGET = "unreachable-target-db"


def _with_target(
    steps: Steps, kube_api: k8s.ApiClient, namespace: str, target: PostgresEndpoint, name: str, **changed: str | int
) -> Steps:
    """`steps` with the target Secret `name`: the target's connection with `changed` (host, port, password)."""
    connection = {"host": target.host, "port": target.port, "username": target.user, "password": target.password,
                  "database": target.database, **changed}  # fmt: skip
    create_secret(kube_api, namespace, name, {key: str(value) for key, value in connection.items()})
    return dataclasses.replace(steps, driver=steps.driver.model_copy(update={"target_secret": name}))


def _closed_port() -> int:
    """A loopback port nothing listens on (one that was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])
