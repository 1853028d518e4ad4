"""What each survey row saw, and what calibrate makes of it (docs/sizing-model.md, "What each row saw"):
the kind columns' grammar, each part of a pod's memory from the rows that saw it or a stated default,
TCG's translation cache kept out of a KVM node's host side, a host side beyond its VM refused, and the
lowering rule of a proposal, on a probe's real figures (tests/fixtures/probe-tcg.csv: docs/probe.md's
TCG table) alone and with survey rows of live pods."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction

import pytest
import yaml

from kata_sizing.cli import main
from kata_sizing.core import defaults
from kata_sizing.core.calibrate import CalibrationError, Part, fit_overhead, parse_samples_csv
from kata_sizing.core.model import parse_policy
from kata_sizing.core.proposal import proposal_status, propose
from kata_sizing.core.sizing import explain_pod, size_policy
from kata_sizing.core.survey import index_pods, readings_from, survey_rows, to_csv
from tests.support.paths import ROOT
from tests.support.summaries import MIB, Figures, kata_pod, summary

PROBE = ROOT / "tests" / "fixtures" / "probe-tcg.csv"
EXAMPLE = ROOT / "examples" / "qemu-runtime-rs.yaml"
SURVEY = ROOT / "tests" / "fixtures" / "survey-aks-clh-snp.csv"
USERLAND, VIRTIOFSD, SHIM = defaults.GUEST_USERLAND_MIB, defaults.VIRTIOFSD_MIB, defaults.SHIM_MIB
# docs/probe.md: the VMs and the VMM cgroup's peak less the VM (MiB), tb-size=64.
PROBE_VMS = (128, 256, 512, 1024, 2048)
PEAK_BEYOND_VM = (84, 82, 84, 46, 47)


def example_policy():
    return parse_policy(yaml.safe_load(EXAMPLE.read_text()))


def probe_text(**replace: str) -> str:
    """The probe fixture with cells of its rows replaced ({column: value}: every row)."""
    lines = PROBE.read_text().splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.startswith("node,"))
    header = lines[header_at].split(",")
    out = lines[:header_at + 1]
    for line in lines[header_at + 1:]:
        cells = line.split(",")
        for column, value in replace.items():
            cells[header.index(column)] = value
        out.append(",".join(cells))
    return "\n".join(out) + "\n"


def parts_of(fit) -> dict[Part, object]:
    return {p.part: p for p in fit.parts}


# --- the kind columns: bounded words, refused with a line naming the column and the rule ---------

HEADER = ("accelerator,guest,host_processes,devices,container_limit_mib,vm_nominal_mib,free_total_mib,free_used_mib,"
          "pod_cgroup_memory_current_bytes,tcg_tb_size_mib,tcg_cache_resident_bytes")
GOOD = {"accelerator": "tcg", "guest": "kernel-only", "host_processes": "vmm", "devices": "serial+virtio-console",
        "container_limit_mib": "448", "vm_nominal_mib": "512", "free_total_mib": "470", "free_used_mib": "17.6",
        "pod_cgroup_memory_current_bytes": str(596 * MIB), "tcg_tb_size_mib": "64", "tcg_cache_resident_bytes": ""}


def one_row(**cells: str) -> str:
    row = {**GOOD, **cells}
    return HEADER + "\n" + ",".join(row[c] for c in HEADER.split(",")) + "\n"


@pytest.mark.parametrize("cells, message", [
    ({"accelerator": "xen"}, "line 2: accelerator 'xen' is not kvm or tcg"),
    ({"accelerator": ""}, "line 2: accelerator is empty: a probe's row (guest kernel-only) says kvm or tcg"),
    ({"tcg_tb_size_mib": ""}, "line 2: tcg_tb_size_mib is empty: a tcg row gives the size of its translation cache"),
    ({"tcg_tb_size_mib": "0"}, "line 2: tcg_tb_size_mib 0 is QEMU's default (up to 1 GiB"),
    ({"tcg_tb_size_mib": "64.5"}, "line 2: tcg_tb_size_mib: '64.5' is not a whole number"),
    ({"tcg_tb_size_mib": "5000"}, "line 2: tcg_tb_size_mib 5000 is above 4096"),
    ({"accelerator": "kvm"}, "line 2: tcg_tb_size_mib and tcg_cache_resident_bytes go with accelerator tcg only"),
    ({"guest": "kata"}, "line 2: guest 'kata' is not one of kata-pod, kata-image, kata-initrd, kernel-only"),
    ({"host_processes": "kata-pod"}, "line 2: host_processes 'kata-pod' does not go with guest kernel-only: a probe's "
                                     "VM counts vmm or vmm+virtiofsd"),
    ({"host_processes": ""}, "line 2: host_processes is empty: a probe's row (guest kernel-only) says vmm or"),
    ({"guest": "kata-pod", "host_processes": "vmm", "devices": "kata", "tcg_tb_size_mib": "", "accelerator": "kvm"},
     "line 2: host_processes 'vmm' does not go with guest kata-pod"),
    ({"guest": "kata-pod", "host_processes": "", "devices": ""},
     "line 2: accelerator 'tcg' does not go with guest kata-pod: Kata runs its VMs under KVM"),
    ({"devices": "serial+gpu"}, "line 2: devices 'serial+gpu': 'gpu' is not a device of the grammar"),
    ({"devices": "serial+serial"}, "line 2: devices 'serial+serial' names a device twice"),
    ({"devices": "kata"}, "line 2: devices kata goes with guest kata-pod"),
    ({"devices": "x" * 200}, "line 2: devices: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... is longer than 160 characters"),
    ({"guest": "kata-pod", "accelerator": "kvm", "host_processes": "", "devices": "vsock", "tcg_tb_size_mib": ""},
     "line 2: devices 'vsock' does not go with guest kata-pod: a Kata pod's row says kata"),
    # The VMM's cgroup held 1 TiB beyond a 306 MiB VM: not a sandbox's host side.
    ({"vm_nominal_mib": "306", "container_limit_mib": "50", "free_total_mib": "197",
      "pod_cgroup_memory_current_bytes": str(306 * MIB + 2**40)},
     "line 2: host side beyond its VM: the pod cgroup holds 1048576 MiB beyond its VM of 306 MiB"),
    ({"tcg_cache_resident_bytes": str(100 * MIB)},
     "line 2: tcg_cache_resident_bytes 104857600 is more than the host side it is part of"),
])
def test_a_kind_cell_outside_the_grammar_is_one_line_naming_the_column_and_the_rule(cells, message):
    with pytest.raises(CalibrationError) as caught:
        parse_samples_csv(one_row(**cells))
    assert any(p.startswith(message) for p in caught.value.problems), caught.value.problems
    assert all("\n" not in p for p in caught.value.problems)


def test_the_good_row_parses():
    [row] = parse_samples_csv(one_row())
    assert (row.accelerator, row.tcg_tb_size_mib, row.guest, row.host_processes, row.devices) == (
        "tcg", 64, "kernel-only", "vmm", "serial+virtio-console")


def test_a_row_without_the_kind_columns_is_a_real_kata_pod_as_the_published_survey_measured():
    legacy = parse_samples_csv(SURVEY.read_text())
    lines = SURVEY.read_text().splitlines()
    said = [line if line.startswith("#") else (f"accelerator,guest,host_processes,devices,{line}" if "_mib" in line
                                               else f"kvm,kata-pod,kata-pod,kata,{line}") for line in lines]
    empty = [line if line.startswith("#") else (f"accelerator,guest,host_processes,devices,{line}" if "_mib" in line
                                                else f",,,,{line}") for line in lines]
    assert parse_samples_csv("\n".join(said)) == legacy == parse_samples_csv("\n".join(empty))
    assert {(r.accelerator, r.guest, r.host_processes, r.devices) for r in legacy} == {
        ("kvm", "kata-pod", "kata-pod", "kata")}
    # Every part measured: `free -m` inside a real Kata guest and its pod cgroup outside.
    parts = parts_of(fit_overhead(legacy))
    assert all(parts[p].measured == "lines 5-10" and parts[p].assumed_mib is None for p in Part)


# --- each part from the rows that saw it, or a stated default -------------------------------------


def test_a_probe_under_tcg_gives_the_guest_kernel_and_no_host_side():
    fit = fit_overhead(parse_samples_csv(PROBE.read_text()))
    parts = parts_of(fit)
    assert parts[Part.GUEST_KERNEL].measured == "lines 7-11"
    assert "kernel-only" in parts[Part.GUEST_KERNEL].detail and "tcg" in parts[Part.GUEST_KERNEL].detail
    userland = parts[Part.GUEST_USERLAND]
    assert (userland.measured, userland.assumed_mib, userland.assumed_for) == (
        None, USERLAND, "lines 7-11 (guest kernel-only)")
    assert "Contrast survey" in userland.source
    # tb-size=64: the host side holds a translation cache a KVM node has not; not taken for the VMM.
    for part in (Part.VMM, Part.VIRTIOFSD, Part.SHIM):
        assert parts[part].describe() == "not measured"
    assert fit.host_mib is None and fit.host_basis is None and "hostMemory" not in fit.overhead_block()
    assert any(note.startswith("lines 7-11: no host side taken from them: it ran under TCG with a 64 MiB translation "
                               "cache") for note in fit.notes)
    # A kernel-only guest's point is what its workload could not have plus the guest userland's default.
    rows = parse_samples_csv(PROBE.read_text())
    assert [y for _, y in fit.guest_points] == [Decimal(r.unusable_mib.numerator) / r.unusable_mib.denominator + USERLAND
                                                for r in rows]


def test_under_kvm_the_probe_measures_the_vmm_and_virtiofsd_and_the_shim_are_assumed():
    fit = fit_overhead(parse_samples_csv(probe_text(accelerator="kvm", tcg_tb_size_mib="")))
    parts = parts_of(fit)
    assert parts[Part.VMM].measured == "lines 7-11"
    assert ("devices serial+virtio-console: without Kata's vsock, rng, virtio-fs, image disk (where Kata boots an "
            "image)") in parts[Part.VMM].detail
    for part, mib in ((Part.VIRTIOFSD, VIRTIOFSD), (Part.SHIM, SHIM)):
        assert (parts[part].measured, parts[part].assumed_mib, parts[part].assumed_for) == (None, mib, "lines 7-11")
    # The largest host side measured (84 MiB at 128 and 512 MiB; line 7 first) with the defaults added;
    # the margin goes on what was measured only.
    assert fit.host_exact_mib == 84 + VIRTIOFSD + SHIM
    assert fit.host_with_margin_mib == math.ceil(Fraction(84) * Fraction("1.1") + VIRTIOFSD + SHIM)
    assert fit.host_basis == (f"{84 + VIRTIOFSD + SHIM:.1f} MiB from line 7: its VMM 84.0 MiB, with virtiofsd "
                              f"{VIRTIOFSD} MiB, shim {SHIM} MiB assumed")


@pytest.mark.parametrize("cells, vmm_mib", [
    # A tb-size of at most 8 MiB is counted in: the VMM's share overstated by at most that.
    ({"tcg_tb_size_mib": "8"}, max(PEAK_BEYOND_VM)),
    # Measured apart, the translation cache is taken off.
    ({"tcg_cache_resident_bytes": str(40 * MIB)}, max(PEAK_BEYOND_VM) - 40),
])
def test_a_tcg_row_gives_the_vmm_only_without_its_translation_cache(cells, vmm_mib):
    fit = fit_overhead(parse_samples_csv(probe_text(**cells)))
    assert parts_of(fit)[Part.VMM].measured == "lines 7-11"
    assert "TCG" in parts_of(fit)[Part.VMM].detail
    assert fit.host_exact_mib == vmm_mib + VIRTIOFSD + SHIM


def test_a_probe_counting_virtiofsd_leaves_only_the_shim_assumed():
    fit = fit_overhead(parse_samples_csv(probe_text(accelerator="kvm", tcg_tb_size_mib="",
                                                    host_processes="vmm+virtiofsd",
                                                    devices="serial+virtio-console+virtio-fs")))
    parts = parts_of(fit)
    assert parts[Part.VIRTIOFSD].measured == "lines 7-11" and parts[Part.VIRTIOFSD].assumed_mib is None
    assert (parts[Part.SHIM].assumed_mib, fit.host_exact_mib) == (SHIM, 84 + SHIM)


def test_a_kata_guest_image_sees_the_guest_userland():
    fit = fit_overhead(parse_samples_csv(probe_text(guest="kata-image")))
    parts = parts_of(fit)
    assert parts[Part.GUEST_USERLAND].measured == "lines 7-11" and parts[Part.GUEST_USERLAND].assumed_mib is None


KATA_PROBE = ROOT / "tests" / "fixtures" / "probe-kata-tcg.csv"


def test_a_tcg_probe_of_kata_s_guest_gives_qemu_s_share_without_its_translation_cache(capsys):
    """Real rows (tests/fixtures/probe-kata-tcg.csv: `kata-sizing probe` of the example's class s on this
    project's machine, the stand-in Kata initrd with its agent, virtiofsd beside QEMU, TCG with the
    translation cache measured from smaps; docs/probe.md): each part but the shim is measured, and the host
    side is what the VM's cgroup held beyond the VM less the cache, QEMU's and virtiofsd's as a KVM node has
    them."""
    rows = parse_samples_csv(KATA_PROBE.read_text())
    assert {(r.accelerator, r.guest, r.host_processes) for r in rows} == {("tcg", "kata-initrd", "vmm+virtiofsd")}
    fit = fit_overhead(rows)
    parts = parts_of(fit)
    for part in (Part.GUEST_KERNEL, Part.GUEST_USERLAND, Part.VMM, Part.VIRTIOFSD):
        assert parts[part].measured == "lines 9, 11, 13" and parts[part].assumed_mib is None, parts[part]
    assert parts[Part.VMM].detail == ("devices serial+virtio-console+virtio-scsi+rng+virtio-fs: without Kata's vsock; "
                                      "TCG, the translation cache measured and taken off")
    assert parts[Part.SHIM].assumed_mib == SHIM
    beyond = [Fraction(r.pod_cgroup_memory_current_bytes - r.tcg_cache_resident_bytes, MIB) - int(r.vm_nominal_mib)
              for r in rows]
    assert fit.host_exact_mib == max(beyond) + SHIM
    # The cache was most of what the cgroup held beyond each VM: without it, about 77 MiB of 134.
    assert 70 < max(beyond) < 80 and all(r.tcg_cache_resident_bytes > 50 * MIB for r in rows)
    # Not measured apart, a 64 MiB cache gives no host side at all: no KVM node has it.
    unmeasured = fit_overhead(parse_samples_csv("\n".join(
        ",".join(line.split(",")[:-1] + [""]) if line[:1] not in ("#", "n") else line
        for line in KATA_PROBE.read_text().splitlines())))
    assert unmeasured.host_exact_mib is None and "measured" not in parts_of(unmeasured)[Part.VMM].as_dict()
    # End to end, with the example policy: class s is within the probed VMs and refitted with the measured
    # host side; m, l and xl lie beyond them and are kept.
    assert main(["calibrate", str(KATA_PROBE), "--policy", str(EXAMPLE), "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["overhead"]["hostMemory"] == f"{math.ceil((max(beyond)) * Fraction(11, 10) + SHIM)}Mi"
    kept = {c["name"] for c in report["specClasses"] if "podFixed" in c}
    assert kept == {"m", "l", "xl"}


def test_a_pod_cgroup_without_its_host_processes_gives_no_host_side():
    text = SURVEY.read_text().replace("container_limit_mib,", "host_processes,container_limit_mib,")
    text = "\n".join(line if line.startswith(("#", "host")) else f"none,{line}" for line in text.splitlines())
    fit = fit_overhead(parse_samples_csv(text))
    assert fit.host_mib is None
    assert fit.notes == ("lines 5-10: no host side taken from them: its pod cgroup counts no host process "
                         "(host_processes none: sandbox_cgroup_only = false)",)


# --- survey rows of live pods, with the probe's ----------------------------------------------------


def live_pods_survey_csv(resident: bool = True) -> str:
    """`kata-sizing survey` of examples/qemu-runtime-rs.yaml's pods on a node: limits across classes s and
    m, each pod's cgroup holding its whole VM (confidential guests: fully resident) plus the host side
    the published survey measured (6.2 to 23.4 MiB), or, not resident, the guest's touched pages."""
    policy = example_policy()
    sizing = size_policy(policy)
    published = [line.split(",") for line in SURVEY.read_text().splitlines() if line[0].isdigit()]
    host_sides = [Fraction(int(current), MIB) - int(vm) for _, vm, _, _, current in published]
    pods, figures = [], {}
    for number, (limit_mib, host) in enumerate(zip((256, 640, 1024, 2048, 3072, 4096), host_sides, strict=True)):
        name = "s" if limit_mib <= 1024 else "m"
        sized = sizing.class_named(name)
        pod = kata_pod(f"p{number}", "node-1", sized.runtime_class, f"{limit_mib}Mi", f"{sized.pod_fixed_memory_mib}Mi",
                       namespace="live", uid=f"u{number}")
        vm = explain_pod(sizing, name, None, limit_mib * MIB).vm.memory_mib
        # The workload holds half its limit; a VM not fully resident has 150 MiB of the guest's own touched.
        workload = limit_mib // 2 * MIB
        held = (vm * MIB if resident else workload + 150 * MIB) + math.ceil(host * MIB)
        figures[f"u{number}"] = Figures(workload, held - workload, 0)
        pods.append(pod)
    index = index_pods(pods, {c.runtime_class for c in sizing.classes})
    readings, _ = readings_from([("node-1", summary("node-1", pods, lambda p: figures[p["metadata"]["uid"]]))], index)
    rows, notes = survey_rows(readings, sizing)
    assert notes == [] and len(rows) == 6
    return to_csv(rows, ["kata-sizing survey of policy qemu-rs"])


