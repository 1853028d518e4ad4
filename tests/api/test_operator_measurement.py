"""The measurement in the operator, on the emulator (docs/measurement.md): kubelet Summaries served
through the API server's node proxy path, read at the policy's interval (run faster than real
time: a measurement.Clock), written to status.measurement, with the near-OOM warning as an
event and a metric, a failing node skipped and said, the off switch, and a survey in a
ConfigMap proposed in status.proposal."""

from __future__ import annotations

import re
import time

import pytest

from kata_sizing.controller import metrics
from kata_sizing.controller.kubelet import KubeletOptions
from kata_sizing.controller.measurement import Clock
from tests.support.operator_helpers import event_messages, status, update_spec, wait_for, wait_observed
from tests.support.policies import explicit_classes_policy
from tests.support.summaries import MIB, Figures, json_response, kata_pod, node, summary

pytestmark = pytest.mark.emulator

SPEED = 10.0  # measurement seconds per real second: the 15 s interval takes 1.5 s
PROXY = re.compile(r"^/api/v1/nodes/([^/]+)/proxy/stats/summary$")
CLASSES = [{"name": "s", "cpu": "1", "memory": "1Gi"}, {"name": "m", "cpu": "2", "memory": "4Gi"}]


class Fleet:
    """Nodes and Kata pods in the emulator, and the Summary each node's kubelet answers with."""

    def __init__(self, emu):
        self.emu = emu
        self.figures: dict[str, Figures] = {}
        self.failing: dict[str, int] = {}  # node -> HTTP status its kubelet answers with
        emu.serve_node_proxy(self.answer)

    async def answer(self, node_name: str, path: str):
        if path != "stats/summary":
            return json_response({"kind": "Status", "code": 404}, 404)
        if node_name in self.failing:
            return json_response({"kind": "Status", "message": "kubelet failed", "code": self.failing[node_name]},
                                 self.failing[node_name])
        pods = [p for p in self.emu.objects("v1/pods").list() if p["spec"].get("nodeName") == node_name]
        return json_response(summary(node_name, pods, lambda pod: self.figures.get(
            pod["metadata"]["name"], Figures(100 * MIB, 20 * MIB))))

    def add_node(self, name: str) -> None:
        self.emu.objects("v1/nodes").create(node(name))

    def add_pod(self, name: str, node_name: str, runtime_class: str | None, limit: str, pod_fixed: str,
                figures: Figures | None = None) -> dict:
        body = kata_pod(name, node_name, runtime_class or "", limit, pod_fixed)
        if runtime_class is None:
            del body["spec"]["runtimeClassName"], body["spec"]["overhead"]
        if figures is not None:
            self.figures[name] = figures
        return self.emu.objects("v1/pods").create(body, "fleet")

    def reads(self, node_name: str | None = None) -> list:
        return [r for r in self.emu.requests("GET", PROXY)
                if node_name is None or (match := PROXY.match(r.path)) is not None and match.group(1) == node_name]


def valid_status(emu, policy: str) -> dict:
    """The policy's status, checked against the CRD's schema models (the API server would prune
    a field they do not name)."""
    from kata_sizing.core.statusmodel import KataSizingPolicyStatus

    found = status(emu, policy)
    KataSizingPolicyStatus.model_validate(found)
    return found


def measured_class(emu, policy: str, name: str) -> dict:
    for found in (status(emu, policy).get("measurement") or {}).get("classes") or []:
        if found["name"] == name:
            return found
    return {}


@pytest.fixture(autouse=True)
def _status_refresh(monkeypatch):
    """The guidance timer writes the measurement to status; every half second here, not 10 s."""
    from kata_sizing.controller import worker

    monkeypatch.setattr(worker, "GUIDANCE_INTERVAL_S", 0.5)


