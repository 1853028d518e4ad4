"""A refit of a policy's overhead function from survey rows, as a proposal (docs/measurement.md).

`calibrate --policy`, `render --samples` and the operator (a survey named by
spec.overhead.survey, proposed in status) all call `propose`; none of them changes a
policy: the proposal is for a person or a GitOps change to apply.

The fit (calibrate.fit_overhead) covers every row's unusable memory. A proposal also checks
what a user would see: every measured pod with a memory limit must fit under the cgroup limit
the proposal gives it (its limits + its class's proposed podFixed). Where one would not, the
host side is raised by that pod's shortfall times (1 + margin), which raises every class's
podFixed alike (podFixed = guest part + hostMemory in both runtimes); a class with an explicit
podFixed is not refitted and is only reported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from .calibrate import CalibrationError, Fit, Sample, fit_overhead
from .model import KataSizingPolicy, PolicyError, ProposalStatus, ProposedClass, Resources, parse_policy
from .quantity import MIB
from .sizing import PolicySizing, overhead_function, size_policy


@dataclass(frozen=True)
class ClassProposal:
    name: str
    runtime_class: str
    pod_fixed_before: dict[str, str]
    pod_fixed: dict[str, str]
    guest_budget_mib: int
    explicit_pod_fixed: bool
    # The measured pods of this class with a memory limit, and the least headroom one of them
    # would have under the proposed podFixed (None: no such pod was measured).
    pods: int = 0
    min_headroom_bytes: int | None = None
    min_headroom_pod: str | None = None

    def as_dict(self) -> dict:
        found = {"name": self.name, "runtimeClass": self.runtime_class, "podFixed": self.pod_fixed,
                 "podFixedBefore": self.pod_fixed_before, "guestBudgetMiB": self.guest_budget_mib,
                 "podsMeasured": self.pods}
        if self.min_headroom_bytes is not None:
            found["minHeadroomBytes"] = self.min_headroom_bytes
            found["minHeadroomPod"] = self.min_headroom_pod
        return found


@dataclass(frozen=True)
class Proposal:
    overhead: dict[str, str]  # the spec.overhead fields to set
    classes: tuple[ClassProposal, ...]
    rows: int
    fit: Fit
    host_raised_mib: int = 0
    host_raised_for: str | None = None
    notes: tuple[str, ...] = ()
    refitted: KataSizingPolicy | None = None

    @property
    def uncovered(self) -> list[ClassProposal]:
        return [c for c in self.classes if c.min_headroom_bytes is not None and c.min_headroom_bytes < 0]

    def as_dict(self) -> dict:
        found = {"overhead": dict(self.overhead), "rows": self.rows,
                 "classes": [c.as_dict() for c in self.classes]}
        if self.host_raised_mib:
            found["hostRaisedMiB"] = self.host_raised_mib
            found["hostRaisedFor"] = self.host_raised_for
        if self.notes:
            found["notes"] = list(self.notes)
        return found


def with_overhead(policy: KataSizingPolicy, block: dict[str, str]) -> KataSizingPolicy:
    """The policy with these spec.overhead fields set and its inline samples dropped (the fields
    say what the samples would)."""
    spec = policy.spec.model_dump(by_alias=True, exclude_none=True)
    spec["overhead"] = {**spec.get("overhead", {}), **block}
    spec["overhead"].pop("samples", None)
    spec["overhead"].pop("survey", None)
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


def _cover(samples: Sequence[Sample], sizing: PolicySizing) -> dict[str, tuple[int, int, str]]:
    """{class: (pods, least headroom in bytes, its pod)} under `sizing`, for the measured pods
    that have a memory limit (a cgroup limit) and a class of the policy."""
    by_name = {c.name: c for c in sizing.classes}
    found: dict[str, tuple[int, int, str]] = {}
    for sample in samples:
        sized = by_name.get(sample.class_name or "")
        if sized is None or sample.pod_cgroup_limit_bytes is None or not sample.measured_by_kubelet:
            continue
        headroom = _limits_bytes(sample) + sized.pod_fixed_memory_mib * MIB - sample.pod_working_set_bytes
        pods, least, pod = found.get(sized.name, (0, headroom, sample.pod or f"line {sample.line}"))
        if headroom < least:
            least, pod = headroom, sample.pod or f"line {sample.line}"
        found[sized.name] = (pods + 1, least, pod)
    return found


def propose(policy: KataSizingPolicy, samples: Sequence[Sample], margin: Decimal | None = None) -> Proposal:
    """Refit `policy`'s overhead function from `samples` and check the result against every
    measured pod; CalibrationError when the rows cannot be fitted or the result is not valid."""
    current, _ = overhead_function(policy.spec)
    margin = current.margin if margin is None else margin
    fit = fit_overhead(samples, margin=margin, assumed_host_mib=current.host_memory_mib)
    block = fit.overhead_block()
    notes = list(fit.notes)
    before = {c.name: c for c in size_policy(policy).classes}
    known = set(before)
    strangers = sorted({s.class_name for s in samples if s.class_name and s.class_name not in known})
    if strangers:
        notes.append(f"rows of class(es) {', '.join(strangers)} are not classes of policy {policy.name}: "
                     "fitted, but not checked against a podFixed")
    refitted = with_overhead(policy, block)
    sizing = _sized(refitted)
    covered = _cover(samples, sizing)
    host_raised, raised_for = 0, None
    adjustable = {c.name for c in sizing.classes if "pod_fixed" not in c.explicit}
    short = [(least, pod) for name, (_, least, pod) in covered.items() if least < 0 and name in adjustable]
    if short:
        least, raised_for = min(short)
        host_raised = math.ceil(Decimal(-least) * (1 + Decimal(margin)) / MIB)
        host = (fit.host_mib if fit.host_mib is not None else current.host_memory_mib) + host_raised
        block = {**block, "hostMemory": f"{host}Mi"}
        notes.append(f"hostMemory raised by {host_raised} MiB to {host} MiB: pod {raised_for} would have had "
                     f"{-least} bytes too little under its cgroup limit")
        refitted = with_overhead(policy, block)
        sizing = _sized(refitted)
        covered = _cover(samples, sizing)
    for name, (_, least, pod) in sorted(covered.items()):
        if least < 0:
            notes.append(f"class {name} has an explicit podFixed, which a refit does not change: pod {pod} "
                         f"would be {-least} bytes over its cgroup limit")
    classes = []
    for sized in sizing.classes:
        pods, least, pod = covered.get(sized.name, (0, None, None))
        classes.append(ClassProposal(
            name=sized.name, runtime_class=sized.runtime_class, pod_fixed_before=before[sized.name].pod_fixed,
            pod_fixed=sized.pod_fixed, guest_budget_mib=sized.guest_budget_mib,
            explicit_pod_fixed="pod_fixed" in sized.explicit, pods=pods, min_headroom_bytes=least,
            min_headroom_pod=pod))
    return Proposal(overhead=block, classes=tuple(classes), rows=len(samples), fit=fit,
                    host_raised_mib=host_raised, host_raised_for=raised_for, notes=tuple(notes),
                    refitted=refitted)


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
            pods_measured=c.pods, min_headroom_bytes=c.min_headroom_bytes) for c in proposal.classes],
        host_raised_mib=proposal.host_raised_mib, notes=list(proposal.notes))
