"""The status the operator writes on a KataSizingPolicy, as pydantic models: the CRD's status
schema (`crdgen`) and what the pass, the measurement and the proposal return, dumped once at the
status write. Never parsed from input (`parse_policy` drops a policy's status).
"""


# No `from __future__ import annotations`: pydantic would compile and evaluate every field's
# annotation from its string when the models are built, on each CLI start.
from typing import Any, Literal, Self

from pydantic import (
    ConfigDict,
    Field,
)

from .modelbase import ApiModel, Resources


class _Status(ApiModel):
    """Status is written by the operator and never parsed from input (parse_policy drops it):
    these models are built on first use (crdgen, the tests), not on every CLI run."""

    model_config = ConfigDict(defer_build=True, strict=False)

    def replaced(self, **changes: Any) -> Self:
        """A copy with `changes` (by field name), validated as a new model is: a misspelt field or
        a value of the wrong type fails here, where `model_copy(update=...)` takes it silently."""
        fields = type(self).model_fields
        return self.model_validate({**{name: getattr(self, name) for name in fields}, **changes})


class Condition(_Status):
    """A Kubernetes condition: Valid, InSync, Conflict or Ready."""

    type: str = Field(description="Valid, InSync, Conflict or Ready.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="One CamelCase word saying why (shown by kubectl get ksp).")
    message: str = Field(default="", description="What is wrong, for people.")
    observed_generation: int | None = Field(
        default=None, description="The policy generation this condition describes."
    )
    last_transition_time: str | None = Field(
        default=None, description="When status last changed (RFC 3339)."
    )


class LargestVm(_Status):
    """The VM Kata boots for the largest pod of a class."""

    vcpus: int = Field(description="vCPUs at boot.")
    memory_mib: int = Field(alias="memoryMiB", description="VM memory, MiB.")


class ClassStatus(_Status):
    """One sized class as applied."""

    name: str = Field(description="The class name.")
    runtime_class: str = Field(description="The RuntimeClass (and handler) name.")
    pod_fixed: Resources = Field(description="The RuntimeClass overhead.podFixed.")
    overhead_vcpus: str | None = Field(default=None, description="overhead_vcpus in the drop-in (Rust runtime).")
    overhead_memory: str | None = Field(default=None, description="overhead_memory in the drop-in (Rust runtime).")
    default_vcpus: int = Field(description="default_vcpus in the drop-in.")
    default_memory: str = Field(description="default_memory in the drop-in.")
    largest_vm: LargestVm = Field(description="The VM of the class's largest pod.")


class NodesStatus(_Status):
    seen: int = Field(default=0, description="Nodes matching spec.nodes.selector.")
    groups: int = Field(default=0, description="Groups of identical nodes in the guidance ConfigMap.")
    with_warnings: int = Field(default=0, description="Nodes whose guidance carries a warning.")


class OverheadStatus(_Status):
    """The overhead function in effect: the policy's fields, a fit of its samples, or defaults."""

    guest_memory_base: str = Field(description="Memory the guest keeps whatever its size.")
    guest_memory_ratio: str = Field(description="Fraction of VM memory the workload cannot use.")
    guest_cpu: str = Field(description="Guest CPU budget.")
    host_memory: str = Field(description="Host-side memory outside the VM.")
    host_cpu: str = Field(description="Host-side CPU.")
    margin: str = Field(description="Safety margin on the guest budget.")
    fitted: bool = Field(default=False, description="True when fitted from spec.overhead.samples.")


class UnmanagedRuntimeClass(_Status):
    """A RuntimeClass with a Kata handler that no policy manages, and what is wrong with it."""

    runtime_class: str = Field(description="The RuntimeClass name.")
    handler: str | None = Field(default=None, description="Its handler.")
    severity: Literal["error", "warning"] = Field(description="error: pods are under-accounted; warning: a risk.")
    rule: str = Field(description="The sizing rule it breaks.")
    message: str = Field(description="What is wrong, with the two values.")
    fix: str = Field(default="", description="How to fix it.")


class PodAuditCount(_Status):
    """How many running pods of one class break one rule."""

    class_name: str = Field(alias="class", description="The class (none: a pod asking to be routed that has no class).")
    rule: str = Field(description="The rule id (docs/rules.md): pod-envelope-exceeded, pod-memory-limit-missing, "
                      "pod-not-routed, pod-sandbox-memory-zero.")
    pods: int = Field(description="Pods breaking it.")


class PodAuditFinding(_Status):
    """One running pod outside its class, with the admission policies' message."""

    pod: str = Field(description="namespace/name.")
    runtime_class: str = Field(description="Its runtimeClassName (empty: none).")
    class_name: str = Field(alias="class", description="The policy's class of that RuntimeClass.")
    rule: str = Field(description="The rule it breaks.")
    action: Literal["Deny", "Warn", "Audit"] = Field(description="What spec.admission does with the rule at admission.")
    message: str = Field(description="The pod's figures, the class envelope and the smallest class that fits.")


class PodAuditStatus(_Status):
    """Kata pods of this policy's classes that are outside their class's envelope or have no
    memory limit (created before the policy, or admitted with Warn or Audit)."""

    pods: int = Field(default=0, description="Pods with at least one finding.")
    counts: list[PodAuditCount] = Field(default_factory=list, description="Pods per class and rule.")
    listed: list[PodAuditFinding] = Field(
        default_factory=list, description="The findings, by namespace/name; at most 50 (see truncated).")
    truncated: bool = Field(default=False, description="More findings exist than are listed.")


class MeasuredClass(_Status):
    """What one class's pods used on their nodes over the window (docs/measurement.md). Bytes are
    exact for max and min; p50/p99 within 0.5% (a fixed-size sketch)."""

    name: str = Field(description="The class.")
    runtime_class: str = Field(description="Its RuntimeClass.")
    pods_measured: int = Field(default=0, description="Pods of the class in each node's latest reading.")
    pods_without_limit: int = Field(default=0, description="... of them without a memory limit (no headroom).")
    pods_not_measured: int = Field(
        default=0, description="Pods of the class on the nodes read that the last reading could not measure (not in "
        "the Summary yet, or without figures).")
    pods_under_threshold: int = Field(default=0, description="... of them with headroom under spec.measurement.headroomWarning.")
    samples: int = Field(default=0, description="Pod readings in the window.")
    overhead_p50_bytes: int | None = Field(default=None, description="Overhead used (pod working set - containers') p50.")
    overhead_p99_bytes: int | None = Field(default=None, description="... p99.")
    overhead_max_bytes: int | None = Field(default=None, description="... the largest.")
    overhead_max_pod: str | None = Field(default=None, description="The pod (namespace/name) of the largest.")
    min_headroom_bytes: int | None = Field(default=None, description="Least headroom (cgroup limit - working set) seen.")
    min_headroom_pod: str | None = Field(default=None, description="Its pod (namespace/name).")
    min_headroom_node: str | None = Field(default=None, description="Its node.")
    min_headroom_at: str | None = Field(default=None, description="When (RFC 3339).")
    last_measured: str | None = Field(default=None, description="The latest reading of a pod of the class (RFC 3339).")


class HeadroomLowPod(_Status):
    """A pod whose headroom is under the threshold: its VMM is close to an OOM kill."""

    pod: str = Field(description="namespace/name.")
    node: str = Field(description="Its node.")
    class_name: str = Field(alias="class", description="Its class.")
    headroom_bytes: int = Field(description="cgroup limit - working set.")
    threshold_bytes: int = Field(description="The threshold it is under.")
    measured_at: str = Field(description="When (RFC 3339).")


class SkippedNode(_Status):
    """A node whose Summary could not be read at its last turn; its last reading stands."""

    node: str = Field(description="The node.")
    reason: str = Field(description="Why (the HTTP status and message, or the timeout).")
    failures: int = Field(description="Reads failed in a row.")
    since: str | None = Field(default=None, description="The last failure (RFC 3339).")


class MeasurementStatus(_Status):
    """The operator's reading of the kubelets' Summaries for this policy's pods."""

    interval_seconds: int = Field(description="Each node read once per interval.")
    window_seconds: int = Field(description="The window of the figures.")
    nodes: int = Field(default=0, description="Nodes running this policy's pods that were read.")
    nodes_skipped: int = Field(default=0, description="... of them whose last read failed.")
    skipped: list[SkippedNode] = Field(default_factory=list, description="The first 20 of them, by name.")
    classes: list[MeasuredClass] = Field(default_factory=list, description="Per class.")
    under_threshold: list[HeadroomLowPod] = Field(
        default_factory=list, description="Pods under the headroom threshold, least headroom first; at most 20.")


class ClassPin(_Status):
    """A class's values that the proposal keeps (a refit does not lower them on rows that cannot speak
    for the class): set them on the class (spec.classes[]) with the proposed spec.overhead."""

    overhead_memory: str | None = Field(default=None, description="overheadMemory to set (Rust runtime).")
    default_memory: str | None = Field(default=None, description="defaultMemory to set (Go runtime).")
    pod_fixed: Resources = Field(description="podFixed to set.")


class ProposedPart(_Status):
    """Where a part of a Kata pod's memory comes from in the proposal (docs/sizing-model.md, What each
    row saw): the survey rows that saw it, and the stated default that stands in where they did not."""

    part: Literal["guest kernel", "guest userland", "VMM", "virtiofsd", "shim"] = Field(description="The part.")
    measured: str | None = Field(default=None, description="The rows that saw it (lines of the CSV).")
    detail: str | None = Field(default=None, description="How they saw it, where that matters.")
    assumed_mib: int | None = Field(
        default=None, alias="assumedMiB", description="The stated default added for the rows that did not.")
    assumed_for: str | None = Field(default=None, description="Those rows.")
    source: str | None = Field(default=None, description="Where the default comes from.")


class ProposedClass(_Status):
    name: str = Field(description="The class.")
    pod_fixed: Resources = Field(description="The proposed overhead.podFixed.")
    pod_fixed_before: Resources = Field(description="podFixed as the policy sizes it now.")
    guest_budget_mib: int | None = Field(
        default=None, alias="guestBudgetMiB", description="The proposed guest budget (overhead_memory or "
        "default_memory).")
    guest_budget_before_mib: int | None = Field(
        default=None, alias="guestBudgetBeforeMiB", description="The guest budget as the policy sizes it now.")
    kept: list[str] = Field(
        default_factory=list, description="Why the proposal keeps the class's podFixed and guest budget (not "
        "lowered on rows that cannot speak for it).")
    pin: ClassPin | None = Field(default=None, description="The values to set on the class to keep them.")
    pods_measured: int = Field(default=0, description="Survey rows of this class with a memory limit.")
    min_headroom_bytes: int | None = Field(
        default=None, description="The least headroom one of them would have in the VM the proposal gives it.")
    headroom_warning_bytes: int | None = Field(
        default=None, description="The warning line its pods are judged by under the proposed podFixed.")
    extrapolated: bool = Field(
        default=False, description="Its largest VM lies beyond the largest surveyed VM: the fit is extrapolated.")
    refuted: list[str] = Field(
        default_factory=list, description="Why the survey refutes the class's explicit guest budget, if it does.")


class ProposalStatus(_Status):
    """A refit of the overhead function from spec.overhead.survey, for a person to apply."""

    source: str = Field(description="The ConfigMap and key read.")
    rows: int = Field(default=0, description="Survey rows fitted.")
    overhead: dict[str, str] = Field(default_factory=dict, description="The spec.overhead fields to set.")
    classes: list[ProposedClass] = Field(default_factory=list, description="What they give per class.")
    host_raised_mib: int = Field(
        default=0, alias="hostRaisedMiB", description="MiB added to hostMemory so every measured pod fits.")
    host_side: str | None = Field(
        default=None, description="How the host side was made up (which row, what it counted, what was assumed), "
        "or that no row measured it.")
    parts: list[ProposedPart] = Field(
        default_factory=list, description="Each part of a pod's memory: measured by which rows, or assumed.")
    notes: list[str] = Field(default_factory=list, description="What the fit says about the rows.")
    error: str | None = Field(default=None, description="Why there is no proposal (the survey unreadable or unfittable).")


class KataSizingPolicyStatus(_Status):
    observed_generation: int | None = Field(
        default=None, description="The policy generation the operator last acted on."
    )
    runtime: Literal["Rust", "Go"] | None = Field(default=None, description="The runtime sized for.")
    class_names: str | None = Field(default=None, description="The classes, comma-separated (for kubectl get).")
    conditions: list[Condition] = Field(
        default_factory=list, description="Valid, InSync, Conflict and Ready, keyed by type."
    )
    classes: list[ClassStatus] = Field(default_factory=list, description="The sized classes as applied.")
    drift_corrections: int = Field(default=0, description="Hand edits put back (driftPolicy Correct).")
    drift_detected: int = Field(default=0, description="Hand edits reported, not corrected (driftPolicy Report).")
    warnings: list[str] = Field(
        default_factory=list, description="Sizing warnings of a valid policy (pods without limits under-accounted)."
    )
    overhead: OverheadStatus | None = None
    nodes: NodesStatus | None = Field(default=None, description="What the node guidance covers.")
    unmanaged_runtime_classes: list[UnmanagedRuntimeClass] = Field(
        default_factory=list,
        description="Audit of Kata RuntimeClasses on the cluster that no policy manages.",
    )
    pod_audit: PodAuditStatus | None = Field(
        default=None, description="Audit of the running pods of this policy's classes (from the operator's pod cache).")
    measurement: MeasurementStatus | None = Field(
        default=None, description="What this policy's pods use on their nodes, from the kubelets' Summaries.")
    proposal: ProposalStatus | None = Field(
        default=None, description="The overhead function refitted from spec.overhead.survey (never applied).")
