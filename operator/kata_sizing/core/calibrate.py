"""Fit Kata's guest overhead as a function of VM size from measured survey rows.

A survey row is one sandbox (docs/sizing-model.md). Measured by hand from inside and outside:
inside the guest, `free -m` gives `total` (what the kernel left to userland) and `used`
(the guest daemons); on the host, the pod cgroup's `memory.current` covers the VM plus
the shim and VMM. From these:

- unusable (MiB) = vm_nominal - free_total + free_used: memory a container cannot have;
- host (MiB)     = memory.current / MiB - vm_nominal, once the VM is fully resident
  (memory.current >= vm_nominal: the guest has touched all of its memory).

Measured from the host only (`kata-sizing survey`: the kubelet's Summary, docs/measurement.md),
a row has no `free` split; it has the pod cgroup's working set and its containers':

- overhead used (MiB) = pod working set - containers' working sets: what the pod holds
  beyond its workload, i.e. the VM's non-workload pages that are resident plus the host side.

Such a row gives the host side when its VM is fully resident, and nothing about the guest's
split then (all of the VM is resident whatever the guest keeps). When the VM is not fully
resident its overhead used, less the host side, stands in for the unusable memory: pages the
guest never touched are not in it, page cache it holds is; docs/measurement.md says what this
can and cannot tell.

Each row also says what it measured (docs/sizing-model.md, "What each row saw"): the accelerator
its VM ran under (and TCG's translation cache), the guest it booted (a real Kata pod's, Kata's image or
initrd with its agent, or a kernel only) and the host processes its host figure counts (a whole Kata
pod, or the VMM with or without virtiofsd). A pod's memory is taken as five parts, the guest kernel,
the guest userland (agent, daemons), the VMM, virtiofsd and the shim; a row stands for the parts it saw
and a stated default (defaults.py) stands in for each part it did not. A row without these columns is
what the published survey measured: a real Kata pod, `free -m` inside and the pod cgroup outside.

`fit_overhead` fits unusable(V) = base + ratio * V as an upper envelope: every sample is
covered, because the fit becomes a budget and an uncovered sample is a pod that gets
OOM-killed. Among covering lines it takes the one with the least total over-coverage.

Everything is exact (`Fraction` inside, `Decimal`/`int` outside): the results are pasted
into a policy, and a float that rounds 0.14 to 0.13999999 would under-size a class.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from enum import Enum
from fractions import Fraction

from kata_sizing.core import defaults
from kata_sizing.core.kubegrammar import UINT64_MAX, name_problem
from kata_sizing.core.quantity import MIB

__all__ = [
    "MAX_RATIO",
    "CalibrationError",
    "Fit",
    "Part",
    "PartSource",
    "Sample",
    "fit_overhead",
    "parse_samples_csv",
]

MAX_RATIO = defaults.MAX_GUEST_MEMORY_RATIO  # 0.9: defaults.py says why
RATIO_PLACES = 4

_COLUMNS = (
    "container_limit_mib",
    "vm_nominal_mib",
    "free_total_mib",
    "free_used_mib",
    "pod_cgroup_memory_current_bytes",
)
# Written by `kata-sizing survey`: the kubelet's figures (bytes) and where a row came from.
HOST_COLUMNS = (
    "pod_working_set_bytes",
    "containers_working_set_bytes",
    "pod_cgroup_limit_bytes",
)
TEXT_COLUMNS = ("node", "pod", "class")
# What a row measured (docs/sizing-model.md, "What each row saw"); each a word of the grammar below. An
# empty cell, or no such column, means what the published survey measured: a real Kata pod.
KIND_COLUMNS = ("accelerator", "guest", "host_processes", "devices")
# A tcg row's translation cache: its size (QEMU's tb-size, MiB) and, when measured apart, its resident bytes.
TCG_COLUMNS = ("tcg_tb_size_mib", "tcg_cache_resident_bytes")
# Written by `kata-sizing probe` (docs/probe.md): what a workload in the guest could allocate and
# touch before the guest refused it (MiB), and the VMM's peak resident memory on the host (bytes).
PROBE_COLUMNS = ("workload_allocated_mib", "vmm_peak_resident_bytes", *TCG_COLUMNS)
_KNOWN = (*TEXT_COLUMNS, *KIND_COLUMNS, *_COLUMNS, *HOST_COLUMNS, *PROBE_COLUMNS)
# Required in the header; a row then needs either the guest's figures (free_*) or the
# kubelet's (the two working sets), see _row_rules.
_REQUIRED = ("container_limit_mib", "vm_nominal_mib")
_GUEST = ("free_total_mib", "free_used_mib")
_KUBELET = ("pod_working_set_bytes", "containers_working_set_bytes")
# Header spellings after _normalise_header: the canonical names, the same without the
# unit suffix, and the wording of the survey table in docs/sizing-model.md.
_ALIASES = {
    "container_limit_mib": "container_limit_mib",
    "container_limit": "container_limit_mib",
    "vm_nominal_mib": "vm_nominal_mib",
    "vm_nominal": "vm_nominal_mib",
    "free_total_mib": "free_total_mib",
    "free_total": "free_total_mib",
    "free_used_mib": "free_used_mib",
    "free_used": "free_used_mib",
    "pod_cgroup_memory_current_bytes": "pod_cgroup_memory_current_bytes",
    "pod_cgroup_memory_current": "pod_cgroup_memory_current_bytes",
    **{name: name for name in (*HOST_COLUMNS, *TEXT_COLUMNS, *KIND_COLUMNS, *PROBE_COLUMNS)},
    "class_name": "class",
}


class Part(str, Enum):
    """A part of a Kata pod's memory (docs/sizing-model.md, "What each row saw")."""

    GUEST_KERNEL = "guest kernel"
    GUEST_USERLAND = "guest userland"  # kata-agent, guest daemons, a rootfs in memory
    VMM = "VMM"
    VIRTIOFSD = "virtiofsd"
    SHIM = "shim"


HOST_PARTS = (Part.VMM, Part.VIRTIOFSD, Part.SHIM)
# What stands in for a part a row did not see, and where that figure comes from (defaults.py). The
# guest kernel and the VMM have none: a fit needs rows that saw them.
ASSUMED_PARTS: dict[Part, tuple[int, str]] = {
    Part.GUEST_USERLAND: (defaults.GUEST_USERLAND_MIB, defaults.GUEST_USERLAND_SOURCE),
    Part.VIRTIOFSD: (defaults.VIRTIOFSD_MIB, defaults.VIRTIOFSD_SOURCE),
    Part.SHIM: (defaults.SHIM_MIB, defaults.SHIM_SOURCE),
}

