"""`kubectl ferry` without a cluster: its tables, its control values, its history rows, its flags and exit codes."""

from __future__ import annotations

import json
import queue
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from ferry.kube_requests import BoundedApiClient, RequestTimeouts
from ferry.kubectl import cli, controls, following, history, listing, progress
from ferry.kubectl.cluster import Cluster, Target, connect
from ferry.kubectl.errors import EXIT_CODES_HELP, Exit, PluginError, exit_for_phase
from ferry.kubectl.output import Colours, table

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


RUNNING = {
    "phase": "Running",
    "currentStep": "migrate",
    "message": "migrate: running (attempt 1)",
    "steps": [
        {"name": "precheck", "state": "Succeeded", "attempts": 1, "startedAt": _at(0), "finishedAt": _at(0.4)},
        {"name": "provision", "state": "Succeeded", "attempts": 2, "startedAt": _at(1), "finishedAt": _at(2.5)},
        {"name": "migrate", "state": "Running", "attempts": 1, "startedAt": _at(10)},
        {"name": "verify", "state": "Pending", "attempts": 0},
    ],
}


# --- the step table ------------------------------------------------------------------------


def test_the_table_shows_each_step_with_its_state_time_and_attempts() -> None:
    shown = progress.lines(RUNNING, None, T0 + timedelta(seconds=20))

    assert shown[0] == "phase: Running  migrate: running (attempt 1)"
    assert shown[1].split() == ["✓", "precheck", "Succeeded", "0.4s"]
    assert shown[2].split() == ["✓", "provision", "Succeeded", "1.5s", "(attempt", "2)"]
    assert shown[3].split() == [">", "migrate", "Running", "10.0s"]
    assert shown[4].split() == ["verify", "Pending"]


def test_the_running_migrate_step_shows_a_bar_the_bytes_and_the_time_left() -> None:
    heartbeat = {"read_bytes": 25_000_000, "size_bytes": 100_000_000}

    migrate = progress.lines(RUNNING, heartbeat, T0 + timedelta(seconds=20))[3]

    # A quarter in 10 s: three quarters more take about 30 s at that rate.
    assert "[######..................]  25% 25.0 MB ~30.0s left" in migrate


def test_a_snapshot_shows_bytes_without_a_total_and_a_retrying_step_its_last_error() -> None:
    status = {
        "phase": "Running",
        "currentStep": "snapshot",
        "steps": [
            {"name": "snapshot", "state": "Running", "attempts": 1, "startedAt": _at(0)},
            {"name": "verify", "state": "Retrying", "attempts": 2, "lastError": "connection refused"},
        ],
    }

    shown = progress.lines(status, {"dumped_bytes": 3_000_000, "uploaded_bytes": 1_000_000}, T0)

    assert shown[1].endswith("3.0 MB dumped, 1.0 MB uploaded")
    assert shown[2].endswith("(attempt 2)  last error: connection refused")


def test_a_step_an_abandoned_run_left_under_way_shows_interrupted_with_no_time_running_on() -> None:
    status = {
        "phase": "Abandoned",
        "steps": [{"name": "migrate", "state": "Interrupted", "attempts": 1, "startedAt": _at(10)}],
    }

    shown = progress.lines(status, None, T0 + timedelta(days=3))

    note = "the run stopped while it was under way: what it did may be done in part"
    assert shown[1].split() == ["?", "migrate", "Interrupted", *note.split()], "no time: nobody knows when it stopped"


def test_an_online_migration_shows_its_own_steps_and_the_replications_progress() -> None:
    online = {"spec": {"driver": {"mode": "Online"}}}
    pending = progress.lines({}, None, None, order=progress.order_of(online))
    assert [line.split()[0] for line in pending[1:]] == [
        "precheck", "provision", "snapshot", "replicate", "freeze", "catch-up", "verify", "switch-traffic",
        "scale-down-old",
    ]  # fmt: skip
    assert progress.order_of({"spec": {"driver": {}}})[2] == "freeze", "mode Snapshot by default"
    status = {
        "phase": "Running",
        "currentStep": "replicate",
        "steps": [{"name": "replicate", "state": "Running", "attempts": 1, "startedAt": _at(0)}],
    }

    replicating = progress.lines(status, {"tables": 5, "tables_synced": 3, "lag_bytes": 42_000_000}, T0)
    catching_up = progress.lines(
        {**status, "currentStep": "catch-up", "steps": [{**status["steps"][0], "name": "catch-up"}]},  # type: ignore[dict-item]
        {"frozen_lsn": "0/3000060", "lsn_to_apply_bytes": 1_500_000},
        T0,
    )

    assert replicating[1].endswith("tables copied 3/5, 42.0 MB behind the source")
    assert catching_up[1].endswith("1.5 MB still to apply (up to 0/3000060)")