def start(cluster, **measurement) -> None:
    cluster.start(kubelet=KubeletOptions(access="apiserver", timeout_s=2), measurement_clock=Clock.faster(SPEED))
    body = explicit_classes_policy(classes=CLASSES)
    body["spec"]["measurement"] = {"intervalSeconds": 15, "windowSeconds": 300, **measurement}
    cluster.create(body)
    wait_observed(cluster.emu, "qemu-rs", timeout=20, Ready="True")


def pod_fixed_mib(emu, class_name: str, field: str = "podFixed") -> int:
    for found in status(emu, "qemu-rs")["classes"]:
        if found["name"] == class_name:
            value = found[field]["memory"] if field == "podFixed" else found[field]
            return int(value.removesuffix("Mi"))
    raise AssertionError(class_name)


def test_each_class_is_measured_and_written_to_status(cluster):
    emu = cluster.emu
    fleet = Fleet(emu)
    for name in ("n1", "n2", "n3"):
        fleet.add_node(name)
    start(cluster)
    s_fixed, m_fixed = pod_fixed_mib(emu, "s"), pod_fixed_mib(emu, "m")
    fleet.add_pod("s-0", "n1", "kata-qemu-rs-s", "512Mi", f"{s_fixed}Mi", Figures(300 * MIB, 100 * MIB))
    fleet.add_pod("s-1", "n1", "kata-qemu-rs-s", "512Mi", f"{s_fixed}Mi", Figures(200 * MIB, 90 * MIB))
    fleet.add_pod("m-0", "n2", "kata-qemu-rs-m", "2Gi", f"{m_fixed}Mi", Figures(1500 * MIB, 150 * MIB))
    fleet.add_pod("runc-0", "n3", None, "1Gi", "0")

    s = wait_for(lambda: (lambda c: c if c.get("samples", 0) >= 4 else None)(measured_class(emu, "qemu-rs", "s")),
                 20, lambda: repr(status(emu, "qemu-rs").get("measurement")))
    assert s["podsMeasured"] == 2 and s["runtimeClass"] == "kata-qemu-rs-s"
    assert (s["overheadMaxBytes"], s["overheadMaxPod"]) == (100 * MIB, "fleet/s-0")
    # The least headroom: s-0's cgroup limit (its limit + its podFixed) less its working set.
    assert s["minHeadroomBytes"] == (512 + s_fixed) * MIB - 400 * MIB
    assert (s["minHeadroomPod"], s["minHeadroomNode"]) == ("fleet/s-0", "n1")
    assert abs(s["overheadP99Bytes"] - 100 * MIB) <= 0.005 * 100 * MIB
    assert s["overheadP50Bytes"] in range(int(89.5 * MIB), int(100.5 * MIB))
    assert s["podsUnderThreshold"] == 0 and s["lastMeasured"].endswith("Z")
    m = wait_for(lambda: measured_class(emu, "qemu-rs", "m").get("samples"), 10) and measured_class(emu, "qemu-rs", "m")
    assert m["overheadMaxBytes"] == 150 * MIB
    section = valid_status(emu, "qemu-rs")["measurement"]
    assert (section["intervalSeconds"], section["windowSeconds"], section["nodes"]) == (15, 300, 2)
    # Only nodes running a pod of the policy's classes are read: n3 runs runc pods only.
    assert fleet.reads("n1") and fleet.reads("n2") and not fleet.reads("n3")
    # One read per node per interval (1.5 s real here).
    reads = fleet.reads("n1")
    gaps = [b.at - a.at for a, b in zip(reads, reads[1:])]
    assert gaps and min(gaps) > 0.8 * 15 / SPEED, gaps


