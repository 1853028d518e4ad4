"""`make bench` section "node": the operator as a Pod on the real node (tests/support/realnode.py), from
its image (`make image`) and chart, as tests/node/test_node_operator.py runs it:

- the image's import into the node's containerd;
- `helm install --wait` (both replicas Ready), and the time from `helm install` to every class
  of a policy applied beforehand written (its RuntimeClasses, and the policy Ready);
- the operator Pods' peak memory, from their pod cgroups (cgroup v1 memory.max_usage_in_bytes,
  what the kubelet's limit is enforced against), against the chart's memory limit;
- leader handover: the leader Pod deleted, until the other replica holds the Lease.

Skipped with one line where the node cannot run (not root, the node's parts or the image not
built, another session holding the machine's node).
"""

from __future__ import annotations

import contextlib
import fcntl
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from bench.run import Report, verdict
from tests.support import image as img
from tests.support import realnode as rn
from tests.support.nodeoperator import (
    NAMESPACE,
    POLICY_FILE,
    OperatorRelease,
    guided_node_config,
    policy_runtime_classes,
)
from tests.support.realcluster import POLICIES, RUNTIME_CLASSES, installed_control_plane

MIB = 2**20
LOCK_WAIT_S = 120


def _memory_limit_bytes() -> int:
    values = yaml.safe_load((img.ROOT / "charts" / "kata-sizing" / "values.yaml").read_text())
    return int(values["resources"]["limits"]["memory"].removesuffix("Mi")) * MIB


def _wait(predicate, timeout: float, interval: float = 0.05) -> float | None:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if predicate():
            return time.monotonic() - began
        time.sleep(interval)
    return None


def bench_node(report: Report, quick: bool = False) -> None:
    problem = rn.host_problem() or (None if img.ARCHIVE.exists() else
                                   f"the operator image {img.ARCHIVE.relative_to(img.ROOT)} is not built (`make image`)")
    if problem:
        report(f"skipped: no real node here: {problem}", "", "", "SKIP")
        return
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(rn.flock(rn.NODE_LOCK, fcntl.LOCK_EX, LOCK_WAIT_S, "the machine's node"))
        except TimeoutError as err:
            report(f"skipped: {err}", "", "", "SKIP")
            return
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kata-sizing-node-bench-")))
        (workdir / "cp").mkdir()
        (workdir / "node").mkdir()
        address = stack.enter_context(rn.node_address())
        cp = stack.enter_context(installed_control_plane(workdir / "cp", address=address))
        node = rn.Node(cp, guided_node_config(), workdir / "node")
        stack.callback(node.stop)
        node.start()
        report("node start (containerd, images, kubelet, scheduler, kube-proxy) until Ready",
               f"{node.start_seconds:.1f} s", "", "")
        _bench_release(report, node, workdir, handovers=1 if quick else 3)


def _bench_release(report: Report, node: rn.Node, workdir: Path, handovers: int) -> None:
    cp = node.cp
    release = OperatorRelease(node, workdir)
    name = release.import_image()
    report(f"ctr images import of the operator image ({name})", f"{release.import_seconds:.1f} s", "", "")
    release.prepare_namespace()
    release.take_over_shared_admission()  # the chart creates them (the control plane's install made them first)
    policy = yaml.safe_load(POLICY_FILE.read_text())
    classes = set(policy_runtime_classes())
    cp.apply(policy)  # before the operator runs: it finds the policy when it starts
    selector = f"katasizing.dev/policy={policy['metadata']['name']}"

    def ready() -> bool:
        body = cp.get(f"{POLICIES}/{policy['metadata']['name']}") or {}
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in (body.get("status") or {}).get("conditions") or [])
    began = time.monotonic()
    install = release.helm_started("install", release.values())
    try:
        written = _wait(lambda: set(cp.items(RUNTIME_CLASSES, selector)) == classes, 180)
        ready_s = _wait(ready, 60)
        status = install.wait(240)
        installed_s = time.monotonic() - began
        output = install.stdout.read()
    finally:
        if install.poll() is None:
            install.kill()
            install.wait()
        install.stdout.close()
    if status != 0 or written is None or ready_s is None:
        report(f"helm install: exit {status}, classes written: {written}, Ready: {ready_s}", output[-200:], "", "MISS")
        return
    report(f"helm install to all {len(classes)} classes written (RuntimeClasses)", f"{written:.1f} s", "", "")
    report("helm install to the policy Ready", f"{written + ready_s:.1f} s", "", "")
    report("helm install --wait returned (both replicas Ready)", f"{installed_s:.1f} s", "", "")

    # Peak memory of the first two replicas: the leader made every object and has run the node
    # guidance (every 10 s) and the pod audit since.
    time.sleep(12)
    limit = _memory_limit_bytes()
    leader = release.leader()
    for pod in release.pods():
        peak = release.peak_memory_bytes(pod)
        role = "leader" if pod["metadata"]["name"] == leader else "follower"
        report(f"peak memory of the operator Pod, {role} (pod cgroup memory.max_usage_in_bytes)",
               f"{peak / MIB:.0f} MiB", f"< {limit // MIB} MiB", verdict(peak < limit))

    leases_s = []
    for _ in range(handovers):
        release.wait_ready(2)
        time.sleep(2)  # the follower has renewed its view of the Lease
        old = release.leader()
        duration_s = release.lease().get("leaseDurationSeconds", 15)
        began = time.monotonic()
        cp.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{old}")
        took = _wait(lambda: release.leader() not in ("", old), duration_s + 30, interval=0.05)
        leases_s.append(took if took is not None else float("inf"))
    median = statistics.median(leases_s)
    report(f"leader handover (leader Pod deleted until the other holds the Lease), median of {handovers}",
           f"{median:.1f} s", f"< {duration_s} s", verdict(median < duration_s))

    release.uninstall()
