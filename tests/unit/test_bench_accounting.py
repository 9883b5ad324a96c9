"""The fleet benchmark's accounts of the seconds after the apply: who used the machine, what the API server answered."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scripts.bench_fleet import CpuAccount, answered, requests_by_kind

TICK = os.sysconf("SC_CLK_TCK")


def test_each_process_is_charged_what_it_used_between_the_two_moments() -> None:
    before = {1: ("kube-apiserver", 10 * TICK), 2: ("worker-a", 3 * TICK)}
    after = {1: ("kube-apiserver", 14 * TICK), 2: ("worker-a", 4 * TICK)}

    account = CpuAccount.between(((0, 0), (150, 200)), (before, after))

    assert account.by_process == {"kube-apiserver": 4.0, "worker-a": 1.0}
    assert account.busy == pytest.approx(0.75)


def test_a_process_born_in_between_is_charged_all_it_used() -> None:
    account = CpuAccount.between(((0, 0), (1, 1)), ({}, {7: ("pg_dump", 2 * TICK)}))

    assert account.by_process == {"pg_dump": 2.0}


def test_a_kernel_thread_that_renamed_itself_is_charged_only_what_it_used_since() -> None:
    before = {9: ("kworker/u8:1-events", 500 * TICK)}
    after = {9: ("kworker/u8:1-ext4-rsv-conversion", 501 * TICK)}

    account = CpuAccount.between(((0, 0), (1, 1)), (before, after))

    assert account.by_process == {"kworker/u8:1-ext4-rsv-conversion": 1.0}


def test_a_reused_pid_is_a_new_process() -> None:
    before = {5: ("psql", 40 * TICK)}
    after = {5: ("pg_restore", 3 * TICK)}

    account = CpuAccount.between(((0, 0), (1, 1)), (before, after))

    assert account.by_process == {"pg_restore": 3.0}


def test_the_api_servers_requests_are_counted_by_verb_and_resource_over_every_other_label() -> None:
    metrics = "\n".join(
        [
            "# TYPE apiserver_request_total counter",
            'apiserver_request_total{code="200",component="apiserver",group="ferry.dev",resource="migrations",'
            'scope="resource",subresource="",verb="GET",version="v1alpha1"} 7',
            'apiserver_request_total{code="404",component="apiserver",group="ferry.dev",resource="migrations",'
            'scope="resource",subresource="",verb="GET",version="v1alpha1"} 2',
            'apiserver_request_total{code="200",component="apiserver",group="ferry.dev",resource="migrations",'
            'scope="resource",subresource="status",verb="APPLY",version="v1alpha1"} 3',
            'apiserver_request_total{code="200",component="",group="",resource="",scope="",subresource="/healthz",'
            'verb="GET",version=""} 5',
            'apiserver_request_duration_seconds_count{resource="migrations",verb="GET"} 99',
        ]
    )

    counted = requests_by_kind(metrics)

    assert counted == {"GET migrations": 9, "APPLY migrations/status": 3, "GET /healthz": 5}


def _status_write(received: str, answered_at: str, code: int, status: dict[str, object]) -> str:
    return json.dumps(
        {
            "stage": "ResponseComplete",
            "objectRef": {"resource": "migrations", "subresource": "status", "namespace": "shop"},
            "responseStatus": {"code": code},
            "requestReceivedTimestamp": received,
            "stageTimestamp": answered_at,
            "requestObject": {"status": status},
        }
    )


def test_each_stamp_is_timed_by_the_first_successful_write_that_carried_it(tmp_path: Path) -> None:
    first = {"phase": "Running", "currentStep": "precheck", "transitionedAt": "2026-11-25T07:00:00.000000Z"}
    second = {
        "phase": "Running",
        "transitionedAt": "2026-11-25T07:00:05.000000Z",
        "steps": [{"name": "precheck", "startedAt": "2026-11-25T07:00:00.000000Z"}],
    }
    log = tmp_path / "kube-apiserver-audit.log"
    log.write_text(
        "\n".join(
            [
                _status_write("2026-11-25T07:00:00.100000Z", "2026-11-25T07:00:00.300000Z", 409, first),
                _status_write("2026-11-25T07:00:00.400000Z", "2026-11-25T07:00:00.900000Z", 200, first),
                _status_write("2026-11-25T07:00:05.200000Z", "2026-11-25T07:00:05.250000Z", 200, second),
            ]
        )
        + "\n"
    )

    found = answered([log])["shop"]

    moment = 1795590000.0  # 2026-11-25T07:00:00Z
    assert {stamp: (received - moment, at - moment) for stamp, (received, at) in found.items()} == {
        "2026-11-25T07:00:00.000000Z": pytest.approx((0.4, 0.9)),
        "2026-11-25T07:00:05.000000Z": pytest.approx((5.2, 5.25)),
    }
