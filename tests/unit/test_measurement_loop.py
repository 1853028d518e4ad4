"""The measurement loop's schedule (controller/measurement.py) with a clock the test moves: each
node once per interval at a phase hashed from its name (the fleet's reads spread over the
interval), never two reads of a node within half an interval even when the loop runs late, and
a node that never answers holds up no other."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from kata_sizing.controller.measurement import Clock, MeasuredPolicy, MeasurementLoop, next_turn, phase_s
from kata_sizing.core.headroom import HeadroomThreshold
from kata_sizing.core.measure import KataPod
from kata_sizing.core.statusmodel import MeasurementStatus

MIB = 2**20
INTERVAL_S = 60.0


@dataclass(frozen=True)
class Request:
    kata: KataPod


class Pods:
    def __init__(self, nodes: int):
        self.items = {f"u{n}": Request(KataPod(f"u{n}", f"ns/p{n}", "kata-p-s", f"node-{n:03d}", 512 * MIB,
                                               400 * MIB, ("c",))) for n in range(nodes)}
        self.version = 1


def summary(node: str) -> dict:
    n = int(node.split("-")[1])
    return {"node": {"nodeName": node}, "pods": [{
        "podRef": {"name": f"p{n}", "namespace": "ns", "uid": f"u{n}"},
        "memory": {"time": "2026-12-03T10:00:00Z", "workingSetBytes": 300 * MIB},
        "containers": [{"name": "c", "startTime": "2026-12-03T09:00:00Z", "memory": {"workingSetBytes": 200 * MIB}}],
    }]}


def policy() -> MeasuredPolicy:
    return MeasuredPolicy(name="p", ref={}, classes={"kata-p-s": ("s", 400 * MIB, 350 * MIB)}, interval_s=INTERVAL_S,
                          window_s=600.0, threshold=HeadroomThreshold(), threshold_text="10%")


def run(nodes: int, until_s: float, step_s: float = 0.25, stall_at: float | None = None, stall_s: float = 0.0,
        hang: frozenset[str] = frozenset()) -> list[tuple[float, str]]:
    """Run the loop on a fake clock from 0 to `until_s`; the loop may be kept from running for
    `stall_s` seconds from `stall_at` (an operator busy elsewhere). Returns (time, node) of each read."""
    now = [0.0]
    reads: list[tuple[float, str]] = []

    async def read(node: str) -> object:
        reads.append((now[0], node))
        if node in hang:
            await asyncio.Event().wait()
        return summary(node)

    async def main() -> None:
        loop = MeasurementLoop(read, Pods(nodes), clock=Clock(now=lambda: now[0], speed=1e9), read_slots=4)
        loop.configure(policy(), "p")
        task = asyncio.create_task(loop.run())
        while now[0] < until_s:
            if stall_at is not None and stall_at <= now[0] < stall_at + stall_s:
                now[0] += stall_s  # the clock moves on while the loop does not run
            now[0] += step_s
            for _ in range(20):
                await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert loop.reads_ok >= 0

    asyncio.run(main())
    return reads


def test_each_node_is_read_once_per_interval_at_its_phase():
    reads = run(120, 5 * INTERVAL_S)
    for k in range(1, 4):
        window = Counter(node for at, node in reads if k * INTERVAL_S <= at < (k + 1) * INTERVAL_S)
        assert len(window) == 120 and set(window.values()) == {1}, Counter(window.values())
    # Spread over the interval: no second holds more than a few of the 120 (2 a second on average).
    per_second = Counter(int(at) for at, _ in reads if INTERVAL_S <= at < 4 * INTERVAL_S)
    assert max(per_second.values()) <= 8, per_second.most_common(3)
    first = {node: at for at, node in reversed(reads)}
    assert all(abs(first[node] - next_turn(node, INTERVAL_S, 0.0)) <= 0.5 for node in first)


def test_a_late_loop_reads_late_once_and_never_twice_within_half_an_interval():
    reads = run(120, 6 * INTERVAL_S, stall_at=100.0, stall_s=45.0)
    by_node: dict[str, list[float]] = {}
    for at, node in reads:
        by_node.setdefault(node, []).append(at)
    gaps = [b - a for times in by_node.values() for a, b in zip(times, times[1:])]
    assert min(gaps) >= INTERVAL_S / 2, min(gaps)
    # After the stall, back to one read per node per interval.
    window = Counter(node for at, node in reads if 4 * INTERVAL_S <= at < 5 * INTERVAL_S)
    assert len(window) == 120 and set(window.values()) == {1}


def test_a_node_that_never_answers_holds_up_no_other():
    hung = {"node-007"}
    reads = run(40, 4 * INTERVAL_S, hang=hung)
    window = Counter(node for at, node in reads if 2 * INTERVAL_S <= at < 3 * INTERVAL_S)
    assert set(window) == {f"node-{n:03d}" for n in range(40)} - hung
    assert set(window.values()) == {1}
    # Its one read is still waiting (the kubelet timeout ends it in real use): no second one starts.
    assert [node for _, node in reads].count("node-007") == 1


def test_phases_are_stable_and_within_the_interval():
    assert phase_s("node-001", 60.0) == phase_s("node-001", 60.0)
    assert all(0 <= phase_s(f"n{i}", 60.0) < 60.0 for i in range(1000))
    assert next_turn("node-001", 60.0, 125.0) >= 125.0 and next_turn("node-001", 60.0, 125.0) < 185.0


def test_a_new_leader_keeps_the_status_until_it_has_read_and_an_unmeasured_policy_has_none():
    now = [0.0]

    async def read(node: str) -> object:
        return summary(node)

    async def main() -> tuple:
        loop = MeasurementLoop(read, Pods(3), clock=Clock(now=lambda: now[0], speed=1e9), read_slots=4)
        loop.configure(policy(), "p")
        kept = MeasurementStatus(interval_seconds=60, window_seconds=600, nodes=3)  # the last leader's
        before = loop.report("p", kept)  # nothing read yet: the status keeps what it holds
        task = asyncio.create_task(loop.run())
        for _ in range(int(INTERVAL_S / 0.25) + 4):
            now[0] += 0.25
            for _ in range(20):
                await asyncio.sleep(0)
        measured = loop.report("p")
        loop.forget()  # another replica leads, then this one again: its window starts empty
        again = loop.report("p", measured)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return kept, before, measured, again, loop.report("other", kept)

    kept, before, measured, again, other = asyncio.run(main())
    assert before is kept and again is measured
    assert measured.nodes == 3 and measured.classes[0].pods_measured == 3
    assert other is None  # not measured: status.measurement is removed


def test_the_loop_stops_when_cancelled_as_a_policy_is_forgotten():
    """At shutdown a deleted policy is forgotten (which wakes the loop) just as the loop is
    cancelled: with asyncio.wait_for, Python 3.11 lost that cancellation and the loop ran on, so
    the operator's cleanup waited until the kubelet killed it."""

    async def read(node: str) -> object:
        return summary(node)

    async def main() -> bool:
        loop = MeasurementLoop(read, Pods(0))
        loop.configure(policy(), "p")
        task = asyncio.create_task(loop.run())
        await asyncio.sleep(0.05)  # the loop waits to be woken
        loop.configure(None, "p")
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=3)
        return task in done

    assert asyncio.run(main())


