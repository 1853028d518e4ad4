"""Issue 7's properties, with a fuzz budget: `make test` runs FUZZ_EXAMPLES (default 60) per
property, `make fuzz` many more (KATA_SIZING_FUZZ_EXAMPLES, with hypothesis' statistics
printed: the count of inputs each property tried).

- For any valid policy, `audit` of what `render` wrote finds no error, and with the policy
  the same rules `validate` gives.
- For any valid policy, what `render` writes parses back to the same numbers.
- Any byte string as a policy file, values file or CSV, and any string as a CLI flag value,
  ends in exit 0, 1 or 2 with one-line messages and no traceback.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kata_sizing.cli import main
from kata_sizing.core import defaults
from kata_sizing.core.audit import audit_values
from kata_sizing.core.defaults import Runtime
from kata_sizing.core.model import parse_policy
from kata_sizing.core.quantity import MIB, cpu_cores, memory_bytes
from kata_sizing.core.render import render_policy
from kata_sizing.core.rules import KataConfig, Severity, read_drop_in
from tests.support import apiserver_grammar as grammar
from tests.support.paths import ROOT
from tests.support.strategies import SCALAR_FIELDS, valid_policies, yaml_scalars

FUZZ_EXAMPLES = int(os.environ.get("KATA_SIZING_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- the rendered output, judged by the same rules ----------------------------------------


def _rendered_install(document: dict):
    policy = parse_policy(document)
    rendered = render_policy(policy)
    return policy, rendered, yaml.safe_load(rendered.values_yaml)


@FUZZ
@given(document=valid_policies())
def test_audit_of_a_rendered_valid_policy_finds_no_error(document):
    policy, rendered, values = _rendered_install(document)
    runtime_classes = rendered.runtime_classes
    with_policy = audit_values(values, runtime_classes, [policy])
    assert with_policy.errors == [], [str(f) for f in with_policy.errors]
    # With the policy, audit and validate apply the same rules to each class.
    validated = {(p.severity, p.rule) for p in rendered.sizing.problems}
    audited = {(f.severity, f.rule) for f in with_policy.findings}
    assert audited == validated
    # Without it (the shim family's host side assumed), still no error: no rule's error
    # depends on the host side.
    assert [f for f in audit_values(values, runtime_classes).findings if f.severity == Severity.ERROR] == []


@FUZZ
@given(document=valid_policies())
def test_what_render_writes_parses_back_to_the_same_numbers(document):
    policy, rendered, values = _rendered_install(document)
    sizing = rendered.sizing
    base = KataConfig.shipped(defaults.SHIMS[policy.spec.shim])
    by_name = {rc["metadata"]["name"]: rc for rc in rendered.runtime_classes}
    for sized in sizing.classes:
        runtime_class = by_name[sized.runtime_class]
        pod_fixed = runtime_class["overhead"]["podFixed"]
        assert cpu_cores(pod_fixed["cpu"]) == sized.pod_fixed_cpu
        assert memory_bytes(pod_fixed["memory"]) == sized.pod_fixed_memory_mib * MIB
        drop_in = rendered.drop_ins[f"{sized.name}.toml"]
        assert read_drop_in(drop_in, base, "d").config == sized.kata
        table = tomllib.loads(drop_in)["hypervisor"][sizing.hypervisor]
        assert table["default_memory"] == sized.default_memory_mib
        assert table["default_vcpus"] == sized.default_vcpus
        if sizing.runtime is Runtime.RUST:
            assert table["overhead_memory"] == sized.overhead_memory_mib
            assert table["overhead_vcpus"] == float(sized.overhead_vcpus)
            assert table["default_maxmemory"] == sized.default_maxmemory_mib
        custom = values["customRuntimes"]["runtimes"][sized.runtime_class]
        assert custom["dropIn"] == drop_in
        assert yaml.safe_load(custom["runtimeClass"])["overhead"] == runtime_class["overhead"]


# --- any input: exit 0, 1 or 2, never a traceback ----------------------------------------


def _run(argv: list[str], reported_on_stdout: bool = False) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code: int | str | None
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: a usage error
            code = exc.code
    text = err.getvalue()
    assert code in (0, 1, 2), (argv, code, text[-500:])
    assert "Traceback" not in text
    if code and not reported_on_stdout:
        lines = text.splitlines()
        assert lines, argv
        assert all(line.startswith(("error: ", "warning: ", "note: ", "usage: ", "kata-sizing"))
                   or line.startswith(" ") for line in lines), text[-500:]
    return code, text


@contextlib.contextmanager
def _file(data: bytes, name: str) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / name
        path.write_bytes(data)
        yield str(path)


# Pieces that break parsers: YAML structure, aliases, huge numbers, control characters,
# quantities at their edges. Bytes are drawn from these and from anything at all.
FRAGMENTS = [
    b"apiVersion: katasizing.dev/v1alpha1\n", b"kind: KataSizingPolicy\n", b"metadata: {name: p}\n",
    b"spec:\n", b"  shim: qemu-runtime-rs\n", b"  classes:\n", b"  - name: s\n", b"    cpu: '1'\n",
    b"    memory: 1Gi\n", b"&a [*a]", b"&a [1,2,3]\n", b"b: &b [*a,*a,*a,*a]\n", b"<<: *a\n", b"*b",
    b"---\n", b"...\n", b"key: 1\nkey: 2\n", b"1" * 50, b"1e99999", b"0x" + b"f" * 40, b"\x00", b"\xff\xfe",
    b"\t", b"\r\n", b"\xe2\x80\xa8", b"  ", b"[" * 50, b"]" * 50, b"{", b"}", b"!!python/object:os.system",
    b"!!binary AAAA", b"\"\\u0000\"", b"' 1Gi'", b"\xd9\xa3Mi", b"-", b": ", b"- ", b"# c\n", b"%YAML 1.1\n",
    b"shims:\n  qemu:\n    enabled: true\n    dropIn: |\n      [hypervisor.qemu]\n      default_memory = 0\n",
    b"customRuntimes: {enabled: true, runtimes: {x: {baseConfig: qemu, runtimeClass: 'handler: x'}}}\n",
    b"container_limit_mib,vm_nominal_mib,free_total_mib,free_used_mib\n", b"50,306,197,27\n",
    b"\"" + b"9" * 300 + b"\"", b",,,,", b"\"a,b", b"1.5,2.5,1,0\n",
    # What a row measured (calibrate's kind columns), and a second header starting rows of other columns.
    b"accelerator,guest,host_processes,devices,tcg_tb_size_mib,tcg_cache_resident_bytes,",
    b"container_limit_mib,vm_nominal_mib,free_total_mib,free_used_mib,pod_cgroup_memory_current_bytes\n",
    b"tcg,kernel-only,vmm,serial+virtio-console,64,,", b"kvm,kata-pod,kata-pod,kata,,,", b"vmm+virtiofsd",
    b"kata-image", b"serial+serial", b"+", b"tcg,", b"0,", b"4097,", b"50,306,197,27,1099511627776\n",
]
hostile_bytes = st.one_of(
    st.binary(max_size=400),
    st.lists(st.sampled_from(FRAGMENTS), max_size=20).map(b"".join),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.binary(max_size=8)), max_size=20).map(b"".join),
)


@FUZZ
@given(data=hostile_bytes)
def test_any_bytes_as_a_policy_file_exit_cleanly(data):
    with _file(data, "policy.yaml") as path:
        for argv in (["validate", path], ["render", path], ["explain", path, "--class", "s"]):
            _run(argv)
        _run(["validate", path, "-o", "json"], reported_on_stdout=True)


@FUZZ
@given(data=hostile_bytes)
def test_any_bytes_as_a_values_file_or_runtime_class_list_exit_cleanly(data):
    with _file(data, "values.yaml") as path:
        _run(["audit", path], reported_on_stdout=True)
        _run(["audit", str(ROOT / "tests" / "fixtures" / "audit" / "mistakes.yaml"), path], reported_on_stdout=True)


@FUZZ
@given(data=hostile_bytes)
def test_any_bytes_as_a_csv_exit_cleanly(data):
    with _file(data, "samples.csv") as path:
        _run(["calibrate", path])


@FUZZ
@given(pods=hostile_bytes, summary=st.one_of(hostile_bytes, st.sampled_from([
    b'{"node": {"nodeName": "n1"}, "pods": [{"podRef": {"name": "p", "namespace": "ns", "uid": "u"}, '
    b'"memory": {"workingSetBytes": 18446744073709551616}}]}',
    b'{"node": {"nodeName": ["n1"]}}', b'{"node": {"nodeName": "n1"}, "pods": {}}', b'[]'])))
def test_any_bytes_as_a_survey_exit_cleanly(pods, summary):
    policy = str(ROOT / "examples" / "qemu-runtime-rs.yaml")
    with _file(pods, "pods.yaml") as pods_path, _file(summary, "summary.json") as summary_path:
        _run(["survey", policy, "--pods", pods_path, "--summary", summary_path])


POD_FRAGMENTS = [
    b"apiVersion: v1\n", b"kind: Pod\n", b"kind: List\n", b"kind: Deployment\n", b"kind: CronJob\n",
    b"metadata: {name: p, namespace: n, labels: {katasizing.dev/policy: qemu-rs}}\n", b"spec:\n",
    b"  runtimeClassName: kata-qemu-rs-s\n", b"  containers:\n", b"  initContainers:\n",
    b"  - resources: {limits: {memory: 5Zi}}\n", b"  - resources: {limits: {cpu: '1001m', memory: 1Gi}}\n",
    b"    restartPolicy: Always\n", b"  resources: {limits: {memory: [1]}}\n", b"items:\n", b"- spec: {containers: []}\n",
    b"  template: {spec: {containers: [{}]}}\n", b"  jobTemplate: 1\n",
]
hostile_pod_bytes = st.lists(st.one_of(st.sampled_from(POD_FRAGMENTS), st.sampled_from(FRAGMENTS),
                                       st.binary(max_size=8)), max_size=24).map(b"".join)
_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=12),
                    st.sampled_from(["1Gi", "1001m", "0", "-1", "1e3", "9Ei", "5Zi", "Always", "0.5"]))
_limits = st.one_of(_scalar, st.dictionaries(st.sampled_from(["cpu", "memory", "x"]), _scalar, max_size=3))
_container = st.one_of(_scalar, st.fixed_dictionaries({}, optional={
    "resources": st.one_of(_scalar, st.fixed_dictionaries({}, optional={"limits": _limits})),
    "restartPolicy": _scalar}))
hostile_pods = st.fixed_dictionaries({"kind": st.sampled_from(["Pod", "Job", None])}, optional={
    "metadata": st.one_of(_scalar, st.fixed_dictionaries({}, optional={
        "name": _scalar, "namespace": _scalar,
        "labels": st.one_of(_scalar, st.dictionaries(st.sampled_from(["katasizing.dev/policy", "a"]), _scalar))})),
    "spec": st.one_of(_scalar, st.fixed_dictionaries({}, optional={
        "containers": st.one_of(_scalar, st.lists(_container, max_size=3)),
        "initContainers": st.one_of(_scalar, st.lists(_container, max_size=3)),
        "resources": st.one_of(_scalar, st.fixed_dictionaries({}, optional={"limits": _limits})),
        "runtimeClassName": st.one_of(_scalar, st.sampled_from(["kata-qemu-rs-s", "kata-qemu-rs-xl"])),
        "template": _scalar})),
})


@FUZZ
@given(data=hostile_pod_bytes)
def test_any_bytes_as_a_pod_file_exit_cleanly(data):
    policy = str(ROOT / "examples" / "qemu-runtime-rs.yaml")
    with _file(data, "pods.yaml") as path:
        _run(["audit", "--pods", path, "--policy", policy], reported_on_stdout=True)
        _run(["explain", "--pod", path, "--policy", policy], reported_on_stdout=True)


@FUZZ
@given(pods=st.lists(hostile_pods, min_size=1, max_size=4))
def test_any_pods_of_the_right_shape_exit_cleanly(pods):
    policy = str(ROOT / "examples" / "qemu-runtime-rs.yaml")
    text = yaml.safe_dump_all(pods).encode()
    with _file(text, "pods.yaml") as path:
        _run(["audit", "--pods", path, "--policy", policy], reported_on_stdout=True)
        _run(["explain", "--pod", path, "--policy", policy, "-o", "json"], reported_on_stdout=True)


EDGE_FLAGS = ["", " ", "1", "0", "-1", "1.5", "600Mi", " 600Mi", "600Mi\n", "1e99999", "9" * 300, "1" * 64,
              "\x00", "\u0663", "NaN", "inf", "-0", "0.", ".5", "1e-99999", "9Ei", "abc", "--strict"]
flag_values = st.one_of(st.sampled_from(EDGE_FLAGS), st.text(max_size=80))


@FUZZ
@given(value=flag_values)
def test_any_string_as_a_flag_value_exits_cleanly(value):
    policy = str(ROOT / "examples" / "measured-classes.yaml")
    samples = str(ROOT / "tests" / "fixtures" / "survey-aks-clh-snp.csv")
    for argv in (
        ["explain", policy, "--class", "m", "--cpu", value],
        ["explain", policy, "--class", "m", "--memory", value],
        ["explain", policy, "--class", value],
        ["explain", policy, "--class", "m", "--policy-name", value],
        ["render", policy, "--node-capacity", value],
        ["render", policy, "--node-capacity", "64Gi", "--node-cpu", value],
        ["render", policy, "--node-capacity", "64Gi", "--infra-pod-memory", value],
        ["calibrate", samples, "--margin", value],
    ):
        _run(argv)


@pytest.mark.parametrize("value, accepted", [("0.10", True), ("1", True), ("1.5", False), ("-0.1", False),
                                              ("NaN", False), ("abc", False), ("1e3", False)])
def test_calibrate_margin_is_checked_like_the_policys(value, accepted, capsys) -> None:
    code = main(["calibrate", str(ROOT / "tests" / "fixtures" / "survey-aks-clh-snp.csv"), "--margin", value])
    err = capsys.readouterr().err
    assert code == (0 if accepted else 1)
    assert accepted or err.startswith("error: --margin: ")


# --- hostile values files: a real install's shape with one part replaced --------------------

VALUES_FIXTURES = [ROOT / "tests" / "fixtures" / "audit" / name
                   for name in ("mistakes.yaml", "kata-deploy-defaults.yaml")]
HOSTILE_TOML = [
    "[hypervisor.qemu]\ndefault_memory = 99999999999999999999\n", "[hypervisor.qemu]\noverhead_vcpus = 1e308\n",
    "[hypervisor.qemu]\ndefault_vcpus = -inf\n", "[hypervisor]\nqemu = 1\n", "hypervisor = 'x'\n",
    "[hypervisor.qemu]\ndefault_memory = 1979-05-27\n", "[runtime]\nsandbox_cgroup_only = [true]\n",
    "[hypervisor.qemu]\noverhead_memory = 0\ndefault_memory = 0\n", "a = " + "[" * 600 + "]" * 600 + "\n",
    "[hypervisor.\"qemu\\u0000\"]\ndefault_memory = 1\n", "\x00", "[[hypervisor.qemu]]\n",
]
HOSTILE_RUNTIME_CLASS = [
    "handler: x\noverhead: {podFixed: {memory: ' 1Gi', cpu: 1e400}}\n", "handler: 'kata-x'\n",
    "handler:\n", "handler: [a]\n", "kind: RuntimeClass\nhandler: kata-x\noverhead: {podFixed: 5}\n",
    "&a [*a]", "handler: kata-x\nhandler: kata-y\n",
]
hostile_leaves = st.one_of(
    st.sampled_from(HOSTILE_TOML), st.sampled_from(HOSTILE_RUNTIME_CLASS), st.sampled_from(EDGE_FLAGS),
    st.integers(-(2**80), 2**80), st.floats(), st.none(), st.booleans(), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3), st.text(max_size=40),
)


def _leaf_paths(node, prefix=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key)
            yield from _leaf_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield (*prefix, index)
            yield from _leaf_paths(value, (*prefix, index))


@st.composite
def hostile_values(draw) -> dict:
    values = yaml.safe_load(draw(st.sampled_from(VALUES_FIXTURES)).read_text())
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(list(_leaf_paths(values))))
        target = values
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = draw(hostile_leaves)
    return values


@FUZZ
@given(values=hostile_values())
def test_any_values_of_the_charts_shape_audit_cleanly(values):
    try:
        text = yaml.safe_dump(values)
    except (yaml.YAMLError, ValueError):
        text = None
    report = audit_values(values, [])
    for finding in report.findings:
        assert "\n" not in finding.message and "\n" not in finding.fix
    if text is not None:
        with _file(text.encode(), "values.yaml") as path:
            # audit reports its findings on stdout (a table, or JSON).
            _run(["audit", path], reported_on_stdout=True)
            _run(["audit", "-o", "json", path], reported_on_stdout=True)


# --- valid policy text with one value or line replaced by something hostile ----------------

HOSTILE_VALUES = [
    "&a [*a]", "*nowhere", "1" * 60, "1.0e+99999", '"\\n"', '"s\\n"', "' 1Gi'", '"\\u0663Gi"', "[" * 80,
    "{a: 1, a: 2}", "!!binary AAAA", "!!python/object/apply:os.system ['true']", "0x" + "f" * 30, ".nan",
    "-.inf", "~", "[]", "{}", "'0.49999999999999999999999999999'", "'1e5000'", "2001-01-01", "'9Ei'", "-1",
    "'" + "x" * 300 + "'", "|\n  multi\n  line", "0o777", "1_000", "yes", "'\\t'",
]


@st.composite
def hostile_policy_texts(draw) -> str:
    lines = yaml.safe_dump(draw(valid_policies()), sort_keys=False).splitlines()
    for _ in range(draw(st.integers(1, 3))):
        index = draw(st.integers(0, len(lines) - 1))
        line = lines[index]
        hostile = draw(st.sampled_from(HOSTILE_VALUES))
        if ": " in line and draw(st.booleans()):
            key = line.split(": ", 1)[0]
            lines[index] = f"{key}: {hostile}"
        else:
            indent = line[: len(line) - len(line.lstrip())]
            lines.insert(index, f"{indent}{draw(st.sampled_from(['x', 'name', 'memory', 'cpu']))}: {hostile}")
    return "\n".join(lines) + "\n"


@FUZZ
@given(text=hostile_policy_texts())
def test_valid_policy_text_with_hostile_values_exits_cleanly(text):
    with _file(text.encode(), "policy.yaml") as path:
        for argv in (["validate", path, "--strict"], ["render", path, "--node-capacity", "64Gi", "--node-cpu", "8"],
                     ["explain", path, "--class", "s", "--cpu", "1"]):
            _run(argv)


# --- YAML as the API server reads it (tests/support/apiserver_grammar.py): the CLI's exit code -----------


@FUZZ
@given(picks=st.lists(st.tuples(st.sampled_from(sorted(SCALAR_FIELDS)), yaml_scalars), min_size=1, max_size=4))
def test_validate_agrees_with_the_api_servers_schema_on_unquoted_scalars(picks):
    lines: dict[str, str] = {}
    expected_valid = True
    for field, scalar in picks:
        kind, line, stricter = SCALAR_FIELDS[field]
        text = line.format(scalar.text)
        top = text.split(":", 1)[0]
        if top in lines:
            continue  # one value per spec key
        lines[top] = text
        expected_valid = expected_valid and grammar.schema_accepts(kind, scalar) and not stricter(scalar)
    policy = ("apiVersion: katasizing.dev/v1alpha1\nkind: KataSizingPolicy\nmetadata: {name: p}\n"
              "spec:\n  shim: qemu-runtime-rs\n" + "".join(f"  {line}\n" for line in lines.values()))
    with _file(policy.encode(), "policy.yaml") as path:
        code, err = _run(["validate", path])
    assert code == (0 if expected_valid else 1), (policy, err)
