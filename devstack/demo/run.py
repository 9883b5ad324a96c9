"""`make up` (`python -m devstack up`): the local stack, the worker and the watcher, and a sample followed live.

Order: start the stack; install the CRD; start the worker and the watcher (in this
process, like two pods); seed the sample and apply its Migration; follow its status
until it finishes; print where to look next. Ctrl-C at any point stops everything.
Meanwhile the worker, the watcher and every process of the stack are watched: one that
stops ends the run with a ComponentStopped naming it, for the terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import SecretStr
from temporalio.client import Client

from activities.settings import DataActivitySettings, KubeActivitySettings
from devstack.demo import sample
from devstack.demo.progress import Display
from devstack.stack import admission
from devstack.stack.errors import ComponentStopped, StackError, StartError
from devstack.stack.install import Binaries
from devstack.stack.logtail import meaningful
from devstack.stack.readiness import wait_until
from devstack.stack.stack import StackInfo
from ferry.api.crd import manifest_yaml
from ferry.api.migration import FINISHED_PHASES, GROUP, PLURAL, VERSION
from ferry.api.saga import TASK_QUEUE
from ferry.clients import TemporalSettings, connect_temporal, kubernetes_client
from ferry.startup import StartupError
from watcher import runner as watcher_runner
from watcher.settings import LeaseSettings, WatcherSettings
from worker import runner as worker_runner
from worker.settings import WorkerSettings

log = logging.getLogger("devstack.demo")

FERRY_LOG = "ferry.log"
"""ferry's own log (the worker's, the watcher's, the demo's), in the stack's logs folder."""
STACK_CHECK_INTERVAL = 1.0
"""Seconds between two looks at whether every process of the stack still runs."""
FINISHED = {phase.value for phase in FINISHED_PHASES}


CRD_ESTABLISHED = 300.0
"""Seconds the API server may take to serve the Migration CRD once applied (a busy, cold machine is slow)."""


def install_crd(binaries: Binaries, info: StackInfo) -> None:
    """Applies the Migration CRD and waits until the API server serves it."""
    kubectl = [str(binaries.kubectl), f"--kubeconfig={info.kubeconfig}"]
    applied = subprocess.run([*kubectl, "apply", "--server-side", "-f", "-"], input=manifest_yaml(), text=True,
                             capture_output=True)  # fmt: skip
    if applied.returncode in (-signal.SIGINT, -signal.SIGTERM):
        raise KeyboardInterrupt  # stopped with the run (Ctrl-C reaches the whole process group): not a failure
    if applied.returncode != 0:
        what = f"kubectl could not apply the Migration CRD (exit code {applied.returncode})"
        raise StartError(what, component="kubectl", cause=meaningful(applied.stderr))
    # Polled, not `kubectl wait`: that fails outright when it reads the CRD before it has any condition.
    api = kubernetes_client(info.kubeconfig)
    try:
        extensions = k8s.ApiextensionsV1Api(api)
        wait_until(
            "the Migration CRD (Established)",
            lambda: _established(extensions.read_custom_resource_definition(f"{PLURAL}.{GROUP}")),
            timeout=CRD_ESTABLISHED,
        )
    finally:
        api.close()
    admission.wait_migrations_admitted(kubectl)


def _established(crd: Any) -> bool:
    conditions = (crd.status and crd.status.conditions) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def component_settings(info: StackInfo, binaries: Binaries) -> tuple[WorkerSettings, WatcherSettings]:
    assert info.temporal_address is not None
    temporal = TemporalSettings(
        address=info.temporal_address, namespace=info.temporal_namespace or "default", codec_keys=info.codec_keys
    )
    worker = WorkerSettings(
        temporal=temporal,
        task_queue=TASK_QUEUE,
        kubeconfig=info.kubeconfig,
        kube_activities=KubeActivitySettings(poll_interval=0.5, temporal_ui_url=info.temporal_ui_url),
        data_activities=DataActivitySettings(postgres_bindir=binaries.postgres_bindir),
        claim_key=SecretStr(secrets.token_hex(32)),  # one process signs and checks: any key of its own will do
    )
    watcher = WatcherSettings(
        temporal=temporal,
        task_queue=TASK_QUEUE,
        kubeconfig=info.kubeconfig,
        lease=LeaseSettings(namespace="default"),
        resync_interval=10,
    )
    return worker, watcher