def test_probe_and_survey_rows_combine_by_what_each_saw():
    """The probe's rows give the guest kernel, the live pods' the host side (shim, VMM and virtiofsd in
    their cgroup); the guest userland, which neither saw apart, is the stated default."""
    text = PROBE.read_text() + live_pods_survey_csv()
    rows = parse_samples_csv(text)
    assert len(rows) == 11
    fit = fit_overhead(rows)
    parts = parts_of(fit)
    assert parts[Part.GUEST_KERNEL].measured == "lines 7-11"  # fully resident pods say nothing of the guest
    assert parts[Part.GUEST_USERLAND].assumed_for == "lines 7-11 (guest kernel-only)"
    for part in (Part.VMM, Part.VIRTIOFSD, Part.SHIM):
        assert (parts[part].measured, parts[part].assumed_mib) == ("lines 14-19", None)
    # The largest host side of the live pods: the published survey's 23.4 MiB (4587950080 B - 4352 MiB).
    assert fit.host_exact_mib == Fraction(math.ceil((Fraction(4587950080, MIB) - 4352) * MIB), MIB)
    assert fit.host_basis.startswith("23.4 MiB from line 19: its VMM+virtiofsd+shim 23.4 MiB")
    assert any("lines 7-11: no host side taken from them: it ran under TCG" in note for note in fit.notes)


