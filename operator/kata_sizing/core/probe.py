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

import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import PurePosixPath

from .bounded import printable
from .calibrate import DEVICES, Sample
from .kataguest import (
    GuestBoot,
    KataConfigError,
    KataGuest,
    device_arguments,
    guest_params,
    kata_guest,
    machine_options,
    memory_option,
    qemu_option_value,
)
from .model import Runtime
from .quantity import MIB
from .sizing import PolicySizing, SandboxRefused, Vm, explain_pod

# What the init reports, and the protocol's version it says hello with (operator/probe-init).
REPORT_PREFIX = "KSP "
PROTOCOL_VERSION = "1"
# The second console's file: the console's path with this added (vm_command).
HVC_SUFFIX = ".hvc"
# The workload allocates and touches this many MiB at a time: what it reports is a lower bound
# of what it could have within one step.
ALLOCATION_STEP_MIB = 4
# At most this many VMs per class (`--points`): each is a boot (seconds to a minute under TCG, by
# its size), and more sizes than this add nothing to a line fitted through them (docs/probe.md).
MAX_POINTS_PER_CLASS = 10
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
    if not 1 <= per_class <= MAX_POINTS_PER_CLASS:
        raise ProbeError(f"--points {per_class}: at least 1 and at most {MAX_POINTS_PER_CLASS} VMs per class")
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


def select_points(points: Sequence[ProbePoint], class_names: Sequence[str], *, classes: Sequence[str] | None = None,
                  max_vm_memory_mib: int | None = None) -> tuple[list[ProbePoint], list[tuple[ProbePoint, str]]]:
    """The points a user asked for: only `classes` (None: all of `class_names`, the policy's), only
    VMs of at most `max_vm_memory_mib`; (kept, [(left out, why)])."""
    if classes is not None:
        unknown = [name for name in classes if name not in class_names]
        if unknown or not classes:
            raise ProbeError(f"--classes: {', '.join(map(repr, unknown)) or 'no class'} is not a class of the policy "
                             f"(its classes: {', '.join(class_names)})")
    kept: list[ProbePoint] = []
    left_out: list[tuple[ProbePoint, str]] = []
    for point in points:
        if classes is not None and point.class_name not in classes:
            left_out.append((point, "its class is not in --classes"))
        elif max_vm_memory_mib is not None and point.vm.memory_mib > max_vm_memory_mib:
            left_out.append((point, f"above --max-vm-memory {max_vm_memory_mib} MiB"))
        else:
            kept.append(point)
    return kept, left_out


# --- the node's Kata configuration ------------------------------------------------------------


@dataclass(frozen=True)
class VmmPaths:
    """What a probe boots: the node's VMM and guest kernel (Kata's `[hypervisor.*] path` and
    `kernel`), the guest and devices its configuration gives the VM (Kata's shipped configuration's
    without one), and where they were read from."""

    vmm: str
    kernel: str
    hypervisor: str
    source: str
    kata: KataGuest = field(default_factory=KataGuest)


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


def vmm_paths(text: str, source: str, hypervisor: str, runtime: Runtime = Runtime.RUST) -> VmmPaths:
    """The VMM, kernel, guest and devices of `[hypervisor.<hypervisor>]` in a Kata configuration file
    (for `runtime`'s shim: the runtimes read some keys apart)."""
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
        problem = path_problem(value)
        if problem:
            raise ProbeError(f"{source}: [hypervisor.{hypervisor}] {key}: {problem}")
        found[key] = value
    try:
        kata = kata_guest(section, runtime, f"{source}: [hypervisor.{hypervisor}]")
    except KataConfigError as exc:
        raise ProbeError(str(exc)) from None
    for key, value in (("image", kata.image), ("initrd", kata.initrd), ("virtio_fs_daemon", kata.virtio_fs_daemon),
                       ("entropy_source", kata.entropy_source)):
        problem = None if value is None else path_problem(value)
        if problem:
            raise ProbeError(f"{source}: [hypervisor.{hypervisor}] {key}: {problem}")
    return VmmPaths(found["path"], found["kernel"], hypervisor, source, kata)


