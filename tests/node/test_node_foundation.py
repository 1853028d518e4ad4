"""The real node (tests/support/realnode.py) proves its foundation: what the kubelet, the scheduler and
kube-proxy decide for a pod of a RuntimeClass with `overhead.podFixed`, with runc standing in
for Kata (containerd maps the class's handler to runc).

- the node is Ready and every component reports v1.37.2, as `kubectl version` and helm see it;
- a pod of the class runs, and the kubelet sizes its pod cgroup to Σ container limits +
  podFixed (memory limit and CFS quota, read from the host's cgroupfs);
- a pod whose limits fit the node but whose limits + podFixed do not is refused: Pending
  with the scheduler's reason, and, bound to the node directly, rejected by the kubelet;
- from inside a pod, the in-cluster configuration reaches the API server through the
  kubernetes Service (10.96.0.1) with the ServiceAccount's projected token and CA;
- the kubelet's Summary API, through the API server's node proxy, reports the pod's working set.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.operator_helpers import wait_for as poll
from tests.support.realnode import ROOT, Node

pytestmark = pytest.mark.node

MIB = 2**20
HELM = ROOT / ".tools" / "helm"  # `make tools`
RUNTIME_CLASSES = "/apis/node.k8s.io/v1/runtimeclasses"
HANDLER = "kata-node-m"
POD_FIXED = {"cpu": "250m", "memory": "358Mi"}


def memory_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)


def millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


@pytest.fixture
def namespace(node_namespace: str) -> str:
    return node_namespace


@pytest.fixture
def runtime_class(real_node: Node) -> Iterator[str]:
    """A RuntimeClass as the project renders one: handler = name, overhead.podFixed."""
    real_node.cp.create(RUNTIME_CLASSES, {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": HANDLER},
        "handler": HANDLER, "overhead": {"podFixed": POD_FIXED}})
    try:
        yield HANDLER
    finally:
        real_node.cp.delete(f"{RUNTIME_CLASSES}/{HANDLER}")


def test_the_node_is_ready_and_reports_v1_37_2(real_node: Node, tmp_path: Path) -> None:
    node = real_node.cp.read(f"/api/v1/nodes/{real_node.name}")
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True", conditions
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.37.2"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.6.")
    assert {"type": "InternalIP", "address": real_node.ip} in node["status"]["addresses"]
    assert node["metadata"]["labels"]["katacontainers.io/kata-runtime"] == "true"

    version = json.loads(real_node.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.37.2"
    assert (version["serverVersion"]["major"], version["serverVersion"]["minor"]) == ("1", "37")

    # helm checks a chart's kubeVersion against the server's (v0.0.0-master+$Format:%H$ before the
    # version was stamped); offline it assumes a version of its own, which this range excludes.
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text('apiVersion: v2\nname: probe\nversion: 0.1.0\nkubeVersion: ">=1.37.2-0 <1.37.3-0"\n')
    (chart / "templates" / "seen.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: seen}\n'
        'data: {kubeVersion: "{{ .Capabilities.KubeVersion.Version }}"}\n')
    helm = subprocess.run([str(HELM), "template", "probe", str(chart), "--dry-run=server",
                           f"--kubeconfig={real_node.cp.admin_kubeconfig}"], capture_output=True, text=True, timeout=60)
    assert helm.returncode == 0, helm.stderr
    assert yaml.safe_load(helm.stdout)["data"] == {"kubeVersion": "v1.37.2"}


def test_a_pod_of_the_class_is_charged_its_limits_plus_pod_fixed(
        real_node: Node, namespace: str, runtime_class: str) -> None:
    # Two containers, so the pod cgroup is the sum of both plus the class's podFixed.
    pod = real_node.pod("charged", namespace=namespace, runtime_class=runtime_class,
                        limits={"cpu": "1", "memory": "400Mi"})
    second = dict(pod["spec"]["containers"][0], name="second", resources={"limits": {"cpu": "500m", "memory": "200Mi"}})
    pod["spec"]["containers"].append(second)
    running = real_node.run_pod(pod)

    # Admission copied the class's overhead into the pod; the kubelet adds it to the pod cgroup.
    assert running["spec"]["overhead"] == POD_FIXED
    memory = real_node.pod_cgroup(running, "memory")
    assert int((memory / "memory.limit_in_bytes").read_text()) == (400 + 200 + 358) * MIB
    cpu = real_node.pod_cgroup(running, "cpu")
    period_us = int((cpu / "cpu.cfs_period_us").read_text())
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == (1000 + 500 + 250) * period_us // 1000
    # Each container keeps its own limit; only the pod level carries podFixed (the third
    # cgroup under the pod is the sandbox's pause process, which has no limit of its own).
    limits = sorted(int((d / "memory.limit_in_bytes").read_text()) for d in memory.iterdir() if d.is_dir())
    assert limits[:2] == [200 * MIB, 400 * MIB] and len(limits) == 3 and limits[2] > 2**60, limits


def test_a_pod_whose_limits_fit_but_limits_plus_pod_fixed_do_not_is_refused(
        real_node: Node, namespace: str, runtime_class: str) -> None:
    allocatable_bytes = memory_bytes(real_node.allocatable()["memory"])
    # Fits by its limit alone (other pods of the node hold none), not with podFixed on top.
    limit = f"{(allocatable_bytes - 100 * MIB) // MIB}Mi"
    too_big = real_node.pod("too-big", namespace=namespace, runtime_class=runtime_class,
                            limits={"cpu": "100m", "memory": limit})
    real_node.cp.create(f"/api/v1/namespaces/{namespace}/pods", too_big)

    def unschedulable(pod: dict) -> bool:
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                   for c in pod.get("status", {}).get("conditions", []))
    refused = real_node.wait_pod(too_big, unschedulable, "refused by the scheduler")
    assert refused["status"]["phase"] == "Pending"
    message = next(c["message"] for c in refused["status"]["conditions"] if c["type"] == "PodScheduled")
    assert "Insufficient memory" in message, message

    # Bound to the node directly (no scheduler), the kubelet's own admission refuses it.
    bound = real_node.pod("too-big-bound", namespace=namespace, runtime_class=runtime_class,
                          limits={"cpu": "100m", "memory": limit}, nodeName=real_node.name)
    real_node.cp.create(f"/api/v1/namespaces/{namespace}/pods", bound)
    rejected = real_node.wait_pod(bound, lambda p: p.get("status", {}).get("phase") == "Failed", "Failed")
    assert rejected["status"]["reason"] == "OutOfmemory", rejected["status"]

    # The same limits without the class's overhead fit: podFixed is what tipped it.
    plain = real_node.pod("plain", namespace=namespace, limits={"cpu": "100m", "memory": limit})
    assert real_node.run_pod(plain)["spec"]["nodeName"] == real_node.name


def test_a_pod_reaches_the_api_server_with_its_in_cluster_configuration(real_node: Node, namespace: str) -> None:
    script = ("echo KUBERNETES_SERVICE_HOST=$KUBERNETES_SERVICE_HOST; /podtool kube-get /api; "
              f"/podtool kube-get /api/v1/namespaces/{namespace}/secrets; exit 0")
    pod = real_node.pod("in-cluster", namespace=namespace, command=["sh", "-c", script])
    real_node.cp.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    real_node.wait_pod(pod, lambda p: p.get("status", {}).get("phase") == "Succeeded", "Succeeded")
    # Read through the API server and the kubelet (logs need the API server's kubelet client).
    log = real_node.kubectl("logs", "-n", namespace, "in-cluster").stdout

    assert "KUBERNETES_SERVICE_HOST=10.96.0.1" in log, log
    # The CA of kube-root-ca.crt verified the server on 10.96.0.1 (podtool refuses otherwise).
    discovery = log.split("GET https://10.96.0.1:443/api: 200 OK\n", 1)[1].splitlines()[0]
    assert json.loads(discovery)["kind"] == "APIVersions"
    # The projected token authenticated the pod as its ServiceAccount, which RBAC does not let
    # read secrets: the refusal names the identity.
    assert f'User \\"system:serviceaccount:{namespace}:default\\" cannot list resource \\"secrets\\"' in log, log


def test_the_summary_api_reports_the_pods_working_set_and_what_is_not_the_workload(
        real_node: Node, namespace: str, runtime_class: str) -> None:
    pod = real_node.pod("holder", namespace=namespace, runtime_class=runtime_class,
                        command=["/podtool", "hold", "64"], limits={"cpu": "200m", "memory": "256Mi"})
    running = real_node.run_pod(pod)
    poll(lambda: "holding 64 MiB" in real_node.kubectl("logs", "-n", namespace, "holder").stdout, 30,
         "podtool holds 64 MiB")
    # kubectl exec goes through the API server to the kubelet's streaming server.
    assert real_node.kubectl("exec", "-n", namespace, "holder", "--", "cat", "/proc/1/cmdline").stdout \
        .split("\0")[:3] == ["/podtool", "hold", "64"]
    # The pod cgroup the kubelet reads is the one whose limit carries podFixed.
    cgroup = real_node.pod_cgroup(running, "memory")
    assert int((cgroup / "memory.limit_in_bytes").read_text()) == (256 + 358) * MIB

    def measured() -> dict | None:
        for entry in real_node.stats_summary().get("pods", []):
            if entry["podRef"]["uid"] != running["metadata"]["uid"]:
                continue
            pod_ws = entry.get("memory", {}).get("workingSetBytes", 0)
            containers_ws = sum(c.get("memory", {}).get("workingSetBytes", 0) for c in entry["containers"])
            if containers_ws >= 64 * MIB and pod_ws - containers_ws >= 48 * MIB:
                return entry
        return None

    # A host process in the pod's cgroup, as a Kata sandbox's shim and VMM are, is part of the
    # pod's working set and of no container's: the part of the pod that is not the workload.
    with real_node.hold_memory_in_pod(running, 48) as helper:
        try:
            assert helper.stdout is not None and helper.stdout.readline() == "holding 48 MiB\n"
            assert str(helper.pid) in (cgroup / "cgroup.procs").read_text().split()
            entry = poll(measured, 60, "the Summary API reports the container's 64 MiB and 48 MiB outside it",
                         interval=1)
        finally:
            helper.kill()
    container = next(c for c in entry["containers"] if c["name"] == "main")
    assert 64 * MIB <= container["memory"]["workingSetBytes"] < (64 + 16) * MIB
    outside = entry["memory"]["workingSetBytes"] - container["memory"]["workingSetBytes"]
    assert 48 * MIB <= outside < (48 + 16) * MIB, outside  # podtool's own runtime and the pause process
