"""Rotating the codec key: a run written with the old key goes on, and is read, under the new one.

The keys are a folder laid out as a mounted Secret. A run is started while `k1` is
current; then `k2` is added and made current, `k1` kept, as the README's rotation says.
ferry's real worker, started only after the rotation, must still read the run's input and
write what follows with `k2`; a reader that dropped `k1` too early is told which key it lacks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import os
import uuid
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowFailureError

from devstack.stack.stack import StackInfo
from ferry.api.integrity import NOT_BACKED
from ferry.api.migration import MigrationSpec
from ferry.api.saga import WORKFLOW_NAME, MigrationInput, MigrationRef, workflow_id
from ferry.clients import TemporalSettings, connect_temporal
from ferry.codec.encryption import ENCODING, KEY_ID
from ferry.codec.errors import UnknownKey
from ferry.codec.events import messages
from tests import samples
from tests.end_to_end import worker_settings
from worker import runner

pytestmark = pytest.mark.usefixtures("migration_crd")


def _add_key(folder: Path, key_id: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / key_id).write_text(base64.b64encode(os.urandom(32)).decode())
    (folder / "current").write_text(key_id)


def _key_ids(payloads: list[Payload]) -> list[str]:
    return [p.metadata[KEY_ID].decode() for p in payloads if p.metadata.get("encoding") == ENCODING]


def _causes(error: BaseException | None) -> str:
    said = []
    while error is not None:
        said.append(f"{error} ({getattr(error, 'type', '')})")
        error = error.__cause__
    return " <- ".join(said)


async def test_a_run_started_before_a_rotation_runs_and_reads_after_it_while_the_old_key_is_kept(
    stack: StackInfo, task_queue: str, temporal_client: Client, tmp_path: Path
) -> None:
    keys = tmp_path / "codec-keys"
    _add_key(keys, "k1")
    assert stack.temporal_address is not None
    settings = TemporalSettings(address=stack.temporal_address, codec_keys=keys)
    # A run for a Migration that does not exist: ferry's worker reads its input, and its gate refuses it.
    ref = MigrationRef(namespace="shop", name=f"rotation-{uuid.uuid4().hex[:6]}", uid=str(uuid.uuid4()))
    spec = MigrationSpec.model_validate(samples.migration()["spec"])
    before = await connect_temporal(settings)
    await before.start_workflow(
        WORKFLOW_NAME, MigrationInput(ref=ref, generation=1, spec=spec), id=workflow_id(ref), task_queue=task_queue
    )

    _add_key(keys, "k2")
    after = await connect_temporal(settings)
    worker = dataclasses.replace(worker_settings(stack, task_queue), temporal=settings)
    stop = asyncio.Event()
    running = asyncio.create_task(runner.run(worker, stop=stop))
    try:
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(after.get_workflow_handle(workflow_id(ref)).result(), timeout=180)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(running, timeout=60)

    assert NOT_BACKED in _causes(failed.value), _causes(failed.value)
    stored = await temporal_client.get_workflow_handle(workflow_id(ref)).fetch_history()
    started, *later = stored.events
    start_input = list(started.workflow_execution_started_event_attributes.input.payloads)
    written_after = [item for event in later for item in messages(event) if isinstance(item, Payload)]
    assert _key_ids(start_input) == ["k1"]
    assert (await after.data_converter.decode(start_input, [MigrationInput]))[0].ref == ref
    assert len(_key_ids(written_after)) >= 3, "the activity's input, its failure and the run's are written after it"
    assert set(_key_ids(written_after)) == {"k2"}

    # Dropping k1 while a history written with it is kept: that history can no longer be read, and the error says why.
    (keys / "k1").unlink()
    too_early = await connect_temporal(settings)
    with pytest.raises(UnknownKey) as unknown:
        await too_early.data_converter.decode(start_input)
    assert "codec key 'k1', which is not among the keys" in str(unknown.value)
