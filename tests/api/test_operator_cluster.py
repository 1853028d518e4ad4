"""The operator's cluster-facing parts against the emulator: node guidance from live Nodes and
Pods, the audit of Kata RuntimeClasses no policy manages, and overhead fitted from samples."""

from __future__ import annotations

import copy
import csv

import pytest
import yaml

from kata_sizing.controller import worker
from tests.support.operator_helpers import (
    condition,
    event_messages,
    get_cm,
    settle,
    status,
    wait_for,
    wait_observed,
)
from tests.support.paths import FIXTURES
from tests.support.policies import example

pytestmark = pytest.mark.emulator

NAME = "qemu-rs"
GUIDANCE = f"{NAME}-node-guidance"
KATA_LABEL = {"katacontainers.io/kata-runtime": "true"}
SURVEY = FIXTURES / "survey-aks-clh-snp.csv"


def node(name: str, capacity: str = "256Gi", allocatable: str = "248Gi", cpu: str = "64",
         labels: dict | None = None) -> dict:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": dict(KATA_LABEL if labels is None else labels)},
        "status": {"capacity": {"memory": capacity, "cpu": cpu},
                   "allocatable": {"memory": allocatable, "cpu": cpu}},
    }


def pod(name: str, node_name: str, memory: str, runtime_class: str | None = None,
        init_memory: str | None = None, phase: str = "Running", namespace: str = "kube-system") -> dict:
    spec: dict = {"nodeName": node_name, "containers": [
        {"name": "c", "image": "i", "resources": {"requests": {"memory": memory}}}]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    if init_memory:
        spec["initContainers"] = [{"name": "init", "image": "i", "resources": {"requests": {"memory": init_memory}}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": spec, "status": {"phase": phase}}


def guidance_documents(emu) -> dict[str, dict]:
    cm = get_cm(emu, GUIDANCE) or {}
    return {k: yaml.safe_load(v) for k, v in (cm.get("data") or {}).items() if k.endswith(".yaml")}


@pytest.fixture
def fast_guidance(monkeypatch):
    monkeypatch.setattr(worker, "GUIDANCE_INTERVAL_S", 0.3)


def test_guidance_comes_from_the_live_nodes_and_the_infra_pods_on_them(cluster, fast_guidance):
    emu = cluster.emu
    for name in ("n1", "n2"):
        emu.objects("nodes").create(node(name))
    emu.objects("nodes").create(node("other", labels={}))
    # n1: 1Gi of CNI, and a pod whose init container (3Gi) outweighs its app container (1Gi).
    emu.objects("pods").create(pod("cni-n1", "n1", "1Gi"))
    emu.objects("pods").create(pod("job-n1", "n1", "1Gi", init_memory="3Gi"))
    # Not infra: a Kata pod, a finished pod, a pod on a node outside the selector.
    emu.objects("pods").create(pod("app", "n1", "8Gi", runtime_class="kata-qemu-rs-m", namespace="apps"))
    emu.objects("pods").create(pod("done", "n1", "16Gi", phase="Succeeded"))
    emu.objects("pods").create(pod("cni-other", "other", "4Gi"))
    # n2: 2Gi of CNI.
    emu.objects("pods").create(pod("cni-n2", "n2", "2Gi"))
    cluster.start()
    cluster.create(example())

    wait_for(lambda: get_cm(emu, GUIDANCE), message="the node-guidance ConfigMap")
    (document,) = guidance_documents(emu).values()
    assert document["nodes"] == ["n1", "n2"]
    assert document["allocatable"]["memory"] == "248Gi"
    assert document["infraPodMemoryByNode"] == {"n1": "4Gi", "n2": "2Gi"}
    # /dev/shm must hold every VM the kubelet admits: the node with the least infra sets it.
    assert document["infraPodMemory"] == "2Gi"
    assert document["devShm"]["size"] == "246Gi"
    assert document["devShm"]["fstab"] == "none /dev/shm tmpfs defaults,nosuid,nodev,size=246g 0 0"
    assert document["devShm"]["remount"] == "mount -o remount,size=246g /dev/shm"
    assert document["kubeletConfiguration"]["systemReserved"] == {"memory": "4Gi"}
    assert set(document["vmsPerClass"]) == {"s", "m", "l", "xl"}
    assert document["warnings"] == []
    summary = get_cm(emu, GUIDANCE)["data"]["summary.txt"]
    assert "n1, n2" in summary and "size=246g" in summary
    assert wait_observed(emu, NAME, Ready="True")["nodes"] == {"seen": 2, "groups": 1, "withWarnings": 0}


def test_a_kubelet_not_configured_as_the_policy_says_is_a_warning(cluster, fast_guidance):
    emu = cluster.emu
    emu.objects("nodes").create(node("n1", allocatable="250Gi"))
    cluster.start()
    cluster.create(example())
    wait_for(lambda: get_cm(emu, GUIDANCE), message="the node-guidance ConfigMap")
    (document,) = guidance_documents(emu).values()
    assert document["allocatable"] == {"memory": "248Gi", "observedMemory": "250Gi"}
    assert any("kubelet reports allocatable 250Gi" in w for w in document["warnings"])
    wait_for(lambda: (status(emu, NAME).get("nodes") or {}).get("withWarnings") == 1,
             message="status.nodes.withWarnings")


def test_dev_shm_is_not_the_limit_for_cloud_hypervisor(cluster, fast_guidance):
    emu = cluster.emu
    emu.objects("nodes").create(node("n1"))
    body = example()
    body["spec"]["shim"] = "clh-runtime-rs"
    cluster.start()
    cluster.create(body)
    wait_for(lambda: get_cm(emu, GUIDANCE), message="the node-guidance ConfigMap")
    (document,) = guidance_documents(emu).values()
    assert document["devShm"]["applies"] is False
    assert "memfd" in document["devShm"]["reason"]
    assert all("byDevShm" not in fit for fit in document["vmsPerClass"].values())


def test_guidance_follows_pod_changes_and_is_quiet_when_nothing_changes(cluster, fast_guidance):
    emu = cluster.emu
    emu.objects("nodes").create(node("n1"))
    cluster.start()
    cluster.create(example())
    wait_for(lambda: get_cm(emu, GUIDANCE), message="the node-guidance ConfigMap")
    wait_observed(emu, NAME, Ready="True")
    settle(emu)

    emu.reset_request_log()
    settle(emu, quiet_s=1.2)  # four debounce ticks with nothing changed
    assert [r for r in emu.request_log if not r.is_watch] == []

    emu.objects("pods").create(pod("monitoring", "n1", "64Gi"))
    wait_for(lambda: next(iter(guidance_documents(emu).values()))["devShm"]["size"] == "184Gi",
             message="/dev/shm shrinks by the new infra pod's request")


def test_unmanaged_kata_runtime_classes_are_audited_in_status(cluster, fast_guidance):
    emu = cluster.emu
    emu.objects("runtimeclasses").create({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "kata-qemu"},
        "handler": "kata-qemu", "overhead": {"podFixed": {"memory": "320Mi", "cpu": "250m"}},
    })
    emu.objects("runtimeclasses").create({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "gvisor"},
        "handler": "runsc",
    })
    cluster.start()
    cluster.create(example())
    found = wait_for(lambda: status(emu, NAME).get("unmanagedRuntimeClasses"), message="the audit in status")
    errors = [f for f in found if f["severity"] == "error"]
    assert [f["runtimeClass"] for f in errors] == ["kata-qemu"]
    assert "320Mi" in errors[0]["message"] and "default_memory 2Gi" in errors[0]["message"]
    assert "2098Mi" in errors[0]["fix"]
    assert all(f["runtimeClass"] != "gvisor" for f in found)
    assert all(not f["runtimeClass"].startswith("kata-qemu-rs-") for f in found), "our own classes are managed"
    # The event is posted after the status write of the same pass: wait for it, do not race it.
    wait_for(lambda: any("kata-qemu" in m for m in event_messages(emu, "UnmanagedRuntimeClassAudit", "Warning")),
             message="a Warning event names kata-qemu")

    emu.objects("runtimeclasses").delete("kata-qemu")
    wait_for(lambda: status(emu, NAME).get("unmanagedRuntimeClasses") == [],
             message="the audit clears when the RuntimeClass is gone")


def _survey_samples() -> list[dict]:
    rows = []
    lines = [line for line in SURVEY.read_text().splitlines() if line and not line.startswith("#")]
    for row in csv.DictReader(lines):
        rows.append({
            "containerLimitMib": int(row["container_limit_mib"]),
            "vmNominalMib": int(row["vm_nominal_mib"]),
            "freeTotalMib": int(row["free_total_mib"]),
            "freeUsedMib": int(row["free_used_mib"]),
            "podCgroupMemoryCurrentBytes": int(row["pod_cgroup_memory_current_bytes"]),
        })
    return rows


def test_samples_in_the_policy_replace_the_default_function_and_show_in_status(cluster):
    emu = cluster.emu
    body = example()
    body["spec"]["overhead"] = {"samples": _survey_samples()}
    cluster.start()
    cluster.create(body)
    overhead = wait_observed(emu, NAME, Ready="True")["overhead"]
    assert overhead["fitted"] is True
    # The measured host side (24 MiB at most) with the policy's margin (0.10), as calibrate gives it.
    assert (overhead["guestMemoryBase"], overhead["guestMemoryRatio"], overhead["hostMemory"]) == (
        "95Mi", "0.1352", "26Mi")


def test_samples_that_cannot_be_fitted_make_the_policy_invalid(cluster):
    emu = cluster.emu
    body = example()
    samples = _survey_samples()[:2]
    # The second VM loses 95% of itself: a ratio far outside [0, 0.9).
    samples[1] = {**samples[1], "vmNominalMib": 4000, "freeTotalMib": 200, "freeUsedMib": 0,
                  "containerLimitMib": 100}
    body["spec"]["overhead"] = {"samples": copy.deepcopy(samples)}
    cluster.start()
    cluster.create(body)
    wait_observed(emu, NAME, Valid="False")
    assert "spec.overhead.samples" in condition(emu, NAME, "Valid")["message"]
    assert emu.objects("runtimeclasses").list() == []


def _passes(trigger: str | None = None) -> float:
    """Reconcile passes this process has run (the operator runs in this process's thread)."""
    from kata_sizing.controller import metrics

    return sum(s.value for m in metrics.REGISTRY.collect() if m.name == "kata_sizing_reconciles"
               for s in m.samples if s.name.endswith("_total") and (trigger is None or s.labels["trigger"] == trigger))


def test_a_change_to_one_policys_runtime_class_makes_no_policy_reconcile(cluster, fast_guidance):
    emu = cluster.emu
    cluster.start()
    for name in ("qemu-rs", "other"):
        body = example()
        body["metadata"]["name"] = name
        body["spec"]["runtimeClass"]["namePrefix"] = f"kata-{name}"
        cluster.create(body)
        wait_observed(emu, name, Ready="True")
    settle(emu, quiet_s=1.0)
    before = _passes()

    # A hand edit of one class: put back by one pass of its policy, queued by the drift event;
    # neither policy's guidance timer (every 0.3 s here) takes it for a reason to reconcile.
    drift_before = _passes("drift")
    rc = emu.objects("runtimeclasses").get("kata-qemu-rs-m")
    rc["overhead"]["podFixed"]["memory"] = "1Mi"
    emu.objects("runtimeclasses").put(rc)
    wait_for(lambda: emu.objects("runtimeclasses").get("kata-qemu-rs-m")["overhead"]["podFixed"]["memory"] != "1Mi")
    settle(emu, quiet_s=1.5)
    assert _passes("drift") == drift_before + 1
    assert _passes() == before + 1
    before = _passes()

    # A Kata RuntimeClass nobody manages changes the audit every policy reports: one pass each.
    emu.objects("runtimeclasses").create({"metadata": {"name": "kata-qemu"}, "handler": "kata-qemu",
                                          "overhead": {"podFixed": {"memory": "320Mi", "cpu": "250m"}}})
    wait_for(lambda: all(status(emu, n).get("unmanagedRuntimeClasses") for n in ("qemu-rs", "other")), 5)
    settle(emu, quiet_s=1.0)
    assert _passes() == before + 2