# The grammar of the kind columns. A Kata pod runs its VM under KVM: Kata needs hardware virtualization.
ACCELERATORS = ("kvm", "tcg")
# kata-pod: a real Kata pod's guest (survey, or `free -m` by hand); kata-image / kata-initrd: the node's
# Kata guest image or initrd booted by the probe with its agent started; kernel-only: the node's guest
# kernel with the probe's own init, no agent and no daemons.
KATA_POD = "kata-pod"
GUESTS = (KATA_POD, "kata-image", "kata-initrd", "kernel-only")
KERNEL_ONLY = "kernel-only"
# The host processes a row's host figure counts, as the parts of the pod they are: a Kata pod's cgroup
# holds its shim, VMM and virtiofsd with sandbox_cgroup_only = true, none of them with false.
HOST_PROCESSES: dict[str, tuple[Part, ...]] = {
    KATA_POD: HOST_PARTS, "vmm+virtiofsd": (Part.VMM, Part.VIRTIOFSD), "vmm": (Part.VMM,), "none": (),
}
PROBE_HOST_PROCESSES = ("vmm", "vmm+virtiofsd")
# A probe's VM lists its devices, '+' between (QEMU's: the ISA serial port, virtio-serial with a
# console, the disks Kata attaches an image or volumes as, vsock, virtio-rng, vhost-user-fs, a NIC);
# a Kata pod's row says `kata`: the devices Kata's configuration gave it.
DEVICES = ("serial", "virtio-console", "virtio-blk", "virtio-scsi", "nvdimm", "vsock", "rng", "virtio-fs",
           "virtio-net")
KATA_DEVICES = "kata"
MAX_KIND_CHARS = 160  # all of DEVICES joined is 83
# Bytes, and QEMU's tb-size (a whole number of MiB).
_WHOLE_COLUMNS = frozenset(c for c in (*_COLUMNS, *HOST_COLUMNS, *PROBE_COLUMNS) if c.endswith("_bytes")) | {
    "tcg_tb_size_mib"}
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
# Bounds on a survey file (docs/inputs.md): no measurement needs more digits or rows.
MAX_ROWS = 10_000
MAX_CELL_CHARS = 32
MAX_TEXT_CHARS = 320  # namespace/name: 63 + 1 + 253
MAX_LINE_CHARS = 1024
# What a kubelet and a policy can carry (docs/inputs.md): the Summary's figures are uint64 bytes, and
# a size in MiB must be a memory quantity the API server takes (at most 2^63 - 1 bytes).
MAX_BYTES = UINT64_MAX
MAX_MIB = (2**63 - 1) // MIB


class CalibrationError(ValueError):
    """Survey data that cannot be fitted; `problems` lists every problem found."""

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems: tuple[str, ...] = (
            (problems,) if isinstance(problems, str) else tuple(problems)
        )
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} problems in the survey:\n" + "\n".join(
                f"  {problem}" for problem in self.problems
            )
        super().__init__(message)


@dataclass(frozen=True)
class Sample:
    """One measured sandbox. Sizes in MiB, `*_bytes` in bytes; a figure not measured is None.

    A row has the guest's figures (free_total_mib and free_used_mib, measured by hand) or the
    kubelet's (pod_working_set_bytes and containers_working_set_bytes, from `survey`), or both.
    `line` is where the row came from, so fit errors can point back at the file; `node`, `pod`
    and `class_name` say which pod it was (a survey writes them). `accelerator`, `guest`,
    `host_processes` and `devices` say what it measured (KIND_COLUMNS): left empty, a real Kata pod's
    (kvm, kata-pod, kata-pod, kata), as the published survey measured; a probe's row gives all four."""

    container_limit_mib: Decimal
    vm_nominal_mib: Decimal
    free_total_mib: Decimal | None = None
    free_used_mib: Decimal | None = None
    pod_cgroup_memory_current_bytes: int | None = None
    line: int | None = field(default=None, compare=False)
    pod_working_set_bytes: int | None = None
    containers_working_set_bytes: int | None = None
    pod_cgroup_limit_bytes: int | None = None
    node: str | None = field(default=None, compare=False)
    pod: str | None = field(default=None, compare=False)
    class_name: str | None = None
    workload_allocated_mib: Decimal | None = None
    vmm_peak_resident_bytes: int | None = None
    accelerator: str = ""
    tcg_tb_size_mib: int | None = None
    tcg_cache_resident_bytes: int | None = None
    guest: str = ""
    host_processes: str = ""
    devices: str = ""

    def __post_init__(self) -> None:
        if not self.guest:
            object.__setattr__(self, "guest", KATA_POD)
        if self.guest == KATA_POD:
            for name, said in (("accelerator", "kvm"), ("host_processes", KATA_POD), ("devices", KATA_DEVICES)):
                if not getattr(self, name):
                    object.__setattr__(self, name, said)
        if self.workload_allocated_mib is not None:
            object.__setattr__(self, "workload_allocated_mib", Decimal(self.workload_allocated_mib))
        for name in _COLUMNS[:4]:
            value = getattr(self, name)
            if value is None and name in _GUEST:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
                raise TypeError(f"{name} must be an int or Decimal, not {value!r}")
            object.__setattr__(self, name, Decimal(value))
        for name in ("pod_cgroup_memory_current_bytes", *HOST_COLUMNS, "vmm_peak_resident_bytes", *TCG_COLUMNS):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an int, not {value!r}")
        for name in KIND_COLUMNS:
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a str, not {getattr(self, name)!r}")
        problems = _row_rules(self)
        if problems:
            where = "" if self.line is None else f"line {self.line}: "
            raise CalibrationError([where + problem for problem in problems])

    @property
    def measured_in_guest(self) -> bool:
        return self.free_total_mib is not None and self.free_used_mib is not None

    @property
    def measured_by_kubelet(self) -> bool:
        return self.pod_working_set_bytes is not None and self.containers_working_set_bytes is not None

    @property
    def unusable_mib(self) -> Fraction | None:
        """Memory of the VM that no container can use: the kernel's share plus daemons (only
        measured inside the guest). A probe's row also says what a workload really got before
        the guest refused it, which is less than `free` suggests by the kernel's free-memory
        reserve (its watermarks): the larger of the two is what the workload cannot have."""
        total, used = self.free_total_mib, self.free_used_mib
        if total is None or used is None:  # not measured in the guest
            return None
        by_free = Fraction(self.vm_nominal_mib - total + used)
        if self.workload_allocated_mib is None:
            return by_free
        return max(by_free, Fraction(self.vm_nominal_mib - self.workload_allocated_mib))

    @property
    def overhead_used_mib(self) -> Fraction | None:
        """What the pod cgroup holds beyond its containers (only from the kubelet)."""
        pod, containers = self.pod_working_set_bytes, self.containers_working_set_bytes
        if pod is None or containers is None:  # not measured by the kubelet
            return None
        return Fraction(pod - containers, MIB)

    @property
    def resident(self) -> bool:
        """The VM is fully resident: the pod cgroup holds at least the VM's nominal memory."""
        held = self.pod_cgroup_memory_current_bytes
        if held is None:
            held = self.pod_working_set_bytes
        return held is not None and held >= self.vm_nominal_mib * MIB

    @property
    def host_mib(self) -> Fraction | None:
        """The host processes the row counts (`host_processes`: a Kata pod's shim, VMM and virtiofsd,
        or a probe's VMM): what their cgroup holds beyond a fully resident VM."""
        held = self.pod_cgroup_memory_current_bytes
        if held is None:
            held = self.pod_working_set_bytes
        if held is None or not self.resident:
            return None
        return Fraction(held, MIB) - Fraction(self.vm_nominal_mib)

    @property
    def sees_guest_userland(self) -> bool:
        """The guest ran Kata's agent (and whatever else Kata's guest runs): its `used` holds them."""
        return self.guest != KERNEL_ONLY


