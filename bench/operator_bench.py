"""Operator figures, measured against the Kubernetes API emulator.

The emulator runs in this process (its own thread); the operator runs as the real
`kata-sizing operator --standalone` subprocess pointed at it by a kubeconfig, so its RSS
is its own. Every figure is printed; nothing here asserts.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.harness import running_emulator  # noqa: E402

CLASSES = 4
CONFIGMAPS = 2  # values overlay and drop-ins; node guidance is a third when nodes exist
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def policy(name: str, memory: str = "1Gi") -> dict:
    return {
        "apiVersion": "katasizing.dev/v1alpha1",
        "kind": "KataSizingPolicy",
        "metadata": {"name": name},
        "spec": {
            "shim": "qemu-runtime-rs",
            "classes": [
                {"name": "s", "cpu": "1", "memory": memory},
                {"name": "m", "cpu": "2", "memory": "4Gi"},
                {"name": "l", "cpu": "4", "memory": "16Gi"},
                {"name": "xl", "cpu": "16", "memory": "64Gi"},
            ],
        },
    }


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.002) -> float | None:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if predicate():
            return time.perf_counter() - start
        time.sleep(step)
    return None


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def operator_process(kubeconfig: Path, log_path: Path, *args: str, **env_overrides: str) -> Iterator[subprocess.Popen]:
    port = free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), **env_overrides}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [str(ROOT / ".venv/bin/kata-sizing"), "operator", "--standalone",
             "--liveness", f"http://127.0.0.1:{port}/healthz", *args],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=0.5) as response:
                    return response.status == 200
            except OSError:
                return False

        if wait_until(healthy, 30, 0.05) is None:
            raise RuntimeError(f"the operator did not become healthy; see {log_path}")
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def peak_rss_mib(proc: subprocess.Popen) -> float | None:
    try:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def objects_ready(emu, name: str, configmaps: int = CONFIGMAPS) -> bool:
    rcs = emu.objects("runtimeclasses").list(label_selector=f"katasizing.dev/policy={name}")
    cms = emu.objects("configmaps").list(namespace="kata-sizing", label_selector=f"katasizing.dev/policy={name}")
    return len(rcs) == CLASSES and len(cms) >= configmaps


def policy_ready(emu, name: str) -> bool:
    body = emu.objects("katasizingpolicies").get(name) or {}
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def writes(emu) -> list:
    return [r for r in emu.request_log if r.method in WRITE_METHODS]


def bench_operator(report: Callable[[str, str, str, str], None], quick: bool = False) -> None:
    work = Path(tempfile.mkdtemp(prefix="kata-sizing-bench-"))
    log_path = work / "operator.log"
    samples = 10 if quick else 30
    idle_s = 20 if quick else 60
    cold_policies = 50 if quick else 200
    try:
        with running_emulator(work) as emu:
            with operator_process(
                emu.kubeconfig, log_path, KATA_SIZING_RESYNC_SECONDS="10", KATA_SIZING_GUIDANCE_SECONDS="10",
            ) as proc:
                created = []
                for i in range(samples):
                    name = f"lat-{i}"
                    start = time.perf_counter()
                    emu.objects("katasizingpolicies").create(policy(name))
                    took = wait_until(lambda: objects_ready(emu, name), 10)
                    if took is not None:
                        created.append(time.perf_counter() - start)
                report("policy created -> all objects written, median", f"{statistics.median(created) * 1000:.0f} ms",
                       "< 300 ms", _verdict(statistics.median(created) < 0.3))
                report("policy created -> all objects written, p95", f"{percentile(created, 0.95) * 1000:.0f} ms",
                       "", "")

                restored = []
                for i in range(samples):
                    name = f"kata-lat-{i % samples}-m"
                    rc = emu.objects("runtimeclasses").get(name)
                    rc["overhead"]["podFixed"]["memory"] = "1Mi"
                    start = time.perf_counter()
                    emu.objects("runtimeclasses").put(rc)
                    took = wait_until(
                        lambda: emu.objects("runtimeclasses").get(name)["overhead"]["podFixed"]["memory"] != "1Mi", 5)
                    if took is not None:
                        restored.append(time.perf_counter() - start)
                    time.sleep(0.02)
                report("hand edit -> restored, median", f"{statistics.median(restored) * 1000:.0f} ms", "", "")
                report("hand edit -> restored, p95", f"{percentile(restored, 0.95) * 1000:.0f} ms", "< 1 s",
                       _verdict(percentile(restored, 0.95) < 1.0))
                report("hand edits not restored", f"{samples - len(restored)} of {samples}", "0",
                       _verdict(len(restored) == samples))

                for i in range(samples, 50):
                    emu.objects("katasizingpolicies").create(policy(f"lat-{i}"))
                wait_until(lambda: all(policy_ready(emu, f"lat-{i}") for i in range(50)), 60, 0.1)
                time.sleep(2)
                emu.reset_request_log()
                time.sleep(idle_s)
                idle_writes = writes(emu)
                reads = [r for r in emu.request_log if r.method == "GET" and not r.is_watch]
                report(f"write calls in {idle_s} s of idle resyncs (50 policies, resync every 10 s)",
                       str(len(idle_writes)), "0", _verdict(not idle_writes))
                report(f"read calls in those {idle_s} s", str(len(reads)), "", "")
                rss_after_latency = peak_rss_mib(proc)
            for name in emu.objects("katasizingpolicies").names():
                emu.objects("katasizingpolicies").delete(name, force=True)
            for name in emu.objects("runtimeclasses").names():
                emu.objects("runtimeclasses").delete(name, force=True)
            for name in emu.objects("configmaps").names("kata-sizing"):
                emu.objects("configmaps").delete(name, "kata-sizing", force=True)

            for i in range(cold_policies):
                emu.objects("katasizingpolicies").create(policy(f"cold-{i}"))
            start = time.perf_counter()
            with operator_process(emu.kubeconfig, log_path) as proc:
                took = wait_until(
                    lambda: len(emu.objects("runtimeclasses")) >= cold_policies * CLASSES
                    and all(policy_ready(emu, f"cold-{i}") for i in range(cold_policies)),
                    300, 0.1,
                )
                total = time.perf_counter() - start
                report(f"cold start: {cold_policies} policies x {CLASSES} classes reconciled",
                       f"{total:.1f} s" if took is not None else "not finished in 300 s",
                       "< 30 s" if cold_policies == 200 else "", _verdict(took is not None and total < 30)
                       if cold_policies == 200 else "")
                rss = max(filter(None, [peak_rss_mib(proc), rss_after_latency]))
                report("operator peak RSS", f"{rss:.0f} MiB", "< 200 MiB", _verdict(rss < 200))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> None:
    def report(what: str, figure: str, target: str, verdict: str) -> None:
        print(f"{what:<70} {figure:>14} {target:>10} {verdict}")

    bench_operator(report, quick="--quick" in sys.argv)


if __name__ == "__main__":
    main()