# Linux's PATH_MAX: no path the kernel opens is longer.
MAX_PATH_CHARS = 4096
# What may not be in a path the probe passes on or prints: C0 and C1 control characters (a line
# break would forge a line of the CSV or of a message), DEL, and Unicode's line separators.
_UNPRINTABLE_PATH = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def path_problem(text: str) -> str | None:
    """Why `text` is not a path the probe takes (empty, longer than PATH_MAX, a control character), or None."""
    if not text:
        return "is empty"
    if len(text) > MAX_PATH_CHARS:
        return f"{len(text)} characters is longer than {MAX_PATH_CHARS} (PATH_MAX)"
    bad = _UNPRINTABLE_PATH.search(text)
    if bad:
        return f"{text[:60]!r} holds the control character {bad.group()!r} (a path with it could forge a line of output)"
    return None


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


# Bounds on what the guest says (it is data, not trust): a console line is cut at MAX_LINE_BYTES
# (the init's longest report is a few hundred bytes), text quoted from a guest or a VMM at
# MAX_QUOTED_CHARS, at most MAX_REPORTED_PROBLEMS problems kept. A figure is a whole number
# of ASCII digits, at most 19 of them (2^63 - 1): `²` is a digit to str.isdigit and not to int.
MAX_LINE_BYTES = 4096
MAX_QUOTED_CHARS = 200
MAX_REPORTED_PROBLEMS = 5
_FIGURE = re.compile(r"[0-9]{1,19}", re.ASCII)
_PREFIX_BYTES = REPORT_PREFIX.encode()
_OUTCOME = re.compile(r"[a-z0-9-]{1,32}", re.ASCII)
# /proc/meminfo's figures free reads, each at most MemTotal.
MEMINFO_PARTS = ("MemFree", "MemAvailable", "Buffers", "Cached", "SReclaimable", "Shmem")