_UPPER_BOUNDS = (
    *((name, MAX_MIB, "memory quantity, in MiB") for name in (*_COLUMNS[:4], "workload_allocated_mib")),
    *((name, MAX_BYTES, "figure a kubelet reports: uint64") for name in (_COLUMNS[4], *HOST_COLUMNS)),
    ("vmm_peak_resident_bytes", MAX_BYTES, "process's resident memory: uint64"),
    ("tcg_cache_resident_bytes", MAX_BYTES, "process's resident memory: uint64"),
    ("tcg_tb_size_mib", defaults.TCG_TB_SIZE_MAX_MIB, "translation cache QEMU takes, in MiB"),
)


def _row_rules(sample: Sample) -> list[str]:
    problems = [
        f"{name} {getattr(sample, name)} is negative"
        for name in (*_COLUMNS, *HOST_COLUMNS, *PROBE_COLUMNS)
        if getattr(sample, name) is not None and getattr(sample, name) < 0
    ]
    problems += [
        f"{name} {getattr(sample, name)} is above {limit} (the largest {what})"
        for name, limit, what in _UPPER_BOUNDS
        if getattr(sample, name) is not None and getattr(sample, name) > limit
    ]
    problems += _kind_rules(sample)
    if problems:
        return problems
    vm, total, used = sample.vm_nominal_mib, sample.free_total_mib, sample.free_used_mib
    if (total is None) != (used is None):
        problems.append("free_total_mib and free_used_mib go together: give both or neither")
    if (sample.pod_working_set_bytes is None) != (sample.containers_working_set_bytes is None):
        problems.append("pod_working_set_bytes and containers_working_set_bytes go together: give both or neither")
    if not problems and not sample.measured_in_guest and not sample.measured_by_kubelet:
        problems.append(
            "no measurement: give free_total_mib and free_used_mib (from `free -m` in the guest) or "
            "pod_working_set_bytes and containers_working_set_bytes (from the kubelet: kata-sizing survey)")
    if vm == 0:
        problems.append("vm_nominal_mib is 0; a VM has memory")
    if total is not None and total > vm:
        problems.append(f"free_total_mib {total} is larger than vm_nominal_mib {vm}")
    allocated = sample.workload_allocated_mib
    if allocated is not None and allocated > vm:
        problems.append(f"workload_allocated_mib {allocated} is larger than vm_nominal_mib {vm}")
    if used is not None and total is not None and used > total:
        problems.append(f"free_used_mib {used} is larger than free_total_mib {total}")
    if sample.container_limit_mib > vm:
        problems.append(
            f"container_limit_mib {sample.container_limit_mib} is larger than "
            f"vm_nominal_mib {vm}; both runtimes add the limit to the VM"
        )
    current = sample.pod_cgroup_memory_current_bytes
    # memory.current counts only resident pages; below the VM's size the guest had not
    # touched all of its memory yet, and the difference says nothing about the host side. A
    # row from the kubelet is kept: its overhead used still counts (see the module docstring).
    if current is not None and current < vm * MIB and not sample.measured_by_kubelet:
        problems.append(
            f"pod_cgroup_memory_current_bytes {current} is less than vm_nominal_mib {vm} "
            f"({vm * MIB} bytes): the VM was not fully resident; measure again after the "
            "guest has touched its memory, or leave the cell empty"
        )
    if not problems:
        problems += _host_rules(sample)
    return problems