def _low_summary(node: str) -> dict:
    """node's pod at 910 MiB of its 912 MiB cgroup: 2 MiB of headroom, under its warning line (10% of the
    50 MiB its 400 MiB podFixed holds beyond the 350 MiB guest budget: 5 MiB)."""
    found = summary(node)
    found["pods"][0]["memory"]["workingSetBytes"] = 910 * MIB
    return found


async def _intervals(now: list[float], count: int) -> None:
    for _ in range(int(count * INTERVAL_S / 0.25) + 4):
        now[0] += 0.25
        for _ in range(20):
            await asyncio.sleep(0)


def test_a_policy_no_longer_measured_is_forgotten_whole_and_comes_back_as_new():
    now = [0.0]
    posted: list[str] = []

    async def read(node: str) -> object:
        return _low_summary(node)

    async def main() -> None:
        loop = MeasurementLoop(read, Pods(1), events=lambda ref, type_, reason, message: posted.append(reason),
                               clock=Clock(now=lambda: now[0], speed=1e9))
        loop.configure(policy(), "p")
        task = asyncio.create_task(loop.run())
        await _intervals(now, 1)
        assert posted == ["HeadroomLow"] and loop.version("p") > 0
        loop.configure(None, "p")
        assert (loop.measures("p"), loop.version("p"), loop.report("p")) == (False, 0, None)
        loop.configure(policy(), "p")
        await _intervals(now, 1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        # Nothing of before was kept: the pod still under its threshold is news again.
        assert posted == ["HeadroomLow", "HeadroomLow"]

    asyncio.run(main())


def _nodes(report: MeasurementStatus | None) -> int:
    assert report is not None
    return report.nodes


def test_a_policy_with_nothing_measured_publishes_its_empty_report_once_not_every_interval():
    """The version a status is written by moves once per interval while the policy has pods to
    measure, and once more when they are gone (the empty report is news), then not again: a
    policy without Kata pods cost the guidance check a report every interval."""
    now = [0.0]

    async def read(node: str) -> object:
        return summary(node)

    async def main() -> list[tuple[int, int]]:
        pods = Pods(2)
        loop = MeasurementLoop(read, pods, clock=Clock(now=lambda: now[0], speed=1e9))
        loop.configure(policy(), "p")
        task = asyncio.create_task(loop.run())
        seen = []
        for _ in range(3):
            await _intervals(now, 1)
            seen.append((loop.version("p"), _nodes(loop.report("p"))))
        pods.items.clear()  # the pods are gone, and so are their nodes and readings
        pods.version += 1
        for _ in range(14):
            await _intervals(now, 1)
            seen.append((loop.version("p"), _nodes(loop.report("p"))))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return seen

    seen = asyncio.run(main())
    measured, gone = seen[:3], seen[3:]
    assert [nodes for _, nodes in measured] == [2, 2, 2]
    assert measured[0][0] < measured[1][0] < measured[2][0]  # a new report each interval
    assert all(nodes == 0 for _, nodes in gone)
    # The window holds the pods' samples for up to window_s (600 s): the report moves until it is
    # empty, is published empty once, and then stays.
    versions = [version for version, _ in gone]
    assert versions[0] > measured[2][0]
    assert versions[8] > versions[7]
    assert versions[11:] == [versions[11]] * 3


def test_a_policy_that_never_had_pods_keeps_the_version_its_first_pass_wrote():
    """Its first pass wrote the empty report; nothing after it would write another."""
    now = [0.0]

    async def read(node: str) -> object:
        return summary(node)

    async def main() -> list[int]:
        loop = MeasurementLoop(read, Pods(0), clock=Clock(now=lambda: now[0], speed=1e9))
        loop.configure(policy(), "p")
        task = asyncio.create_task(loop.run())
        seen = []
        for _ in range(4):
            await _intervals(now, 1)
            seen.append(loop.version("p"))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return seen

    assert asyncio.run(main()) == [0, 0, 0, 0]


def _measured(name: str, classes: list[str], window_s: float = 600.0) -> MeasuredPolicy:
    return MeasuredPolicy(name=name, ref={}, classes={c: (c[-1], 400 * MIB, 350 * MIB) for c in classes},
                          interval_s=INTERVAL_S, window_s=window_s, threshold=HeadroomThreshold(), threshold_text="10%")


def test_the_class_table_kept_policy_by_policy_is_the_one_built_whole():
    """configure updates the table by the one policy that changed; with two policies naming one
    class (for a while, until the second is refused) it is the table built from every policy in
    order, the last naming a class owning it, as before."""
    steps = [
        ("a", ["a-s", "a-m"]), ("b", ["b-s"]), ("a", ["a-s", "a-l"]), ("c", ["c-s", "b-s"]),  # c names b's class
        ("b", None), ("c", ["c-s"]), ("b", ["b-s", "b-m"]), ("a", None), ("d", ["d-s"]),
    ]
    loop = MeasurementLoop(lambda node: None, Pods(0))
    for step, (name, classes) in enumerate(steps):
        loop.configure(_measured(name, classes, window_s=60.0 * (step + 1)) if classes else None, name)
        whole: tuple[dict, dict, dict] = ({}, {}, {})
        for measured in loop.policies():
            for runtime_class, (_, pod_fixed, guest_budget) in measured.classes.items():
                whole[0][runtime_class] = measured.window_s
                whole[1][runtime_class] = (measured.threshold, pod_fixed, guest_budget)
                whole[2][runtime_class] = measured.name
        assert loop._table == whole, f"after step {step}: {name} {classes}"
