"""Pods and the scopes of spec.admission.namespaces, and which class the policies' bindings route
each pod to: the table the routing webhook (tests/api/test_webhook_routing.py) and the real API
server (tests/api/test_admission_objects.py) both route."""

from __future__ import annotations

from kata_sizing.core.model import parse_policy
from kata_sizing.core.render import render_policy
from tests.support.harness.selectors import parse_label_selector
from tests.support.policies import explicit_classes_policy


def pod(name: str = "app", namespace: str = "team", labels: dict | None = None, runtime_class: str | None = None,
        **limits: str) -> dict:
    spec: dict = {"containers": [{"name": "app", "image": "app", "resources": {"limits": limits}}]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                           "labels": labels or {}}, "spec": spec}


# --- the scope of a policy: the webhook routes the pods its bindings would ------------------------

# Namespaces by their labels, and the scopes of spec.admission.namespaces the table covers; a
# policy per scope, scope-<key>, routed by the webhook. tests/api/test_admission_objects.py runs
# the same table through the MutatingAdmissionPolicy and the webhook on the real API server.
SCOPE_NAMESPACES = {
    "listed": {},
    "listed-kata": {"kata": "yes"},
    "kata": {"kata": "yes"},
    "plain": {},
    # Opted in as a whole (the namespace's label), for the selector's policy.
    "kata-opted": {"kata": "yes", "katasizing.dev/policy": "scope-selector"},
    "plain-opted": {"katasizing.dev/policy": "scope-selector"},
}
SCOPES = {
    "everywhere": {},
    "names": {"names": ["listed", "listed-kata"]},
    "selector": {"selector": {"matchLabels": {"kata": "yes"}}},
    "both": {"names": ["listed", "listed-kata"], "selector": {"matchExpressions": [
        {"key": "kata", "operator": "In", "values": ["yes"]}]}},
}


def scope_policy(scope: str, routing: str = "Webhook") -> dict:
    return explicit_classes_policy(f"scope-{scope}", admission={"routing": routing, "namespaces": SCOPES[scope]})


# A pod two policies would both route (its label's, everywhere, and its namespace's): the API server
# runs the bindings of one policy in no order it promises; the webhook asks the pod's label first.
BOTH_ROUTE = "everywhere-in-kata-opted"


def scope_pods() -> list[dict]:
    """A pod of each namespace labelled for each scope's policy; one without the label in each
    namespace opted in as a whole. All fit class s."""
    labelled = [pod(f"{scope}-in-{namespace}", namespace, {"katasizing.dev/policy": f"scope-{scope}"},
                    cpu="500m", memory="512Mi")
                for scope in SCOPES for namespace in SCOPE_NAMESPACES if f"{scope}-in-{namespace}" != BOTH_ROUTE]
    unlabelled = [pod(f"unlabelled-in-{namespace}", namespace, cpu="500m", memory="512Mi")
                  for namespace, labels in SCOPE_NAMESPACES.items() if "katasizing.dev/policy" in labels]
    return labelled + unlabelled


def _selector_text(selector: dict) -> str:
    """A LabelSelector as kubectl writes it (`-l`), for the emulator's own selector semantics."""
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for requirement in selector.get("matchExpressions") or []:
        key, operator, values = requirement["key"], requirement["operator"], requirement.get("values") or []
        parts.append({"In": f"{key} in ({','.join(values)})", "NotIn": f"{key} notin ({','.join(values)})",
                      "Exists": key, "DoesNotExist": f"!{key}"}[operator])
    return ",".join(parts)


def routed_by_the_bindings(pods: list[dict]) -> dict[str, str | None]:
    """{pod: the class} as the policies' MutatingAdmissionPolicyBindings would route it: the binding's
    namespaceSelector (as render writes it) over the namespace's labels, as the API server matches it
    (the name label it sets on every namespace included), the pod opted in, the smallest class."""
    routed: dict[str, str | None] = {}
    for case in pods:
        namespace = case["metadata"]["namespace"]
        labels = {**SCOPE_NAMESPACES[namespace], "kubernetes.io/metadata.name": namespace}
        routed[case["metadata"]["name"]] = None
        for name in ((case["metadata"].get("labels") or {}).get("katasizing.dev/policy"),
                     labels.get("katasizing.dev/policy")):
            if name is None:
                continue
            (binding,) = [o for o in render_policy(parse_policy(scope_policy(name.removeprefix("scope-"),
                                                                             "MutatingAdmissionPolicy"))).admission
                          if o["kind"] == "MutatingAdmissionPolicyBinding"]
            selector = ((binding["spec"].get("matchResources") or {}).get("namespaceSelector")) or {}
            if parse_label_selector(_selector_text(selector))({"metadata": {"labels": labels}}):
                routed[case["metadata"]["name"]] = f"kata-{name}-s"
                break
    return routed