def test_durations_stay_short_enough_for_a_column() -> None:
    assert [progress.duration(s) for s in (4.24, 185, 3725)] == ["4.2s", "3m05s", "1h02m"]
    assert progress.time_left(0, 100, 10) == ""  # no rate yet


def test_colours_paint_states_only_when_asked() -> None:
    plain = progress.lines(RUNNING, None, T0)
    painted = progress.lines(RUNNING, None, T0, Colours.ANSI)

    assert "\x1b[" not in "".join(plain)
    assert "\x1b[32m✓\x1b[0m" in painted[1]
    assert "\x1b[36mRunning\x1b[0m" in painted[0]


def test_without_a_terminal_the_display_logs_each_change_once() -> None:
    import io

    out = io.StringIO()
    display = progress.Display(out, interactive=False)
    display.render(RUNNING, None, T0)
    display.render(RUNNING, None, T0 + timedelta(seconds=1))

    logged = out.getvalue().splitlines()
    assert len(logged) == 1 + len(RUNNING["steps"])
    assert logged[0] == "12:00:00 phase: Running  migrate: running (attempt 1)"


# --- get -----------------------------------------------------------------------------------


def test_get_lists_name_phase_step_steps_done_age_and_message() -> None:
    item = {
        "metadata": {"name": "orders-db-to-16", "namespace": "shop", "creationTimestamp": _at(0)},
        "status": RUNNING,
    }

    shown = listing.rows([item], T0 + timedelta(minutes=7), namespaces=True, colours=Colours.NONE)

    assert shown[0].split() == ["NAMESPACE", "NAME", "PHASE", "STEP", "STEPS", "AGE", "MESSAGE"]
    assert shown[1].split() == [
        "shop",
        "orders-db-to-16",
        "Running",
        "migrate",
        "2/4",
        "7m",
        *RUNNING["message"].split(),
    ]


def test_ages_read_like_kubectls() -> None:
    assert [listing.age(T0, T0 + timedelta(seconds=s)) for s in (42, 420, 18000, 259200)] == ["42s", "7m", "5h", "3d"]


def test_columns_are_aligned_three_spaces_apart() -> None:
    assert table(["A", "BB"], [["long", "x"]]) == ["A      BB", "long   x"]


# --- controls ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("username", "who"),
    [
        ("ferry-admin", "ferry-admin"),
        ("alice@example.com", "alice@example.com"),
        ("system:serviceaccount:ci:deployer", "system.serviceaccount.ci.deployer"),
        ("oidc:Ana María", "oidc.Ana.Mar.a"),
        ("x" * 80, "x" * 63),
    ],
)
def test_the_user_name_is_written_in_the_alphabet_the_watcher_accepts(username: str, who: str) -> None:
    assert controls.who_from_username(username) == who


def test_a_control_value_is_who_then_the_reason_and_new_when_given_before() -> None:
    assert controls.control_value("alice", "", set(), T0) == "alice"
    assert controls.control_value("alice", "slow  queries\n", set(), T0) == "alice: slow queries"
    assert controls.control_value("alice", "", {"alice"}, T0) == "alice: again at 2026-11-22T12:00:00Z"
    again = controls.control_value("alice", "slow", {"alice: slow"}, T0)
    assert again == "alice: slow (again at 2026-11-22T12:00:00Z)"


def test_a_reason_longer_than_the_watcher_keeps_is_refused_before_anything_is_written() -> None:
    with pytest.raises(PluginError, match="at most 256"):
        controls.control_value("alice", "x" * 257, set(), T0)


def test_the_answer_is_read_from_the_watchers_event_for_that_message() -> None:
    key = "ferry.dev/retry"
    events = [
        ("ControlAccepted", "ferry.dev/approve: approved by alice"),
        ("ControlRefused", "ferry.dev/retry: retry refused: no failed step waits for a decision"),
    ]

    refused = controls.outcome_reason(events, key, "retry refused: no failed step waits for a decision")
    accepted = controls.outcome_reason(events, "ferry.dev/approve", "approved by alice")

    assert (refused, accepted) == ("ControlRefused", "ControlAccepted")
    assert controls.outcome_reason([("InvalidControl", "bad value")], key, "bad value") == "InvalidControl"


