"""The work queue and the Lease elector on their own: coalescing and never-ending retries, and
client-go's leader-election rules over a fake Lease API with a fake clock."""

from __future__ import annotations

import asyncio
import copy

import pytest

from kata_sizing.controller import compare
from kata_sizing.controller.kube import Conflict, TransientApiError
from kata_sizing.controller.leader import LeaderElector, LeaseOptions
from kata_sizing.controller.workqueue import Retry, WorkQueue


def run(coro):
    return asyncio.run(coro)


# --- work queue -------------------------------------------------------------------------------


async def drive(queue: WorkQueue, seconds: float) -> None:
    """Run the queue's workers for a while, then stop them."""
    task = asyncio.create_task(queue.run())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_a_burst_of_adds_for_one_key_is_processed_once():
    async def scenario():
        seen = []

        async def process(key):
            seen.append(key)

        queue = WorkQueue(process, workers=2)
        for _ in range(50):
            queue.add("a")
        queue.add("b")
        await drive(queue, 0.05)
        return seen

    assert sorted(run(scenario())) == ["a", "b"]


def test_a_failing_key_is_retried_with_growing_capped_delays_until_it_succeeds():
    async def scenario():
        attempts = []
        loop = asyncio.get_running_loop()

        async def process(key):
            attempts.append(loop.time())
            if len(attempts) < 7:  # more failures than the old handler's four tries
                raise Retry("HTTP 500")

        queue = WorkQueue(process, workers=1, retry_base_s=0.01, retry_cap_s=0.04)
        queue.add("k")
        task = asyncio.create_task(queue.run())
        for _ in range(200):
            if len(attempts) == 7 and not len(queue):
                break
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return attempts, queue.failures

    attempts, failures = run(scenario())
    assert len(attempts) == 7 and failures == {}
    gaps = [b - a for a, b in zip(attempts, attempts[1:])]
    assert all(gap >= 0.004 for gap in gaps)  # at least half the first delay: backed off
    assert max(gaps) < 0.04 + 0.03  # capped (plus scheduling slack)


def test_a_key_added_while_it_is_processed_runs_again_afterwards():
    async def scenario():
        runs = []
        release = asyncio.Event()

        async def process(key):
            runs.append(key)
            if len(runs) == 1:
                await release.wait()

        queue = WorkQueue(process, workers=2)
        queue.add("k")

        def changed_again() -> None:  # the object changed again while being corrected
            queue.add("k")
            release.set()

        asyncio.get_running_loop().call_later(0.01, changed_again)
        await drive(queue, 0.06)
        return runs

    assert run(scenario()) == ["k", "k"]


def test_the_queue_waits_for_its_gate():
    async def scenario():
        seen = []
        gate = asyncio.Event()

        async def process(key):
            seen.append(key)

        queue = WorkQueue(process, gate=gate.wait)
        queue.add("k")
        asyncio.get_running_loop().call_later(0.03, lambda: before.extend(seen) or gate.set())
        before: list = []
        await drive(queue, 0.06)
        return before, seen

    assert run(scenario()) == ([], ["k"])


# --- what KataDeploy mode compares -------------------------------------------------------------


WANT = {
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
