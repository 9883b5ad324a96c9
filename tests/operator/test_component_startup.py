"""Starting `ferry worker` and `ferry watcher` as an operator does, including before Temporal is up.

A component started while Temporal is unreachable stays alive, says once that it waits,
answers /healthz and reports not ready on /readyz; once a real Temporal dev server comes
up on that address, the component becomes ready and works. One that cannot start for a
reason waiting would not fix says why in one line and exits non-zero.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError

from devstack.stack.install import Binaries
from devstack.stack.readiness import LOOPBACK, PortBook, free_port
from devstack.stack.stack import StackInfo
from devstack.stack.temporal import TemporalDevServer
from ferry.api.migration import MigrationSpec
from ferry.api.saga import MigrationInput, MigrationRef
from ferry.clients import TemporalSettings, connect_temporal
from tests import samples
from tests.end_to_end import eventually
from tests.processes import FerryProcess, start_ferry, wait_until

TEMPORAL_START = 180.0
"""Seconds a cold machine may take to start the Temporal dev server (SQLite schema, Web UI)."""
READY_AFTER_TEMPORAL = 90.0
"""Seconds to become ready once Temporal is up: the backoff is at most 30s, plus a slow connect."""


def _probe(address: str, path: str) -> tuple[int, str] | None:
    """(status, body) of a probe, or None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return None


@pytest.fixture
def late_temporal(binaries: Binaries, tmp_path: Path) -> Iterator[TemporalDevServer]:
    """The stack's Temporal dev server, its address chosen now and its start left to the test."""
    server = TemporalDevServer(binaries, tmp_path / "temporal", PortBook(tmp_path / "ports.json"), tmp_path / "logs")
    yield server
    if server.process is not None:
        server.process.stop()


@pytest.fixture
def dead_end_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig that loads, for a cluster nobody runs: enough for a component waiting for Temporal."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://{LOOPBACK}:{free_port()}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def _answers(address: str, path: str, expected: tuple[int, str]) -> Callable[[], bool]:
    return lambda: _probe(address, path) == expected


def _lines(process: FerryProcess, text: str) -> list[str]:
    return [line for line in process.log().splitlines() if text in line]


def _logged(process: FerryProcess, text: str) -> Callable[[], bool]:
    return lambda: bool(_lines(process, text))


