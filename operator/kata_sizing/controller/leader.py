"""Leader election with a coordination.k8s.io/v1 Lease, the way client-go's leaderelection does
it, so two replicas never both write: one holds the Lease and reconciles, the other waits (and
still serves the admission webhook, which writes nothing).

- A replica takes the Lease when it is free (no holder: released on a clean shutdown) or when
  the holder has not renewed it for `lease_duration_s`, judged by this replica's own clock from
  the moment it last saw the Lease change (never by comparing clocks across machines). Taking
  and renewing are PUTs with the read resourceVersion: of two replicas racing, one gets 409.
- The leader renews every `retry_period_s`; if it cannot renew for `renew_deadline_s` (shorter
  than the lease duration, so it stops before anybody else may start) it steps down.
- While a replica does not lead, its work queue runs no pass (the queue's gate is
  `wait_leading`), nor its measurement or guidance check. Its policy watch and caches keep
  following the cluster, so a takeover starts warm.

Defaults are client-go's and controller-runtime's: 15 s lease, 10 s renew deadline, 2 s retry
(`retry.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from .api_errors import ApiError, Conflict
from .retry import LEASE_DURATION_S, LEASE_RETRY_PERIOD_S, RENEW_DEADLINE_S

log = logging.getLogger("kata_sizing.leader")

LEASE_NAME = "kata-sizing"


def default_identity() -> str:
    """The pod's name (the Deployment passes it from the Downward API) plus a random suffix, so a
    restarted container never mistakes its predecessor's Lease for its own."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaseOptions:
    namespace: str
    identity: str
    name: str = LEASE_NAME
    lease_duration_s: float = LEASE_DURATION_S
    renew_deadline_s: float = RENEW_DEADLINE_S
    retry_period_s: float = LEASE_RETRY_PERIOD_S

    def __post_init__(self) -> None:
        if not (0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s):
            raise ValueError(
                "leader election needs retry period < renew deadline < lease duration, got "
                f"{self.retry_period_s} / {self.renew_deadline_s} / {self.lease_duration_s} s")


def _micro_time(now: datetime) -> str:
    # MicroTime is RFC 3339 with exactly six fractional digits.
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


Listener = Callable[[bool], Awaitable[None]]


class LeaderElector:
    def __init__(self, api, options: LeaseOptions, clock: Callable[[], float] = time.monotonic):
        self.api = api
        self.options = options
        self.clock = clock
        self.leading = asyncio.Event()
        self._listeners: list[Listener] = []
        self._observed: tuple | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self.transitions = 0

    @property
    def is_leader(self) -> bool:
        return self.leading.is_set()

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def wait_leading(self) -> None:
        await self.leading.wait()

    async def _set(self, leading: bool, released: bool = False) -> None:
        if leading == self.is_leader:
            return
        if leading:
            self.leading.set()
            self.transitions += 1
            log.info("%s now holds Lease %s/%s: this replica reconciles", self.options.identity,
                     self.options.namespace, self.options.name)
        elif released:
            self.leading.clear()
        else:
            self.leading.clear()
            log.warning("%s no longer holds Lease %s/%s: this replica stops writing", self.options.identity,
                        self.options.namespace, self.options.name)
        for listener in self._listeners:
            await listener(leading)

    async def run(self) -> None:
        while True:
            try:
                held = await self._try_acquire_or_renew()
            except (TimeoutError, ApiError) as exc:
                log.warning("Lease %s/%s: %s", self.options.namespace, self.options.name, exc)
                held = None
            now = self.clock()
            if held:
                self._renewed_at = now
                await self._set(True)
            elif held is False or now - self._renewed_at > self.options.renew_deadline_s:
                # Somebody else holds it, or we could not renew in time: stop before it may expire.
                await self._set(False)
            period = self.options.retry_period_s
            await asyncio.sleep(random.uniform(period * 0.8, period) if self.is_leader else random.uniform(period, period * 1.2))

    async def _try_acquire_or_renew(self) -> bool:
        """True: we hold the Lease now. False: somebody else does."""
        o = self.options
        now = datetime.now(UTC)
        lease = await self.api.read(("Lease", o.namespace, o.name))
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": o.name, "namespace": o.namespace},
                "spec": {"holderIdentity": o.identity, "leaseDurationSeconds": int(round(o.lease_duration_s)),
                         "acquireTime": _micro_time(now), "renewTime": _micro_time(now), "leaseTransitions": 0},
            }
            try:
                await self.api.create(body)
            except Conflict:
                return False
            return True
        spec = dict(lease.get("spec") or {})
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        duration = float(spec.get("leaseDurationSeconds") or o.lease_duration_s)
        if holder and holder != o.identity and self.clock() < self._observed_at + duration:
            return False
        spec.update(holderIdentity=o.identity, leaseDurationSeconds=int(round(o.lease_duration_s)),
                    renewTime=_micro_time(now))
        if holder != o.identity:
            spec.update(acquireTime=_micro_time(now), leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1)
        try:
            written = await self.api.replace({**lease, "spec": spec})
        except Conflict:
            return False
        written_spec = written.get("spec") or {}
        self._observed = (o.identity, written_spec.get("renewTime"), written_spec.get("leaseDurationSeconds"))
        self._observed_at = self.clock()
        return True

    async def release(self) -> None:
        """On a clean shutdown: give the Lease up so the other replica takes over at its next
        try (a couple of seconds), not after the lease duration."""
        if not self.is_leader:
            return
        o = self.options
        try:
            lease = await self.api.read(("Lease", o.namespace, o.name))
            spec = dict((lease or {}).get("spec") or {})
            if lease is not None and spec.get("holderIdentity") == o.identity:
                spec.update(holderIdentity=None, leaseDurationSeconds=1,
                            renewTime=_micro_time(datetime.now(UTC)))
                await self.api.replace({**lease, "spec": spec})
                log.info("%s released Lease %s/%s", o.identity, o.namespace, o.name)
        except (TimeoutError, ApiError) as exc:
            log.warning("could not release Lease %s/%s (%s); it expires in %ss", o.namespace, o.name, exc,
                        o.lease_duration_s)
        await self._set(False, released=True)
