"""Starts the one workflow of a Migration, however often it is asked to.

The workflow ID is derived from the Migration's namespace, name and UID. Starting uses
ID conflict policy FAIL and ID reuse policy REJECT_DUPLICATE: whether a run with that ID
is running or closed, no second one starts, and Temporal says so, which tells the
watcher whether this call created the run. A duplicate event, a relist, a restarted or
a second watcher cannot make a second run. A Migration deleted and created again has a
new UID, hence a new workflow.
"""

from __future__ import annotations

import logging

from temporalio.client import Client
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError

from ferry.api import search_attributes
from ferry.api.migration import MigrationSpec, Phase
from ferry.api.saga import MigrationInput, MigrationRef, workflow_id
from workflows.migration import MigrationWorkflow

log = logging.getLogger("ferry.watcher.starting")


async def ensure_started(
    client: Client, ref: MigrationRef, generation: int, spec: MigrationSpec, task_queue: str
) -> bool:
    """Makes sure the Migration's workflow exists; True when this call started it, False when it existed."""
    source, target = spec.source.stateful_set, spec.target.stateful_set
    try:
        await client.start_workflow(
            MigrationWorkflow.run,
            MigrationInput(ref=ref, generation=generation, spec=spec),
            id=workflow_id(ref),
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(search_attributes.MIGRATION_NAMESPACE, ref.namespace),
                    SearchAttributePair(search_attributes.MIGRATION_NAME, ref.name),
                    SearchAttributePair(search_attributes.PHASE, Phase.PENDING.value),
                ]
            ),
            static_summary=f"Migration {ref}: {source} → {target} ({spec.target.image})",
            static_details=(
                f"Moves StatefulSet {ref.namespace}/{source} to {target} ({spec.target.image}, "
                f"{spec.target.storage_size} on {spec.target.storage_class_name or 'the default StorageClass'}), "
                f"then moves the traffic of Service {spec.source.service}. kubectl describe migration -n "
                f"{ref.namespace} {ref.name} shows its status."
            ),
        )
    except WorkflowAlreadyStartedError:
        log.debug("workflow %s of Migration %s exists already", workflow_id(ref), ref)
        return False
    log.debug("workflow %s of Migration %s started", workflow_id(ref), ref)
    return True