def test_with_live_pods_that_are_not_resident_the_guest_userland_is_measured_too():
    fit = fit_overhead(parse_samples_csv(PROBE.read_text() + live_pods_survey_csv(resident=False)),
                       assumed_host_mib=50)
    parts = parts_of(fit)
    assert parts[Part.GUEST_KERNEL].measured == "lines 7-11, 14-19"
    assert parts[Part.GUEST_USERLAND].measured == "lines 14-19"
    assert parts[Part.GUEST_USERLAND].assumed_for == "lines 7-11 (guest kernel-only)"
    assert fit.host_mib is None  # neither the TCG rows nor pods whose VM is not fully resident give it


# --- the lowering rule --------------------------------------------------------------------------


def test_a_probe_only_proposal_of_the_example_never_lowers_a_podfixed_silently():
    """s lies within the probed VMs (up to 2048 MiB) and is lowered, its unseen parts from stated
    defaults (said); m, l and xl lie beyond them and keep their podFixed and guest budget, set on the
    classes; the host side, which TCG rows cannot give, stays the policy's."""
    policy = example_policy()
    before = {c.name: c for c in size_policy(policy).classes}
    proposal = propose(policy, parse_samples_csv(PROBE.read_text()))
    by_name = {c.name: c for c in proposal.classes}
    assert proposal.host_memory_mib == 50 and "hostMemory" not in proposal.overhead
    assert proposal.host_side == "not measured by any row: the policy's hostMemory (50 MiB) stays"
    s = by_name["s"]
    assert not s.kept and not s.extrapolated and s.largest_vm_mib <= 2048
    assert s.guest_budget_mib < before["s"].guest_budget_mib and int(s.pod_fixed["memory"][:-2]) < 358
    for name in ("m", "l", "xl"):
        c = by_name[name]
        assert c.extrapolated and c.kept and "beyond the rows' largest (2048 MiB)" in c.kept[0]
        assert c.pod_fixed == before[name].pod_fixed and c.guest_budget_mib == before[name].guest_budget_mib
        assert c.pin == {"overheadMemory": f"{before[name].guest_budget_mib}Mi", "podFixed": before[name].pod_fixed}
    # The refitted policy carries the pins: what is applied is what is proposed.
    refitted = {c.name: c for c in size_policy(proposal.refitted).classes}
    assert all(refitted[c.name].pod_fixed == c.pod_fixed for c in proposal.classes)
    # Every lowered class says what it rests on: the guest userland assumed, with its source.
    lowered = [c for c in proposal.classes if int(c.pod_fixed["memory"][:-2]) < before[c.name].pod_fixed_memory_mib]
    assert [c.name for c in lowered] == ["s"]
    assert parts_of(proposal.fit)[Part.GUEST_USERLAND].assumed_mib == USERLAND


