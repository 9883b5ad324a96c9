"""While snapshot, migrate and verify run, the Migration's status.progress says how far they are; when they end, it is
gone, and the saga's own status fields are as the saga left them.

Seen through a Kubernetes watch on the Migration, as `kubectl get mig -w` sees it. The
activities run on the real source, target, S3 and API server; where a step would be too
quick to show two values, the test holds it at a known point (a heartbeat, a lock on a
table) until the watch has seen what it wrote.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities.progress_status import FIELD_MANAGER, ProgressWriter
from activities.settings import MIB, DataActivitySettings, KubeActivitySettings
from activities.status import StatusActivities
from devstack.stack.postgres import PostgresEndpoint
from ferry.api.migration import MigrationStatus, Phase, StepState, StepStatus
from ferry.api.saga import MigrationRef, MirrorStatusInput
from tests import samples
from tests.cluster import eventually
from tests.conftest import Kubectl
from tests.end_to_end import Databases
from tests.postgres.conftest import Steps
from tests.postgres.data import connect, create_bulky, create_shop

GROUP, VERSION, PLURAL = "ferry.dev", "v1alpha1", "migrations"
STARTED = datetime(2026, 1, 5, 9, 30, tzinfo=UTC)


class MigrationWatch:
    """Every version of one Migration's status, in order, from a Kubernetes watch run in a thread."""

    def __init__(self, kube_api: k8s.ApiClient, ref: MigrationRef) -> None:
        self.statuses: list[dict[str, Any]] = []
        self._ref = ref
        self._custom = k8s.CustomObjectsApi(kube_api)
        self._changed = threading.Condition()
        self._closed = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name="test-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        response = self._custom.list_namespaced_custom_object(
            GROUP, VERSION, self._ref.namespace, PLURAL, field_selector=f"metadata.name={self._ref.name}",
            watch=True, timeout_seconds=300, _preload_content=False,
        )  # fmt: skip
        self._response = response
        pending = b""
        with contextlib.suppress(Exception):  # closed by `close`
            for chunk in response.stream(65536, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in filter(None, lines):
                    status = json.loads(line)["object"].get("status") or {}
                    with self._changed:
                        self.statuses.append(status)
                        self._changed.notify_all()

    def wait_for(self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
        """The first status seen that passes `check`, waiting for it as long as `timeout`."""
        with self._changed:
            found = self._changed.wait_for(lambda: next((s for s in self.statuses if check(s)), None), timeout)
        if found is None:
            raise AssertionError(f"the watch never saw {what}; it saw {self.statuses}")
        return found

    def progress(self, step: str) -> list[dict[str, Any]]:
        with self._changed:
            return [s["progress"] for s in self.statuses if s.get("progress", {}).get("step") == step]

    def close(self) -> None:
        self._closed.set()
        if self._response is not None:
            with contextlib.suppress(Exception):
                self._response.shutdown()
        self._thread.join(timeout=5)


@pytest.fixture
def ref(kubectl: Kubectl, migration_crd: str, namespace: str) -> MigrationRef:
    """The Migration the steps are about, as kubectl created it (the steps' fixtures take their ref from here)."""
    kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(samples.migration("orders-db-to-16")))
    uid = kubectl("get", "migration", "orders-db-to-16", "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout
    return MigrationRef(namespace=namespace, name="orders-db-to-16", uid=uid)


@pytest.fixture
def data_settings(data_settings: DataActivitySettings) -> DataActivitySettings:
    """Progress written every 0.1 s rather than 5 s, so that the small databases of tests show several values."""
    return dataclasses.replace(data_settings, progress_interval=0.1)


@pytest.fixture
def watch(kube_api: k8s.ApiClient, ref: MigrationRef) -> Iterator[MigrationWatch]:
    watching = MigrationWatch(kube_api, ref)
    yield watching
    watching.close()


def _saga_is_running(kube_api: k8s.ApiClient, ref: MigrationRef, step: str) -> MigrationStatus:
    """What the saga writes before it runs a step: phase Running, the step Running, its first attempt."""
    status = MigrationStatus(
        phase=Phase.RUNNING,
        current_step=step,
        message=f"{step}: running (attempt 1)",
        steps=[StepStatus(name=step, state=StepState.RUNNING, attempts=1, started_at=STARTED)],
    )
    saga = StatusActivities(kube_api, KubeActivitySettings(reporting_instance="test-worker"))
    assert ActivityEnvironment().run(saga.mirror_status, MirrorStatusInput(ref=ref, status=status)).found
    return status


def _held_at(
    watch: MigrationWatch, detail: str, marks: list[int], until: Callable[[dict[str, Any]], bool] = lambda _: True
) -> ActivityEnvironment:
    """An activity environment whose heartbeats hold the step, once it has passed each mark of bytes (the heartbeat's
    `detail`), until the watch has seen status.progress at that mark (and `until` holds of it): so the watch sees as
    many values as marks."""
    env = ActivityEnvironment()
    left = list(marks)

    def hold(*details: Any) -> None:
        if threading.current_thread().name == "heartbeats":
            return  # the watchdog repeats what the step said; hold the step itself
        done = details[0].get(detail, 0) if details else 0
        while left and done >= left[0]:
            mark = left.pop(0)
            watch.wait_for(
                f"bytesDone >= {mark}",
                lambda s, at=mark: s.get("progress", {}).get("bytesDone", 0) >= at and until(s["progress"]),
            )

    env.on_heartbeat = hold
    return env


def _stored(kubectl: Kubectl, ref: MigrationRef) -> dict[str, Any]:
    stored: dict[str, Any] = json.loads(
        kubectl("get", "migration", ref.name, "-n", ref.namespace, "-o", "json", "--show-managed-fields").stdout
    )
    return stored


def _status_managers(stored: dict[str, Any]) -> set[str]:
    return {entry["manager"] for entry in stored["metadata"]["managedFields"] if entry.get("subresource") == "status"}


def _increasing(values: list[int]) -> bool:
    return len(set(values)) >= 2 and values == sorted(values)


def test_snapshot_and_migrate_show_their_bytes_in_the_status_while_they_run_and_nothing_once_done(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, kubectl: Kubectl, watch: MigrationWatch
) -> None:
    create_bulky(databases.source, rows=300_000)  # about 20 MB that do not compress: 4 parts of 5 MiB
    _saga_is_running(kube_api, steps.ref, "snapshot")

    artifact = dataclasses.replace(steps, env=_held_at(watch, "dumped_bytes", [5 * MIB, 10 * MIB])).snapshot()

    dumped = watch.progress("snapshot")
    assert _increasing([p["bytesDone"] for p in dumped])
    assert all(p["attempt"] == 1 and "bytesTotal" not in p and "secondsLeft" not in p for p in dumped)
    assert dumped[-1]["summary"].startswith("snapshot: ")
    stored = _stored(kubectl, steps.ref)
    assert "progress" not in stored["status"], "gone once the snapshot ended"
    assert FIELD_MANAGER not in _status_managers(stored)

    _saga_is_running(kube_api, steps.ref, "migrate")
    # Held at 10 MiB until the throughput is known, which takes a second of the attempt.
    rated = _held_at(
        watch, "read_bytes", [5 * MIB, 10 * MIB], until=lambda p: p["bytesDone"] < 10 * MIB or "secondsLeft" in p
    )
    dataclasses.replace(steps, env=rated).migrate(artifact)

    restored = watch.progress("migrate")
    assert _increasing([p["bytesDone"] for p in restored])
    assert {p["bytesTotal"] for p in restored} == {artifact.size_bytes}
    assert any("secondsLeft" in p and "bytesPerSecond" in p for p in restored), "a throughput and a time left"
    assert " of " in restored[-1]["summary"]
    stored = _stored(kubectl, steps.ref)
    assert "progress" not in stored["status"]
    saga = _saga_is_running(kube_api, steps.ref, "migrate")  # the same again: changes nothing
    assert MigrationStatus.model_validate(stored["status"]) == saga, "the saga's fields are as the saga wrote them"
    assert "ferry-saga" in _status_managers(stored)
    row = kubectl("get", "migration", steps.ref.name, "-n", steps.ref.namespace, "-o", "wide").stdout
    assert "PROGRESS" in row.splitlines()[0]


def _three_tables(endpoint: PostgresEndpoint, rows: int) -> None:
    """Tables first, second and third, without defaults or indexes: reading their schema takes no lock on them
    (printing a default or an index would), so a lock on one holds verify only where it reads its rows."""
    with connect(endpoint) as conn:
        for table in ("first", "second", "third"):
            conn.execute(f"create table {table} (id int not null, note text not null)")
            conn.execute(f"insert into {table} select i, md5(i::text) from generate_series(1, %s) as i", (rows,))
        conn.execute("analyze")


def test_verify_shows_the_rows_it_has_compared_on_both_sides_of_the_sources_estimate(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, kubectl: Kubectl, watch: MigrationWatch
) -> None:
    rows = 20_000
    _three_tables(databases.source, rows)  # analyzed: the statistics have an estimate
    steps.migrate(steps.snapshot())
    _saga_is_running(kube_api, steps.ref, "verify")
    with (
        connect(databases.source) as first_lock,
        connect(databases.source) as second_lock,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        # The source's side reads first, second, third: hold it before each of the first two, while the target's
        # side, with no lock, reads all three.
        for conn, table in ((first_lock, "first"), (second_lock, "second")):
            conn.execute("begin")
            conn.execute(f"lock table {table} in access exclusive mode")
        verified = pool.submit(steps.verify)
        try:
            watch.wait_for("the target's rows", lambda s: s.get("progress", {}).get("rowsDone") == 3 * rows)
            first_lock.execute("rollback")
            watch.wait_for("the source's first", lambda s: s.get("progress", {}).get("rowsDone") == 4 * rows)
        finally:
            for conn in (first_lock, second_lock):
                conn.execute("rollback")
        verified.result(timeout=120)

    compared = watch.progress("verify")
    assert _increasing([p["rowsDone"] for p in compared])
    [estimate] = {p["rowsTotal"] for p in compared}
    assert estimate == pytest.approx(6 * rows, rel=0.1), "both sides, as the source's statistics estimate them"
    assert compared[-1]["summary"].startswith("verify: ")
    assert " rows" in compared[-1]["summary"]
    assert "progress" not in _stored(kubectl, steps.ref)["status"]


def test_a_cancelled_snapshot_takes_its_progress_away_too(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, kubectl: Kubectl, watch: MigrationWatch
) -> None:
    create_bulky(databases.source, rows=300_000)
    _saga_is_running(kube_api, steps.ref, "snapshot")
    env = ActivityEnvironment()

    def cancel_once_shown(*details: Any) -> None:
        if details and details[0].get("dumped_bytes", 0) >= 5 * MIB:
            watch.wait_for("some progress", lambda s: "progress" in s)
            env.cancel()

    env.on_heartbeat = cancel_once_shown

    with pytest.raises(CancelledError):
        dataclasses.replace(steps, env=env).snapshot()

    assert watch.progress("snapshot")
    assert "progress" not in _stored(kubectl, steps.ref)["status"]


def test_a_migration_created_again_under_the_same_name_gets_no_progress_of_the_first(
    steps: Steps, databases: Databases, kube_api: k8s.ApiClient, kubectl: Kubectl, watch: MigrationWatch
) -> None:
    """The steps run for the first Migration, deleted and created again (another uid) before they write."""
    create_shop(databases.source, customers=200, orders=2_000)
    first = steps.ref
    kubectl("delete", "migration", first.name, "-n", first.namespace)
    kubectl("apply", "-n", first.namespace, "-f", "-", stdin=json.dumps(samples.migration(first.name)))
    again = _stored(kubectl, first)
    assert again["metadata"]["uid"] != first.uid
    _saga_is_running(kube_api, first.model_copy(update={"uid": again["metadata"]["uid"]}), "snapshot")
    before = _stored(kubectl, first)

    def write_for_the_first() -> bool:
        """The writer itself, given counts to write, until it has found the Migration is not its own."""
        with ProgressWriter(kube_api, first, "snapshot", interval=0.05) as writer:
            writer.update(bytes_done=MIB)
            eventually("the writer to see another uid", lambda: writer.gone, timeout=30)
        return writer.gone

    assert ActivityEnvironment().run(write_for_the_first)
    steps.migrate(steps.snapshot())

    after = _stored(kubectl, first)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], "not written at all"
    assert FIELD_MANAGER not in _status_managers(after)
    assert not any("progress" in s for s in watch.statuses)


def test_an_apply_to_the_status_does_not_refuse_another_uid_so_progress_checks_it_on_a_read(
    kube_api: k8s.ApiClient, ref: MigrationRef, kubectl: Kubectl
) -> None:
    """Why the writer reads first: the API server copies the stored metadata into a status write before it
    validates it, so a uid in the apply's metadata is no precondition; the resourceVersion of a read is."""
    custom = k8s.CustomObjectsApi(kube_api)
    applied = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Migration",
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": "uid-of-another-migration"},
        "status": {"message": "written despite the uid"},
    }

    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ref.namespace, PLURAL, ref.name, applied, field_manager="test",
        _content_type="application/apply-patch+yaml",
    )  # fmt: skip

    assert _stored(kubectl, ref)["status"]["message"] == "written despite the uid"
    stale = {**applied, "metadata": {**applied["metadata"], "resourceVersion": "1"}}
    with pytest.raises(ApiException) as refused:
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ref.namespace, PLURAL, ref.name, stale, field_manager="test",
            _content_type="application/apply-patch+yaml",
        )  # fmt: skip
    assert refused.value.status == 409
