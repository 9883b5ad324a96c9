"""The `kubectl-ferry` command: kubectl finds it on PATH and runs it as `kubectl ferry ...`.

Flags follow kubectl's habits (--kubeconfig, --context, -n, -A, -o json|yaml), errors are
one line on stderr with a non-zero exit code (errors.Exit), and colours appear only on a
terminal. Each subcommand is a small function here; what it reads and how it renders
live in the modules named after it.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ferry.api.migration import FINISHED_PHASES, Phase
from ferry.api.saga import MigrationRef, workflow_id
from ferry.codec.events import sealed_payloads
from ferry.configuration import arguments
from ferry.kubectl import controls, history, listing, logs, planning, progress, temporal
from ferry.kubectl.cluster import Cluster, Target, connected
from ferry.kubectl.errors import EXIT_CODES_HELP, Exit, PluginError, exit_for_phase
from ferry.kubectl.following import follow, running_heartbeat, warn
from ferry.kubectl.output import Colours, dump, table
from ferry.process import exit_without_teardown

PROG = "kubectl ferry"
FINISHED = {phase.value for phase in FINISHED_PHASES}


def _target(args: argparse.Namespace) -> Target:
    return Target(
        kubeconfig=getattr(args, "kubeconfig", None),
        context=getattr(args, "context", None),
        namespace=getattr(args, "namespace", None),
    )


def _workflow(obj: dict[str, Any]) -> tuple[str, str | None]:
    """The Migration's workflow ID (from its status, else computed as the watcher does) and Temporal namespace."""
    workflow = (obj.get("status") or {}).get("workflow") or {}
    metadata = obj["metadata"]
    ref = MigrationRef(namespace=metadata["namespace"], name=metadata["name"], uid=metadata["uid"])
    return workflow.get("id") or workflow_id(ref), workflow.get("namespace")


