"""The guest side of a survey, measured by booting VMs: what is pure of `kata-sizing probe`
(docs/probe.md). The VMs themselves are booted by `kata_sizing.vm`.

A probe boots the node's own VMM and guest kernel at the VM sizes a policy's classes give (those
`explain` computes for each class's smallest and largest pods, and sizes between), with an init
of the project's own (operator/probe-init: a static binary) in an initramfs written here. The
init reports, one `KSP ` line each on the guest's consoles: /proc/meminfo at boot (what `free`
shows: MemTotal is what the kernel left to userland, `used` the guest's own processes), then how
much memory a workload could allocate and touch before the guest refused it (its OOM killer, or a
failed mapping), or that it reached its target. Each VM gives one row of the CSV `survey` writes
and `calibrate` reads, with the guest's columns filled.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import PurePosixPath

from .calibrate import Sample
from .model import Runtime
from .quantity import MIB
from .sizing import PolicySizing, SandboxRefused, Vm, explain_pod

# What the init reports, and the protocol's version it says hello with (operator/probe-init).
REPORT_PREFIX = "KSP "
PROTOCOL_VERSION = "1"
# The workload allocates and touches this many MiB at a time: what it reports is a lower bound
# of what it could have within one step.
ALLOCATION_STEP_MIB = 4
# Where kata-deploy installs (its chart's default), and where a shim's configuration lives under
# it: the per-shim layout first (drop-ins in config.d/ beside it), then the flat one.
KATA_ROOT = "/opt/kata"
CONFIG_DIR = "share/defaults/kata-containers"


class ProbeError(Exception):
    """A probe that cannot go on; the message is one line naming what and why."""


@dataclass(frozen=True)
class ProbePoint:
    """One VM to boot: a pod of `class_name` with these limits, and the VM Kata gives it."""

    class_name: str
    cpu_limit: Decimal
    container_limit_mib: int
    vm: Vm


def probe_points(sizing: PolicySizing, per_class: int = 3) -> list[ProbePoint]:
    """The VMs of each class's smallest and largest pods (as `explain` computes them) and
    `per_class - 2` sizes evenly between, smallest first; a VM size is booted once.

    A class's smallest pod has 2 MiB more memory than the class before serves (Kata rounds a
    limit up to an even MiB); the first class's, a quarter of its envelope (the default classes
    step by 4x)."""
    if per_class < 1:
        raise ProbeError(f"--points {per_class}: at least 1 VM per class")
    points: list[ProbePoint] = []
    seen: set[tuple[int, int]] = set()
    previous_mib: int | None = None
    for sized in sizing.classes:
        largest = sized.envelope_memory_mib
        smallest = previous_mib + 2 if previous_mib is not None else max(2, largest // 4)
        smallest = min(smallest, largest)
        limits = [largest] if per_class == 1 else sorted({
            smallest + (largest - smallest) * step // (per_class - 1) for step in range(per_class)})
        for limit_mib in limits:
            try:
                explanation = explain_pod(sizing, sized.name, sized.envelope_cpu, limit_mib * MIB)
            except SandboxRefused as exc:
                raise ProbeError(f"class {sized.name}: Kata refuses a pod of {limit_mib} MiB: {exc}") from None
            key = (explanation.vm.memory_mib, explanation.vm.vcpus)
            if key not in seen:
                seen.add(key)
                points.append(ProbePoint(sized.name, sized.envelope_cpu, limit_mib, explanation.vm))
        previous_mib = largest
    return points


# --- the node's Kata configuration ------------------------------------------------------------


@dataclass(frozen=True)
class VmmPaths:
    """What a probe boots: the node's VMM and guest kernel (Kata's `[hypervisor.*] path` and
    `kernel`), and where they were read from."""

    vmm: str
    kernel: str
    hypervisor: str
    source: str
    # The guest image Kata boots (initrd or image): reported only, the probe boots its own init.
    guest_image: str | None = None


def config_candidates(shim: str, runtime: Runtime, kata_root: str = KATA_ROOT) -> list[str]:
    """Where kata-deploy puts a shim's configuration, in the order looked at."""
    base = PurePosixPath(kata_root) / CONFIG_DIR
    rust = runtime is Runtime.RUST
    nested = base / "runtime-rs" if rust else base
    return [str(p) for p in (
        nested / "runtimes" / shim / f"configuration-{shim}.toml",
        nested / f"configuration-{shim}.toml",
        base / f"configuration-{shim}.toml",
    )]


