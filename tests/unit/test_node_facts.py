"""What the operator counts as a node's infra pods for node guidance (controller/cluster.py):
each non-Kata pod's effective memory and CPU request, as the scheduler counts them."""

from __future__ import annotations

from decimal import Decimal

from kata_sizing.controller.cluster import facts_for_nodes, summarize_node, summarize_pod
from kata_sizing.core.guidance import NodeFacts
from kata_sizing.core.quantity import MIB

NODE = {"metadata": {"name": "node-a", "labels": {"katacontainers.io/kata-runtime": "true"}},
        "status": {"capacity": {"memory": "24Gi", "cpu": "2"}, "allocatable": {"memory": "22Gi", "cpu": "2"}}}


def pod(name: str, *, requests: dict | None = None, runtime_class: str | None = None, overhead: dict | None = None,
        init: list[dict] | None = None, phase: str = "Running") -> dict:
    spec: dict = {"nodeName": "node-a", "containers": [{"name": "main", "resources": {"requests": requests or {}}}]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    if overhead:
        spec["overhead"] = overhead
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec, "status": {"phase": phase}}


def facts(*pods: dict) -> NodeFacts:
    summaries = [s for s in map(summarize_pod, pods) if s is not None]
    summary = summarize_node(NODE)
    assert summary is not None
    (node,) = facts_for_nodes([summary], {"node-a": summaries},
                              {"katacontainers.io/kata-runtime": "true"}, {"kata-node-s"})
    return node


def test_infra_pods_memory_and_cpu_requests_are_summed_and_kata_pods_are_not():
    node = facts(
        pod("operator-a", requests={"cpu": "50m", "memory": "160Mi"}),
        pod("operator-b", requests={"cpu": "50m", "memory": "160Mi"}),
        pod("vm", requests={"cpu": "1", "memory": "1Gi"}, runtime_class="kata-node-s",
            overhead={"cpu": "250m", "memory": "306Mi"}),
        pod("done", requests={"cpu": "4", "memory": "4Gi"}, phase="Succeeded"),
    )
    assert node.infra_pod_memory_bytes == 320 * MIB
    assert node.infra_pod_cpu == Decimal("0.1")


def test_an_init_container_larger_than_the_app_sets_the_pods_cpu_request_and_overhead_adds():
    node = facts(pod("init-heavy", requests={"cpu": "100m"}, overhead={"cpu": "50m"},
                     init=[{"name": "setup", "resources": {"requests": {"cpu": "500m", "memory": "64Mi"}}}]))
    assert node.infra_pod_cpu == Decimal("0.55")
    assert node.infra_pod_memory_bytes == 64 * MIB
