"""`python -m devstack`: the local stack's commands, `setup` and `up` (what the README's two commands run).

A development tool beside the product: the `ferry` command (ferry/cli.py) runs the worker
and the watcher anywhere; this one builds and starts the real components on this machine
and runs a sample migration on them.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from devstack.stack import install
from devstack.stack.errors import StackError
from devstack.stack.stack import START_TIMEOUT, Stack, describe
from ferry.observability import logs
from ferry.process import take_stop_signals

log = logging.getLogger("devstack")


def _default_state_dir() -> Path:
    return Path(os.environ.get("FERRY_STATE_DIR", ".ferry/stack"))


def _cmd_setup(args: argparse.Namespace) -> int:
    started = time.monotonic()
    binaries = install.ensure_binaries()
    for field, value in vars(binaries).items():
        print(f"{field:25} {value}")
    if args.browser:
        print(f"{'chromium':25} {install.ensure_chromium()}")
    if args.helm:
        print(f"{'helm':25} {install.ensure_tool('helm')}")
    print(f"setup finished in {time.monotonic() - started:.1f}s")
    return 0


STOP_ASKED = threading.Event()
"""Set by Ctrl-C or SIGTERM. The KeyboardInterrupt they raise can be lost (CPython ignores one raised while it runs
its fork handlers, as subprocess does), so the run also looks at this before it goes on."""


def _ask_to_stop(signum: int, frame: FrameType | None) -> None:
    STOP_ASKED.set()
    raise KeyboardInterrupt


def _cmd_up(args: argparse.Namespace) -> int:
    from devstack.demo import run as demo

    # A Ctrl-C or SIGTERM stops `make up` at any moment, even one started with SIGINT ignored.
    take_stop_signals(_ask_to_stop, (signal.SIGINT, signal.SIGTERM))
    # `kill -USR1` shows where every thread is: what a stop that does not end waits for.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    stack = Stack(Path(args.state_dir), timeout=args.timeout)
    # The terminal shows progress; the components' logs go to a file beside the stack's.
    stack.logs_dir.mkdir(parents=True, exist_ok=True)
    ferry_log = stack.logs_dir / demo.FERRY_LOG
    logfile = logging.FileHandler(ferry_log)
    logfile.setFormatter(logs.TextFormatter())
    logging.getLogger().handlers[:] = [logfile]
    code = 0

    def stop_from_outside() -> None:
        # The run is stuck (its threads' stacks are on the terminal): the stack is stopped anyway.
        print(f"ferry up: the run did not stop; stopping the stack anyway (ferry's log: {ferry_log})", flush=True)
        stack.stop()
        print("stopped; no process of the stack is left.", flush=True)

    try:
        info = stack.start()
        if STOP_ASKED.is_set():  # asked while the stack started, and its KeyboardInterrupt was lost
            raise KeyboardInterrupt
        print(describe(info), flush=True)
        print(f"ferry's own log:   {ferry_log}", flush=True)
        print("\nThe stack is up.", flush=True)
        code = demo.main_entry(
            info, install.ensure_binaries(), with_sample=not args.no_sample, keep_running=args.keep_running,
            orders=args.orders, check_stack=stack.check_running, when_stuck=stop_from_outside,
            stop_asked_before=STOP_ASKED.is_set,
        )  # fmt: skip
    except KeyboardInterrupt:
        print("\ninterrupted", flush=True)
    except StackError as error:
        # ferry's log goes to a file here: what failed, why and where to read more belong on the terminal.
        log.error("%s", error)
        print(f"\nferry up: {error}", flush=True)
        code = 1
    except Exception as error:
        log.exception("ferry up failed")
        cause = " ".join(str(error).split())[:200]
        print(f"\nferry up failed: {type(error).__name__}: {cause}\n  full log (with the traceback): {ferry_log}")
        code = 1
    finally:
        print("stopping the stack...", flush=True)
        stack.stop()
    print("stopped; no process of the stack is left.", flush=True)
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devstack",
        description="ferry's local stack of real components, for development and the tests: not part of ferry.",
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
    setup.add_argument(
        "--helm", action="store_true", help="also build helm for the chart tests (Go module proxy, cached by version)"
    )
    setup.set_defaults(run=_cmd_setup)

    up = commands.add_parser(
        "up",
        help="the main job: local stack, worker, watcher, and a sample Migration followed live",
        description="Starts etcd, kube-apiserver, controller-manager, scheduler, kwok, the Temporal dev "
        "server with its Web UI, an S3 server and two PostgreSQL instances (source, target) on "
        "loopback; installs the Migration CRD; runs ferry's worker and watcher; seeds a sample "
        "'orders' database behind StatefulSet shop/orders-db and applies the Migration "
        "shop/orders-db-to-18, showing its progress until it finishes; then stops everything (exit code 0 when "
        "the sample Succeeded), unless --keep-running or --no-sample keeps it up until Ctrl-C. A component that "
        "fails is named on the terminal with its cause and its log.",
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.run(args))
    except StackError as error:
        log.error("%s", error)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
