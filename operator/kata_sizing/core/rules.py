"""Kata's sizing rules, written once (docs/rules.md lists them with their ids).

Every path that judges a Kata configuration comes here: `validate`, `render`, `explain`,
`audit`, the admission webhook and the operator. It holds

- `KataConfig`: what one shim boots with (shipped defaults, then a drop-in), read from
  TOML and written to TOML by the same code, so a policy is checked on the drop-in text
  Kata will read, not on the numbers the user typed;
- `check_class`: one function that checks a class's configuration against its podFixed
  and the host-side overhead;
- `Problem`: one problem type (severity, rule id, field path, message, fix).

Pure: no I/O. Numbers follow docs/sizing-model.md.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from . import defaults
from .defaults import Runtime, ShimInfo
from .quantity import MIB, format_cpu, format_memory, format_mib, format_vcpus, shown


class Severity:
    ERROR = "error"
    WARNING = "warning"


class Rule:
    """Rule ids: stable names for docs/rules.md, `-o json` output and status."""

    RUST_POD_FIXED_MEMORY = "rust-pod-fixed-memory"
    RUST_POD_FIXED_CPU = "rust-pod-fixed-cpu"
    NO_LIMITS_UNDER_ACCOUNTED = "no-limits-under-accounted"
    GO_POD_FIXED_MEMORY = "go-pod-fixed-memory"
    GO_HOST_UNCOVERED = "go-host-side-uncovered"
    GO_DEFAULT_MEMORY_IGNORED = "go-default-memory-ignored"
    POD_FIXED_CPU_ZERO = "pod-fixed-cpu-zero"
    SANDBOX_MEMORY_ZERO = "sandbox-memory-zero"
    LARGEST_VM_ZERO = "largest-vm-zero"
    SANDBOX_CGROUP_ONLY = "sandbox-cgroup-only"
    OVERHEAD_DISABLED = "overhead-disabled"
    OVERHEAD_INVALID = "overhead-invalid"
    DROP_IN_INVALID = "drop-in-invalid"
    HYPERVISOR_SECTION_IGNORED = "hypervisor-section-ignored"
    RUNTIME_SHIM_MISMATCH = "runtime-shim-mismatch"
    RUNTIME_CLASS_INVALID = "runtime-class-invalid"
    POLICY_SCHEMA = "policy-schema"
    OVERHEAD_SAMPLES = "overhead-samples"
    NODE_RESERVATIONS = "node-reservations"


@dataclass(frozen=True)
class Problem:
    severity: str
    rule: str
    path: str
    message: str
    fix: str = ""
    # What the configuration has and what the rule compares it with (audit's table).
    value: str = ""
    bound: str = ""

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"

    def as_dict(self) -> dict:
        return {"severity": self.severity, "rule": self.rule, "path": self.path,
                "message": self.message, "fix": self.fix}


# --- the Kata configuration --------------------------------------------------------------

_HYPERVISOR_MIB_KEYS = ("default_memory", "default_maxmemory", "overhead_memory")
_HYPERVISOR_VCPU_KEYS = ("default_vcpus", "overhead_vcpus")
_HYPERVISOR_BOOL_KEYS = ("enable_hugepages",)
_RUNTIME_BOOL_KEYS = ("sandbox_cgroup_only", "static_sandbox_resource_mgmt")
_RUST_ONLY_KEYS = ("default_maxmemory", "overhead_vcpus", "overhead_memory")
# The order a drop-in is written in.
_KEY_ORDER = ("default_vcpus", "default_memory", "default_maxmemory", "overhead_vcpus", "overhead_memory",
              "enable_hugepages", "sandbox_cgroup_only", "static_sandbox_resource_mgmt")
# Kata reads memory sizes as uint32 MiB; anything larger is not a size it can hold.
MAX_MIB = 2**32 - 1
# Kata's largest vCPU count is far below this; a bound keeps a typo from becoming a VM size.
MAX_VCPUS = Decimal(1024)


@dataclass(frozen=True)
class KataConfig:
    """The settings one class's sandboxes boot with: shipped values, then the drop-in.

    `default_memory_mib` is what the configuration says; `effective_default_memory_mib`
    is what the runtime uses (the Go runtime replaces a value below its minimum)."""

    runtime: Runtime
    hypervisor: str
    default_vcpus: Decimal
    default_memory_mib: int
    overhead_vcpus: Decimal | None  # runtime-rs only
    overhead_memory_mib: int | None  # runtime-rs only
    static_sandbox_resource_mgmt: bool
    sandbox_cgroup_only: bool
    default_maxmemory_mib: int | None = None
    enable_hugepages: bool | None = None
    # The keys the drop-in sets.
    from_drop_in: frozenset[str] = frozenset()

    @classmethod
    def shipped(cls, info: ShimInfo) -> KataConfig:
        # [go-make]/[rs-make]: default_memory 2048 MiB, default_vcpus 1 for both runtimes;
        # overhead_* and the [runtime] switches per shim (defaults.SHIMS).
        return cls(
            runtime=info.runtime,
            hypervisor=info.hypervisor,
            default_vcpus=Decimal(defaults.SHIPPED_DEFAULT_VCPUS),
            default_memory_mib=defaults.SHIPPED_DEFAULT_MEMORY_MIB,
            overhead_vcpus=info.shipped_overhead_vcpus,
            overhead_memory_mib=info.shipped_overhead_memory_mib,
            static_sandbox_resource_mgmt=info.shipped_static_sizing,
            sandbox_cgroup_only=info.shipped_sandbox_cgroup_only,
        )

    @property
    def rust_static(self) -> bool:
        """runtime-rs static sizing: VM = limits + overhead_* (docs/sizing-model.md)."""
        return self.runtime is Runtime.RUST and self.static_sandbox_resource_mgmt

    @property
    def go_default_memory_ignored(self) -> bool:
        # [go-src]: the Go runtime replaces a default_memory below 256 MiB with 2048 MiB.
        return self.runtime is Runtime.GO and self.default_memory_mib < defaults.GO_MIN_DEFAULT_MEMORY_MIB

    @property
    def effective_default_memory_mib(self) -> int:
        if self.go_default_memory_ignored:
            return defaults.SHIPPED_DEFAULT_MEMORY_MIB
        return self.default_memory_mib

    def _value(self, key: str) -> object:
        return getattr(self, {
            "default_memory": "default_memory_mib", "default_maxmemory": "default_maxmemory_mib",
            "overhead_memory": "overhead_memory_mib",
        }.get(key, key))

    def to_toml(self) -> str:
        """The drop-in body: the keys this configuration sets, as Kata's TOML takes them."""
        hypervisor = [k for k in _KEY_ORDER if k in self.from_drop_in and k not in _RUNTIME_BOOL_KEYS]
        runtime = [k for k in _KEY_ORDER if k in self.from_drop_in and k in _RUNTIME_BOOL_KEYS]
        lines = []
        if hypervisor:
            lines.append(f"[hypervisor.{self.hypervisor}]")
            lines += [f"{k} = {toml_value(self._value(k))}" for k in hypervisor]
        if runtime:
            if lines:
                lines.append("")
            lines.append("[runtime]")
            lines += [f"{k} = {toml_value(self._value(k))}" for k in runtime]
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict:
        return {
            "hypervisor": self.hypervisor,
            "defaultMemoryMiB": self.default_memory_mib,
            "defaultVcpus": format_vcpus(self.default_vcpus),
            "overheadMemoryMiB": self.overhead_memory_mib,
            "overheadVcpus": None if self.overhead_vcpus is None else format_vcpus(self.overhead_vcpus),
            "staticSandboxResourceMgmt": self.static_sandbox_resource_mgmt,
            "sandboxCgroupOnly": self.sandbox_cgroup_only,
            "fromDropIn": sorted(self.from_drop_in),
        }


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        return format_vcpus(value)
    raise TypeError(f"no TOML form for {value!r}")


