"""A level-triggered work queue, in the manner of client-go's rate-limited workqueue.

Keys, not events: a key added again while it waits is queued once (a burst of watch events
for one object is one piece of work), and a key added while it is being processed runs once
more afterwards. A transient failure puts the key back after a capped exponential back-off
with jitter, for as long as it keeps failing: nothing is dropped to wait for a periodic
resync. Processing reads the current state when it runs, so a retry never replays a stale
event.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Generic, Hashable, TypeVar

from .retry import RETRY_BASE_S, RETRY_CAP_S, backoff_s

log = logging.getLogger("kata_sizing.workqueue")

K = TypeVar("K", bound=Hashable)


class Retry(Exception):
    """Raised by a processor for a failure worth retrying (5xx, 429, timeouts, lost races)."""


class WorkQueue(Generic[K]):
    def __init__(
        self, process: Callable[[K], Awaitable[None]], *, workers: int = 4,
        retry_base_s: float = RETRY_BASE_S, retry_cap_s: float = RETRY_CAP_S,
        gate: Callable[[], Awaitable[None]] | None = None, name: str = "work",
    ):
        self._process = process
        self._workers = workers
        self._retry_base_s = retry_base_s
        self._retry_cap_s = retry_cap_s
        self._gate = gate
        self._name = name
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._waiting: set[K] = set()
        self._active: set[K] = set()
        self._again: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self.failures: dict[K, int] = {}
        self.processed = 0

    def add(self, key: K) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self._waiting:
            return
        if key in self._active:
            self._again.add(key)
            return
        self._waiting.add(key)
        self._queue.put_nowait(key)

    def add_after(self, key: K, delay_s: float) -> None:
        if key in self._waiting or key in self._timers:
            return
        self._timers[key] = asyncio.get_running_loop().call_later(delay_s, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def __len__(self) -> int:
        return len(self._waiting) + len(self._active) + len(self._timers)

    async def run(self) -> None:
        workers = [asyncio.create_task(self._worker(), name=f"{self._name}-worker-{i}") for i in range(self._workers)]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            if self._gate is not None:
                await self._gate()
            self._waiting.discard(key)
            self._active.add(key)
            try:
                await self._process(key)
            except asyncio.CancelledError:
                raise
            except Retry as exc:
                self._retry(key, exc)
            except Exception as exc:  # noqa: BLE001 - a bug in one key must not stop the queue
                log.exception("%s: %r failed unexpectedly", self._name, key)
                self._retry(key, exc)
            else:
                self.failures.pop(key, None)
            finally:
                self._active.discard(key)
                self.processed += 1
                if key in self._again:
                    self._again.discard(key)
                    self.add(key)

    def _retry(self, key: K, exc: BaseException) -> None:
        failures = self.failures.get(key, 0)
        self.failures[key] = failures + 1
        delay = backoff_s(failures, self._retry_base_s, self._retry_cap_s)
        log.warning("%s: %r: %s; retrying in %.2fs (attempt %d)", self._name, key, exc, delay, failures + 2)
        self._again.discard(key)  # the retry reads the latest state anyway
        self.add_after(key, delay)
