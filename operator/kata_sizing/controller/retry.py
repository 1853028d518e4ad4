"""Every back-off, retry and leader-election timing of the operator, in one place, and the one
failure policy of a pass, whatever queued it, and of a background task, whatever it does
(docs/operation.md, API failures; the defaults are client-go's where client-go has one)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

from . import metrics
from .api_errors import ApiError, Conflict, TransientApiError

log = logging.getLogger("kata_sizing.tasks")

# A write that meets 409 (a stale resourceVersion, an object that appeared) re-reads and tries
# again, at most this many times in one pass; then the pass is retried after a back-off.
CONFLICT_ATTEMPTS = 5
# A failed pass: capped exponential back-off with jitter, never given up (client-go's
# rate-limited workqueue uses 5 ms to 1000 s; a pass is heavier).
RETRY_BASE_S = 0.2
RETRY_CAP_S = 30.0
# A refused request (4xx other than 409: a lost permission, an object the server will not take)
# is tried again after this long; soon would not help.
REFUSED_RETRY_S = 60.0
# A broken list or watch reconnects after a shorter back-off: it is one request.
WATCH_RETRY_BASE_S = 0.1
WATCH_RETRY_CAP_S = 10.0
# Leader election (client-go's and controller-runtime's defaults): retry period < renew deadline <
# lease duration.
LEASE_DURATION_S = 15.0
RENEW_DEADLINE_S = 10.0
LEASE_RETRY_PERIOD_S = 2.0


class RetryLater(Exception):
    """A pass did what it could and said so in status, and must run again after a back-off (a
    ConfigMap's namespace does not exist yet)."""


# Failures a pass is expected to meet (logged as one line, not with a traceback).
EXPECTED_FAILURES: tuple[type[Exception], ...] = (ApiError, RetryLater)


def backoff_s(failures: int, base_s: float = RETRY_BASE_S, cap_s: float = RETRY_CAP_S) -> float:
    """Capped exponential back-off with jitter in [d/2, d]: retries of many callers spread out
    instead of arriving together at a server that is just recovering."""
    delay = min(cap_s, base_s * (2 ** min(failures, 30)))
    return random.uniform(delay / 2, delay)


def retry_delay_s(error: BaseException, failures: int) -> float:
    """How long a failed pass waits before it runs again, `failures` being how many failed in a
    row before this one. A refused request (4xx other than 409) waits REFUSED_RETRY_S; anything
    else (a 5xx, 429, timeout, a conflict that kept coming back, RetryLater, a bug) backs off."""
    if isinstance(error, ApiError) and not isinstance(error, (TransientApiError, Conflict)):
        return REFUSED_RETRY_S
    return backoff_s(failures)


def task_failed(task: str, delay_s: float) -> None:
    """A background task raised (called in its `except`): one line at ERROR with the traceback,
    and kata_sizing_task_failures_total{task} + 1."""
    metrics.task_failed(task)
    log.exception("%s failed unexpectedly; it goes on in %.2fs", task, delay_s)


async def keep_running(task: str, run: Callable[[], Awaitable[object]],
                       clock: Callable[[], float] = time.monotonic) -> None:
    """Run a background task (the guidance check, the measurement loop, a watch...) until it is
    cancelled or returns: when it raises it is said (`task_failed`) and started again after
    `backoff_s` of its failures in a row. A run that lasted RETRY_CAP_S or more had worked: the
    count starts over, and a task that fails once a day starts again at once."""
    metrics.track_task(task)
    failures = 0
    while True:
        started = clock()
        try:
            await run()
            return
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - said and counted; the task goes on
            if clock() - started >= RETRY_CAP_S:
                failures = 0
            delay_s = backoff_s(failures)
            failures += 1
            task_failed(task, delay_s)
        await asyncio.sleep(delay_s)
