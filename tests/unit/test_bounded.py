"""Hostile input, each kind issue 7 names: refused with a line naming what is wrong, exit 2
for what cannot be read, 1 for what breaks a rule, never a traceback (bounded.py)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import yaml

from kata_sizing.cli import main
from kata_sizing.core import bounded
from kata_sizing.core.model import PolicyError, parse_policy
from tests.support.paths import ROOT

POLICY = """apiVersion: katasizing.dev/v1alpha1
kind: KataSizingPolicy
metadata: {name: p}
spec:
  shim: qemu-runtime-rs
"""
BILLION_LAUGHS = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
) + "\n"


def run(capsys, *argv: object) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.fixture
def write(tmp_path):
    def write(text: str | bytes, name: str = "input.yaml") -> Path:
        path = tmp_path / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path
    return write


def test_an_alias_bomb_is_refused_while_still_text(capsys, write) -> None:
    # 9^9 nodes once expanded; audit used to walk them all and exhaust memory.
    for command in (["audit"], ["validate"], ["audit", ROOT / "tests" / "fixtures" / "audit" / "mistakes.yaml"]):
        code, err = run(capsys, *command, write(BILLION_LAUGHS))
        assert code == 2
        assert "expands to more than 200000 YAML nodes" in err


def test_deep_nesting_is_refused(capsys, write) -> None:
    code, err = run(capsys, "validate", write(POLICY + "  classes: " + "[" * 5000 + "]" * 5000 + "\n"))
    assert code == 2 and "nests deeper than 64 levels" in err


@pytest.mark.parametrize("number", ["9" * 5000, "1.0e+" + "9" * 100, "0." + "1" * 100])
def test_numbers_with_too_many_digits_are_refused(capsys, write, number) -> None:
    code, err = run(capsys, "validate", write(POLICY + f"  hugepages: {number}\n"))
    assert code == 2 and "numbers are at most 40" in err


def test_a_quoted_huge_exponent_is_a_quantity_problem_not_a_crash(capsys, write) -> None:
    code, err = run(capsys, "validate", write(POLICY + "  nodes: {systemReserved: '1e" + "9" * 5000 + "'}\n"))
    assert code == 1 and "spec.nodes.systemReserved:" in err and "at most 64" in err


def test_duplicate_keys_are_refused_naming_both_lines(capsys, write) -> None:
    code, err = run(capsys, "validate", write(POLICY + "  hugepages: true\n  hugepages: false\n"))
    assert code == 2
    assert "key 'hugepages' is given twice in one mapping (first at line 6)" in err and "line 7" in err


def test_merge_keys_are_not_duplicates(capsys, write) -> None:
    text = POLICY + "  fallback: &f {cpu: '1', memory: 256Mi}\n  nodes:\n    <<: {systemReserved: 4Gi}\n"
    assert run(capsys, "validate", write(text))[0] == 0


def test_two_policies_with_one_name_in_a_file_are_refused(capsys, write) -> None:
    code, err = run(capsys, "validate", write(POLICY + "---\n" + POLICY))
    assert code == 1
    assert "(document 2): metadata.name: a policy named 'p' is already in " in err
    assert "input.yaml (document 1); names must be unique" in err


@pytest.mark.parametrize("field, value, where", [
    ("metadata.name", '"p\\n"', "metadata.name"),
    ("class name", '"s\\n"', "spec.classes[0].name"),
    ("name prefix", '"kata-x\\n"', "spec.runtimeClass.namePrefix"),
])
def test_names_with_control_characters_are_refused(capsys, write, field, value, where) -> None:
    document = yaml.safe_load(POLICY)
    document["spec"]["classes"] = [{"name": "s", "cpu": "1", "memory": "1Gi"}]
    text = yaml.safe_dump(document)
    text = {
        "metadata.name": text.replace("name: p", f"name: {value}"),
        "class name": text.replace("name: s", f"name: {value}"),
        "name prefix": text + f"  runtimeClass: {{namePrefix: {value}}}\n".replace("  runtimeClass", "runtimeClass")
        .replace("runtimeClass", "  runtimeClass", 1),
    }[field]
    code, err = run(capsys, "validate", write(text))
    assert code == 1 and where in err, err


@pytest.mark.parametrize("quantity", [" 4Gi", "4Gi ", "4Gi\n", "\u0664Gi", "\uff14Gi", "4_096Mi"])
def test_quantities_outside_the_api_servers_grammar_are_refused(capsys, write, quantity) -> None:
    text = POLICY + f"  nodes: {{systemReserved: {json.dumps(quantity)}}}\n"
    assert yaml.safe_load(text)["spec"]["nodes"]["systemReserved"] == quantity
    code, err = run(capsys, "validate", write(text))
    assert code == 1 and "spec.nodes.systemReserved:" in err and "not a Kubernetes quantity" in err


@pytest.mark.parametrize("ratio", [" 0.14", "0.1_4", "\u0660.14", "1e-1", "Infinity"])
def test_decimal_fields_follow_the_crd_pattern(ratio) -> None:
    document = yaml.safe_load(POLICY)
    document["spec"]["overhead"] = {"guestMemoryRatio": ratio}
    with pytest.raises(PolicyError) as info:
        parse_policy(document)
    assert info.value.problems[0].startswith("spec.overhead.guestMemoryRatio: ")


def test_a_file_past_the_size_bound_is_refused(capsys, write) -> None:
    code, err = run(capsys, "validate", write(POLICY + "#" * bounded.MAX_INPUT_BYTES))
    assert code == 2 and "larger than the 4 MiB kata-sizing reads" in err


def test_stdin_past_the_size_bound_is_refused(capsys, monkeypatch) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(b"#" * (bounded.MAX_INPUT_BYTES + 10)))
    monkeypatch.setattr(sys, "stdin", stdin)
    code, err = run(capsys, "validate", "-")
    assert code == 2 and "larger than" in err


def test_a_parsed_body_is_bounded_too() -> None:
    # The operator and the webhook get bodies the API server parsed already.
    body = yaml.safe_load(POLICY)
    body["spec"]["nodes"] = {"selector": {f"k{i}": "v" for i in range(bounded.MAX_NODES + 1)}}
    with pytest.raises(PolicyError, match="more than 200000 nodes"):
        parse_policy(body)
    body = yaml.safe_load(POLICY)
    body["spec"]["hugepages"] = 10**200
    with pytest.raises(PolicyError, match="numbers are at most 128 bits"):
        parse_policy(body)


@pytest.mark.parametrize("line, message", [
    ("50,306,197," + "9" * 200000, "longer than 1024"),
    ("50,306,197," + "9" * 100, "longer than 32 characters"),
    ("50,306,197,\x00", None),
])
def test_oversize_or_broken_csv_fields_are_problems_not_crashes(capsys, write, line, message) -> None:
    header = "container_limit_mib,vm_nominal_mib,free_total_mib,free_used_mib\n"
    code, err = run(capsys, "calibrate", write(header + line + "\n100,400,300,20\n", "s.csv"))
    assert code == 1 and err.startswith("error: ")
    assert message is None or message in err


@pytest.mark.parametrize("argv, message", [
    (["--cpu", "1" * 300], "--cpu: 300 characters; at most 256"),
    (["--memory", "1Gi\n"], "--memory: '1Gi\\n' holds control characters"),
    (["--class", "m\x1b[2J"], "--class: 'm\\x1b[2J' holds control characters"),
])
def test_flag_values_are_bounded_and_printable(capsys, argv, message) -> None:
    code, err = run(capsys, "explain", ROOT / "examples" / "measured-classes.yaml", "--class", "m", *argv)
    assert code == 1 and message in err


@pytest.mark.parametrize("selector, problem", [
    ({"bad key": "x"}, "'bad key' is not a label key"),
    ({"k": "v\n"}, "'v\\n' is not a label value"),
    ({"k": "x" * 64}, "is not a label value"),
    ({"Example.com/k": "v"}, "is not a label key"),
])
def test_selectors_are_kubernetes_labels(selector, problem) -> None:
    document = yaml.safe_load(POLICY)
    document["spec"]["runtimeClass"] = {"nodeSelector": selector}
    with pytest.raises(PolicyError) as info:
        parse_policy(document)
    assert info.value.problems[0].startswith("spec.runtimeClass.nodeSelector: ")
    assert problem in info.value.problems[0]


def test_an_alias_bomb_inside_a_custom_runtimes_runtime_class_string_is_a_finding(capsys, write) -> None:
    from kata_sizing.core.audit import Rule, audit_values

    runtime_class = BILLION_LAUGHS + "handler: kata-bomb\noverhead:\n  podFixed:\n    memory: *i\n"
    values = {"customRuntimes": {"enabled": True, "runtimes": {"bomb": {
        "baseConfig": "qemu-runtime-rs", "runtimeClass": runtime_class}}}}
    (finding,) = audit_values(values, []).findings
    assert finding.rule == Rule.RUNTIME_CLASS_INVALID
    assert "expands to more than 200000 YAML nodes" in finding.message
    code, _ = run(capsys, "audit", write(yaml.safe_dump(values)))
    assert code == 1


def test_a_quantity_that_is_a_huge_aliased_list_is_reported_briefly() -> None:
    from kata_sizing.core.quantity import QuantityError, memory_bytes

    bomb = yaml.load(BILLION_LAUGHS, Loader=yaml.SafeLoader)["i"]  # 9^9 elements if expanded
    with pytest.raises(QuantityError) as info:
        memory_bytes(bomb)
    assert len(str(info.value)) < 200
