"""Leader election through a coordination.k8s.io Lease: one watcher replica acts, the others wait.

The algorithm follows client-go's: a candidate takes the Lease when it is free or when
its record has not changed for a whole lease duration, judged by the candidate's own
clock (when it last saw the record change), so clocks of different machines need not
agree. Writes carry the resourceVersion they were computed from, so two candidates
cannot both win. A leader that cannot renew within the renew deadline steps down, even
when its last renewal has not been answered (a silent API server): it stops acting
before its Lease can run out, and a standby takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from datetime import UTC, datetime

from kubernetes.client.exceptions import ApiException

from watcher.kube import Kube, LeaseRecord
from watcher.settings import LeaseSettings

log = logging.getLogger("ferry.watcher.leadership")


class LeadershipLost(Exception):
    """This replica could not renew its Lease in time; another may be leading now."""


@dataclasses.dataclass
class _Observed:
    record: tuple[object, ...] | None = None
    at: float = 0.0


class LeaderElector:
    def __init__(self, kube: Kube, settings: LeaseSettings) -> None:
        self._kube = kube
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
                if await self._try_acquire_or_renew():
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
            # A renewal that has not answered by the renew deadline counts as failed, whatever it does later (it is
            # conditional on the version it read, so a standby that took the Lease meanwhile makes it a conflict):
            # an API server that accepts and then stays silent must not keep a leader leading past its Lease. Each
            # try gets at least the time the Lease outlasts the renew deadline: a process that was stopped (SIGSTOP,
            # a paused VM) past its deadline tries once, and goes on leading if nobody took the Lease meanwhile.
            left = self._settings.renew_deadline - (time.monotonic() - last_renewal)
            least = self._settings.duration - self._settings.renew_deadline
            try:
                renewed = await asyncio.wait_for(self._try_acquire_or_renew(), timeout=max(left, least))
            except ApiException as error:
                log.warning("could not renew Lease %s: %s", self._settings.name, error.reason)
                renewed = False
            except TimeoutError:
                log.warning("renewing Lease %s got no answer in time", self._settings.name)
                raise self._lost() from None
            if renewed:
                last_renewal = time.monotonic()
            elif time.monotonic() - last_renewal > self._settings.renew_deadline:
                raise self._lost()

    def _lost(self) -> LeadershipLost:
        return LeadershipLost(
            f"{self.identity} could not renew Lease {self._settings.namespace}/{self._settings.name} "
            f"for {self._settings.renew_deadline:.0f}s"
        )

    async def release(self) -> None:
        """Gives the Lease up at once (on a clean shutdown), so a standby takes over without waiting."""
        settings = self._settings
        try:
            lease = await self._kube.read_lease(settings.name, settings.namespace)
            if lease is None or lease.holder != self.identity:
                return
            if await self._kube.write_lease(
                settings.name, settings.namespace, dataclasses.replace(lease, holder=None, duration_seconds=1)
            ):
                log.info("%s released Lease %s", self.identity, settings.name)
        except ApiException as error:
            log.warning("could not release Lease %s: %s", settings.name, error.reason)

    async def _try_acquire_or_renew(self) -> bool:
        now = datetime.now(UTC)
        settings = self._settings
        lease = await self._kube.read_lease(settings.name, settings.namespace)
        if lease is None:
            return await self._kube.write_lease(
                settings.name,
                settings.namespace,
                LeaseRecord(self.identity, lease_seconds(settings), now, now, transitions=0),
            )
        record = (lease.holder, lease.renew_time, lease.transitions)
        if record != self._observed.record:
            self._observed = _Observed(record, time.monotonic())
        duration = lease.duration_seconds or settings.duration
        expired = time.monotonic() - self._observed.at > duration
        if lease.holder and lease.holder != self.identity and not expired:
            return False
        if lease.holder != self.identity:
            lease = dataclasses.replace(
                lease, holder=self.identity, acquire_time=now, transitions=lease.transitions + 1
            )
        lease = dataclasses.replace(lease, renew_time=now, duration_seconds=lease_seconds(settings))
        # The read's resourceVersion rides along: a concurrent write makes this a conflict (False).
        if not await self._kube.write_lease(settings.name, settings.namespace, lease):
            return False
        self._observed = _Observed((lease.holder, lease.renew_time, lease.transitions), time.monotonic())
        return True


def lease_seconds(settings: LeaseSettings) -> int:
    """The duration written into the Lease, which holds whole seconds: rounded up. Rounded down (15.9 to 15), the
    standbys would take over at 15 s while a leader with a renew deadline of 15.5 s still acted. Rounded up, it is at
    least the duration, which the settings keep above the renew deadline."""
    return math.ceil(settings.duration)