def test_a_pod_close_to_its_limit_raises_the_warning_and_it_clears(cluster):
    emu = cluster.emu
    fleet = Fleet(emu)
    fleet.add_node("n1")
    start(cluster)
    s_fixed, s_budget = pod_fixed_mib(emu, "s"), pod_fixed_mib(emu, "s", "overheadMemory")
    # The line: 10% of what podFixed holds beyond the guest budget (the host side's share: 50 MiB).
    line_mib = (s_fixed - s_budget) / 10
    fleet.add_pod("s-0", "n1", "kata-qemu-rs-s", "512Mi", f"{s_fixed}Mi", Figures(300 * MIB, 100 * MIB))
    wait_for(lambda: measured_class(emu, "qemu-rs", "s").get("samples"), 20)
    assert event_messages(emu, "HeadroomLow") == []
    # The VMM grows: 3 MiB short of the cgroup limit, under the line.
    fleet.figures["s-0"] = Figures(500 * MIB, (12 + s_fixed - 3) * MIB)
    low = wait_for(lambda: event_messages(emu, "HeadroomLow", "Warning"), 20)
    assert low == [f"pod fleet/s-0 (class s) on node n1: working set {512 + s_fixed - 3:.1f}Mi of its cgroup limit "
                   f"{512 + s_fixed:.1f}Mi leaves 3.0Mi, under {line_mib:.1f}Mi (10% of podFixed.memory beyond the guest "
                   "budget): its VMM is close to an OOM kill"]
    listed = wait_for(lambda: status(emu, "qemu-rs")["measurement"]["underThreshold"], 20)
    valid_status(emu, "qemu-rs")
    assert [(p["pod"], p["class"], p["headroomBytes"]) for p in listed] == [("fleet/s-0", "s", 3 * MIB)]
    assert metric("kata_sizing_pods_headroom_low", policy="qemu-rs", **{"class": "s"}) == 1
    assert metric("kata_sizing_pod_headroom_min_bytes", policy="qemu-rs", **{"class": "s"}) == 3 * MIB
    # It shrinks again: the warning clears.
    fleet.figures["s-0"] = Figures(300 * MIB, 100 * MIB)
    cleared = wait_for(lambda: event_messages(emu, "HeadroomRecovered", "Normal"), 20)
    assert cleared == [f"pod fleet/s-0 (class s) on node n1: headroom no longer under {line_mib:.1f}Mi (10%)"]
    wait_for(lambda: status(emu, "qemu-rs")["measurement"]["underThreshold"] == [], 20)
    assert metric("kata_sizing_pods_headroom_low", policy="qemu-rs", **{"class": "s"}) == 0
    # The window still remembers the least headroom seen.
    assert measured_class(emu, "qemu-rs", "s")["minHeadroomBytes"] == 3 * MIB


def test_a_failing_node_is_skipped_and_said_without_holding_up_the_others(cluster):
    emu = cluster.emu
    fleet = Fleet(emu)
    for name in ("n1", "n2"):
        fleet.add_node(name)
    fleet.failing["n2"] = 500
    start(cluster)
    s_fixed = pod_fixed_mib(emu, "s")
    fleet.add_pod("s-0", "n1", "kata-qemu-rs-s", "512Mi", f"{s_fixed}Mi")
    fleet.add_pod("s-1", "n2", "kata-qemu-rs-s", "512Mi", f"{s_fixed}Mi")
    section = wait_for(lambda: (lambda m: m if m.get("nodesSkipped") else None)(
        status(emu, "qemu-rs").get("measurement") or {}), 20)
    assert section["nodes"] == 2
    [skipped] = section["skipped"]
    valid_status(emu, "qemu-rs")
    assert skipped["node"] == "n2" and "kubelet failed" in skipped["reason"]
    wait_for(lambda: measured_class(emu, "qemu-rs", "s").get("samples", 0) >= 3, 20)
    assert measured_class(emu, "qemu-rs", "s")["podsMeasured"] == 1
    del fleet.failing["n2"]
    wait_for(lambda: measured_class(emu, "qemu-rs", "s").get("podsMeasured") == 2
             and status(emu, "qemu-rs")["measurement"]["nodesSkipped"] == 0, 20)


