"""How the worker sandboxes ferry's workflow code: its own modules are imported once, not once per run.

Temporal's sandbox imports a workflow's module afresh for every run it starts (and for every
run it brings back into its cache), so that module-level state cannot leak from one run into
another. For ferry's migration workflow that cost 4 to 5 ms of CPU per run on an idle core,
0.35 ms passed through (scripts/bench_sandbox.py prints both), all of it in the process that
hosts the workflows, in front of each run's first status write: fifty Migrations started at
once queued behind it. ferry's workflow modules keep no state at module level that a run
could change, and no workflow file calls the clock, randomness or I/O directly
(tests/unit/test_workflow_modules.py checks both), so the isolation bought nothing for them:
the worker imports them once per process.

What passing them through gives up is the sandbox's runtime check on their own code: a clock
read in a passed-through module runs instead of failing the workflow task. That check never
reached most of ferry's workflow code: the workflow files import workflows.saga, steps, plan
and status passed through, so a clock read in the saga's loop ran under the SDK's default
sandbox too (tried on 2026-11-25). The unit test above checks every workflow file for such
calls instead, and the tests' workers and the replayer of recorded histories keep the SDK's
default sandbox, which still checks the workflow files themselves at runtime.
"""

from __future__ import annotations

from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

PASSED_THROUGH = ("workflows",)
"""ferry's workflow modules; the shared models they use (ferry.api) are passed through where they import them."""

WORKFLOW_RUNNER = SandboxedWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSED_THROUGH)
)
"""The runner of the worker that hosts ferry's workflows (worker/runner.py); tests use the SDK's default."""