def _apply(api: k8s.ApiClient, manifest: dict[str, Any]) -> dict[str, Any]:
    custom = k8s.CustomObjectsApi(api)
    metadata = manifest["metadata"]
    try:
        created: dict[str, Any] = custom.create_namespaced_custom_object(
            GROUP, VERSION, metadata["namespace"], PLURAL, manifest
        )
        return created
    except ApiException as error:
        if error.status != 409:
            raise
    existing: dict[str, Any] = custom.get_namespaced_custom_object(
        GROUP, VERSION, metadata["namespace"], PLURAL, metadata["name"]
    )
    return existing


async def _heartbeat(client: Client, workflow_id: str) -> dict[str, Any] | None:
    """The latest heartbeat details of the workflow's running activity, if any."""
    try:
        description = await client.get_workflow_handle(workflow_id).describe()
    except Exception:  # noqa: BLE001 - progress is best effort
        return None
    for pending in description.raw_description.pending_activities:
        if pending.activity_type.name != "mirror_status" and pending.heartbeat_details.payloads:
            values = await client.data_converter.decode(pending.heartbeat_details.payloads)
            if values and isinstance(values[0], dict):
                return values[0]
    return None


async def follow(api: k8s.ApiClient, client: Client, namespace: str, name: str, out: TextIO) -> dict[str, Any]:
    """Shows the Migration's progress until it reaches a final phase; returns its last state."""
    display = Display(out, interactive=out.isatty())
    custom = k8s.CustomObjectsApi(api)
    while True:
        obj: dict[str, Any] = await asyncio.to_thread(
            custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name
        )
        status = obj.get("status") or {}
        workflow = (status.get("workflow") or {}).get("id")
        heartbeat = await _heartbeat(client, workflow) if workflow and status.get("currentStep") else None
        display.render(status, heartbeat, datetime.now(UTC))
        if status.get("phase") in FINISHED:
            return obj
        await asyncio.sleep(0.5)


def where_next(info: StackInfo, obj: dict[str, Any], kubectl: Path, temporal: Path) -> str:
    status = obj.get("status") or {}
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    workflow = status.get("workflow") or {}
    k = f"{kubectl} --kubeconfig={info.kubeconfig}"
    codec = f" --codec-endpoint {info.codec_endpoint}" if info.codec_endpoint else ""
    url = (
        workflow.get("url")
        or f"{info.temporal_ui_url}/namespaces/default/workflows/{quote(workflow.get('id', ''), safe='')}"
    )
    return "\n".join(
        [
            f"Migration {namespace}/{name}: {status.get('phase')} — {status.get('message')}",
            "",
            "Where to look next:",
            f"  {k} get migrations -n {namespace}",
            f"  {k} describe migration {name} -n {namespace}",
            f"  {k} get statefulsets,services,endpointslices -n {namespace}",
            f"  Temporal Web UI: {url}",
            f"  {temporal} workflow show --address {info.temporal_address}{codec} "
            f"--workflow-id '{workflow.get('id', '')}'",
        ]
    )


async def run(
    info: StackInfo,
    binaries: Binaries,
    *,
    with_sample: bool,
    keep_running: bool,
    orders: int,
    out: TextIO,
    check_stack: Callable[[], None] = lambda: None,
    stopping: asyncio.Event | None = None,
) -> int:
    """Runs the worker, the watcher and (optionally) the sample; returns the exit code.

    `check_stack` raises when a process of the stack has stopped; it is called every
    STACK_CHECK_INTERVAL seconds, and what it raises ends the run. `stopping` is set once
    the run has begun to stop its worker and watcher.
    """
    install_crd(binaries, info)
    worker_settings, watcher_settings = component_settings(info, binaries)
    stop = asyncio.Event()
    guards = [
        asyncio.create_task(worker_runner.run(worker_settings, stop=stop), name="worker"),
        asyncio.create_task(watcher_runner.run(watcher_settings, stop=stop), name="watcher"),
        asyncio.create_task(_watch_stack(check_stack), name="stack"),
    ]
    print(f"worker and watcher are running (task queue {TASK_QUEUE})", file=out, flush=True)
    code = 0
    try:
        if with_sample:
            code = await _while_guarded(_run_sample(info, binaries, orders, out), guards, info)
        if keep_running or not with_sample:
            print("\nThe stack, the worker and the watcher keep running. Press Ctrl-C to stop.", file=out, flush=True)
            await _while_guarded(asyncio.Event().wait(), guards, info)
    finally:
        if stopping is not None:
            stopping.set()
        stop.set()
        guards[-1].cancel()
        for task in guards:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=30)
    return code


