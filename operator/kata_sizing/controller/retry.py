"""Every back-off, retry and leader-election timing of the operator, in one place, and the one
failure policy of a pass, whatever queued it (docs/operation.md, API failures; the defaults are
client-go's where client-go has one)."""

from __future__ import annotations

import random

from .api_errors import ApiError, Conflict, TransientApiError

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
