"""`kata-sizing` as a user runs it: output, exit codes (0 ok, 1 invalid, 2 unreadable), and
one line per problem on stderr, never a traceback."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from kata_sizing.cli import main
from tests.support.paths import ROOT
from tests.support.pods import SHARED_OBJECTS

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SURVEY_CSV = ROOT / "tests" / "fixtures" / "survey-aks-clh-snp.csv"
CONSOLE_SCRIPT = Path(sys.executable).parent / "kata-sizing"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _lines(err: str) -> list[str]:
    return err.splitlines()


@pytest.fixture
def policy_file(tmp_path):
    def write(text: str, name: str = "policy.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


# --- the happy paths on the bundled examples ----------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_render_examples_prints_applyable_documents(capsys, example):
    code, out, err = run(capsys, "render", example)
    assert code == 0
    documents = list(yaml.safe_load_all(out))
    assert documents and all(d["apiVersion"] in ("v1", "node.k8s.io/v1", "admissionregistration.k8s.io/v1")
                             for d in documents)
    assert out.startswith("---\n")
    for line in _lines(err):
        assert line.startswith(("warning: ", "note: "))


def test_render_prints_configmaps_then_runtime_classes_then_admission_policies(capsys):
    code, out, _ = run(capsys, "render", ROOT / "examples" / "qemu-runtime-rs.yaml")
    assert code == 0
    kinds_names = [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out)]
    assert kinds_names == [
        ("ConfigMap", "qemu-rs-kata-deploy-values"),
        ("ConfigMap", "qemu-rs-dropins"),
        ("RuntimeClass", "kata-qemu-rs-s"),
        ("RuntimeClass", "kata-qemu-rs-m"),
        ("RuntimeClass", "kata-qemu-rs-l"),
        ("RuntimeClass", "kata-qemu-rs-xl"),
        # The policy's bindings of the shared admission policies (the install's, not printed).
        ("ValidatingAdmissionPolicyBinding", "kata-sizing-qemu-rs-memory-limit"),
        ("ValidatingAdmissionPolicyBinding", "kata-sizing-qemu-rs-envelope"),
        ("MutatingAdmissionPolicyBinding", "kata-sizing-qemu-rs-route"),
    ]


def test_render_multiline_data_stays_readable(capsys):
    _, out, _ = run(capsys, "render", ROOT / "examples" / "qemu-runtime-rs.yaml")
    assert "  s.toml: |\n    # Rendered by kata-sizing" in out
    assert "  values.yaml: |\n    # kata-deploy values overlay" in out


def test_render_json_is_a_list_of_the_same_objects(capsys):
    path = ROOT / "examples" / "qemu-runtime-rs.yaml"
    _, yaml_out, _ = run(capsys, "render", path)
    code, json_out, _ = run(capsys, "render", path, "-o", "json")
    assert code == 0
    body = json.loads(json_out)
    assert body["apiVersion"] == "v1" and body["kind"] == "List"
    assert body["items"] == list(yaml.safe_load_all(yaml_out))


def test_render_with_node_capacity_adds_guidance(capsys):
    code, out, _ = run(capsys, "render", ROOT / "examples" / "qemu-runtime-rs.yaml",
                       "--node-capacity", "256Gi", "--node-cpu", "64", "-o", "json")
    assert code == 0
    (guidance,) = [o for o in json.loads(out)["items"] if o["metadata"]["name"] == "qemu-rs-node-guidance"]
    document = yaml.safe_load(guidance["data"]["capacity-256gi-cpu-64.yaml"])
    assert document["devShm"]["fstab"] == "none /dev/shm tmpfs defaults,nosuid,nodev,size=248g 0 0"


def test_render_for_a_kubelet_version_gives_the_feature_gates_it_needs(capsys):
    code, out, _ = run(capsys, "render", ROOT / "examples" / "qemu-runtime-rs.yaml",
                       "--node-capacity", "256Gi", "--kubelet-version", "v1.37.2", "-o", "json")
    assert code == 0
    (guidance,) = [o for o in json.loads(out)["items"] if o["metadata"]["name"] == "qemu-rs-node-guidance"]
    document = yaml.safe_load(guidance["data"]["capacity-256gi.yaml"])
    assert document["kubeletConfiguration"]["featureGates"] == {"InPlacePodLevelResourcesVerticalScaling": False}


def test_render_managed_by_kata_deploy_says_why_runtime_classes_are_missing(capsys):
    code, out, err = run(capsys, "render", ROOT / "examples" / "clh-snp-go.yaml")
    assert code == 0
    assert {d["kind"] for d in yaml.safe_load_all(out)} - {
        "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicyBinding"} == {"ConfigMap"}
    assert _lines(err) == [
        "note: clh-snp: runtimeClass.managedBy is KataDeploy; the kata-deploy chart creates the "
        "RuntimeClasses from the values overlay, so they are not printed",
        SHARED_NOTE,
    ]


def test_render_reads_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO((ROOT / "examples" / "qemu-runtime-rs.yaml").read_text()))
    code, out, _ = run(capsys, "render", "-")
    assert code == 0
    # 2 ConfigMaps (one with the admission parameters), 4 RuntimeClasses, 3 bindings
    assert len(list(yaml.safe_load_all(out))) == 9


SHARED_NOTE = ("note: the bindings name the shared admission policies kata-sizing-memory-limit-v1, "
               "kata-sizing-envelope-v1, kata-sizing-route-v1: the install creates them (the chart, manifests/), "
               "or `kata-sizing render --shared` prints them; without them the bindings judge no pod")


def test_render_of_several_policies_prints_each_object_once_and_names_the_shared_ones_once(capsys, tmp_path):
    first = yaml.safe_load((ROOT / "examples" / "qemu-runtime-rs.yaml").read_text())
    second = json.loads(json.dumps(first))
    second["metadata"]["name"] = "second"
    second["spec"]["runtimeClass"]["namePrefix"] = "kata-second"
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump_all([first, second]))
    code, out, err = run(capsys, "render", path)
    assert code == 0
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in yaml.safe_load_all(out)]
    assert len(keys) == len(set(keys)) == 18
    assert not [k for k in keys if k[0] in ("ValidatingAdmissionPolicy", "MutatingAdmissionPolicy")]
    assert _lines(err) == [SHARED_NOTE]


def test_render_shared_prints_the_shared_admission_policies_alone(capsys, tmp_path):
    code, out, err = run(capsys, "render", "--shared")
    assert (code, err) == (0, "")
    shared = list(yaml.safe_load_all(out))
    assert [(d["kind"], d["metadata"]["name"]) for d in shared] == SHARED_OBJECTS
    # Exactly what a policy's bindings name, and a keep-alive binding of each.
    _, policy_out, _ = run(capsys, "render", ROOT / "examples" / "qemu-runtime-rs.yaml")
    named = [d["spec"]["policyName"] for d in yaml.safe_load_all(policy_out) if d["kind"].endswith("Binding")]
    assert named == [d["metadata"]["name"] for d in shared[:3]] == [d["spec"]["policyName"] for d in shared[3:]]
    code, out, _ = run(capsys, "render", "--shared", "-o", "json")
    assert code == 0 and json.loads(out)["items"] == shared
    # Policies that all route through the operator's webhook bind no MutatingAdmissionPolicy.
    body = yaml.safe_load((ROOT / "examples" / "qemu-runtime-rs.yaml").read_text())
    body["spec"]["admission"] = {"routing": "Webhook"}
    (tmp_path / "webhook.yaml").write_text(yaml.safe_dump(body))
    code, out, _ = run(capsys, "render", "--shared", tmp_path / "webhook.yaml")
    assert code == 0 and [d["kind"] for d in yaml.safe_load_all(out)] == (
        ["ValidatingAdmissionPolicy"] * 2 + ["ValidatingAdmissionPolicyBinding"] * 2)
    body["spec"]["admission"] = {"enabled": False}
    (tmp_path / "off.yaml").write_text(yaml.safe_dump(body))
    code, out, err = run(capsys, "render", "--shared", tmp_path / "off.yaml")
    assert (code, out) == (0, "") and "no shared admission policy is needed" in err


@pytest.mark.parametrize("argv, expected", [
    (["render"], "error: render: give POLICY.yaml (or --shared for the shared admission policies alone)\n"),
    (["render", "--shared", "--values-only"],
     "error: render --shared prints the shared admission policies alone; drop --values-only\n"),
    (["render", "--shared", "--node-capacity", "1Gi", "--proposal", "x.csv"],
     "error: render --shared prints the shared admission policies alone; drop --node-capacity, --proposal\n"),
])
def test_render_without_a_policy_or_with_shared_and_another_output_is_refused(capsys, argv, expected):
    code, out, err = run(capsys, *argv)
    assert (code, out, err) == (2, "", expected)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_validate_examples(capsys, example):
    code, out, _ = run(capsys, "validate", example)
    assert code == 0
    assert out.startswith("valid: ")


def test_validate_reports_the_warning_and_strict_makes_it_an_error(capsys):
    path = ROOT / "examples" / "measured-classes.yaml"
    warning = ("measured: spec.classes[1] (m): podFixed.memory 160Mi is below default_memory 1Gi + host "
               "memory 50Mi: pods without limits boot a VM of default_memory and are under-accounted")
    code, out, err = run(capsys, "validate", path)
    assert (code, out, _lines(err)) == (0, "valid: measured\n", [f"warning: {warning}"])
    code, out, err = run(capsys, "validate", path, "--strict")
    assert (code, out, _lines(err)) == (1, "", [f"error: {warning} (--strict)"])


def test_explain_text(capsys):
    code, out, _ = run(capsys, "explain", ROOT / "examples" / "measured-classes.yaml", "--class", "m",
                       "--cpu", "1.5", "--memory", "600Mi")
    assert code == 0
    assert out.splitlines() == [
        "pod with cpu 1.5, memory 600Mi on RuntimeClass kata-measured-m (Rust runtime)",
        "  VM Kata boots:        2 vCPUs, 728 MiB",
        "  Kubernetes accounts:  cpu 2100m, memory 760Mi (limits + podFixed 600m/160Mi)",
    ]


@pytest.mark.parametrize(
    ("limits", "vm", "accounted"),
    [
        (["--cpu", "1.5", "--memory", "600Mi"], {"vcpus": 2, "memoryMiB": 728}, {"cpu": "2100m", "memory": "760Mi"}),
        (["--memory", "512Mi"], {"vcpus": 1, "memoryMiB": 640}, {"cpu": "600m", "memory": "672Mi"}),
        (["--cpu", "1.5"], {"vcpus": 2, "memoryMiB": 128}, {"cpu": "2100m", "memory": "160Mi"}),
        ([], {"vcpus": 2, "memoryMiB": 1024}, {"cpu": "600m", "memory": "160Mi"}),
    ],
)
def test_explain_json_gives_domains_worked_examples(capsys, limits, vm, accounted):
    code, out, _ = run(capsys, "explain", ROOT / "examples" / "measured-classes.yaml",
                       "--class", "m", *limits, "-o", "json")
    assert code == 0
    body = json.loads(out)
    assert set(body) == {"class", "runtimeClass", "vm", "accounted", "warnings"}
    assert (body["class"], body["runtimeClass"]) == ("m", "kata-measured-m")
    assert (body["vm"], body["accounted"]) == (vm, accounted)


def test_explain_text_shows_warnings(capsys):
    _, out, _ = run(capsys, "explain", ROOT / "examples" / "measured-classes.yaml", "--class", "m")
    assert "pod with no limits on RuntimeClass kata-measured-m" in out
    assert "  warning: a pod without limits boots the fallback VM (2 vCPUs, 1024 MiB)" in out


def test_calibrate_prints_a_pasteable_overhead_block(capsys):
    code, out, _ = run(capsys, "calibrate", SURVEY_CSV)
    assert code == 0
    block = yaml.safe_load(out)
    assert set(block) == {"overhead"}
    assert set(block["overhead"]) >= {"guestMemoryBase", "guestMemoryRatio", "margin"}


def test_calibrate_json_with_a_policy_sizes_its_classes(capsys):
    code, out, _ = run(capsys, "calibrate", SURVEY_CSV, "--policy", ROOT / "examples" / "clh-snp-go.yaml",
                       "-o", "json")
    assert code == 0
    body = json.loads(out)
    assert [c["name"] for c in body["classes"]] == ["s", "m", "l"]
    assert len(body["residualsMiB"]) == 6


# --- bad input --------------------------------------------------------------------------------


def test_missing_file_exits_2(capsys, tmp_path):
    code, out, err = run(capsys, "render", tmp_path / "nope.yaml")
    assert (code, out) == (2, "")
    assert _lines(err) == [f"error: {tmp_path / 'nope.yaml'}: no such file"]


def test_directory_exits_2(capsys, tmp_path):
    code, _, err = run(capsys, "validate", tmp_path)
    assert code == 2
    assert _lines(err) == [f"error: {tmp_path}: is a directory, not a file"]


def test_bad_yaml_exits_2_with_line_and_column(capsys, policy_file):
    path = policy_file("metadata: {name: p}\nspec:\n  shim: qemu\n  classes: [\n")
    code, _, err = run(capsys, "validate", path)
    assert code == 2
    (line,) = _lines(err)
    assert line.startswith(f"error: {path}: line 5, column 1: not valid YAML: ")


def test_tab_indented_yaml_exits_2(capsys, policy_file):
    path = policy_file("metadata:\n\tname: p\n")
    code, _, err = run(capsys, "render", path)
    assert code == 2
    assert "line 2, column 1: not valid YAML" in err


def test_binary_file_exits_2(capsys, tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    code, _, err = run(capsys, "render", path)
    assert code == 2
    assert _lines(err) == [f"error: {path}: not UTF-8 text (invalid start byte at byte 0)"]


def test_empty_file_exits_2(capsys, policy_file):
    path = policy_file("# nothing here\n")
    code, _, err = run(capsys, "validate", path)
    assert code == 2
    assert _lines(err) == [f"error: {path}: holds no YAML document"]


@pytest.mark.parametrize(("text", "type_name"), [("- a\n- b\n", "list"), ("hello\n", "str"), ("42\n", "int")])
def test_non_mapping_is_an_invalid_policy_exit_1(capsys, policy_file, text, type_name):
    # Readable YAML that is not a KataSizingPolicy is an invalid policy (1), not unreadable (2).
    path = policy_file(text)
    code, _, err = run(capsys, "validate", path)
    assert code == 1
    assert _lines(err) == [f"error: {path}: (policy): expected a mapping (a KataSizingPolicy), got {type_name}"]


def test_unknown_field_exits_1_naming_the_path(capsys, policy_file):
    path = policy_file("""\
        metadata: {name: p}
        spec:
          shim: qemu
          overhead: {guestMemoryBse: 64Mi}
        """)
    code, _, err = run(capsys, "render", path)
    assert code == 1
    assert _lines(err) == [f"error: {path}: spec.overhead.guestMemoryBse: unknown field (not part of KataSizingPolicy)"]


def test_bad_quantity_exits_1_naming_the_path(capsys, policy_file):
    path = policy_file("""\
        metadata: {name: p}
        spec:
          shim: qemu-runtime-rs
          classes:
          - {name: s, cpu: "1", memory: 1Gi}
          - {name: m, cpu: "2", memory: 4GB}
        """)
    code, _, err = run(capsys, "explain", path, "--class", "s")
    assert code == 1
    assert _lines(err) == [
        f"error: {path}: spec.classes[1].memory: '4GB' is not a Kubernetes quantity (examples: 512Mi, 2Gi, 600m, 1.5)"
    ]


def test_huge_quantity_exits_1_not_a_traceback(capsys, policy_file):
    path = policy_file("""\
        metadata: {name: p}
        spec:
          shim: qemu-runtime-rs
          classes: [{name: s, cpu: "1", memory: "1e5000"}]
        """)
    code, _, err = run(capsys, "render", path)
    assert code == 1
    assert "spec.classes[0].memory: '1e5000' is out of range" in err


def test_every_problem_of_every_document_is_listed_one_per_line(capsys, policy_file):
    path = policy_file("""\
        metadata: {name: a}
        spec: {shim: qemu, bogus: 1, overhead: {guestMemoryRatio: "0.95"}}
        ---
        kind: ConfigMap
        metadata: {name: b}
        ---
        metadata: {name: c}
        spec: {shim: remote}
        """)
    code, _, err = run(capsys, "validate", path)
    assert code == 1
    assert _lines(err) == [
        f"error: {path} (document 1): spec.overhead.guestMemoryRatio: 0.95 is not in [0, 0.9): "
        "the guest cannot lose 90% or more of the VM",
        f"error: {path} (document 1): spec.bogus: unknown field (not part of KataSizingPolicy)",
        f"error: {path} (document 2): kind: 'ConfigMap' is not KataSizingPolicy",
        f"error: {path} (document 3): spec.shim: remote (peer pods) runs no local VM and is out of scope",
    ]


INVALID_INVARIANTS = """\
    metadata: {name: bad}
    spec:
      shim: qemu-runtime-rs
      classes:
      - name: s
        cpu: "1"
        memory: 1Gi
        overheadVcpus: "0.5"
        overheadMemory: 256Mi
        podFixed: {cpu: 500m, memory: 200Mi}
      - name: m
        cpu: "2"
        memory: 2Gi
        overheadMemory: 512Mi
        podFixed: {cpu: "1", memory: 512Mi}
    """


@pytest.mark.parametrize("command", ["validate", "render"])
def test_invalid_invariants_exit_1_with_every_rule(capsys, policy_file, command):
    code, out, err = run(capsys, command, policy_file(INVALID_INVARIANTS))
    assert (code, out) == (1, "")
    errors = [line for line in _lines(err) if line.startswith("error: ")]
    assert errors == [
        "error: bad: spec.classes[0] (s): podFixed.memory 200Mi must be above overhead_memory 256Mi: "
        "podFixed covers the guest side (overhead_memory) plus the host side",
        "error: bad: spec.classes[0] (s): podFixed.cpu 500m must be above overhead_vcpus 0.5: "
        "podFixed covers the guest side (overhead_vcpus) plus the host side",
        "error: bad: spec.classes[1] (m): podFixed.memory 512Mi must be above overhead_memory 512Mi: "
        "podFixed covers the guest side (overhead_memory) plus the host side",
    ]


def test_explain_of_an_invalid_policy_exits_1(capsys, policy_file):
    code, out, err = run(capsys, "explain", policy_file(INVALID_INVARIANTS), "--class", "s")
    assert (code, out) == (1, "")
    assert len(_lines(err)) == 3


def test_explain_of_a_zero_memory_pod_exits_1_with_katas_message(capsys, policy_file):
    path = policy_file("""\
        metadata: {name: z}
        spec:
          shim: qemu-runtime-rs
          classes:
          - {name: s, cpu: "2", memory: 1Gi, overheadVcpus: "0", overheadMemory: "0",
             podFixed: {cpu: 100m, memory: 300Mi}}
        """)
    code, out, err = run(capsys, "explain", path, "--class", "s", "--cpu", "1")
    assert (code, out) == (1, "")
    assert _lines(err) == [
        "error: Kata refuses this pod: computed sandbox memory is 0 MiB for hypervisor qemu; set a "
        "non-zero memory limit or configure non-zero default_memory/overhead_memory"
    ]


def test_explain_unknown_class_exits_1(capsys):
    code, out, err = run(capsys, "explain", ROOT / "examples" / "measured-classes.yaml", "--class", "xl")
    assert (code, out) == (1, "")
    assert _lines(err) == ["error: --class: no class 'xl' in policy measured (classes: s, m, l)"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--cpu", "fast"], "error: --cpu: 'fast' is not a Kubernetes quantity (examples: 512Mi, 2Gi, 600m, 1.5)"),
        (["--memory=-1Gi"], "error: --memory: '-1Gi' is negative; memory must be zero or more"),
    ],
)
def test_explain_bad_limits_exit_1(capsys, argv, expected):
    code, _, err = run(capsys, "explain", ROOT / "examples" / "measured-classes.yaml", "--class", "m", *argv)
    assert code == 1
    assert _lines(err) == [expected]


def test_render_bad_kubelet_version_exits_1(capsys):
    code, _, err = run(capsys, "render", ROOT / "examples" / "qemu-runtime-rs.yaml", "--node-capacity", "8Gi",
                       "--kubelet-version", "latest")
    assert code == 1
    assert _lines(err) == ["error: --kubelet-version: 'latest' is not a Kubernetes version (examples: v1.37.2, 1.36.4)"]


def test_render_bad_node_capacity_exits_1(capsys):
    code, _, err = run(capsys, "render", ROOT / "examples" / "qemu-runtime-rs.yaml", "--node-capacity", "lots")
    assert code == 1
    assert _lines(err) == ["error: --node-capacity: 'lots' is not a Kubernetes quantity (examples: 512Mi, 2Gi, 600m, 1.5)"]


def test_render_reservations_above_capacity_exit_1(capsys):
    code, out, err = run(capsys, "render", ROOT / "examples" / "qemu-runtime-rs.yaml", "--node-capacity", "6Gi")
    assert (code, out) == (1, "")
    assert _lines(err)[-1] == (
        "error: qemu-rs: spec.nodes: systemReserved 4Gi + kubeReserved 2Gi + evictionHard 2Gi = 8Gi is "
        "not smaller than node capacity 6Gi (node)")


def test_explain_needs_a_policy_name_for_a_file_of_several(capsys, policy_file):
    path = policy_file("metadata: {name: a}\nspec: {shim: qemu}\n---\nmetadata: {name: b}\nspec: {shim: clh}\n")
    code, _, err = run(capsys, "explain", path, "--class", "s")
    assert code == 1
    assert _lines(err) == [f"error: {path} holds several policies (a, b); pick one with --policy-name"]
    code, out, _ = run(capsys, "explain", path, "--class", "s", "--policy-name", "b", "-o", "json")
    assert code == 0
    assert json.loads(out)["runtimeClass"] == "kata-b-s"


def test_calibrate_bad_csv_exits_1(capsys, tmp_path):
    path = tmp_path / "samples.csv"
    path.write_text("container_limit_mib,vm_nominal_mib,free_total_mib,free_used_mib\n50,306,197\n")
    code, out, err = run(capsys, "calibrate", path)
    assert (code, out) == (1, "")
    assert err and all(line.startswith(f"error: {path}: ") for line in _lines(err))


def test_calibrate_missing_file_exits_2(capsys, tmp_path):
    code, _, err = run(capsys, "calibrate", tmp_path / "none.csv")
    assert code == 2
    assert _lines(err) == [f"error: {tmp_path / 'none.csv'}: no such file"]


def test_usage_errors_exit_2(capsys):
    code, _, err = run(capsys, "explain", str(ROOT / "examples" / "measured-classes.yaml"))
    assert code == 2
    assert "--class" in err and "--pod" in err


# --- the installed console script ---------------------------------------------------------------


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "COV_"))}


def test_console_script_runs_cold_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("metadata: {name: p}\nspec: {shim: qemu, classes: [{name: s, cpu: '1', memory: 1e1000000}]}\n")
    result = subprocess.run([str(CONSOLE_SCRIPT), "validate", str(bad)], capture_output=True, text=True,
                            timeout=60, env=_clean_env(), cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"error: {bad}: spec.classes[0].memory: '1e1000000' is out of range: a Kubernetes quantity is at most 2^63-1"
    ]


@pytest.mark.parametrize("argv, commands", [
    (["render", "--node-capacity", "256Gi"], ["common", "proposals", "render"]),
    (["validate"], ["common", "validate"]),
], ids=["render", "validate"])
def test_a_command_imports_only_its_own_module_and_nothing_of_the_operator(tmp_path, argv, commands):
    """Only the command being run is imported (cli/__init__.py's registry), and neither kopf, the
    kubernetes client, aiohttp nor matplotlib (without --plot)."""
    command, *flags = argv
    probe = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from kata_sizing.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            code = main([{command!r}, {str(ROOT / "examples" / "qemu-runtime-rs.yaml")!r}, *{flags!r}])
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("kopf", "kubernetes", "aiohttp", "matplotlib"))
        commands = sorted(m.rpartition(".")[2] for m in sys.modules if m.startswith("kata_sizing.cli."))
        print(json.dumps({{"code": code, "heavy": heavy, "commands": commands}}))
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            env=_clean_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"code": 0, "heavy": [], "commands": commands}


def test_every_command_is_in_the_help_in_the_registrys_order():
    from kata_sizing.cli import COMMANDS, build_parser

    help_text = build_parser().format_help()
    listed = [line.split()[0] for line in help_text.split("COMMAND\n", 1)[1].splitlines()
              if line.startswith("    ") and line.split() and not line.startswith("     ")]
    assert listed == list(COMMANDS)


def test_plain_render_loads_neither_node_guidance_nor_the_status_models(tmp_path):
    # A cold `kata-sizing render` is mostly imports and model construction; what it does not
    # need stays out (make bench's helm section shows the import profile).
    probe = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from kata_sizing.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["render", {str(ROOT / "examples" / "qemu-runtime-rs.yaml")!r}])
        print(json.dumps({{"code": code, "guidance": "kata_sizing.core.guidance" in sys.modules,
                          "status": "kata_sizing.core.statusmodel" in sys.modules}}))
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            env=_clean_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"code": 0, "guidance": False, "status": False}


def test_the_lease_timings_are_retry_pys_unless_a_test_flag_sets_them():
    from kata_sizing.cli import build_parser
    from kata_sizing.cli.operator import _lease_options
    from kata_sizing.controller import retry

    defaults = _lease_options(build_parser("operator").parse_args(["operator", "--leader-elect"]))
    assert (defaults.lease_duration_s, defaults.renew_deadline_s, defaults.retry_period_s) == (
        retry.LEASE_DURATION_S, retry.RENEW_DEADLINE_S, retry.LEASE_RETRY_PERIOD_S)
    shorter = _lease_options(build_parser("operator").parse_args(
        ["operator", "--leader-elect", "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.25"]))
    assert (shorter.lease_duration_s, shorter.renew_deadline_s, shorter.retry_period_s) == (4.0, 3.0, 0.25)
