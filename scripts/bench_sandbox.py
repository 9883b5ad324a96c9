"""What it costs the worker to bring a run of each of ferry's workflows into its sandbox.

    .venv/bin/python scripts/bench_sandbox.py [--runs 200]

Temporal's sandbox builds a fresh instance for every run a worker starts (or brings back into
its cache), and with the default restrictions imports the workflow's module anew each time.
This prints, for each workflow class, the CPU milliseconds per instance with the SDK's default
restrictions and with ferry's (worker/sandbox.py, its workflow package passed through), as
the mean over --runs instances built one after another in this process. No server is needed:
it builds the instances the way the SDK validates a workflow when a worker starts.
A benchmark, not a test: it asserts nothing about times.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio import workflow
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from worker.sandbox import WORKFLOW_RUNNER
from workflows.cleanup import RetentionCleanupWorkflow
from workflows.legacy import MigrationWorkflowV1
from workflows.migration import MigrationWorkflow
from workflows.undo import MigrationUndoWorkflow

CLASSES = (MigrationWorkflow, MigrationUndoWorkflow, RetentionCleanupWorkflow, MigrationWorkflowV1)


def cpu_ms_per_instance(runner: SandboxedWorkflowRunner, cls: type, runs: int) -> float:
    definition = workflow._Definition.must_from_class(cls)
    runner.prepare_workflow(definition)  # the first one imports what later ones find cached
    started = time.process_time()
    for _ in range(runs):
        runner.prepare_workflow(definition)
    return (time.process_time() - started) / runs * 1000


async def main(runs: int) -> None:
    # The SDK's instances attach to the running event loop, as they do in a worker.
    runners = {"SDK default": SandboxedWorkflowRunner(), "ferry's (worker/sandbox.py)": WORKFLOW_RUNNER}
    print(f"CPU per sandbox instance, mean of {runs}")
    print(f"{'workflow':<28}" + "".join(f"{label:>30}" for label in runners))
    for cls in CLASSES:
        figures = [cpu_ms_per_instance(runner, cls, runs) for runner in runners.values()]
        print(f"{cls.__name__:<28}" + "".join(f"{figure:>27.2f} ms" for figure in figures))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="instances built per workflow and runner")
    asyncio.run(main(parser.parse_args().runs))
