"""Node guidance at fleet scale: 500 nodes and 20,000 pods.

In-process: from generated Node and Pod objects to the rendered guidance ConfigMap (the
same functions the operator's indexes and timer call). Against the emulator: the real
operator subprocess indexes them through watches; we time a recompute after one pod
changes and count its API calls.
"""

from __future__ import annotations

import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.operator_bench import operator_process, wait_until  # noqa: E402
from kata_sizing.controller.cluster import facts_for_nodes, summarize_node, summarize_pod  # noqa: E402
from kata_sizing.core.model import parse_policy  # noqa: E402
from kata_sizing.core.render import render_policy  # noqa: E402

NODES = 500
PODS = 20_000
KATA_LABEL = {"katacontainers.io/kata-runtime": "true"}


def make_nodes(count: int) -> list[dict]:
    shapes = [("256Gi", "64", "248Gi"), ("512Gi", "128", "504Gi"), ("128Gi", "32", "121Gi")]
    nodes = []
    for i in range(count):
        capacity, cpu, allocatable = shapes[i % len(shapes)]
        nodes.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"node-{i:04d}", "labels": dict(KATA_LABEL)},
            "status": {"capacity": {"memory": capacity, "cpu": cpu},
                       "allocatable": {"memory": allocatable, "cpu": cpu}},
        })
    return nodes


def make_pods(count: int, nodes: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    pods = []
    for i in range(count):
        kata = rng.random() < 0.7
        spec = {
            "nodeName": f"node-{rng.randrange(nodes):04d}",
            "containers": [{"name": "app", "image": "app",
                            "resources": {"requests": {"memory": f"{rng.choice([64, 128, 256, 512])}Mi"}}}],
        }
        if kata:
            spec["runtimeClassName"] = "kata-fleet-m"
        if rng.random() < 0.1:
            spec["initContainers"] = [{"name": "init", "image": "init",
                                       "resources": {"requests": {"memory": "1Gi"}}}]
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"pod-{i:05d}", "namespace": f"ns-{i % 50}"},
                     "spec": spec, "status": {"phase": "Running"}})
    return pods


FLEET_POLICY = {
    "apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy",
    "metadata": {"name": "fleet"}, "spec": {"shim": "qemu-runtime-rs"},
}


def bench_guidance(report: Callable[[str, str, str, str], None], quick: bool = False) -> None:
    nodes, pods = make_nodes(NODES), make_pods(PODS, NODES)
    policy = parse_policy(FLEET_POLICY)

    runs = []
    for _ in range(5):
        start = time.perf_counter()
        summaries = [summarize_node(n) for n in nodes]
        by_node: dict[str, list] = {}
        for pod in pods:
            found = summarize_pod(pod)
            if found and found.node:
                by_node.setdefault(found.node, []).append(found)
        facts = facts_for_nodes(summaries, by_node, KATA_LABEL, {"kata-fleet-m"})
        rendered = render_policy(policy, nodes=facts)
        runs.append(time.perf_counter() - start)
    guidance = rendered.configmaps[-1]
    size = sum(len(v) for v in guidance["data"].values())
    report(f"guidance, in-process, {NODES} nodes + {PODS} pods (from raw objects)",
           f"{statistics.median(runs) * 1000:.0f} ms", "< 2 s", "PASS" if statistics.median(runs) < 2 else "MISS")

    recompute = []
    for _ in range(5):
        start = time.perf_counter()
        facts = facts_for_nodes(summaries, by_node, KATA_LABEL, {"kata-fleet-m"})
        render_policy(policy, nodes=facts)
        recompute.append(time.perf_counter() - start)
    report("guidance recompute from the indexes (what the operator's timer does)",
           f"{statistics.median(recompute) * 1000:.0f} ms", "", "")
    report("guidance ConfigMap size", f"{size / 1024:.0f} KiB", "< 1 MiB", "PASS" if size < 1024 * 1024 else "MISS")
    if quick:
        return

    work = Path(tempfile.mkdtemp(prefix="kata-sizing-guidance-"))
    try:
        from tests.support.harness import running_emulator

        with running_emulator(work) as emu:
            for node in nodes:
                emu.objects("nodes").create(node)
            for pod in pods:
                emu.objects("pods").create(pod)
            start = time.perf_counter()
            with operator_process(emu.kubeconfig, work / "operator.log", KATA_SIZING_GUIDANCE_SECONDS="1"):
                emu.objects("katasizingpolicies").create(FLEET_POLICY)

                def guidance_written() -> bool:
                    return emu.objects("configmaps").get("fleet-node-guidance", "kata-sizing") is not None

                took = wait_until(guidance_written, 120, 0.05)
                report("operator start (indexing 500 nodes + 20,000 pods) -> guidance written",
                       f"{time.perf_counter() - start:.1f} s" if took is not None else "not written", "", "")
                before = emu.objects("configmaps").get("fleet-node-guidance", "kata-sizing")["metadata"]["resourceVersion"]
                time.sleep(3)
                emu.reset_request_log()
                start = time.perf_counter()
                emu.objects("pods").create({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "new-infra", "namespace": "kube-system"},
                    "spec": {"nodeName": "node-0000", "containers": [
                        {"name": "c", "image": "c", "resources": {"requests": {"memory": "64Gi"}}}]},
                })
                current = emu.objects("configmaps").get

                def updated() -> bool:
                    cm = current("fleet-node-guidance", "kata-sizing")
                    return cm["metadata"]["resourceVersion"] != before

                took = wait_until(updated, 30, 0.01)
                time.sleep(1.5)
                calls = [r for r in emu.request_log if not r.is_watch]
                report("one infra pod added -> guidance rewritten (debounce interval 1 s)",
                       f"{time.perf_counter() - start - 1.5:.2f} s" if took is not None else "not rewritten", "", "")
                kinds = sorted({r.method + " " + r.path.rsplit("/", 1)[-1] for r in calls})
                report("API calls for that recompute (not counting watches)", str(len(calls)), "", "")
                report("  of which", ", ".join(kinds), "", "")
                emu.reset_request_log()
                time.sleep(3)
                idle = [r for r in emu.request_log if not r.is_watch]
                report("API calls in 3 s with nothing changing (3 debounce ticks)", str(len(idle)), "0",
                       "PASS" if not idle else "MISS")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    def report(what: str, figure: str, target: str, verdict: str) -> None:
        print(f"{what:<70} {figure:>14} {target:>10} {verdict}")

    bench_guidance(report, quick="--quick" in sys.argv)


if __name__ == "__main__":
    main()