def quoted(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """Text from outside (a guest, a VMM's stderr) for one line of a message: at most `limit`
    characters, what does not print as its escape (bounded.printable)."""
    return printable(text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)")


@dataclass(frozen=True)
class GuestReport:
    """What the init said. Sizes in KiB as /proc/meminfo gives them; None: not said. `errors` are
    the init's own (`KSP error`), `malformed` the report lines that are not what the init writes,
    `notes` what it says that is not an error (a module that did not load). Of a Kata guest, the
    agent's resident memory once settled (`agent_settled`: it stayed the same for a second) and the
    first line it wrote; of a virtio-fs share, the bytes the workload read through it."""

    meminfo: dict[str, int] = field(default_factory=dict)
    held_mib: int | None = None
    outcome: str | None = None
    errors: tuple[str, ...] = ()
    said_hello: bool = False
    malformed: tuple[str, ...] = ()
    agent_rss_kib: int | None = None
    agent_settled: bool | None = None
    agent_said: str | None = None
    share_read_bytes: int | None = None
    notes: tuple[str, ...] = ()

    @property
    def free_total_mib(self) -> Decimal:
        return Decimal(self.meminfo["MemTotal"]) / 1024

    @property
    def free_used_mib(self) -> Decimal:
        """`free`'s `used`: total - free - buffers - cache (page cache and reclaimable slab)."""
        m = self.meminfo
        used = m["MemTotal"] - m["MemFree"] - m.get("Buffers", 0) - m.get("Cached", 0) - m.get("SReclaimable", 0)
        return Decimal(max(used, 0)) / 1024


class ConsoleReader:
    """The init's report, read from the guest's consoles as they grow: bytes in, in chunks of any
    size; only `KSP ` lines are kept (parsed), and of any line at most MAX_LINE_BYTES, so what the
    reader holds is bounded whatever the guest prints. Every console carries the same report (the
    init writes each line to each), so they feed one report; a line is split per console."""

    def __init__(self) -> None:
        self._partial: dict[str, bytearray] = {}
        self._meminfo: dict[str, int] = {}
        self._held: int | None = None
        self._outcome: str | None = None
        self._hello = False
        self._errors: list[str] = []
        self._malformed: list[str] = []
        self._notes: list[str] = []
        self._agent: tuple[int | None, bool | None, str | None] = (None, None, None)
        self._share_read: int | None = None

    def feed(self, data: bytes, console: str = "") -> None:
        partial = self._partial.setdefault(console, bytearray())
        first = data.find(b"\n")
        if first < 0:
            partial += data[:max(0, MAX_LINE_BYTES - len(partial))]
            return
        partial += data[:min(first, max(0, MAX_LINE_BYTES - len(partial)))]
        self._line(bytes(partial))
        partial.clear()
        # The whole lines after the first: only those holding a report are looked at (a guest
        # printing 200 MiB of kernel messages costs a search, not a line each).
        last = data.rfind(b"\n")
        at = data.find(_PREFIX_BYTES, first + 1, last)
        while at >= 0:
            start = data.rfind(b"\n", 0, at) + 1
            end = data.find(b"\n", at)
            self._line(data[start:min(end, start + MAX_LINE_BYTES)])
            at = data.find(_PREFIX_BYTES, end + 1, last)
        partial += data[last + 1:last + 1 + MAX_LINE_BYTES]

    def end(self, console: str = "") -> None:
        """The console will say no more: its last line counts even without a line break."""
        partial = self._partial.pop(console, None)
        if partial:
            self._line(bytes(partial))

    def report(self) -> GuestReport:
        return GuestReport(dict(self._meminfo), self._held, self._outcome, tuple(self._errors), self._hello,
                           tuple(self._malformed), *self._agent, self._share_read, tuple(self._notes))

    def _problem(self, into: list[str], text: str) -> None:
        text = quoted(text)
        if text not in into and len(into) < MAX_REPORTED_PROBLEMS:
            into.append(text)

    def _figure(self, what: str, key: str, value: str) -> int | None:
        if _FIGURE.fullmatch(value):
            return int(value)
        self._problem(self._malformed, f"{what} {key}={value[:40]!r} is not a whole number (ASCII digits, at most 19)")
        return None

    def _line(self, raw_bytes: bytes) -> None:
        raw = raw_bytes.decode("utf-8", errors="replace")
        at = raw.find(REPORT_PREFIX)
        if at < 0:
            return
        words = raw[at + len(REPORT_PREFIX):].split()
        if not words:
            return
        what, pairs = words[0], dict(w.split("=", 1) for w in words[1:] if "=" in w)
        if what == "hello":
            self._hello = True
        elif what == "meminfo" and pairs.get("stage") == "boot":
            figures = {k: self._figure("meminfo", k, v) for k, v in pairs.items() if k != "stage"}
            self._meminfo = {k: v for k, v in figures.items() if v is not None}
        elif what == "progress" and self._outcome is None and "held" in pairs:
            self._held = self._figure("progress", "held", pairs["held"])
        elif what == "done":
            if "held" in pairs:
                self._held = self._figure("done", "held", pairs["held"])
            outcome = pairs.get("outcome", "")
            if _OUTCOME.fullmatch(outcome):
                self._outcome = outcome
            else:
                self._problem(self._malformed, f"done outcome={outcome[:40]!r} is not an outcome the init reports")
        elif what == "error":
            self._problem(self._errors, " ".join(words[1:]))
        elif what == "note":
            self._problem(self._notes, " ".join(words[1:]))
        elif what == "agent" and "rss_kib" in pairs:
            settled = {"yes": True, "no": False}.get(pairs.get("settled", ""))
            if settled is None:
                self._problem(self._malformed, f"agent settled={pairs.get('settled', '')[:40]!r} is not yes or no")
            self._agent = (self._figure("agent", "rss_kib", pairs["rss_kib"]), settled, self._agent[2])
        elif what == "agent-said":
            self._agent = (*self._agent[:2], quoted(" ".join(words[1:])))
        elif what == "share" and "read" in pairs:
            self._share_read = self._figure("share", "read", pairs["read"])


def parse_console(text: str) -> GuestReport:
    """The init's report from the console output (kernel messages and firmware noise between)."""
    reader = ConsoleReader()
    reader.feed(text.encode("utf-8", errors="replace"))
    reader.end()
    return reader.report()


def report_problem(report: GuestReport, vm: Vm | None = None, boot: GuestBoot | None = None) -> str | None:
    """Why a report cannot give a row, or None; with the VM it came from, a figure no guest of that
    VM can report (MemTotal beyond the VM, a part beyond MemTotal, an allocation beyond the VM) is one,
    and with what it booted, a Kata guest that did not say its agent ran or a share it did not read."""
    if not report.said_hello:
        return "the guest never reported (no init output on its consoles)"
    if report.malformed:
        return "the guest's report is malformed: " + "; ".join(report.malformed)
    if report.errors:
        return "the guest's init failed: " + "; ".join(report.errors)
    if "MemTotal" not in report.meminfo or "MemFree" not in report.meminfo:
        return "the guest did not report its memory"
    total_kib = report.meminfo["MemTotal"]
    if vm is not None and total_kib > vm.memory_mib * 1024:
        return (f"the guest reported MemTotal {total_kib} kB, more than its VM's {vm.memory_mib} MiB "
                f"({vm.memory_mib * 1024} kB)")
    beyond = [f"{part} {report.meminfo[part]} kB" for part in MEMINFO_PARTS
              if report.meminfo.get(part, 0) > total_kib]
    if beyond:
        return f"the guest reported {', '.join(beyond)}, more than its MemTotal {total_kib} kB"
    if vm is not None and report.held_mib is not None and report.held_mib > vm.memory_mib:
        return f"the guest reported holding {report.held_mib} MiB, more than its VM's {vm.memory_mib} MiB"
    if report.agent_rss_kib is not None and report.agent_rss_kib > total_kib:
        return f"the guest reported its agent holding {report.agent_rss_kib} kB, more than its MemTotal {total_kib} kB"
    if boot is not None and boot.kata.guest_kind != "kernel-only" and report.agent_rss_kib is None:
        return "the guest did not report its Kata agent running: its memory would not be in the row's used"
    if boot is not None and boot.virtio_fs_socket is not None and report.share_read_bytes is None and \
            report.outcome is not None:
        return "the guest's workload did not report reading through the virtio-fs share"
    if report.outcome is None:
        return "the guest's workload never finished"
    return None


@dataclass(frozen=True)
class HostFigures:
    """The VM on the host, bytes: the VMM's peak resident memory (VmHWM) and its cgroup's peak charge;
    under TCG, what of QEMU's translation cache was resident when the cgroup held the most (sampled
    with it); the virtio-fs daemon's peak resident memory (its processes' largest VmHWM)."""

    vmm_peak_resident_bytes: int | None = None
    cgroup_peak_bytes: int | None = None
    tcg_cache_resident_bytes: int | None = None
    virtiofsd_peak_resident_bytes: int | None = None


# What every probe VM has besides Kata's devices (vm_command): its consoles on the ISA serial port and
# virtio-serial (calibrate.KIND_COLUMNS).
CONSOLE_DEVICES = ("serial", "virtio-console")
# QEMU's translation cache under TCG (MiB): in the VMM's host side, absent under KVM; the probe measures
# what of it is resident (tcg_cache_resident_bytes) so calibrate can take it off.
TCG_TB_SIZE_MIB = 64


def row_kinds(boot: GuestBoot | None) -> tuple[str, str, str]:
    """(guest, host_processes, devices) of a row (calibrate.KIND_COLUMNS) for what a VM booted."""
    found = set(CONSOLE_DEVICES) | set(boot.devices if boot is not None else ())
    devices = "+".join(d for d in DEVICES if d in found)
    if boot is None:
        return "kernel-only", "vmm", devices
    return boot.kata.guest_kind, "vmm+virtiofsd" if boot.virtio_fs_socket is not None else "vmm", devices


def probe_row(point: ProbePoint, report: GuestReport, host: HostFigures, node: str | None,
              accelerator: str, boot: GuestBoot | None = None) -> Sample:
    """One survey row: the guest's `free` figures, what its workload got, the VMM's charge, and what
    was measured (the accelerator, TCG's translation cache, the guest, the host processes, the devices).

    The cgroup's peak is the row's pod cgroup figure only once the VM was fully resident (its
    workload touched all it could): below the VM's size it says nothing of the host side."""
    charged = host.cgroup_peak_bytes
    if charged is not None and charged < point.vm.memory_mib * MIB:
        charged = None
    guest, host_processes, devices = row_kinds(boot)
    tcg = accelerator == "tcg"
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
        tcg_tb_size_mib=TCG_TB_SIZE_MIB if tcg else None,
        tcg_cache_resident_bytes=host.tcg_cache_resident_bytes if tcg and charged is not None else None,
        guest=guest,
        host_processes=host_processes,
        devices=devices,
    )


