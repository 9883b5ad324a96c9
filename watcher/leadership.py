"""Leader election through a coordination.k8s.io Lease: one watcher replica acts, the others wait.

The algorithm follows client-go's: a candidate takes the Lease when it is free or when
its record has not changed for a whole lease duration, judged by the candidate's own
clock (when it last saw the record change), so clocks of different machines need not
agree. Writes carry the resourceVersion they were computed from, so two candidates
cannot both win. A leader that cannot renew within the renew deadline steps down.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from watcher.settings import LeaseSettings

log = logging.getLogger("ferry.watcher.leadership")


class LeadershipLost(Exception):
    """This replica could not renew its Lease in time; another may be leading now."""


@dataclasses.dataclass
class _Observed:
    record: tuple[Any, ...] | None = None
    at: float = 0.0


class LeaderElector:
    def __init__(self, api: k8s.ApiClient, settings: LeaseSettings) -> None:
        self._coordination = k8s.CoordinationV1Api(api)
        self._settings = settings
        self._observed = _Observed()

    @property
    def identity(self) -> str:
        return self._settings.identity

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Waits until this replica holds the Lease (True) or `stop` is set (False)."""
        announced = False
        while not stop.is_set():
            try:
                if await asyncio.to_thread(self._try_acquire_or_renew):
                    log.info("%s leads (Lease %s/%s)", self.identity, self._settings.namespace, self._settings.name)
                    return True
            except ApiException as error:
                log.warning("could not read or write Lease %s: %s", self._settings.name, error.reason)
            if not announced:
                log.info("%s is standing by: another replica holds Lease %s", self.identity, self._settings.name)
                announced = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._settings.retry_period)
        return False

    async def hold(self, stop: asyncio.Event) -> None:
        """Renews the Lease every retry period until `stop` is set; raises LeadershipLost if renewal fails."""
        last_renewal = time.monotonic()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self._settings.retry_period)
                return
            except TimeoutError:
                pass
            try:
                renewed = await asyncio.to_thread(self._try_acquire_or_renew)
            except ApiException as error:
                log.warning("could not renew Lease %s: %s", self._settings.name, error.reason)
                renewed = False
            if renewed:
                last_renewal = time.monotonic()
            elif time.monotonic() - last_renewal > self._settings.renew_deadline:
                raise LeadershipLost(
                    f"{self.identity} could not renew Lease {self._settings.namespace}/{self._settings.name} "
                    f"for {self._settings.renew_deadline:.0f}s"
                )

    def release(self) -> None:
        """Gives the Lease up at once (on a clean shutdown), so a standby takes over without waiting."""
        try:
            lease = self._coordination.read_namespaced_lease(self._settings.name, self._settings.namespace)
        except ApiException:
            return
        if lease.spec.holder_identity != self.identity:
            return
        lease.spec.holder_identity = None
        lease.spec.lease_duration_seconds = 1
        try:
            self._coordination.replace_namespaced_lease(self._settings.name, self._settings.namespace, lease)
            log.info("%s released Lease %s", self.identity, self._settings.name)
        except ApiException as error:
            log.warning("could not release Lease %s: %s", self._settings.name, error.reason)

    def _try_acquire_or_renew(self) -> bool:
        now = datetime.now(UTC)
        settings = self._settings
        try:
            lease = self._coordination.read_namespaced_lease(settings.name, settings.namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            return self._create(now)
        spec = lease.spec
        record = (spec.holder_identity, spec.renew_time, spec.lease_transitions)
        if record != self._observed.record:
            self._observed = _Observed(record, time.monotonic())
        holder = spec.holder_identity
        duration = spec.lease_duration_seconds or settings.duration
        expired = time.monotonic() - self._observed.at > duration
        if holder and holder != self.identity and not expired:
            return False
        if holder != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
            spec.holder_identity = self.identity
        spec.renew_time = now
        spec.lease_duration_seconds = int(settings.duration)
        try:
            # The read's resourceVersion rides along: a concurrent write makes this a 409.
            self._coordination.replace_namespaced_lease(settings.name, settings.namespace, lease)
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        self._observed = _Observed((spec.holder_identity, spec.renew_time, spec.lease_transitions), time.monotonic())
        return True

    def _create(self, now: datetime) -> bool:
        lease = k8s.V1Lease(
            metadata=k8s.V1ObjectMeta(name=self._settings.name, namespace=self._settings.namespace),
            spec=k8s.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=int(self._settings.duration),
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        try:
            self._coordination.create_namespaced_lease(self._settings.namespace, lease)
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True
