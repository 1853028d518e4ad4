"""Fit Kata's guest overhead as a function of VM size from measured survey rows.

A survey row is one sandbox measured from inside and outside (docs/sizing-model.md):
inside the guest, `free -m` gives `total` (what the kernel left to userland) and `used`
(the guest daemons); on the host, the pod cgroup's `memory.current` covers the VM plus
the shim and VMM. From these:

- unusable (MiB) = vm_nominal - free_total + free_used: memory a container cannot have;
- host (MiB)     = memory.current / MiB - vm_nominal.

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

from kata_sizing.core.quantity import MIB

__all__ = [
    "MAX_RATIO",
    "CalibrationError",
    "Fit",
    "Sample",
    "fit_overhead",
    "parse_samples_csv",
]

# At ratio r a VM must grow by 1/(1 - r) MiB per MiB of limit, so r near 1 means the
# budget diverges; 0.9 already means a 10x VM and is a broken measurement, not a guest.
MAX_RATIO = Fraction(9, 10)
RATIO_PLACES = 4

_COLUMNS = (
    "container_limit_mib",
    "vm_nominal_mib",
    "free_total_mib",
    "free_used_mib",
    "pod_cgroup_memory_current_bytes",
)
_OPTIONAL = frozenset({"pod_cgroup_memory_current_bytes"})
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
}
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
# Bounds on a survey file (docs/inputs.md): no measurement needs more digits or rows.
MAX_ROWS = 10_000
MAX_CELL_CHARS = 32
MAX_LINE_CHARS = 512


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
    """One measured sandbox. Sizes in MiB; `pod_cgroup_memory_current_bytes` in bytes.

    `line` is where the row came from, so fit errors can point back at the file.
    """

    container_limit_mib: Decimal
    vm_nominal_mib: Decimal
    free_total_mib: Decimal
    free_used_mib: Decimal
    pod_cgroup_memory_current_bytes: int | None = None
    line: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in _COLUMNS[:4]:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
                raise TypeError(f"{name} must be an int or Decimal, not {value!r}")
            object.__setattr__(self, name, Decimal(value))
        current = self.pod_cgroup_memory_current_bytes
        if current is not None and (isinstance(current, bool) or not isinstance(current, int)):
            raise TypeError(f"pod_cgroup_memory_current_bytes must be an int, not {current!r}")
        problems = _row_rules(self)
        if problems:
            where = "" if self.line is None else f"line {self.line}: "
            raise CalibrationError([where + problem for problem in problems])

    @property
    def unusable_mib(self) -> Fraction:
        """Memory of the VM that no container can use: the kernel's share plus daemons."""
        return Fraction(self.vm_nominal_mib - self.free_total_mib + self.free_used_mib)

    @property
    def host_mib(self) -> Fraction | None:
        """The shim and VMM on the host: what the pod cgroup holds beyond the VM."""
        if self.pod_cgroup_memory_current_bytes is None:
            return None
        return Fraction(self.pod_cgroup_memory_current_bytes, MIB) - Fraction(self.vm_nominal_mib)


