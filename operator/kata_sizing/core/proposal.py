"""A refit of a policy's overhead function from survey rows, as a proposal (docs/measurement.md).

`calibrate --policy`, `render --proposal` and the operator (a survey named by spec.overhead.survey,
proposed in status) all call `propose`, with the policy's own margin unless the command is given
one; none of them changes a policy: the proposal is for a person or a GitOps change to apply.

The fit (calibrate.fit_overhead) covers every row's unusable memory. A proposal also keeps the
promises the operator then checks, for every measured pod with a memory limit:

- its headroom is predicted for the VM the proposal implies: a class whose guest budget changes by
  D MiB boots a VM D MiB larger, and a fully resident VM (confidential guests: the pod cgroup holds
  the whole VM) then holds D MiB more in the pod cgroup. Predicted headroom = its limits + the
  proposed podFixed - (its measured working set + D, or + 0 when the VM was not fully resident);
- hostMemory is chosen, with the margin on the host side the rows give, so that every such pod stays
  at or above the warning line it will be judged by (spec.measurement.headroomWarning, a share of what
  the proposed podFixed holds beyond the guest budget: core/headroom.py). hostMemory raises every
  class's podFixed alike (podFixed = guest part + hostMemory in both runtimes); a class with an
  explicit podFixed is not refitted and is only reported;
- a class whose largest VM lies beyond the largest surveyed VM is flagged as extrapolated, and an
  explicit guest budget (defaultMemory in the Go runtime, overheadMemory in the Rust one) that the
  fitted line says leaves the class's largest pod less than its limit is named as refuted.

The lowering rule (docs/sizing-model.md, "What a proposal may lower"): each part of a pod's memory
comes from rows that saw it or from a stated default (calibrate.fit_overhead, Fit.parts); a host side
no row measured stays the policy's hostMemory. A class's podFixed or guest budget is lowered only when
its largest VM (as the proposal sizes it) lies within the measured VMs; otherwise the class keeps both
(its guest budget the larger of its current and proposed one, its podFixed the larger of its current
one and the proposed one moved up with that budget), set on the class as explicit values (`pin`), and
the proposal says why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from .calibrate import CalibrationError, Fit, Sample, checked_overhead_block, fit_overhead
from .defaults import Runtime
from .headroom import HeadroomThreshold, mib_text
from .model import KataSizingPolicy, PolicyError, Resources, parse_policy
from .quantity import MIB, format_mib
from .sizing import (
    ClassSizing,
    PolicySizing,
    SandboxRefused,
    explain_pod,
    guest_budget_mib,
    overhead_function,
    size_policy,
)
from .statusmodel import ClassPin, ProposalStatus, ProposedClass, ProposedPart


@dataclass(frozen=True)
class ClassProposal:
    name: str
    runtime_class: str
    pod_fixed_before: dict[str, str]
    pod_fixed: dict[str, str]
    guest_budget_mib: int
    explicit_pod_fixed: bool
    guest_budget_before_mib: int = 0
    # The measured pods of this class with a memory limit, and the least headroom one of them would
    # have in the VM the proposal gives it (None: no such pod was measured).
    pods: int = 0
    min_headroom_bytes: int | None = None
    min_headroom_pod: str | None = None
    # The warning line its pods are judged by under the proposed podFixed (headroomWarning).
    warning_line_bytes: int = 0
    largest_vm_mib: int = 0
    envelope_memory_mib: int = 0
    extrapolated: bool = False
    refuted: tuple[str, ...] = ()
    # Why the class keeps its values (not lowered on rows that cannot speak for it), and the class
    # fields that keep them (spec.classes[]: overheadMemory or defaultMemory, podFixed).
    kept: tuple[str, ...] = ()
    pin: dict | None = None

    @property
    def under_line(self) -> bool:
        return self.min_headroom_bytes is not None and self.min_headroom_bytes < self.warning_line_bytes

    def as_dict(self) -> dict:
        found = {"name": self.name, "runtimeClass": self.runtime_class, "podFixed": self.pod_fixed,
                 "podFixedBefore": self.pod_fixed_before, "guestBudgetMiB": self.guest_budget_mib,
                 "guestBudgetBeforeMiB": self.guest_budget_before_mib,
                 "largestVmMiB": self.largest_vm_mib, "extrapolated": self.extrapolated,
                 "podsMeasured": self.pods, "headroomWarningBytes": self.warning_line_bytes}
        if self.min_headroom_bytes is not None:
            found["minHeadroomBytes"] = self.min_headroom_bytes
            found["minHeadroomPod"] = self.min_headroom_pod
        if self.refuted:
            found["refuted"] = list(self.refuted)
        if self.kept:
            found["kept"] = list(self.kept)
            found["pin"] = self.pin
        return found


@dataclass(frozen=True)
class Proposal:
    overhead: dict[str, str]  # the spec.overhead fields to set
    classes: tuple[ClassProposal, ...]
    rows: int
    fit: Fit
    refitted: KataSizingPolicy  # the policy with the proposal applied (overhead and kept classes)
    host_raised_mib: int = 0
    host_raised_for: str | None = None
    notes: tuple[str, ...] = ()
    margin: Decimal = Decimal("0.10")
    threshold: HeadroomThreshold = HeadroomThreshold()
    host_memory_mib: int = 0  # the hostMemory the proposal sizes with (proposed, or the policy's)

    @property
    def host_side(self) -> str:
        """How the host side was made up, or that no row measured it and the policy's hostMemory stays."""
        if self.fit.host_basis is None:
            return f"not measured by any row: the policy's hostMemory ({self.host_memory_mib} MiB) stays"
        return self.fit.host_basis

    @property
    def pins(self) -> dict[str, dict]:
        """{class: the fields that keep it}: to set on spec.classes[] with the proposed spec.overhead."""
        return {c.name: c.pin for c in self.classes if c.pin}

    def classes_block(self) -> list[dict] | None:
        """spec.classes to set with the overhead when a class is kept (every class: the list replaces the
        policy's), None when none is."""
        if not self.pins:
            return None
        return [c.model_dump(by_alias=True, exclude_none=True) for c in self.refitted.spec.effective_classes]

    @property
    def uncovered(self) -> list[ClassProposal]:
        """Classes with a measured pod the proposal would leave under its warning line."""
        return [c for c in self.classes if c.under_line]

    @property
    def refuted(self) -> list[ClassProposal]:
        return [c for c in self.classes if c.refuted]

    @property
    def surveyed_vm_mib(self) -> Decimal:
        return self.fit.largest_vm_mib

    def as_dict(self) -> dict:
        found = {"overhead": dict(self.overhead), "rows": self.rows, "margin": str(self.margin),
                 "headroomWarning": self.threshold.describe(), "largestSurveyedVmMiB": _plain(self.surveyed_vm_mib),
                 "hostSide": self.host_side, "parts": [p.as_dict() for p in self.fit.parts],
                 "classes": [c.as_dict() for c in self.classes]}
        if self.classes_block() is not None:
            found["specClasses"] = self.classes_block()
        if self.host_raised_mib:
            found["hostRaisedMiB"] = self.host_raised_mib
            found["hostRaisedFor"] = self.host_raised_for
        if self.notes:
            found["notes"] = list(self.notes)
        return found


