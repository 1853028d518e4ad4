"""Concluding a pass, pure: its status, conditions, events and drift counts, computed once from
the plan and what the executor reports (docs/operation.md: Status, Events)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from . import conditions as cond
from .execute import CONFLICTED, DONE, FAILED, GONE, REFUSED, Outcome
from .kinds import describe
from .plan import Action, Desired, Gathered, Plan, Verb, conflict_text
from ..core.model import KataSizingPolicy
from ..core.quantity import format_cpu, format_mib, format_vcpus
from ..core.render import Rendered
from ..core.sizing import PolicySizing

EventSpec = tuple[str, str, str]  # (type, reason, message)
COUNTERS = ("driftCorrections", "driftDetected")


@dataclass
class Findings:
    """What a pass found, as the status reports it."""

    writes: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    drifted: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # creates the server answered 404 (the namespace is missing)
    nodes: dict | None = None
    unmanaged: list[dict] | None = None
    pod_audit: dict | None = None
    # None leaves status.measurement / status.proposal as they were, {} removes them.
    measurement: dict | None = None
    proposal: dict | None = None


@dataclass(frozen=True)
class Conclusion:
    status: dict
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


# --- the pieces of status -----------------------------------------------------------------
def class_status(sizing: PolicySizing) -> list[dict]:
    rows = []
    for c in sizing.classes:
        row = {
            "name": c.name,
            "runtimeClass": c.runtime_class,
            "podFixed": c.pod_fixed,
            "defaultVcpus": c.default_vcpus,
            "defaultMemory": format_mib(c.default_memory_mib),
            "largestVm": {"vcpus": c.largest_vm.vcpus, "memoryMiB": c.largest_vm.memory_mib},
        }
        if c.overhead_vcpus is not None:
            row["overheadVcpus"] = format_vcpus(c.overhead_vcpus)
            row["overheadMemory"] = format_mib(c.overhead_memory_mib)
        rows.append(row)
    return rows


OWNED_STATUS_FIELDS = (
    "observedGeneration", "runtime", "classNames", "conditions", "classes", "warnings", "overhead", "nodes",
    "unmanagedRuntimeClasses", "podAudit", "measurement", "proposal",
)
# status.podAudit lists at most this many pods (the counts cover them all): a status object
# stays far below etcd's 1.5 MiB request limit whatever the number of pods breaking a rule.
POD_AUDIT_LISTED = 50


def pod_audit_status(findings: list[dict]) -> dict:
    """Counts per class and rule over every finding, and the first POD_AUDIT_LISTED findings
    (by namespace/name). Each finding: {pod, runtimeClass, class, rule, message}."""
    counts: dict[tuple[str, str], set[str]] = {}
    for f in findings:
        counts.setdefault((f["class"], f["rule"]), set()).add(f["pod"])
    rows = sorted(findings, key=lambda f: (f["pod"], f["rule"]))
    return {
        "pods": len({f["pod"] for f in findings}),
        "counts": [{"class": c, "rule": r, "pods": len(p)} for (c, r), p in sorted(counts.items())],
        "listed": rows[:POD_AUDIT_LISTED],
        "truncated": len(rows) > POD_AUDIT_LISTED,
    }


def unmanaged_status(findings) -> list[dict]:
    keys = ("runtimeClass", "handler", "severity", "rule", "message", "fix")
    rows = [{k: v for k, v in f.as_dict().items() if k in keys and v is not None} for f in findings]
    return sorted(rows, key=lambda r: (r["runtimeClass"], r["rule"]))


def overhead_status(sizing: PolicySizing) -> dict:
    fn = sizing.overhead
    return {
        "guestMemoryBase": format_mib(fn.guest_memory_base_mib),
        "guestMemoryRatio": format(fn.guest_memory_ratio.normalize(), "f"),
        "guestCpu": format_cpu(fn.guest_cpu),
        "hostMemory": format_mib(fn.host_memory_mib),
        "hostCpu": format_cpu(fn.host_cpu),
        "margin": format(fn.margin.normalize(), "f"),
        "fitted": fn.fitted,
    }


def nodes_status(rendered: Rendered) -> dict:
    return {
        "seen": sum(len(g.nodes) for g in rendered.guidance),
        "groups": len(rendered.guidance),
        "withWarnings": sum(len(g.nodes) for g in rendered.guidance if g.warnings),
    }


def compute_status(body: Mapping, result: Findings, sizing: PolicySizing | None) -> dict:
    meta = body.get("metadata") or {}
    generation = meta.get("generation")
    previous = body.get("status") or {}
    valid = not result.invalid
    current = []
    if valid:
        current.append(cond.condition(
            cond.VALID, True, cond.REASON_VALID,
            "; ".join(result.warnings) or "all sizing rules hold", generation))
    else:
        current.append(cond.condition(cond.VALID, False, cond.REASON_INVALID, "; ".join(result.invalid), generation))
    current.append(cond.condition(
        cond.CONFLICT, bool(result.conflicts),
        cond.REASON_CONFLICT if result.conflicts else cond.REASON_NO_CONFLICT,
        "; ".join(result.conflicts), generation))
    if not valid:
        in_sync = cond.condition(
            cond.IN_SYNC, False, cond.REASON_NOT_APPLIED,
            "this generation is invalid; the objects of the last valid generation are kept as they were",
            generation)
    elif result.conflicts:
        in_sync = cond.condition(cond.IN_SYNC, False, cond.REASON_CONFLICT, "; ".join(result.conflicts), generation)
    elif result.missing:
        in_sync = cond.condition(
            cond.IN_SYNC, False, cond.REASON_RUNTIME_CLASS_MISSING,
            "kata-deploy has not created RuntimeClass " + ", ".join(result.missing)
            + " (apply the values overlay with helm)", generation)
    elif result.failed:
        in_sync = cond.condition(
            cond.IN_SYNC, False, cond.REASON_OUTPUT_NAMESPACE_MISSING,
            "the API server could not create " + "; ".join(result.failed)
            + " (create the namespace spec.output.namespace names; retried with back-off)", generation)
    elif result.refused:
        in_sync = cond.condition(
            cond.IN_SYNC, False, cond.REASON_REFUSED, "the API server refused " + "; ".join(result.refused), generation)
    elif result.drifted:
        in_sync = cond.condition(cond.IN_SYNC, False, cond.REASON_DRIFT_REPORTED, "; ".join(result.drifted), generation)
    else:
        in_sync = cond.condition(cond.IN_SYNC, True, cond.REASON_IN_SYNC, "every managed object matches the policy", generation)
    current.append(in_sync)
    ready = valid and in_sync["status"] == "True"
    current.append(cond.condition(
        cond.READY, ready, in_sync["reason"] if valid else cond.REASON_INVALID,
        "" if ready else (in_sync["message"] if valid else "the policy is invalid"), generation))
    status = {
        "observedGeneration": generation,
        "conditions": cond.merge_conditions(previous.get("conditions"), current, cond.now_rfc3339()),
        "classes": class_status(sizing) if sizing is not None else previous.get("classes") or [],
        "warnings": result.warnings,
    }
    if sizing is not None:
        status["overhead"] = overhead_status(sizing)
        status["runtime"] = sizing.runtime.value
        status["classNames"] = ",".join(c.name for c in sizing.classes)
    else:
        for kept in ("overhead", "runtime", "classNames"):
            if previous.get(kept) is not None:
                status[kept] = previous[kept]
    nodes = result.nodes if result.nodes is not None else previous.get("nodes")
    if nodes is not None:
        status["nodes"] = nodes
    unmanaged = result.unmanaged if result.unmanaged is not None else previous.get("unmanagedRuntimeClasses")
    if unmanaged is not None:
        status["unmanagedRuntimeClasses"] = unmanaged
    pod_audit = result.pod_audit if result.pod_audit is not None else previous.get("podAudit")
    if pod_audit is not None:
        status["podAudit"] = pod_audit
    for key, value in (("measurement", result.measurement), ("proposal", result.proposal)):
        if value is None:
            if previous.get(key) is not None:
                status[key] = previous[key]
        elif value:
            status[key] = dict(value)
        elif previous.get(key) is not None:
            status[key] = None  # a merge patch's null removes the field
    return status


def status_changed(body: Mapping, status: dict) -> bool:
    previous = body.get("status") or {}
    return any(previous.get(k) != status.get(k) for k in OWNED_STATUS_FIELDS)


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
    """One JSON patch of the status subresource that writes `status` (the fields a pass owns,
    as its merge patch would write them over `body`'s status) and adds `counts` to the drift
    counters, with `test` operations on the counters as `body` holds them: a concurrent
    increment makes the server refuse the whole patch (re-read and build it again), so no
    count is lost or added twice (docs/operation.md: Status)."""
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


def _conflict_already_said(body: Mapping, conflicts: list[str]) -> bool:
    """The status already reports these conflicts: a resync must not post the event again."""
    for c in (body.get("status") or {}).get("conditions") or []:
        if c.get("type") == cond.CONFLICT:
            return c.get("status") == "True" and c.get("message") == "; ".join(conflicts)
    return False


def pod_audit_event(announcements: Announcements, body: Mapping, audit: dict) -> EventSpec | None:
    """A Warning event when the list of pods outside their class changes (not on every pass, nor
    again after a restart when the status already shows the same list)."""
    listed = audit["listed"]
    said = (audit["pods"], tuple((row["pod"], row["rule"]) for row in listed))
    previous = ((body.get("status") or {}).get("podAudit") or {})
    if previous.get("listed") == listed and previous.get("pods") == audit["pods"]:
        announcements.first_time(cond.EVENT_POD_AUDIT, said)
        return None
    if not listed:
        announcements.first_time(cond.EVENT_POD_AUDIT, None)  # forget: the next finding is news again
        return None
    if not announcements.first_time(cond.EVENT_POD_AUDIT, said):
        return None
    counts = ", ".join(f"{c['pods']} {c['rule']} on class {c['class']}" for c in audit["counts"])
    first = listed[0]
    return ("Warning", cond.EVENT_POD_AUDIT, (
        f"{audit['pods']} Kata pod(s) outside their class ({counts}); see status.podAudit. "
        f"First: {first['pod']}: {first['message']}"))


def _drift_text(action: Action) -> str:
    """How the status and a DriftDetected event say a difference that is not written."""
    key, have, want = action.key, action.have or {}, action.want or {}
    if action.verb is Verb.MISSING:
        return f"{describe(key)} is missing"
    if action.guarded and have.get("handler") != want.get("handler"):
        return f"{describe(key)}: handler {have.get('handler')!r} (immutable; fix the chart)"
    return f"{describe(key)}: {', '.join(action.differences)}"


def _detected_event(action: Action, drift_policy: str) -> str:
    key = action.key
    if action.verb is Verb.MISSING:
        return (f"{describe(key)} was deleted; the kata-deploy chart creates it from the values overlay "
                "(helm upgrade), not the operator (managedBy: KataDeploy)")
    if action.guarded and (action.have or {}).get("handler") != (action.want or {}).get("handler"):
        return (f"{describe(key)}: handler {(action.have or {}).get('handler')!r} differs from the policy's and "
                "RuntimeClass.handler is immutable; the kata-deploy chart created it: fix the chart's values "
                "(helm upgrade with the overlay), the operator does not replace it")
    return (f"{describe(key)} differs from the policy ({', '.join(action.differences)}); "
            f"driftPolicy is {drift_policy}, not corrected")


def _corrected_event(action: Action) -> str:
    key = action.key
    if action.verb is Verb.RECREATE:
        return f"{describe(key)}: handler changed by hand; re-created"
    if action.have is None:
        return f"{describe(key)} was deleted by hand; created again from the policy"
    return f"{describe(key)} was changed by hand ({', '.join(action.differences)}); updated from the policy"


def conclude(gathered: Gathered, plan: Plan, outcome: Outcome) -> Conclusion:
    """The status, events and counts of a pass, once, from its plan and the executor's outcome."""
    body, intent = gathered.body, plan.intent
    announcements = Announcements(gathered.announced)
    findings = Findings(invalid=list(intent.invalid), warnings=list(intent.warnings))
    events: list[EventSpec] = []
    if intent.invalid:
        # Nothing is written: the objects of the last valid generation stay exactly as they were.
        generation = (body.get("metadata") or {}).get("generation")
        already_said = any(
            c.get("type") == cond.VALID and c.get("status") == "False" and c.get("observedGeneration") == generation
            for c in (body.get("status") or {}).get("conditions") or [])
        if not already_said:
            events.append(("Warning", cond.EVENT_INVALID, "; ".join(intent.invalid)))
        return Conclusion(compute_status(body, findings, None), findings, tuple(events),
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
                    corrections.append(_corrected_event(action))
                    counts["driftCorrections"] += 1
                    drift_seen.append((action.key[0], True))
                elif result is not None:
                    applied.append(result.text)
            elif result.status == CONFLICTED:
                findings.conflicts.append(result.text)
            elif result.status == REFUSED:
                findings.refused.append(result.text)
            elif result.status == FAILED:
                findings.failed.append(result.text)
            elif result.status == GONE:
                findings.missing.append(action.key[2])
            continue
        if action.verb is Verb.CONFLICT:
            findings.conflicts.append(conflict_text(action))
            continue
        if action.verb is Verb.MISSING:
            findings.missing.append(action.key[2])
        else:
            findings.drifted.append(_drift_text(action))
        version = ((action.have or {}).get("metadata") or {}).get("resourceVersion") or "missing"
        reported.add((action.key, version))
        if (action.key, version) in gathered.reported:
            continue
        if action.verb is Verb.MISSING and not action.drift:
            continue  # not created yet (the chart has not been applied): the status says so
        events.append(("Warning", cond.EVENT_DRIFT_DETECTED, _detected_event(action, desired.drift_policy)))
        if action.drift:
            counts["driftDetected"] += 1
            drift_seen.append((action.key[0], False))
    findings.writes = list(outcome.landed)
    findings.warnings += [f"node guidance: {e}" for e in intent.guidance_errors] + [
        f"admission: the API server does not serve {what}; not written" for what in desired.unserved
        if not desired.unserved_expected(what)] + routing_warnings(intent.policy, desired, gathered.webhook_serving)
    findings.nodes = nodes_status(intent.rendered) if gathered.nodes_known else None
    status_before = body.get("status") or {}
    if gathered.unmanaged is not None:
        findings.unmanaged = unmanaged_status(gathered.unmanaged)
        if (findings.unmanaged != status_before.get("unmanagedRuntimeClasses")
                and announcements.first_time(cond.EVENT_UNMANAGED, findings.unmanaged)):
            errors = [r for r in findings.unmanaged if r["severity"] == "error"]
            events.append(("Warning" if errors else "Normal", cond.EVENT_UNMANAGED, (
                f"{len(findings.unmanaged)} finding(s) on Kata RuntimeClasses no policy manages "
                f"({len(errors)} error(s)); see status.unmanagedRuntimeClasses. First: "
                f"{findings.unmanaged[0]['runtimeClass']}: {findings.unmanaged[0]['message']}")))
    findings.measurement = dict(gathered.measurement) if gathered.measurement is not None else None
    findings.proposal = dict(gathered.proposal) if gathered.proposal is not None else None
    if gathered.pod_findings is not None:
        findings.pod_audit = pod_audit_status(list(gathered.pod_findings))
        event = pod_audit_event(announcements, body, findings.pod_audit)
        if event:
            events.append(event)
    if applied:
        events.append(("Normal", cond.EVENT_APPLIED, "; ".join(applied)))
    events += [("Normal", cond.EVENT_DRIFT_CORRECTED, text) for text in corrections]
    if findings.warnings != status_before.get("warnings") and announcements.first_time(
            cond.EVENT_WARNING, findings.warnings):
        # Valid, but an administrator should hear of it once (docs/rules.md: status, events, validate).
        events.append(("Warning", cond.EVENT_WARNING, "; ".join(findings.warnings)))
    if not _conflict_already_said(body, findings.conflicts) and announcements.first_time(
            cond.EVENT_CONFLICT, "; ".join(findings.conflicts)):
        events.append(("Warning", cond.EVENT_CONFLICT, "; ".join(findings.conflicts)))
    if announcements.first_time(cond.EVENT_WRITE_FAILED, "; ".join(findings.failed)):
        events.append(("Warning", cond.EVENT_WRITE_FAILED, "; ".join(findings.failed)))
    return Conclusion(
        compute_status(body, findings, intent.sizing), findings, tuple(events),
        {k: v for k, v in counts.items() if v}, tuple(drift_seen), frozenset(reported), announcements.announced)