def _row_rules(sample: Sample) -> list[str]:
    problems = [
        f"{name} {getattr(sample, name)} is negative"
        for name in _COLUMNS[:4]
        if getattr(sample, name) < 0
    ]
    current = sample.pod_cgroup_memory_current_bytes
    if current is not None and current < 0:
        problems.append(f"pod_cgroup_memory_current_bytes {current} is negative")
    if problems:
        return problems
    vm, total, used = sample.vm_nominal_mib, sample.free_total_mib, sample.free_used_mib
    if vm == 0:
        problems.append("vm_nominal_mib is 0; a VM has memory")
    if total > vm:
        problems.append(f"free_total_mib {total} is larger than vm_nominal_mib {vm}")
    if used > total:
        problems.append(f"free_used_mib {used} is larger than free_total_mib {total}")
    if sample.container_limit_mib > vm:
        problems.append(
            f"container_limit_mib {sample.container_limit_mib} is larger than "
            f"vm_nominal_mib {vm}; both runtimes add the limit to the VM"
        )
    # memory.current counts only resident pages; below the VM's size the guest had not
    # touched all of its memory yet, and the difference says nothing about the host side.
    if current is not None and current < vm * MIB:
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
        row_problems: list[str] = []
        for column, cell in zip(columns, cells, strict=True):
            if column in _OPTIONAL and not cell:
                values[column] = None
                continue
            value, problem = _number(column, cell, integer=column.endswith("_bytes"))
            values[column] = value
            if problem:
                row_problems.append(f"line {number}: {problem}")
        if row_problems:
            problems.extend(row_problems)
            continue
        current = values.get("pod_cgroup_memory_current_bytes")
        try:
            samples.append(
                Sample(
                    container_limit_mib=_required(values["container_limit_mib"]),
                    vm_nominal_mib=_required(values["vm_nominal_mib"]),
                    free_total_mib=_required(values["free_total_mib"]),
                    free_used_mib=_required(values["free_used_mib"]),
                    pod_cgroup_memory_current_bytes=None if current is None else int(current),
                    line=number,
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


def _parse_header(number: int, text: str) -> tuple[list[str], list[str]]:
    columns: list[str] = []
    problems: list[str] = []
    for raw in _cells(text):
        canonical = _ALIASES.get(_normalise_header(raw))
        if canonical is None:
            # Unknown columns are refused rather than skipped: a misspelt optional
            # column would otherwise silently drop the host measurement.
            problems.append(
                f"line {number}: unknown column {raw!r} (known: {', '.join(_COLUMNS)})"
            )
        elif canonical in columns:
            problems.append(f"line {number}: column {canonical} appears twice")
        columns.append(canonical or raw)
    missing = [c for c in _COLUMNS if c not in columns and c not in _OPTIONAL]
    if missing:
        problems.append(f"line {number}: missing column(s) {', '.join(missing)}")
    return columns, problems


@dataclass(frozen=True)
class Fit:
    """unusable(V) = base_mib + ratio * V, covering every sample, plus the host side."""

    base_mib: int
    ratio: Decimal
    host_mib: int | None
    residuals_mib: tuple[Decimal, ...]
    max_guest_daemons_mib: Decimal
    margin: Decimal

    def unusable_mib(self, vm_mib: int | Decimal) -> Decimal:
        """The fitted unusable memory of a VM of `vm_mib` MiB."""
        return self.base_mib + self.ratio * Decimal(vm_mib)

    def overhead_block(self) -> dict[str, str]:
        """The policy's `spec.overhead` fields, ready to paste."""
        block = {
            "guestMemoryBase": f"{self.base_mib}Mi",
            "guestMemoryRatio": str(self.ratio),
        }
        if self.host_mib is not None:
            block["hostMemory"] = f"{self.host_mib}Mi"
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


def fit_overhead(samples: Sequence[Sample], margin: Decimal = Decimal("0.10")) -> Fit:
    """Fit unusable(V) = base + ratio * V as the tightest line above every sample.

    The origin is added as a constraint point (an empty VM loses no memory), which keeps
    base >= 0 without counting the origin's over-coverage. Ratio is constrained to >= 0
    (a negative slope is noise: the line then sits flat on the highest sample); a ratio of
    0.9 or more is refused. Base is rounded up to whole MiB and ratio up to four places,
    and base is recomputed for the rounded ratio, so the rounded line still covers all.
    """
    if isinstance(margin, bool) or not isinstance(margin, (int, Decimal)) or margin < 0:
        raise CalibrationError(f"margin {margin!r} must be a Decimal of zero or more")
    sizes = {s.vm_nominal_mib for s in samples}
    if len(samples) < 2 or len(sizes) < 2:
        raise CalibrationError(
            f"need samples at two or more distinct VM sizes (vm_nominal_mib) to fit a "
            f"ratio; got {len(samples)} sample(s) at {len(sizes)} size(s)"
        )
    points = [(Fraction(s.vm_nominal_mib), s.unusable_mib) for s in samples]
    mean_x = sum((x for x, _ in points), Fraction(0)) / len(points)
    edge = _tightest_cover([*points, (Fraction(0), Fraction(0))], mean_x)
    ratio = _ceil_places(max(_slope(edge), Fraction(0)), RATIO_PLACES)
    if ratio >= MAX_RATIO:
        raise CalibrationError(
            f"fitted guestMemoryRatio {ratio} is not below {_decimal(MAX_RATIO)} (the ratio "
            f"must be in [0, {_decimal(MAX_RATIO)})): unusable memory grows by {ratio} MiB "
            f"per MiB of VM between {_describe(edge, samples)}; check free_total_mib and "
            "free_used_mib there"
        )
    exact_ratio = Fraction(ratio)
    base = max(0, math.ceil(max(y - exact_ratio * x for x, y in points)))
    residuals = tuple(_decimal(base + exact_ratio * x - y) for x, y in points)
    hosts = [h for h in (s.host_mib for s in samples) if h is not None]
    return Fit(
        base_mib=base,
        ratio=ratio,
        host_mib=math.ceil(max(hosts)) if hosts else None,
        residuals_mib=residuals,
        max_guest_daemons_mib=max(s.free_used_mib for s in samples),
        margin=Decimal(margin),
    )


def _describe(edge: tuple[Point, Point], samples: Sequence[Sample]) -> str:
    def where(point: Point) -> str:
        if point[0] == 0:
            return "the origin"
        # Several rows may share a VM size; the hull vertex is the highest of them.
        row = max(
            (s for s in samples if s.vm_nominal_mib == point[0]), key=lambda s: s.unusable_mib
        )
        at = "" if row.line is None else f"line {row.line} "
        return f"{at}(vm_nominal_mib {row.vm_nominal_mib}, unusable {_decimal(row.unusable_mib)})"

    return f"{where(edge[0])} and {where(edge[1])}"
