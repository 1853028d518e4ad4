"""The work queue and the Lease elector on their own: coalescing and never-ending retries, and
client-go's leader-election rules over a fake Lease API with a fake clock."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from kata_sizing.controller import compare
from kata_sizing.controller.kube import Conflict, TransientApiError
from kata_sizing.controller.leader import LeaderElector, LeaseOptions
from kata_sizing.controller.workqueue import WorkQueue


def run(coro):
    return asyncio.run(coro)


# --- work queue -------------------------------------------------------------------------------


def queue_of(process, **options) -> WorkQueue:
    """A queue of keys with a string reason: the strongest (first in STRENGTH) wins."""
    strength = ["apply", "drift", "resync", "retry"]
    defaults = {"retry_delay": lambda error, failures: 0.01, "retry_reason": "retry",
                "merge": lambda a, b: min(a, b, key=strength.index), "expected": (Retry,)}
    return WorkQueue(process, **{**defaults, **options})


class Retry(Exception):
    """A failure the processor expects (as the operator expects its API errors)."""


async def drive(queue: WorkQueue, seconds: float) -> None:
    """Run the queue's workers for a while, then stop them."""
    task = asyncio.create_task(queue.run())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_a_burst_of_adds_for_one_key_is_processed_once_for_the_strongest_reason():
    async def scenario():
        seen = []

        async def process(key, reason):
            seen.append((key, reason))

        queue = queue_of(process, workers=2)
        for reason in ["resync", "drift"] * 25:
            queue.add("a", reason)
        queue.add("a", "retry")
        queue.add("b", "resync")
        await drive(queue, 0.05)
        return seen

    assert sorted(run(scenario())) == [("a", "drift"), ("b", "resync")]


def test_a_failing_key_is_retried_with_the_delays_the_policy_gives_until_it_succeeds():
    async def scenario():
        attempts, asked = [], []
        loop = asyncio.get_running_loop()

        async def process(key, reason):
            attempts.append((loop.time(), reason))
            if len(attempts) < 7:  # more failures than the old handler's four tries
                raise Retry("HTTP 500")

        def retry_delay(error, failures):
            asked.append((type(error).__name__, failures))
            return min(0.04, 0.01 * 2 ** failures)

        queue = queue_of(process, workers=1, retry_delay=retry_delay)
        queue.add("k", "apply")
        task = asyncio.create_task(queue.run())
        for _ in range(200):
            if len(attempts) == 7 and not len(queue):
                break
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return attempts, asked, queue.failures

    attempts, asked, failures = run(scenario())
    assert len(attempts) == 7 and failures == {}
    assert asked == [("Retry", n) for n in range(6)]  # the failures in a row before each
    assert [reason for _, reason in attempts] == ["apply"] + ["retry"] * 6
    gaps = [b - a for (a, _), (b, _) in zip(attempts, attempts[1:])]
    assert all(gap >= 0.009 for gap in gaps)  # the delay the policy gave
    assert max(gaps) < 0.04 + 0.03  # capped (plus scheduling slack)


def test_a_key_added_while_it_is_processed_runs_again_afterwards_for_what_was_asked():
    async def scenario():
        runs = []
        release = asyncio.Event()

        async def process(key, reason):
            runs.append((key, reason))
            if len(runs) == 1:
                await release.wait()

        queue = queue_of(process, workers=2)
        queue.add("k", "apply")

        def changed_again() -> None:  # the object changed again while being corrected
            queue.add("k", "drift")
            release.set()

        asyncio.get_running_loop().call_later(0.01, changed_again)
        await drive(queue, 0.06)
        return runs

    assert run(scenario()) == [("k", "apply"), ("k", "drift")]


def test_add_after_keeps_the_earliest_timer_and_an_add_runs_at_once():
    async def scenario():
        seen = []
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def process(key, reason):
            seen.append((key, reason, round(loop.time() - start, 2)))

        queue = queue_of(process)
        queue.add_after("a", 0.05, "resync")
        queue.add_after("a", 10, "resync")  # later: the sooner one stays
        queue.add_after("b", 10, "resync")
        queue.add_after("b", 0.02, "retry")  # sooner: replaces it
        queue.add_after("c", 10, "resync")
        queue.add("c", "drift")  # now: the timer goes
        await drive(queue, 0.1)
        return seen, len(queue)

    seen, left = run(scenario())
    assert [(k, r) for k, r, _ in seen] == [("c", "drift"), ("b", "retry"), ("a", "resync")]
    assert seen[1][2] < 0.05 and left == 0


