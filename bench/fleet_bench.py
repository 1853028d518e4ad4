"""The operator at fleet scale, against the emulator (the real `kata-sizing operator`
subprocess, so its RSS and its requests are its own):

- API requests per policy reconcile with 1, 50 and 500 policies (the goal: constant), counted
  from the emulator's request log: a cold start divided by the number of policies, and one
  policy's spec change with the others present;
- cold start of 500 policies x 4 classes; the same under 5 ms of latency on every request;
- peak RSS with realistic pods (init containers, a sidecar, env, volumes, probes,
  managedFields, status: about 5 KB of JSON each) at 500 nodes and 20,000 pods, and at
  100,000 pods; 70% of them Kata pods of the policy, one in 20 of those without a memory limit
  (the pod audit lists them in status.podAudit); with BENCH_BASELINE=<git revision>, the same
  20,000 pods under that revision's operator (before the pod audit), for the audit's cost;
- with those pods, the requests of one policy's spec change (the audit reads the pod cache).

Nothing here asserts; each figure is printed with its target.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.operator_bench import CLASSES, operator_process, peak_rss_mib, policy, policy_ready, wait_until  # noqa: E402
from tests.support.harness import running_emulator  # noqa: E402

Report = Callable[[str, str, str, str], None]
NODES = 500
KATA_LABEL = {"katacontainers.io/kata-runtime": "true"}
RSS_TARGET_MIB = 200


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def api_calls(emu) -> list:
    """The operator's requests, watches (long-lived streams) left out."""
    return [r for r in emu.request_log if not r.is_watch]


def _numbered_policy(i: int) -> dict:
    body = policy(f"p{i:03d}")
    body["spec"]["runtimeClass"] = {"namePrefix": f"kata-p{i:03d}"}
    return body


def requests_per_reconcile(report: Report, counts: tuple[int, ...], latency_s: float, work: Path) -> None:
    suffix = f", {latency_s * 1000:.0f} ms per request" if latency_s else ""
    for count in counts:
        with running_emulator(work) as emu:
            for i in range(count):
                emu.objects("katasizingpolicies").create(_numbered_policy(i))
            if latency_s:
                emu.add_latency(latency_s)
            start = time.perf_counter()
            with operator_process(emu.kubeconfig, work / "fleet.log", KATA_SIZING_GUIDANCE_SECONDS="10"):
                names = [f"p{i:03d}" for i in range(count)]
                done = wait_until(lambda: all(policy_ready(emu, n) for n in names), 600, 0.2)
                cold_s = time.perf_counter() - start
                time.sleep(2)
                cold_calls = api_calls(emu)
                if count >= 500:
                    report(f"cold start: {count} policies x {CLASSES} classes, all Ready{suffix}",
                           f"{cold_s:.1f} s" if done is not None else "not in 600 s", "", "")
                report(f"requests per policy at cold start, {count} policies{suffix}",
                       f"{len(cold_calls) / count:.1f}", "constant", "")
                emu.reset_request_log()
                body = emu.objects("katasizingpolicies").get("p000")
                changed = copy.deepcopy(body)
                changed["spec"]["classes"][0]["memory"] = "2Gi"
                emu.objects("katasizingpolicies").put(changed)
                wait_until(lambda: (emu.objects("katasizingpolicies").get("p000").get("status") or {})
                           .get("observedGeneration") == body["metadata"]["generation"] + 1, 60, 0.05)
                time.sleep(2)
                calls = api_calls(emu)
                lists = [r for r in calls if r.method == "GET" and r.path.rsplit("/", 1)[-1] in
                         ("runtimeclasses", "configmaps")]
                report(f"requests for one policy's spec change, {count} policies{suffix}",
                       str(len(calls)), "constant", "")
                report("  of which lists of RuntimeClasses or ConfigMaps", str(len(lists)), "0", _verdict(not lists))


# --- realistic pods ---------------------------------------------------------------------------


