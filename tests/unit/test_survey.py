"""survey -> calibrate -> proposal, on the core: rows from Summary readings, the CSV calibrate reads,
the fit of rows measured from the host only, and a proposal that covers every measured pod."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from kata_sizing.core.calibrate import CalibrationError, Sample, fit_overhead, parse_samples_csv
from kata_sizing.core.measure import KataPod, NodeReading, PodMeasurement
from kata_sizing.core.model import parse_policy
from kata_sizing.core.proposal import propose
from kata_sizing.core.sizing import explain_pod, size_policy
from kata_sizing.core.survey import survey_rows, to_csv
from tests.support.paths import FIXTURES

MIB = 1024 * 1024


def policy(name: str = "qemu-rs", **overhead) -> object:
    spec: dict[str, object] = {"shim": "qemu-runtime-rs", "classes": [
        {"name": "s", "cpu": "1", "memory": "1Gi"}, {"name": "m", "cpu": "2", "memory": "4Gi"}]}
    if overhead:
        spec["overhead"] = overhead
    return parse_policy({"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy",
                         "metadata": {"name": name}, "spec": spec})


def measurement(sizing, class_name: str, limit_mib: int, workload_mib: float, overhead_mib: float,
                usage_extra_mib: float = 8, index: int = 0, node: str = "n1") -> PodMeasurement:
    """A pod of `class_name` with a memory limit, whose containers use `workload_mib` and whose
    cgroup holds `overhead_mib` more."""
    sized = sizing.class_named(class_name)
    pod = KataPod(uid=f"{class_name}-{index}", pod=f"ns/{class_name}-{index}", runtime_class=sized.runtime_class,
                  node=node, memory_limit_bytes=limit_mib * MIB, pod_fixed_memory_bytes=sized.pod_fixed_memory_mib * MIB,
                  containers=("c",), set_cpu_millis=None, set_memory_bytes=limit_mib * MIB)
    containers = int(workload_mib * MIB)
    working_set = containers + int(overhead_mib * MIB)
    return PodMeasurement(pod, working_set, working_set + int(usage_extra_mib * MIB), containers)


def fleet(sizing, true_overhead, workload: float = 0.5) -> list[NodeReading]:
    """Pods of both classes at several limits, using `workload` of their limit; `true_overhead(vm_mib)`
    is what each holds beyond its workload."""
    measurements = []
    for index, (class_name, limit) in enumerate([("s", 256), ("s", 512), ("s", 1024), ("m", 2048), ("m", 4096)]):
        vm = explain_pod(sizing, class_name, None, limit * MIB).vm.memory_mib
        measurements.append(measurement(sizing, class_name, limit, limit * workload, true_overhead(vm), index=index,
                                        usage_extra_mib=0))
    return [NodeReading("n1", tuple(measurements[:3])), NodeReading("n2", tuple(measurements[3:]))]


def test_rows_carry_the_pod_its_class_its_vm_and_the_kubelets_figures():
    sizing = size_policy(policy())
    rows, notes = survey_rows(fleet(sizing, lambda vm: 40 + 0.05 * vm), sizing)
    assert notes == []
    first = rows[0]
    assert (first.node, first.pod, first.class_name) == ("n1", "ns/s-0", "s")
    assert first.container_limit_mib == 256
    # Rust runtime: the VM is the limit plus overhead_memory.
    assert first.vm_nominal_mib == 256 + sizing.class_named("s").overhead_memory_mib
    assert first.pod_cgroup_limit_bytes == (256 + sizing.class_named("s").pod_fixed_memory_mib) * MIB
    assert first.free_total_mib is None and first.unusable_mib is None
    assert first.overhead_used_mib == pytest.approx(40 + 0.05 * float(first.vm_nominal_mib), abs=1e-5)


def test_the_csv_reads_back_as_the_same_rows():
    sizing = size_policy(policy())
    rows, _ = survey_rows(fleet(sizing, lambda vm: 40 + 0.05 * vm), sizing)
    text = to_csv(rows, ["kata-sizing survey of policy qemu-rs"])
    assert text.startswith("# kata-sizing survey of policy qemu-rs\nnode,pod,class,accelerator,guest,host_processes,"
                           "devices,container_limit_mib,")
    # Each row says what it measured: a Kata pod, its shim, VMM and virtiofsd in its cgroup.
    assert text.splitlines()[2].startswith("n1,ns/s-0,s,kvm,kata-pod,kata-pod,kata,256,")
    back = parse_samples_csv(text)
    assert back == rows
    assert [(s.node, s.pod) for s in back] == [(s.node, s.pod) for s in rows]


def test_a_pod_not_measured_whole_is_left_out_with_the_reason():
    sizing = size_policy(policy())
    sized = sizing.class_named("s")
    pod = KataPod("u", "ns/p", sized.runtime_class, "n1", 256 * MIB, 0, ("c",), None, 256 * MIB)
    reading = NodeReading("n1", (PodMeasurement(pod, 300 * MIB, None, None, ("container c not in the Summary",)),))
    rows, notes = survey_rows([reading], sizing)
    assert rows == []
    assert notes == ["ns/p on n1: container c not in the Summary"]


def test_pods_of_another_policy_are_not_rows():
    sizing = size_policy(policy())
    pod = KataPod("u", "ns/p", "kata-other-s", "n1", 256 * MIB, 0, ("c",), None, 256 * MIB)
    rows, notes = survey_rows([NodeReading("n1", (PodMeasurement(pod, 300 * MIB, 300 * MIB, 100 * MIB),))], sizing)
    assert rows == [] and notes == []


def test_a_fit_from_the_host_side_with_the_host_assumed():
    """Lazily touched VMs (no row fully resident): overhead used less the policy's hostMemory
    stands for the guest; the host is not measured, so no hostMemory is proposed."""
    sizing = size_policy(policy())
    rows, _ = survey_rows(fleet(sizing, lambda vm: 50 + 40 + 0.05 * vm), sizing)
    fit = fit_overhead(rows, assumed_host_mib=50)
    assert fit.host_mib is None and fit.assumed_host_mib == 50
    assert fit.ratio == Decimal("0.05")
    assert fit.base_mib == 40
    assert "hostMemory" not in fit.overhead_block()
    assert fit.max_guest_daemons_mib is None
    assert any("50 MiB assumed" in note for note in fit.notes)


def test_fully_resident_rows_give_the_host_side_only():
    """A VM whose every page is resident (pod memory >= its nominal size) says nothing of the
    guest's split: its overhead used is the whole VM less the workload."""
    resident = Sample(container_limit_mib=Decimal(512), vm_nominal_mib=Decimal(640),
                      pod_cgroup_memory_current_bytes=(640 + 24) * MIB,
                      pod_working_set_bytes=(640 + 20) * MIB, containers_working_set_bytes=300 * MIB)
    lazy = [Sample(container_limit_mib=Decimal(limit), vm_nominal_mib=Decimal(limit + 128),
                   pod_working_set_bytes=(limit // 2 + 60 + 24) * MIB,
                   containers_working_set_bytes=(limit // 2) * MIB) for limit in (256, 1024)]
    fit = fit_overhead([resident, *lazy], assumed_host_mib=50)
    assert fit.host_mib == 24  # measured, so the lazy rows' guest is their overhead less 24
    assert fit.base_mib == 60 and fit.ratio == 0
    assert len(fit.residuals_mib) == 2
    assert any("fully resident" in note for note in fit.notes)
    with pytest.raises(CalibrationError, match=r"got 0 sample\(s\) at 0 size\(s\) \(1 fully resident"):
        fit_overhead([resident], assumed_host_mib=50)


def test_kubelet_rows_without_a_host_side_to_assume_are_refused():
    lazy = [Sample(container_limit_mib=Decimal(limit), vm_nominal_mib=Decimal(limit + 128),
                   pod_working_set_bytes=(limit + 60) * MIB // 2, containers_working_set_bytes=limit * MIB // 4)
            for limit in (256, 1024)]
    with pytest.raises(CalibrationError, match="no row measures the host side"):
        fit_overhead(lazy)


def test_a_row_needs_a_measurement_and_pairs_go_together():
    with pytest.raises(CalibrationError, match="no measurement"):
        Sample(container_limit_mib=Decimal(1), vm_nominal_mib=Decimal(2))
    with pytest.raises(CalibrationError, match="go together"):
        Sample(container_limit_mib=Decimal(1), vm_nominal_mib=Decimal(2), pod_working_set_bytes=5)
    with pytest.raises(CalibrationError, match="missing column"):
        parse_samples_csv("container_limit_mib,vm_nominal_mib,pod_working_set_bytes\n1,2,3\n")


@pytest.mark.parametrize("cell, message", [
    ("ns/pod name", "is not a pod \\(namespace/name\\): 'pod name' is not a DNS subdomain"),
    ("a" * 321, "longer than 320 characters"),
    ("ns/p\x1b[31m", "is not a DNS subdomain"),
    ("=ns/p", "'=ns' is not a DNS label"),
    ("ns/p,q", "is not a pod"),
    ("p", "is not a pod \\(namespace/name\\)"),
])
def test_text_cells_are_names(cell, message):
    text = ("pod,container_limit_mib,vm_nominal_mib,pod_working_set_bytes,containers_working_set_bytes\n"
            f"\"{cell}\",256,384,100,50\n")
    with pytest.raises(CalibrationError, match=message):
        parse_samples_csv(text)


def test_a_kubelet_row_below_its_vm_is_kept():
    row = parse_samples_csv(
        "container_limit_mib,vm_nominal_mib,pod_cgroup_memory_current_bytes,pod_working_set_bytes,"
        "containers_working_set_bytes\n256,384,1000,900,500\n")[0]
    assert not row.resident and row.host_mib is None
    assert row.overhead_used_mib == Decimal(400) / MIB


# --- the proposal ------------------------------------------------------------------------------


def covered(proposal, rows) -> list[tuple[str, int]]:
    pod_fixed = {c.name: int(Decimal(c.pod_fixed["memory"].removesuffix("Mi"))) for c in proposal.classes}
    return [(row.pod, math.ceil(row.container_limit_mib * MIB) + pod_fixed[row.class_name] * MIB
             - row.pod_working_set_bytes) for row in rows if row.pod_cgroup_limit_bytes is not None]


def test_a_proposal_from_a_survey_covers_every_measured_pod():
    current = policy()
    sizing = size_policy(current)
    rows, _ = survey_rows(fleet(sizing, lambda vm: 50 + 40 + 0.05 * vm), sizing)
    proposal = propose(current, parse_samples_csv(to_csv(rows)))
    assert proposal.rows == 5
    assert proposal.host_raised_mib == 0
    assert proposal.overhead == {"guestMemoryBase": "40Mi", "guestMemoryRatio": "0.0500", "margin": "0.10"}
    assert all(headroom >= 0 for _, headroom in covered(proposal, rows))
    by_name = {c.name: c for c in proposal.classes}
    assert by_name["s"].pods == 3 and by_name["m"].pods == 2
    assert by_name["s"].pod_fixed_before == sizing.class_named("s").pod_fixed
    assert proposal.uncovered == []


def test_a_fully_resident_pod_gives_the_host_side_with_its_margin_and_stays_above_its_line():
    """One pod's VM is fully resident (its cgroup holds the whole VM and more): it gives the host
    side, not a guest point; hostMemory is that host side with the margin, which keeps it (the pod
    with the least headroom) above its warning line in the VM the proposal gives it."""
    current = policy()
    sizing = size_policy(current)
    readings = fleet(sizing, lambda vm: 50 + 40 + 0.05 * vm)
    outlier = measurement(sizing, "s", 512, 400, 700, index=9, node="n3")
    rows, _ = survey_rows([*readings, NodeReading("n3", (outlier,))], sizing)
    proposal = propose(current, rows)
    assert proposal.fit.host_mib is not None  # measured on the resident VM
    assert proposal.overhead["hostMemory"] == f"{proposal.fit.host_with_margin_mib}Mi"
    by_name = {c.name: c for c in proposal.classes}
    assert by_name["s"].min_headroom_pod == "ns/s-9"
    # Its VM changes with the refit's guest budget, and a fully resident VM holds that change.
    resident = next(r for r in rows if r.pod == "ns/s-9")
    new_vm = explain_pod(size_policy(proposal.refitted), "s", None, 512 * MIB).vm.memory_mib
    pod_fixed = int(by_name["s"].pod_fixed["memory"].removesuffix("Mi"))
    assert by_name["s"].min_headroom_bytes == (
        (512 + pod_fixed) * MIB - resident.pod_working_set_bytes - int(new_vm - resident.vm_nominal_mib) * MIB)
    assert all(c.min_headroom_bytes >= c.warning_line_bytes for c in proposal.classes)


def test_an_explicit_podfixed_is_reported_not_refitted():
    """Pods at their limit holding 300 MiB beyond it: the refit gives class m room, class s keeps
    its explicit 290Mi (valid beside the refitted overhead_memory of 276 MiB) and stays short."""
    current = parse_policy({"metadata": {"name": "measured"}, "spec": {
        "shim": "qemu-runtime-rs", "fallback": {"cpu": "1", "memory": "128Mi"}, "classes": [
            {"name": "s", "cpu": "1", "memory": "1Gi", "podFixed": {"cpu": "300m", "memory": "290Mi"}},
            {"name": "m", "cpu": "2", "memory": "4Gi"}]}})
    sizing = size_policy(current)
    rows, _ = survey_rows(fleet(sizing, lambda vm: 300, workload=1.0), sizing)
    proposal = propose(current, rows)
    s = next(c for c in proposal.classes if c.name == "s")
    assert s.explicit_pod_fixed and s.pod_fixed == {"cpu": "300m", "memory": "290Mi"}
    assert next(c for c in proposal.classes if c.name == "m").min_headroom_bytes >= 0
    assert s.min_headroom_bytes < 0
    assert proposal.uncovered == [s]
    assert any("explicit podFixed" in note for note in proposal.notes)


def test_rows_of_a_class_the_policy_does_not_have_are_noted():
    current = policy()
    sizing = size_policy(current)
    rows, _ = survey_rows(fleet(sizing, lambda vm: 90 + 0.05 * vm), sizing)
    renamed = [Sample(**{**row.__dict__, "class_name": "xl"}) if row.class_name == "m" else row for row in rows]
    proposal = propose(current, renamed)
    assert any("xl are not classes of policy qemu-rs" in note for note in proposal.notes)


def test_the_by_hand_survey_still_fits_as_before():
    """The in-guest rows of the upstream survey: the same fit as calibrate gave before."""
    rows = parse_samples_csv((FIXTURES / "survey-aks-clh-snp.csv").read_text())
    fit = fit_overhead(rows)
    assert (fit.base_mib, fit.ratio, fit.host_mib) == (95, Decimal("0.1352"), 24)
    assert fit.notes == ()
