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
from fractions import Fraction

from kata_sizing.core import defaults
from kata_sizing.core.kubegrammar import UINT64_MAX, name_problem
from kata_sizing.core.quantity import MIB

__all__ = [
    "MAX_RATIO",
    "CalibrationError",
    "Fit",
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
# Written by `kata-sizing probe` (docs/probe.md): what a workload in the guest could allocate and
# touch before the guest refused it (MiB), and the VMM's peak resident memory on the host (bytes).
PROBE_COLUMNS = ("workload_allocated_mib", "vmm_peak_resident_bytes")
_KNOWN = (*TEXT_COLUMNS, *_COLUMNS, *HOST_COLUMNS, *PROBE_COLUMNS)
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
    **{name: name for name in (*HOST_COLUMNS, *TEXT_COLUMNS, *PROBE_COLUMNS)},
    "class_name": "class",
}
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
    and `class_name` say which pod it was (a survey writes them)."""

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

    def __post_init__(self) -> None:
        if self.workload_allocated_mib is not None:
            object.__setattr__(self, "workload_allocated_mib", Decimal(self.workload_allocated_mib))
        for name in _COLUMNS[:4]:
            value = getattr(self, name)
            if value is None and name in _GUEST:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
                raise TypeError(f"{name} must be an int or Decimal, not {value!r}")
            object.__setattr__(self, name, Decimal(value))
        for name in ("pod_cgroup_memory_current_bytes", *HOST_COLUMNS, "vmm_peak_resident_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an int, not {value!r}")
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
        """The shim and VMM on the host: what the pod cgroup holds beyond a fully resident VM."""
        held = self.pod_cgroup_memory_current_bytes
        if held is None:
            held = self.pod_working_set_bytes
        if held is None or not self.resident:
            return None
        return Fraction(held, MIB) - Fraction(self.vm_nominal_mib)


_UPPER_BOUNDS = (
    *((name, MAX_MIB, "memory quantity, in MiB") for name in (*_COLUMNS[:4], "workload_allocated_mib")),
    *((name, MAX_BYTES, "figure a kubelet reports: uint64") for name in (_COLUMNS[4], *HOST_COLUMNS)),
    ("vmm_peak_resident_bytes", MAX_BYTES, "process's resident memory: uint64"),
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
    wording ("VM nominal"); `pod_cgroup_memory_current_bytes` is optional per row.
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
            elif column not in _REQUIRED and not cell:
                values[column], problem = None, None
            else:
                values[column], problem = _number(column, cell, integer=column.endswith("_bytes"))
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
class Fit:
    """unusable(V) = base_mib + ratio * V, covering every sample, plus the host side.

    `host_mib` is measured (the largest host side of a fully resident VM) or None; the guest
    points of kubelet rows were then taken with `assumed_host_mib` (the policy's hostMemory).
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
    # point, (vm_nominal_mib, host MiB) per fully resident row.
    guest_points: tuple[tuple[Decimal, Decimal], ...] = ()
    host_points: tuple[tuple[Decimal, Decimal], ...] = ()
    # The exact largest host side measured (host_mib is it rounded up), None when none was.
    measured_host_exact_mib: Fraction | None = None

    @property
    def largest_vm_mib(self) -> Decimal:
        """The largest VM the guest line was fitted on: beyond it the line is extrapolated."""
        return max(x for x, _ in self.guest_points)

    def unusable_mib(self, vm_mib: int | Decimal) -> Decimal:
        """The fitted unusable memory of a VM of `vm_mib` MiB."""
        return self.base_mib + self.ratio * Decimal(vm_mib)

    @property
    def host_with_margin_mib(self) -> int | None:
        """The largest measured host side with the margin, rounded up: a pod holding exactly the
        largest host side measured would otherwise have no headroom at all."""
        if self.measured_host_exact_mib is None:
            return None
        return math.ceil(self.measured_host_exact_mib * (1 + Fraction(self.margin)))

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
    overhead used is the whole VM less the workload, whatever the guest keeps)."""
    if sample.measured_in_guest:
        return sample.unusable_mib
    used = sample.overhead_used_mib
    if sample.resident or host_mib is None or used is None:
        return None
    return used - host_mib


def fit_overhead(
    samples: Sequence[Sample], margin: Decimal = Decimal("0.10"), assumed_host_mib: int | None = None,
) -> Fit:
    """Fit unusable(V) = base + ratio * V as the tightest line above every sample.

    The origin is added as a constraint point (an empty VM loses no memory), which keeps
    base >= 0 without counting the origin's over-coverage. Ratio is constrained to >= 0
    (a negative slope is noise: the line then sits flat on the highest sample); a ratio of
    0.9 or more is refused. Base is rounded up to whole MiB and ratio up to four places,
    and base is recomputed for the rounded ratio, so the rounded line still covers all.

    Rows from the kubelet (see the module docstring): a fully resident VM gives the host
    side only; another gives a guest point once the host side is known, measured by a
    resident row or else `assumed_host_mib` (the policy's hostMemory).
    """
    if isinstance(margin, bool) or not isinstance(margin, (int, Decimal)) or margin < 0:
        raise CalibrationError(f"margin {margin!r} must be a Decimal of zero or more")
    hosts = [h for h in (s.host_mib for s in samples) if h is not None]
    measured_host = math.ceil(max(hosts)) if hosts else None
    host_points = tuple((s.vm_nominal_mib, _decimal(s.host_mib)) for s in samples if s.host_mib is not None)
    host_for_points = measured_host if measured_host is not None else assumed_host_mib
    kubelet_only = [s for s in samples if not s.measured_in_guest]
    if host_for_points is None and any(not s.resident for s in kubelet_only):
        raise CalibrationError(
            "no row measures the host side (no VM was fully resident) and no host side to assume: "
            "give the policy (--policy, its hostMemory is used) or --host-memory"
        )
    guest = [(s, y) for s in samples if (y := _guest_point(s, host_for_points)) is not None]
    notes = []
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
        measured_host_exact_mib=max(hosts) if hosts else None,
    )


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
