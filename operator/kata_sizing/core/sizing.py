"""The sizing math: pure functions from a validated policy to per-class Kata settings.

docs/sizing-model.md (the two runtimes' rules and the guest budget formula).
No I/O; everything exact (int MiB, Decimal cores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING

from . import defaults
from .defaults import MAX_GUEST_MEMORY_RATIO as MAX_RATIO
from .defaults import Runtime
from .model import Admission, KataSizingPolicy, KataSizingPolicySpec, SizeClass
from .quantity import MIB, cpu_cores, format_cpu, format_memory, format_mib, memory_bytes, mib_ceil
from .rules import (  # noqa: F401  (Problem and Severity are re-exported for the other modules)
    HostOverhead,
    KataConfig,
    PodFixed,
    Problem,
    Rule,
    Severity,
    Where,
    check_class,
    check_shim,
    read_drop_in,
    sandbox_zero_message,
)

if TYPE_CHECKING:
    from .calibrate import Fit


# The guest budget formula (docs/sizing-model.md); its one home.
def guest_budget_mib(
    base_mib: int | Decimal,
    ratio: Decimal,
    largest_limit_mib: int | Decimal,
    margin: Decimal,
) -> int:
    """The guest budget G for pods with memory limits up to L, in even MiB.

    In a VM of L + G the guest loses base + ratio * (L + G); L stays usable when
    G >= (base + ratio * L) / (1 - ratio). The margin multiplies that, and the result is
    rounded up to an even MiB because the runtime aligns VM memory to 2 MiB.
    """
    values = {
        "base_mib": base_mib,
        "ratio": ratio,
        "largest_limit_mib": largest_limit_mib,
        "margin": margin,
    }
    for name, value in values.items():
        # A float here would make the budget depend on binary rounding of e.g. 0.14.
        if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
            raise TypeError(f"{name} must be an int or Decimal, not {value!r}")
        if value < 0:
            raise ValueError(f"{name} {value} is negative")
    exact_ratio = Fraction(ratio)
    if exact_ratio >= MAX_RATIO:
        raise ValueError(f"ratio {ratio} is not below {Decimal(MAX_RATIO.numerator) / Decimal(MAX_RATIO.denominator)}")
    needed = (Fraction(base_mib) + exact_ratio * Fraction(largest_limit_mib)) / (1 - exact_ratio)
    with_margin = needed * (1 + Fraction(margin))
    return 2 * math.ceil(with_margin / 2)


@dataclass(frozen=True)
class OverheadFunction(defaults.OverheadParameters):
    """The function a policy sizes with: its own fields, a fit of its samples, or defaults."""

    fitted: bool = False


@dataclass(frozen=True)
class Vm:
    vcpus: int
    memory_mib: int


@dataclass(frozen=True)
class ClassSizing:
    name: str
    runtime_class: str
    runtime: Runtime
    envelope_cpu: Decimal
    envelope_memory_mib: int
    guest_budget_mib: int
    overhead_vcpus: Decimal | None  # Rust runtime only
    overhead_memory_mib: int | None  # Rust runtime only
    default_vcpus: int
    default_memory_mib: int
    default_maxmemory_mib: int
    pod_fixed_cpu: Decimal
    pod_fixed_memory_mib: int
    largest_vm: Vm
    explicit: frozenset[str] = field(default_factory=frozenset)
    envelope_memory_bytes: int = 0
    # The drop-in as Kata reads it back; every number above that Kata reads comes from it.
    kata: KataConfig | None = None

    @property
    def kata_config(self) -> KataConfig:
        """The drop-in as Kata reads it back (known once the class is rendered)."""
        if self.kata is None:
            raise ValueError(f"class {self.name} has not been read back from its drop-in")
        return self.kata

    @property
    def pod_fixed(self) -> dict[str, str]:
        return {"cpu": format_cpu(self.pod_fixed_cpu), "memory": format_mib(self.pod_fixed_memory_mib)}


@dataclass(frozen=True)
class PolicySizing:
    policy: KataSizingPolicy
    runtime: Runtime
    hypervisor: str
    overhead: OverheadFunction
    classes: tuple[ClassSizing, ...]
    problems: tuple[Problem, ...]

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == Severity.ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == Severity.WARNING]

    def class_named(self, name: str) -> ClassSizing:
        for sized in self.classes:
            if sized.name == name:
                return sized
        known = ", ".join(c.name for c in self.classes)
        raise KeyError(f"no class {name!r} in policy {self.policy.name} (classes: {known})")


def round_up_even(mib: int) -> int:
    return mib + (mib % 2)


def _fit_samples(spec: KataSizingPolicySpec, margin: Decimal) -> tuple[Fit | None, list[Problem]]:
    rows = spec.overhead.samples
    if not rows:
        return None, []
    # Only a policy with samples needs the fit (and its module: a plain render does not load it).
    from .calibrate import CalibrationError, fit_overhead
    from .calibrate import Sample as SurveySample

    try:
        return fit_overhead(margin=margin, samples=[
            SurveySample(
                container_limit_mib=Decimal(row.container_limit_mib),
                vm_nominal_mib=Decimal(row.vm_nominal_mib),
                free_total_mib=Decimal(row.free_total_mib),
                free_used_mib=Decimal(row.free_used_mib),
                pod_cgroup_memory_current_bytes=row.pod_cgroup_memory_current_bytes,
            )
            for row in rows
        ]), []
    except (CalibrationError, ValueError) as exc:
        problems = getattr(exc, "problems", None) or [str(exc)]
        return None, [Problem(Severity.ERROR, Rule.OVERHEAD_SAMPLES, "spec.overhead.samples", p) for p in problems]


def overhead_function(spec: KataSizingPolicySpec) -> tuple[OverheadFunction, list[Problem]]:
    """The policy's overhead function: its own fields, else a fit of its samples, else the
    shim family's defaults (defaults.py)."""
    family = defaults.OVERHEAD_DEFAULTS[spec.shim_info.family]
    given = spec.overhead
    margin = Decimal(given.margin) if given.margin else family.margin
    fit, problems = _fit_samples(spec, margin)
    base = family.guest_memory_base_mib
    ratio = family.guest_memory_ratio
    host_memory = family.host_memory_mib
    if fit is not None:
        base, ratio = fit.base_mib, fit.ratio
        # The measured host side with the margin (calibrate.Fit.host_with_margin_mib), as calibrate prints it.
        host_memory = fit.host_with_margin_mib or host_memory
    if given.guest_memory_base:
        base = mib_ceil(memory_bytes(given.guest_memory_base))
    if given.guest_memory_ratio:
        ratio = Decimal(given.guest_memory_ratio)
    if given.host_memory:
        host_memory = mib_ceil(memory_bytes(given.host_memory))
    return OverheadFunction(
        guest_memory_base_mib=base,
        guest_memory_ratio=ratio,
        guest_cpu=cpu_cores(given.guest_cpu) if given.guest_cpu else family.guest_cpu,
        host_memory_mib=host_memory,
        host_cpu=cpu_cores(given.host_cpu) if given.host_cpu else family.host_cpu,
        margin=margin,
        fitted=fit is not None,
    ), problems


