"""The operator's figures against the real kube-apiserver (`make controlplane`), beside the
emulator's: the operator runs as a subprocess with its ServiceAccount identity, and the API
server's audit log counts what it asked for. Skipped, with a line saying why, where the
control plane is not built.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.run import percentile, verdict
from tests.support.policies import explicit_classes_policy
from tests.support.realcluster import (
    BINARY,
    KUBECTL,
    POLICIES,
    RUNTIME_CLASSES,
    ControlPlane,
    RealOperator,
    configmaps,
    installed_control_plane,
)

Report = Callable[[str, str, str, str], None]
CLASSES = 4


def _ready(cp: ControlPlane) -> set[str]:
    """Names of the policies whose status says Ready for their current generation."""
    ready = set()
    for name, body in cp.items(POLICIES).items():
        st = body.get("status") or {}
        if st.get("observedGeneration") == body["metadata"]["generation"] and any(
                c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or []):
            ready.add(name)
    return ready


def _wait(predicate: Callable[[], object], timeout: float, interval: float = 0.02) -> float | None:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if predicate():
            return time.perf_counter() - start
        time.sleep(interval)
    return None


def _objects_written(cp: ControlPlane, name: str, admission_objects: int = 3) -> bool:
    selector = f"katasizing.dev/policy={name}"
    admission = sum(len(cp.items(f"/apis/admissionregistration.k8s.io/v1/{kind}", selector)) for kind in (
        "validatingadmissionpolicies", "validatingadmissionpolicybindings",
        "mutatingadmissionpolicies", "mutatingadmissionpolicybindings"))
    # Its bindings of the two shared ValidatingAdmissionPolicies and the MutatingAdmissionPolicy
    # (its ConfigMaps include their parameters).
    return (len(cp.items(RUNTIME_CLASSES, selector)) == CLASSES and len(cp.items(configmaps(), selector)) >= 3
            and admission == admission_objects)


def quiet(cp: ControlPlane, seconds: float = 1.0, timeout: float = 60) -> None:
    """Until the operator has written nothing for `seconds` (at most `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mark = cp.audit_offset()
        time.sleep(seconds)
        if not cp.operator_writes(mark):
            return


def _clear(cp: ControlPlane, operator: RealOperator) -> None:
    for name in cp.items(POLICIES):
        if not operator.running:
            cp.merge_patch(f"{POLICIES}/{name}", {"metadata": {"finalizers": None}})
        cp.delete(f"{POLICIES}/{name}")
    _wait(lambda: not cp.items(POLICIES), 120, 0.2)
    for name in cp.items(RUNTIME_CLASSES):
        cp.delete(f"{RUNTIME_CLASSES}/{name}")
    for name in cp.items(configmaps(), "katasizing.dev/policy"):
        cp.delete(f"{configmaps()}/{name}")


def _peak_rss_mib(operator: RealOperator) -> float | None:
    try:
        for line in Path(f"/proc/{operator.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, AttributeError):
        return None
    return None


def _sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


class _PeakSockets:
    """The most sockets the operator held at once (its connections to the API server plus its
    health and metrics listeners), sampled every 50 ms."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak = max(self.peak, _sockets(self.pid))
            except OSError:
                return

    def stop(self) -> int:
        self._stop.set()
        return self.peak


def _reconcile_requests(cp: ControlPlane, name: str) -> int:
    """Requests (watches aside) the operator makes for one spec change of one policy."""
    body = cp.get(f"{POLICIES}/{name}")
    body["spec"]["classes"][0]["memory"] = "768Mi" if body["spec"]["classes"][0]["memory"] != "768Mi" else "1Gi"
    mark = cp.audit_offset()
    cp.request("PUT", f"{POLICIES}/{name}", body)
    _wait(lambda: name in _ready(cp), 30)
    quiet(cp)
    return sum(1 for r in cp.operator_requests(mark) if r.verb != "watch")


def bench_realserver(report: Report, quick: bool = False) -> None:
    if not BINARY.exists() or not KUBECTL.exists():
        report("real control plane not built (`make controlplane` needs Go): section skipped", "", "", "SKIP")
        return
    samples = 10 if quick else 30
    idle_s = 20 if quick else 60
    cold_sizes = (50,) if quick else (50, 200)
    work = Path(tempfile.mkdtemp(prefix="kata-sizing-realbench-"))
    try:
        with installed_control_plane(work) as cp:
            operator = RealOperator(cp, work).start(resync_s=10, guidance_s=10)
            try:
                created = []
                for i in range(samples):
                    name = f"lat-{i}"
                    start = time.perf_counter()
                    cp.create(POLICIES, explicit_classes_policy(name))
                    if _wait(lambda: _objects_written(cp, name), 20) is not None:
                        created.append(time.perf_counter() - start)
                report("real API server: policy created -> all objects written, median",
                       f"{statistics.median(created) * 1000:.0f} ms", "< 300 ms",
                       verdict(statistics.median(created) < 0.3))
                report("real API server: policy created -> all objects written, p95",
                       f"{percentile(created, 0.95) * 1000:.0f} ms", "", "")
                # The same without the admission objects (spec.admission.enabled: false): what they add.
                without = []
                for i in range(samples):
                    name = f"noadm-{i}"
                    start = time.perf_counter()
                    cp.create(POLICIES, explicit_classes_policy(name, admission={"enabled": False}))
                    if _wait(lambda: _objects_written(cp, name, admission_objects=0), 20) is not None:
                        without.append(time.perf_counter() - start)
                report("  same, spec.admission.enabled: false (no admission objects), median",
                       f"{statistics.median(without) * 1000:.0f} ms", "", "")
                for i in range(samples):
                    cp.delete(f"{POLICIES}/noadm-{i}")
                _wait(lambda: not [n for n in cp.items(POLICIES) if n.startswith("noadm-")], 60, 0.2)
                _wait(lambda: len(_ready(cp)) == samples, 60)
                quiet(cp)

                restored = []
                for i in range(samples):
                    path = f"{RUNTIME_CLASSES}/kata-lat-{i}-m"
                    rc = cp.get(path)
                    rc["overhead"]["podFixed"]["memory"] = "1Mi"
                    start = time.perf_counter()
                    cp.request("PUT", path, rc)
                    if _wait(lambda: cp.get(path)["overhead"]["podFixed"]["memory"] != "1Mi", 5) is not None:
                        restored.append(time.perf_counter() - start)
                report("real API server: hand edit -> restored, median",
                       f"{statistics.median(restored) * 1000:.0f} ms", "", "")
                report("real API server: hand edit -> restored, p95",
                       f"{percentile(restored, 0.95) * 1000:.0f} ms", "< 1 s",
                       verdict(percentile(restored, 0.95) < 1.0))
                report("real API server: hand edits not restored", f"{samples - len(restored)} of {samples}",
                       "0", verdict(len(restored) == samples))

                report("real API server: requests per policy reconcile (spec change), "
                       f"{samples} policies", str(_reconcile_requests(cp, "lat-0")), "", "")
                for i in range(samples, 50):
                    cp.create(POLICIES, explicit_classes_policy(f"lat-{i}"))
                _wait(lambda: len(_ready(cp)) == 50, 120, 0.2)
                quiet(cp)
                report("real API server: requests per policy reconcile (spec change), 50 policies",
                       str(_reconcile_requests(cp, "lat-1")), "", "")

                quiet(cp)
                mark = cp.audit_offset()
                time.sleep(idle_s)
                idle = cp.operator_requests(mark)
                idle_writes = [r for r in idle if r.verb in ("create", "update", "patch", "delete")]
                report(f"real API server: writes in {idle_s} s idle (50 policies, resync every 10 s)",
                       str(len(idle_writes)), "0", verdict(not idle_writes))
                report(f"real API server: reads in those {idle_s} s",
                       str(sum(1 for r in idle if r.verb in ("get", "list"))), "", "")
                rss = _peak_rss_mib(operator)
            finally:
                _clear(cp, operator)
                operator.stop()

            for size in cold_sizes:
                for i in range(size):
                    cp.create(POLICIES, explicit_classes_policy(f"cold-{i}"))
                start = time.perf_counter()
                operator = RealOperator(cp, work).start()
                sockets = _PeakSockets(operator.process.pid)
                try:
                    took = _wait(lambda size=size: len(_ready(cp)) == size, 600, 0.5)
                    total = time.perf_counter() - start
                    report(f"real API server: sockets the operator held at once, cold start of {size}",
                           str(sockets.stop()), "", "")
                    report(f"real API server: cold start, {size} policies x {CLASSES} classes all Ready",
                           f"{total:.1f} s" if took is not None else "not in 600 s",
                           "< 30 s" if size == 200 else "", verdict(took is not None and total < 30)
                           if size == 200 else "")
                    rss = max(filter(None, [rss, _peak_rss_mib(operator)]), default=None)
                finally:
                    _clear(cp, operator)
                    operator.stop()
            if rss is not None:
                report("real API server: operator peak RSS", f"{rss:.0f} MiB", "< 200 MiB", verdict(rss < 200))
    finally:
        shutil.rmtree(work, ignore_errors=True)
