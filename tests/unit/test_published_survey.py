"""survey -> calibrate -> render --proposal on the published SNP survey, rebuilt as the pods and kubelet
Summaries its cluster would give (tests/support/published_surveys.py), with the guests' `free -m` columns
added: the fit matches the documented method, and the proposal keeps the promises the operator then
checks (predicted headroom = what the measurement computes for a pod of the proposed VM, at or above
its warning line), flags extrapolated classes, names the explicit values the survey refutes, and is
the same whichever command prints it."""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
import xml.etree.ElementTree as ElementTree
from decimal import Decimal

import pytest
import yaml

from kata_sizing.cli import main
from kata_sizing.core.calibrate import parse_samples_csv
from kata_sizing.core.headroom import HeadroomThreshold
from kata_sizing.core.measure import KataPod, MeasurementState, read_summary
from kata_sizing.core.model import parse_policy
from kata_sizing.core.proposal import propose
from kata_sizing.core.sizing import explain_pod, size_policy
from tests.support import published_surveys as published
from tests.support.summaries import MIB, Figures, kata_pod, summary


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def files(tmp_path) -> dict:
    pods, summaries = published.cluster()
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": pods}))
    paths = []
    for node, document in summaries.items():
        paths.append(tmp_path / f"{node}.json")
        paths[-1].write_text(json.dumps(document))
    (tmp_path / "survey-policy.yaml").write_text(yaml.safe_dump(published.policy()))
    (tmp_path / "refit.yaml").write_text(yaml.safe_dump(published.policy(survey_time=False)))
    return {"dir": tmp_path, "pods": tmp_path / "pods.yaml", "summaries": paths,
            "survey_policy": tmp_path / "survey-policy.yaml", "refit": tmp_path / "refit.yaml"}


@pytest.fixture
def survey_csv(capsys, files) -> str:
    """The survey's CSV as `survey` writes it, then with the guests' free -m columns added."""
    args = ["survey", files["survey_policy"], "--pods", files["pods"]]
    for path in files["summaries"]:
        args += ["--summary", path]
    code, out, err = run(capsys, *args)
    assert (code, err) == (0, "")
    # What survey writes reads back unchanged by Python's csv module and by calibrate.
    data = [line for line in out.splitlines() if not line.startswith("#")]
    assert [",".join(cells) for cells in csv.reader(data)] == data
    rows = parse_samples_csv(out)
    by_limit = {int(r.container_limit_mib): r for r in rows}
    for row in published.rows():
        found = by_limit[row["container_limit_mib"]]
        assert found.vm_nominal_mib == row["vm_nominal_mib"]
        assert found.pod_cgroup_memory_current_bytes == row["pod_cgroup_memory_current_bytes"]
    full = published.with_guest_columns(out)
    (files["dir"] / "survey.csv").write_text(full)
    return full


