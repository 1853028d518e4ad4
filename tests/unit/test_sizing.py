"""The sizing math against docs/sizing-model.md's own numbers."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest

from kata_sizing.core.defaults import Runtime
from kata_sizing.core.model import parse_policy
from kata_sizing.core.quantity import MIB, cpu_cores, memory_bytes
from kata_sizing.core.sizing import (
    SandboxRefused,
    Severity,
    explain_pod,
    guest_budget_mib,
    simulate_go,
    simulate_rust,
    size_policy,
)

# docs/sizing-model.md's worked-example class (runtime-rs).
WORKED_CLASS = {
    "name": "m",
    "cpu": "2",
    "memory": "2Gi",
    "overheadVcpus": "0.5",
    "overheadMemory": "128Mi",
    "defaultVcpus": 2,
    "defaultMemory": "1024Mi",
    "podFixed": {"cpu": "600m", "memory": "160Mi"},
}

# The survey of docs/sizing-model.md (MiB): container limit, VM nominal, free total, free used.
SURVEY = [
    (50, 306, 197, 27),
    (150, 406, 295, 26),
    (500, 756, 640, 30),
    (1024, 1280, 1090, 32),
    (2048, 2304, 1965, 31),
    (4096, 4352, 3716, 47),
]


def _sizing(spec: dict, name: str = "p"):
    return size_policy(parse_policy({"metadata": {"name": name}, "spec": spec}))


def _explain(sizing, class_name: str, cpu: str | None = None, memory: str | None = None) -> dict:
    return explain_pod(
        sizing, class_name,
        cpu_cores(cpu) if cpu is not None else None,
        memory_bytes(memory) if memory is not None else None,
    ).as_dict()


@pytest.fixture
def worked():
    return _sizing({"shim": "qemu-runtime-rs", "classes": [WORKED_CLASS]}, name="measured")


def test_worked_example_limits_on_both(worked):
    assert _explain(worked, "m", cpu="1.5", memory="600Mi") == {
        "class": "m",
        "runtimeClass": "kata-measured-m",
        "vm": {"vcpus": 2, "memoryMiB": 728},
        "accounted": {"cpu": "2100m", "memory": "760Mi"},
        "warnings": [],
    }


def test_worked_example_memory_limit_only(worked):
    result = _explain(worked, "m", memory="512Mi")
    assert result["vm"] == {"vcpus": 1, "memoryMiB": 640}
    assert result["accounted"] == {"cpu": "600m", "memory": "672Mi"}
    assert result["warnings"] == []


def test_worked_example_cpu_limit_only(worked):
    result = _explain(worked, "m", cpu="1.5")
    assert result["vm"] == {"vcpus": 2, "memoryMiB": 128}
    assert result["accounted"] == {"cpu": "2100m", "memory": "160Mi"}
    assert len(result["warnings"]) == 1
    assert result["warnings"][0].startswith("no memory limit: the VM gets only the guest budget (128 MiB)")


def test_worked_example_no_limits_is_under_accounted(worked):
    result = _explain(worked, "m")
    assert result["vm"] == {"vcpus": 2, "memoryMiB": 1024}
    assert result["accounted"] == {"cpu": "600m", "memory": "160Mi"}
    assert any("boots the fallback VM (2 vCPUs, 1024 MiB)" in w for w in result["warnings"])
    assert any("Kubernetes accounts 160Mi but the VM alone is 1024 MiB" in w for w in result["warnings"])


def test_worked_example_class_draws_the_under_accounting_warning(worked):
    assert worked.errors == []
    assert [str(w) for w in worked.warnings] == [
        "spec.classes[0] (m): podFixed.memory 160Mi is below default_memory 1Gi + host memory "
        "50Mi: pods without limits boot a VM of default_memory and are under-accounted"
    ]


def _zero_overhead_class(**extra) -> dict:
    return {
        "name": "z", "cpu": "2", "memory": "2Gi", "overheadVcpus": "0", "overheadMemory": "0",
        "podFixed": {"cpu": "100m", "memory": "64Mi"}, **extra,
    }


def test_zero_overhead_gives_exactly_the_limits():
    sizing = _sizing({"shim": "qemu-runtime-rs", "classes": [_zero_overhead_class()]})
    assert _explain(sizing, "z", cpu="1.5", memory="600Mi")["vm"] == {"vcpus": 2, "memoryMiB": 600}
    # The exact vCPU figure before boot-time rounding is 1.5.
    simulated = simulate_rust(Decimal("1.5"), 600 * MIB, Decimal(0), 0, 1, 256)
    assert simulated.vcpus_exact == Decimal("1.5")
    assert simulated.vm.vcpus == 2


@pytest.mark.parametrize(
    ("memory", "vm_memory_mib"),
    [
        ("600Mi", 600 + 128),
        ("601Mi", 602 + 128),  # odd MiB rounds up to even (2 MiB huge-page alignment)
        ("600.5Mi", 600 + 128),  # truncated to whole MiB first
        ("601.9Mi", 602 + 128),
        ("1Mi", 2 + 128),
        ("0.5Mi", 0 + 128),
        (str(600 * MIB + 1), 600 + 128),
    ],
)
def test_runtime_rs_memory_rounding(worked, memory, vm_memory_mib):
    assert _explain(worked, "m", memory=memory)["vm"]["memoryMiB"] == vm_memory_mib


def test_small_cpu_limit_still_boots_one_vcpu():
    sizing = _sizing({"shim": "qemu-runtime-rs", "classes": [_zero_overhead_class()]})
    assert _explain(sizing, "z", cpu="100m", memory="64Mi")["vm"]["vcpus"] == 1


def test_zero_memory_sandbox_is_refused_with_katas_message():
    sizing = _sizing({"shim": "qemu-runtime-rs", "classes": [_zero_overhead_class()]})
    with pytest.raises(SandboxRefused) as info:
        explain_pod(sizing, "z", Decimal("1.5"), None)
    assert str(info.value) == (
        "computed sandbox memory is 0 MiB for hypervisor qemu; set a non-zero memory limit "
        "or configure non-zero default_memory/overhead_memory"
    )


def test_zero_memory_message_names_the_policys_hypervisor():
    sizing = _sizing({"shim": "dragonball", "classes": [_zero_overhead_class()]})
    with pytest.raises(SandboxRefused, match="0 MiB for hypervisor dragonball;"):
        explain_pod(sizing, "z", Decimal(1), None)


def test_go_runtime_vm_is_default_memory_plus_limits():
    sizing = _sizing({
        "shim": "qemu",
        "fallback": {"cpu": "1"},
        "classes": [{"name": "m", "cpu": "2", "memory": "2Gi", "defaultMemory": "256Mi",
                     "podFixed": {"cpu": "250m", "memory": "320Mi"}}],
    })
    assert sizing.runtime is Runtime.GO
    result = _explain(sizing, "m", cpu="1.5", memory="600Mi")
    assert result["vm"] == {"vcpus": 1 + 2, "memoryMiB": 256 + 600}
    assert result["accounted"] == {"cpu": "1750m", "memory": "920Mi"}
    # No limits: just default_*; Kubernetes accounts podFixed, which covers it in the Go runtime.
    assert _explain(sizing, "m")["vm"] == {"vcpus": 1, "memoryMiB": 256}
    assert simulate_go(Decimal("0.1"), None, 2, 256).vm.vcpus == 3


def test_go_runtime_uses_default_vcpus_given_per_class():
    sizing = _sizing({"shim": "clh", "classes": [{"name": "s", "cpu": "1", "memory": "1Gi", "defaultVcpus": 2}]})
    assert _explain(sizing, "s", cpu="1", memory="1Gi")["vm"]["vcpus"] == 3


def test_computed_default_classes_for_qemu_runtime_rs():
    # guest budget G = (96 + 0.14 L) / 0.86 x 1.10, rounded up to even MiB (docs/sizing-model.md,
    # the overhead function with the standard-family defaults); podFixed = max(G, 256) + 50, 0.2 + 0.05.
    sizing = _sizing({"shim": "qemu-runtime-rs"}, name="qemu-rs")
    assert sizing.problems == ()
    table = {
        c.name: (c.overhead_memory_mib, c.pod_fixed, c.default_memory_mib, c.default_maxmemory_mib,
                 c.largest_vm.vcpus, c.largest_vm.memory_mib, c.runtime_class)
        for c in sizing.classes
    }
    assert table == {
        "s": (308, {"cpu": "250m", "memory": "358Mi"}, 256, 1024 + 308, 2, 1024 + 308, "kata-qemu-rs-s"),
        "m": (858, {"cpu": "250m", "memory": "908Mi"}, 256, 4096 + 858, 3, 4096 + 858, "kata-qemu-rs-m"),
        "l": (3058, {"cpu": "250m", "memory": "3108Mi"}, 256, 16384 + 3058, 5, 16384 + 3058,
              "kata-qemu-rs-l"),
        "xl": (11860, {"cpu": "250m", "memory": "11910Mi"}, 256, 65536 + 11860, 17, 65536 + 11860,
               "kata-qemu-rs-xl"),
    }
    assert all(c.overhead_vcpus == Decimal("0.2") for c in sizing.classes)


def test_rust_pod_fixed_covers_a_fallback_larger_than_the_guest_budget():
    sizing = _sizing({
        "shim": "qemu-runtime-rs",
        "fallback": {"cpu": "1", "memory": "1Gi"},
        "classes": [{"name": "s", "cpu": "1", "memory": "512Mi"}],
    })
    (sized,) = sizing.classes
    assert sized.overhead_memory_mib < 1024
    assert sized.pod_fixed_memory_mib == 1024 + 50
    assert sizing.warnings == []


def _errors(spec: dict) -> list[str]:
    return [str(p) for p in _sizing(spec).errors]


def test_rust_invariant_pod_fixed_memory_above_overhead_memory():
    errors = _errors({"shim": "qemu-runtime-rs", "classes": [{
        "name": "big", "cpu": "2", "memory": "2Gi", "overheadMemory": "256Mi",
        "podFixed": {"cpu": "1", "memory": "256Mi"},
    }]})
    assert errors == [
        "spec.classes[0] (big): podFixed.memory 256Mi must be above overhead_memory 256Mi: "
        "podFixed covers the guest side (overhead_memory) plus the host side"
    ]


def test_rust_invariant_pod_fixed_cpu_above_overhead_vcpus():
    errors = _errors({"shim": "qemu-runtime-rs", "classes": [{
        "name": "s", "cpu": "1", "memory": "1Gi", "overheadVcpus": "0.6",
        "podFixed": {"cpu": "500m", "memory": "2Gi"},
    }]})
    assert errors == [
        "spec.classes[0] (s): podFixed.cpu 500m must be above overhead_vcpus 0.6: "
        "podFixed covers the guest side (overhead_vcpus) plus the host side"
    ]


def test_go_invariant_pod_fixed_memory_above_default_memory():
    errors = _errors({"shim": "qemu", "classes": [{
        "name": "s", "cpu": "1", "memory": "1Gi", "defaultMemory": "512Mi",
        "podFixed": {"cpu": "1", "memory": "500Mi"},
    }]})
    assert errors == [
        "spec.classes[0] (s): podFixed.memory 500Mi must be above default_memory 512Mi: in the "
        "Go runtime default_memory is the guest budget and podFixed must cover it plus the host side "
        "(every pod is under-accounted by about 62Mi)"
    ]


def test_every_violated_rule_of_every_class_is_listed():
    spec = {"shim": "qemu-runtime-rs", "classes": [
        {"name": "s", "cpu": "1", "memory": "1Gi", "overheadVcpus": "1", "overheadMemory": "512Mi",
         "podFixed": {"cpu": "1", "memory": "100Mi"}},
        {"name": "m", "cpu": "2", "memory": "2Gi", "overheadMemory": "1Gi",
         "podFixed": {"cpu": "1", "memory": "1Gi"}},
    ]}
    errors = _errors(spec)
    assert [e.split(":")[0] for e in errors] == ["spec.classes[0] (s)", "spec.classes[0] (s)", "spec.classes[1] (m)"]
    assert "overhead_memory 512Mi" in errors[0]
    assert "overhead_vcpus 1" in errors[1]
    assert "podFixed.memory 1Gi must be above overhead_memory 1Gi" in errors[2]


@pytest.mark.parametrize(("pod_fixed_memory", "warned"), [("1073Mi", True), ("1074Mi", False)])
def test_rust_warning_boundary_pod_fixed_below_default_memory_plus_host(pod_fixed_memory, warned):
    sizing = _sizing({"shim": "qemu-runtime-rs", "classes": [{
        "name": "s", "cpu": "1", "memory": "1Gi", "defaultMemory": "1Gi",
        "podFixed": {"cpu": "1", "memory": pod_fixed_memory},
    }]})
    assert sizing.errors == []
    assert [p.severity for p in sizing.warnings] == ([Severity.WARNING] if warned else [])
    if warned:
        assert str(sizing.warnings[0]).startswith(
            "spec.classes[0] (s): podFixed.memory 1073Mi is below default_memory 1Gi + host memory 50Mi")


def test_computed_values_never_break_an_invariant_across_shims():
    for shim in ("qemu-runtime-rs", "qemu-snp-runtime-rs", "qemu-se-runtime-rs", "qemu-nvidia-gpu-runtime-rs",
                 "qemu", "clh", "fc", "qemu-tdx", "qemu-nvidia-cpu"):
        assert _sizing({"shim": shim}).problems == (), shim


# --- docs/sizing-model.md: the survey and the guest budget ---------------------------------

SURVEY_FUNCTION = {"guestMemoryBase": "96Mi", "guestMemoryRatio": "0.14", "margin": "0"}


def _unusable_mib(vm_mib: int) -> Fraction:
    return 96 + Fraction(14, 100) * vm_mib


@pytest.mark.parametrize(
    ("limit_mib", "budget_mib", "default_memory_mib"),
    # Worked by hand: G = (96 + 0.14 L) / 0.86, rounded up to an even MiB; the Go runtime
    # replaces a default_memory below 256 MiB with 2048 MiB, so G is raised to 256 there.
    [(50, 120, 256), (150, 138, 256), (500, 194, 256), (1024, 280, 280), (2048, 446, 446), (4096, 780, 780)],
)
def test_go_guest_budget_from_the_survey_function(limit_mib, budget_mib, default_memory_mib):
    assert guest_budget_mib(96, Decimal("0.14"), limit_mib, Decimal(0)) == budget_mib
    sizing = _sizing({
        "shim": "clh",
        "runtime": "Go",
        "overhead": {**SURVEY_FUNCTION, "hostMemory": "50Mi"},
        "classes": [{"name": "s", "cpu": "1", "memory": f"{limit_mib}Mi"}],
    })
    assert sizing.problems == ()
    (sized,) = sizing.classes
    assert sized.default_memory_mib == default_memory_mib
    assert sized.pod_fixed_memory_mib == default_memory_mib + 50
    vm_mib = _explain(sizing, "s", cpu="1", memory=f"{limit_mib}Mi")["vm"]["memoryMiB"]
    assert vm_mib == limit_mib + default_memory_mib
    # The guest keeps at most default_memory, so the whole container limit stays usable.
    assert _unusable_mib(vm_mib) <= default_memory_mib
    if default_memory_mib == budget_mib:
        # The budget is tight: 2 MiB less would not be enough.
        assert _unusable_mib(vm_mib - 2) > budget_mib - 2
    survey_vms = {nominal: total - used for _limit, nominal, total, used in SURVEY}
    if vm_mib in survey_vms:
        # This VM is the survey's own (default_memory 256): its measured usable memory holds the limit.
        assert survey_vms[vm_mib] >= limit_mib


def test_go_default_memory_below_256_mib_is_an_error():
    # Kata's Go runtime (katautils defaultMemSz, MinHypervisorMemory) would boot 2048 MiB instead.
    errors = _errors({"shim": "qemu", "classes": [{
        "name": "s", "cpu": "1", "memory": "1Gi", "defaultMemory": "192Mi",
        "podFixed": {"cpu": "1", "memory": "320Mi"},
    }]})
    assert errors[0] == (
        "spec.classes[0] (s): default_memory 192Mi is below 256Mi: the Go runtime replaces it with "
        "its built-in 2048 MiB, so every VM of this class is 2048 MiB plus the limits")
    # ... and podFixed is then checked against what the runtime really boots.
    assert errors[1].startswith("spec.classes[0] (s): podFixed.memory 320Mi must be above default_memory 2Gi")
    assert len(errors) == 2


@pytest.mark.parametrize(("limit_mib", "nominal_mib", "free_total_mib", "free_used_mib"), SURVEY)
def test_survey_function_covers_every_measured_vm(limit_mib, nominal_mib, free_total_mib, free_used_mib):
    # What the workload could not use in the survey's VM: what the kernel kept plus the daemons.
    measured_unusable = nominal_mib - free_total_mib + free_used_mib
    assert _unusable_mib(nominal_mib) >= measured_unusable


def test_budget_grows_where_the_surveys_fixed_256_mib_starved_the_container():
    budgets = {}
    for limit_mib, _nominal_mib, free_total_mib, free_used_mib in SURVEY:
        budget = _sizing({
            "shim": "clh", "overhead": SURVEY_FUNCTION,
            "classes": [{"name": "s", "cpu": "1", "memory": f"{limit_mib}Mi"}],
        }).classes[0].default_memory_mib
        starved = free_total_mib - free_used_mib < limit_mib
        budgets[limit_mib] = (budget, starved)
    # The survey VMs had default_memory 256: the 2 GiB and 4 GiB containers could not use
    # their whole limit there, and exactly for those the computed budget exceeds 256 MiB
    # (by more than the shortfall: 1934 usable of 2048, 3669 of 4096).
    assert {limit for limit, (_, starved) in budgets.items() if starved} == {2048, 4096}
    assert budgets[2048][0] - 256 >= 2048 - (1965 - 31)
    assert budgets[4096][0] - 256 >= 4096 - (3716 - 47)


def test_samples_in_the_policy_are_fitted_into_the_overhead_function():
    samples = [
        {"containerLimitMib": limit, "vmNominalMib": nominal, "freeTotalMib": total, "freeUsedMib": used}
        for limit, nominal, total, used in SURVEY
    ]
    sizing = _sizing({
        "shim": "clh", "overhead": {"samples": samples, "margin": "0"},
        "classes": [{"name": "s", "cpu": "1", "memory": "4Gi"}],
    })
    fn = sizing.overhead
    assert fn.fitted is True
    for _limit, nominal, total, used in SURVEY:
        assert fn.guest_memory_base_mib + fn.guest_memory_ratio * nominal >= nominal - total + used
    assert sizing.problems == ()


def test_explain_warns_about_pods_above_the_class_envelope(worked):
    warnings = _explain(worked, "m", cpu="3", memory="3Gi")["warnings"]
    assert any("CPU limit 3 is above class m's envelope 2; use a larger class" in w for w in warnings)
    assert any("memory limit 3Gi is above class m's envelope 2Gi" in w for w in warnings)


def test_explain_of_an_unknown_class_names_the_known_ones(worked):
    with pytest.raises(KeyError, match=r"no class 'xxl' in policy measured \(classes: m\)"):
        explain_pod(worked, "xxl", None, None)


def test_go_largest_vm_adds_an_odd_envelope_as_it_is():
    sizing = _sizing({"shim": "clh", "classes": [{"name": "s", "cpu": "1", "memory": "511Mi"}]})
    (sized,) = sizing.classes
    vm = _explain(sizing, "s", cpu="1", memory="511Mi")["vm"]
    assert vm == {"vcpus": sized.largest_vm.vcpus, "memoryMiB": sized.largest_vm.memory_mib}
    assert sized.largest_vm.memory_mib == sized.default_memory_mib + 511
