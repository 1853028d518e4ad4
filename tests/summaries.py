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


def node(name: str, address: str | None = None, port: int = 10250) -> dict:
    status: dict = {"capacity": {"cpu": "64", "memory": "256Gi"}, "allocatable": {"cpu": "63", "memory": "248Gi"},
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}
    if address:
        status["addresses"] = [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"katacontainers.io/kata-runtime": "true"}}, "status": status}


def json_response(document: object, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.Response(body=json.dumps(document).encode(), status=status, content_type="application/json")
