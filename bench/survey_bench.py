"""`make bench`, section survey: `kata-sizing survey` of a real cluster's saved pod list
(`kubectl get pods -A -o yaml`, about 4 KiB a pod, read a pod at a time: core/podlist.py), as a
user runs it: the command's wall time and its peak memory (docs/inputs.md)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tests.support.summaries import MIB, Figures, summary, write_pod_list

PEAK_TARGET_MIB = 256  # the operator chart's memory limit: the CLI stays well within what a pod gets
POLICY = {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy", "metadata": {"name": "qemu-rs"},
          "spec": {"shim": "qemu-runtime-rs", "classes": [{"name": "s", "cpu": "1", "memory": "1Gi"}]}}


def _survey(work: Path, pods: int, kata_every: int) -> tuple[float, float, int]:
    kata = write_pod_list(work / "pods.yaml", pods, kata_every, 50, "kata-qemu-rs-s")
    (work / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    argv = [str(Path(sys.executable).parent / "kata-sizing"), "survey", str(work / "policy.yaml"),
            "--pods", str(work / "pods.yaml")]
    for node in sorted({p["spec"]["nodeName"] for p in kata}):
        (work / f"{node}.json").write_text(json.dumps(summary(
            node, [p for p in kata if p["spec"]["nodeName"] == node], lambda _: Figures(100 * MIB, 60 * MIB))))
        argv += ["--summary", str(work / f"{node}.json")]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    took = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    rows = sum(1 for line in done.stdout.splitlines() if line and not line.startswith(("#", "node,")))
    return took, peak_mib, rows


def bench_survey(report, quick: bool = False) -> None:
    for kata_every, share in ((100, "1%"), (5, "20%")):
        with tempfile.TemporaryDirectory() as work:
            took, peak, rows = _survey(Path(work), 20_000, kata_every)
            size = (Path(work) / "pods.yaml").stat().st_size
            report(f"survey of a 20,000-pod list (~{size / MIB:.0f} MiB), {share} of the policy's class ({rows} rows)",
                   f"{took:.1f} s, peak RSS {peak:.0f} MiB", f"peak < {PEAK_TARGET_MIB} MiB",
                   "PASS" if peak < PEAK_TARGET_MIB else "MISS")
        if quick:
            break