async def _picked_up_by_ferry_worker(client: Client, workflow_id: str) -> bool:
    """Whether a ferry worker has completed the run's first workflow task, as its history shows."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    started = [e for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED]
    completed = any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for e in history.events)
    return completed and any(
        re.fullmatch(r"ferry-worker\.\d+@.+", e.workflow_task_started_event_attributes.identity) for e in started
    )


async def test_the_worker_and_the_watcher_started_before_temporal_wait_for_it_then_work(
    stack: StackInfo, late_temporal: TemporalDevServer, migration_crd: str, namespace: str, tmp_path: Path,
    kube_api: k8s.ApiClient,
) -> None:  # fmt: skip
    task_queue = f"ferry-test-{uuid.uuid4()}"
    common = {
        "FERRY_TEMPORAL_ADDRESS": late_temporal.address,  # nothing listens there yet
        "FERRY_KUBECONFIG": str(stack.kubeconfig),
        "FERRY_TASK_QUEUE": task_queue,
        "FERRY_LOG_FORMAT": "text",
    }
    worker_probes, watcher_probes = f"{LOOPBACK}:{free_port()}", f"{LOOPBACK}:{free_port()}"
    # -v: every failed attempt is logged at debug level, so the test can tell that several were made.
    worker = start_ferry("-v", "worker", log_path=tmp_path / "worker.log", FERRY_HEALTH_ADDRESS=worker_probes, **common)
    watcher = start_ferry(
        "-v", "watcher", log_path=tmp_path / "watcher.log", FERRY_HEALTH_ADDRESS=watcher_probes,
        FERRY_NAMESPACES=namespace, FERRY_LEASE_NAMESPACE=namespace, FERRY_IDENTITY="late-watcher", **common,
    )  # fmt: skip
    try:
        both = (worker, watcher)
        for process, probes in ((worker, worker_probes), (watcher, watcher_probes)):
            name = process.log_path.stem
            wait_until(f"{name} to answer /healthz", _answers(probes, "/healthz", (200, "ok")), 120, *both)
            wait_until(f"{name} to try again", _logged(process, "still not reachable"), 60, *both)

            assert _probe(probes, "/readyz") == (503, "not ready")
            assert process.popen.poll() is None

        late_temporal.start()
        late_temporal.wait(TEMPORAL_START)
        for process, probes in ((worker, worker_probes), (watcher, watcher_probes)):
            ready = _answers(probes, "/readyz", (200, "ready"))
            wait_until(f"{process.log_path.stem} to be ready", ready, READY_AFTER_TEMPORAL, *both)

            waiting = _lines(process, "is not reachable (Connection refused); trying again with backoff")
            assert len(waiting) == 1, process.log()
            assert late_temporal.address in waiting[0]
            assert len(_lines(process, f"connected to Temporal at {late_temporal.address}")) == 1, process.log()

        # The worker polls: a run started on its task queue gets its first workflow task done by it.
        client = await connect_temporal(TemporalSettings(address=late_temporal.address))
        ref = MigrationRef(namespace=namespace, name="late", uid=str(uuid.uuid4()))
        spec = MigrationSpec.model_validate(samples.migration("late")["spec"])
        run = MigrationInput(ref=ref, generation=1, spec=spec)
        handle = await client.start_workflow("Migration", run, id=f"late-{uuid.uuid4()}", task_queue=task_queue)
        await eventually("the worker to pick up the run", lambda: _picked_up_by_ferry_worker(client, handle.id), 60)
        # No Migration backs this run, so the worker's gate may already have ended it; else it ends here.
        with contextlib.suppress(RPCError):
            await handle.terminate("the test is over")
        # The watcher works: it leads, holding the Lease it was told to use.
        leases = k8s.CoordinationV1Api(kube_api)

        def leading() -> bool:
            try:
                return bool(
                    leases.read_namespaced_lease("ferry-watcher", namespace).spec.holder_identity == "late-watcher"
                )
            except ApiException:
                return False

        wait_until("the watcher to hold its Lease", leading, 60, watcher)

        assert worker.stop() == 0
        assert watcher.stop() == 0
    finally:
        for process in (worker, watcher):
            if process.popen.poll() is None:
                process.stop(signal.SIGKILL)


@pytest.mark.parametrize("command", ["worker", "watcher"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_component_waiting_for_temporal_stops_cleanly_when_told(
    command: str, signum: int, dead_end_kubeconfig: Path, tmp_path: Path
) -> None:
    probes = f"{LOOPBACK}:{free_port()}"
    process = start_ferry(
        command, log_path=tmp_path / f"{command}.log", FERRY_TEMPORAL_ADDRESS=f"{LOOPBACK}:{free_port()}",
        FERRY_KUBECONFIG=str(dead_end_kubeconfig), FERRY_HEALTH_ADDRESS=probes, FERRY_LOG_FORMAT="text",
    )  # fmt: skip
    wait_until("it to wait for Temporal", _logged(process, "is not reachable"), 120, process)
    assert _probe(probes, "/readyz") == (503, "not ready")

    code = process.stop(signum)

    assert code == 0, process.log()
    assert _lines(process, "stopped while waiting for Temporal")
    assert "Traceback" not in process.log()
    assert _probe(probes, "/healthz") is None


@pytest.fixture
def occupied_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.mark.parametrize("command", ["worker", "watcher"])
@pytest.mark.parametrize("broken", ["kubeconfig", "health port", "metrics port", "Temporal address"])
def test_a_component_that_cannot_start_says_why_in_one_line_and_exits_non_zero(
    command: str, broken: str, dead_end_kubeconfig: Path, occupied_port: int, tmp_path: Path
) -> None:
    settings = {"FERRY_KUBECONFIG": str(dead_end_kubeconfig), "FERRY_TEMPORAL_ADDRESS": f"{LOOPBACK}:{free_port()}"}
    if broken == "kubeconfig":
        garbage = tmp_path / "garbage.yaml"
        garbage.write_text("clusters: [this is not: a kubeconfig\n")
        settings["FERRY_KUBECONFIG"] = str(garbage)
        cause = f"cannot load the Kubernetes configuration (kubeconfig {garbage}): "
    elif broken == "health port":
        settings["FERRY_HEALTH_ADDRESS"] = f"{LOOPBACK}:{occupied_port}"
        cause = f"cannot answer health probes on {LOOPBACK}:{occupied_port}: Address already in use"
    elif broken == "metrics port":
        settings["FERRY_METRICS_ADDRESS"] = f"{LOOPBACK}:{occupied_port}"
        cause = f"cannot serve metrics on {LOOPBACK}:{occupied_port}: Address already in use"
    else:
        settings["FERRY_TEMPORAL_ADDRESS"] = "not an address"
        cause = "cannot connect to Temporal at 'not an address': invalid target URL: "
    process = start_ferry(command, log_path=tmp_path / f"{command}.log", **settings)

    code = process.popen.wait(120)

    log = process.log()
    assert code == 1, log
    assert "Traceback" not in log
    last = json.loads(log.splitlines()[-1])
    assert last["level"] == "ERROR"
    assert last["message"].startswith(cause)
    assert [line for line in log.splitlines() if cause in line] == [log.splitlines()[-1]]


def test_a_bad_setting_stops_the_command_with_exit_2_one_line_and_no_traceback() -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "ferry.cli", "worker"],
        env={"FERRY_GRACEFUL_SHUTDOWN": "-1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert finished.returncode == 2
    assert finished.stderr.splitlines() == [
        "ferry worker: --graceful-shutdown (FERRY_GRACEFUL_SHUTDOWN): input should be greater than or equal to 0 "
        "(got '-1' from FERRY_GRACEFUL_SHUTDOWN)"
    ]
