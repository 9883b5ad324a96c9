"""Chaos run on a stack of its own: Migrations under SIGKILLs, rollbacks and deletions; prints what it found.

    .venv/bin/python scripts/chaos.py --migrations 50 --rollbacks 20 --deletions 10 --kills 10

Starts the local stack in a temporary folder (or --state-dir), installs the CRD, runs
tests/chaos/harness.py and prints a table of figures; exits 1 if any check found a
problem (each is printed). A benchmark-style harness, not a timed test.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kubernetes import config

from devstack.stack.install import ensure_binaries
from devstack.stack.stack import Stack
from tests.chaos.harness import ChaosPlan, ChaosRun, cleanup, keep_only_logs, own_temporal
from tests.cluster import install_crd


def main() -> int:
    defaults = ChaosPlan()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--migrations", type=int, default=defaults.migrations)
    parser.add_argument("--rollbacks", type=int, default=defaults.rollbacks)
    parser.add_argument("--deletions", type=int, default=defaults.deletions)
    parser.add_argument("--kills", type=int, default=defaults.kills, help="kill at least this many processes")
    parser.add_argument("--rows", type=int, default=defaults.rows, help="rows in each source database")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--timeout", type=float, default=defaults.timeout, help="seconds for every Migration to end")
    parser.add_argument("--state-dir", type=Path, help="the stack's folder (default: a new temporary one)")
    args = parser.parse_args()
    plan = ChaosPlan(
        migrations=args.migrations, rollbacks=args.rollbacks, deletions=args.deletions, kills=args.kills,
        rows=args.rows, seed=args.seed, timeout=args.timeout,
    )  # fmt: skip
    if plan.rollbacks + plan.deletions > plan.migrations:
        parser.error("--rollbacks + --deletions must not exceed --migrations")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    binaries = ensure_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="ferry-chaos-"))
    workdir.chmod(0o755)
    state_dir = args.state_dir or workdir / "stack"
    try:
        with Stack(state_dir, components=frozenset({"kubernetes", "s3", "postgres"}), binaries=binaries) as info:
            install_crd([str(binaries.kubectl), f"--kubeconfig={info.kubeconfig}"])
            api = config.new_client_from_config(config_file=str(info.kubeconfig))
            with own_temporal(workdir / "temporal", binaries) as temporal:
                run = ChaosRun(info, temporal, api, plan, workdir)
                try:
                    report = run.run()
                finally:
                    cleanup(run)
    finally:
        keep_only_logs(workdir)  # the stack's data is most of a gigabyte; its logs are kept
    print(f"\nchaos run, {dataclasses.asdict(plan)}\n")
    print(report.table())
    print(f"\nlogs of ferry's processes: {workdir}")
    for problem in report.problems:
        print(f"PROBLEM: {problem}")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