def _read_float(text: str) -> Decimal:
    # Kata's TOML readers hold vCPU counts as binary floats: 0.49999999999999999999 is 0.5
    # to them. repr() gives the shortest decimal of that float, so rules compare with it.
    number = float(text)
    return Decimal(repr(number)) if math.isfinite(number) else Decimal("NaN")


@dataclass(frozen=True)
class DropInReading:
    config: KataConfig | None  # None when the drop-in is not TOML: Kata would not start
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def read_drop_in(text: object, base: KataConfig, where: str) -> DropInReading:
    """`base` overridden by a drop-in's keys, read as Kata reads them. `where` names the
    drop-in in messages (a values path, or a policy class)."""
    if text is None or text == "":
        return DropInReading(base)
    problems: list[Problem] = []
    notes: list[str] = []

    def bad(key: str, value: str, why: str) -> None:
        problems.append(Problem(
            Severity.ERROR, Rule.DROP_IN_INVALID, where,
            f"{where}: {key} = {value} is not usable: {why}", f"correct {key} in {where}", value, key))

    if not isinstance(text, str):
        problems.append(Problem(
            Severity.ERROR, Rule.DROP_IN_INVALID, where,
            f"{where} cannot be read: it must be a TOML string; Kata fails to load this "
            "configuration, so no pod of this class starts", f"correct the TOML in {where}",
            shown(text), "valid TOML"))
        return DropInReading(None, problems)
    try:
        document = tomllib.loads(text, parse_float=_read_float)
    except (tomllib.TOMLDecodeError, ValueError, RecursionError) as exc:
        problems.append(Problem(
            Severity.ERROR, Rule.DROP_IN_INVALID, where,
            f"{where} cannot be read: {_short(str(exc))}; Kata fails to load this configuration, "
            "so no pod of this class starts", f"correct the TOML in {where}", "not TOML", "valid TOML"))
        return DropInReading(None, problems)

    changes: dict[str, Any] = {}  # each value checked above against its key's type
    hypervisors = document.get("hypervisor")
    hypervisors = hypervisors if isinstance(hypervisors, dict) else {}
    for table_name in hypervisors:
        if table_name != base.hypervisor:
            problems.append(Problem(
                Severity.ERROR, Rule.HYPERVISOR_SECTION_IGNORED, where,
                f"{where}: [hypervisor.{_short(table_name)}] is not the {base.hypervisor} hypervisor this "
                f"shim runs; the shim sizes its VM from [hypervisor.{base.hypervisor}], so these "
                "settings never reach the VM",
                f"move the keys under [hypervisor.{base.hypervisor}] in {where}",
                f"[hypervisor.{_short(table_name)}]", f"[hypervisor.{base.hypervisor}]"))
    table = hypervisors.get(base.hypervisor)
    table = table if isinstance(table, dict) else {}
    for key in _HYPERVISOR_MIB_KEYS:
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_MIB:
                bad(key, _short(repr(value)), f"it must be a whole number of MiB from 0 to {MAX_MIB}")
            else:
                changes[key] = value
    for key in _HYPERVISOR_VCPU_KEYS:
        if key in table:
            value = table[key]
            if (isinstance(value, bool) or not isinstance(value, (int, Decimal))
                    or (isinstance(value, Decimal) and not value.is_finite()) or not 0 <= value <= MAX_VCPUS):
                bad(key, _short(repr(value)), f"it must be a number of vCPUs from 0 to {MAX_VCPUS}")
            else:
                changes[key] = Decimal(value)
    runtime = document.get("runtime")
    runtime = runtime if isinstance(runtime, dict) else {}
    for key, section in [*((k, table) for k in _HYPERVISOR_BOOL_KEYS), *((k, runtime) for k in _RUNTIME_BOOL_KEYS)]:
        if key in section:
            if isinstance(section[key], bool):
                changes[key] = section[key]
            else:
                bad(key, _short(repr(section[key])), "it must be true or false")
    if base.runtime is Runtime.GO and {"overhead_memory", "overhead_vcpus", "default_maxmemory"} & set(changes):
        notes.append(f"{where}: overhead_memory/overhead_vcpus are runtime-rs settings; "
                     "the Go runtime ignores them")
        for key in _RUST_ONLY_KEYS:
            changes.pop(key, None)
    config = replace(
        base,
        default_memory_mib=changes.get("default_memory", base.default_memory_mib),
        default_maxmemory_mib=changes.get("default_maxmemory", base.default_maxmemory_mib),
        default_vcpus=changes.get("default_vcpus", base.default_vcpus),
        overhead_memory_mib=changes.get("overhead_memory", base.overhead_memory_mib),
        overhead_vcpus=changes.get("overhead_vcpus", base.overhead_vcpus),
        enable_hugepages=changes.get("enable_hugepages", base.enable_hugepages),
        static_sandbox_resource_mgmt=changes.get("static_sandbox_resource_mgmt", base.static_sandbox_resource_mgmt),
        sandbox_cgroup_only=changes.get("sandbox_cgroup_only", base.sandbox_cgroup_only),
        from_drop_in=frozenset(changes),
    )
    if base.runtime is Runtime.RUST and not config.static_sandbox_resource_mgmt:
        notes.append(f"{where}: static_sandbox_resource_mgmt is false, so runtime-rs sizes the VM as "
                     "default_memory plus hot-plugged limits; checked with the default_memory rule")
    return DropInReading(config, problems, notes)