def _plain(value: Decimal) -> str:
    return format(value.normalize(), "f")


def with_overhead(policy: KataSizingPolicy, block: dict[str, str],
                  pins: dict[str, dict] | None = None) -> KataSizingPolicy:
    """The policy with these spec.overhead fields set and its inline samples dropped (the fields
    say what the samples would), and the `pins` ({class: fields}) set on its classes."""
    spec = policy.spec.model_dump(by_alias=True, exclude_none=True)
    spec["overhead"] = {**spec.get("overhead", {}), **block}
    spec["overhead"].pop("samples", None)
    spec["overhead"].pop("survey", None)
    if pins:
        spec["classes"] = [{**c.model_dump(by_alias=True, exclude_none=True), **pins.get(c.name, {})}
                           for c in policy.spec.effective_classes]
    try:
        return parse_policy({"metadata": {"name": policy.name}, "spec": spec})
    except PolicyError as exc:
        raise CalibrationError([f"the refitted policy is not valid: {p}" for p in exc.problems]) from None


def _sized(policy: KataSizingPolicy) -> PolicySizing:
    sizing = size_policy(policy)
    if sizing.errors:
        raise CalibrationError([f"the refitted policy breaks a rule: {p}" for p in sizing.errors])
    return sizing


def _limits_bytes(sample: Sample) -> int:
    return math.ceil(sample.container_limit_mib * MIB)


