"""The one rule set (rules.py): every path judges a class by the same code, on the values
as rendered, and the contradictions of issue 7 are refused (or warned about) by name."""

from __future__ import annotations

import copy
from decimal import Decimal

import pytest
import yaml

from kata_sizing.cli import main
from kata_sizing.controller.policy_webhook import admission_problems
from kata_sizing.core import defaults
from kata_sizing.core.audit import audit_values
from kata_sizing.core.defaults import Runtime
from kata_sizing.core.model import parse_policy
from kata_sizing.core.render import VALUES_KEY, render_policy
from kata_sizing.core.rules import KataConfig, Rule, Severity, read_drop_in
from kata_sizing.core.sizing import size_policy


def policy(**spec) -> dict:
    return {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy",
            "metadata": {"name": "p"}, "spec": {"shim": "qemu-runtime-rs", **spec}}


def measured(**fields) -> dict:
    return policy(classes=[{"name": "s", "cpu": "1", "memory": "1Gi", **fields}])


def rules_of(document: dict) -> set[tuple[str, str]]:
    return {(p.severity, p.rule) for p in size_policy(parse_policy(document)).problems}


def write(tmp_path, document: dict | str, name: str = "policy.yaml") -> str:
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    return str(path)


# --- checked on what Kata reads ---------------------------------------------------------


def test_overhead_vcpus_that_render_as_the_podfixed_cpu_are_refused(tmp_path, capsys) -> None:
    document = measured(overheadVcpus="0.49999999999999999999999999999", overheadMemory="128Mi",
                        defaultMemory="256Mi", podFixed={"cpu": "500m", "memory": "400Mi"})
    assert main(["validate", write(tmp_path, document)]) == 1
    err = capsys.readouterr().err
    assert "spec.classes[0] (s): podFixed.cpu 500m must be above overhead_vcpus 0.5" in err
    # The webhook and the operator use the same check.
    errors, _ = admission_problems(document)
    assert any("overhead_vcpus 0.5" in e for e in errors)


def test_the_drop_in_says_what_kata_reads_and_the_check_uses_the_same_value() -> None:
    document = measured(overheadVcpus="0.2000000000000000000001", overheadMemory="128Mi",
                        defaultMemory="256Mi", podFixed={"cpu": "300m", "memory": "400Mi"})
    sizing = size_policy(parse_policy(document))
    (sized,) = sizing.classes
    assert sized.overhead_vcpus == Decimal("0.2")  # a binary float to Kata's TOML reader
    drop_in = render_policy(sizing.policy, sizing=sizing).drop_ins["s.toml"]
    assert "overhead_vcpus = 0.2\n" in drop_in
    assert sizing.errors == []


def test_kata_config_round_trips_through_its_own_toml() -> None:
    base = KataConfig.shipped(defaults.SHIMS["qemu-runtime-rs"])
    text = ("[hypervisor.qemu]\ndefault_vcpus = 2\ndefault_memory = 1024\noverhead_vcpus = 0.5\n"
            "overhead_memory = 128\n\n[runtime]\nsandbox_cgroup_only = true\n")
    reading = read_drop_in(text, base, "d")
    assert reading.problems == [] and reading.config is not None
    assert reading.config.to_toml() == text
    assert read_drop_in(reading.config.to_toml(), base, "d").config == reading.config


# --- audit with the policy's own overhead -------------------------------------------------


def test_a_rendered_policy_with_a_small_host_side_audits_clean_with_its_policy(tmp_path, capsys) -> None:
    document = policy(overhead={"hostMemory": "20Mi", "hostCpu": "10m"})
    rendered = render_policy(parse_policy(document))
    values = yaml.safe_load(rendered.values_yaml)
    report = audit_values(values, [], [parse_policy(document)])
    assert report.errors == [] and report.warnings == []
    # Without the policy the family's 50 MiB host side is assumed: warnings at most.
    assert audit_values(values, []).errors == []
    values_path = write(tmp_path, rendered.values_yaml, "values.yaml")
    assert main(["audit", values_path, "--policy", write(tmp_path, document), "--strict"]) == 0
    assert "0 errors, 0 warnings" in capsys.readouterr().out


def test_validate_and_audit_give_the_same_rules_for_the_same_class() -> None:
    document = measured(overheadMemory="0", defaultMemory="256Mi", podFixed={"cpu": "1", "memory": "200Mi"})
    parsed = parse_policy(document)
    validated = {(p.severity, p.rule) for p in size_policy(parsed).problems}
    values = yaml.safe_load(render_policy(parsed).values_yaml)
    audited = {(f.severity, f.rule) for f in audit_values(values, [], [parsed]).findings}
    assert validated == audited == {
        (Severity.WARNING, Rule.SANDBOX_MEMORY_ZERO), (Severity.WARNING, Rule.NO_LIMITS_UNDER_ACCOUNTED),
    }


# --- contradictions -----------------------------------------------------------------------


def test_go_runtime_with_a_runtime_rs_shim_is_refused_naming_the_field() -> None:
    problems = size_policy(parse_policy(policy(runtime="Go"))).errors
    assert [(p.rule, p.path) for p in problems] == [(Rule.RUNTIME_SHIM_MISMATCH, "spec.runtime")]
    assert "qemu-runtime-rs, which runs the Rust runtime" in problems[0].message


def test_a_hypervisor_the_shim_does_not_read_is_refused_naming_the_field() -> None:
    problems = size_policy(parse_policy(policy(hypervisor="clh"))).errors
    assert [(p.rule, p.path) for p in problems] == [(Rule.HYPERVISOR_SECTION_IGNORED, "spec.hypervisor")]
    assert "[hypervisor.qemu]" in problems[0].message


