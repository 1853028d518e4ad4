"""No background task dies in silence: a raise in the guidance check, the measurement loop, a
watch's cache (informer) or the policy watch is logged once at ERROR with its traceback, counted
in kata_sizing_task_failures_total{task}, and the task goes on under the one retry policy
(retry.keep_running, retry.backoff_s). Each test injects one raise and then shows the task doing
its work: a node change queued by the guidance check well before the 300 s resync, nodes read
again, a change delivered to the cache's consumer, a policy event taken again."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import kopf

from kata_sizing.controller import gather, handlers, metrics, retry, worker
from kata_sizing.controller.cluster import summarize_node
from kata_sizing.controller.informer import ChildCache, Informer, slim_child
from kata_sizing.controller.measurement import Clock, MeasuredPolicy, MeasurementLoop
from kata_sizing.controller.plan import APPLY, GUIDANCE
from kata_sizing.controller.state import OperatorState, PolicyRecord
from kata_sizing.controller.workqueue import WorkQueue
from kata_sizing.core.headroom import HeadroomThreshold
from kata_sizing.core.measure import KataPod
from tests.support.policies import example

MIB = 2**20
NAME = example()["metadata"]["name"]


def _failures(task: str) -> float:
    return metrics.REGISTRY.get_sample_value("kata_sizing_task_failures_total", {"task": task}) or 0.0


def _said_once(caplog, task: str) -> None:
    said = [r for r in caplog.records if r.name == "kata_sizing.tasks" and r.getMessage().startswith(f"{task} ")]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].levelno == logging.ERROR and said[0].exc_info is not None
    assert "injected" in str(said[0].exc_info[1]) and "failed unexpectedly; it goes on in" in said[0].getMessage()


async def _until(predicate, timeout_s: float = 5.0, step=None) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "the task did not go on"
        if step is not None:
            step()
        await asyncio.sleep(0.005)


async def _stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class RaisingOnce:
    """`real`, except that its first call raises; `calls` holds each call's arguments."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.calls: list[tuple] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(args)
        if len(self.calls) == 1:
            raise RuntimeError("injected")
        return self.real(*args, **kwargs)


class Queue:
    def __init__(self) -> None:
        self.added: list[tuple[str, str]] = []

    def add(self, name: str, trigger: str) -> None:
        self.added.append((name, trigger))


def _ready() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


def _state() -> tuple[OperatorState, Queue]:
    """No RuntimeClass, node or pod yet, every cache synced; the queue, which records what is added."""
    def cache() -> Any:  # what a pass reads of an informer: synced, its version, its items
        return SimpleNamespace(synced=_ready(), version=0, items={})
    children = cast(ChildCache, SimpleNamespace(runtime_classes=cache(), runtime_classes_except=lambda names: [], informers=list))
    queue = Queue()
    state = OperatorState(api=None, admission_versions={}, children=children, nodes=cache(), pods=cache())
    state.work = cast(WorkQueue, queue)
    return state, queue


def _body() -> dict:
    body = example()
    body["metadata"].update(uid="u-policy", generation=1)
    return body


def test_the_guidance_check_goes_on_after_a_raise_and_queues_a_node_change(monkeypatch, caplog):
    monkeypatch.setattr(worker, "GUIDANCE_INTERVAL_S", 0.01)
    before = _failures("guidance-check")

    async def main() -> None:
        state, queue = _state()
        record = state.records[NAME] = PolicyRecord(NAME, _body())
        record.inputs = await gather.pass_inputs(state, record.body or {})  # what its last pass read: no node
        raising_once = RaisingOnce(worker.guidance_due)  # its first call raises before it awaits anything
        monkeypatch.setattr(worker, "guidance_due", raising_once)
        task = asyncio.create_task(retry.keep_running("guidance-check", lambda: worker.watch_guidance(state)))
        await _until(lambda: len(raising_once.calls) >= 1)
        state.nodes.items["n1"] = summarize_node({
            "metadata": {"name": "n1", "labels": {"katacontainers.io/kata-runtime": "true"}},
            "status": {"capacity": {"memory": "256Gi", "cpu": "64"}, "allocatable": {"memory": "250Gi", "cpu": "63"}}})
        state.nodes.version += 1
        await _until(lambda: (NAME, GUIDANCE) in queue.added)
        await _stop(task)
        assert queue.added == [(NAME, GUIDANCE)]

    asyncio.run(main())
    _said_once(caplog, "guidance-check")
    assert _failures("guidance-check") - before == 1