def _short(text: str, limit: int = 80) -> str:
    """A value quoted in a message: one line, bounded."""
    text = text if text.isprintable() else repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- the shim -----------------------------------------------------------------------------


def check_shim(shim: str, runtime: str | None, hypervisor: str | None) -> list[Problem]:
    """A policy's `runtime` and `hypervisor` against what its shim runs: the shim's own
    configuration decides both, so a different value describes a VM Kata never boots."""
    info = defaults.SHIMS[shim]
    problems = []
    if runtime is not None and runtime != info.runtime.value:
        problems.append(Problem(
            Severity.ERROR, Rule.RUNTIME_SHIM_MISMATCH, "spec.runtime",
            f"{runtime} contradicts shim {shim}, which runs the {info.runtime.value} runtime; the drop-in "
            f"and podFixed would be sized by the wrong runtime's rules",
            f"omit spec.runtime or set it to {info.runtime.value}", runtime, info.runtime.value))
    if hypervisor is not None and hypervisor != info.hypervisor:
        problems.append(Problem(
            Severity.ERROR, Rule.HYPERVISOR_SECTION_IGNORED, "spec.hypervisor",
            f"{hypervisor} is not the hypervisor of shim {shim} ({info.hypervisor}); the shim reads only "
            f"[hypervisor.{info.hypervisor}], so a drop-in section [hypervisor.{hypervisor}] never "
            "reaches the VM",
            f"omit spec.hypervisor or set it to {info.hypervisor}", hypervisor, info.hypervisor))
    return problems