@dataclass(frozen=True)
class _Pod:
    """A measured pod with a memory limit, as the proposed sizing will see it."""

    name: str
    class_name: str
    limits_bytes: int
    usage_bytes: int  # its working set in the VM the proposal gives it


def _pods(samples: Sequence[Sample], sizing: PolicySizing) -> list[_Pod]:
    """The measured pods that have a memory limit (a cgroup limit) and a class of the policy, each
    with its working set moved to the proposed VM: a fully resident VM holds its size change."""
    by_name = {c.name: c for c in sizing.classes}
    pods = []
    for sample in samples:
        sized = by_name.get(sample.class_name or "")
        working_set = sample.pod_working_set_bytes
        if sized is None or sample.pod_cgroup_limit_bytes is None or not sample.measured_by_kubelet \
                or working_set is None:
            continue
        limits = _limits_bytes(sample)
        try:
            vm = explain_pod(sizing, sized.name, None, limits).vm.memory_mib
        except SandboxRefused:
            continue  # Kata would not boot it under the proposal: validate says so for the class
        delta_bytes = int((vm - sample.vm_nominal_mib) * MIB) if sample.resident else 0
        pods.append(_Pod(sample.pod or f"line {sample.line}", sized.name, limits,
                         working_set + delta_bytes))
    return pods


def predicted_headroom_bytes(pod: _Pod, sized: ClassSizing) -> int:
    """What the measurement will compute for this pod in the proposed class: cgroup limit (its limits
    + podFixed) - working set."""
    return pod.limits_bytes + sized.pod_fixed_memory_mib * MIB - pod.usage_bytes


def _host_for_line(pod: _Pod, guest_part_mib: int, guest_budget_mib: int, threshold: HeadroomThreshold,
                   margin: Decimal) -> int | None:
    """The least hostMemory (MiB) that keeps `pod` at or above its warning line, with `margin` on what
    it holds beyond its limits and guest part (podFixed = guest part + hostMemory; the line a share of
    podFixed beyond the guest budget); None when no hostMemory can (a line of 100%)."""
    beyond = Fraction(pod.usage_bytes - pod.limits_bytes - guest_part_mib * MIB)
    if beyond > 0:
        beyond *= 1 + Fraction(margin)
    fraction = Fraction(threshold.fraction or 0) if threshold.fixed_bytes is None else Fraction(0)
    if fraction >= 1:
        return None
    fixed = threshold.fixed_bytes or 0
    # The guest part beyond the guest budget (runtime-rs: a fallback default_memory above it) is in the share.
    extra_mib = guest_part_mib - guest_budget_mib
    host = max(1, math.ceil((beyond + fixed + fraction * extra_mib * MIB) / ((1 - fraction) * MIB)))
    # The line is rounded up to whole bytes: step past it if the closed form landed just under.
    while host * MIB - beyond < threshold.line_bytes((guest_part_mib + host) * MIB, guest_budget_mib * MIB):
        host += 1
    return host


def _kept(before: ClassSizing, after: ClassSizing, fit: Fit) -> tuple[str, ...]:
    """Why a class keeps its podFixed and guest budget (the lowering rule, module docstring): the
    proposal would lower one of them, and its largest VM lies beyond the VMs the rows measured."""
    lowered = [what for what, now, proposed in (
        ("podFixed.memory", before.pod_fixed_memory_mib, after.pod_fixed_memory_mib),
        ("guest budget", before.guest_budget_mib, after.guest_budget_mib)) if proposed < now]
    vm = after.largest_vm.memory_mib
    if not lowered or vm <= fit.largest_vm_mib:
        return ()
    return (f"its largest VM, {vm} MiB as refitted, lies beyond the rows' largest ({_plain(fit.largest_vm_mib)} "
            f"MiB): its {' and '.join(lowered)} would be lowered on a line extrapolated past the data",)


