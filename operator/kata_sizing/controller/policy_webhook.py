"""Admission review of a KataSizingPolicy: the rules the operator reports as Valid=False,
checked before the API server stores the object. Pure: the kopf handler in `handlers` and
the tests call these functions; the optional webhook server is wired in `operator_main`."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping

from ..core.model import GROUP, PLURAL, PolicyError, parse_policy
from ..core.sizing import size_policy

# kopf serves each admission handler at /<handler id>; manifests/webhook/ points the
# ValidatingWebhookConfiguration at this path.
VALIDATE_HANDLER_ID = "validate-policy"
# The routing of opted-in pods where the server serves no MutatingAdmissionPolicy: overlays/webhook/
# points the MutatingWebhookConfiguration at /route-pod (served by operator_main's server itself).
ROUTE_POD_PATH_ID = "route-pod"


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

    An UPDATE that leaves the spec alone is let through: a label, the removal of an older
    operator's finalizer, must not be refused because of a policy stored before the webhook
    existed; the operator reports such a policy as Valid=False instead."""
    if operation == "UPDATE" and old is not None and new is not None:
        return old.get("spec") != new.get("spec")
    return True


ADMISSION_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
MAX_UID_CHARS = 128


def pod_to_route(review: dict) -> tuple[dict, str] | None:
    """(the pod, its namespace) when the review is the creation of a Pod without a
    runtimeClassName (the only reviews the routing changes), else None. Metadata and labels that
    are not mappings (no API server sends those) read as empty, so the pod is not routed."""
    request = review["request"]
    kind = request.get("kind")
    kind = kind if isinstance(kind, Mapping) else {}
    pod = request.get("object")
    if (request.get("operation") != "CREATE" or kind.get("kind") != "Pod" or kind.get("group")
            or request.get("subResource") or not isinstance(pod, dict)):
        return None
    spec = pod.get("spec")
    if not isinstance(spec, Mapping) or spec.get("runtimeClassName"):
        return None
    metadata = pod.get("metadata")
    metadata = dict(metadata) if isinstance(metadata, Mapping) else {}
    labels = metadata.get("labels")
    metadata["labels"] = ({k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}
                          if isinstance(labels, Mapping) else {})
    namespace = request.get("namespace") or metadata.get("namespace") or "default"
    if not isinstance(namespace, str):
        return None
    # The API server sends a pod created by a controller with generateName and no name yet.
    metadata["namespace"] = namespace
    return {**pod, "metadata": metadata}, namespace


def review_problem(review: object) -> str | None:
    """Why a decoded body is not an AdmissionReview request the webhook can answer, or None.

    The API server always sends these fields (admission.k8s.io/v1 AdmissionRequest); a body
    without them is not a review, and the answer is HTTP 400 rather than a guess."""
    if not isinstance(review, dict):
        return "the body is not a JSON object (an AdmissionReview)"
    if review.get("kind") != "AdmissionReview" or review.get("apiVersion") not in ADMISSION_VERSIONS:
        return f"kind/apiVersion must be AdmissionReview in {' or '.join(ADMISSION_VERSIONS)}"
    request = review.get("request")
    if not isinstance(request, dict):
        return "request is missing or not an object"
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > MAX_UID_CHARS or not uid.isprintable():
        return f"request.uid must be a printable string of 1 to {MAX_UID_CHARS} characters"
    resource = request.get("resource")
    if not isinstance(resource, dict) or not all(isinstance(resource.get(k), str)
                                                 for k in ("group", "version", "resource")):
        return "request.resource must hold group, version and resource strings"
    if not isinstance(request.get("userInfo"), dict):
        return "request.userInfo is missing or not an object"
    if not isinstance(request.get("operation"), str):
        return "request.operation is missing or not a string"
    new, old = request.get("object"), request.get("oldObject")
    if not all(body is None or isinstance(body, dict) for body in (new, old)) or (new is None and old is None):
        return "request.object or request.oldObject must be an object"
    return None


def not_a_policy(review: dict) -> str | None:
    """Why a well-formed review (review_problem returned None) is none of the policy rules'
    business, or None for a KataSizingPolicy's: kopf answers only the resources it has handlers
    for."""
    resource = review["request"]["resource"]
    if (resource["group"], resource["resource"]) == (GROUP, PLURAL):
        return None
    return f"no rule for {resource['group'] or 'core'}/{resource['version']} {resource['resource']}"


def review_response(review: dict, allowed: bool, message: str = "", code: int = 0,
                    warnings: list[str] | None = None, patch: list[dict] | None = None) -> dict:
    """An AdmissionReview answer to a well-formed review (review_problem returned None); `patch`
    (JSON patch operations) makes it a mutation."""
    response: dict = {"uid": review["request"]["uid"], "allowed": allowed}
    if message:
        response["status"] = {"code": code, "message": message}
    if warnings:
        response["warnings"] = warnings
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": review["apiVersion"], "kind": "AdmissionReview", "response": response}
