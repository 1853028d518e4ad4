"""`make bench` section "node": the operator as a Pod on the real node (tests/support/realnode.py), from
its image (`make image`) and chart, as tests/node/test_node_operator.py runs it:

- the image's import into the node's containerd;
- `helm install --wait` (both replicas Ready), and the time from `helm install` to every class
  of a policy applied beforehand written (its RuntimeClasses, and the policy Ready);
- the operator Pods' peak memory, from their pod cgroups (cgroup v1 memory.max_usage_in_bytes,
  what the kubelet's limit is enforced against), against the chart's memory limit;
- leader handover: the leader Pod deleted, until the other replica holds the Lease;
- the routing webhook under change: pods created (dry run) at a steady rate all through a
  `helm upgrade` that rolls both replicas, counted refused or admitted without a class; and what a
  pod gets with no replica running.

Skipped with one line where the node cannot run (not root, the node's parts or the image not
built, another session holding the machine's node).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from bench.run import Report, percentile, verdict
from tests.support import image as img
from tests.support import realnode as rn
from tests.support.nodeoperator import (
    NAMESPACE,
    POLICY_FILE,
    RELEASE,
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
        # BENCH_NODE_ROLLOUTS: more helm upgrade rolls, for a count of refused pods worth reading.
        rollouts = 1 if quick else int(os.environ.get("BENCH_NODE_ROLLOUTS") or 2)
        _bench_release(report, node, workdir, handovers=1 if quick else 3, rollouts=rollouts)


def _bench_release(report: Report, node: rn.Node, workdir: Path, handovers: int, rollouts: int) -> None:
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

    _bench_webhook_rollout(report, release, rollouts)
    release.uninstall()


# A policy whose pods the operator's webhook routes (no MutatingAdmissionPolicy), and the namespace
# that opts into it: the pods of the rollout measurement (created with dryRun: the whole admission
# chain runs, nothing is stored or scheduled).
ROUTED_POLICY = {
    "apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy", "metadata": {"name": "node-routed"},
    "spec": {"shim": "qemu-runtime-rs", "classes": [{"name": "s", "cpu": "1", "memory": "1Gi"}],
             "runtimeClass": {"namePrefix": "kata-sizing-node-routed"},
             "nodes": {"selector": {"kata-sizing.test/none": "true"}},
             "admission": {"routing": "Webhook", "namespaces": {"names": ["node-routed"]}}}}
ROLLOUT_RATE = 20.0


def _bench_webhook_rollout(report: Report, release: OperatorRelease, rounds: int) -> None:
    """Pods created at a steady rate while `helm upgrade` rolls both replicas (maxSurge 1,
    maxUnavailable 0): how many were refused (the routing webhook's failurePolicy is Ignore, so a
    pod it could not route is refused by the envelope policy, rule pod-not-routed) or admitted
    without a class; then what a pod gets with no replica running."""
    from bench.admission_bench import ONE, Case, Creator, Tally, pod_spec
    from tests.support.realnode import NODE_TOLERATION

    cp = release.cp
    cp.apply({"apiVersion": "v1", "kind": "Namespace",
              "metadata": {"name": "node-routed", "labels": {"katasizing.dev/policy": "node-routed"}}},
             ROUTED_POLICY)
    case = Case("routed by the webhook", "node-routed", "node-routed", webhook=True)
    spec = {**pod_spec(ONE, 0), "tolerations": [NODE_TOLERATION]}
    creator = Creator(cp)

    def routed() -> bool:
        tally = Tally()
        asyncio.run(creator.block(case, spec, 1, 1, 0, tally, dry_run=True))
        return not tally.refused and not tally.unrouted
    if _wait(routed, 120, interval=0.5) is None:
        report("webhook rollout: the webhook never routed the policy's pods", "", "", "ERROR")
        return
    for round_ in range(rounds):
        release.wait_ready(2)
        tally = Tally()
        upgrade = release.helm_started("upgrade", release.values(
            podAnnotations={"kata-sizing.bench/rollout": f"{time.time():.0f}-{round_}"}))
        began = time.monotonic()
        try:
            # Pods all through the rollout: until helm returns (both new replicas Ready), and the
            # old replicas' termination after it.
            while upgrade.poll() is None and time.monotonic() - began < 240:
                asyncio.run(creator.block(case, spec, ROLLOUT_RATE, 2, tally.sent + 1, tally, dry_run=True))
            asyncio.run(creator.block(case, spec, ROLLOUT_RATE, 10, tally.sent + 1, tally, dry_run=True))
            status = upgrade.wait(30)
        finally:
            if upgrade.poll() is None:
                upgrade.kill()
                upgrade.wait()
            upgrade.stdout.close()
        took = time.monotonic() - began
        worst = max(tally.latencies_ms, default=0.0)
        report(f"webhook rollout {round_ + 1}: pods created during helm upgrade (exit {status}, {took:.0f} s), "
               f"refused / admitted without a class", f"{tally.refused} / {tally.unrouted} of {tally.sent}", "0",
               verdict(tally.refused + tally.unrouted == 0))
        for failure, count in sorted(tally.failures.items(), key=lambda kv: -kv[1])[:3]:
            report(f"  {count} x {failure}", "", "", "")
        report(f"webhook rollout {round_ + 1}: slowest create, p99", f"{worst:.0f} ms, "
               f"{percentile(tally.latencies_ms, 0.99):.0f} ms" if tally.latencies_ms else "-", "", "")
    # Every replica down: the routing webhook fails open (Ignore) and the envelope policy refuses
    # the pod it could not route, saying so.
    cp.kubectl("scale", "-n", NAMESPACE, f"deployment/{RELEASE}", "--replicas=0")
    try:
        _wait(lambda: not release.all_pods(), 90, interval=0.5)
        tally = Tally()
        asyncio.run(creator.block(case, spec, 1, 3, 0, tally, dry_run=True))
        said = next(iter(tally.failures), "admitted")
        report("no replica running: a pod that asks for routing gets", said[:110], "", "")
    finally:
        cp.kubectl("scale", "-n", NAMESPACE, f"deployment/{RELEASE}", "--replicas=2")
        release.wait_ready(2, timeout=180)
    cp.kubectl("delete", "ksp", "node-routed", "--wait=false")
    cp.kubectl("delete", "namespace", "node-routed", "--wait=false")