# --- the class check -----------------------------------------------------------------------


@dataclass(frozen=True)
class HostOverhead:
    """The host side of a sandbox (shim, VMM, virtiofsd): what podFixed adds to the guest."""

    memory_mib: int
    cpu: Decimal

    @classmethod
    def for_shim(cls, shim: str) -> HostOverhead:
        family = defaults.OVERHEAD_DEFAULTS[defaults.SHIMS[shim].family]
        return cls(family.host_memory_mib, family.host_cpu)


@dataclass(frozen=True)
class Where:
    """How one path names things: the problem's path, the podFixed fields, and how a
    Kata setting is changed there (a policy field, or a line in a values drop-in)."""

    path: str
    pod_fixed_field: Callable[[str], str]
    set_kata: Callable[[KataConfig, str, int], str]
    overhead_disabled_fix: str = ""


@dataclass(frozen=True)
class PodFixed:
    memory_bytes: int | None
    cpu: Decimal | None


def sandbox_zero_message(hypervisor: str) -> str:
    """runtime-rs' own words when a sandbox would get 0 MiB [rs-src]."""
    return (f"computed sandbox memory is 0 MiB for hypervisor {hypervisor}; set a non-zero memory limit or "
            "configure non-zero default_memory/overhead_memory")


def overhead_disabled(where: Where) -> Problem:
    """A Kata RuntimeClass without overhead: checked even when its drop-in cannot be read."""
    return Problem(Severity.ERROR, Rule.OVERHEAD_DISABLED, where.path,
                   "the RuntimeClass has no overhead: Kubernetes accounts nothing for the VM, the shim "
                   "and the VMM, so every pod's node memory is under-accounted", where.overhead_disabled_fix,
                   "no overhead", "podFixed covering the VM")