def describe_row(point: ProbePoint, report: GuestReport, host: HostFigures, accelerator: str) -> str:
    """One line for a person: the VM and what it showed."""
    mib = lambda b: f"{b / MIB:.0f} MiB" if b is not None else "not read"  # noqa: E731
    agent = "" if report.agent_rss_kib is None else (
        f"; its agent held {report.agent_rss_kib / 1024:.1f} MiB{'' if report.agent_settled else ' (not settled)'}")
    shared = "" if report.share_read_bytes is None else \
        f"; it read {report.share_read_bytes / MIB:.0f} MiB through virtio-fs"
    cache = "" if host.tcg_cache_resident_bytes is None else \
        f", of which TCG's translation cache {mib(host.tcg_cache_resident_bytes)}"
    daemon = "" if host.virtiofsd_peak_resident_bytes is None else \
        f"; virtiofsd peak resident {mib(host.virtiofsd_peak_resident_bytes)}"
    return (f"class {point.class_name}: VM {point.vm.memory_mib} MiB, {point.vm.vcpus} vCPU ({accelerator}): "
            f"MemTotal {report.free_total_mib:.1f} MiB, used {report.free_used_mib:.1f} MiB{agent}, the workload got "
            f"{report.held_mib} MiB ({report.outcome}){shared}; VMM peak resident {mib(host.vmm_peak_resident_bytes)}"
            f"{daemon}; cgroup peak {mib(host.cgroup_peak_bytes)}{cache}")