def test_an_unexpected_failure_is_logged_with_its_traceback_and_retried(caplog):
    async def scenario():
        runs = []

        async def process(key, reason):
            runs.append(reason)
            if len(runs) == 1:
                raise KeyError("a bug")

        queue = queue_of(process)
        queue.add("k", "apply")
        await drive(queue, 0.05)
        return runs

    with caplog.at_level("WARNING", logger="kata_sizing.workqueue"):
        assert run(scenario()) == ["apply", "retry"]
    [record] = caplog.records
    assert record.exc_info and "failed unexpectedly" in record.getMessage()


def test_the_queue_waits_for_its_gate():
    async def scenario():
        seen = []
        gate = asyncio.Event()

        async def process(key, reason):
            seen.append(key)

        queue = queue_of(process, gate=gate.wait)
        queue.add("k", "resync")
        asyncio.get_running_loop().call_later(0.03, lambda: before.extend(seen) or gate.set())
        before: list = []
        await drive(queue, 0.06)
        return before, seen

    assert run(scenario()) == ([], ["k"])


def test_one_failure_policy_for_every_pass():
    from kata_sizing.controller.api_errors import Invalid, NotFound, PermanentApiError
    from kata_sizing.controller.retry import REFUSED_RETRY_S, RETRY_CAP_S, RetryLater, retry_delay_s

    for error in (TransientApiError(503, "x"), Conflict(409, "x"), RetryLater("x"), KeyError("a bug")):
        assert 0 < retry_delay_s(error, 0) <= 0.2 and retry_delay_s(error, 40) <= RETRY_CAP_S, error
    for error in (PermanentApiError(403, "x"), Invalid(422, "x"), NotFound(404, "x")):
        assert retry_delay_s(error, 0) == retry_delay_s(error, 9) == REFUSED_RETRY_S, error


# --- what KataDeploy mode compares -------------------------------------------------------------


WANT: dict[str, Any] = {
    "kind": "RuntimeClass", "handler": "kata-x-m",
    "metadata": {"name": "kata-x-m", "labels": {"app.kubernetes.io/managed-by": "kata-sizing",
                                                "katasizing.dev/policy": "x", "katasizing.dev/class": "m"}},
    "overhead": {"podFixed": {"cpu": "250m", "memory": "908Mi"}},
    "scheduling": {"nodeSelector": {"katacontainers.io/kata-runtime": "true"},
                   "tolerations": [{"key": "kata", "operator": "Exists", "effect": "NoSchedule"}]},
}


def chart_made(**change) -> dict:
    obj = copy.deepcopy(WANT)
    obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "Helm"
    obj["metadata"]["annotations"] = {"meta.helm.sh/release-name": "kata-deploy"}
    obj["scheduling"]["nodeSelector"]["kata-deploy.katacontainers.io/default"] = "true"
    obj["overhead"]["podFixed"]["memory"] = "0.88671875Gi"  # 908Mi, as another writer may print it
    for path, value in change.items():
        target = obj
        *parents, last = path.split(".")
        for part in parents:
            target = target[part]
        target[last] = value
    return obj


@pytest.mark.parametrize("live, expected", [
    (chart_made(), []),
    (chart_made(**{"overhead.podFixed": {"cpu": "250m", "memory": "908Mi", "sev-snp.amd.com/esids": "1"}}), []),
    (chart_made(**{"overhead.podFixed": {"cpu": "250m", "memory": "1Mi"}}), ["overhead.podFixed"]),
    (chart_made(**{"scheduling.nodeSelector": {"kata-deploy.katacontainers.io/default": "true"}}),
     ["scheduling.nodeSelector[katacontainers.io/kata-runtime]"]),
    (chart_made(**{"scheduling.tolerations": []}), ["scheduling.tolerations"]),
    (chart_made(**{"metadata.labels": {"app.kubernetes.io/managed-by": "Helm"}}),
     ["metadata.labels[katasizing.dev/policy]", "metadata.labels[katasizing.dev/class]"]),
    (chart_made(handler="other"), ["handler"]),
], ids=["as-the-chart-makes-it", "tee-key", "pod-fixed", "selector-key", "toleration", "our-labels", "handler"])
def test_kata_deploy_mode_compares_only_what_the_policy_decides(live, expected):
    assert compare.differences(WANT, live, guarded=True) == expected