def _write(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    sys.stdout.flush()


# --- get -----------------------------------------------------------------------------------


def cmd_get(args: argparse.Namespace, cluster: Cluster) -> Exit:
    if args.name:
        if args.all_namespaces:
            raise PluginError("a Migration's name goes with one namespace: drop -A, or drop the name")
        items = [cluster.migration(cluster.namespace, args.name)]
    else:
        items = cluster.migrations(None if args.all_namespaces else cluster.namespace)
    if args.output:
        data = items[0] if args.name else {"apiVersion": "v1", "kind": "List", "items": items}
        _write(dump(data, args.output))
        return Exit.OK
    if not items:
        where = "any namespace" if args.all_namespaces else f"namespace {cluster.namespace}"
        print(f"No Migrations found in {where}.", file=sys.stderr)
        return Exit.OK
    colours = Colours.for_stream(sys.stdout)
    _write("\n".join(listing.rows(items, datetime.now(UTC), namespaces=args.all_namespaces, colours=colours)))
    return Exit.OK


# --- status --------------------------------------------------------------------------------


async def _temporal_client(args: argparse.Namespace, obj: dict[str, Any]) -> Any:
    """A Temporal client when an address was given, else None; a Temporal that does not answer is a warning."""
    settings = temporal.settings_from(args, os.environ, _workflow(obj)[1])
    if settings is None:
        return None
    try:
        return await temporal.connect(settings)
    except PluginError as error:
        warn(f"{error}; showing the status without the running step's progress")
        return None


async def _status(args: argparse.Namespace, cluster: Cluster) -> Exit:
    obj = cluster.migration(cluster.namespace, args.name)
    if args.output and not args.watch:
        _write(dump(obj, args.output))
        return exit_for_phase((obj.get("status") or {}).get("phase"))
    client = await _temporal_client(args, obj) if not args.output else None
    colours = Colours.for_stream(sys.stdout)
    metadata = obj["metadata"]
    if not args.output:
        title = f"Migration {metadata['namespace']}/{metadata['name']}  (workflow {_workflow(obj)[0]})"
        _write(colours.paint(title, "bold"))
    if args.watch:
        if args.output:
            obj = await follow(cluster, obj, None, io.StringIO())  # only the final version is printed
            _write(dump(obj, args.output))
        else:
            obj = await follow(cluster, obj, client, sys.stdout)
    else:
        status = obj.get("status") or {}
        heartbeat = await running_heartbeat(client, obj)
        _write("\n".join(progress.lines(status, heartbeat, datetime.now(UTC), colours, progress.order_of(obj))))
    return exit_for_phase((obj.get("status") or {}).get("phase"))


def cmd_status(args: argparse.Namespace, cluster: Cluster) -> Exit:
    return asyncio.run(_status(args, cluster))


# --- plan --------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace, cluster: Cluster) -> Exit:
    migration = planning.read_manifest(args.filename)
    namespace = getattr(args, "namespace", None) or migration["metadata"].get("namespace") or cluster.namespace
    ended = planning.run(cluster, migration, namespace, args.timeout)
    name = migration["metadata"]["name"]
    if args.output:
        _write(dump(planning.as_data(ended, name), args.output))
    else:
        _write("\n".join(planning.lines(ended, name, Colours.for_stream(sys.stdout))))
    planned = (ended.get("status") or {}).get("phase") == Phase.PLANNED.value
    return Exit.OK if planned else Exit.NOT_PLANNED


# --- controls ------------------------------------------------------------------------------


def cmd_control(args: argparse.Namespace, cluster: Cluster) -> Exit:
    answer = controls.send(cluster, cluster.namespace, args.name, args.command, args.reason or "", args.timeout)
    if args.output:
        _write(dump(answer.as_dict(), args.output))
    else:
        verdict = "accepted" if answer.accepted else "refused"
        line = f"{args.command} {verdict} ({answer.annotation}={answer.value}): {answer.message}"
        colours = Colours.for_stream(sys.stdout if answer.accepted else sys.stderr)
        painted = colours.paint(line, "green" if answer.accepted else "red")
        print(painted, file=sys.stdout if answer.accepted else sys.stderr)
    return answer.code


# --- history -------------------------------------------------------------------------------


async def _history(args: argparse.Namespace, cluster: Cluster) -> Exit:
    obj = cluster.migration(cluster.namespace, args.name)
    workflow, namespace = _workflow(obj)
    settings = temporal.settings_from(args, os.environ, namespace)
    if settings is None:
        raise PluginError(temporal.NO_ADDRESS)
    client = await temporal.connect(settings)
    events = await temporal.history_events(client, workflow)
    if client.data_converter.payload_codec is None and sealed_payloads(events):
        warn(
            "the history is encrypted: pass --codec-keys (or set FERRY_CODEC_KEYS) to the worker's codec keys to see "
            "failure messages and who gave each control"
        )
    found = history.rows(events, bookkeeping=args.all)
    if args.output:
        data = {"workflow": {"id": workflow, "namespace": settings.namespace}, "items": [r.as_dict() for r in found]}
        _write(dump(data, args.output))
    else:
        _write(f"workflow {workflow} (Temporal namespace {settings.namespace}); times in UTC")
        _write("\n".join(table(history.HEADER, history.table_rows(found))))
    return Exit.OK


def cmd_history(args: argparse.Namespace, cluster: Cluster) -> Exit:
    return asyncio.run(_history(args, cluster))


# --- logs ----------------------------------------------------------------------------------


def cmd_logs(args: argparse.Namespace, cluster: Cluster) -> Exit:
    obj = cluster.migration(cluster.namespace, args.name)
    where = logs.WorkerPods(namespace=args.worker_namespace, selector=args.worker_selector, container=args.container)
    for line in logs.lines(cluster, where, _workflow(obj)[0], args.tail):
        _write(line)
    return Exit.OK


# --- the parser ----------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    """kubectl's connection flags, accepted before and after the subcommand."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("Kubernetes")
    group.add_argument(
        "--kubeconfig",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)",
    )
    group.add_argument("--context", default=argparse.SUPPRESS, help="the kubeconfig context to use")
    group.add_argument("-n", "--namespace", default=argparse.SUPPRESS,
                       help="the Migration's namespace (default: the context's, else default)")  # fmt: skip
    return common