def _size_class(
    size_class: SizeClass, runtime: Runtime, fn: OverheadFunction, spec: KataSizingPolicySpec, prefix: str
) -> ClassSizing:
    envelope_cpu = cpu_cores(size_class.cpu)
    envelope_bytes = memory_bytes(size_class.memory)
    envelope_mib = round_up_even(envelope_bytes // MIB)
    budget = guest_budget_mib(fn.guest_memory_base_mib, fn.guest_memory_ratio, envelope_mib, fn.margin)
    explicit = {
        name for name in ("overhead_vcpus", "overhead_memory", "default_vcpus", "default_memory", "pod_fixed")
        if getattr(size_class, name) is not None
    }
    fallback_vcpus = int(cpu_cores(spec.fallback.cpu))
    default_vcpus = size_class.default_vcpus or fallback_vcpus

    if runtime is Runtime.RUST:
        overhead_vcpus = (
            Decimal(size_class.overhead_vcpus) if size_class.overhead_vcpus is not None else fn.guest_cpu
        )
        # A computed budget is never 0: Kata refuses a 0 MiB sandbox (a pod with a CPU limit
        # only) and the guest always keeps some memory; 2 MiB is the runtime's alignment.
        overhead_memory = (
            mib_ceil(memory_bytes(size_class.overhead_memory))
            if size_class.overhead_memory is not None else max(budget, 2)
        )
        default_memory = (
            mib_ceil(memory_bytes(size_class.default_memory))
            if size_class.default_memory is not None
            else mib_ceil(memory_bytes(spec.fallback.memory))
        )
        pod_fixed_cpu = overhead_vcpus + fn.host_cpu
        pod_fixed_memory = max(overhead_memory, default_memory) + fn.host_memory_mib
        largest = simulate_rust(
            envelope_cpu, envelope_bytes, overhead_vcpus, overhead_memory, default_vcpus, default_memory
        )
        largest_vm = largest.vm if largest.vm else Vm(default_vcpus, default_memory)
        guest_budget = overhead_memory
    else:
        overhead_vcpus = None
        overhead_memory = None
        # A smaller default_memory would be replaced by 2048 MiB in the Go runtime [go-src].
        default_memory = (
            mib_ceil(memory_bytes(size_class.default_memory))
            if size_class.default_memory is not None
            else max(budget, defaults.GO_MIN_DEFAULT_MEMORY_MIB)
        )
        pod_fixed_cpu = fn.guest_cpu + fn.host_cpu
        pod_fixed_memory = default_memory + fn.host_memory_mib
        # The Go runtime adds the limit as it is; only runtime-rs rounds it to even MiB.
        largest_vm = simulate_go(envelope_cpu, envelope_bytes, default_vcpus, default_memory).vm
        guest_budget = default_memory

    if size_class.pod_fixed is not None:
        pod_fixed_cpu = cpu_cores(size_class.pod_fixed.cpu)
        pod_fixed_memory = mib_ceil(memory_bytes(size_class.pod_fixed.memory))

    return ClassSizing(
        name=size_class.name,
        runtime_class=f"{prefix}-{size_class.name}",
        runtime=runtime,
        envelope_cpu=envelope_cpu,
        envelope_memory_mib=envelope_mib,
        guest_budget_mib=guest_budget,
        overhead_vcpus=overhead_vcpus,
        overhead_memory_mib=overhead_memory,
        default_vcpus=default_vcpus,
        default_memory_mib=default_memory,
        # The largest VM of the class; runtime-rs raises it to at least default_memory itself.
        default_maxmemory_mib=max(largest_vm.memory_mib, default_memory),
        pod_fixed_cpu=pod_fixed_cpu,
        pod_fixed_memory_mib=pod_fixed_memory,
        largest_vm=largest_vm,
        explicit=frozenset(explicit),
        envelope_memory_bytes=envelope_bytes,
    )


_DROP_IN_KEYS = {
    Runtime.RUST: ("default_vcpus", "default_memory", "default_maxmemory", "overhead_vcpus", "overhead_memory",
                   "enable_hugepages", "sandbox_cgroup_only", "static_sandbox_resource_mgmt"),
    Runtime.GO: ("default_vcpus", "default_memory", "enable_hugepages", "sandbox_cgroup_only"),
}


def _as_rendered(sized: ClassSizing, spec: KataSizingPolicySpec, hypervisor: str, where: str) -> tuple[
        ClassSizing, tuple[Problem, ...]]:
    """The class as Kata and Kubernetes will read it: its drop-in written to TOML and read
    back, its podFixed formatted as the RuntimeClass carries it and parsed again. Read back by its
    figures alone: another policy's class of the same figures (policies copied per team differ in
    their names) is not read back again."""
    read, problems = _read_back(replace(sized, runtime_class=""), spec.shim_info, spec.hugepages,
                                spec.sandbox_cgroup_only, hypervisor, where)
    return replace(read, runtime_class=sized.runtime_class), problems


# The read-back is two thirds of sizing a policy and the same for a class whose figures did not
# change: the operator sizes every new generation of a policy, and a spec change most often
# changes one class of four (docs/performance.md). Its inputs are frozen values.
@lru_cache(maxsize=512)
def _read_back(sized: ClassSizing, info: defaults.ShimInfo, hugepages: bool, sandbox_cgroup_only: bool,
               hypervisor: str, where: str) -> tuple[ClassSizing, tuple[Problem, ...]]:
    base = replace(KataConfig.shipped(info), runtime=sized.runtime, hypervisor=hypervisor)
    written = replace(
        base,
        default_vcpus=Decimal(sized.default_vcpus),
        default_memory_mib=sized.default_memory_mib,
        default_maxmemory_mib=sized.default_maxmemory_mib,
        overhead_vcpus=sized.overhead_vcpus,
        overhead_memory_mib=sized.overhead_memory_mib,
        enable_hugepages=hugepages,
        sandbox_cgroup_only=sandbox_cgroup_only,
        static_sandbox_resource_mgmt=True if sized.runtime is Runtime.RUST else base.static_sandbox_resource_mgmt,
        from_drop_in=frozenset(_DROP_IN_KEYS[sized.runtime]),
    )
    reading = read_drop_in(written.to_toml(), base, where)
    kata = reading.config or written
    if sized.runtime is Runtime.RUST:
        largest_vm = simulate_rust(
            sized.envelope_cpu, sized.envelope_memory_bytes, kata.overhead_vcpus, kata.overhead_memory_mib,
            sized.default_vcpus, kata.default_memory_mib).vm
    else:
        largest_vm = simulate_go(
            sized.envelope_cpu, sized.envelope_memory_bytes, sized.default_vcpus,
            kata.effective_default_memory_mib).vm
    read = replace(
        sized,
        overhead_vcpus=kata.overhead_vcpus if sized.runtime is Runtime.RUST else None,
        overhead_memory_mib=kata.overhead_memory_mib if sized.runtime is Runtime.RUST else None,
        default_memory_mib=kata.default_memory_mib,
        largest_vm=largest_vm,
        pod_fixed_cpu=cpu_cores(format_cpu(sized.pod_fixed_cpu)),
        pod_fixed_memory_mib=mib_ceil(memory_bytes(format_mib(sized.pod_fixed_memory_mib))),
        kata=kata,
    )
    return read, tuple(reading.problems)


def _policy_where(index: int, name: str) -> Where:
    fields = {
        "default_memory": f"spec.classes[{index}].defaultMemory",
        "overhead_memory": f"spec.classes[{index}].overheadMemory",
    }

    def set_kata(kata: KataConfig, key: str, value: int) -> str:
        if key == "sandbox_cgroup_only":
            return "set spec.sandboxCgroupOnly to true"
        return f"set {fields.get(key, key)} to {format_mib(value)}"

    return Where(
        path=f"spec.classes[{index}] ({name})",
        pod_fixed_field=lambda key: f"spec.classes[{index}].podFixed.{key}",
        set_kata=set_kata,
    )


def admission_of_refused_pods(admission: Admission) -> str:
    """What happens at admission to a pod Kata will refuse (podfit rule pod-sandbox-memory-zero,
    in the envelope policy, with its action): docs/rules.md says why it is refused there."""
    if not admission.enabled:
        return ("spec.admission.enabled is false, so such pods are admitted and then fail to start; enable "
                "admission to have them refused")
    if admission.envelope_exceeded != "Deny":
        return (f"spec.admission.envelopeExceeded is {admission.envelope_exceeded}, so such pods are admitted "
                "and then fail to start; with Deny they are refused (rule pod-sandbox-memory-zero)")
    return "the admission policy refuses such pods (rule pod-sandbox-memory-zero)"


def check_invariants(classes: tuple[ClassSizing, ...], fn: OverheadFunction, admission: Admission) -> list[Problem]:
    """The rules of docs/rules.md on each class as rendered (rules.check_class)."""
    problems = []
    host = HostOverhead(fn.host_memory_mib, fn.host_cpu)
    for index, sized in enumerate(classes):
        where = _policy_where(index, sized.name)
        pod_fixed = PodFixed(sized.pod_fixed_memory_mib * MIB, sized.pod_fixed_cpu)
        for problem in check_class(sized.kata_config, pod_fixed, host, where):
            if problem.rule == Rule.SANDBOX_CGROUP_ONLY and index:
                continue  # one policy field: said once, not per class
            if problem.rule == Rule.SANDBOX_MEMORY_ZERO and problem.severity == Severity.WARNING:
                problem = replace(problem, message=f"{problem.message}; {admission_of_refused_pods(admission)}")
            problems.append(problem)
        if sized.largest_vm.memory_mib <= 0:
            problems.append(Problem(Severity.ERROR, Rule.LARGEST_VM_ZERO, where.path, (
                "the largest VM of this class has 0 MiB of memory; set a non-zero memory "
                "envelope or overhead_memory")))
    return problems


def size_policy(policy: KataSizingPolicy) -> PolicySizing:
    spec = policy.spec
    runtime = spec.effective_runtime
    hypervisor = spec.effective_hypervisor
    problems = check_shim(spec.shim, spec.runtime, spec.hypervisor)
    fn, fit_problems = overhead_function(spec)
    problems += fit_problems
    prefix = policy.runtime_class_prefix
    classes = []
    for index, size_class in enumerate(spec.effective_classes):
        sized, reading_problems = _as_rendered(
            _size_class(size_class, runtime, fn, spec, prefix), spec, hypervisor,
            f"the drop-in of spec.classes[{index}] ({size_class.name})")
        classes.append(sized)
        problems += list(reading_problems)
    problems += check_invariants(tuple(classes), fn, spec.admission)
    return PolicySizing(policy, runtime, hypervisor, fn, tuple(classes), tuple(problems))


# --- The VM simulator: each runtime's own rules (docs/sizing-model.md) ----------------------


class SandboxRefused(Exception):
    """The runtime would refuse to start this sandbox; the message is Kata's."""


@dataclass(frozen=True)
class SimulatedVm:
    vm: Vm
    vcpus_exact: Decimal | None = None


def _limit_mib_rust(memory_limit_bytes: int) -> int:
    # runtime-rs truncates to whole MiB, then rounds an odd value up (2 MiB huge-page alignment).
    return round_up_even(memory_limit_bytes // MIB)


def simulate_rust(
    cpu_limit: Decimal | None,
    memory_limit_bytes: int | None,
    overhead_vcpus: Decimal | None,
    overhead_memory_mib: int | None,
    default_vcpus: int,
    default_memory_mib: int,
    hypervisor: str = "qemu",
) -> SimulatedVm:
    """runtime-rs with static_sandbox_resource_mgmt = true."""
    if overhead_vcpus is None or overhead_memory_mib is None:
        raise ValueError("runtime-rs sizes a VM as the limits plus overhead_vcpus and overhead_memory: "
                         "both must be known")
    if cpu_limit is None and memory_limit_bytes is None:
        if default_memory_mib == 0:
            raise SandboxRefused(sandbox_zero_message(hypervisor))
        return SimulatedVm(Vm(default_vcpus, default_memory_mib), Decimal(default_vcpus))
    vcpus_exact = (cpu_limit or Decimal(0)) + overhead_vcpus
    vcpus = max(1, math.ceil(vcpus_exact))
    memory_mib = (_limit_mib_rust(memory_limit_bytes) if memory_limit_bytes else 0) + overhead_memory_mib
    if memory_mib == 0:
        raise SandboxRefused(sandbox_zero_message(hypervisor))
    return SimulatedVm(Vm(vcpus, memory_mib), vcpus_exact)


def simulate_go(
    cpu_limit: Decimal | None, memory_limit_bytes: int | None, default_vcpus: int, default_memory_mib: int
) -> SimulatedVm:
    """Go runtime: default_* plus the containers' limits (hot-plugged or static)."""
    extra_vcpus = math.ceil(cpu_limit) if cpu_limit else 0
    extra_mib = memory_limit_bytes // MIB if memory_limit_bytes else 0
    vcpus = default_vcpus + extra_vcpus
    return SimulatedVm(Vm(vcpus, default_memory_mib + extra_mib), Decimal(vcpus))


@dataclass(frozen=True)
class Explanation:
    class_name: str
    runtime_class: str
    vm: Vm
    accounted_cpu: Decimal
    accounted_memory_bytes: int
    warnings: tuple[str, ...]

    def as_dict(self) -> dict:
        return {
            "class": self.class_name,
            "runtimeClass": self.runtime_class,
            "vm": {"vcpus": self.vm.vcpus, "memoryMiB": self.vm.memory_mib},
            "accounted": {
                "cpu": format_cpu(self.accounted_cpu),
                "memory": format_memory(self.accounted_memory_bytes),
            },
            "warnings": list(self.warnings),
        }


def explain_pod(
    sizing: PolicySizing, class_name: str, cpu_limit: Decimal | None, memory_limit_bytes: int | None
) -> Explanation:
    """The VM Kata boots for a pod with these limits, and what Kubernetes accounts for it."""
    sized = sizing.class_named(class_name)
    if sizing.runtime is Runtime.RUST:
        simulated = simulate_rust(
            cpu_limit, memory_limit_bytes, sized.overhead_vcpus, sized.overhead_memory_mib,
            sized.default_vcpus, sized.default_memory_mib, sizing.hypervisor,
        )
    else:
        simulated = simulate_go(
            cpu_limit, memory_limit_bytes, sized.default_vcpus, sized.kata_config.effective_default_memory_mib)
    vm = simulated.vm
    accounted_cpu = (cpu_limit or Decimal(0)) + sized.pod_fixed_cpu
    accounted_bytes = (memory_limit_bytes or 0) + sized.pod_fixed_memory_mib * MIB
    warnings = []
    if cpu_limit is None and memory_limit_bytes is None:
        warnings.append(
            f"a pod without limits boots the fallback VM ({vm.vcpus} vCPUs, {vm.memory_mib} MiB) "
            f"but Kubernetes accounts only podFixed ({format_cpu(sized.pod_fixed_cpu)}, "
            f"{format_mib(sized.pod_fixed_memory_mib)}); set limits on Kata pods"
        )
    elif memory_limit_bytes is None:
        warnings.append(
            "no memory limit: the VM gets only the guest budget "
            f"({vm.memory_mib} MiB) and the workload may be OOM-killed inside it"
        )
    if accounted_bytes < vm.memory_mib * MIB:
        warnings.append(
            f"Kubernetes accounts {format_memory(accounted_bytes)} but the VM alone is "
            f"{vm.memory_mib} MiB: the node is overcommitted by this pod"
        )
    if cpu_limit is not None and cpu_limit > sized.envelope_cpu:
        warnings.append(
            f"CPU limit {format_cpu(cpu_limit)} is above class {sized.name}'s envelope "
            f"{format_cpu(sized.envelope_cpu)}; use a larger class"
        )
    if memory_limit_bytes is not None and memory_limit_bytes > sized.envelope_memory_bytes:
        warnings.append(
            f"memory limit {format_memory(memory_limit_bytes)} is above class {sized.name}'s "
            f"envelope {format_mib(sized.envelope_memory_mib)}; the guest budget may not cover "
            "the kernel's share of a VM this large; use a larger class"
        )
    return Explanation(
        sized.name, sized.runtime_class, vm, accounted_cpu,
        accounted_bytes, tuple(warnings),
    )