@pytest.mark.parametrize("rows, expected", [
    # The probe alone: s within the probed VMs, lowered; the others beyond them, kept.
    ("probe", {"s": "lowered", "m": "kept", "l": "kept", "xl": "kept"}),
    # Under KVM the probe's VMM and the stated virtiofsd and shim raise hostMemory past the policy's 50 MiB:
    # podFixed goes up everywhere, and beyond the data the guest budget keeps its value (m, l, xl).
    ("probe-kvm", {"s": "raised", "m": "kept", "l": "kept", "xl": "kept"}),
    # Fully resident live pods give the host side only: the guest line still ends at the probe's 2048 MiB.
    ("probe+resident pods", {"s": "lowered", "m": "kept", "l": "kept", "xl": "kept"}),
    # Live pods whose VMs are not fully resident stand for the guest up to their VMs (4954 MiB): m within.
    ("probe+pods", {"s": "lowered", "m": "lowered", "l": "kept", "xl": "kept"}),
])
def test_the_lowering_rule(rows, expected):
    text = {"probe": PROBE.read_text(), "probe-kvm": probe_text(accelerator="kvm", tcg_tb_size_mib=""),
            "probe+resident pods": PROBE.read_text() + live_pods_survey_csv(),
            "probe+pods": PROBE.read_text() + live_pods_survey_csv(resident=False)}[rows]
    policy = example_policy()
    before = {c.name: c for c in size_policy(policy).classes}
    proposal = propose(policy, parse_samples_csv(text))
    found = {}
    for c in proposal.classes:
        was = before[c.name]
        pod_fixed = int(c.pod_fixed["memory"][:-2])
        if c.kept:
            # Beyond the data: neither value goes down (podFixed may go up with hostMemory), and podFixed holds
            # at least the proposed hostMemory beyond the kept guest budget.
            assert c.extrapolated and c.guest_budget_mib >= was.guest_budget_mib and pod_fixed >= was.pod_fixed_memory_mib
            assert pod_fixed - c.guest_budget_mib >= proposal.host_memory_mib
            found[c.name] = "kept"
        else:
            # Lowered only within the data.
            assert c.largest_vm_mib <= proposal.surveyed_vm_mib or (
                pod_fixed >= was.pod_fixed_memory_mib and c.guest_budget_mib >= was.guest_budget_mib)
            found[c.name] = "lowered" if pod_fixed < was.pod_fixed_memory_mib else "raised"
    assert found == expected


