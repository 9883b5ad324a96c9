"""A stack keeps its data across a stop and a start, and leaves no process behind.

These tests run stacks of their own, in their own state folders, beside the session's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from devstack.stack import postgres_home
from devstack.stack.install import Binaries
from devstack.stack.processes import group_members, processes_under
from devstack.stack.stack import Stack, StackInfo
from ferry.clients import TemporalSettings, connect_temporal
from tests.conftest import make_closed_folder, make_state_dir, remove_state_dir


@pytest.fixture
def own_state_dir() -> Iterator[Path]:
    folder = make_state_dir("ferry-lifecycle-")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def closed_state_dir() -> Iterator[Path]:
    """A state folder inside a folder like root's home (mode 700), which the postgres user cannot enter."""
    closed = make_closed_folder("ferry-closed-")
    state_dir = closed / "stack"
    yield state_dir
    remove_state_dir(state_dir)
    shutil.rmtree(closed, ignore_errors=True)


def _wait_for_no_process(state_dir: Path, groups: set[int], timeout: float = 15) -> list[object]:
    deadline = time.monotonic() + timeout
    left: list[object] = []
    outside = postgres_home.outside_folder(state_dir)
    while time.monotonic() < deadline:
        left = [*processes_under(state_dir), *processes_under(outside), *group_members(groups)]
        if not left:
            break
        time.sleep(0.2)
    return left


async def test_data_survives_a_stop_and_start_and_nothing_is_left_after_teardown(
    own_state_dir: Path, binaries: Binaries
) -> None:
    stack = Stack(own_state_dir, binaries=binaries)
    marker = uuid.uuid4().hex
    info = stack.start()
    try:
        with psycopg.connect(info.postgres["source"].dsn) as conn:
            conn.execute("create table survivors (marker text)")
            conn.execute("insert into survivors values (%s)", (marker,))
        info.s3_client().create_bucket(Bucket="survivors")
        info.s3_client().put_object(Bucket="survivors", Key="marker", Body=marker.encode())
        api = k8s_config.new_client_from_config(config_file=str(info.kubeconfig))
        k8s.CoreV1Api(api).create_namespaced_config_map(
            "default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="survivor"), data={"marker": marker})
        )
        api.close()
        temporal = await connect_temporal(TemporalSettings(address=str(info.temporal_address)))
        await temporal.start_workflow("NeverRuns", id=f"survivor-{marker}", task_queue="nobody-polls")
    finally:
        stack.stop()

    info = stack.start()
    try:
        with psycopg.connect(info.postgres["source"].dsn) as conn:
            row = conn.execute("select marker from survivors").fetchone()
        body = info.s3_client().get_object(Bucket="survivors", Key="marker")["Body"].read()
        api = k8s_config.new_client_from_config(config_file=str(info.kubeconfig))
        config_map = k8s.CoreV1Api(api).read_namespaced_config_map("survivor", "default")
        api.close()
        temporal = await connect_temporal(TemporalSettings(address=str(info.temporal_address)))
        described = await temporal.get_workflow_handle(f"survivor-{marker}").describe()
        pids = {int(entry) for entry in _recorded_pids(own_state_dir)}
    finally:
        stack.stop()

    assert row == (marker,)
    assert body == marker.encode()
    assert config_map.data == {"marker": marker}
    assert described.id == f"survivor-{marker}"
    assert _wait_for_no_process(own_state_dir, pids) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="only as root does PostgreSQL run as another user")
def test_postgres_data_under_a_folder_closed_to_the_postgres_user_survives_a_stop_and_start(
    closed_state_dir: Path, binaries: Binaries
) -> None:
    stack = Stack(closed_state_dir, components=frozenset({"postgres"}), binaries=binaries)
    marker = uuid.uuid4().hex
    info = stack.start()
    try:
        described = StackInfo.load(closed_state_dir)
        with psycopg.connect(info.postgres["target"].dsn) as conn:
            conn.execute("create table survivors (marker text)")
            conn.execute("insert into survivors values (%s)", (marker,))
    finally:
        stack.stop()

    info = stack.start()
    try:
        with psycopg.connect(info.postgres["target"].dsn) as conn:
            row = conn.execute("select marker from survivors").fetchone()
        pids = set(_recorded_pids(closed_state_dir))
    finally:
        stack.stop()

    assert row == (marker,)
    assert described.postgres_data == postgres_home.outside_folder(closed_state_dir)
    assert described.postgres_data_outside is not None
    assert f"cannot enter {closed_state_dir.parent} (drwx------)" in described.postgres_data_outside
    assert _wait_for_no_process(closed_state_dir, pids) == []


def _recorded_pids(state_dir: Path) -> list[int]:
    import json

    return [entry["pid"] for entry in json.loads((state_dir / "pids.json").read_text())]


def _start_ferry_up(state_dir: Path) -> tuple[subprocess.Popen[str], set[int]]:
    up = subprocess.Popen(
        [sys.executable, "-m", "devstack", "up", f"--state-dir={state_dir}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert up.stdout is not None
    seen = []
    for line in up.stdout:
        seen.append(line)
        if "The stack is up" in line:
            return up, set(_recorded_pids(state_dir))
    raise AssertionError("ferry up ended before the stack was up:\n" + "".join(seen))


@pytest.mark.parametrize(
    ("how", "sig"), [("interrupted with Ctrl-C", signal.SIGINT), ("killed outright", signal.SIGKILL)]
)
def test_no_process_is_left_when_ferry_up_is(how: str, sig: int, own_state_dir: Path, binaries: Binaries) -> None:
    up, groups = _start_ferry_up(own_state_dir)
    assert group_members(groups), "the stack's processes should be running before the signal"

    os.kill(up.pid, sig)
    up.communicate(timeout=60)

    assert _wait_for_no_process(own_state_dir, groups) == []
    if sig == signal.SIGINT:
        assert up.returncode == 0
