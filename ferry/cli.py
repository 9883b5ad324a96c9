"""The `ferry` command: the entry point that configures logging and dispatches subcommands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import FrameType

from ferry.configuration import arguments
from ferry.configuration.loading import SettingsError
from ferry.observability import logs
from ferry.stack import install
from ferry.stack.errors import StackError
from ferry.stack.stack import START_TIMEOUT, Stack, describe
from ferry.startup import StartupError

log = logging.getLogger("ferry")


def _default_state_dir() -> Path:
    return Path(os.environ.get("FERRY_STATE_DIR", ".ferry/stack"))


def _cmd_setup(args: argparse.Namespace) -> int:
    started = time.monotonic()
    binaries = install.ensure_binaries()
    for field, value in vars(binaries).items():
        print(f"{field:25} {value}")
    if args.browser:
        print(f"{'chromium':25} {install.ensure_chromium()}")
    print(f"setup finished in {time.monotonic() - started:.1f}s")
    return 0


def _terminate_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _cmd_up(args: argparse.Namespace) -> int:
    from ferry.demo import run as demo

    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    stack = Stack(Path(args.state_dir), timeout=args.timeout)
    # The terminal shows progress; the components' logs go to a file beside the stack's.
    stack.logs_dir.mkdir(parents=True, exist_ok=True)
    logfile = logging.FileHandler(stack.logs_dir / "ferry.log")
    logfile.setFormatter(logs.TextFormatter())
    logging.getLogger().handlers[:] = [logfile]
    code = 0
    try:
        info = stack.start()
        print(describe(info), flush=True)
        print(f"ferry's own log:   {stack.logs_dir / 'ferry.log'}", flush=True)
        print("\nThe stack is up.", flush=True)
        code = demo.main_entry(
            info, install.ensure_binaries(), with_sample=not args.no_sample, keep_running=args.keep_running,
            orders=args.orders,
        )  # fmt: skip
    except KeyboardInterrupt:
        print("\ninterrupted", flush=True)
    except StackError as error:
        # ferry's log goes to a file here: the reason belongs on the terminal.
        print(f"\nferry up: {error}", flush=True)
        code = 1
    finally:
        print("stopping the stack...", flush=True)
        stack.stop()
    print("stopped; no process of the stack is left.", flush=True)
    return code


def _cmd_crd(args: argparse.Namespace) -> int:
    from ferry.api import crd

    text = crd.manifest_yaml()
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferry",
        description="Durable, reversible migrations of stateful services on Kubernetes, run as Temporal sagas.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    commands = parser.add_subparsers(dest="command", required=True)

    setup = commands.add_parser(
        "setup",
        help="find or build every component of the local stack (cached by version)",
        description="Finds or builds kube-apiserver, controller-manager, scheduler, kubectl, etcd, kwok "
        "and versitygw (cache: $FERRY_CACHE_DIR or ~/.cache/ferry), and installs PostgreSQL "
        "from Debian's packages when it is missing.",
    )
    setup.add_argument(
        "--browser", action="store_true", help="also install headless Chromium for the Web UI tests (Debian's package)"
    )
    setup.set_defaults(run=_cmd_setup)

    up = commands.add_parser(
        "up",
        help="the main job: local stack, worker, watcher, and a sample Migration followed live",
        description="Starts etcd, kube-apiserver, controller-manager, scheduler, kwok, the Temporal dev "
        "server with its Web UI, an S3 server and two PostgreSQL instances (source, target) on "
        "loopback; installs the Migration CRD; runs ferry's worker and watcher; seeds a sample "
        "'orders' database behind StatefulSet shop/orders-db and applies the Migration "
        "shop/orders-db-to-16, showing its progress until it finishes. Ctrl-C stops everything.",
    )
    up.add_argument(
        "--state-dir",
        default=str(_default_state_dir()),
        help="folder for the stack's data, logs and kubeconfig; reused across runs "
        "(default: $FERRY_STATE_DIR or .ferry/stack)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=START_TIMEOUT,
        help="seconds each component may take to come up; a component that exits fails at once "
        "(default: %(default)s, for a first start on a cold machine)",
    )
    up.add_argument("--no-sample", action="store_true", help="skip the sample Migration; keep everything running")
    up.add_argument(
        "--keep-running", action="store_true", help="after the sample, keep everything running until Ctrl-C"
    )
    up.add_argument(
        "--orders", type=int, default=200_000, help="rows in the sample's orders table (default: %(default)s)"
    )
    up.set_defaults(run=_cmd_up)
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
        "turns kubectl controls (annotations) into signals, and holds deletion until the undo is done. "
        "Replicas elect one active watcher through a Lease. Every flag can also be set by the FERRY_ "
        "variable in brackets (an empty one counts as unset); a flag wins over its variable. Until Temporal "
        "answers, the watcher keeps trying and reports not ready on /readyz.",
    )
    arguments.add_arguments(watcher, WatcherSettings)
    watcher.set_defaults(run=_cmd_watcher)

    crd = commands.add_parser(
        "crd",
        help="print the Migration CustomResourceDefinition generated from ferry's API models",
        description="Generates the CRD manifest (schema, CEL rules, printer columns) from ferry/api/migration.py.",
    )
    crd.add_argument("-o", "--output", default="-", help="file to write (default: standard output)")
    crd.set_defaults(run=_cmd_crd)
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
    except (StackError, StartupError) as error:
        log.error("%s", error)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the component took over the signal
        return 130


if __name__ == "__main__":
    sys.exit(main())