def _pin(before: ClassSizing, after: ClassSizing, runtime: Runtime) -> dict:
    """The class fields that keep its values: the larger of its current and proposed guest budget, and
    podFixed the larger of its current value and the proposed one moved up with the guest budget, so
    what podFixed holds beyond the guest budget (the host side's share, which its pods' headroom and
    warning line are checked against) is at least the proposal's."""
    budget = max(before.guest_budget_mib, after.guest_budget_mib)
    pod_fixed = max(before.pod_fixed_memory_mib, after.pod_fixed_memory_mib + budget - after.guest_budget_mib)
    field = "defaultMemory" if runtime is Runtime.GO else "overheadMemory"
    return {field: format_mib(budget), "podFixed": {"cpu": after.pod_fixed["cpu"], "memory": format_mib(pod_fixed)}}


def _refuted(sized: ClassSizing, runtime: Runtime, fit: Fit) -> tuple[str, ...]:
    """Why the survey refutes this class's explicit guest budget, if it does: in the class's largest
    VM the fitted line (an upper envelope of every row) has the guest keeping more than the budget
    leaves, so its largest pod cannot use its whole limit."""
    field, budget = (("defaultMemory", sized.default_memory_mib) if runtime is Runtime.GO
                     else ("overheadMemory", sized.overhead_memory_mib))
    if ("default_memory" if runtime is Runtime.GO else "overhead_memory") not in sized.explicit or budget is None:
        return ()
    vm = sized.largest_vm.memory_mib
    kept = fit.unusable_mib(vm)
    usable = vm - kept
    if usable >= sized.envelope_memory_mib:
        return ()
    needed = guest_budget_mib(fit.base_mib, fit.ratio, sized.envelope_memory_mib, Decimal(0))
    return (f"{field} {format_mib(budget)} is refuted by the survey: the class's largest pod "
            f"({sized.envelope_memory_mib} MiB) boots a VM of {vm} MiB, where the fitted line (base {fit.base_mib} "
            f"MiB, ratio {fit.ratio}) has the guest keeping {kept:.0f} MiB, so the pod can use {usable:.0f} MiB of "
            f"its limit; a guest budget of at least {needed} MiB (before the margin) covers it",)


