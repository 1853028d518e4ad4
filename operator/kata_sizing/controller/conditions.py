"""Condition types, reasons and event reasons: every name the operator writes, in one place."""

from __future__ import annotations

from datetime import datetime, timezone

# Condition types.
READY = "Ready"
VALID = "Valid"
IN_SYNC = "InSync"
CONFLICT = "Conflict"

# Reasons (CamelCase, as Kubernetes conventions ask).
REASON_VALID = "PolicyValid"
REASON_INVALID = "PolicyInvalid"
REASON_APPLIED = "Applied"
REASON_IN_SYNC = "InSync"
REASON_NOT_APPLIED = "NotApplied"
REASON_DRIFT_REPORTED = "DriftReported"
REASON_RUNTIME_CLASS_MISSING = "RuntimeClassMissing"
REASON_CONFLICT = "UnmanagedRuntimeClass"
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


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, ok: bool, reason: str, message: str, generation: int | None) -> dict:
    return {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def merge_conditions(previous: list[dict] | None, current: list[dict], now: str) -> list[dict]:
    """Kubernetes convention: lastTransitionTime changes only when the status flips."""
    before = {c.get("type"): c for c in previous or []}
    merged = []
    for cond in current:
        old = before.get(cond["type"])
        if old and old.get("status") == cond["status"] and old.get("lastTransitionTime"):
            transition = old["lastTransitionTime"]
        else:
            transition = now
        merged.append({**cond, "lastTransitionTime": transition})
    return merged
