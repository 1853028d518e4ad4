"""kubelet Summary documents (`/stats/summary`) for tests and the bench, in the shape the kubelet
serializes k8s.io/kubelet/pkg/apis/stats/v1alpha1 (the same fields as
tests/fixtures/summary/kata-node-1.json), built from Pod objects and the figures a test wants
each pod to show."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import aiohttp.web

MIB = 1024 * 1024
TIME = "2026-12-03T10:00:00Z"  # when the figures were taken
STARTED = "2026-12-03T09:00:00Z"  # when the pods and containers started


@dataclass(frozen=True)
class Figures:
    """What one pod shows: its containers' working sets and what its cgroup holds beyond them."""

    containers_working_set_bytes: int
    overhead_bytes: int
    usage_extra_bytes: int = 4 * MIB  # usage - working set: inactive page cache


def _memory(working_set: int, usage: int) -> dict:
    return {"time": TIME, "usageBytes": usage, "workingSetBytes": working_set, "rssBytes": working_set,
            "pageFaults": 1000, "majorPageFaults": 0}


def pod_stats(pod: dict, figures: Figures) -> dict:
    meta, spec = pod["metadata"], pod["spec"]
    names = [c["name"] for c in spec.get("containers") or []]
    share = figures.containers_working_set_bytes // max(1, len(names))
    containers = [{
        "name": name, "startTime": STARTED,
        "cpu": {"time": TIME, "usageNanoCores": 1000000, "usageCoreNanoSeconds": 5000000000},
        "memory": _memory(share, share + MIB),
        "rootfs": {"time": TIME, "availableBytes": 10 * 2**30, "capacityBytes": 20 * 2**30, "usedBytes": 40960},
        "logs": {"time": TIME, "availableBytes": 10 * 2**30, "capacityBytes": 20 * 2**30, "usedBytes": 8192},
    } for name in names]
    working_set = share * len(names) + figures.overhead_bytes
    return {
        "podRef": {"name": meta["name"], "namespace": meta.get("namespace", "default"), "uid": meta["uid"]},
        "startTime": STARTED,
        "containers": containers,
        "cpu": {"time": TIME, "usageNanoCores": 2000000, "usageCoreNanoSeconds": 9000000000},
        "memory": _memory(working_set, working_set + figures.usage_extra_bytes),
        "network": {"time": TIME, "name": "eth0", "rxBytes": 1000, "rxErrors": 0, "txBytes": 1000, "txErrors": 0},
        "volume": [{"time": TIME, "availableBytes": 2**30, "capacityBytes": 2**30, "usedBytes": 12288,
                    "name": "kube-api-access"}],
        "ephemeral-storage": {"time": TIME, "availableBytes": 10 * 2**30, "capacityBytes": 20 * 2**30,
                              "usedBytes": 49152},
        "process_stats": {"process_count": 0},
    }


def set_figures(stats: dict, figures: Figures) -> None:
    """Change a pod entry of a built Summary in place to show other figures (cheaper than
    building it again, for the fleet test and the bench)."""
    containers = stats["containers"]
    share = figures.containers_working_set_bytes // max(1, len(containers))
    for container in containers:
        container["memory"] = _memory(share, share + MIB)
    working_set = share * len(containers) + figures.overhead_bytes
    stats["memory"] = _memory(working_set, working_set + figures.usage_extra_bytes)


def summary(node: str, pods: Iterable[dict], figures: Callable[[dict], Figures]) -> dict:
    return {
        "node": {
            "nodeName": node, "startTime": TIME,
            "cpu": {"time": TIME, "usageNanoCores": 500000000, "usageCoreNanoSeconds": 10**12},
            "memory": {"time": TIME, "availableBytes": 100 * 2**30, "usageBytes": 20 * 2**30,
                       "workingSetBytes": 16 * 2**30, "rssBytes": 12 * 2**30, "pageFaults": 1, "majorPageFaults": 0},
            "systemContainers": [],
        },
        "pods": [pod_stats(pod, figures(pod)) for pod in pods],
    }


