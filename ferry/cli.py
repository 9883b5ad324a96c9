"""The `ferry` command of the product: `worker`, `watcher`, `codec-server`, `crd`, `rbac`; it sets up logs, dispatches.

The local stack and the `make up` demo are development tools with a command of their
own (`python -m devstack`), which the product does not ship.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from ferry.configuration import arguments
from ferry.configuration.loading import SettingsError
from ferry.observability import logs
from ferry.process import exit_without_teardown, take_stop_signals
from ferry.startup import StartupError

log = logging.getLogger("ferry")


def _cmd_crd(args: argparse.Namespace) -> int:
    from ferry.api import crd

    text = crd.manifest_yaml()
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
    return 0


def _cmd_rbac(args: argparse.Namespace) -> int:
    from ferry import rbac

    namespaces = [name.strip() for name in args.secret_namespaces.split(",") if name.strip()]
    access = rbac.SecretAccess(args.secret_access)
    if namespaces and access is rbac.SecretAccess.CLUSTER:
        print("ferry rbac: --secret-access cluster grants every namespace: drop --secret-namespaces", file=sys.stderr)
        return 2
    if wrong := rbac.not_namespaces([*namespaces, args.namespace]):
        print(f"ferry rbac: not a namespace name: {', '.join(wrong)}", file=sys.stderr)
        return 2
    text = rbac.manifest_yaml(namespaces, access, args.namespace)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
    return 0


def _run_until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Runs an async component until SIGINT or SIGTERM, then lets it shut down cleanly."""

    async def supervise() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await main(stop)

    take_stop_signals()  # until the loop's own handlers: a Ctrl-C then raises KeyboardInterrupt (exit code 130)
    asyncio.run(supervise())
    return 0


def _configure_logs(args: argparse.Namespace, log_format: str) -> None:
    logs.configure(level=logging.DEBUG if args.verbose else logging.INFO, json_lines=log_format == "json")


def _cmd_worker(args: argparse.Namespace) -> int:
    from worker import runner
    from worker.settings import WorkerSettings

    settings = arguments.from_arguments(WorkerSettings, args, os.environ)
    _configure_logs(args, settings.observability.log_format)
    return _run_until_signalled(lambda stop: runner.run(settings, stop=stop))


def _cmd_watcher(args: argparse.Namespace) -> int:
    from watcher import runner
    from watcher.leadership import LeadershipLost
    from watcher.settings import WatcherSettings

    settings = arguments.from_arguments(WatcherSettings, args, os.environ)
    _configure_logs(args, settings.observability.log_format)
    try:
        return _run_until_signalled(lambda stop: runner.run(settings, stop=stop))
    except LeadershipLost as lost:
        log.error("%s; exiting so that a fresh start can stand by again", lost)
        return 2


