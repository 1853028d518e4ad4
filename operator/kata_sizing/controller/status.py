"""Concluding a pass, pure: its status, conditions, events and drift counts, computed once from
the plan and what the executor reports (docs/operation.md: Status, Events).

The status is the pydantic model the CRD's schema is generated from
(`core.statusmodel.KataSizingPolicyStatus`), built here and dumped once, when it is written
(`status_fields`). What an event or a status line says about an object comes from the reason
`plan.decide` gave with its action (`_said`), never from looking at the object again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ..core.model import KataSizingPolicy, Resources
from ..core.quantity import format_cpu, format_mib, format_vcpus
from ..core.render import Rendered
from ..core.sizing import PolicySizing
from ..core.statusmodel import (
    ClassStatus,
    Condition,
    KataSizingPolicyStatus,
    LargestVm,
    MeasurementStatus,
    NodesStatus,
    OverheadStatus,
    PodAuditCount,
    PodAuditFinding,
    PodAuditStatus,
    ProposalStatus,
    UnmanagedRuntimeClass,
)
from . import conditions as cond
from .execute import CONFLICTED, DONE, FAILED, GONE, REFUSED, Outcome
from .kinds import describe
from .plan import Action, Desired, Gathered, Plan, Reason, Verb, conflict_text

log = logging.getLogger("kata_sizing.status")

EventSpec = tuple[str, str, str]  # (type, reason, message)
COUNTERS = ("driftCorrections", "driftDetected")
# The status fields a pass owns (the drift counters are written apart, by increments), by their
# Python names; `status_fields` dumps them by their API names.
OWNED_FIELDS = frozenset({
    "observed_generation", "runtime", "class_names", "conditions", "classes", "warnings", "overhead", "nodes",
    "unmanaged_runtime_classes", "pod_audit", "measurement", "proposal",
})
# status.podAudit lists at most this many pods (the counts cover them all): a status object
# stays far below etcd's 1.5 MiB request limit whatever the number of pods breaking a rule.
POD_AUDIT_LISTED = 50


@dataclass
class Findings:
    """What a pass found, as the status reports it. None for nodes, unmanaged and pod_audit:
    not known this pass (the status keeps what it holds)."""

    writes: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    conflict_kinds: list[str] = field(default_factory=list)  # the kind of each of `conflicts`
    missing: list[str] = field(default_factory=list)
    drifted: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # creates the server answered 404 (the namespace is missing)
    nodes: NodesStatus | None = None
    unmanaged: list[UnmanagedRuntimeClass] | None = None
    pod_audit: PodAuditStatus | None = None
    # As the status is to hold them (gather resolved what keeps the previous one).
    measurement: MeasurementStatus | None = None
    proposal: ProposalStatus | None = None


@dataclass(frozen=True)
class Conclusion:
    status: KataSizingPolicyStatus
    findings: Findings
    events: tuple[EventSpec, ...] = ()
    counts: Mapping[str, int] = field(default_factory=dict)  # increments of status.driftCorrections/driftDetected
    drift_seen: tuple[tuple[str, bool], ...] = ()  # (kind, corrected) per hand edit this pass acted on
    # The drift standing reported after this pass, as (key, resourceVersion): what is not in it
    # any more (put back, or the chart made it again) is news when it happens again.
    reported: frozenset = frozenset()
    announced: Mapping[str, object] = field(default_factory=dict)  # the policy's announced events after it

    @property
    def result(self) -> str:
        if self.findings.invalid:
            return "invalid"
        if self.findings.conflicts:
            return "conflict"
        return "ok"

    @property
    def retry_reason(self) -> str | None:
        """Set when the pass must run again after a back-off (a write failed for a reason that
        may pass: the output namespace does not exist yet)."""
        return "; ".join(self.findings.failed) or None


# --- reading and writing the status ---------------------------------------------------------


def read_status(body: Mapping) -> KataSizingPolicyStatus:
    """The status a policy holds, typed. The API server checks it against the CRD's schema, which
    these models generate, so it parses; if it does not (a CRD older than this operator), the pass
    starts from an empty status and writes the whole of it."""
    try:
        return KataSizingPolicyStatus.model_validate(body.get("status") or {})
    except ValidationError as exc:
        log.warning("policy %s: its status does not read (%s); it is written anew",
                    (body.get("metadata") or {}).get("name"), str(exc).splitlines()[0])
        return KataSizingPolicyStatus()


def status_changed(before: KataSizingPolicyStatus, after: KataSizingPolicyStatus) -> bool:
    return any(getattr(before, name) != getattr(after, name) for name in OWNED_FIELDS)


def status_fields(status: KataSizingPolicyStatus) -> dict[str, Any]:
    """The owned fields as the API holds them; a field the status does not have is null (a
    merge patch's null removes it)."""
    dumped = status.model_dump(mode="json", by_alias=True, exclude_none=True, include=set(OWNED_FIELDS))
    fields = KataSizingPolicyStatus.model_fields
    return {fields[name].alias or name: dumped.get(fields[name].alias or name) for name in sorted(OWNED_FIELDS)}


def merged(target, patch):
    """`patch` applied to `target` as a JSON merge patch applies it (RFC 7386: null removes)."""
    if not isinstance(patch, Mapping):
        return patch
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merged(result.get(key), value)
    return result


def status_patch(body: Mapping, status: Mapping | None, counts: Mapping[str, int]) -> list[dict]:
    """One JSON patch of the status subresource that writes `status` (the owned fields, as
    `status_fields` gives them) and adds `counts` to the drift counters, with `test` operations
    on the counters as `body` holds them: a concurrent increment makes the server refuse the
    whole patch (re-read and build it again), so no count is lost or added twice
    (docs/operation.md: Status)."""
    previous = body.get("status") or {}
    fields = dict(status or {})
    if not previous:
        whole = merged({}, fields)
        for key, n in counts.items():
            whole[key] = whole.get(key, 0) + n
        return [{"op": "test", "path": "/metadata/resourceVersion", "value": body["metadata"].get("resourceVersion")},
                {"op": "add", "path": "/status", "value": whole}]
    if all(previous.get(key) is not None for key in counts):
        ops = [{"op": "test", "path": f"/status/{key}", "value": previous[key]} for key in counts]
    else:
        ops = [{"op": "test", "path": "/status", "value": previous}]  # a counter does not exist yet
    for key, value in fields.items():
        if value is not None:
            ops.append({"op": "add", "path": f"/status/{key}", "value": merged(previous.get(key), value)})
        elif key in previous:
            ops.append({"op": "remove", "path": f"/status/{key}"})
    ops += [{"op": "add", "path": f"/status/{key}", "value": (previous.get(key) or 0) + n} for key, n in counts.items()]
    return ops


# --- the pieces of status -----------------------------------------------------------------


def class_status(sizing: PolicySizing) -> list[ClassStatus]:
    return [ClassStatus(
        name=c.name, runtime_class=c.runtime_class, pod_fixed=Resources(**c.pod_fixed),
        default_vcpus=c.default_vcpus, default_memory=format_mib(c.default_memory_mib),
        largest_vm=LargestVm(vcpus=c.largest_vm.vcpus, memory_mib=c.largest_vm.memory_mib),
        overhead_vcpus=format_vcpus(c.overhead_vcpus) if c.overhead_vcpus is not None else None,
        overhead_memory=format_mib(c.overhead_memory_mib) if c.overhead_memory_mib is not None else None,
    ) for c in sizing.classes]


def pod_audit_status(findings: list[dict]) -> PodAuditStatus:
    """Counts per class and rule over every finding, and the first POD_AUDIT_LISTED findings
    (by namespace/name). Each finding: {pod, runtimeClass, class, rule, action, message}."""
    counts: dict[tuple[str, str], set[str]] = {}
    for f in findings:
        counts.setdefault((f["class"], f["rule"]), set()).add(f["pod"])
    rows = sorted(findings, key=lambda f: (f["pod"], f["rule"]))
    return PodAuditStatus(
        pods=len({f["pod"] for f in findings}),
        counts=[PodAuditCount(class_name=c, rule=r, pods=len(p)) for (c, r), p in sorted(counts.items())],
        listed=[PodAuditFinding.model_validate(row) for row in rows[:POD_AUDIT_LISTED]],
        truncated=len(rows) > POD_AUDIT_LISTED,
    )


def unmanaged_status(findings) -> list[UnmanagedRuntimeClass]:
    keys = ("runtimeClass", "handler", "severity", "rule", "message", "fix")
    rows = [{k: v for k, v in f.as_dict().items() if k in keys and v is not None} for f in findings]
    return [UnmanagedRuntimeClass.model_validate(row)
            for row in sorted(rows, key=lambda r: (r["runtimeClass"], r["rule"]))]


def overhead_status(sizing: PolicySizing) -> OverheadStatus:
    fn = sizing.overhead
    return OverheadStatus(
        guest_memory_base=format_mib(fn.guest_memory_base_mib),
        guest_memory_ratio=format(fn.guest_memory_ratio.normalize(), "f"),
        guest_cpu=format_cpu(fn.guest_cpu),
        host_memory=format_mib(fn.host_memory_mib),
        host_cpu=format_cpu(fn.host_cpu),
        margin=format(fn.margin.normalize(), "f"),
        fitted=fn.fitted,
    )


def nodes_status(rendered: Rendered) -> NodesStatus:
    return NodesStatus(
        seen=sum(len(g.nodes) for g in rendered.guidance),
        groups=len(rendered.guidance),
        with_warnings=sum(len(g.nodes) for g in rendered.guidance if g.warnings),
    )


def _conditions(findings: Findings, generation: int | None) -> list[Condition]:
    """Valid, Conflict, InSync and Ready; InSync False says the first of its reasons that holds."""
    valid = not findings.invalid
    conflict = cond.CONFLICT_REASONS.get(findings.conflict_kinds[0], cond.REASON_CONFLICT) \
        if findings.conflict_kinds else cond.REASON_CONFLICT
    current = [
        cond.condition(cond.VALID, True, cond.REASON_VALID, "; ".join(findings.warnings) or "all sizing rules hold",
                       generation) if valid else
        cond.condition(cond.VALID, False, cond.REASON_INVALID, "; ".join(findings.invalid), generation),
        cond.condition(cond.CONFLICT, bool(findings.conflicts),
                       conflict if findings.conflicts else cond.REASON_NO_CONFLICT,
                       "; ".join(findings.conflicts), generation),
    ]
    out_of_sync = [
        (not valid, cond.REASON_NOT_APPLIED,
         "this generation is invalid; the objects of the last valid generation are kept as they were"),
        (findings.conflicts, conflict, "; ".join(findings.conflicts)),
        (findings.missing, cond.REASON_RUNTIME_CLASS_MISSING,
         "kata-deploy has not created RuntimeClass " + ", ".join(findings.missing)
         + " (apply the values overlay with helm)"),
        (findings.failed, cond.REASON_OUTPUT_NAMESPACE_MISSING,
         "the API server could not create " + "; ".join(findings.failed)
         + " (create the namespace spec.output.namespace names; retried with back-off)"),
        (findings.refused, cond.REASON_REFUSED, "the API server refused " + "; ".join(findings.refused)),
        (findings.drifted, cond.REASON_DRIFT_REPORTED, "; ".join(findings.drifted)),
    ]
    reason, message = next(((r, m) for holds, r, m in out_of_sync if holds),
                           (cond.REASON_IN_SYNC, "every managed object matches the policy"))
    in_sync = cond.condition(cond.IN_SYNC, reason == cond.REASON_IN_SYNC, reason, message, generation)
    ready = valid and in_sync.status == "True"
    current.append(in_sync)
    current.append(cond.condition(
        cond.READY, ready, in_sync.reason if valid else cond.REASON_INVALID,
        "" if ready else (in_sync.message if valid else "the policy is invalid"), generation))
    return current


def compute_status(previous: KataSizingPolicyStatus, generation: int | None, findings: Findings,
                   sizing: PolicySizing | None) -> KataSizingPolicyStatus:
    """The status after a pass: what it found, and for what it did not find out (the nodes, the
    audits while the caches sync; the sizing of an invalid generation), what `previous` says."""
    def known(value, kept):
        return value if value is not None else kept

    sized = {
        "classes": class_status(sizing), "overhead": overhead_status(sizing), "runtime": sizing.runtime.value,
        "class_names": ",".join(c.name for c in sizing.classes),
    } if sizing is not None else {
        "classes": previous.classes, "overhead": previous.overhead, "runtime": previous.runtime,
        "class_names": previous.class_names,
    }
    return previous.model_copy(update={
        "observed_generation": generation,
        "conditions": cond.merge_conditions(previous.conditions, _conditions(findings, generation),
                                            cond.now_rfc3339()),
        "warnings": list(findings.warnings),
        **sized,
        "nodes": known(findings.nodes, previous.nodes),
        "unmanaged_runtime_classes": known(findings.unmanaged, previous.unmanaged_runtime_classes),
        "pod_audit": known(findings.pod_audit, previous.pod_audit),
        "measurement": findings.measurement,
        "proposal": findings.proposal,
    })


# --- what is said about an object: from the reason decide gave -----------------------------


def _said(action: Action, drift_policy: str = "") -> tuple[str, str, str]:
    """(the status's line for a difference not written, the DriftDetected event's message, the
    DriftCorrected event's message) for an action, from the reason `decide` gave it."""
    what, reason = describe(action.key), action.reason
    changes = ", ".join(action.differences)
    handler = (action.have or {}).get("handler")
    if reason is Reason.CHART_MISSING:
        return (f"{what} is missing",
                f"{what} was deleted; the kata-deploy chart creates it from the values overlay (helm upgrade), "
                "not the operator (managedBy: KataDeploy)", "")
    if reason is Reason.HANDLER_IMMUTABLE:
        return (f"{what}: handler {handler!r} (immutable; fix the chart)",
                f"{what}: handler {handler!r} differs from the policy's and RuntimeClass.handler is immutable; the "
                "kata-deploy chart created it: fix the chart's values (helm upgrade with the overlay), the operator "
                "does not replace it", "")
    if reason is Reason.MISSING:
        return (f"{what} is missing", f"{what} was deleted; driftPolicy is {drift_policy}, not corrected",
                f"{what} was deleted by hand; created again from the policy")
    if reason is Reason.HANDLER_CHANGED:
        return (f"{what}: {changes}", f"{what}: handler changed to {handler!r} (immutable: correcting it re-creates "
                f"the RuntimeClass); driftPolicy is {drift_policy}, not corrected",
                f"{what}: handler changed by hand; re-created")
    return (f"{what}: {changes}", f"{what} differs from the policy ({changes}); driftPolicy is {drift_policy}, "
            "not corrected", f"{what} was changed by hand ({changes}); updated from the policy")


# --- concluding a pass --------------------------------------------------------------------


def routing_warnings(policy: KataSizingPolicy, desired: Desired, webhook_serving: bool | None) -> list[str]:
    """The routing falls to the operator's webhook (routing Webhook, or Auto without a served
    MutatingAdmissionPolicy) but this operator serves none (`--webhook-port`): nobody routes."""
    if webhook_serving is not False or not policy.spec.admission.enabled:
        return []
    falls_to_webhook = desired.routing == "Webhook" or any(
        w.startswith("MutatingAdmissionPolicy") for w in desired.unserved if desired.unserved_expected(w))
    if not falls_to_webhook:
        return []
    return ["admission: opted-in pods are routed by the operator's webhook here, but it runs without "
            "--webhook-port (install overlays/webhook/ or the chart's webhook.enabled): they are not routed, "
            "and the envelope policy refuses them (pod-not-routed)"]


class Announcements:
    """What was last posted as an Event per reason (a copy of the operator's record for one
    policy): a pass that runs before the status saying so has come back through the watch must
    not post it again."""

    def __init__(self, announced: Mapping[str, object]) -> None:
        self.announced = dict(announced)

    def first_time(self, reason: str, what: object) -> bool:
        """Record `what` as announced; False when it was the last thing announced."""
        if not what:
            self.announced.pop(reason, None)
            return False
        if self.announced.get(reason) == what:
            return False
        self.announced[reason] = what
        return True


def _conflict_already_said(previous: KataSizingPolicyStatus, conflicts: list[str]) -> bool:
    """The status already reports these conflicts: a resync must not post the event again."""
    for c in previous.conditions:
        if c.type == cond.CONFLICT:
            return c.status == "True" and c.message == "; ".join(conflicts)
    return False


def pod_audit_event(announcements: Announcements, previous: PodAuditStatus | None,
                    audit: PodAuditStatus) -> EventSpec | None:
    """A Warning event when the list of pods outside their class changes (not on every pass, nor
    again after a restart when the status already shows the same list)."""
    listed = audit.listed
    said = (audit.pods, tuple((row.pod, row.rule) for row in listed))
    if previous is not None and previous.listed == listed and previous.pods == audit.pods:
        announcements.first_time(cond.EVENT_POD_AUDIT, said)
        return None
    if not listed:
        announcements.first_time(cond.EVENT_POD_AUDIT, None)  # forget: the next finding is news again
        return None
    if not announcements.first_time(cond.EVENT_POD_AUDIT, said):
        return None
    counts = ", ".join(f"{c.pods} {c.rule} on class {c.class_name}" for c in audit.counts)
    first = listed[0]
    return ("Warning", cond.EVENT_POD_AUDIT, (
        f"{audit.pods} Kata pod(s) outside their class ({counts}); see status.podAudit. "
        f"First: {first.pod}: {first.message}"))


def conclude(gathered: Gathered, plan: Plan, outcome: Outcome) -> Conclusion:
    """The status, events and counts of a pass, once, from its plan and the executor's outcome."""
    body, intent = gathered.body, plan.intent
    previous = gathered.status if gathered.status is not None else KataSizingPolicyStatus()
    generation = (body.get("metadata") or {}).get("generation")
    announcements = Announcements(gathered.announced)
    findings = Findings(invalid=list(intent.invalid), warnings=list(intent.warnings),
                        measurement=gathered.measurement, proposal=gathered.proposal)
    events: list[EventSpec] = []
    if intent.invalid:
        # Nothing is written: the objects of the last valid generation stay exactly as they were.
        already_said = any(c.type == cond.VALID and c.status == "False" and c.observed_generation == generation
                           for c in previous.conditions)
        if not already_said:
            events.append(("Warning", cond.EVENT_INVALID, "; ".join(intent.invalid)))
        return Conclusion(compute_status(previous, generation, findings, None), findings, tuple(events),
                          announced=announcements.announced)
    desired = intent.desired
    assert desired is not None and intent.policy is not None and intent.rendered is not None
    results = outcome.results
    applied, corrections = [], []
    counts = {name: 0 for name in COUNTERS}
    drift_seen: list[tuple[str, bool]] = []
    reported: set = set()
    for action in plan.actions:
        result = results.get(action.key)
        if action.writes:
            if result is None or result.status == DONE:
                if result is not None and action.drift:
                    corrections.append(_said(action)[2])
                    counts["driftCorrections"] += 1
                    drift_seen.append((action.key[0], True))
                elif result is not None:
                    applied.append(result.text)
            elif result.status == CONFLICTED:
                findings.conflicts.append(result.text)
                findings.conflict_kinds.append(action.key[0])
            elif result.status == REFUSED:
                findings.refused.append(result.text)
            elif result.status == FAILED:
                findings.failed.append(result.text)
            elif result.status == GONE:
                findings.missing.append(action.key[2])
            continue
        if action.verb is Verb.CONFLICT:
            findings.conflicts.append(conflict_text(action))
            findings.conflict_kinds.append(action.key[0])
            continue
        line, detected, _ = _said(action, desired.drift_policy)
        if action.verb is Verb.MISSING:
            findings.missing.append(action.key[2])
        else:
            findings.drifted.append(line)
        version = ((action.have or {}).get("metadata") or {}).get("resourceVersion") or "missing"
        reported.add((action.key, version))
        if (action.key, version) in gathered.reported:
            continue
        if action.verb is Verb.MISSING and not action.drift:
            continue  # not created yet (the chart has not been applied): the status says so
        events.append(("Warning", cond.EVENT_DRIFT_DETECTED, detected))
        if action.drift:
            counts["driftDetected"] += 1
            drift_seen.append((action.key[0], False))
    findings.writes = list(outcome.landed)
    findings.warnings += [f"node guidance: {e}" for e in intent.guidance_errors] + [
        f"admission: the API server does not serve {what}; not written" for what in desired.unserved
        if not desired.unserved_expected(what)] + routing_warnings(intent.policy, desired, gathered.webhook_serving)
    findings.nodes = nodes_status(intent.rendered) if gathered.nodes_known else None
    if gathered.unmanaged is not None:
        findings.unmanaged = unmanaged_status(gathered.unmanaged)
        if (findings.unmanaged != previous.unmanaged_runtime_classes
                and announcements.first_time(cond.EVENT_UNMANAGED, findings.unmanaged)):
            errors = [r for r in findings.unmanaged if r.severity == "error"]
            first = findings.unmanaged[0]
            events.append(("Warning" if errors else "Normal", cond.EVENT_UNMANAGED, (
                f"{len(findings.unmanaged)} finding(s) on Kata RuntimeClasses no policy manages "
                f"({len(errors)} error(s)); see status.unmanagedRuntimeClasses. First: "
                f"{first.runtime_class}: {first.message}")))
    if gathered.pod_findings is not None:
        findings.pod_audit = pod_audit_status(list(gathered.pod_findings))
        event = pod_audit_event(announcements, previous.pod_audit, findings.pod_audit)
        if event:
            events.append(event)
    if applied:
        events.append(("Normal", cond.EVENT_APPLIED, "; ".join(applied)))
    events += [("Normal", cond.EVENT_DRIFT_CORRECTED, text) for text in corrections]
    if findings.warnings != previous.warnings and announcements.first_time(cond.EVENT_WARNING, findings.warnings):
        # Valid, but an administrator should hear of it once (docs/rules.md: status, events, validate).
        events.append(("Warning", cond.EVENT_WARNING, "; ".join(findings.warnings)))
    if not _conflict_already_said(previous, findings.conflicts) and announcements.first_time(
            cond.EVENT_CONFLICT, "; ".join(findings.conflicts)):
        events.append(("Warning", cond.EVENT_CONFLICT, "; ".join(findings.conflicts)))
    if announcements.first_time(cond.EVENT_WRITE_FAILED, "; ".join(findings.failed)):
        events.append(("Warning", cond.EVENT_WRITE_FAILED, "; ".join(findings.failed)))
    return Conclusion(
        compute_status(previous, generation, findings, intent.sizing), findings, tuple(events),
        {k: v for k, v in counts.items() if v}, tuple(drift_seen), frozenset(reported), announcements.announced)