def vmm_paths(text: str, source: str, hypervisor: str) -> VmmPaths:
    """The VMM and kernel of `[hypervisor.<hypervisor>]` in a Kata configuration file."""
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProbeError(f"{source}: not TOML Kata can read: {exc}") from None
    sections = config.get("hypervisor")
    if not isinstance(sections, dict) or not sections:
        raise ProbeError(f"{source}: no [hypervisor.*] section")
    section = sections.get(hypervisor)
    if not isinstance(section, dict):
        raise ProbeError(f"{source}: no [hypervisor.{hypervisor}] section (it has "
                         f"{', '.join(f'[hypervisor.{name}]' for name in sections)})")
    found: dict[str, str] = {}
    for key in ("path", "kernel"):
        value = section.get(key)
        if not isinstance(value, str) or not value:
            raise ProbeError(f"{source}: [hypervisor.{hypervisor}] {key} is not set")
        found[key] = value
    guest = next((section[k] for k in ("initrd", "image") if isinstance(section.get(k), str) and section[k]), None)
    return VmmPaths(found["path"], found["kernel"], hypervisor, source, guest)


def vm_paths_problem(hypervisor: str) -> str | None:
    """The probe boots QEMU (the command line of vm_command); None when the policy's is QEMU."""
    if hypervisor != "qemu":
        return (f"the policy's hypervisor is {hypervisor}: the probe boots QEMU only (Cloud Hypervisor and "
                "Firecracker take other command lines); give --vmm a qemu-system binary to probe its guest kernel")
    return None


# --- what the VM is told, and what it says --------------------------------------------------


def kernel_command_line(alloc_mib: int = 0, *, step_mib: int = ALLOCATION_STEP_MIB, step_ms: int = 0,
                        linger: bool = False) -> str:
    """The guest kernel's command line: both consoles Kata's guest kernels may have (the last is
    /dev/console), no reboot on panic, and the init's parameters: allocate `alloc_mib` (0: until
    the guest refuses) `step_mib` at a time, waiting `step_ms` after each step; `linger` keeps what
    it holds and the VM running."""
    words = ["console=ttyS0", "console=hvc0", "quiet", "panic=-1", f"ksp.alloc={alloc_mib}", f"ksp.step={step_mib}"]
    if step_ms:
        words.append(f"ksp.step_ms={step_ms}")
    if linger:
        words.append("ksp.linger=1")
    return " ".join(words)


@dataclass(frozen=True)
class GuestReport:
    """What the init said. Sizes in KiB as /proc/meminfo gives them; None: not said."""

    meminfo: dict[str, int] = field(default_factory=dict)
    held_mib: int | None = None
    outcome: str | None = None
    errors: tuple[str, ...] = ()
    said_hello: bool = False

    @property
    def free_total_mib(self) -> Decimal:
        return Decimal(self.meminfo["MemTotal"]) / 1024

    @property
    def free_used_mib(self) -> Decimal:
        """`free`'s `used`: total - free - buffers - cache (page cache and reclaimable slab)."""
        m = self.meminfo
        used = m["MemTotal"] - m["MemFree"] - m.get("Buffers", 0) - m.get("Cached", 0) - m.get("SReclaimable", 0)
        return Decimal(max(used, 0)) / 1024


def parse_console(text: str) -> GuestReport:
    """The init's report from the console output (kernel messages and firmware noise between)."""
    meminfo: dict[str, int] = {}
    held = outcome = None
    hello = False
    errors = []
    for raw in text.splitlines():
        at = raw.find(REPORT_PREFIX)
        if at < 0:
            continue
        words = raw[at + len(REPORT_PREFIX):].split()
        if not words:
            continue
        what, pairs = words[0], dict(w.split("=", 1) for w in words[1:] if "=" in w)
        if what == "hello":
            hello = True
        elif what == "meminfo" and pairs.get("stage") == "boot":
            meminfo = {k: int(v) for k, v in pairs.items() if k != "stage" and v.isdigit()}
        elif what == "progress" and pairs.get("held", "").isdigit():
            held = int(pairs["held"])
        elif what == "done":
            if pairs.get("held", "").isdigit():
                held = int(pairs["held"])
            outcome = pairs.get("outcome")
        elif what == "error":
            errors.append(" ".join(words[1:]))
    return GuestReport(meminfo, held, outcome, tuple(errors), hello)


def report_problem(report: GuestReport) -> str | None:
    """Why a report cannot give a row, or None."""
    if not report.said_hello:
        return "the guest never reported (no init output on its consoles)"
    if report.errors:
        return "the guest's init failed: " + "; ".join(report.errors)
    if "MemTotal" not in report.meminfo or "MemFree" not in report.meminfo:
        return "the guest did not report its memory"
    if report.outcome is None:
        return "the guest's workload never finished"
    return None


@dataclass(frozen=True)
class HostFigures:
    """The VMM on the host: its peak resident memory (VmHWM) and its cgroup's peak charge, bytes."""

    vmm_peak_resident_bytes: int | None = None
    cgroup_peak_bytes: int | None = None