def propose(policy: KataSizingPolicy, samples: Sequence[Sample], margin: Decimal | None = None) -> Proposal:
    """Refit `policy`'s overhead function from `samples` (with the policy's own margin unless one
    is given) and check the result against every measured pod; CalibrationError when the rows
    cannot be fitted or the result is not valid."""
    current, _ = overhead_function(policy.spec)
    margin = current.margin if margin is None else margin
    threshold = HeadroomThreshold.parse(policy.spec.measurement.headroom_warning)
    fit = fit_overhead(samples, margin=margin, assumed_host_mib=current.host_memory_mib)
    block = fit.overhead_block()
    notes = list(fit.notes)
    before = {c.name: c for c in size_policy(policy).classes}
    strangers = sorted({s.class_name for s in samples if s.class_name and s.class_name not in before})
    if strangers:
        notes.append(f"rows of class(es) {', '.join(strangers)} are not classes of policy {policy.name}: "
                     "fitted, but not checked against a podFixed")
    refitted = with_overhead(policy, checked_overhead_block(block))
    sizing = _sized(refitted)
    pods = _pods(samples, sizing)
    by_name = {c.name: c for c in sizing.classes}
    host = sizing.overhead.host_memory_mib
    needed, raised_for, impossible = host, None, []
    for pod in pods:
        sized = by_name[pod.class_name]
        if "pod_fixed" in sized.explicit:
            continue
        wanted = _host_for_line(pod, sized.pod_fixed_memory_mib - host, sized.guest_budget_mib, threshold, margin)
        if wanted is None:
            impossible.append(pod.name)
        elif wanted > needed:
            needed, raised_for = wanted, pod.name
    if impossible:
        notes.append(f"no hostMemory keeps pod(s) {', '.join(impossible[:5])} above a headroom warning of "
                     f"{threshold.describe()}")
    host_raised = needed - host
    if host_raised:
        block = {**block, "hostMemory": f"{needed}Mi"}
        notes.append(f"hostMemory raised by {host_raised} MiB to {needed} MiB so that every measured pod stays at or "
                     f"above its headroom warning ({threshold.describe()}); pod {raised_for} needs it")
        refitted = with_overhead(policy, checked_overhead_block(block))
        sizing = _sized(refitted)
    kept = {c.name: reasons for c in sizing.classes if (reasons := _kept(before[c.name], c, fit))}
    pins = {name: _pin(before[name], sizing.class_named(name), sizing.runtime) for name in kept}
    extrapolated = {c.name for c in sizing.classes if c.largest_vm.memory_mib > fit.largest_vm_mib}
    if pins:
        refitted = with_overhead(policy, checked_overhead_block(block), pins)
        sizing = _sized(refitted)
        pods = _pods(samples, sizing)  # a kept class boots the VM of its kept guest budget
    classes = []
    for sized in sizing.classes:
        mine = [(predicted_headroom_bytes(p, sized), p.name) for p in pods if p.class_name == sized.name]
        least, least_pod = min(mine) if mine else (None, None)
        line = threshold.line_bytes(sized.pod_fixed_memory_mib * MIB, sized.guest_budget_mib * MIB)
        explicit = "pod_fixed" in sized.explicit and sized.name not in pins
        if explicit and least is not None and least < line:
            notes.append(f"class {sized.name} has an explicit podFixed, which a refit does not change: pod {least_pod} "
                         f"would have {mib_text(least)} of headroom, under its warning line {mib_text(line)}")
        was = before[sized.name]
        classes.append(ClassProposal(
            name=sized.name, runtime_class=sized.runtime_class, pod_fixed_before=was.pod_fixed,
            pod_fixed=sized.pod_fixed, guest_budget_mib=sized.guest_budget_mib, explicit_pod_fixed=explicit,
            guest_budget_before_mib=was.guest_budget_mib,
            pods=len(mine), min_headroom_bytes=least, min_headroom_pod=least_pod, warning_line_bytes=line,
            largest_vm_mib=sized.largest_vm.memory_mib, envelope_memory_mib=sized.envelope_memory_mib,
            extrapolated=sized.name in extrapolated,
            refuted=_refuted(sized, sizing.runtime, fit), kept=kept.get(sized.name, ()), pin=pins.get(sized.name)))
    return Proposal(overhead=block, classes=tuple(classes), rows=len(samples), fit=fit,
                    host_raised_mib=host_raised, host_raised_for=raised_for, notes=tuple(notes),
                    refitted=refitted, margin=Decimal(margin), threshold=threshold,
                    host_memory_mib=sizing.overhead.host_memory_mib)


def proposal_status(policy: KataSizingPolicy, csv_text: str | None, source: str) -> ProposalStatus:
    """status.proposal for a survey's CSV text (None: the ConfigMap or its key is missing)."""
    from .calibrate import parse_samples_csv

    if csv_text is None:
        return ProposalStatus(source=source, error=f"{source} not found")
    try:
        proposal = propose(policy, parse_samples_csv(csv_text))
    except CalibrationError as exc:
        return ProposalStatus(source=source, error="; ".join(exc.problems)[:1000])
    return ProposalStatus(
        source=source, rows=proposal.rows, overhead=dict(proposal.overhead),
        classes=[ProposedClass(
            name=c.name, pod_fixed=Resources(**c.pod_fixed), pod_fixed_before=Resources(**c.pod_fixed_before),
            guest_budget_mib=c.guest_budget_mib, guest_budget_before_mib=c.guest_budget_before_mib,
            pods_measured=c.pods, min_headroom_bytes=c.min_headroom_bytes, headroom_warning_bytes=c.warning_line_bytes,
            extrapolated=c.extrapolated, refuted=list(c.refuted), kept=list(c.kept),
            pin=None if c.pin is None else ClassPin.model_validate(c.pin)) for c in proposal.classes],
        host_raised_mib=proposal.host_raised_mib, host_side=proposal.host_side,
        parts=[ProposedPart.model_validate(p.as_dict()) for p in proposal.fit.parts], notes=list(proposal.notes))
