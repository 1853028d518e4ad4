"""The host side of `kata-sizing probe`, pure (docs/probe.md): what a host can give a VM before it
boots (its available memory, the memory directory's free space, the memory limits over the
probe's cgroup as the kernel applies them), the plan printed before any boot, and the name of what
ended a VM that gave no row. `kata_sizing.vm` reads the files; here their text becomes figures.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from .probe import ProbePoint, quoted
from .quantity import MIB
from .sizing import Vm

# What one VM costs the host beyond its guest memory and what its workload reads through virtio-fs: QEMU
# with Kata's devices and, under TCG, its translation cache (tb-size=64), virtiofsd, the page cache of the
# workload's binary and of Kata's image. The largest seen (docs/probe.md, figures) was 128 MiB under TCG;
# KVM has no translation cache.
VMM_MARGIN_MIB = 176
# The probe's own process (its peak resident memory while a guest floods its console, `make
# bench` section probe), for the memory limit of a container that runs it.
PROBE_MEMORY_MIB = 128
# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages):
# a limit this large limits nothing.
NO_LIMIT_BYTES = 2**62
# How long a VM takes, for the plan's estimate: a boot to the init's report, and the workload
# touching each GiB of the guest. TCG's measured on 2 cores with other work running (docs/probe.md:
# 4.5 s for 200 MiB, 9 s for 1.3 GiB, 11 s for 2.5 GiB), rounded up; KVM's not measured (no KVM
# guest runs where the project is tested), a guess from a KVM guest reaching its init in under a second.
BOOT_S = {"tcg": 6.0, "kvm": 2.0}
TOUCH_S_PER_GIB = {"tcg": 4.0, "kvm": 1.0}
# The KVM check of `--accel auto`: a small VM booted first (kata_sizing.vm.KVM_CHECK_S at most).
KVM_CHECK_MIB = 128
SIGBUS = int(signal.SIGBUS)
SIGKILL = int(signal.SIGKILL)


# --- cgroup files, as text ------------------------------------------------------------------------


def own_cgroup(proc_self_cgroup: str, v2: bool) -> str | None:
    """The path of this process's memory cgroup from /proc/self/cgroup: the `0::` line on a v2
    (unified) host, the line naming the `memory` controller on a v1 one; None when there is none."""
    for line in proc_self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if (v2 and parts[0] == "0" and controllers == "") or (not v2 and "memory" in controllers.split(",")):
            return path
    return None


def keyed_counts(text: str) -> dict[str, int]:
    """A flat-keyed cgroup file (memory.stat, memory.events, v1's memory.oom_control): `key value`
    lines; a line that is not one is skipped."""
    counts = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[1].isascii() and words[1].isdigit():
            counts[words[0]] = int(words[1])
    return counts


def limit_bytes(text: str) -> int | None:
    """A memory limit (v2 memory.max, v1 memory.limit_in_bytes); None: no limit ("max", or v1's
    largest count), or not a number."""
    value = text.strip()
    if not (value.isascii() and value.isdigit()):
        return None
    number = int(value)
    return None if number >= NO_LIMIT_BYTES else number


_MAPPING = re.compile(r"[0-9a-f]+-[0-9a-f]+ ([-r][-w][-x][ps]) \S+ \S+ \S+ *(.*)", re.ASCII)


def tcg_cache_resident_bytes(smaps: str) -> int | None:
    """What of QEMU's translation cache is resident, from /proc/PID/smaps of a VMM under TCG: its code
    buffer is the process's anonymous mappings that are writable and executable (QEMU's tcg/region.c
    allocates it PROT_READ|PROT_WRITE|PROT_EXEC and splits it by guard pages into one mapping per
    region), or, where QEMU keeps the writable and executable views apart (split-wx), the executable
    view of its memfd `tcg-jit`. None: no such mapping (not a TCG VMM)."""
    total, found, counting = 0, False, False
    for line in smaps.splitlines():
        mapping = _MAPPING.fullmatch(line)
        if mapping:
            perms, name = mapping.groups()
            counting = (perms == "rwxp" and not name) or (name.startswith("/memfd:tcg-jit") and perms[2] == "x")
            found = found or counting
        elif counting and line.startswith("Rss:"):
            words = line.split()
            if len(words) == 3 and words[1].isascii() and words[1].isdigit():
                total += int(words[1]) * 1024
    return total if found else None


@dataclass(frozen=True)
class CgroupLevel:
    """One memory cgroup from the probe's own up to the hierarchy's root: its limit, and what it
    holds that cannot be reclaimed (usage less inactive file pages: the kubelet's working set)."""

    path: str
    limit_bytes: int | None
    usage_bytes: int
    inactive_file_bytes: int
    limit_file: str  # memory.max (v2) or memory.limit_in_bytes (v1)
    # Times its limit was hit: v1 memory.failcnt, v2 memory.events `max` (None: not read).
    limit_hits: int | None = None

    @property
    def working_set_bytes(self) -> int:
        return self.usage_bytes - min(self.usage_bytes, self.inactive_file_bytes)

    @property
    def headroom_bytes(self) -> int | None:
        return None if self.limit_bytes is None else self.limit_bytes - self.working_set_bytes

    def describe(self) -> str:
        assert self.limit_bytes is not None
        return (f"{self.limit_bytes // MIB} MiB ({self.limit_file} of {quoted(self.path)}, "
                f"{self.working_set_bytes // MIB} MiB in use)")


def tightest_limit(levels: Sequence[CgroupLevel]) -> CgroupLevel | None:
    """The level whose limit leaves the least room: the kernel charges a page to every level up to
    the root, so a VM below all of them has at most the least of their headrooms."""
    limited = [level for level in levels if level.headroom_bytes is not None]
    return min(limited, key=lambda level: level.headroom_bytes or 0) if limited else None


# --- what a VM needs, and what the host gives ----------------------------------------------------------


@dataclass(frozen=True)
class HostRoom:
    """What this host can give a VM now. None: not read (and `notes` say why)."""

    mem_available_bytes: int | None
    memory_dir: str
    memory_dir_free_bytes: int | None
    memory_dir_size_bytes: int | None
    cgroup_levels: tuple[CgroupLevel, ...] = ()
    notes: tuple[str, ...] = ()
    host_cpus: int | None = None

    @property
    def cgroup_limit(self) -> CgroupLevel | None:
        return tightest_limit(self.cgroup_levels)

    def describe(self) -> str:
        mib = lambda b: "not read" if b is None else f"{b // MIB} MiB"  # noqa: E731
        limit = self.cgroup_limit
        return (f"MemAvailable {mib(self.mem_available_bytes)}; {quoted(self.memory_dir)} "
                f"{mib(self.memory_dir_free_bytes)} free of {mib(self.memory_dir_size_bytes)}; the memory limit over "
                f"the probe: {limit.describe() if limit else 'none'}")


def vm_need_mib(vm: Vm, read_mib: int = 0) -> int:
    """The host memory one VM needs once its guest has touched all it has: the guest's memory, its VMM and
    virtiofsd, and the page cache of the `read_mib` its workload reads through virtio-fs."""
    return vm.memory_mib + VMM_MARGIN_MIB + read_mib


def fit_problem(point: ProbePoint, room: HostRoom, read_mib: int = 0) -> str | None:
    """Why `point`'s VM cannot run on this host now (one line naming the class, the VM and the
    limit), or None. The guest memory file in the memory directory holds the whole VM once the
    guest has touched it; the host's available memory and every cgroup limit over the probe must
    hold that and the VMM (vm_need_mib)."""
    vm = point.vm
    what = f"class {point.class_name}: the VM of {vm.memory_mib} MiB ({vm.vcpus} vCPU)"
    need = vm_need_mib(vm, read_mib)
    if room.memory_dir_free_bytes is not None and vm.memory_mib * MIB > room.memory_dir_free_bytes:
        return (f"{what} does not fit the memory directory {quoted(room.memory_dir)} (its guest would die of SIGBUS): "
                f"{room.memory_dir_free_bytes // MIB} MiB free of {(room.memory_dir_size_bytes or 0) // MIB} MiB "
                "(statvfs)")
    if room.mem_available_bytes is not None and need * MIB > room.mem_available_bytes:
        return (f"{what} needs {need} MiB with its VMM, more than the host's MemAvailable "
                f"{room.mem_available_bytes // MIB} MiB (/proc/meminfo)")
    limit = room.cgroup_limit
    if limit is not None and need * MIB > (limit.headroom_bytes or 0):
        return f"{what} needs {need} MiB with its VMM, more than the memory limit over the probe leaves: {limit.describe()}"
    return None


# --- the plan ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbePlan:
    """The VMs a probe boots, one at a time, and those it was asked to leave out."""

    points: tuple[ProbePoint, ...]
    left_out: tuple[tuple[ProbePoint, str], ...] = ()
    read_mib: int = 0  # what each workload reads through virtio-fs (--share-read)

    @property
    def largest(self) -> Vm:
        return max((p.vm for p in self.points), key=lambda vm: vm.memory_mib)

    @property
    def container_memory_mib(self) -> int:
        """The memory limit a container running this probe needs: its largest VM with the VMM,
        and the probe itself (the VMs run one at a time)."""
        return vm_need_mib(self.largest, self.read_mib) + PROBE_MEMORY_MIB

    def seconds(self, accelerator: str) -> float:
        return sum(BOOT_S[accelerator] + p.vm.memory_mib / 1024 * TOUCH_S_PER_GIB[accelerator] for p in self.points)

    def lines(self, policy_name: str, accelerator: str, why: str, room: HostRoom) -> list[str]:
        """The plan for a person (stderr, and `--plan`)."""
        lines = [f"plan: {len(self.points)} VM(s) of policy {policy_name}, one at a time, under {accelerator} ({why})"]
        for name in dict.fromkeys(p.class_name for p in self.points):
            vms = [p.vm for p in self.points if p.class_name == name]
            lines.append(f"  class {name}: {len(vms)} VM(s) of {', '.join(str(vm.memory_mib) for vm in vms)} MiB "
                         f"({'/'.join(dict.fromkeys(str(vm.vcpus) for vm in vms))} vCPU)")
        for name in dict.fromkeys(p.class_name for p, _ in self.left_out):
            left = [(p, why) for p, why in self.left_out if p.class_name == name]
            reasons = "; ".join(dict.fromkeys(why for _, why in left))
            lines.append(f"  left out: class {name}: {', '.join(str(p.vm.memory_mib) for p, _ in left)} MiB ({reasons})")
        largest = self.largest
        total = sum(p.vm.memory_mib for p in self.points)
        lines.append(f"  guest memory {total} MiB in all, at most {largest.memory_mib} MiB at once "
                     f"({vm_need_mib(largest, self.read_mib)} MiB with its VMM); a container running this probe needs a memory "
                     f"limit of at least {self.container_memory_mib} MiB")
        seconds = self.seconds(accelerator)
        took = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
        lines.append(f"  about {took} under {accelerator} ({BOOT_S[accelerator]:g} s a boot, "
                     f"{TOUCH_S_PER_GIB[accelerator]:g} s a GiB the guest touches)")
        lines.append(f"  room now: {room.describe()}")
        vcpus = max(p.vm.vcpus for p in self.points)
        if room.host_cpus is not None and vcpus > room.host_cpus:
            lines.append(f"  note: VMs of up to {vcpus} vCPUs on a host of {room.host_cpus} CPUs: they boot, and take "
                         "longer than the estimate")
        lines.extend(f"  note: {note}" for note in room.notes)
        return lines


# --- what ended a VM -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VmEnd:
    """How a VM ended, as the host saw it. `exit_code`: the VMM's (negative: the signal that killed
    it), None when the probe stopped it; `oom_kills`: its cgroup's OOM kill count (None: not read)."""

    exit_code: int | None
    timed_out: bool = False
    seconds: float = 0.0
    oom_kills: int | None = None
    limit: CgroupLevel | None = None
    memory_dir_free_bytes: int | None = None
    memory_dir_size_bytes: int | None = None
    stderr_line: str | None = None
    stopped_because: str | None = None  # the probe stopped it for this (a console flood)
    limit_hits: int | None = None  # times `limit` was hit while the VM ran


def _signal_of(exit_code: int | None) -> int | None:
    """The signal that ended the VMM: a negative exit code (Popen's), or 128 + N from a shell that
    ran it without exec (a wrapper script)."""
    if exit_code is None:
        return None
    if exit_code < 0:
        return -exit_code
    if 128 < exit_code < 128 + 65:
        return exit_code - 128
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def failure(point: ProbePoint, memory_dir: str, end: VmEnd, problem: str | None, read_mib: int = 0) -> str | None:
    """Why a VM gave no row, named (an OOM kill, SIGBUS, a timeout, the VMM's exit), or None when it
    gave one. `problem` is report_problem's verdict on what the guest said."""
    vm = point.vm
    need = vm_need_mib(vm, read_mib)
    if end.oom_kills:
        limit = end.limit
        over = (f"the memory limit over it is {limit.describe()}" if limit is not None
                else "no cgroup limit over it: the host itself ran out")
        return (f"OOM-killed: the kernel killed {end.oom_kills} process(es) of its memory cgroup (oom_kill "
                f"{end.oom_kills}); the VM of {vm.memory_mib} MiB needs about {need} MiB with its VMM, "
                f"{over}")
    number = _signal_of(end.exit_code)
    if end.oom_kills is None and number == SIGKILL and end.limit_hits and end.limit is not None:
        return (f"killed by SIGKILL after the memory limit over it was hit {end.limit_hits} time(s): most likely the "
                f"OOM killer (this kernel keeps no OOM kill count); the VM of {vm.memory_mib} MiB needs about "
                f"{need} MiB with its VMM, the limit is {end.limit.describe()}")
    if number == SIGBUS:
        size = "" if end.memory_dir_size_bytes is None else (
            f": a filesystem of {end.memory_dir_size_bytes // MIB} MiB, {(end.memory_dir_free_bytes or 0) // MIB} MiB "
            "free after the VM")
        return (f"SIGBUS: the VMM died of signal 7 (exit {end.exit_code}): the guest touched memory its file in "
                f"{quoted(memory_dir)} could not get{size}; the VM needs {vm.memory_mib} MiB there. A memory "
                "directory (/dev/shm on a Kata node) too small for the VMs on it kills them this way: size it with "
                "`kata-sizing render --node-capacity` (docs/probe.md)")
    if end.stopped_because:
        return f"stopped: {end.stopped_because}"
    if end.timed_out:
        return f"timed out after {end.seconds:.0f} s ({problem or 'the guest had not powered off'})"
    if end.exit_code not in (0, None):
        said = f": {quoted(end.stderr_line)}" if end.stderr_line else ""
        how = f"was killed by {_signal_name(number)}" if number is not None else f"exited with {end.exit_code}"
        return f"the VMM {how}{said}" + (f" ({problem})" if problem and "never reported" not in problem else "")
    return problem
