"""The measurement at fleet scale on the emulator: 100 nodes x 40 Kata pods served as kubelet
Summaries through the node proxy path. One read per node per interval (the requests of an
interval equal the node count), the operator's measurement state does not grow with readings
(no per-pod history), and a node that answers 500 or never answers is skipped and said in
status without holding up the other 98. `make bench` (bench/measurement_bench.py) gives the
same figures at 500 nodes; the suite keeps to a fifth of that for its time budget."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections import Counter

import pytest

from kata_sizing.controller.kubelet import KubeletOptions
from kata_sizing.controller.measurement import Clock
from tests.support.operator_helpers import status, wait_for, wait_observed
from tests.support.policies import explicit_classes_policy
from tests.support.summaries import MIB, Figures, json_response, kata_pod, node, set_figures, summary

pytestmark = pytest.mark.emulator

NODES, PODS_PER_NODE = 100, 40
SPEED = 6.0  # the 15 s interval takes 2.5 s: 40 Summaries a second through one process's emulator
WINDOW_S = 60  # the shortest window: its six slots fill in 10 s here
INTERVAL_REAL_S = 15 / SPEED
FAILING, SILENT = "fleet-013", "fleet-027"
CLASSES = [{"name": "s", "cpu": "1", "memory": "1Gi"}, {"name": "m", "cpu": "2", "memory": "4Gi"},
           {"name": "l", "cpu": "4", "memory": "16Gi"}, {"name": "xl", "cpu": "16", "memory": "64Gi"}]
LIMITS = {"s": "512Mi", "m": "2Gi", "l": "8Gi", "xl": "32Gi"}


def deep_size(root: object) -> int:
    """Bytes held by `root` and everything only reachable through it (ints, strings and tuples
    shared with the rest of the process counted once, as they are held)."""
    seen, pending, total = set(), [root], 0
    while pending:
        obj = pending.pop()
        if id(obj) in seen or isinstance(obj, (type, type(sys), type(deep_size))):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        pending.extend(gc.get_referents(obj))
    return total


def test_a_hundred_nodes_are_each_read_once_per_interval_with_flat_memory(cluster, monkeypatch):
    from kata_sizing.controller import worker

    monkeypatch.setattr(worker, "GUIDANCE_INTERVAL_S", 1.0)
    emu = cluster.emu
    pods_by_node: dict[str, list[dict]] = {}
    for n in range(NODES):
        name = f"fleet-{n:03d}"
        emu.objects("v1/nodes").create(node(name))
        for i in range(PODS_PER_NODE):
            class_name = CLASSES[i % 4]["name"]
            pods_by_node.setdefault(name, []).append(emu.objects("v1/pods").create(kata_pod(
                f"p{n:03d}-{i:02d}", name, f"kata-qemu-rs-{class_name}", LIMITS[class_name], "400Mi"), "fleet"))
    reads: Counter = Counter()
    arrivals: list[tuple[float, str]] = []  # as the kubelets see them (a request that never ends is never logged)
    documents = {name: summary(name, pods, lambda pod: Figures(200 * MIB, 120 * MIB))
                 for name, pods in pods_by_node.items()}

    async def kubelet(node_name: str, path: str):
        reads[node_name] += 1
        arrivals.append((time.monotonic(), node_name))
        if node_name == FAILING:
            return json_response({"kind": "Status", "code": 500, "message": "kubelet: internal error"}, 500)
        if node_name == SILENT:
            await asyncio.sleep(3600)
        # Figures that change with every read, so the sketches see many values.
        document, turn = documents[node_name], reads[node_name]
        for index, stats in enumerate(document["pods"]):
            set_figures(stats, Figures(200 * MIB, (120 + (index * 7 + turn * 13) % 80) * MIB))
        return json_response(document)

    emu.serve_node_proxy(kubelet)
    cluster.start(kubelet=KubeletOptions(access="apiserver", timeout_s=2), measurement_clock=Clock.faster(SPEED))
    body = explicit_classes_policy(classes=CLASSES)
    body["spec"]["measurement"] = {"intervalSeconds": 15, "windowSeconds": WINDOW_S}
    cluster.create(body)
    wait_observed(emu, "qemu-rs", timeout=60, Ready="True")
    loop = cluster.memo.state.measurement

    # Wait for a whole interval of reads, then for the window to fill (every slot holds readings:
    # the state is at its size; a loop running late while the operator started catches up by
    # then), then count the next two intervals.
    wait_for(lambda: len(set(reads)) == NODES, 60, lambda: f"{len(set(reads))} nodes read")
    time.sleep(WINDOW_S / SPEED)
    state_after_one = (deep_size(loop.state), sum(w.buckets() for w in loop.state.windows.values()))
    start = time.monotonic()
    time.sleep(2 * INTERVAL_REAL_S)
    end = time.monotonic()
    state_later = (deep_size(loop.state), sum(w.buckets() for w in loop.state.windows.values()))
    window = [name for at, name in list(arrivals) if start <= at < end]
    per_node = Counter(window)
    # Each node once per interval: exactly 2 reads in two intervals, give or take the one read a
    # late loop pushes across the window's edge.
    assert NODES * 2 - 4 <= len(window) <= NODES * 2 + 4, len(window)
    assert set(per_node.values()) <= {1, 2, 3}, Counter(per_node.values())
    by_node: dict[str, list[float]] = {}
    for at, name in list(arrivals):
        by_node.setdefault(name, []).append(at)
    closest = min(b - a for times in by_node.values() for a, b in zip(times, times[1:]))
    assert closest > 0.5 * INTERVAL_REAL_S, f"a node read twice within {closest:.2f}s"
    # The silent node times out on every turn, and the other nodes are read on time all the same.
    assert per_node[SILENT] >= 1 and per_node[FAILING] >= 1

    # Memory: sketches and per-node counters only, whatever the readings (no per-pod history):
    # after 200 more Summaries of 40 pods the state holds what it held.
    assert state_later[1] <= state_after_one[1] + 4 * 6 * 20, (state_after_one, state_later)
    assert state_later[0] < state_after_one[0] * 1.25, (state_after_one, state_later)
    assert state_later[0] < 400_000, f"the state of 100 nodes x 40 pods holds {state_later[0]} bytes"
    assert len(loop.state.nodes) == NODES and len(loop.next_due) == NODES

    def said() -> dict | None:
        section = status(emu, "qemu-rs").get("measurement") or {}
        return section if section.get("nodesSkipped") == 2 else None

    section = wait_for(said, 30, lambda: repr((status(emu, "qemu-rs").get("measurement") or {}).get("skipped")))
    assert section["nodes"] == NODES
    skipped = {s["node"]: s["reason"] for s in section["skipped"]}
    assert set(skipped) == {FAILING, SILENT}
    assert "kubelet: internal error" in skipped[FAILING]
    assert "Timeout" in skipped[SILENT] or "timeout" in skipped[SILENT], skipped[SILENT]
    measured = {c["name"]: c["podsMeasured"] for c in section["classes"]}
    assert measured == {name: (NODES - 2) * PODS_PER_NODE // 4 for name in ("s", "m", "l", "xl")}
    s = next(c for c in section["classes"] if c["name"] == "s")
    assert 120 * MIB <= s["overheadP50Bytes"] <= 200 * MIB and s["overheadMaxBytes"] <= 200 * MIB