def vm_command(paths: VmmPaths, vm: Vm, *, accelerator: str, memory_dir: str, initramfs_path: str,
               command_line: str, console_path: str | None, boot: GuestBoot | None = None) -> list[str]:
    """QEMU's command line for a VM as Kata's QEMU places its memory: a file-backed, shared
    memory backend in `memory_dir` (Kata's virtio-fs setup, on /dev/shm), one NUMA node. The
    guest's consoles go to `console_path` (ttyS0) and `console_path`.hvc (hvc0, virtio); without
    one, ttyS0 goes to QEMU's standard output (a container's log). With `boot`, the memory hotplug
    region, the devices and the kernel parameters Kata's runtime gives it (kataguest). Every path given
    to QEMU's option grammar is escaped (qemu_option_value)."""
    accel = "kvm" if accelerator == "kvm" else f"tcg,tb-size={TCG_TB_SIZE_MIB}"
    value = qemu_option_value
    return [
        paths.vmm, "-accel", accel, "-machine", machine_options(boot), "-m", memory_option(vm.memory_mib, boot),
        "-smp", str(vm.vcpus),
        "-object", f"memory-backend-file,id=mem,size={vm.memory_mib}M,mem-path={value(memory_dir)},share=on",
        "-numa", "node,memdev=mem", "-nodefaults", "-nographic", "-no-reboot",
        *(["-chardev", f"file,id=ksp-ttys0,path={value(console_path)}", "-serial", "chardev:ksp-ttys0",
           "-device", "virtio-serial-pci,id=ksp-serial",
           "-chardev", f"file,id=ksp-hvc,path={value(console_path + HVC_SUFFIX)}",
           "-device", "virtconsole,chardev=ksp-hvc"] if console_path else ["-serial", "stdio"]),
        *(device_arguments(boot) if boot is not None else []),
        # -kernel, -initrd and -append take their whole argument as it is (no option grammar).
        "-kernel", paths.kernel, "-initrd", initramfs_path, "-append", " ".join([*guest_params(boot), command_line]),
    ]