def test_the_shims_own_runtime_and_hypervisor_are_fine() -> None:
    assert rules_of(policy(runtime="Rust", hypervisor="qemu")) == set()


def test_a_zero_mib_sandbox_is_a_warning_validate_strict_refuses_and_explain_refuses(tmp_path, capsys) -> None:
    document = measured(overheadMemory="0", defaultMemory="256Mi", podFixed={"cpu": "1", "memory": "400Mi"})
    path = write(tmp_path, document)
    assert main(["validate", path]) == 0
    assert "warning: p: spec.classes[0] (s): computed sandbox memory is 0 MiB" in capsys.readouterr().err
    assert main(["validate", path, "--strict"]) == 1
    assert main(["explain", path, "--class", "s", "--cpu", "1"]) == 1
    assert "computed sandbox memory is 0 MiB" in capsys.readouterr().err
    no_default = write(tmp_path, measured(overheadMemory="128Mi", defaultMemory="0",
                                          podFixed={"cpu": "1", "memory": "400Mi"}), "no-default.yaml")
    assert main(["validate", no_default]) == 0
    assert "computed sandbox memory is 0 MiB" in capsys.readouterr().err
    assert main(["explain", no_default, "--class", "s"]) == 1  # a pod without limits
    assert "Kata refuses this pod: computed sandbox memory is 0 MiB" in capsys.readouterr().err
    both = measured(overheadMemory="0", defaultMemory="0", podFixed={"cpu": "1", "memory": "400Mi"})
    assert (Severity.ERROR, Rule.SANDBOX_MEMORY_ZERO) in rules_of(both)


def test_sandbox_cgroup_only_false_is_warned_once_per_policy() -> None:
    found = [p for p in size_policy(parse_policy(policy(sandboxCgroupOnly=False))).problems]
    assert [(p.severity, p.rule) for p in found] == [(Severity.WARNING, Rule.SANDBOX_CGROUP_ONLY)]
    assert found[0].fix == "set spec.sandboxCgroupOnly to true"


def test_go_class_with_zero_podfixed_cpu_is_refused_and_guidance_does_not_divide_by_it(tmp_path, capsys) -> None:
    document = policy(shim="qemu", classes=[{"name": "s", "cpu": "0", "memory": "1Gi",
                                             "podFixed": {"cpu": "0", "memory": "400Mi"}}])
    assert (Severity.ERROR, Rule.POD_FIXED_CPU_ZERO) in rules_of(document)
    code = main(["render", write(tmp_path, document), "--node-capacity", "64Gi", "--node-cpu", "16"])
    assert code == 1
    err = capsys.readouterr().err
    assert "podFixed.cpu 0 accounts nothing" in err and "Traceback" not in err


def test_every_problem_carries_severity_rule_path_message_and_fix() -> None:
    document = copy.deepcopy(measured(overheadVcpus="0.5", overheadMemory="128Mi", defaultMemory="1Gi",
                                      podFixed={"cpu": "500m", "memory": "128Mi"}))
    problems = size_policy(parse_policy(document)).problems
    assert {p.rule for p in problems} == {
        Rule.RUST_POD_FIXED_CPU, Rule.RUST_POD_FIXED_MEMORY, Rule.NO_LIMITS_UNDER_ACCOUNTED}
    for p in problems:
        assert p.severity in (Severity.ERROR, Severity.WARNING)
        assert p.path == "spec.classes[0] (s)" and p.message and p.fix.startswith("set spec.classes[0].")


def test_go_shim_keeps_the_go_rules() -> None:
    sizing = size_policy(parse_policy(policy(shim="qemu")))
    assert sizing.runtime is Runtime.GO and sizing.problems == ()
    assert all(c.kata is not None and c.kata.runtime is Runtime.GO for c in sizing.classes)


@pytest.mark.parametrize("values_key", [VALUES_KEY])
def test_rendered_values_carry_the_drop_in_the_rules_read(values_key) -> None:
    rendered = render_policy(parse_policy(policy()))
    values = yaml.safe_load(rendered.configmaps[0]["data"][values_key])
    for sized in rendered.sizing.classes:
        drop_in = values["customRuntimes"]["runtimes"][sized.runtime_class]["dropIn"]
        base = KataConfig.shipped(defaults.SHIMS["qemu-runtime-rs"])
        assert read_drop_in(drop_in, base, "d").config == sized.kata


def test_validate_json_gives_each_problem_its_rule_id_and_fix(tmp_path, capsys) -> None:
    import json

    document = measured(overheadVcpus="0.5", overheadMemory="128Mi", defaultMemory="256Mi",
                        podFixed={"cpu": "500m", "memory": "400Mi"})
    assert main(["validate", write(tmp_path, document), "-o", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False
    (problem,) = report["policies"][0]["problems"]
    assert problem == {
        "severity": "error", "rule": Rule.RUST_POD_FIXED_CPU, "path": "spec.classes[0] (s)",
        "message": "podFixed.cpu 500m must be above overhead_vcpus 0.5: podFixed covers the guest side "
                   "(overhead_vcpus) plus the host side",
        "fix": "set spec.classes[0].podFixed.cpu to 550m (overhead_vcpus 0.5 + 50m host)",
    }
    bad = write(tmp_path, policy(nodes={"systemReserved": " 4Gi"}), "bad.yaml")
    assert main(["validate", bad, "-o", "json"]) == 1
    (schema,) = json.loads(capsys.readouterr().out)["problems"]
    assert schema["rule"] == Rule.POLICY_SCHEMA and schema["path"] == "spec.nodes.systemReserved"
