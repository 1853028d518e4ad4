"""Admission review of a KataSizingPolicy: the rules the operator reports as Valid=False,
checked before the API server stores the object. Pure: the kopf handler in `handlers` and
the tests call these functions; the optional webhook server is wired in `operator_main`."""

from __future__ import annotations

from collections.abc import Mapping

from .model import PolicyError, parse_policy
from .sizing import size_policy

# kopf serves each admission handler at /<handler id>; manifests/webhook/ points the
# ValidatingWebhookConfiguration at this path.
VALIDATE_HANDLER_ID = "validate-policy"


def admission_problems(body: Mapping) -> tuple[list[str], list[str]]:
    """(errors, warnings) of a policy body, one line each naming the field and the rule."""
    try:
        policy = parse_policy(dict(body))
    except PolicyError as exc:
        return list(exc.problems), []
    sizing = size_policy(policy)
    return [str(p) for p in sizing.errors], [str(p) for p in sizing.warnings]


def needs_review(operation: str | None, old: Mapping | None, new: Mapping | None) -> bool:
    """Whether an admission request changes what the rules look at.

    An UPDATE that leaves the spec alone is let through: kopf's own finalizer and
    annotation patches, and the removal of the finalizer when a policy is deleted, must
    not be refused because of a policy stored before the webhook existed; the operator
    reports such a policy as Valid=False instead."""
    if operation == "UPDATE" and old is not None and new is not None:
        return old.get("spec") != new.get("spec")
    return True