def test_the_measurement_loop_goes_on_after_a_raise_and_reads_the_nodes_again(monkeypatch, caplog):
    before = _failures("measurement")
    now = [0.0]
    reads: list[tuple[float, str]] = []

    async def read(node: str) -> object:
        reads.append((now[0], node))
        return {"node": {"nodeName": node}, "pods": []}

    async def main() -> None:
        pods = SimpleNamespace(version=1, items={"u1": SimpleNamespace(kata=KataPod(
            "u1", "ns/p1", "kata-p-s", "node-1", 512 * MIB, 400 * MIB, ("c",)))})
        loop = MeasurementLoop(read, pods, clock=Clock(now=lambda: now[0], speed=1e9))
        loop.configure(MeasuredPolicy(name="p", ref={}, classes={"kata-p-s": ("s", 400 * MIB, 350 * MIB)}, interval_s=60.0,
                                      window_s=600.0, threshold=HeadroomThreshold(), threshold_text="10%"), "p")
        publish_due = RaisingOnce(loop._publish_due)
        monkeypatch.setattr(loop, "_publish_due", publish_due)
        task = asyncio.create_task(retry.keep_running("measurement", loop.run))
        await _until(lambda: publish_due.calls)
        raised_at = now[0]

        def tick() -> None:
            now[0] += 1.0

        await _until(lambda: any(at > raised_at for at, _ in reads), step=tick)
        await _stop(task)

    asyncio.run(main())
    _said_once(caplog, "measurement")
    assert _failures("measurement") - before == 1


class Collection:
    """A collection as the API server serves it: a list (one page) and a watch of the events
    queued for it; a watch with nothing queued stays open."""

    def __init__(self, objects: list[dict]) -> None:
        self.objects = objects
        self.lists = 0
        self.events: list[dict] = []

    async def list_page(self, kind, limit, continue_token=None, label_selector=None, field_selector=None):
        self.lists += 1
        return copy.deepcopy(self.objects), str(self.lists), None

    async def watch_raw(self, kind, resource_version, timeout_s, label_selector=None, field_selector=None):
        while not self.events:
            await asyncio.sleep(0.005)
        while self.events:
            yield self.events.pop(0)


def _pod(rv: str, memory: str) -> dict:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": rv},
            "spec": {"memory": memory}}


def test_a_watch_whose_consumer_raises_goes_on_and_tells_the_change_again(caplog):
    before = _failures("pods-informer")

    async def main() -> None:
        api = Collection([_pod("1", "1Gi")])
        told: list[tuple[object, object]] = []
        consumer = RaisingOnce(lambda key, old, new: told.append((old["spec"]["memory"], new["spec"]["memory"])))
        informer = Informer(api, "Pod", slim_child("Pod"), on_change=consumer)
        task = asyncio.create_task(retry.keep_running("pods-informer", informer.run))
        await _until(informer.synced.is_set)
        api.objects = [_pod("2", "2Gi")]  # the edit, as the server holds it and watches say it
        api.events.append({"type": "MODIFIED", "object": _pod("2", "2Gi")})
        await _until(lambda: told)
        await _stop(task)
        assert len(consumer.calls) == 2 and told == [("1Gi", "2Gi")]  # the change, told again after the raise
        assert informer.items["u1"]["spec"] == {"memory": "2Gi"} and api.lists == 2  # from a fresh list

    asyncio.run(main())
    _said_once(caplog, "pods-informer")
    assert _failures("pods-informer") - before == 1


def test_a_policy_event_whose_handling_raises_is_taken_again(monkeypatch, caplog):
    before = _failures(worker.POLICY_WATCH)
    monkeypatch.setattr(worker, "policy_seen", RaisingOnce(worker.policy_seen))

    async def main() -> None:
        state, queue = _state()
        body = _body()
        # kopf hands the handler the policy as a Body and its memo; a dict and a namespace read alike.
        await handlers.policy_event(type=None, body=cast(kopf.Body, body), memo=cast(kopf.Memo, SimpleNamespace(state=state)))
        assert NAME not in state.records and queue.added == []
        await _until(lambda: queue.added)
        assert queue.added == [(NAME, APPLY)] and state.records[NAME].body == body and not state.unseen

    asyncio.run(main())
    _said_once(caplog, worker.POLICY_WATCH)
    assert _failures(worker.POLICY_WATCH) - before == 1


def test_a_newer_policy_event_taken_meanwhile_is_not_undone_by_the_retry(monkeypatch, caplog):
    monkeypatch.setattr(worker, "policy_seen", RaisingOnce(worker.policy_seen))

    async def main() -> None:
        state, queue = _state()
        first, newer = _body(), _body()
        newer["metadata"]["generation"] = 2
        worker.policy_watched(state, None, first)
        worker.policy_watched(state, "MODIFIED", newer)
        await asyncio.sleep(0.3)  # past the retry's back-off (at most 0.2 s)
        assert state.records[NAME].body is newer and queue.added == [(NAME, APPLY)]

    asyncio.run(main())