# What the probe's VM is (vm_command): the node's kernel with the probe's own init (no Kata agent), QEMU
# alone in its cgroup, its consoles on the ISA serial port and virtio-serial (calibrate.KIND_COLUMNS).
GUEST_BOOTED = "kernel-only"
HOST_PROCESSES_COUNTED = "vmm"
VM_DEVICES = "serial+virtio-console"
# QEMU's translation cache under TCG (MiB): in the VMM's host side, absent under KVM.
TCG_TB_SIZE_MIB = 64


def probe_row(point: ProbePoint, report: GuestReport, host: HostFigures, node: str | None,
              accelerator: str) -> Sample:
    """One survey row: the guest's `free` figures, what its workload got, the VMM's charge, and what
    was measured (the accelerator, TCG's translation cache, the guest, the host processes, the devices).

    The cgroup's peak is the row's pod cgroup figure only once the VM was fully resident (its
    workload touched all it could): below the VM's size it says nothing of the host side."""
    charged = host.cgroup_peak_bytes
    if charged is not None and charged < point.vm.memory_mib * MIB:
        charged = None
    return Sample(
        container_limit_mib=Decimal(point.container_limit_mib),
        vm_nominal_mib=Decimal(point.vm.memory_mib),
        free_total_mib=report.free_total_mib,
        free_used_mib=report.free_used_mib,
        pod_cgroup_memory_current_bytes=charged,
        workload_allocated_mib=None if report.held_mib is None else Decimal(report.held_mib),
        vmm_peak_resident_bytes=host.vmm_peak_resident_bytes,
        node=node,
        class_name=point.class_name,
        accelerator=accelerator,
        tcg_tb_size_mib=TCG_TB_SIZE_MIB if accelerator == "tcg" else None,
        guest=GUEST_BOOTED,
        host_processes=HOST_PROCESSES_COUNTED,
        devices=VM_DEVICES,
    )


def describe_row(point: ProbePoint, report: GuestReport, host: HostFigures, accelerator: str) -> str:
    """One line for a person: the VM and what it showed."""
    mib = lambda b: f"{b / MIB:.0f} MiB" if b is not None else "not read"  # noqa: E731
    return (f"class {point.class_name}: VM {point.vm.memory_mib} MiB, {point.vm.vcpus} vCPU ({accelerator}): "
            f"MemTotal {report.free_total_mib:.1f} MiB, used {report.free_used_mib:.1f} MiB, the workload got "
            f"{report.held_mib} MiB ({report.outcome}); VMM peak resident {mib(host.vmm_peak_resident_bytes)}, "
            f"cgroup peak {mib(host.cgroup_peak_bytes)}")


# --- the initramfs ---------------------------------------------------------------------------


def _cpio_entry(name: str, mode: int, data: bytes, inode: int) -> bytes:
    encoded = name.encode() + b"\0"
    fields = (inode, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
    header = b"070701" + b"".join(f"{value:08x}".encode() for value in fields)
    entry = header + encoded
    entry += b"\0" * (-len(entry) % 4)
    return entry + data + b"\0" * (-len(data) % 4)


def initramfs(init: bytes) -> bytes:
    """A newc cpio archive (what the kernel unpacks as its initramfs) holding `init` as /init and
    the mount points it uses."""
    if init[:4] != b"\x7fELF":
        raise ProbeError("the probe's init is not an ELF executable")
    return b"".join([
        _cpio_entry("dev", 0o40755, b"", 1),
        _cpio_entry("proc", 0o40755, b"", 2),
        _cpio_entry("init", 0o100755, init, 3),
        _cpio_entry("TRAILER!!!", 0, b"", 0),
    ])


def vm_command(paths: VmmPaths, vm: Vm, *, accelerator: str, memory_dir: str, initramfs_path: str,
               command_line: str, console_path: str | None) -> list[str]:
    """QEMU's command line for a VM as Kata's QEMU places its memory: a file-backed, shared
    memory backend in `memory_dir` (Kata's virtio-fs setup, on /dev/shm), one NUMA node. The
    guest's consoles go to `console_path` (ttyS0) and `console_path`.hvc (hvc0, virtio); without
    one, ttyS0 goes to QEMU's standard output (a container's log)."""
    accel = "kvm" if accelerator == "kvm" else f"tcg,tb-size={TCG_TB_SIZE_MIB}"
    return [
        paths.vmm, "-accel", accel, "-machine", "q35", "-m", f"{vm.memory_mib}M", "-smp", str(vm.vcpus),
        "-object", f"memory-backend-file,id=mem,size={vm.memory_mib}M,mem-path={memory_dir},share=on",
        "-numa", "node,memdev=mem", "-nodefaults", "-nographic", "-no-reboot",
        *(["-serial", f"file:{console_path}",
            "-device", "virtio-serial-pci,id=ksp-serial", "-chardev", f"file,id=ksp-hvc,path={console_path}.hvc",
            "-device", "virtconsole,chardev=ksp-hvc"] if console_path else ["-serial", "stdio"]),
        "-kernel", paths.kernel, "-initrd", initramfs_path, "-append", command_line,
    ]