def _cmd_codec_server(args: argparse.Namespace) -> int:
    from ferry.codec import server
    from ferry.codec.settings import CodecServerSettings

    settings = arguments.from_arguments(CodecServerSettings, args, os.environ)
    _configure_logs(args, settings.log_format)
    return _run_until_signalled(lambda stop: server.serve(settings, stop))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferry",
        description="Durable, reversible migrations of stateful services on Kubernetes, run as Temporal sagas.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    commands = parser.add_subparsers(dest="command", required=True)

    from ferry.codec.settings import CodecServerSettings
    from watcher.settings import WatcherSettings
    from worker.settings import WorkerSettings

    worker = commands.add_parser(
        "worker",
        help="run ferry's Temporal worker (the saga and its activities) against a cluster",
        description="Polls the task queue for migration workflows and runs their activities against the "
        "Kubernetes cluster of --kubeconfig, the databases and the S3 buckets the Migrations name. "
        "Run as many as you like. Every flag can also be set by the FERRY_ variable in brackets (an empty one "
        "counts as unset); a flag wins over its variable. Until Temporal answers, the worker keeps trying "
        "and reports not ready on /readyz.",
    )
    arguments.add_arguments(worker, WorkerSettings)
    worker.set_defaults(run=_cmd_worker)

    watcher = commands.add_parser(
        "watcher",
        help="run ferry's watcher: each Migration becomes exactly one workflow",
        description="Lists and watches Migrations, holds their finalizer, starts one workflow per Migration, "
        "turns kubectl controls (annotations) into updates of the saga, and holds deletion until the undo is done. "
        "Replicas elect one active watcher through a Lease. Every flag can also be set by the FERRY_ "
        "variable in brackets (an empty one counts as unset); a flag wins over its variable. Until Temporal "
        "answers, the watcher keeps trying and reports not ready on /readyz.",
    )
    arguments.add_arguments(watcher, WatcherSettings)
    watcher.set_defaults(run=_cmd_watcher)

    codec_server = commands.add_parser(
        "codec-server",
        help="serve the payload codec over HTTP, so the Temporal Web UI and CLI show ferry's encrypted payloads",
        description="Decrypts (POST /decode) and encrypts (POST /encode) payloads for the Temporal Web UI (point its "
        "codec endpoint here and list its origin in --codec-server-cors-origins) and the temporal CLI "
        "(--codec-endpoint http://ADDRESS, with --codec-auth 'Bearer TOKEN' when a token is set), with the codec "
        "keys of the worker and the watcher. Whoever reaches it can read every payload: keep it where only its "
        "users reach it, behind TLS and a token. Every flag can also be set by the FERRY_ variable in brackets "
        "(an empty one counts as unset); a flag wins over its variable.",
    )
    arguments.add_arguments(codec_server, CodecServerSettings)
    codec_server.set_defaults(run=_cmd_codec_server)

    crd = commands.add_parser(
        "crd",
        help="print the Migration CustomResourceDefinition generated from ferry's API models",
        description="Generates the CRD manifest (schema, CEL rules, printer columns) from ferry/api/migration.py.",
    )
    crd.add_argument("-o", "--output", default="-", help="file to write (default: standard output)")
    crd.set_defaults(run=_cmd_crd)

    from ferry import rbac

    grant = commands.add_parser(
        "rbac",
        help="print the worker's read access to Secrets: a Role and RoleBinding in each namespace listed",
        description="Generates deploy/rbac/worker_secrets.yaml: where ferry's worker may read the Secrets that "
        "Migrations name (get, by name). By default only in the namespaces listed; --secret-access cluster grants "
        "every namespace instead. The Helm chart renders the same from worker.secretNamespaces and "
        "worker.secretAccess.",
    )
    grant.add_argument(
        "--secret-namespaces",
        default="",
        metavar="NAMESPACE,...",
        help="comma-separated namespaces whose Migrations the worker runs (default: none)",
    )
    grant.add_argument(
        "--secret-access",
        choices=[access.value for access in rbac.SecretAccess],
        default=rbac.SecretAccess.NAMESPACES.value,
        help="namespaces: only those listed (default); cluster: every namespace, present and future",
    )
    grant.add_argument(
        "--namespace",
        default=rbac.SYSTEM_NAMESPACE,
        help=f"the namespace of the worker's ServiceAccount (default: {rbac.SYSTEM_NAMESPACE})",
    )
    grant.add_argument("-o", "--output", default="-", help="file to write (default: standard output)")
    grant.set_defaults(run=_cmd_rbac)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.run(args))
    except SettingsError as error:
        # Before logging is configured (the log format is a setting too): a plain line, as argparse's own.
        print(f"ferry {args.command}: {error}", file=sys.stderr)
        return 2
    except StartupError as error:
        log.error("%s", error)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the component took over the signal
        return 130


def entry() -> None:
    """The `ferry` command: `main`, then the end of the process without the interpreter's teardown.

    See ferry/process.py for why.
    """
    exit_without_teardown(main())


if __name__ == "__main__":
    entry()