def _kind_rules(sample: Sample) -> list[str]:
    """The kind columns' grammar, and which go together (docs/sizing-model.md, "What each row saw")."""
    problems = []
    guest, host, devices, accelerator = sample.guest, sample.host_processes, sample.devices, sample.accelerator
    if guest not in GUESTS:
        return [f"guest {guest[:MAX_KIND_CHARS]!r} is not one of {', '.join(GUESTS)}"]
    if guest == KATA_POD:
        if host in PROBE_HOST_PROCESSES or host not in HOST_PROCESSES:
            problems.append(f"host_processes {host[:MAX_KIND_CHARS]!r} does not go with guest kata-pod: a Kata pod's "
                            "cgroup counts kata-pod (its shim, VMM and virtiofsd) or none (sandbox_cgroup_only = false)")
        if devices != KATA_DEVICES:
            problems.append(f"devices {devices[:MAX_KIND_CHARS]!r} does not go with guest kata-pod: a Kata pod's row "
                            "says kata (the devices Kata's configuration gave it)")
        if accelerator != "kvm":
            problems.append(f"accelerator {accelerator[:MAX_KIND_CHARS]!r} does not go with guest kata-pod: Kata runs "
                            "its VMs under KVM (only a probe's VM runs under tcg)")
    else:
        if accelerator not in ACCELERATORS:
            problems.append(f"accelerator {accelerator[:MAX_KIND_CHARS]!r} is not kvm or tcg" if accelerator else
                            f"accelerator is empty: a probe's row (guest {guest}) says kvm or tcg")
        if host not in PROBE_HOST_PROCESSES:
            problems.append(f"host_processes {host[:MAX_KIND_CHARS]!r} does not go with guest {guest}: a probe's VM "
                            f"counts {' or '.join(PROBE_HOST_PROCESSES)}" if host else
                            f"host_processes is empty: a probe's row (guest {guest}) says "
                            f"{' or '.join(PROBE_HOST_PROCESSES)}")
        problem = _devices_problem(devices)
        if problem:
            problems.append(problem)
        if sample.pod_working_set_bytes is not None or sample.containers_working_set_bytes is not None:
            problems.append(f"the kubelet's columns come from a Kata pod, not a probe's VM (guest {guest})")
    tb_size, cache = sample.tcg_tb_size_mib, sample.tcg_cache_resident_bytes
    if accelerator == "tcg":
        if tb_size is None:
            problems.append("tcg_tb_size_mib is empty: a tcg row gives the size of its translation cache "
                            "(QEMU's -accel tcg,tb-size=N, in MiB)")
        elif tb_size == 0:
            problems.append("tcg_tb_size_mib 0 is QEMU's default (up to 1 GiB, an eighth of the host's memory), not "
                            "a size: give the tb-size the VM ran with")
    elif tb_size is not None or cache is not None:
        problems.append("tcg_tb_size_mib and tcg_cache_resident_bytes go with accelerator tcg only")
    return problems


def _devices_problem(devices: str) -> str | None:
    words = devices.split("+")
    unknown = [w for w in words if w not in DEVICES]
    if not devices:
        return "devices is empty: a probe's row lists its VM's devices"
    if devices == KATA_DEVICES:
        return "devices kata goes with guest kata-pod: a probe's row lists its VM's devices"
    if unknown:
        return (f"devices {devices[:MAX_KIND_CHARS]!r}: {unknown[0][:40]!r} is not a device of the grammar "
                f"({'+'.join(DEVICES)}, any of them joined by +)")
    if len(set(words)) < len(words):
        return f"devices {devices!r} names a device twice"
    return None


def _host_rules(sample: Sample) -> list[str]:
    """A host side is QEMU, virtiofsd and a shim: refused when it is beyond its VM (HOST_SIDE_FLOOR_MIB,
    defaults.py), and a translation cache cannot be more than the host side it is in."""
    host = sample.host_mib
    if host is None:
        return []
    problems = []
    cache = sample.tcg_cache_resident_bytes
    if cache is not None and Fraction(cache, MIB) > host:
        problems.append(f"tcg_cache_resident_bytes {cache} is more than the host side it is part of "
                        f"({_decimal(host * MIB):.0f} bytes beyond the VM)")
    beyond_cache = host - (sample.tcg_tb_size_mib or 0)
    if beyond_cache > max(Fraction(sample.vm_nominal_mib), Fraction(defaults.HOST_SIDE_FLOOR_MIB)):
        problems.append(
            f"host side beyond its VM: the pod cgroup holds {float(host):.0f} MiB beyond its VM of "
            f"{sample.vm_nominal_mib} MiB ({'less its translation cache, ' if sample.tcg_tb_size_mib else ''}more "
            f"than the VM itself and than {defaults.HOST_SIDE_FLOOR_MIB} MiB): not a sandbox's shim, VMM and "
            "virtiofsd; check the cgroup and the figure's unit (bytes), or leave the cell empty")
    return problems


