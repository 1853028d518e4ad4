"""Concluding a pass, pure: its status, conditions, events and drift counts, computed once from
the plan and what the executor reports (docs/operation.md: Status, Events).

The status is the pydantic model the CRD's schema is generated from
(`core.statusmodel.KataSizingPolicyStatus`), built here and dumped once, when it is written
(`status_fields`). What an event or a status line says about an object comes from the reason
`plan.decide` gave with its action (`_said`), never from looking at the object again.

The conclusion is read from tables, each walked row by row by tests/unit/test_conclude.py: what each
outcome of an action says (`ACTION_OUTCOMES`: a line of the status, an event, a drift count),
which reason InSync gives when several hold (`IN_SYNC_ORDER`), and when an event of the pass as
a whole is news (`News`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
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
from .execute import CONFLICTED, DONE, ERROR, FAILED, GONE, REFUSED, UNCHANGED, Outcome, Result
from .kinds import describe
from .plan import Action, Desired, Gathered, Intent, Plan, Reason, Verb, conflict_text

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


# Why InSync is False, the first row whose findings hold: (which findings, the reason, its message).
IN_SYNC_ORDER: tuple[tuple[str, str, Callable[[Findings], str]], ...] = (
    ("invalid", cond.REASON_NOT_APPLIED,
     lambda f: "this generation is invalid; the objects of the last valid generation are kept as they were"),
    ("conflicts", cond.REASON_CONFLICT, lambda f: "; ".join(f.conflicts)),
    ("missing", cond.REASON_RUNTIME_CLASS_MISSING,
     lambda f: "kata-deploy has not created RuntimeClass " + ", ".join(f.missing)
     + " (apply the values overlay with helm)"),
    ("failed", cond.REASON_OUTPUT_NAMESPACE_MISSING,
     lambda f: "the API server could not create " + "; ".join(f.failed)
     + " (create the namespace spec.output.namespace names; retried with back-off)"),
    ("refused", cond.REASON_REFUSED, lambda f: "the API server refused " + "; ".join(f.refused)),
    ("drifted", cond.REASON_DRIFT_REPORTED, lambda f: "; ".join(f.drifted)),
)


def _conditions(findings: Findings, generation: int | None) -> list[Condition]:
    """Valid, Conflict, InSync and Ready; InSync False says the first of its reasons that holds
    (IN_SYNC_ORDER), and Ready is Valid and InSync together."""
    valid = not findings.invalid
    reason, message = next(((r, says(findings)) for name, r, says in IN_SYNC_ORDER if getattr(findings, name)),
                           (cond.REASON_IN_SYNC, "every managed object matches the policy"))
    # Somebody else's object holds a name: the reason names its kind (the first one's).
    conflict = cond.CONFLICT_REASONS.get(findings.conflict_kinds[0], cond.REASON_CONFLICT) \
        if findings.conflict_kinds else cond.REASON_CONFLICT
    if reason == cond.REASON_CONFLICT:
        reason = conflict
    ready = valid and reason == cond.REASON_IN_SYNC
    return [
        cond.condition(cond.VALID, True, cond.REASON_VALID, "; ".join(findings.warnings) or "all sizing rules hold",
                       generation) if valid else
        cond.condition(cond.VALID, False, cond.REASON_INVALID, "; ".join(findings.invalid), generation),
        cond.condition(cond.CONFLICT, bool(findings.conflicts),
                       conflict if findings.conflicts else cond.REASON_NO_CONFLICT,
                       "; ".join(findings.conflicts), generation),
        cond.condition(cond.IN_SYNC, reason == cond.REASON_IN_SYNC, reason, message, generation),
        cond.condition(cond.READY, ready, reason if valid else cond.REASON_INVALID,
                       "" if ready else (message if valid else "the policy is invalid"), generation),
    ]


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
    return previous.replaced(
        observed_generation=generation,
        conditions=cond.merge_conditions(previous.conditions, _conditions(findings, generation), cond.now_rfc3339()),
        warnings=list(findings.warnings),
        **sized,
        nodes=known(findings.nodes, previous.nodes),
        unmanaged_runtime_classes=known(findings.unmanaged, previous.unmanaged_runtime_classes),
        pod_audit=known(findings.pod_audit, previous.pod_audit),
        measurement=findings.measurement,
        proposal=findings.proposal,
    )


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


# --- a pass's warnings, and what was already announced -------------------------------------


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


def pass_warnings(intent: Intent, desired: Desired, webhook_serving: bool | None) -> list[str]:
    """A valid pass's warnings besides the sizing's: the node guidance, what the server does not
    serve, the routing nobody serves."""
    assert intent.policy is not None
    return [f"node guidance: {e}" for e in intent.guidance_errors] + [
        f"admission: the API server does not serve {what}; not written" for what in desired.unserved
        if not desired.unserved_expected(what)] + routing_warnings(intent.policy, desired, webhook_serving)


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


# --- what one action's outcome says: the table --------------------------------------------------

WRITE = "write"  # an action of a verb that writes (plan.WRITES): the executor's result says what came of it
DRIFT_CORRECTIONS, DRIFT_DETECTED = COUNTERS
ActionLine = Callable[[Action, Result | None], str]
# (WRITE or the verb of an action that writes nothing, the executor's result (None: no write was
# made), whether the action undoes a hand edit).
OutcomeKey = tuple[str, str | None, bool]


def _by_executor(action: Action, result: Result | None) -> str:
    assert result is not None  # the rows that take the executor's line have a result
    return result.text


def _object_name(action: Action, result: Result | None) -> str:
    return action.key[2]


def _conflict(action: Action, result: Result | None) -> str:
    return conflict_text(action)


def _difference(action: Action, result: Result | None) -> str:
    return _said(action)[0]


@dataclass(frozen=True)
class ActionSays:
    """What one action's outcome adds to its pass's conclusion: a line in one of the findings'
    lists (which the conditions read: IN_SYNC_ORDER), an event, one drift counter more."""

    finding: str | None = None  # the Findings list that gets `line`
    line: ActionLine | None = None
    event: str | None = None  # its message is worded from the action's reason (`_event_message`)
    counter: str | None = None
    # A difference left standing (reported, or the chart's to make): said once per object and
    # resourceVersion, its event and its count with the first pass that finds it.
    stands: bool = False


def _either_drift(what: str, result: str | None, said: ActionSays) -> dict[OutcomeKey, ActionSays]:
    return {(what, result, drift): said for drift in (True, False)}


# What each outcome of an action says; every combination is a row (tests/unit/test_conclude.py).
ACTION_OUTCOMES: dict[OutcomeKey, ActionSays] = {
    # A write that landed: a hand edit put back is a correction, counted; anything else is applied.
    (WRITE, DONE, True): ActionSays(event=cond.EVENT_DRIFT_CORRECTED, counter=DRIFT_CORRECTIONS),
    (WRITE, DONE, False): ActionSays(event=cond.EVENT_APPLIED),
    # A write that did not land says why in the status; the pass's own events say it once.
    **_either_drift(WRITE, CONFLICTED, ActionSays("conflicts", _by_executor)),
    **_either_drift(WRITE, REFUSED, ActionSays("refused", _by_executor)),
    **_either_drift(WRITE, FAILED, ActionSays("failed", _by_executor)),
    **_either_drift(WRITE, GONE, ActionSays("missing", _object_name)),  # the chart's object vanished under the write
    # Not made (a write it needs did not land, or the pass failed first), already there, or a
    # failure the pass is retried for: nothing to say yet.
    **_either_drift(WRITE, None, ActionSays()),
    **_either_drift(WRITE, UNCHANGED, ActionSays()),
    **_either_drift(WRITE, ERROR, ActionSays()),
    # Decided nothing to do: the plan leaves these out.
    **_either_drift(Verb.NOTHING.value, None, ActionSays()),
    # Somebody else's object holds the name.
    **_either_drift(Verb.CONFLICT.value, None, ActionSays("conflicts", _conflict)),
    # The chart's RuntimeClass is not there: news when it was deleted, not while the chart has
    # not made it yet.
    (Verb.MISSING.value, None, True): ActionSays(
        "missing", _object_name, event=cond.EVENT_DRIFT_DETECTED, counter=DRIFT_DETECTED, stands=True),
    (Verb.MISSING.value, None, False): ActionSays("missing", _object_name, stands=True),
    # A difference reported, not written (driftPolicy Report, the chart's immutable handler):
    # counted when it is a hand edit.
    (Verb.REPORT.value, None, True): ActionSays(
        "drifted", _difference, event=cond.EVENT_DRIFT_DETECTED, counter=DRIFT_DETECTED, stands=True),
    (Verb.REPORT.value, None, False): ActionSays("drifted", _difference, event=cond.EVENT_DRIFT_DETECTED, stands=True),
}


def outcome_key(action: Action, result: Result | None) -> OutcomeKey:
    return (WRITE if action.writes else action.verb.value, result.status if result is not None else None,
            action.drift)


def _event_message(reason: str, action: Action, result: Result | None, drift_policy: str) -> str:
    if reason == cond.EVENT_APPLIED:
        return _by_executor(action, result)
    _, detected, corrected = _said(action, drift_policy)
    return corrected if reason == cond.EVENT_DRIFT_CORRECTED else detected


@dataclass
class _Tally:
    """What the actions of a pass said, as ACTION_OUTCOMES has it."""

    said: dict[str, list[str]] = field(default_factory=dict)  # event reason -> the actions' messages
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    drift_seen: list[tuple[str, bool]] = field(default_factory=list)
    reported: set = field(default_factory=set)

    def add(self, findings: Findings, action: Action, result: Result | None, drift_policy: str,
            reported_before: frozenset) -> None:
        said = ACTION_OUTCOMES[outcome_key(action, result)]
        if said.finding is not None and said.line is not None:
            getattr(findings, said.finding).append(said.line(action, result))
            if said.finding == "conflicts":
                findings.conflict_kinds.append(action.key[0])
        if said.stands:
            version = ((action.have or {}).get("metadata") or {}).get("resourceVersion") or "missing"
            self.reported.add((action.key, version))
            if (action.key, version) in reported_before:
                return  # said already
        if said.event is not None:
            self.said.setdefault(said.event, []).append(_event_message(said.event, action, result, drift_policy))
        if said.counter is not None:
            self.counts[said.counter] += 1
            self.drift_seen.append((action.key[0], said.counter == DRIFT_CORRECTIONS))

    def each(self, type_: str, reason: str) -> list[EventSpec]:
        return [(type_, reason, message) for message in self.said.get(reason, [])]


# --- what the pass as a whole says: the table -----------------------------------------------------


def _unmanaged_event(found: list[UnmanagedRuntimeClass]) -> tuple[str, str]:
    errors = [r for r in found if r.severity == "error"]
    return ("Warning" if errors else "Normal", (
        f"{len(found)} finding(s) on Kata RuntimeClasses no policy manages ({len(errors)} error(s)); see "
        f"status.unmanagedRuntimeClasses. First: {found[0].runtime_class}: {found[0].message}"))


def _conflict_shown(status: KataSizingPolicyStatus) -> str | None:
    """The conflicts the status reports already (a resync must not post them again)."""
    found = next((c for c in status.conditions if c.type == cond.CONFLICT), None)
    return found.message if found is not None and found.status == "True" else None


@dataclass(frozen=True)
class News:
    """An event of a pass as a whole, posted when what it says (`what`; None: not known this pass)
    differs from what the status shows of it (`shown`) and from what was last posted
    (`Announcements`); `event` gives its type and message."""

    reason: str
    what: Callable[[Findings], Any]
    shown: Callable[[KataSizingPolicyStatus], Any]
    event: Callable[[Any], tuple[str, str]]

    def said(self, findings: Findings, previous: KataSizingPolicyStatus,
             announcements: Announcements) -> list[EventSpec]:
        what = self.what(findings)
        if what is None or what == self.shown(previous) or not announcements.first_time(self.reason, what):
            return []
        type_, message = self.event(what)
        return [(type_, self.reason, message)]


UNMANAGED_NEWS = News(cond.EVENT_UNMANAGED, lambda f: f.unmanaged, lambda s: s.unmanaged_runtime_classes,
                      _unmanaged_event)
# Valid, but an administrator should hear of it once (docs/rules.md: status, events, validate).
WARNING_NEWS = News(cond.EVENT_WARNING, lambda f: f.warnings, lambda s: s.warnings,
                    lambda warnings: ("Warning", "; ".join(warnings)))
CONFLICT_NEWS = News(cond.EVENT_CONFLICT, lambda f: "; ".join(f.conflicts), _conflict_shown,
                     lambda text: ("Warning", text))
WRITE_FAILED_NEWS = News(cond.EVENT_WRITE_FAILED, lambda f: "; ".join(f.failed), lambda s: None,
                         lambda text: ("Warning", text))


def _pass_events(findings: Findings, previous: KataSizingPolicyStatus, tally: _Tally,
                 announcements: Announcements) -> list[EventSpec]:
    """The events of a valid pass, in the order they are posted."""
    events = tally.each("Warning", cond.EVENT_DRIFT_DETECTED)
    events += UNMANAGED_NEWS.said(findings, previous, announcements)
    if findings.pod_audit is not None:
        pod_audit = pod_audit_event(announcements, previous.pod_audit, findings.pod_audit)
        events += [pod_audit] if pod_audit is not None else []
    applied = tally.said.get(cond.EVENT_APPLIED)
    events += [("Normal", cond.EVENT_APPLIED, "; ".join(applied))] if applied else []
    events += tally.each("Normal", cond.EVENT_DRIFT_CORRECTED)
    for news in (WARNING_NEWS, CONFLICT_NEWS, WRITE_FAILED_NEWS):
        events += news.said(findings, previous, announcements)
    return events


# --- concluding a pass --------------------------------------------------------------------------


def _conclude_invalid(previous: KataSizingPolicyStatus, generation: int | None, findings: Findings,
                      announcements: Announcements) -> Conclusion:
    """Nothing is written: the objects of the last valid generation stay exactly as they were.
    InvalidPolicy is posted once per generation."""
    said = any(c.type == cond.VALID and c.status == "False" and c.observed_generation == generation
               for c in previous.conditions)
    events = () if said else (("Warning", cond.EVENT_INVALID, "; ".join(findings.invalid)),)
    return Conclusion(compute_status(previous, generation, findings, None), findings, events,
                      announced=announcements.announced)


def conclude(gathered: Gathered, plan: Plan, outcome: Outcome) -> Conclusion:
    """The status, events and counts of a pass, once, from its plan and the executor's outcome:
    each action through ACTION_OUTCOMES, the conditions through IN_SYNC_ORDER, the pass's own
    events through `_pass_events`."""
    intent = plan.intent
    previous = gathered.status if gathered.status is not None else KataSizingPolicyStatus()
    generation = (gathered.body.get("metadata") or {}).get("generation")
    announcements = Announcements(gathered.announced)
    findings = Findings(invalid=list(intent.invalid), warnings=list(intent.warnings),
                        measurement=gathered.measurement, proposal=gathered.proposal)
    if intent.invalid:
        return _conclude_invalid(previous, generation, findings, announcements)
    desired = intent.desired
    assert desired is not None and intent.rendered is not None
    tally = _Tally()
    for action in plan.actions:
        tally.add(findings, action, outcome.results.get(action.key), desired.drift_policy, gathered.reported)
    findings.writes = list(outcome.landed)
    findings.warnings += pass_warnings(intent, desired, gathered.webhook_serving)
    findings.nodes = nodes_status(intent.rendered) if gathered.nodes_known else None
    if gathered.unmanaged is not None:
        findings.unmanaged = unmanaged_status(gathered.unmanaged)
    if gathered.pod_findings is not None:
        findings.pod_audit = pod_audit_status(list(gathered.pod_findings))
    events = _pass_events(findings, previous, tally, announcements)
    return Conclusion(
        compute_status(previous, generation, findings, intent.sizing), findings, tuple(events),
        {k: v for k, v in tally.counts.items() if v}, tuple(tally.drift_seen), frozenset(tally.reported),
        announcements.announced)