def _managed_fields() -> list[dict]:
    fields = {"f:metadata": {"f:labels": {f"f:{k}": {} for k in ("app", "team", "version", "tier")},
                             "f:ownerReferences": {"k:{\"uid\":\"x\"}": {}}},
              "f:spec": {"f:containers": {f"k:{{\"name\":\"c{i}\"}}": {
                  ".": {}, "f:env": {f"k:{{\"name\":\"E{j}\"}}": {".": {}, "f:name": {}, "f:value": {}} for j in range(6)},
                  "f:image": {}, "f:resources": {"f:requests": {"f:cpu": {}, "f:memory": {}}}} for i in range(1)}}}
    return [
        {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
         "time": "2026-12-01T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields},
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-12-01T10:00:05Z",
         "fieldsType": "FieldsV1", "subresource": "status",
         "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:podIP": {}, "f:phase": {}}}},
    ]


def _container(name: str, memory: str, image: str) -> dict:
    return {
        "name": name, "image": f"registry.example.com/team/{image}:1.2.3", "imagePullPolicy": "IfNotPresent",
        "env": [{"name": f"E{j}", "value": f"value-{j}"} for j in range(3)]
        + [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": {"requests": {"cpu": "100m", "memory": memory}, "limits": {"memory": memory}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/app"},
                         {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                          "readOnly": True}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 10},
        "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
    }


def realistic_pod(i: int, nodes: int) -> dict:
    """A pod as the API server returns it from a real cluster: about 5 KB of JSON."""
    kata = i % 10 < 7
    spec = {
        "nodeName": f"node-{i % nodes:04d}",
        "serviceAccountName": "app", "restartPolicy": "Always", "dnsPolicy": "ClusterFirst",
        "schedulerName": "default-scheduler", "terminationGracePeriodSeconds": 30,
        "initContainers": [
            _container("init-db", "256Mi", "migrate"),
            {**_container("log-shipper", "64Mi", "fluent-bit"), "restartPolicy": "Always"},  # a sidecar
        ],
        "containers": [_container("c0", f"{(i % 4 + 1) * 128}Mi", "app")],
        "volumes": [
            {"name": "config", "configMap": {"name": "app-config", "defaultMode": 420}},
            {"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}},
        ],
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 300}],
    }
    if kata:
        spec["runtimeClassName"] = "kata-fleet-m"
        spec["overhead"] = {"cpu": "250m", "memory": "908Mi"}
        if i % 20 == 0:  # no memory limit: a finding of the pod audit
            del spec["containers"][0]["resources"]["limits"]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"app-{i:06d}-7d9f8c6b5-x2x4z", "namespace": f"team-{i % 50:02d}",
            "labels": {"app": "app", "team": f"team-{i % 50:02d}", "version": "1.2.3", "tier": "backend",
                       "pod-template-hash": "7d9f8c6b5"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-01T10:00:00Z",
                            "prometheus.io/scrape": "true"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "app-7d9f8c6b5",
                                 "uid": "3f6c1a2e-0000-4000-8000-000000000000", "controller": True,
                                 "blockOwnerDeletion": True}],
            "managedFields": _managed_fields(),
        },
        "spec": spec,
        "status": {
            "phase": "Running", "podIP": "10.1.2.3", "hostIP": "192.168.0.10", "qosClass": "Burstable",
            "startTime": "2026-12-01T10:00:01Z",
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-12-01T10:00:04Z"}
                           for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
            "containerStatuses": [{"name": f"c{j}", "ready": True, "restartCount": 0, "started": True,
                                   "image": "registry.example.com/team/app:1.2.3",
                                   "imageID": "registry.example.com/team/app@sha256:" + "a" * 64,
                                   "containerID": "containerd://" + "b" * 64,
                                   "state": {"running": {"startedAt": "2026-12-01T10:00:03Z"}}} for j in range(1)],
        },
    }


def _node(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"node-{i:04d}", "labels": dict(KATA_LABEL)},
            "status": {"capacity": {"memory": "256Gi", "cpu": "64"}, "allocatable": {"memory": "248Gi", "cpu": "64"}}}


def baseline_source(work: Path) -> tuple[str, Path] | None:
    """BENCH_BASELINE=<git revision>: that revision's operator/ and templates/, to run instead of
    this checkout's (through PYTHONPATH, ahead of the editable install)."""
    from bench.run import baseline_checkout

    revision = os.environ.get("BENCH_BASELINE")
    if not revision:
        return None
    return revision, baseline_checkout(revision, work)