def test_a_guarded_correction_keeps_every_key_of_the_chart():
    live = chart_made(**{"overhead.podFixed": {"cpu": "1m", "memory": "1Mi", "sev-snp.amd.com/esids": "1"},
                         "scheduling.tolerations": [{"key": "theirs", "operator": "Exists"}]})
    fixed = compare.corrected(WANT, live, guarded=True)
    assert compare.differences(WANT, fixed, guarded=True) == []
    assert fixed["overhead"]["podFixed"] == {"cpu": "250m", "memory": "908Mi", "sev-snp.amd.com/esids": "1"}
    assert fixed["scheduling"]["nodeSelector"]["kata-deploy.katacontainers.io/default"] == "true"
    assert fixed["scheduling"]["tolerations"] == [
        {"key": "theirs", "operator": "Exists"}, {"key": "kata", "operator": "Exists", "effect": "NoSchedule"}]
    assert fixed["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert fixed["metadata"]["annotations"] == {"meta.helm.sh/release-name": "kata-deploy"}


def test_operator_mode_still_owns_the_whole_scheduling_block():
    live = copy.deepcopy(WANT)
    live["scheduling"]["nodeSelector"]["extra"] = "1"
    assert compare.differences(WANT, live) == ["scheduling"]


# --- the Lease elector -------------------------------------------------------------------------


class FakeLeases:
    """One Lease, with resourceVersion checks as the API server does them."""

    def __init__(self):
        self.lease: dict | None = None
        self.version = 0
        self.fail_next = 0

    def _maybe_fail(self):
        if self.fail_next:
            self.fail_next -= 1
            raise TransientApiError(503, "unavailable")

    async def read(self, key):
        assert key[0] == "Lease"
        self._maybe_fail()
        return copy.deepcopy(self.lease)

    async def create(self, body):
        self._maybe_fail()
        if self.lease is not None:
            raise Conflict(409, "exists")
        self.version += 1
        self.lease = {**copy.deepcopy(body), "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        return copy.deepcopy(self.lease)

    async def replace(self, body):
        self._maybe_fail()
        if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise Conflict(409, "stale")
        self.version += 1
        self.lease = {**copy.deepcopy(body), "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        return copy.deepcopy(self.lease)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def elector(api, identity, clock) -> LeaderElector:
    return LeaderElector(api, LeaseOptions(namespace="ns", identity=identity, lease_duration_s=15,
                                           renew_deadline_s=10, retry_period_s=2), clock=clock)


def test_the_first_replica_takes_a_free_lease_and_the_second_waits_until_it_expires():
    async def scenario():
        api, clock = FakeLeases(), Clock()
        a, b = elector(api, "a", clock), elector(api, "b", clock)
        assert await a._try_acquire_or_renew() is True
        assert await b._try_acquire_or_renew() is False
        clock.now += 14  # a stopped renewing 14 s ago: not expired yet (as b saw it)
        assert await b._try_acquire_or_renew() is False
        clock.now += 2
        assert await b._try_acquire_or_renew() is True
        assert api.lease["spec"]["holderIdentity"] == "b" and api.lease["spec"]["leaseTransitions"] == 1
        assert await a._try_acquire_or_renew() is False  # a sees b's renewals now
    run(scenario())


def test_a_renewing_leader_keeps_the_lease():
    async def scenario():
        api, clock = FakeLeases(), Clock()
        a, b = elector(api, "a", clock), elector(api, "b", clock)
        await a._try_acquire_or_renew()
        for _ in range(20):
            clock.now += 2
            assert await a._try_acquire_or_renew() is True
            assert await b._try_acquire_or_renew() is False
    run(scenario())


def test_a_released_lease_is_taken_at_once():
    async def scenario():
        api, clock = FakeLeases(), Clock()
        a, b = elector(api, "a", clock), elector(api, "b", clock)
        await a._set(await a._try_acquire_or_renew())
        assert await b._try_acquire_or_renew() is False
        await a.release()
        assert not a.is_leader and api.lease["spec"]["holderIdentity"] is None
        assert await b._try_acquire_or_renew() is True
    run(scenario())


def test_a_leader_that_cannot_renew_within_the_deadline_steps_down():
    async def scenario():
        api = FakeLeases()
        options = LeaseOptions(namespace="ns", identity="a", lease_duration_s=0.3, renew_deadline_s=0.2,
                               retry_period_s=0.02)
        a = LeaderElector(api, options)
        changes = []

        async def listen(leading):
            changes.append(leading)

        a.listen(listen)
        task = asyncio.create_task(a.run())
        await asyncio.wait_for(a.wait_leading(), 1)
        api.fail_next = 10_000  # the API server is unreachable from here on
        for _ in range(100):
            if not a.is_leader:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return changes

    assert run(scenario()) == [True, False]


def test_lease_timings_must_be_ordered():
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaseOptions(namespace="ns", identity="a", lease_duration_s=10, renew_deadline_s=10, retry_period_s=2)