def _output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("json", "yaml"), help="print JSON or YAML instead of a table")


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog=PROG, parents=[common], formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Follow and steer ferry's Migrations (ferry.dev/v1alpha1) in any cluster kubectl reaches.",
        epilog=EXIT_CODES_HELP,
    )  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, description: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, parents=[common], help=help, description=description, epilog=EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        return sub

    get = command("get", "list Migrations: phase, step, steps done, age, message",
                  "List the Migrations of a namespace (-A: of every namespace), or show one.")  # fmt: skip
    get.add_argument("name", nargs="?", help="one Migration")
    get.add_argument("-A", "--all-namespaces", action="store_true", help="list the Migrations of every namespace")
    _output(get)
    get.set_defaults(run=cmd_get)

    status = command(
        "status", "the step table of a Migration (-w: live until it finishes)",
        "Show a Migration's phase and every step with its state, time and attempts; with a Temporal address, "
        "the running step's progress (bytes, tables checked, time left) from its heartbeat. -w redraws on every "
        "change until the Migration finishes. Exits 0 when it Succeeded or is still under way, else with the "
        "code of its final phase (below).",
    )  # fmt: skip
    status.add_argument("name", help="the Migration")
    status.add_argument("-w", "--watch", action="store_true", help="follow it until it finishes")
    _output(status)
    arguments.add_arguments(status, temporal.TemporalAccess)
    status.set_defaults(run=cmd_status)

    plan = command(
        "plan", "what a Migration would do, and for how long writes would stop, without changing anything",
        "Create a copy of the Migration in FILE with spec.dryRun: true under a generated name, wait until ferry "
        "has checked it (the precheck: everything the steps need, and rates measured with a small sample), print "
        "status.plan (steps, sizes, the expected write downtime and total time) or the problems found, and delete "
        "the copy. Exit 0 when ferry planned it, 7 when the checks found problems.",
    )  # fmt: skip
    plan.add_argument("-f", "--filename", required=True, help="the Migration's manifest (YAML or JSON; - for stdin)")
    plan.add_argument("--timeout", type=float, default=600.0,
                      help="seconds to wait for the checks, and again for the copy to go (default: 600)")  # fmt: skip
    _output(plan)
    plan.set_defaults(run=cmd_plan)

    for name in controls.CONTROLS:
        control = command(
            name, f"{name} a Migration, as the user the API server says you are",
            f"Annotate the Migration with {controls.annotation_name(name)}=<you>[: <reason>], where <you> is the "
            "user the API server authenticated (a SelfSubjectReview, like `kubectl auth whoami`), then wait for "
            "ferry's watcher to answer in status.controls and print the answer: exit 0 when the saga took the "
            "control, 1 when it refused it, 3 when no answer came in time.",
        )  # fmt: skip
        control.add_argument("name", help="the Migration")
        control.add_argument("--reason", help="why, recorded with the control (at most 256 characters)")
        control.add_argument("--timeout", type=float, default=60.0,
                             help="seconds to wait for the watcher's answer (default: 60)")  # fmt: skip
        _output(control)
        control.set_defaults(run=cmd_control)

    runs = command(
        "history", "every step, undo and check the saga ran, with times (from Temporal)",
        "List, from the workflow's history in Temporal, every activity attempt (steps, undos, checks) with when "
        "it was scheduled, started and closed and how it ended, and the controls the run received. Needs "
        "--temporal-address (or FERRY_TEMPORAL_ADDRESS), and --codec-keys (or FERRY_CODEC_KEYS) where ferry "
        "encrypts its payloads.",
    )  # fmt: skip
    runs.add_argument("name", help="the Migration")
    runs.add_argument("--all", action="store_true", help="also list the status writes (mirror_status)")
    _output(runs)
    arguments.add_arguments(runs, temporal.TemporalAccess)
    runs.set_defaults(run=cmd_history)

    worker_logs = command(
        "logs", "the worker's log lines about a Migration (worker Pods)",
        "Print the lines of the ferry worker Pods' logs that name the Migration's workflow. Worker Pods are found "
        "by the labels of deploy/manager/worker.yaml.",
    )  # fmt: skip
    worker_logs.add_argument("name", help="the Migration")
    worker_logs.add_argument("--worker-namespace", help="where the worker Pods are (default: every namespace)")
    worker_logs.add_argument("--worker-selector", default=logs.WORKER_SELECTOR,
                             help=f"label selector of the worker Pods (default: {logs.WORKER_SELECTOR})")  # fmt: skip
    worker_logs.add_argument("--container", default=logs.WORKER_CONTAINER, help="the worker's container")
    worker_logs.add_argument("--tail", type=int, help="read only the last N lines of each Pod's log")
    worker_logs.set_defaults(run=cmd_logs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with connected(_target(args)) as cluster:
            return int(args.run(args, cluster))
    except PluginError as error:
        print(f"error: {error}", file=sys.stderr)
        return int(error.code)
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    """The `kubectl-ferry` command: `main`, then the end of the process without the interpreter's teardown.

    Its Temporal client's threads would otherwise be able to abort it there (see ferry/process.py).
    """
    exit_without_teardown(main())