def test_the_fit_of_the_rebuilt_survey_is_the_documented_one(capsys, files, survey_csv):
    code, out, err = run(capsys, "calibrate", files["dir"] / "survey.csv", "-o", "json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    # docs/sizing-model.md: base 95 MiB, ratio 0.1352, host 24 MiB measured (printed with the margin).
    assert report["overhead"] == {"guestMemoryBase": "95Mi", "guestMemoryRatio": "0.1352", "hostMemory": "26Mi",
                                  "margin": "0.10"}
    assert report["largestSurveyedVmMiB"] == "4352"


def _pod_in_proposed_vm(proposal, row, sized) -> tuple[KataPod, dict]:
    """A pod like the row's, admitted with the proposed podFixed into the VM the proposed sizing
    boots, its Summary built from what the survey measured: the VM fully resident, plus the same host
    side (memory.current - VM nominal) and the same container."""
    limit = int(row.container_limit_mib) * MIB
    vm = explain_pod(size_policy(proposal.refitted), sized.name, None, limit).vm.memory_mib
    host = row.pod_cgroup_memory_current_bytes - int(row.vm_nominal_mib) * MIB
    pod_fixed = sized.pod_fixed["memory"]
    spec = kata_pod("again", "aks-snp-0", sized.runtime_class, f"{int(row.container_limit_mib)}Mi", pod_fixed,
                    namespace="survey", uid="uid-again")
    working_set = vm * MIB + host
    document = summary("aks-snp-0", [spec], lambda _: Figures(published.CONTAINER_WORKING_SET,
                                                            working_set - published.CONTAINER_WORKING_SET, 0))
    pod = KataPod("uid-again", "survey/again", sized.runtime_class, "aks-snp-0", limit,
                  int(Decimal(pod_fixed.removesuffix("Mi"))) * MIB, ("c0",), None, limit)
    return pod, document


def test_predicted_headroom_is_what_the_measurement_computes_for_the_proposed_vm(survey_csv, files):
    policy = parse_policy(published.policy(survey_time=False))
    rows = parse_samples_csv(survey_csv)
    proposal = propose(policy, rows)
    threshold = HeadroomThreshold.parse(policy.spec.measurement.headroom_warning)
    state = MeasurementState()
    for proposed in proposal.classes:
        sized = size_policy(proposal.refitted).class_named(proposed.name)
        mine = [row for row in rows if row.class_name == proposed.name]
        assert proposed.pods == len(mine) > 0
        measured = {}
        for row in mine:
            pod, document = _pod_in_proposed_vm(proposal, row, proposed)
            reading = read_summary(document, "aks-snp-0", {pod.uid: pod})
            [measurement] = reading.measurements
            measured[row.pod] = measurement.headroom_bytes
            state.add_reading(reading, 0.0, {pod.runtime_class: 600.0},
                              {pod.runtime_class: (threshold, sized.pod_fixed_memory_mib * MIB,
                                                   sized.guest_budget_mib * MIB)})
            # The operator would not warn about it.
            assert state.low_headroom({pod.runtime_class}) == []
        least_pod = min(measured, key=measured.get)
        assert (proposed.min_headroom_pod, proposed.min_headroom_bytes) == (least_pod, measured[least_pod])
        assert proposed.warning_line_bytes == threshold.line_bytes(sized.pod_fixed_memory_mib * MIB,
                                                                   sized.guest_budget_mib * MIB)
        assert proposed.min_headroom_bytes >= proposed.warning_line_bytes
    # A fully resident VM's headroom is hostMemory less its host side: with the measured 23.4 MiB and the
    # margin (26 MiB) the 4 GiB pod keeps 2.6 MiB, under its line (10% of the 26 MiB podFixed holds beyond
    # the guest budget). hostMemory is raised to (23.4 x 1.1) / 0.9 = 28.6, 29 MiB: by 3, not to 121 as
    # a line of 10% of the whole podFixed asked for (docs/measurement.md).
    assert (proposal.host_raised_mib, proposal.host_raised_for) == (3, "survey/snp-4096")
    assert proposal.overhead["hostMemory"] == "29Mi"


def test_a_class_beyond_the_surveyed_vms_is_flagged(capsys, files, survey_csv, tmp_path):
    plot = tmp_path / "fit.svg"
    code, out, err = run(capsys, "calibrate", files["dir"] / "survey.csv", "--policy", files["refit"], "-o", "json",
                         "--plot", plot)
    assert (code, err) == (0, "")
    classes = {c["name"]: c for c in json.loads(out)["classes"]}
    # xl (4 GiB pods) boots a VM of 4096 MiB + its refitted guest budget: past the survey's 4352 MiB.
    assert classes["xl"]["largestVmMiB"] > 4352 and classes["xl"]["extrapolated"] is True
    assert [name for name, c in classes.items() if c["extrapolated"]] == ["xl"]
    code, out, _ = run(capsys, "calibrate", files["dir"] / "survey.csv", "--policy", files["refit"])
    assert re.search(r"# class xl: .*largest VM \d+ MiB \(extrapolated: beyond the largest surveyed VM\)", out)
    assert "# class l: " in out and "extrapolated" not in next(line for line in out.splitlines()
                                                             if line.startswith("# class l:"))
    gids = _svg_gids(plot)
    assert "class-xl-extrapolated" in gids and {"class-s", "class-m", "class-l"} <= gids


def test_explicit_values_the_survey_refutes_are_named_per_class(capsys, files, survey_csv):
    """The policy the survey ran (defaultMemory 256Mi, podFixed 320Mi in every class) validates, and
    the survey refutes it for the classes of 1, 2 and 4 GiB pods."""
    assert run(capsys, "validate", files["survey_policy"])[0] == 0
    code, out, err = run(capsys, "calibrate", files["dir"] / "survey.csv", "--policy", files["survey_policy"])
    assert code == 1
    refuted = {line.split(":")[1].strip().removeprefix("class "): line for line in err.splitlines()}
    assert sorted(refuted) == ["l", "m", "xl"]
    assert "defaultMemory 256Mi is refuted by the survey" in refuted["xl"]
    assert "the pod can use 3669 MiB of its limit" in refuted["xl"]
    assert "the pod can use 1897 MiB of its limit" in refuted["l"]
    code, out, _ = run(capsys, "calibrate", files["dir"] / "survey.csv", "--policy", files["survey_policy"],
                       "-o", "json")
    report = {c["name"]: c for c in json.loads(out)["classes"]}
    assert code == 1 and "refuted" not in report["s"] and report["m"]["refuted"]


def test_calibrate_and_render_propose_the_same_with_the_policys_margin(capsys, files, survey_csv):
    document = published.policy(survey_time=False)
    document["spec"]["overhead"] = {"margin": "0.30"}
    files["refit"].write_text(yaml.safe_dump(document))
    code, out, err = run(capsys, "calibrate", files["dir"] / "survey.csv", "--policy", files["refit"], "-o", "json")
    assert (code, err) == (0, "")
    calibrated = json.loads(out)
    assert calibrated["margin"] == "0.30" and calibrated["overhead"]["margin"] == "0.30"
    code, out, err = run(capsys, "render", files["refit"], "--proposal", files["dir"] / "survey.csv")
    assert (code, err) == (0, "")
    overhead_text, _, classes_text = out.partition("# and (spec.classes: a kept class keeps its values):\n")
    set_block = yaml.safe_load("\n".join(line[3:] for line in overhead_text.splitlines() if line.startswith("#   ")))
    assert set_block == calibrated["overhead"]
    # The class the survey cannot speak for (xl: beyond its VMs) is kept, set on the classes alike.
    assert yaml.safe_load("\n".join(line[3:] for line in itertools.takewhile(
        lambda line: line.startswith("#   "), classes_text.splitlines()))) == calibrated["specClasses"]
    assert [c["name"] for c in calibrated["classes"] if c.get("kept")] == ["xl"]
    for c in calibrated["classes"]:
        assert f"# class {c['name']}: {'kept: ' if c.get('kept') else ''}guest budget {c['guestBudgetMiB']} MiB " \
               f"(now {c['guestBudgetBeforeMiB']}), podFixed {c['podFixed']['cpu']}/{c['podFixed']['memory']}" in out
    # --margin given explicitly wins in both, alike.
    code, out, _ = run(capsys, "calibrate", files["dir"] / "survey.csv", "--policy", files["refit"], "-o", "json",
                       "--margin", "0.05")
    with_flag = json.loads(out)
    code, out, _ = run(capsys, "render", files["refit"], "--proposal", files["dir"] / "survey.csv", "--margin", "0.05")
    assert with_flag["margin"] == "0.05" and "#   margin: '0.05'" in out
    assert f"#   guestMemoryBase: {with_flag['overhead']['guestMemoryBase']}" in out


@pytest.mark.parametrize("current, message", [
    # memory.current == the VM's nominal size: a host side of 0, which no policy takes.
    (lambda vm: vm * MIB, "overhead.hostMemory: must be above 0"),
    # a figure a kubelet never sends.
    (lambda vm: 2**64, "is above 18446744073709551615"),
])
def test_calibrate_prints_no_block_a_policy_refuses(capsys, tmp_path, current, message):
    lines = ["container_limit_mib,vm_nominal_mib,free_total_mib,free_used_mib,pod_cgroup_memory_current_bytes"]
    for limit, vm, total, used in ((50, 306, 197, 27), (2048, 2304, 1965, 31)):
        lines.append(f"{limit},{vm},{total},{used},{current(vm)}")
    (tmp_path / "s.csv").write_text("\n".join(lines) + "\n")
    code, out, err = run(capsys, "calibrate", tmp_path / "s.csv")
    assert code == 1 and out == "" and message in err and err.count("\n") >= 1


def _svg_gids(path) -> set[str]:
    return {gid for element in ElementTree.parse(path).iter() if (gid := element.get("id"))}


def _points(group) -> list[tuple[float, float]]:
    """The marker positions of a scatter group in the SVG (display coordinates, y downwards)."""
    found = []
    for use in group.iter("{http://www.w3.org/2000/svg}use"):
        found.append((float(use.get("x")), float(use.get("y"))))
    return found


def _segment(group) -> tuple[tuple[float, float], tuple[float, float]]:
    path = next(group.iter("{http://www.w3.org/2000/svg}path"))
    numbers = [float(n) for n in re.findall(r"-?[0-9.]+", path.get("d"))]
    return (numbers[0], numbers[1]), (numbers[-2], numbers[-1])


def test_the_plot_holds_the_samples_under_the_fitted_line(capsys, files, survey_csv, tmp_path):
    plot = tmp_path / "fit.svg"
    code, _, err = run(capsys, "render", files["refit"], "--proposal", files["dir"] / "survey.csv", "--plot", plot)
    assert (code, err) == (0, "")
    groups = {element.get("id"): element for element in ElementTree.parse(plot).iter() if element.get("id")}
    guest = _points(groups["guest-samples"])
    assert len(guest) == 6 and len(_points(groups["host-samples"])) == 6
    (x0, y0), (x1, y1) = _segment(groups["fit-line"])

    def line_y(x: float) -> float:
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    # An upper envelope: every sample on or under the line (SVG y grows downwards), two touching it.
    gaps = sorted(y - line_y(x) for x, y in guest)
    assert gaps[0] > -0.01
    assert gaps[1] < 0.5
    # The extrapolated part starts where the surveyed range ends.
    assert {"fit-line-extrapolated", "extrapolated-range", "data-range", "host-line", "fit-line-margin"} <= set(groups)
    assert _segment(groups["fit-line-extrapolated"])[0] == pytest.approx((x1, y1), abs=0.01)


def test_without_matplotlib_the_plot_says_how_to_install_it(capsys, files, survey_csv, monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run(capsys, "calibrate", files["dir"] / "survey.csv", "--plot", tmp_path / "fit.svg")
    assert code == 2 and out == ""
    assert err == "error: --plot needs matplotlib, the optional extra `plot`: pip install 'kata-sizing[plot]' " \
                  "(or pip install matplotlib)\n"


def test_render_never_imports_matplotlib():
    import subprocess
    import sys

    from tests.support.published_surveys import FIXTURE

    script = ("import sys; from kata_sizing.cli import main; "
              f"code = main(['render', {str(FIXTURE.parent.parent.parent / 'examples' / 'qemu-runtime-rs.yaml')!r}]); "
              "assert code == 0 and 'matplotlib' not in sys.modules, sorted(sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_survey_csv_round_trips_through_csv_and_calibrate(survey_csv):
    reader = list(csv.DictReader(io.StringIO(survey_csv)))
    assert len(reader) == 6 and all(row["node"].startswith("aks-snp-") for row in reader)