async def _watch_stack(check_stack: Callable[[], None]) -> None:
    while True:
        check_stack()
        await asyncio.sleep(STACK_CHECK_INTERVAL)


async def _while_guarded(work: Coroutine[Any, Any, Any], guards: list[asyncio.Task[None]], info: StackInfo) -> Any:
    """Runs `work` to its end, unless a guard ends first: then raises why that guard ended."""
    job = asyncio.ensure_future(work)
    try:
        await asyncio.wait([job, *guards], return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not job.done():
            job.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await job
    for guard in guards:
        if guard.done():
            raise _why_it_ended(guard, info)
    return job.result()


def _why_it_ended(guard: asyncio.Task[None], info: StackInfo) -> StackError:
    """The error for the terminal when the worker, the watcher or the stack's watch ended."""
    error = None if guard.cancelled() else guard.exception()
    if isinstance(error, StackError):
        return error  # a process of the stack stopped: it names itself
    name = guard.get_name()
    ferry_log = info.logs_dir / FERRY_LOG
    if error is None:
        return ComponentStopped(f"ferry's {name} stopped on its own", component=name, log_path=ferry_log)
    log.error("ferry's %s stopped", name, exc_info=error)  # the traceback goes to ferry's log
    cause = " ".join(str(error).split()) or type(error).__name__
    if not isinstance(error, StartupError):  # a StartupError says it all in one line
        cause = f"{type(error).__name__}: {cause}"
    stopped = ComponentStopped(f"ferry's {name} stopped", component=name, cause=[cause[:200]], log_path=ferry_log)
    stopped.__cause__ = error
    return stopped


async def _run_sample(info: StackInfo, binaries: Binaries, orders: int, out: TextIO) -> int:
    api = kubernetes_client(info.kubeconfig)
    try:
        print(f"seeding the sample: database '{sample.DATABASE}' ({orders:,} orders) behind StatefulSet "
              f"{sample.NAMESPACE}/{sample.SOURCE}", file=out, flush=True)  # fmt: skip
        await asyncio.to_thread(sample.prepare, api, info, orders)
        manifest = sample.migration_manifest(info)
        await asyncio.to_thread(_apply, api, manifest)
        print(f"applied Migration {sample.NAMESPACE}/{sample.MIGRATION}:", file=out)
        print(json.dumps(manifest["spec"], indent=2), file=out, flush=True)
        assert info.temporal_address is not None
        client = await connect_temporal(TemporalSettings(address=info.temporal_address, codec_keys=info.codec_keys))
        final = await follow(api, client, sample.NAMESPACE, sample.MIGRATION, out)
        print("\n" + where_next(info, final, binaries.kubectl, binaries.temporal), file=out, flush=True)
        return 0 if (final.get("status") or {}).get("phase") == "Succeeded" else 1
    finally:
        api.close()


def main_entry(
    info: StackInfo,
    binaries: Binaries,
    *,
    with_sample: bool,
    keep_running: bool,
    orders: int,
    check_stack: Callable[[], None] = lambda: None,
    when_stuck: Callable[[], None] = lambda: None,
    stop_asked_before: Callable[[], bool] = lambda: False,
) -> int:
    """Runs `run` until it ends or the process gets Ctrl-C or SIGTERM (then KeyboardInterrupt).

    Ctrl-C also reaches the short-lived programs `run` starts in the terminal's process
    group (kubectl), which then fail: once a stop was asked for, whatever failed after it
    is part of stopping, not a failure to report. `when_stuck` is what supervise calls
    when the stop takes longer than STOP_GRACE.
    """

    def running(stopping: asyncio.Event) -> Coroutine[Any, Any, int]:
        return run(
            info, binaries, with_sample=with_sample, keep_running=keep_running, orders=orders, out=sys.stdout,
            check_stack=check_stack, stopping=stopping,
        )  # fmt: skip

    return supervise(running, when_stuck=when_stuck, stop_asked_before=stop_asked_before)


INSIST_INTERVAL = 2.0
"""Seconds after which a stop that has not reached the run yet is asked for again."""
STOP_GRACE = 120.0
"""Seconds the run may take to stop once asked to (its worker and watcher take at most 30s each)."""


def supervise(
    running: Callable[[asyncio.Event], Coroutine[Any, Any, int]],
    *,
    when_stuck: Callable[[], None] = lambda: None,
    stop_asked_before: Callable[[], bool] = lambda: False,
) -> int:
    """Runs `running(stopping)` in an event loop until it ends, or until Ctrl-C or SIGTERM stop it.

    A stop cancels the run, and is asked for again every INSIST_INTERVAL seconds until the
    run has begun to stop (it sets `stopping`) or ended: a cancellation can be lost (in
    Python 3.11, asyncio.wait_for drops one that arrives as the awaited thing completes),
    and a Ctrl-C must never leave the stack running. A run still not ended STOP_GRACE
    seconds after the stop was asked for is stuck: every thread's stack is shown (where
    it waits), `when_stuck` runs (from another thread: it stops the stack), and the
    process exits with code 1. `stop_asked_before` says whether a stop was asked for before
    the handlers were in place (and its KeyboardInterrupt lost): then the run stops at once.
    """
    loops: list[asyncio.AbstractEventLoop] = []
    overdue = threading.Timer(STOP_GRACE, _stuck, args=(when_stuck, loops))
    overdue.daemon = True

    async def supervised() -> int:
        stopping = asyncio.Event()
        task = asyncio.create_task(running(stopping))
        asked_to_stop = asyncio.Event()
        loops.append(asyncio.get_running_loop())

        def stop() -> None:
            if not asked_to_stop.is_set():
                overdue.start()
            asked_to_stop.set()
            task.cancel()

        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, stop)
        if stop_asked_before():
            stop()
        insisting = asyncio.create_task(_insist(task, asked_to_stop, stopping))
        try:
            return await task
        except (asyncio.CancelledError, Exception):
            if asked_to_stop.is_set():
                raise KeyboardInterrupt from None
            raise
        finally:
            insisting.cancel()

    try:
        return asyncio.run(supervised())  # its own end waits for every task and thread left: within the grace too
    finally:
        overdue.cancel()


def _stuck(when_stuck: Callable[[], None], loops: list[asyncio.AbstractEventLoop]) -> None:
    log.error("the run has not stopped %gs after it was asked to: stopping the stack from outside it", STOP_GRACE)
    print(f"\nthe run has not stopped {STOP_GRACE:g}s after it was asked to; where each thread waits:",
          file=sys.stderr, flush=True)  # fmt: skip
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    with contextlib.suppress(Exception):  # read from another thread than the loop's: the best it can show
        for task in list(asyncio.all_tasks(loops[0])):
            print(f"task {task.get_name()}:", file=sys.stderr)
            task.print_stack(limit=8, file=sys.stderr)
        sys.stderr.flush()
    try:
        when_stuck()
    finally:
        os._exit(1)


async def _insist(task: asyncio.Task[int], asked_to_stop: asyncio.Event, stopping: asyncio.Event) -> None:
    await asked_to_stop.wait()
    while True:
        await asyncio.wait({task}, timeout=INSIST_INTERVAL)
        if task.done() or stopping.is_set():
            return
        log.warning("the stop asked for has not reached the run after %.0fs: asking again", INSIST_INTERVAL)
        task.cancel()