FLEET_POLICY = {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy",
                "metadata": {"name": "fleet"},
                "spec": {"shim": "qemu-runtime-rs", "classes": policy("fleet")["spec"]["classes"]}}


def memory_at_scale(report: Report, pod_counts: tuple[int, ...], work: Path) -> None:
    size = len(json.dumps(realistic_pod(1, NODES)))
    report("realistic pod object (init container, sidecar, env, volumes, managedFields, status)",
           f"{size / 1024:.1f} KiB", "about 5 KiB", "")
    baseline = baseline_source(work)
    runs = [(pods, None) for pods in pod_counts]
    if baseline is not None:
        runs.insert(1, (pod_counts[0], baseline))
    for pods, source in runs:
        env = {"KATA_SIZING_GUIDANCE_SECONDS": "2"}
        if source is not None:
            env["PYTHONPATH"] = str(source[1])
        with running_emulator(work, history_limit=1000) as emu:
            for i in range(NODES):
                emu.objects("nodes").create(_node(i))
            for i in range(pods):
                emu.objects("pods").create(realistic_pod(i, NODES))
            start = time.perf_counter()
            with operator_process(emu.kubeconfig, work / "memory.log", **env) as proc:
                emu.objects("katasizingpolicies").create(copy.deepcopy(FLEET_POLICY))
                written = wait_until(
                    lambda: "node-0000" in json.dumps(
                        (emu.objects("configmaps").get("fleet-node-guidance", "kata-sizing") or {}).get("data") or {}),
                    600, 0.1)
                took = time.perf_counter() - start
                def audited_pods() -> int:
                    status = emu.objects("katasizingpolicies").get("fleet").get("status") or {}
                    return (status.get("podAudit") or {}).get("pods") or 0

                if source is None:
                    wait_until(audited_pods, 30, 0.1)
                audited = audited_pods()
                time.sleep(1)
                rss = peak_rss_mib(proc)
                if source is None and pods == pod_counts[0]:
                    emu.reset_request_log()
                    body = emu.objects("katasizingpolicies").get("fleet")
                    changed = copy.deepcopy(body)
                    changed["spec"]["classes"][0]["memory"] = "2Gi"  # as requests_per_reconcile does
                    emu.objects("katasizingpolicies").put(changed)
                    wait_until(lambda: (emu.objects("katasizingpolicies").get("fleet").get("status") or {})
                               .get("observedGeneration") == body["metadata"]["generation"] + 1, 60, 0.05)
                    time.sleep(2)
                    report(f"requests for one policy's spec change, {pods:,} pods (pod audit from the cache)",
                           str(len(api_calls(emu))), "constant", "")
            if source is not None:
                report(f"  same, {pods:,} pods, operator of {source[0]} (before the pod audit)",
                       f"{rss:.0f} MiB" if rss else "?", "", "")
                continue
            target = f"< {RSS_TARGET_MIB} MiB" if pods == 20_000 else ""
            report(f"operator peak RSS, {NODES} nodes + {pods:,} realistic pods",
                   f"{rss:.0f} MiB" if rss else "?", target,
                   _verdict(rss is not None and rss < RSS_TARGET_MIB) if target else "")
            report(f"  start -> guidance for {NODES} nodes written, {pods:,} pods",
                   f"{took:.1f} s" if written is not None else "not in 600 s", "", "")
            report(f"  pods in status.podAudit (Kata pods without a memory limit), {pods:,} pods",
                   str(audited), str(sum(1 for i in range(pods) if i % 10 < 7 and i % 20 == 0)), "")


def bench_fleet(report: Report, quick: bool = False) -> None:
    work = Path(tempfile.mkdtemp(prefix="kata-sizing-fleet-"))
    try:
        requests_per_reconcile(report, (1, 50) if quick else (1, 50, 500), 0.0, work)
        requests_per_reconcile(report, (50,) if quick else (500,), 0.005, work)
        memory_at_scale(report, (20_000,) if quick else (20_000, 100_000), work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    def report(what: str, figure: str, target: str, verdict: str) -> None:
        print(f"{what:<78} {figure:>12} {target:>10} {verdict}", flush=True)

    bench_fleet(report, quick="--quick" in sys.argv)


if __name__ == "__main__":
    main()
