"""Condition types, reasons and event reasons: every name the operator writes, in one place."""

from __future__ import annotations

from datetime import UTC, datetime

from ..core.statusmodel import Condition

# Condition types.
READY = "Ready"
VALID = "Valid"
IN_SYNC = "InSync"
CONFLICT = "Conflict"

# Reasons (CamelCase, as Kubernetes conventions ask).
REASON_VALID = "PolicyValid"
REASON_INVALID = "PolicyInvalid"
REASON_IN_SYNC = "InSync"
REASON_NOT_APPLIED = "NotApplied"
REASON_DRIFT_REPORTED = "DriftReported"
REASON_RUNTIME_CLASS_MISSING = "RuntimeClassMissing"
REASON_CONFLICT = "UnmanagedRuntimeClass"
# Somebody else's object holds a name the policy writes: the reason names its kind (the first's,
# when several conflict; the message names them all).
CONFLICT_REASONS = {
    "RuntimeClass": REASON_CONFLICT,
    "ConfigMap": "UnmanagedConfigMap",
    "ValidatingAdmissionPolicy": "UnmanagedAdmissionPolicy",
    "MutatingAdmissionPolicy": "UnmanagedAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding": "UnmanagedAdmissionPolicyBinding",
    "MutatingAdmissionPolicyBinding": "UnmanagedAdmissionPolicyBinding",
}
REASON_NO_CONFLICT = "NoConflict"
REASON_REFUSED = "RefusedByServer"
REASON_OUTPUT_NAMESPACE_MISSING = "OutputNamespaceMissing"

# Event reasons.
EVENT_APPLIED = "Applied"
EVENT_INVALID = "InvalidPolicy"
EVENT_DRIFT_CORRECTED = "DriftCorrected"
EVENT_DRIFT_DETECTED = "DriftDetected"
EVENT_CONFLICT = "Conflict"
EVENT_WARNING = "PolicyWarning"
EVENT_UNMANAGED = "UnmanagedRuntimeClassAudit"
EVENT_POD_AUDIT = "PodAudit"
EVENT_WRITE_FAILED = "WriteFailed"
EVENT_HEADROOM_LOW = "HeadroomLow"
EVENT_HEADROOM_RECOVERED = "HeadroomRecovered"


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, ok: bool, reason: str, message: str, generation: int | None) -> Condition:
    return Condition(type=type_, status="True" if ok else "False", reason=reason, message=message,
                     observed_generation=generation)


def merge_conditions(previous: list[Condition], current: list[Condition], now: str) -> list[Condition]:
    """Kubernetes convention: lastTransitionTime changes only when the status flips."""
    before = {c.type: c for c in previous}
    merged = []
    for found in current:
        old = before.get(found.type)
        if old is not None and old.status == found.status and old.last_transition_time:
            transition = old.last_transition_time
        else:
            transition = now
        merged.append(found.replaced(last_transition_time=transition))
    return merged
