"""A level-triggered work queue, in the manner of client-go's rate-limited delaying workqueue.

Keys, not events: a key added again while it waits is queued once (a burst of watch events
for one object is one piece of work), and a key added while it is being processed runs once
more afterwards; one key is never processed by two workers at once. Each key carries why it is
queued (a reason): a key added again keeps the reason `merge` prefers. `add_after` puts a key in
after a delay; a key has at most one such timer, the earliest asked for. A failure puts the key
back after the delay `retry_delay` gives for that error and the failures in a row before it, for
as long as it keeps failing: nothing is dropped to wait for a periodic resync. Processing reads
the current state when it runs, so a retry never replays a stale event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger("kata_sizing.workqueue")

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


def _latest(_old: R, new: R) -> R:
    return new


class WorkQueue(Generic[K, R]):
    def __init__(
        self, process: Callable[[K, R], Awaitable[None]], *, retry_delay: Callable[[BaseException, int], float],
        retry_reason: R, merge: Callable[[R, R], R] = _latest, workers: int = 4,
        expected: tuple[type[Exception], ...] = (), gate: Callable[[], Awaitable[None]] | None = None,
        name: str = "work",
    ):
        self._process = process
        self._retry_delay = retry_delay
        self._retry_reason = retry_reason
        self._merge = merge
        self._expected = expected  # failures logged as a line; anything else with its traceback
        self._workers = workers
        self._gate = gate
        self._name = name
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._reasons: dict[K, R] = {}  # why each waiting, re-queued or timed key is queued
        self._waiting: set[K] = set()
        self._active: set[K] = set()
        self._again: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self.failures: dict[K, int] = {}
        self.processed = 0

    def _note(self, key: K, reason: R) -> None:
        before = self._reasons.get(key)
        self._reasons[key] = reason if before is None else self._merge(before, reason)

    def add(self, key: K, reason: R) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._note(key, reason)
        if key in self._waiting:
            return
        if key in self._active:
            self._again.add(key)
            return
        self._waiting.add(key)
        self._queue.put_nowait(key)

    def add_after(self, key: K, delay_s: float, reason: R) -> None:
        """`add(key, reason)` in `delay_s`, unless the key is queued or timed to come sooner."""
        if key in self._waiting or key in self._again:
            return
        loop = asyncio.get_running_loop()
        timer = self._timers.get(key)
        if timer is not None:
            if timer.when() <= loop.time() + delay_s:
                return
            timer.cancel()
        self._timers[key] = loop.call_later(delay_s, self._fire, key, reason)

    def _fire(self, key: K, reason: R) -> None:
        self._timers.pop(key, None)
        self.add(key, reason)

    def forget(self, key: K) -> None:
        """No timer for `key` any more (a queued or running key still runs)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self.failures.pop(key, None)

    def __len__(self) -> int:
        return len(self._waiting) + len(self._active) + len(self._timers)

    def busy(self) -> int:
        """Keys waiting or being processed (not those timed for later)."""
        return len(self._waiting) + len(self._active)

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

    async def drain(self) -> None:
        """Until no key is being processed (the workers may take the next one right after)."""
        await self._idle.wait()

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            if self._gate is not None:
                await self._gate()
            self._waiting.discard(key)
            reason = self._reasons.pop(key)
            self._active.add(key)
            self._idle.clear()
            try:
                await self._process(key, reason)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one key's failure must not stop the queue
                self._retry(key, exc)
            else:
                self.failures.pop(key, None)
            finally:
                self._active.discard(key)
                if not self._active:
                    self._idle.set()
                self.processed += 1
                if key in self._again:
                    self._again.discard(key)
                    self.add(key, self._reasons.pop(key))

    def _retry(self, key: K, exc: Exception) -> None:
        failures = self.failures.get(key, 0)
        self.failures[key] = failures + 1
        delay = self._retry_delay(exc, failures)
        if isinstance(exc, self._expected):
            log.warning("%s: %s: %s; retrying in %.2fs (attempt %d)", self._name, key, exc, delay, failures + 2)
        else:
            log.exception("%s: %s failed unexpectedly; retrying in %.2fs", self._name, key, delay)
        if key in self._again:
            # Something changed while it ran: what it asked for runs after the back-off too.
            self._again.discard(key)
            reason = self._merge(self._reasons.pop(key), self._retry_reason)
        else:
            reason = self._retry_reason
        self.add_after(key, delay, reason)