# --- history -------------------------------------------------------------------------------


def _event(event_id: int, kind: int, seconds: float, **attributes: object) -> HistoryEvent:
    event = HistoryEvent(event_id=event_id, event_type=kind, **attributes)  # type: ignore[arg-type]
    event.event_time.FromDatetime(T0 + timedelta(seconds=seconds))
    return event


def _scheduled(event_id: int, activity: str, seconds: float) -> HistoryEvent:
    return _event(event_id, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, seconds,
                  activity_task_scheduled_event_attributes={"activity_type": {"name": activity}})  # fmt: skip


def test_history_lists_each_attempt_with_its_times_and_outcome_without_status_writes() -> None:
    events = [
        _scheduled(5, "provision", 1),
        _event(6, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED, 1.1,
               activity_task_started_event_attributes={"scheduled_event_id": 5}),
        _event(7, EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, 2,
               activity_task_failed_event_attributes={"scheduled_event_id": 5, "failure": {
                   "message": "Activity task failed", "cause": {"message": "quota exceeded"}}}),
        _scheduled(8, "mirror_status", 2.1),
        _scheduled(9, "undo_provision", 3),
        _event(10, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, 4,
               activity_task_completed_event_attributes={"scheduled_event_id": 9}),
        _scheduled(11, "check_frozen", 5),
        _scheduled(12, "postgresql.undo_freeze", 6),
        _scheduled(13, "postgresql.catch_up", 7),
        _scheduled(14, "postgresql.undo_replicate", 8),
    ]  # fmt: skip

    rows = history.rows(events)

    assert [(r.kind, r.name, r.step, r.outcome, r.detail) for r in rows] == [
        ("step", "provision", "provision", "Failed", "quota exceeded"),
        ("undo", "undo_provision", "provision", "Completed", ""),
        ("check", "check_frozen", None, "Scheduled", ""),
        ("undo", "postgresql.undo_freeze", "freeze", "Scheduled", ""),
        ("step", "postgresql.catch_up", "catch-up", "Scheduled", ""),
        ("undo", "postgresql.undo_replicate", "replicate", "Scheduled", ""),
    ]
    assert rows[0].as_dict()["started"] == "2026-11-22T12:00:01.100000Z"
    cells = history.table_rows(rows)
    assert cells[0] == ["step", "provision", "provision", "12:00:01.000", "12:00:01.100", "12:00:02.000", "0.9s",
                        "Failed: quota exceeded"]  # fmt: skip
    assert [r.name for r in history.rows(events, bookkeeping=True)].count("mirror_status") == 1


def test_history_names_the_controls_and_who_gave_them() -> None:
    request = {
        "name": "rollback",
        "args": {"payloads": [{"data": json.dumps({"by": "erin", "reason": "not today"}).encode()}]},
    }
    events = [
        _event(12, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED, 6,
               workflow_execution_update_accepted_event_attributes={"accepted_request": {"input": request}}),
        _event(13, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, 9),
    ]  # fmt: skip

    rows = history.rows(events)

    assert [(r.kind, r.name, r.outcome, r.detail) for r in rows] == [
        ("control", "rollback", "Accepted", "by erin: not today"),
        ("workflow", "Completed", "Completed", ""),
    ]


# --- flags, errors and exit codes ----------------------------------------------------------


def test_status_exits_non_zero_only_for_the_unhappy_ends() -> None:
    codes = {phase: exit_for_phase(phase) for phase in ("Running", "Succeeded", "Failed", "RolledBack", "Abandoned")}

    assert codes == {"Running": Exit.OK, "Succeeded": Exit.OK, "Failed": Exit.FAILED,
                     "RolledBack": Exit.ROLLED_BACK, "Abandoned": Exit.ABANDONED}  # fmt: skip
    assert exit_for_phase(None) == Exit.OK


def test_help_documents_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["status", "--help"])

    shown = capsys.readouterr().out
    assert EXIT_CODES_HELP in shown
    assert "--temporal-address" in shown
    assert "FERRY_TEMPORAL_ADDRESS" in shown