def kata_pod(name: str, node: str, runtime_class: str, memory_limit: str, pod_fixed: str,
             namespace: str = "fleet", uid: str | None = None, containers: int = 1) -> dict:
    """A Pod as the API server stores it after admission (spec.overhead copied from its RuntimeClass)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, **({"uid": uid} if uid else {})},
        "spec": {
            "nodeName": node, "runtimeClassName": runtime_class,
            "overhead": {"cpu": "250m", "memory": pod_fixed},
            "containers": [{"name": f"c{i}", "image": "app", "resources": {
                "limits": {"memory": memory_limit}, "requests": {"memory": memory_limit}}} for i in range(containers)],
        },
        "status": {"phase": "Running"},
    }


def write_pod_list(path, count: int, kata_every: int, nodes: int, runtime_class: str) -> list[dict]:
    """`kubectl get pods -A -o yaml` of `count` pods of about 4 KiB each, as kubectl writes a List,
    every `kata_every`-th of `runtime_class` (512Mi, podFixed 300Mi), spread over `nodes` nodes;
    returns those Kata pods (as kata_pod builds them, container `app`), for their Summaries."""
    import yaml

    template = yaml.safe_dump(_realistic_pod(), default_flow_style=False, sort_keys=True, width=10**9)
    entry = "- " + template.replace("\n", "\n  ").rstrip(" ")
    kata = []
    with open(path, "w") as handle:
        handle.write("apiVersion: v1\nitems:\n")
        for i in range(count):
            name, node_name = f"app-{i:05d}", f"node-{(i // kata_every) % nodes:03d}"
            text = entry.replace("NAME", name).replace("UID", f"uid-{i:05d}").replace("NODE", node_name)
            if i % kata_every == 0:
                text = text.replace("\n    schedulerName:", f"\n    runtimeClassName: {runtime_class}\n    schedulerName:")
                pod = kata_pod(name, node_name, runtime_class, "512Mi", "300Mi", namespace="payments",
                               uid=f"uid-{i:05d}")
                pod["spec"]["containers"][0]["name"] = "app"
                kata.append(pod)
            handle.write(text)
        handle.write("kind: List\nmetadata:\n  resourceVersion: \"\"\n")
    return kata


def _realistic_pod() -> dict:
    """A Pod as kubectl prints it (managedFields hidden, as by default): about 4 KiB."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-01T10:00:00Z",
                                     "prometheus.io/scrape": "true"},
                     "creationTimestamp": "2026-12-01T10:00:00Z", "generateName": "app-7d9f8b6c4-",
                     "labels": {"app": "app", "pod-template-hash": "7d9f8b6c4", "team": "payments"},
                     "name": "NAME", "namespace": "payments",
                     "ownerReferences": [{"apiVersion": "apps/v1", "blockOwnerDeletion": True, "controller": True,
                                          "kind": "ReplicaSet", "name": "app-7d9f8b6c4",
                                          "uid": "0e7c4a4e-1b2c-4d5e-8f90-123456789abc"}],
                     "resourceVersion": "100000", "uid": "UID"},
        "spec": {"containers": [{
            "env": [{"name": "LOG_LEVEL", "value": "info"},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}}],
            "image": "registry.example.com/payments/app:1.42.0", "imagePullPolicy": "IfNotPresent", "name": "app",
            "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
            "readinessProbe": {"failureThreshold": 3, "httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"},
                               "periodSeconds": 10, "successThreshold": 1, "timeoutSeconds": 1},
            "resources": {"limits": {"cpu": "1", "memory": "512Mi"}, "requests": {"cpu": "250m", "memory": "512Mi"}},
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            "volumeMounts": [{"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                              "name": "kube-api-access-abcde", "readOnly": True}]}],
            "dnsPolicy": "ClusterFirst", "enableServiceLinks": True, "nodeName": "NODE",
            "overhead": {"cpu": "250m", "memory": "300Mi"},
            "preemptionPolicy": "PreemptLowerPriority", "priority": 0, "restartPolicy": "Always",
            "schedulerName": "default-scheduler", "securityContext": {}, "serviceAccount": "default",
            "serviceAccountName": "default", "terminationGracePeriodSeconds": 30,
            "tolerations": [{"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "tolerationSeconds": 300},
                            {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists",
                             "tolerationSeconds": 300}],
            "volumes": [{"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": "kube-root-ca.crt"}},
                {"downwardAPI": {"items": [{"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                            "path": "namespace"}]}}]}}]},
        "status": {"conditions": [{"lastProbeTime": None, "lastTransitionTime": "2026-12-01T10:00:05Z",
                                   "status": "True", "type": t} for t in (
            "PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")],
            "containerStatuses": [{"containerID": "containerd://" + "ab" * 32,
                                   "image": "registry.example.com/payments/app:1.42.0",
                                   "imageID": "registry.example.com/payments/app@sha256:" + "cd" * 32,
                                   "lastState": {}, "name": "app", "ready": True, "restartCount": 0, "started": True,
                                   "state": {"running": {"startedAt": "2026-12-01T10:00:04Z"}}}],
            "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}], "phase": "Running", "podIP": "10.244.1.2",
            "podIPs": [{"ip": "10.244.1.2"}], "qosClass": "Guaranteed", "startTime": "2026-12-01T10:00:00Z"},
    }




def node(name: str, address: str | None = None, port: int = 10250) -> dict:
    status: dict = {"capacity": {"cpu": "64", "memory": "256Gi"}, "allocatable": {"cpu": "63", "memory": "248Gi"},
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}
    if address:
        status["addresses"] = [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"katacontainers.io/kata-runtime": "true"}}, "status": status}


def json_response(document: object, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.Response(body=json.dumps(document).encode(), status=status, content_type="application/json")