def test_probe_kvm_raises_when_its_own_rows_would_lower_nothing_beyond_them():
    proposal = propose(example_policy(), parse_samples_csv(probe_text(accelerator="kvm", tcg_tb_size_mib="")))
    assert proposal.overhead["hostMemory"] == f"{math.ceil(Fraction(84) * Fraction('1.1') + VIRTIOFSD + SHIM)}Mi"


# --- what an administrator reads -------------------------------------------------------------------


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_calibrate_without_a_policy_prints_the_fit_and_where_each_part_comes_from(capsys):
    code, out, err = run(capsys, "calibrate", PROBE)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    start = lines.index("# what each part of a pod's memory comes from (docs/sizing-model.md#what-each-row-saw):")
    assert lines[start + 1:start + 7] == [
        "#   guest kernel:   measured on lines 7-11 (guest kernel-only; tcg)",
        f"#   guest userland: assumed {USERLAND} MiB for lines 7-11 (guest kernel-only): {defaults.GUEST_USERLAND_SOURCE}",
        "#   VMM:            not measured",
        "#   virtiofsd:      not measured",
        "#   shim:           not measured",
        "#   host side:      not measured by any row: hostMemory is not fitted (the policy's stays)",
    ]
    assert yaml.safe_load(out)["overhead"]["guestMemoryBase"].endswith("Mi")
    code, out, _ = run(capsys, "calibrate", PROBE, "-o", "json")
    report = json.loads(out)
    assert [p["part"] for p in report["parts"]] == [p.value for p in Part]
    assert report["parts"][1] == {"part": "guest userland", "assumedMiB": USERLAND,
                                  "assumedFor": "lines 7-11 (guest kernel-only)", "source": defaults.GUEST_USERLAND_SOURCE}