def check_class(kata: KataConfig, pod_fixed: PodFixed | None, host: HostOverhead, where: Where) -> list[Problem]:
    """Every rule of docs/rules.md that compares a class's Kata configuration with its
    podFixed. `pod_fixed` None: the RuntimeClass has no overhead at all."""
    problems: list[Problem] = []

    def problem(severity: str, rule: str, value: str, bound: str, message: str, fix: str) -> None:
        problems.append(Problem(severity, rule, where.path, message, fix, value, bound))

    if pod_fixed is None:
        problems.append(overhead_disabled(where))
    memory_bytes = (pod_fixed.memory_bytes if pod_fixed else None) or 0
    cpu = (pod_fixed.cpu if pod_fixed else None) or Decimal(0)
    pf_mem = f"podFixed.memory {show_memory(pod_fixed.memory_bytes if pod_fixed else None)}"
    pf_cpu = f"podFixed.cpu {show_cpu(pod_fixed.cpu if pod_fixed else None)}"
    mem_field, cpu_field = where.pod_fixed_field("memory"), where.pod_fixed_field("cpu")
    host_mib = host.memory_mib

    if kata.go_default_memory_ignored:
        problem(Severity.ERROR, Rule.GO_DEFAULT_MEMORY_IGNORED, f"default_memory {kata.default_memory_mib}",
                f"at least {defaults.GO_MIN_DEFAULT_MEMORY_MIB} MiB", (
                    f"default_memory {format_mib(kata.default_memory_mib)} is below "
                    f"{format_mib(defaults.GO_MIN_DEFAULT_MEMORY_MIB)}: the Go runtime replaces it with its "
                    f"built-in {defaults.SHIPPED_DEFAULT_MEMORY_MIB} MiB, so every VM of this class is "
                    f"{defaults.SHIPPED_DEFAULT_MEMORY_MIB} MiB plus the limits"),
                where.set_kata(kata, "default_memory", defaults.GO_MIN_DEFAULT_MEMORY_MIB))

    if kata.rust_static:
        ov_mem, ov_cpu = kata.overhead_memory_mib or 0, kata.overhead_vcpus or Decimal(0)
        zero = [key for key, mib in (("overhead_memory", ov_mem), ("default_memory", kata.default_memory_mib))
                if mib == 0]
        if zero:
            # Kata's own message (runtime-rs). One zero is a choice (every pod must then set the
            # limit that fills it); both zero leaves only pods with a memory limit able to start.
            refused = {"overhead_memory": "has a CPU limit but no memory limit",
                       "default_memory": "has no limits"}
            problem(Severity.ERROR if len(zero) == 2 else Severity.WARNING, Rule.SANDBOX_MEMORY_ZERO,
                    ", ".join(f"{key} 0" for key in zero), "a non-zero memory", (
                        f"{sandbox_zero_message(kata.hypervisor)} (Kata refuses every pod of this class that "
                        f"{' or '.join(refused[key] for key in zero)})"),
                    " and ".join(where.set_kata(kata, key, _shipped_overhead_memory(kata)
                                                if key == "overhead_memory" else _fallback_mib()) for key in zero))
        if pod_fixed is not None:
            if not memory_bytes > ov_mem * MIB:
                problem(Severity.ERROR, Rule.RUST_POD_FIXED_MEMORY, pf_mem, f"overhead_memory {ov_mem} MiB", (
                    f"{pf_mem} must be above overhead_memory {format_mib(ov_mem)}: podFixed covers the guest "
                    "side (overhead_memory) plus the host side"),
                    f"set {mem_field} to {format_mib(ov_mem + host_mib)} "
                    f"(overhead_memory {ov_mem} MiB + {host_mib} MiB host)")
            if not cpu > ov_cpu:
                problem(Severity.ERROR, Rule.RUST_POD_FIXED_CPU, pf_cpu, f"overhead_vcpus {format_vcpus(ov_cpu)}", (
                    f"{pf_cpu} must be above overhead_vcpus {format_vcpus(ov_cpu)}: podFixed covers the "
                    "guest side (overhead_vcpus) plus the host side"),
                    f"set {cpu_field} to {format_cpu(ov_cpu + host.cpu)} "
                    f"(overhead_vcpus {format_vcpus(ov_cpu)} + {format_cpu(host.cpu)} host)")
            if memory_bytes < (kata.default_memory_mib + host_mib) * MIB:
                problem(Severity.WARNING, Rule.NO_LIMITS_UNDER_ACCOUNTED, pf_mem,
                        f"default_memory {kata.default_memory_mib} MiB + {host_mib} MiB host", (
                            f"{pf_mem} is below default_memory {format_mib(kata.default_memory_mib)} + host "
                            f"memory {format_mib(host_mib)}: pods without limits boot a VM of default_memory "
                            "and are under-accounted"),
                        _memory_fixes(kata, where, memory_bytes, host_mib, ov_mem))
    elif pod_fixed is not None:
        default_mib = kata.effective_default_memory_mib
        if not memory_bytes > default_mib * MIB:
            short = format_memory(default_mib * MIB + host_mib * MIB - memory_bytes)
            problem(Severity.ERROR, Rule.GO_POD_FIXED_MEMORY, pf_mem, f"default_memory {default_mib} MiB", (
                f"{pf_mem} must be above default_memory {format_mib(default_mib)}: in the Go runtime "
                "default_memory is the guest budget and podFixed must cover it plus the host side "
                f"(every pod is under-accounted by about {short})"),
                _memory_fixes(kata, where, memory_bytes, host_mib, 0))
        elif memory_bytes < (default_mib + host_mib) * MIB:
            problem(Severity.WARNING, Rule.GO_HOST_UNCOVERED, pf_mem,
                    f"default_memory {default_mib} MiB + {host_mib} MiB host", (
                        f"{pf_mem} covers default_memory {format_mib(default_mib)} but not the host side "
                        f"(shim, VMM, virtiofsd: {format_mib(host_mib)})"),
                    f"set {mem_field} to {format_mib(default_mib + host_mib)} "
                    f"(default_memory {default_mib} MiB + {host_mib} MiB host)")

    if pod_fixed is not None and pod_fixed.cpu is not None and pod_fixed.cpu == 0 and not kata.rust_static:
        problem(Severity.ERROR, Rule.POD_FIXED_CPU_ZERO, pf_cpu, f"host CPU {format_cpu(host.cpu)}", (
            f"{pf_cpu} accounts nothing for the shim and VMM threads on the host"),
            f"set {cpu_field} to {format_cpu(host.cpu)} or more")

    if not kata.sandbox_cgroup_only:
        problem(Severity.WARNING, Rule.SANDBOX_CGROUP_ONLY, "sandbox_cgroup_only false", "sandbox_cgroup_only true",
                "the shim and the VMM run outside the pod cgroup (in /kata_overhead), so the pod's "
                "accounting is not enforced on them",
                where.set_kata(kata, "sandbox_cgroup_only", 1))
    return problems


