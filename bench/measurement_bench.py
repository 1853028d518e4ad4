"""The measurement (docs/measurement.md) at fleet scale: 500 nodes x 40 Kata pods.

- in process: one pass over 500 Summaries (JSON parse, the arithmetic, the class windows), and
  the size of what the state keeps after ten passes;
- the real `kata-sizing operator` subprocess against the emulator, which serves each node's
  Summary on the API server's node proxy path (`--kubelet-access apiserver`): Summaries
  requested per interval (the goal: the node count), the operator's CPU per interval, its RSS
  after one interval and after three (flat: no per-pod history), and its peak RSS against the
  same fleet with the measurement switched off.

Nothing here asserts; each figure is printed with its target.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.operator_bench import operator_process, peak_rss_mib, policy, policy_ready, wait_until  # noqa: E402
from tests.support.harness import running_emulator  # noqa: E402
from tests.support.summaries import MIB, Figures, json_response, kata_pod, node, set_figures, summary  # noqa: E402

Report = Callable[[str, str, str, str], None]
NODES, PODS_PER_NODE = 500, 40
INTERVAL_S = 15  # the least a policy may ask for (defaults.MEASUREMENT_MIN_INTERVAL_S)
CLASSES = ("s", "m", "l", "xl")
LIMITS = {"s": "512Mi", "m": "2Gi", "l": "8Gi", "xl": "32Gi"}


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _fleet_pods() -> dict[str, list[dict]]:
    pods: dict[str, list[dict]] = {}
    for n in range(NODES):
        name = f"fleet-{n:03d}"
        for i in range(PODS_PER_NODE):
            class_name = CLASSES[i % 4]
            pods.setdefault(name, []).append(kata_pod(
                f"p{n:03d}-{i:02d}", name, f"kata-bench-{class_name}", LIMITS[class_name], "400Mi",
                uid=f"{n:03d}-{i:02d}"))
    return pods


def _deep_size(root: object) -> int:
    seen, pending, total = set(), [root], 0
    while pending:
        obj = pending.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        pending.extend(gc.get_referents(obj))
    return total


def in_process(report: Report) -> None:
    from kata_sizing.core import bounded
    from kata_sizing.core.headroom import HeadroomThreshold
    from kata_sizing.core.measure import MeasurementState, read_summary
    from kata_sizing.core.measure import kata_pod as measured_pod

    pods = _fleet_pods()
    bodies = {name: json.dumps(summary(name, on_node, lambda p: Figures(200 * MIB, 150 * MIB))).encode()
              for name, on_node in pods.items()}
    kata = {name: {p["metadata"]["uid"]: measured_pod(p, None) for p in on_node} for name, on_node in pods.items()}
    windows = {f"kata-bench-{c}": 3600.0 for c in CLASSES}
    thresholds = {c: (HeadroomThreshold(), 400 * MIB, 350 * MIB) for c in windows}
    state = MeasurementState()
    passes = []
    for turn in range(10):
        start = time.perf_counter()
        for name, body in bodies.items():
            document = bounded.load_json(body, name, walk=False)
            state.add_reading(read_summary(document, name, kata[name], ()), 1000.0 + 60 * turn, windows, thresholds)
        passes.append(time.perf_counter() - start)
    best = min(passes)
    report(f"one pass in process: {NODES} Summaries x {PODS_PER_NODE} pods parsed and aggregated",
           f"{best * 1000:.0f} ms", "", "")
    report("... per pod", f"{best / (NODES * PODS_PER_NODE) * 1e6:.1f} us", "", "")
    report(f"Summary size ({PODS_PER_NODE} pods, the kubelet's fields)", f"{len(next(iter(bodies.values()))) / 1024:.0f} KiB",
           "", "")
    report("what the state keeps after 10 passes (20,000 pods each)", f"{_deep_size(state) / 1024:.0f} KiB", "", "")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def operator_fleet(report: Report, work: Path, enabled: bool) -> dict:
    pods = _fleet_pods()
    with running_emulator(work) as emu:
        stored: dict[str, list[dict]] = {}
        for name, on_node in pods.items():
            emu.objects("v1/nodes").create(node(name))
            for pod in on_node:
                body = dict(pod, metadata={k: v for k, v in pod["metadata"].items() if k != "uid"})
                stored.setdefault(name, []).append(emu.objects("v1/pods").create(body, "fleet"))
        documents = {name: summary(name, on_node, lambda p: Figures(200 * MIB, 150 * MIB))
                     for name, on_node in stored.items()}
        arrivals: list[tuple[float, str]] = []

        async def kubelet(node_name: str, path: str):
            arrivals.append((time.monotonic(), node_name))
            document = documents[node_name]
            turn = len(arrivals)
            for index, stats in enumerate(document["pods"]):
                set_figures(stats, Figures(200 * MIB, (120 + (index * 7 + turn) % 80) * MIB))
            return json_response(document)

        emu.serve_node_proxy(kubelet)
        body = policy("bench")
        body["spec"]["measurement"] = {"enabled": enabled, "intervalSeconds": INTERVAL_S, "windowSeconds": 300}
        emu.objects("katasizingpolicies").create(body)
        figures: dict = {}
        with operator_process(emu.kubeconfig, work / "measurement.log", "--kubelet-access", "apiserver",
                              KATA_SIZING_GUIDANCE_SECONDS="10") as proc:
            if wait_until(lambda: policy_ready(emu, "bench"), 600, 0.2) is None:
                raise RuntimeError("the policy did not become Ready in 600 s")
            if enabled:
                if wait_until(lambda: len({n for _, n in arrivals}) == NODES, 4 * INTERVAL_S, 0.2) is None:
                    raise RuntimeError(f"{len({n for _, n in arrivals})} of {NODES} nodes read in {4 * INTERVAL_S} s")
            else:
                time.sleep(INTERVAL_S)
            rss_one = _rss_mib(proc.pid)
            cpu_start, start = _cpu_seconds(proc.pid), time.monotonic()
            time.sleep(3 * INTERVAL_S)
            cpu = _cpu_seconds(proc.pid) - cpu_start
            end = time.monotonic()
            window = Counter(n for at, n in list(arrivals) if start <= at < end)
            figures.update(requests=sum(window.values()) / 3, nodes=len(window), cpu=cpu / 3,
                           rss_one=rss_one, rss_three=_rss_mib(proc.pid), peak=peak_rss_mib(proc))
            status = (emu.objects("katasizingpolicies").get("bench") or {}).get("status") or {}
            figures["measured"] = sum(c.get("podsMeasured", 0) for c in (status.get("measurement") or {}).get("classes", []))
    return figures


def bench_measurement(report: Report, quick: bool = False) -> None:
    in_process(report)
    with tempfile.TemporaryDirectory(prefix="kata-sizing-measure-") as directory:
        on = operator_fleet(report, Path(directory), enabled=True)
        report(f"Summaries requested per {INTERVAL_S} s interval, {NODES} nodes x {PODS_PER_NODE} Kata pods",
               f"{on['requests']:.0f}", f"= {NODES}", _verdict(abs(on["requests"] - NODES) <= NODES * 0.02))
        report("pods in status.measurement (podsMeasured)", f"{on['measured']}", f"= {NODES * PODS_PER_NODE}",
               _verdict(on["measured"] == NODES * PODS_PER_NODE))
        report(f"operator CPU per interval (the pass over {NODES} nodes)", f"{on['cpu']:.2f} s",
               f"< {INTERVAL_S} s", _verdict(on["cpu"] < INTERVAL_S))
        report("operator RSS after 1 interval -> after 4", f"{on['rss_one']:.0f} -> {on['rss_three']:.0f} MiB",
               "flat", _verdict(on["rss_three"] - on["rss_one"] < 10))
        off = operator_fleet(report, Path(directory), enabled=False)
        report("operator peak RSS, measurement on / off", f"{on['peak']:.0f} / {off['peak']:.0f} MiB", "< 256 MiB",
               _verdict(on["peak"] < 256))