def test_the_off_switch_stops_the_reads_and_removes_the_section(cluster):
    emu = cluster.emu
    fleet = Fleet(emu)
    fleet.add_node("n1")
    start(cluster)
    fleet.add_pod("s-0", "n1", "kata-qemu-rs-s", "512Mi", "358Mi")
    wait_for(lambda: measured_class(emu, "qemu-rs", "s").get("samples"), 20)
    update_spec(emu, "qemu-rs", lambda spec: spec["measurement"].update(enabled=False))
    wait_for(lambda: "measurement" not in status(emu, "qemu-rs"), 20)
    before = len(fleet.reads())
    time.sleep(3 * 15 / SPEED)  # three intervals
    assert len(fleet.reads()) <= before + 1  # at most one read that was already under way


def test_a_survey_in_a_configmap_is_proposed_in_status_and_never_applied(cluster):
    from kata_sizing.core.model import parse_policy
    from kata_sizing.core.sizing import explain_pod, size_policy

    emu = cluster.emu
    emu.objects("v1/namespaces").create({"metadata": {"name": "kata-sizing"}})
    body = explicit_classes_policy(classes=CLASSES)
    sizing = size_policy(parse_policy(body))
    rows = ["node,pod,class,container_limit_mib,vm_nominal_mib,pod_working_set_bytes,containers_working_set_bytes,"
            "pod_cgroup_limit_bytes"]
    for index, (class_name, limit) in enumerate([("s", 256), ("s", 1024), ("m", 2048), ("m", 4096)]):
        vm = explain_pod(sizing, class_name, None, limit * MIB).vm.memory_mib
        pod_fixed = sizing.class_named(class_name).pod_fixed_memory_mib
        rows.append(f"n1,fleet/p{index},{class_name},{limit},{vm},{(limit // 2 + 140 + vm // 20) * MIB},"
                    f"{limit // 2 * MIB},{(limit + pod_fixed) * MIB}")
    emu.objects("v1/configmaps").create({"metadata": {"name": "qemu-rs-survey", "namespace": "kata-sizing"},
                                         "data": {"survey.csv": "\n".join(rows) + "\n"}})
    body["spec"]["overhead"] = {"survey": {"configMap": "qemu-rs-survey"}}
    cluster.start(kubelet=KubeletOptions(access="apiserver"))
    cluster.create(body)
    wait_observed(emu, "qemu-rs", timeout=20, Ready="True")
    proposal = wait_for(lambda: status(emu, "qemu-rs").get("proposal"), 20)
    valid_status(emu, "qemu-rs")
    assert proposal["source"] == "ConfigMap kata-sizing/qemu-rs-survey key survey.csv"
    assert proposal["rows"] == 4
    assert proposal["overhead"]["guestMemoryRatio"] == "0.0500"
    assert all(c["minHeadroomBytes"] >= 0 for c in proposal["classes"])
    # Proposed, not applied: the RuntimeClasses keep the policy's podFixed.
    current = {c["name"]: c["podFixed"] for c in status(emu, "qemu-rs")["classes"]}
    assert {c["name"]: c["podFixedBefore"] for c in proposal["classes"]} == current
    assert emu.objects("runtimeclasses").get("kata-qemu-rs-s")["overhead"]["podFixed"] == current["s"]
    # A survey that cannot be read is said in the proposal, not as an invalid policy.
    emu.objects("v1/configmaps").put({"metadata": {"name": "qemu-rs-survey", "namespace": "kata-sizing"},
                                      "data": {"survey.csv": "node,pod\n"}})
    update_spec(emu, "qemu-rs", lambda spec: spec["classes"][0].update(cpu="1500m"))  # a pass reads it again
    error = wait_for(lambda: (status(emu, "qemu-rs").get("proposal") or {}).get("error"), 20)
    assert "missing column(s) container_limit_mib, vm_nominal_mib" in error
    wait_observed(emu, "qemu-rs", timeout=20, Ready="True")


def metric(name: str, **labels: str) -> float | None:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return value