def show_memory(size_bytes: int | None) -> str:
    return "unset" if size_bytes is None else format_memory(size_bytes)


def show_cpu(cores: Decimal | None) -> str:
    return "unset" if cores is None else format_cpu(cores)


def _fallback_mib() -> int:
    # [survey]: the fallback default_memory (256 MiB).
    return int(defaults.FALLBACK_MEMORY.removesuffix("Mi"))


def _shipped_overhead_memory(kata: KataConfig) -> int:
    shipped = [s.shipped_overhead_memory_mib for s in defaults.SHIMS.values()
               if s.hypervisor == kata.hypervisor and s.shipped_overhead_memory_mib]
    return min(shipped) if shipped else 32


def _memory_fixes(kata: KataConfig, where: Where, pod_fixed_bytes: int, host_mib: int, guest_mib: int) -> str:
    """Raise podFixed to cover default_memory, or shrink default_memory to fit podFixed.
    `guest_mib` is the rest of the guest budget podFixed must also cover (overhead_memory)."""
    default_mib = kata.effective_default_memory_mib
    mem_field = where.pod_fixed_field("memory")
    fixes = [f"set {mem_field} to {format_mib(default_mib + host_mib)} "
             f"(default_memory {default_mib} MiB + {host_mib} MiB host)"]
    # [survey]: a VM below the fallback default_memory (256 MiB) has no room for the kernel's
    # share and the guest daemons, so never suggest less.
    fallback_mib = _fallback_mib()
    fits = pod_fixed_bytes // MIB - host_mib
    if fallback_mib <= fits < default_mib:
        fixes.append(where.set_kata(kata, "default_memory", fits))
    elif fallback_mib < default_mib:
        fixes.append(f"{where.set_kata(kata, 'default_memory', fallback_mib)} ([survey] fallback) and set "
                     f"{mem_field} to {format_mib(max(fallback_mib, guest_mib) + host_mib)}")
    return "; or ".join(fixes)


def drop_in_setter(drop_in_path: str) -> Callable[[KataConfig, str, int], str]:
    """How a fix changes a Kata setting in a values file's drop-in."""

    def set_kata(kata: KataConfig, key: str, value: int) -> str:
        section = "[runtime]" if key in _RUNTIME_BOOL_KEYS else f"[hypervisor.{kata.hypervisor}]"
        shown = toml_value(bool(value)) if key in _RUNTIME_BOOL_KEYS else str(value)
        return f"add to {drop_in_path} under {section}: {key} = {shown}"

    return set_kata
