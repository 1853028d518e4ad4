"""`kata-sizing audit`: kata-deploy values and live RuntimeClasses against docs/rules.md. Fixtures in
tests/fixtures/audit/ are written by hand with the chart's
shape; nothing outside the repository is read."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from kata_sizing.cli import load_policies, main
from kata_sizing.core import defaults
from kata_sizing.core.audit import (
    AuditError,
    CheckedClass,
    Rule,
    Severity,
    audit_runtime_classes,
    audit_values,
    runtime_classes_from_documents,
)
from kata_sizing.core.defaults import Runtime
from kata_sizing.core.quantity import MIB
from kata_sizing.core.render import render_policy
from kata_sizing.core.rules import KataConfig
from tests.support.paths import EXAMPLES, FIXTURES

AUDIT_FIXTURES = FIXTURES / "audit"
CHART_DEFAULTS = AUDIT_FIXTURES / "kata-deploy-defaults.yaml"
MISTAKES = AUDIT_FIXTURES / "mistakes.yaml"
LIVE = AUDIT_FIXTURES / "runtimeclasses.yaml"

HOST_MIB = defaults.OVERHEAD_DEFAULTS[defaults.Family.STANDARD].host_memory_mib



def kata_of(checked: CheckedClass) -> KataConfig:
    """The Kata configuration of a RuntimeClass the audit could read."""
    assert checked.kata is not None, f"{checked.name}'s drop-in was not read"
    return checked.kata

def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _live() -> list[dict]:
    return runtime_classes_from_documents(list(yaml.safe_load_all(LIVE.read_text())))


def _by_class(report) -> dict[str, set[tuple[str, str]]]:
    found: dict[str, set[tuple[str, str]]] = {c.name: set() for c in report.checked}
    for f in report.findings:
        found.setdefault(f.runtime_class, set()).add((f.severity, f.rule))
    return found


def _finding(report, runtime_class: str, rule: str):
    matches = [f for f in report.findings if f.runtime_class == runtime_class and f.rule == rule]
    assert len(matches) == 1, (runtime_class, rule, report.findings)
    return matches[0]


def _drop_in(**keys: object) -> str:
    hypervisor = {k: v for k, v in keys.items() if k not in ("sandbox_cgroup_only", "static_sandbox_resource_mgmt")}
    runtime = {k: v for k, v in keys.items() if k not in hypervisor}

    def toml(v: object) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    lines = ["[hypervisor.qemu]", *(f"{k} = {toml(v)}" for k, v in hypervisor.items())]
    lines += ["[runtime]", *(f"{k} = {toml(v)}" for k, v in runtime.items())]
    return "\n".join(lines) + "\n"


def _one_shim(shim: str, **config: object) -> dict:
    return {"shims": {"disableAll": True, shim: {"enabled": True, **config}}}


# --- the chart's own defaults ----------------------------------------------------------

GO_UNDER_ACCOUNTED = {
    # shim: kata-deploy's podFixed.memory [kd-values] vs the shipped default_memory 2048 MiB.
    "clh": "130Mi", "clh-azure": "130Mi", "fc": "130Mi", "qemu": "320Mi", "qemu-coco-dev": "160Mi",
    "qemu-nvidia-cpu": "320Mi", "qemu-se": "1Gi", "qemu-snp": "2Gi", "qemu-tdx": "2Gi",
}
RUST_NO_LIMITS_UNDER_ACCOUNTED = {
    "clh-runtime-rs", "clh-azure-runtime-rs", "dragonball", "openvmm-azure-runtime-rs", "qemu-runtime-rs",
    "qemu-coco-dev-runtime-rs", "qemu-nvidia-cpu-runtime-rs", "qemu-se-runtime-rs", "qemu-snp-runtime-rs",
    "qemu-tdx-runtime-rs",
}
NVIDIA_GPU = {
    "qemu-nvidia-gpu", "qemu-nvidia-gpu-runtime-rs", "qemu-nvidia-gpu-snp", "qemu-nvidia-gpu-snp-runtime-rs",
    "qemu-nvidia-gpu-tdx", "qemu-nvidia-gpu-tdx-runtime-rs",
}


def test_chart_defaults_every_enabled_shim_is_checked_and_remote_is_not() -> None:
    report = audit_values(_load(CHART_DEFAULTS), [])
    names = {c.name for c in report.checked}
    assert "kata-remote" not in names
    assert len(names) == 25
    assert names == {f"kata-{s}" for s in _load(CHART_DEFAULTS)["shims"] if s not in ("disableAll", "remote")}
    # Shims that set no overhead get the chart's built-in podFixed table.
    qemu = next(c for c in report.checked if c.name == "kata-qemu")
    assert (qemu.pod_fixed_memory_bytes, qemu.pod_fixed_cpu) == (320 * MIB, Decimal("0.25"))
    assert kata_of(qemu).default_memory_mib == defaults.SHIPPED_DEFAULT_MEMORY_MIB


def test_chart_defaults_go_shims_are_under_accounted() -> None:
    report = audit_values(_load(CHART_DEFAULTS), [])
    errors = {(f.runtime_class, f.rule) for f in report.errors}
    assert errors == {(f"kata-{shim}", Rule.GO_POD_FIXED_MEMORY) for shim in GO_UNDER_ACCOUNTED}
    for shim, memory in GO_UNDER_ACCOUNTED.items():
        f = _finding(report, f"kata-{shim}", Rule.GO_POD_FIXED_MEMORY)
        assert (f.value, f.bound) == (f"podFixed.memory {memory}", "default_memory 2048 MiB")


def test_chart_defaults_qemu_finding_reads_as_domain_says() -> None:
    f = _finding(audit_values(_load(CHART_DEFAULTS), []), "kata-qemu", Rule.GO_POD_FIXED_MEMORY)
    assert f.severity == Severity.ERROR and f.handler == "kata-qemu"
    assert "320Mi must be above default_memory 2Gi" in f.message
    assert "set shims.qemu.runtimeClass.overhead.memory to 2098Mi (default_memory 2048 MiB + 50 MiB host)" in f.fix
    # The other way out: shrink the guest budget to what podFixed pays for.
    assert "add to shims.qemu.dropIn under [hypervisor.qemu]: default_memory = 270" in f.fix


def test_chart_defaults_small_pod_fixed_never_suggests_a_guest_below_the_fallback() -> None:
    f = _finding(audit_values(_load(CHART_DEFAULTS), []), "kata-clh", Rule.GO_POD_FIXED_MEMORY)
    assert "default_memory = 80" not in f.fix
    assert "default_memory = 256 ([survey] fallback)" in f.fix and "306Mi" in f.fix


def test_chart_defaults_runtime_rs_warnings_and_no_errors() -> None:
    report = audit_values(_load(CHART_DEFAULTS), [])
    warned = {f.runtime_class for f in report.warnings if f.rule == Rule.NO_LIMITS_UNDER_ACCOUNTED}
    assert warned == {f"kata-{s}" for s in RUST_NO_LIMITS_UNDER_ACCOUNTED}
    rust = {c.name for c in report.checked if c.runtime is Runtime.RUST}
    assert not [f for f in report.errors if f.runtime_class in rust]


def test_chart_defaults_qemu_runtime_rs_is_sound_but_for_pods_without_limits() -> None:
    report = audit_values(_load(CHART_DEFAULTS), [])
    # 320Mi > 32 MiB overhead_memory and 250m > 0.2 overhead_vcpus: no error.
    assert _by_class(report)["kata-qemu-runtime-rs"] == {
        (Severity.WARNING, Rule.NO_LIMITS_UNDER_ACCOUNTED),
        (Severity.WARNING, Rule.SANDBOX_CGROUP_ONLY),
    }
    f = _finding(report, "kata-qemu-runtime-rs", Rule.NO_LIMITS_UNDER_ACCOUNTED)
    assert f.bound == "default_memory 2048 MiB + 50 MiB host"
    assert "pods without limits" in f.message and "under-accounted" in f.message
    assert "add to shims.qemu-runtime-rs.dropIn under [hypervisor.qemu]: default_memory = 270" in f.fix


def test_chart_defaults_sandbox_cgroup_only_is_a_warning_except_on_nvidia() -> None:
    report = audit_values(_load(CHART_DEFAULTS), [])
    flagged = {f.runtime_class for f in report.findings if f.rule == Rule.SANDBOX_CGROUP_ONLY}
    assert {f.severity for f in report.findings if f.rule == Rule.SANDBOX_CGROUP_ONLY} == {Severity.WARNING}
    nvidia = {c.name for c in report.checked if "nvidia" in c.shim}
    assert flagged == {c.name for c in report.checked} - nvidia


def test_chart_defaults_nvidia_gpu_classes_are_not_flagged() -> None:
    found = _by_class(audit_values(_load(CHART_DEFAULTS), []))
    for shim in NVIDIA_GPU:
        assert found[f"kata-{shim}"] == set(), shim


# --- values with known mistakes --------------------------------------------------------


def test_mistakes_each_class_gets_exactly_its_finding() -> None:
    report = audit_values(_load(MISTAKES), [])
    assert _by_class(report) == {
        "kata-qemu-runtime-rs": set(),
        "kata-clh-runtime-rs": {(Severity.ERROR, Rule.DROP_IN_INVALID)},
        "kata-qemu-snp": {(Severity.ERROR, Rule.OVERHEAD_DISABLED)},
        "kata-big-overhead": {(Severity.ERROR, Rule.RUST_POD_FIXED_MEMORY)},
        "kata-inherited": set(),
        "kata-not-inherited": {(Severity.ERROR, Rule.RUST_POD_FIXED_CPU)},
        "kata-zero": {(Severity.ERROR, Rule.SANDBOX_MEMORY_ZERO)},
    }


def test_disable_all_leaves_only_explicitly_enabled_shims() -> None:
    names = {c.name for c in audit_values(_load(MISTAKES), []).checked if c.source == "shim"}
    assert names == {"kata-qemu-runtime-rs", "kata-clh-runtime-rs", "kata-qemu-snp"}


def test_custom_runtime_below_its_overhead_memory() -> None:
    f = _finding(audit_values(_load(MISTAKES), []), "kata-big-overhead", Rule.RUST_POD_FIXED_MEMORY)
    assert (f.value, f.bound) == ("podFixed.memory 384Mi", "overhead_memory 512 MiB")
    assert f.fix == ("set overhead.podFixed.memory in customRuntimes.runtimes.big-overhead.runtimeClass "
                     "to 562Mi (overhead_memory 512 MiB + 50 MiB host)")


def test_inherit_base_overhead_merges_the_base_shims_default_under_the_given_one() -> None:
    checked = {c.name: c for c in audit_values(_load(MISTAKES), []).checked}
    inherited, alone = checked["kata-inherited"], checked["kata-not-inherited"]
    assert (inherited.pod_fixed_memory_bytes, inherited.pod_fixed_cpu) == (320 * MIB, Decimal("0.25"))
    assert (alone.pod_fixed_memory_bytes, alone.pod_fixed_cpu) == (320 * MIB, None)
    assert kata_of(inherited).overhead_memory_mib == 256 and kata_of(inherited).from_drop_in >= {"overhead_memory"}


def test_shim_overhead_override_is_merged_per_key_over_the_chart_table() -> None:
    checked = {c.name: c for c in audit_values(_load(MISTAKES), []).checked}
    qemu_rs = checked["kata-qemu-runtime-rs"]
    assert (qemu_rs.pod_fixed_memory_bytes, qemu_rs.pod_fixed_cpu) == (400 * MIB, Decimal("0.25"))


def test_overhead_disabled_per_shim_and_globally() -> None:
    f = _finding(audit_values(_load(MISTAKES), []), "kata-qemu-snp", Rule.OVERHEAD_DISABLED)
    assert "Kubernetes accounts nothing for the VM" in f.message
    assert "shims.qemu-snp.runtimeClass.overheadEnabled" in f.fix
    values = {**_one_shim("qemu-runtime-rs"), "runtimeClasses": {"overheadEnabled": False}}
    assert {f.rule for f in audit_values(values, []).errors} == {Rule.OVERHEAD_DISABLED}
    # A per-shim true wins over the global false, as in the chart's template.
    values["shims"]["qemu-runtime-rs"]["runtimeClass"] = {"overheadEnabled": True}
    assert Rule.OVERHEAD_DISABLED not in {f.rule for f in audit_values(values, []).findings}


def test_malformed_drop_in_is_a_finding_with_the_toml_error() -> None:
    report = audit_values(_load(MISTAKES), [])
    f = _finding(report, "kata-clh-runtime-rs", Rule.DROP_IN_INVALID)
    assert "line 1" in f.message and "shims.clh-runtime-rs.dropIn" in f.message
    assert next(c for c in report.checked if c.name == "kata-clh-runtime-rs").kata is None


@pytest.mark.parametrize("drop_in, key", [
    ("[hypervisor.qemu]\ndefault_memory = \"2048\"\n", "default_memory"),
    ("[hypervisor.qemu]\ndefault_memory = -1\n", "default_memory"),
    ("[hypervisor.qemu]\noverhead_vcpus = nan\n", "overhead_vcpus"),
    ("[hypervisor.qemu]\noverhead_vcpus = inf\n", "overhead_vcpus"),
    ("[runtime]\nsandbox_cgroup_only = \"yes\"\n", "sandbox_cgroup_only"),
])
def test_drop_in_values_of_the_wrong_type(drop_in: str, key: str) -> None:
    report = audit_values(_one_shim("qemu-runtime-rs", dropIn=drop_in), [])
    bad = [f for f in report.errors if f.rule == Rule.DROP_IN_INVALID]
    assert len(bad) == 1 and bad[0].bound == key


def test_drop_in_not_a_string() -> None:
    report = audit_values(_one_shim("qemu", dropIn={"default_memory": 256}), [])
    assert [f.rule for f in report.errors] == [Rule.DROP_IN_INVALID]


def test_sandbox_memory_zero_uses_katas_wording() -> None:
    f = _finding(audit_values(_load(MISTAKES), []), "kata-zero", Rule.SANDBOX_MEMORY_ZERO)
    assert f.message.startswith(
        "computed sandbox memory is 0 MiB for hypervisor qemu; set a non-zero memory limit or "
        "configure non-zero default_memory/overhead_memory")


def test_a_hypervisor_table_the_shim_does_not_read_is_an_error_and_its_keys_are_not_used() -> None:
    drop_in = "[hypervisor.clh]\ndefault_memory = 256\n[runtime]\nsandbox_cgroup_only = true\n"
    report = audit_values(_one_shim("qemu", dropIn=drop_in, runtimeClass={"overhead": {"memory": "306Mi"}}), [])
    # The qemu shim sizes its VM from [hypervisor.qemu]: the shipped 2048 MiB stays.
    assert kata_of(report.checked[0]).default_memory_mib == defaults.SHIPPED_DEFAULT_MEMORY_MIB
    assert {(f.severity, f.rule) for f in report.findings} == {
        (Severity.ERROR, Rule.HYPERVISOR_SECTION_IGNORED), (Severity.ERROR, Rule.GO_POD_FIXED_MEMORY),
    }
    f = _finding(report, "kata-qemu", Rule.HYPERVISOR_SECTION_IGNORED)
    assert "[hypervisor.clh]" in f.message and "shims.qemu.dropIn" in f.message
    assert f.fix == "move the keys under [hypervisor.qemu] in shims.qemu.dropIn"


def test_go_default_memory_below_the_runtimes_minimum_is_replaced_by_2048() -> None:
    values = _one_shim("qemu", dropIn=_drop_in(default_memory=200, sandbox_cgroup_only=True),
                       runtimeClass={"overhead": {"memory": "250Mi"}})
    report = audit_values(values, [])
    assert kata_of(report.checked[0]).default_memory_mib == 200
    assert kata_of(report.checked[0]).effective_default_memory_mib == defaults.SHIPPED_DEFAULT_MEMORY_MIB
    # The same severity as `validate` gives it: one rule set.
    assert {(f.severity, f.rule) for f in report.findings} == {
        (Severity.ERROR, Rule.GO_DEFAULT_MEMORY_IGNORED), (Severity.ERROR, Rule.GO_POD_FIXED_MEMORY),
    }


def test_go_pod_fixed_above_default_memory_but_without_the_host_side() -> None:
    values = _one_shim("qemu", dropIn=_drop_in(default_memory=256, sandbox_cgroup_only=True),
                       runtimeClass={"overhead": {"memory": "280Mi"}})
    report = audit_values(values, [])
    assert [(f.severity, f.rule) for f in report.findings] == [(Severity.WARNING, Rule.GO_HOST_UNCOVERED)]
    assert "306Mi" in report.findings[0].fix


def test_go_overhead_keys_are_ignored_with_a_note() -> None:
    values = _one_shim("qemu", dropIn=_drop_in(default_memory=256, overhead_memory=900, sandbox_cgroup_only=True),
                       runtimeClass={"overhead": {"memory": "306Mi"}})
    report = audit_values(values, [])
    assert report.findings == [] and kata_of(report.checked[0]).overhead_memory_mib is None
    assert any("Go runtime" in n for n in report.notes)


def test_runtime_rs_without_static_sizing_is_checked_with_the_default_memory_rule() -> None:
    values = _one_shim("qemu-runtime-rs", dropIn=_drop_in(static_sandbox_resource_mgmt=False, sandbox_cgroup_only=True))
    report = audit_values(values, [])
    assert [f.rule for f in report.findings] == [Rule.GO_POD_FIXED_MEMORY]
    assert any("static_sandbox_resource_mgmt is false" in n for n in report.notes)


def test_invalid_overhead_quantity() -> None:
    report = audit_values(_one_shim("qemu", runtimeClass={"overhead": {"memory": "lots"}}), [])
    assert Rule.OVERHEAD_INVALID in {f.rule for f in report.errors}
    report = audit_values(_one_shim("qemu", runtimeClass={"overhead": "320Mi"}), [])
    assert Rule.OVERHEAD_INVALID in {f.rule for f in report.errors}


def test_multi_install_suffix_and_default_runtime_class() -> None:
    values = {**_one_shim("qemu-runtime-rs"), "env": {"multiInstallSuffix": "blue"},
              "runtimeClasses": {"createDefault": True}, "defaultShim": {"amd64": "qemu-runtime-rs"}}
    # The chart skips the default RuntimeClass when a suffix is set.
    assert [(c.name, c.handler) for c in audit_values(values, []).checked] == [
        ("kata-qemu-runtime-rs-blue", "kata-qemu-runtime-rs-blue")]
    values["env"] = {}
    assert [(c.name, c.handler) for c in audit_values(values, []).checked] == [
        ("kata-qemu-runtime-rs", "kata-qemu-runtime-rs"), ("kata", "kata-qemu-runtime-rs")]


def test_remote_and_unknown_shims_are_skipped_with_a_note() -> None:
    values = {"shims": {"disableAll": True, "remote": {"enabled": True}, "acme": {"enabled": True}}}
    report = audit_values(values, [])
    assert report.checked == [] and report.findings == []
    assert any("remote" in n and "out of scope" in n for n in report.notes)
    assert any("acme" in n for n in report.notes)


def test_custom_runtime_with_a_quoted_handler() -> None:
    rc = ('kind: RuntimeClass\napiVersion: node.k8s.io/v1\nmetadata:\n  name: kata-q\nhandler: "kata-q"\n'
          'overhead:\n  podFixed:\n    memory: 400Mi\n    cpu: 250m\n')
    values = {"customRuntimes": {"enabled": True, "runtimes": {"q": {
        "baseConfig": "qemu-runtime-rs", "runtimeClass": rc,
        "dropIn": _drop_in(default_memory=256, sandbox_cgroup_only=True)}}}}
    report = audit_values(values, [])
    assert [(f.rule, f.value) for f in report.errors] == [(Rule.RUNTIME_CLASS_INVALID, 'handler: "kata-q"')]


@pytest.mark.parametrize("runtime, note", [
    ({"baseConfig": "qemu"}, "no runtimeClass"),
    ({"runtimeClass": "handler: x\n"}, "no baseConfig"),
    ({"baseConfig": "remote", "runtimeClass": "handler: x\n"}, "out of scope"),
    ({"baseConfig": "acme", "runtimeClass": "handler: x\n"}, "not a shim kata-sizing knows"),
])
def test_custom_runtimes_that_cannot_be_audited_are_noted(runtime: dict, note: str) -> None:
    report = audit_values({"customRuntimes": {"enabled": True, "runtimes": {"r": runtime}}}, [])
    assert report.checked == [] and any(note in n for n in report.notes)


@pytest.mark.parametrize("text", ["handler: [\n", "just a string\n", "kind: RuntimeClass\nmetadata: {}\n"])
def test_custom_runtime_with_a_broken_runtime_class_string(text: str) -> None:
    values = {"customRuntimes": {"enabled": True, "runtimes": {"r": {"baseConfig": "qemu", "runtimeClass": text}}}}
    assert [f.rule for f in audit_values(values, []).errors] == [Rule.RUNTIME_CLASS_INVALID]


def test_custom_runtimes_not_enabled_are_not_audited() -> None:
    values = _load(MISTAKES)
    values["customRuntimes"]["enabled"] = False
    report = audit_values(values, [])
    assert not [c for c in report.checked if c.source == "custom-runtime"]
    assert any("customRuntimes.enabled" in n for n in report.notes)


# --- a good values file ----------------------------------------------------------------


def _rendered_values(example: str) -> dict:
    policy = load_policies(str(EXAMPLES / example))[0]
    return yaml.safe_load(render_policy(policy).values_yaml)


def test_values_rendered_by_kata_sizing_pass() -> None:
    report = audit_values(_rendered_values("qemu-runtime-rs.yaml"), [])
    assert report.findings == []
    assert [c.name for c in report.checked] == [f"kata-qemu-rs-{c}" for c in ("s", "m", "l", "xl")]
    assert all(c.source == "custom-runtime" and kata_of(c).sandbox_cgroup_only for c in report.checked)


def test_cli_good_values_exit_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(_rendered_values("qemu-runtime-rs.yaml")))
    assert main(["audit", str(path), "--strict"]) == 0
    out = capsys.readouterr().out
    assert "4 runtime classes checked: 0 errors, 0 warnings" in out


# --- live RuntimeClasses ---------------------------------------------------------------


def test_runtime_classes_from_a_list_and_single_documents() -> None:
    assert [rc["metadata"]["name"] for rc in _live()] == ["kata-qemu", "runc", "kata-fc", "kata-snp-large"]
    with pytest.raises(AuditError):
        runtime_classes_from_documents(["not a mapping"])
    with pytest.raises(AuditError):
        runtime_classes_from_documents([{"kind": "List", "items": "nope"}])


def test_live_runtime_class_wins_over_the_values() -> None:
    report = audit_values(_load(CHART_DEFAULTS), _live())
    found = _by_class(report)
    # kata-qemu was raised to 2098Mi in the cluster: no longer under-accounted.
    assert found["kata-qemu"] == {(Severity.WARNING, Rule.SANDBOX_CGROUP_ONLY)}
    qemu = [c for c in report.checked if c.handler == "kata-qemu"]
    assert [(c.source, c.pod_fixed_memory_bytes) for c in qemu] == [("runtime-class", 2098 * MIB)]
    # The fix still points at the values, since the chart owns the object.
    assert any("kata-qemu" in n and "live object is what Kubernetes uses" in n for n in report.notes)
    # kata-fc lost its overhead in the cluster.
    assert (Severity.ERROR, Rule.OVERHEAD_DISABLED) in found["kata-fc"]
    # A second RuntimeClass on a values handler replaces the values' own.
    assert "kata-qemu-snp-runtime-rs" not in found
    assert found["kata-snp-large"] == {(Severity.WARNING, Rule.SANDBOX_CGROUP_ONLY)}
    assert "runc" not in found and any("runc" in n for n in report.notes)


def test_live_runtime_class_not_in_the_values_is_checked_against_its_shim() -> None:
    report = audit_values(_load(MISTAKES), _live())
    qemu = next(c for c in report.checked if c.name == "kata-qemu")
    assert (qemu.shim, qemu.source, qemu.values_path) == ("qemu", "runtime-class", None)
    assert any("kata-qemu" in n and "not described by the values" in n for n in report.notes)
    f = _finding(report, "kata-fc", Rule.OVERHEAD_DISABLED)
    assert "RuntimeClass kata-fc" in f.fix


def test_live_runtime_class_with_a_custom_handler_from_the_values() -> None:
    live = [{"kind": "RuntimeClass", "metadata": {"name": "kata-big-overhead"}, "handler": "kata-big-overhead",
             "overhead": {"podFixed": {"memory": "600Mi", "cpu": "500m"}}}]
    report = audit_values(_load(MISTAKES), live)
    assert _by_class(report)["kata-big-overhead"] == set()


def test_runtime_classes_disabled_in_the_chart_are_audited_only_through_live_objects() -> None:
    values = {**_one_shim("qemu"), "runtimeClasses": {"enabled": False}}
    assert audit_values(values, []).checked == []
    live = [{"kind": "RuntimeClass", "metadata": {"name": "mine"}, "handler": "kata-qemu",
             "overhead": {"podFixed": {"memory": "320Mi", "cpu": "250m"}}}]
    report = audit_values(values, live)
    assert [(c.name, c.values_path) for c in report.checked] == [("mine", "shims.qemu")]
    assert _finding(report, "mine", Rule.GO_POD_FIXED_MEMORY).fix.startswith(
        "set shims.qemu.runtimeClass.overhead.memory to 2098Mi")


def test_audit_runtime_classes_for_the_operator() -> None:
    live: list[Any] = [  # junk among them on purpose
        {"kind": "RuntimeClass", "metadata": {"name": "kata-qemu"}, "handler": "kata-qemu",
         "overhead": {"podFixed": {"memory": "320Mi", "cpu": "250m"}}},
        {"kind": "RuntimeClass", "metadata": {"name": "kata-qemu-rs-s"}, "handler": "kata-qemu-rs-s"},
        {"kind": "RuntimeClass", "metadata": {"name": "managed"}, "handler": "kata-qemu"},
        {"kind": "RuntimeClass", "metadata": {"name": "runc"}, "handler": "runc"},
        {"kind": "RuntimeClass", "metadata": {"name": "peer"}, "handler": "kata-remote"},
        {"kind": "RuntimeClass", "metadata": {"name": "dbg"}, "handler": "kata-qemu-runtime-rs-debug",
         "overhead": {"podFixed": {"memory": "2098Mi", "cpu": "250m"}}},
        "junk",
    ]
    findings = audit_runtime_classes(live, {"managed"})
    assert {(f.runtime_class, f.rule) for f in findings} == {
        ("kata-qemu", Rule.GO_POD_FIXED_MEMORY), ("kata-qemu", Rule.SANDBOX_CGROUP_ONLY),
        ("dbg", Rule.SANDBOX_CGROUP_ONLY),
    }


# --- robustness ------------------------------------------------------------------------


@pytest.mark.parametrize("values", [
    {},
    {"shims": "junk"},
    {"shims": {"qemu": None, 7: [1], "disableAll": "yes"}},
    {"shims": {"qemu": {"runtimeClass": "junk", "dropIn": 5}}},
    {"shims": {"qemu": {"runtimeClass": {"overhead": {"memory": [1], "cpu": {}}}}}},
    {"customRuntimes": {"enabled": True, "runtimes": ["a"]}},
    {"customRuntimes": {"enabled": True, "runtimes": {"a": None, "b": {"baseConfig": ["qemu"]}}}},
    {"runtimeClasses": "x", "env": [], "defaultShim": 3},
])
def test_junk_values_never_raise(values: dict) -> None:
    junk: list[Any] = [{"kind": "RuntimeClass", "handler": "kata-qemu", "overhead": {"podFixed": 5}}, {"handler": 3}, None]
    report = audit_values(values, junk)
    json.dumps(report.as_dict())


def test_audit_values_refuses_a_non_mapping() -> None:
    with pytest.raises(AuditError):
        audit_values(["shims"], [])  # type: ignore[arg-type]


# --- the CLI -----------------------------------------------------------------------------


def test_cli_reference_defaults_exit_one_with_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(CHART_DEFAULTS)]) == 1
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    qemu = [line for line in lines if line.startswith("error: kata-qemu (handler kata-qemu)")]
    assert len(qemu) == 1 and "[go-pod-fixed-memory]" in qemu[0]
    assert any(line.startswith("RUNTIMECLASS") for line in lines)
    assert lines[-1] == "25 runtime classes checked: 9 errors, 27 warnings"
    assert captured.err.startswith("note: ")


def test_cli_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(MISTAKES), str(LIVE), "-o", "json"]) == 1
    body = json.loads(capsys.readouterr().out)
    assert list(body) == ["summary", "findings", "checked", "notes"]
    assert list(body["findings"][0]) == [
        "runtimeClass", "handler", "severity", "rule", "value", "bound", "message", "fix"]
    assert list(body["checked"][0]) == [
        "name", "handler", "shim", "runtime", "source", "valuesPath", "overheadEnabled", "podFixed", "kata"]
    assert body["summary"] == {"checked": 10, "errors": 6, "warnings": 3}
    qemu_rs = next(c for c in body["checked"] if c["name"] == "kata-qemu-runtime-rs")
    assert qemu_rs["podFixed"] == {"memory": "400Mi", "cpu": "250m"}
    assert qemu_rs["kata"]["overheadMemoryMiB"] == 128 and qemu_rs["kata"]["overheadVcpus"] == "0.2"


def test_cli_warnings_only_exit_zero_unless_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(_one_shim("qemu-runtime-rs")))
    assert main(["audit", str(path)]) == 0
    assert main(["audit", str(path), "--strict"]) == 1
    capsys.readouterr()


@pytest.mark.parametrize("content, message", [
    ("- a\n- b\n", "not a kata-deploy values file"),
    ("shims: [\n", "not valid YAML"),
    ("a: 1\n---\nb: 2\n", "not a kata-deploy values file"),
    ("# nothing\n", "holds no YAML document"),
])
def test_cli_junk_values_exit_two(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                  message: str) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(content)
    assert main(["audit", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_missing_files_and_junk_runtime_classes_exit_two(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(tmp_path / "nope.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["audit", str(CHART_DEFAULTS), str(tmp_path / "nope.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    junk = tmp_path / "rc.yaml"
    junk.write_text("- 1\n- 2\n")
    assert main(["audit", str(CHART_DEFAULTS), str(junk)]) == 2
    err = capsys.readouterr().err
    assert "document 1 is not a mapping" in err and "Traceback" not in err