def _normalise_header(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")


def _cells(line: str) -> list[str]:
    try:
        return [cell.strip() for cell in next(csv.reader([line], skipinitialspace=True), [])]
    except csv.Error:
        # e.g. a NUL byte or an unterminated quote: no cell to take from this line.
        return [line]


def _number(column: str, text: str, integer: bool) -> tuple[Decimal | None, str | None]:
    # Signs are accepted here so that Sample's own rules report "-1 is negative".
    pattern, kind = (_INTEGER, "a whole number") if integer else (_NUMBER, "a number")
    if not text:
        return None, f"{column}: is empty; it is required"
    if len(text) > MAX_CELL_CHARS:
        return None, f"{column}: {text[:MAX_CELL_CHARS]!r}... is longer than {MAX_CELL_CHARS} characters"
    if not pattern.fullmatch(text):
        return None, f"{column}: {text!r} is not {kind}"
    return Decimal(text), None


def parse_samples_csv(text: str) -> list[Sample]:
    """Parse survey CSV text into samples, reporting every bad row at once.

    The first line that is neither blank nor a `#` comment is the header. Columns are
    matched case-insensitively, either as `vm_nominal_mib` or as the survey table's
    wording ("VM nominal"); `pod_cgroup_memory_current_bytes` is optional per row. A later
    line that names columns and holds no number is a header too: the rows after it are read by
    it, so a probe's CSV and a survey's, each with its own columns, can be given as one text
    (`cat probe.csv survey.csv`).
    """
    lines = [
        (number, line)
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if len(lines) > MAX_ROWS + 1:
        raise CalibrationError(f"{len(lines) - 1} rows; a survey has at most {MAX_ROWS}")
    too_long = [f"line {number}: {len(line)} characters is longer than {MAX_LINE_CHARS}"
                for number, line in lines if len(line) > MAX_LINE_CHARS]
    if too_long:
        raise CalibrationError(too_long[:20])
    if not lines:
        raise CalibrationError("no header: the survey has no lines other than blanks and comments")
    header_line, header_text = lines[0]
    columns, header_problems = _parse_header(header_line, header_text)
    if header_problems:
        raise CalibrationError(header_problems)

    samples: list[Sample] = []
    problems: list[str] = []
    for number, line in lines[1:]:
        cells = _cells(line)
        if _is_header(cells):
            header_line = number
            columns, header_problems = _parse_header(header_line, line)
            if header_problems:
                raise CalibrationError(problems + header_problems)
            continue
        if len(cells) != len(columns):
            problems.append(
                f"line {number}: has {len(cells)} fields, the header (line {header_line}) "
                f"has {len(columns)}"
            )
            continue
        values: dict[str, Decimal | None] = {}
        texts: dict[str, str | None] = {}
        row_problems: list[str] = []
        for column, cell in zip(columns, cells, strict=True):
            if column in TEXT_COLUMNS:
                texts[column], problem = _text(column, cell)
            elif column in KIND_COLUMNS:
                texts[column], problem = _kind_text(column, cell)
            elif column not in _REQUIRED and not cell:
                values[column], problem = None, None
            else:
                values[column], problem = _number(column, cell, integer=column in _WHOLE_COLUMNS)
            if problem:
                row_problems.append(f"line {number}: {problem}")
        if row_problems:
            problems.extend(row_problems)
            continue

        def whole(column: str, values: dict[str, Decimal | None] = values) -> int | None:
            value = values.get(column)
            return None if value is None else int(value)

        try:
            samples.append(
                Sample(
                    container_limit_mib=_required(values["container_limit_mib"]),
                    vm_nominal_mib=_required(values["vm_nominal_mib"]),
                    free_total_mib=values.get("free_total_mib"),
                    free_used_mib=values.get("free_used_mib"),
                    pod_cgroup_memory_current_bytes=whole("pod_cgroup_memory_current_bytes"),
                    line=number,
                    pod_working_set_bytes=whole("pod_working_set_bytes"),
                    containers_working_set_bytes=whole("containers_working_set_bytes"),
                    pod_cgroup_limit_bytes=whole("pod_cgroup_limit_bytes"),
                    workload_allocated_mib=values.get("workload_allocated_mib"),
                    vmm_peak_resident_bytes=whole("vmm_peak_resident_bytes"),
                    node=texts.get("node"),
                    pod=texts.get("pod"),
                    class_name=texts.get("class"),
                    tcg_tb_size_mib=whole("tcg_tb_size_mib"),
                    tcg_cache_resident_bytes=whole("tcg_cache_resident_bytes"),
                    **{column: texts.get(column) or "" for column in KIND_COLUMNS},
                )
            )
        except CalibrationError as exc:
            problems.extend(exc.problems)
    if problems:
        raise CalibrationError(problems)
    return samples


def _required(value: Decimal | None) -> Decimal:
    assert value is not None  # _number reported an empty required cell already
    return value


# The text columns and the Kubernetes name each holds (kubegrammar.name_problem).
_TEXT_KINDS = {"node": "node", "pod": "pod", "class": "class"}


def _text(column: str, text: str) -> tuple[str | None, str | None]:
    """A node, pod (namespace/name) or class name, as the API server writes them: anything else
    (a quote, a comma, a line break) is not a name and is refused, not printed."""
    if len(text) > MAX_TEXT_CHARS:
        return None, f"{column}: {text[:MAX_CELL_CHARS]!r}... is longer than {MAX_TEXT_CHARS} characters"
    if not text:
        return None, None
    problem = name_problem(_TEXT_KINDS[column], text)
    if problem:
        return None, f"{column}: {problem}"
    return text, None


def _is_header(cells: list[str]) -> bool:
    """A line naming columns: one cell at least is a column's name, and none is a number (every row
    has one, its container_limit_mib)."""
    return (any(_normalise_header(cell) in _ALIASES for cell in cells)
            and not any(_NUMBER.fullmatch(cell) for cell in cells))


def _kind_text(column: str, text: str) -> tuple[str | None, str | None]:
    """A word of a kind column (its grammar is checked with the row, Sample._row_rules), bounded here so
    that no message prints more of it."""
    if len(text) > MAX_KIND_CHARS:
        return None, f"{column}: {text[:MAX_CELL_CHARS]!r}... is longer than {MAX_KIND_CHARS} characters"
    return text or None, None


def _parse_header(number: int, text: str) -> tuple[list[str], list[str]]:
    columns: list[str] = []
    problems: list[str] = []
    for raw in _cells(text):
        canonical = _ALIASES.get(_normalise_header(raw))
        if canonical is None:
            # Unknown columns are refused rather than skipped: a misspelt optional
            # column would otherwise silently drop the host measurement.
            problems.append(
                f"line {number}: unknown column {raw!r} (known: {', '.join(_KNOWN)})"
            )
        elif canonical in columns:
            problems.append(f"line {number}: column {canonical} appears twice")
        columns.append(canonical or raw)
    missing = [c for c in _REQUIRED if c not in columns]
    for pair in (_GUEST, _KUBELET):
        if any(c in columns for c in pair):
            missing += [c for c in pair if c not in columns]
    if not any(c in columns for c in (*_GUEST, *_KUBELET)):
        missing.append(f"{' and '.join(_GUEST)} (measured in the guest), or {' and '.join(_KUBELET)} "
                       "(from the kubelet)")
    if missing:
        problems.append(f"line {number}: missing column(s) {', '.join(missing)}")
    return columns, problems


@dataclass(frozen=True)
class PartSource:
    """Where a part of the pod's memory comes from in a fit: the rows that saw it (`measured`, as
    "lines 5-9"), and the figure that stands in for it in the rows that did not (`assumed_mib` with its
    `source`, for `assumed_for`). `detail` says how the rows saw it where that matters (a VMM without
    Kata's devices)."""

    part: Part
    measured: str | None = None
    assumed_mib: int | None = None
    assumed_for: str | None = None
    source: str | None = None
    detail: str | None = None

    def describe(self) -> str:
        said = []
        if self.measured:
            said.append(f"measured on {self.measured}" + (f" ({self.detail})" if self.detail else ""))
        if self.assumed_mib is not None:
            said.append(f"assumed {self.assumed_mib} MiB for {self.assumed_for}: {self.source}")
        return "; ".join(said) or "not measured"

    def as_dict(self) -> dict[str, str | int]:
        found: dict[str, str | int] = {"part": self.part.value}
        if self.measured:
            found["measured"] = self.measured
        if self.detail:
            found["detail"] = self.detail
        if self.assumed_mib is not None:
            found.update(assumedMiB=self.assumed_mib, assumedFor=self.assumed_for or "", source=self.source or "")
        return found


@dataclass(frozen=True)
class Fit:
    """unusable(V) = base_mib + ratio * V, covering every sample, plus the host side.

    `host_mib` is the host side the rows give (the largest over the rows that measured one, each with
    the stated defaults of the host processes it did not count, see `parts`) or None; the guest points
    of kubelet rows were then taken with `assumed_host_mib` (the policy's hostMemory).
    `residuals_mib` has one entry per guest point, in the order of the samples that gave one."""

    base_mib: int
    ratio: Decimal
    host_mib: int | None
    residuals_mib: tuple[Decimal, ...]
    max_guest_daemons_mib: Decimal | None
    margin: Decimal
    assumed_host_mib: int | None = None
    notes: tuple[str, ...] = ()
    # What the line was fitted to, for a reader and the plot: (vm_nominal_mib, unusable MiB) per guest
    # point, (vm_nominal_mib, host MiB) per row that gave a host side.
    guest_points: tuple[tuple[Decimal, Decimal], ...] = ()
    host_points: tuple[tuple[Decimal, Decimal], ...] = ()
    # The exact host side the rows give (host_mib is it rounded up), None when none gives one; of it, what
    # stated defaults stand for (host processes the row that gave it did not count).
    host_exact_mib: Fraction | None = None
    host_assumed_mib: int = 0
    # Each part of the pod's memory: which rows saw it, what stands in where they did not.
    parts: tuple[PartSource, ...] = ()
    # How the host side was made up: the row that gave the largest, what it counted and what was added.
    host_basis: str | None = None

    @property
    def largest_vm_mib(self) -> Decimal:
        """The largest VM the guest line was fitted on: beyond it the line is extrapolated."""
        return max(x for x, _ in self.guest_points)

    def unusable_mib(self, vm_mib: int | Decimal) -> Decimal:
        """The fitted unusable memory of a VM of `vm_mib` MiB."""
        return self.base_mib + self.ratio * Decimal(vm_mib)

    @property
    def host_with_margin_mib(self) -> int | None:
        """The host side with the margin on what was measured, rounded up: a pod holding exactly the
        largest host side measured would otherwise have no headroom at all. A stated default is a bound
        already and is added as it is."""
        if self.host_exact_mib is None:
            return None
        measured = self.host_exact_mib - self.host_assumed_mib
        return math.ceil(measured * (1 + Fraction(self.margin)) + self.host_assumed_mib)

    def overhead_block(self) -> dict[str, str]:
        """The policy's `spec.overhead` fields, ready to paste (checked_overhead_block says whether a
        policy takes them)."""
        block = {
            "guestMemoryBase": f"{self.base_mib}Mi",
            "guestMemoryRatio": str(self.ratio),
        }
        if self.host_with_margin_mib is not None:
            block["hostMemory"] = f"{self.host_with_margin_mib}Mi"
        block["margin"] = str(self.margin)
        return block


Point = tuple[Fraction, Fraction]


def _upper_hull(points: Iterable[Point]) -> list[Point]:
    """Upper convex hull, left to right (Andrew's monotone chain); collinear points dropped."""
    hull: list[Point] = []
    for point in sorted(set(points)):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            # Pop the middle point unless it turns clockwise (lies strictly above the chord).
            if (x2 - x1) * (point[1] - y1) - (y2 - y1) * (point[0] - x1) >= 0:
                hull.pop()
            else:
                break
        hull.append(point)
    return hull


def _tightest_cover(points: Sequence[Point], mean_x: Fraction) -> tuple[Point, Point]:
    """The edge whose line covers all points with the least total over-coverage.

    Sum of (base + ratio * x_i - y_i) = n * (base + ratio * mean_x) - sum(y): minimising it
    means minimising the line's height at mean_x, and the lowest covering line there is the
    upper hull's edge over mean_x. Bounds on the slope are the caller's business.
    """
    hull = _upper_hull(points)
    edges = list(zip(hull, hull[1:]))
    for left, right in edges:
        # When mean_x falls on a vertex both neighbouring edges are optimal; the one to
        # its right is taken because it is steeper and budgets extrapolate to larger VMs.
        if left[0] <= mean_x < right[0]:
            return left, right
    return edges[-1]


def _slope(edge: tuple[Point, Point]) -> Fraction:
    (x1, y1), (x2, y2) = edge
    return (y2 - y1) / (x2 - x1)


def _ceil_places(value: Fraction, places: int) -> Decimal:
    return Decimal(math.ceil(value * 10**places)).scaleb(-places)


def _decimal(value: Fraction) -> Decimal:
    # Only used on values built from Decimals and a 4-place ratio, so the division ends.
    return Decimal(value.numerator) / Decimal(value.denominator)


def _guest_point(sample: Sample, host_mib: int | None) -> Fraction | None:
    """The unusable memory a sample stands for: measured in the guest, or from the kubelet the
    overhead used less the host side when the VM is not fully resident (a fully resident VM's
    overhead used is the whole VM less the workload, whatever the guest keeps). A guest without Kata's
    agent (kernel-only) has the guest userland's stated default added: its workload had memory Kata's
    agent and daemons would hold."""
    if sample.measured_in_guest:
        unusable = sample.unusable_mib
        assert unusable is not None  # measured in the guest
        return unusable + (0 if sample.sees_guest_userland else ASSUMED_PARTS[Part.GUEST_USERLAND][0])
    used = sample.overhead_used_mib
    if sample.resident or host_mib is None or used is None:
        return None
    return used - host_mib


@dataclass(frozen=True)
class HostReading:
    """What a row gives of the host side: the host processes its figure counts (`seen`) and that figure
    in MiB, a translation cache measured apart taken off; the stated defaults of the other host processes
    complete it (`estimate_mib`)."""

    sample: Sample
    where: str
    measured_mib: Fraction
    seen: tuple[Part, ...]

    @property
    def assumed(self) -> tuple[Part, ...]:
        return tuple(p for p in HOST_PARTS if p not in self.seen)

    @property
    def assumed_mib(self) -> int:
        return sum(ASSUMED_PARTS[p][0] for p in self.assumed)

    @property
    def estimate_mib(self) -> Fraction:
        return self.measured_mib + self.assumed_mib


def host_reading(sample: Sample, where: str) -> tuple[HostReading | None, str | None]:
    """The row's host side, or None with why it gives none (None when it measured none: no figure, or
    its VM was not fully resident). A tcg row's figure holds QEMU's translation cache, which a KVM node
    has not: taken off when measured apart (tcg_cache_resident_bytes), counted in when the cache is at
    most TCG_CACHE_COUNTED_MAX_MIB (the VMM's share then overstated by at most that), else the row gives
    no host side (defaults.py)."""
    host = sample.host_mib
    if host is None:
        return None, None
    seen = HOST_PROCESSES[sample.host_processes]
    if not seen:
        return None, "its pod cgroup counts no host process (host_processes none: sandbox_cgroup_only = false)"
    if sample.accelerator == "tcg":
        tb_size = sample.tcg_tb_size_mib or 0
        if sample.tcg_cache_resident_bytes is not None:
            host -= Fraction(sample.tcg_cache_resident_bytes, MIB)
        elif tb_size > defaults.TCG_CACHE_COUNTED_MAX_MIB:
            return None, (f"it ran under TCG with a {tb_size} MiB translation cache in its host side, which a KVM "
                          f"node has not (not measured apart, and more than the "
                          f"{defaults.TCG_CACHE_COUNTED_MAX_MIB} MiB counted in)")
    return HostReading(sample, where, host, seen), None


def _wheres(samples: Sequence[Sample]) -> list[str]:
    """Where each row came from, for a person: its line in the file, else its position among the rows."""
    return [f"line {s.line}" if s.line is not None else f"row {n}" for n, s in enumerate(samples, start=1)]


def rows_text(wheres: Iterable[str]) -> str:
    """"line 5", "lines 5-9, 12", "rows 1-3": runs of consecutive numbers joined."""
    numbers: dict[str, list[int]] = {}
    for where in wheres:
        kind, digits = where.split(" ")
        numbers.setdefault(kind, []).append(int(digits))
    texts = []
    for kind, found in numbers.items():
        runs: list[list[int]] = []
        for number in sorted(set(found)):
            if runs and number == runs[-1][-1] + 1:
                runs[-1].append(number)
            else:
                runs.append([number])
        spans = [f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs]
        texts.append(f"{kind}{'s' if len(set(found)) > 1 else ''} {', '.join(spans)}")
    return "; ".join(texts)


def _parts(samples: Sequence[Sample], wheres: Sequence[str], guest_rows: Sequence[int],
           readings: Sequence[HostReading]) -> tuple[PartSource, ...]:
    """Each part of the pod's memory: the rows that saw it, and what stands in where they did not."""
    def joined(indexes: Iterable[int]) -> str | None:
        return rows_text(wheres[i] for i in indexes) or None

    kernel_only = [i for i in guest_rows if not samples[i].sees_guest_userland]
    userland_mib, userland_source = ASSUMED_PARTS[Part.GUEST_USERLAND]
    guest_accelerators = sorted({samples[i].accelerator for i in guest_rows})
    parts = [
        PartSource(Part.GUEST_KERNEL, joined(guest_rows),
                   detail=f"guest {', '.join(sorted({samples[i].guest for i in guest_rows}))}; "
                          f"{', '.join(guest_accelerators)}" if guest_rows else None),
        PartSource(Part.GUEST_USERLAND, joined(i for i in guest_rows if samples[i].sees_guest_userland),
                   assumed_mib=userland_mib if kernel_only else None,
                   assumed_for=f"{joined(kernel_only)} (guest kernel-only)" if kernel_only else None,
                   source=userland_source if kernel_only else None),
    ]
    by_sample = {id(s): i for i, s in enumerate(samples)}
    for part in HOST_PARTS:
        seen = [by_sample[id(r.sample)] for r in readings if part in r.seen]
        unseen = [by_sample[id(r.sample)] for r in readings if part not in r.seen]
        detail = None
        if part is Part.VMM and seen:
            said = list(dict.fromkeys(_devices_said(samples[i]) for i in seen if samples[i].devices != KATA_DEVICES))
            tcg = [samples[i] for i in seen if samples[i].accelerator == "tcg"]
            if tcg:
                said.append("TCG, the translation cache " + (
                    "measured and taken off" if all(s.tcg_cache_resident_bytes is not None for s in tcg) else
                    f"taken off or at most {defaults.TCG_CACHE_COUNTED_MAX_MIB} MiB counted in"))
            detail = "; ".join(said) or None
        assumed = ASSUMED_PARTS.get(part) if unseen else None
        parts.append(PartSource(part, joined(seen), assumed_mib=assumed[0] if assumed else None,
                                assumed_for=joined(unseen) if assumed else None,
                                source=assumed[1] if assumed else None, detail=detail))
    return tuple(parts)


# The devices Kata's QEMU gives every VM (docs/probe.md, "The VM Kata boots"), and the disks its image is on.
KATA_VM_DEVICES = ("vsock", "rng", "virtio-fs")
IMAGE_DISKS = frozenset({"nvdimm", "virtio-blk"})


def _devices_said(sample: Sample) -> str:
    """A probe row's devices, and which of Kata's its VM went without."""
    words = set(sample.devices.split("+"))
    missing = [d for d in KATA_VM_DEVICES if d not in words]
    if not words & IMAGE_DISKS and sample.guest in ("kata-image", KERNEL_ONLY):
        missing.append("image disk" if sample.guest == "kata-image" else "image disk (where Kata boots an image)")
    return f"devices {sample.devices}" + (f": without Kata's {', '.join(missing)}" if missing else "")


def fit_overhead(
    samples: Sequence[Sample], margin: Decimal = Decimal("0.10"), assumed_host_mib: int | None = None,
) -> Fit:
    """Fit unusable(V) = base + ratio * V as the tightest line above every sample.

    The origin is added as a constraint point (an empty VM loses no memory), which keeps
    base >= 0 without counting the origin's over-coverage. Ratio is constrained to >= 0
    (a negative slope is noise: the line then sits flat on the highest sample); a ratio of
    0.9 or more is refused. Base is rounded up to whole MiB and ratio up to four places,
    and base is recomputed for the rounded ratio, so the rounded line still covers all.

    Rows by what they saw (docs/sizing-model.md, "What each row saw"): every row measured in a guest
    is a guest point, a guest without Kata's agent with the guest userland's stated default added; the
    host side is the largest over the rows that give one (host_reading), each completed with the stated
    defaults of the host processes it did not count. Rows from the kubelet: a fully resident VM gives
    the host side only; another gives a guest point once the host side is known, from the rows or else
    `assumed_host_mib` (the policy's hostMemory).
    """
    if isinstance(margin, bool) or not isinstance(margin, (int, Decimal)) or margin < 0:
        raise CalibrationError(f"margin {margin!r} must be a Decimal of zero or more")
    wheres = _wheres(samples)
    readings: list[HostReading] = []
    unused: dict[str, list[str]] = {}
    for sample, where in zip(samples, wheres, strict=True):
        reading, why = host_reading(sample, where)
        if reading is not None:
            readings.append(reading)
        elif why is not None:
            unused.setdefault(why, []).append(where)
    # The row whose host side needs the most hostMemory: the margin goes on what it measured.
    largest = max(readings, key=lambda r: r.measured_mib * (1 + Fraction(margin)) + r.assumed_mib,
                  default=None)
    host_exact = largest.estimate_mib if largest is not None else None
    measured_host = math.ceil(host_exact) if host_exact is not None else None
    host_points = tuple((r.sample.vm_nominal_mib, _decimal(r.estimate_mib)) for r in readings)
    host_for_points = measured_host if measured_host is not None else assumed_host_mib
    notes = [f"{rows_text(rows)}: no host side taken from them: {why}" for why, rows in unused.items()]
    kubelet_only = [s for s in samples if not s.measured_in_guest]
    if host_for_points is None and any(not s.resident for s in kubelet_only):
        raise CalibrationError(
            "no row measures the host side (no VM was fully resident) and no host side to assume: "
            "give the policy (--policy, its hostMemory is used) or --host-memory"
            + "".join(f"; {note}" for note in notes)
        )
    by_row = [(i, y) for i, s in enumerate(samples) if (y := _guest_point(s, host_for_points)) is not None]
    guest_rows = [i for i, _ in by_row]
    guest = [(samples[i], y) for i, y in by_row]
    resident_only = [s for s in kubelet_only if s.resident]
    if resident_only:
        notes.append(
            f"{len(resident_only)} row(s) from the kubelet had a fully resident VM (pod memory >= vm_nominal_mib): "
            "they give the host side only")
    if kubelet_only and len(resident_only) < len(kubelet_only):
        source = "measured" if measured_host is not None else "assumed (the policy's hostMemory)"
        notes.append(
            f"{len(kubelet_only) - len(resident_only)} row(s) from the kubelet stand for the guest as their "
            f"overhead used less the host side, {host_for_points} MiB {source}")
    sizes = {s.vm_nominal_mib for s, _ in guest}
    if len(guest) < 2 or len(sizes) < 2:
        raise CalibrationError(
            f"need samples at two or more distinct VM sizes (vm_nominal_mib) to fit a "
            f"ratio; got {len(guest)} sample(s) at {len(sizes)} size(s)"
            + (f" ({len(resident_only)} fully resident row(s) give the host side only)" if resident_only else "")
        )
    points = [(Fraction(s.vm_nominal_mib), y) for s, y in guest]
    mean_x = sum((x for x, _ in points), Fraction(0)) / len(points)
    edge = _tightest_cover([*points, (Fraction(0), Fraction(0))], mean_x)
    ratio = _ceil_places(max(_slope(edge), Fraction(0)), RATIO_PLACES)
    if ratio >= MAX_RATIO:
        raise CalibrationError(
            f"fitted guestMemoryRatio {ratio} is not below {_decimal(MAX_RATIO)} (the ratio "
            f"must be in [0, {_decimal(MAX_RATIO)})): unusable memory grows by {ratio} MiB "
            f"per MiB of VM between {_describe(edge, guest)}; check "
            + ("free_total_mib and free_used_mib there" if all(s.measured_in_guest for s, _ in guest)
               else "those rows (a VM nearly fully resident stands for almost all of its memory)")
        )
    exact_ratio = Fraction(ratio)
    base = max(0, math.ceil(max(y - exact_ratio * x for x, y in points)))
    residuals = tuple(_decimal(base + exact_ratio * x - y) for x, y in points)
    daemons = [s.free_used_mib for s in samples if s.free_used_mib is not None and s.free_total_mib is not None]
    return Fit(
        base_mib=base,
        ratio=ratio,
        host_mib=measured_host,
        residuals_mib=residuals,
        max_guest_daemons_mib=max(daemons) if daemons else None,
        margin=Decimal(margin),
        assumed_host_mib=None if measured_host is not None else assumed_host_mib,
        notes=tuple(notes),
        guest_points=tuple((Decimal(s.vm_nominal_mib), _decimal(y)) for s, y in guest),
        host_points=host_points,
        host_exact_mib=host_exact,
        host_assumed_mib=0 if largest is None else largest.assumed_mib,
        parts=_parts(samples, wheres, guest_rows, readings),
        host_basis=None if largest is None else _host_basis(largest),
    )


def _host_basis(reading: HostReading) -> str:
    counted = "+".join(p.value for p in reading.seen)
    added = ", ".join(f"{p.value} {ASSUMED_PARTS[p][0]} MiB" for p in reading.assumed)
    return (f"{float(reading.estimate_mib):.1f} MiB from {reading.where}: its {counted} "
            f"{float(reading.measured_mib):.1f} MiB" + (f", with {added} assumed" if added else ""))


def checked_overhead_block(block: dict[str, str]) -> dict[str, str]:
    """`block` if a policy takes it as its spec.overhead, else CalibrationError naming each field and
    the rule (a measured host side of 0, a size past what a quantity holds): a fit prints nothing a
    policy would refuse."""
    from pydantic import ValidationError

    from .model import Overhead, validation_problems

    try:
        Overhead.model_validate(block)
    except ValidationError as exc:
        raise CalibrationError([f"the fitted spec.overhead is not one a policy takes: {path}: {message}"
                                for path, message in validation_problems(exc, "overhead")]) from None
    return block


def _describe(edge: tuple[Point, Point], guest: Sequence[tuple[Sample, Fraction]]) -> str:
    def where(point: Point) -> str:
        if point[0] == 0:
            return "the origin"
        # Several rows may share a VM size; the hull vertex is the highest of them.
        row, unusable = max(((s, y) for s, y in guest if s.vm_nominal_mib == point[0]), key=lambda pair: pair[1])
        at = "" if row.line is None else f"line {row.line} "
        return f"{at}(vm_nominal_mib {row.vm_nominal_mib}, unusable {_decimal(unusable)})"

    return f"{where(edge[0])} and {where(edge[1])}"