def test_calibrate_with_the_policy_says_which_classes_it_keeps_and_what_to_paste(capsys, tmp_path):
    code, out, err = run(capsys, "calibrate", PROBE, "--policy", EXAMPLE)
    assert (code, err) == (0, "")
    assert "# Paste under spec: in a KataSizingPolicy (classes too: a kept class keeps its values there)." in out
    pasted = yaml.safe_load(out)
    assert [c["name"] for c in pasted["classes"]] == ["s", "m", "l", "xl"]
    assert pasted["classes"][1] == {"name": "m", "cpu": "2", "memory": "4Gi", "overheadMemory": "858Mi",
                                    "podFixed": {"cpu": "250m", "memory": "908Mi"}}
    assert "# class m: kept: guest budget 858 MiB (now 858), podFixed 250m/908Mi (now 250m/908Mi)" in out
    assert "#   kept because its largest VM, 4688 MiB as refitted, lies beyond the rows' largest (2048 MiB)" in out
    assert "#   host side:      not measured by any row: the policy's hostMemory (50 MiB) stays" in out
    # Pasted into the policy, the proposal is what the policy then sizes.
    document = yaml.safe_load(EXAMPLE.read_text())
    document["spec"].update(pasted)
    applied = {c.name: c.pod_fixed for c in size_policy(parse_policy(document)).classes}
    report = json.loads(run(capsys, "calibrate", PROBE, "--policy", EXAMPLE, "-o", "json")[1])
    assert applied == {c["name"]: c["podFixed"] for c in report["classes"]}
    assert report["specClasses"] == pasted["classes"]
    # render --proposal sets the same.
    code, out, err = run(capsys, "render", EXAMPLE, "--proposal", PROBE)
    assert (code, err) == (0, "")
    assert "# and (spec.classes: a kept class keeps its values):\n#   - name: s\n" in out


def test_status_proposal_says_the_parts_and_the_pins():
    found = proposal_status(example_policy(), PROBE.read_text(), "ConfigMap kata-sizing/probe key survey.csv")
    document = found.model_dump(by_alias=True, exclude_none=True)
    assert document["hostSide"] == "not measured by any row: the policy's hostMemory (50 MiB) stays"
    assert document["parts"][1]["assumedMiB"] == USERLAND
    classes = {c["name"]: c for c in document["classes"]}
    assert classes["xl"]["pin"] == {"overheadMemory": "11860Mi", "podFixed": {"cpu": "250m", "memory": "11910Mi"}}
    assert classes["s"]["kept"] == [] and "pin" not in classes["s"]