def test_kubectls_flags_are_taken_before_and_after_the_command() -> None:
    parser = cli.build_parser()

    before = parser.parse_args(["-n", "shop", "--context", "prod", "approve", "orders", "--reason", "ok"])
    after = parser.parse_args(["rollback", "orders", "-n", "shop", "--timeout", "5"])

    assert (before.namespace, before.context, before.command, before.reason) == ("shop", "prod", "approve", "ok")
    assert (after.namespace, after.command, after.timeout) == ("shop", "rollback", 5.0)


def test_a_wrong_command_line_exits_with_the_usage_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["approve"])
    assert exited.value.code == Exit.USAGE


def _kubeconfig(folder: Path, server: str, namespace: str | None) -> Path:
    context = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "main", "context": context}, {"name": "other", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "main",
    }
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_namespace_is_the_flags_else_the_contexts_else_default(tmp_path: Path) -> None:
    config = str(_kubeconfig(tmp_path, "https://127.0.0.1:1", "shop"))

    assert connect(Target(kubeconfig=config)).namespace == "shop"
    assert connect(Target(kubeconfig=config, namespace="billing")).namespace == "billing"
    assert connect(Target(kubeconfig=config, context="other")).namespace == "default"


def test_an_unknown_context_is_one_line_naming_it(tmp_path: Path) -> None:
    config = str(_kubeconfig(tmp_path, "https://127.0.0.1:1", None))

    with pytest.raises(PluginError, match=r"cannot use the kubeconfig .*nowhere"):
        connect(Target(kubeconfig=config, context="nowhere"))


def test_an_unreachable_cluster_is_one_line_and_exit_code_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    config = _kubeconfig(tmp_path, f"https://127.0.0.1:{port}", None)

    code = cli.main(["get", f"--kubeconfig={config}"])

    error = capsys.readouterr().err
    assert code == Exit.ERROR
    assert error.startswith(f"error: cannot reach the Kubernetes API server at https://127.0.0.1:{port}")
    assert error.count("\n") == 1
    assert "Traceback" not in error


def _refused(message: str) -> ApiException:
    error = ApiException(status=403, reason="Forbidden")
    error.body = json.dumps({"kind": "Status", "status": "Failure", "reason": "Forbidden", "message": message})
    return error


@pytest.mark.parametrize(
    ("message", "said"),
    [
        (
            "migrations.ferry.dev \"m\" is forbidden: ValidatingAdmissionPolicy 'ferry-controls' with binding "
            "'ferry-controls' denied request: user \"bob\" may not approve Migration shop/m: ...",
            'error: the API server at https://127.0.0.1:1 refused to change Migration shop/m: user "bob" may not '
            "approve Migration shop/m: ...",
        ),
        (
            'migrations.ferry.dev "m" is forbidden: User "bob" cannot patch resource "migrations"',
            "error: the API server at https://127.0.0.1:1 refused access to Migration shop/m (403 Forbidden): "
            "check your credentials and RBAC",
        ),
    ],
)
def test_a_refusal_by_ferrys_admission_policy_says_why_and_one_by_rbac_what_to_check(
    tmp_path: Path, message: str, said: str
) -> None:
    cluster = connect(Target(kubeconfig=str(_kubeconfig(tmp_path, "https://127.0.0.1:1", "shop"))))

    def patch() -> None:
        raise _refused(message)

    with pytest.raises(PluginError) as refused:
        cluster.call("Migration shop/m", patch)

    assert f"error: {refused.value}" == said


def test_following_a_migration_through_a_silent_api_server_fails_in_one_line(
    silent_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kubectl ferry status -w` against a server that accepts and never answers: one line, not a frozen table."""
    monkeypatch.setattr(following, "WATCH_SECONDS", 1)  # the server would end each watch after it
    monkeypatch.setattr(following, "TIMEOUTS", RequestTimeouts(connect=1.0, read=1.0))
    configuration = k8s.Configuration(host=silent_server)
    configuration.retries = 0  # as the plugin connects
    cluster = Cluster(api=BoundedApiClient(configuration, following.TIMEOUTS), namespace="shop", server=silent_server)
    got: queue.Queue[tuple[str, Any]] = queue.Queue()
    watch = following._Watch(cluster, {"metadata": {"namespace": "shop", "name": "m", "resourceVersion": "7"}}, got.put)
    watch.start()
    try:
        kind, error = got.get(timeout=30)
    finally:
        watch.close()

    assert kind == "FAILED"
    assert isinstance(error, PluginError)
    assert str(error).startswith("the API server stopped answering: the watch of Migration shop/m got nothing for 2s")
