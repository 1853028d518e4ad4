"""The install as manifests/ holds it, for the tests of every tier: its files, the Kubernetes
releases its objects are checked against, and the permissions its ClusterRole grants, as
(apiGroup, resource, verb) triples, with the triple of any request the operator makes."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import kubernetes_validate
import yaml

from tests.support.paths import ROOT

Triple = tuple[str, str, str]  # (apiGroup, resource, verb); "" is the core group


MANIFESTS = ROOT / "manifests"
CRD_FILE = ROOT / "crds" / "katasizingpolicies.katasizing.dev.yaml"
DOCKERFILE = ROOT / "Dockerfile"

NAMESPACE = "kata-sizing"
SERVICE_ACCOUNT = "kata-sizing"
CUSTOM_RESOURCE_GROUP = "katasizing.dev"

# The oldest Kubernetes the install supports, and the newest schema shipped with
# kubernetes-validate (so a bump of that package moves this check forward by itself).
SCHEMA_VERSIONS = ("1.25", ".".join(kubernetes_validate.latest_version().split(".")[:2]))

RESOURCE_FILES = sorted(p for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml")

EXPECTED_KINDS = Counter(
    {
        "Namespace": 1,
        "ServiceAccount": 1,
        "ClusterRole": 3,  # the operator's, and the aggregated view and edit roles
        "ClusterRoleBinding": 1,
        "Role": 1,
        "RoleBinding": 1,
        "Deployment": 1,
        "PodDisruptionBudget": 1,  # two replicas, drained one at a time
        "Service": 1,  # /metrics
        "CustomResourceDefinition": 1,
        # The shared admission policies (manifests/admission/), the install's, and the keep-alive
        # binding of each (docs/admission.md).
        "ValidatingAdmissionPolicy": 2,
        "MutatingAdmissionPolicy": 1,
        "ValidatingAdmissionPolicyBinding": 2,
        "MutatingAdmissionPolicyBinding": 1,
    }
)
# The Kubernetes release that serves each admission kind in admissionregistration.k8s.io/v1
# (docs/admission.md): manifests/ needs 1.36; the chart leaves out what a server does not serve.
ADMISSION_SERVED_FROM = {"ValidatingAdmissionPolicy": (1, 30), "ValidatingAdmissionPolicyBinding": (1, 30),
                         "MutatingAdmissionPolicy": (1, 36), "MutatingAdmissionPolicyBinding": (1, 36)}
ADMISSION_FILE = MANIFESTS / "admission" / "admission-policies.yaml"

# Objects are written with PUT and a resourceVersion, never a blind patch.
READ_WRITE = ("get", "list", "watch", "create", "update", "delete")

# (apiGroup, resource) -> verbs the ClusterRole grants; "" is the core group. Kept as one
# table so a test of the operator's real API calls can be checked against it.
FRAMEWORK_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    # kopf's scanning for CRDs (namespaces only with namespace patterns: not here).
    ("apiextensions.k8s.io", "customresourcedefinitions"): ("list", "watch"),
    # kopf's policy watch (it writes nothing on a policy).
    (CUSTOM_RESOURCE_GROUP, "katasizingpolicies"): ("list", "watch"),
}
APPLICATION_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    # patch: the finalizer an operator before this one set, taken off by the first pass.
    (CUSTOM_RESOURCE_GROUP, "katasizingpolicies"): ("get", "list", "watch", "patch"),
    # The operator's events: created, and a repeat counted on the one posted (patch).
    ("", "events"): ("create", "patch"),
    (CUSTOM_RESOURCE_GROUP, "katasizingpolicies/status"): ("patch",),
    ("node.k8s.io", "runtimeclasses"): READ_WRITE,
    ("", "configmaps"): READ_WRITE,
    ("", "nodes"): ("list", "watch"),
    ("", "pods"): ("list", "watch"),
    # patch: a shared admission object its installer applied server-side is put back by an apply.
    **{("admissionregistration.k8s.io", kind): (*READ_WRITE, "patch") for kind in (
        "validatingadmissionpolicies", "mutatingadmissionpolicies",
        "validatingadmissionpolicybindings", "mutatingadmissionpolicybindings")},
    ("", "namespaces"): ("get", "list", "watch"),
    # The measurement's Summaries, authorized by each kubelet (docs/measurement.md).
    ("", "nodes/stats"): ("get",),
}


# The Role in the operator's namespace: leader election's one Lease.
LEADER_ELECTION_PERMISSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("coordination.k8s.io", "leases"): ("get", "create", "update"),
}


def expected_permissions() -> set[tuple[str, str, str]]:
    """The (group, resource, verb) triples the ClusterRole must grant, no more, no less."""
    triples: set[tuple[str, str, str]] = set()
    for table in (FRAMEWORK_PERMISSIONS, APPLICATION_PERMISSIONS):
        for (group, resource), verbs in table.items():
            triples.update((group, resource, verb) for verb in verbs)
    return triples


def granted_permissions(clusterrole: dict | None = None) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) the shipped ClusterRole grants; "" is the core group.

    Compare with the API calls the operator makes: a call whose triple is missing here
    would get 403 in a real cluster."""
    if clusterrole is None:
        clusterrole = load_documents(MANIFESTS / "clusterrole.yaml")[0]
    triples: set[tuple[str, str, str]] = set()
    for rule in clusterrole.get("rules", []):
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    triples.add((group, resource, verb))
    return triples


def load_documents(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def find_kubectl() -> str | None:
    found = shutil.which("kubectl")
    if found:
        return found
    local = ROOT / ".tools" / "kubectl"
    return str(local) if os.access(local, os.X_OK) else None


def request_triple(method: str, path: str, query: Mapping[str, str]) -> Triple | None:
    """(apiGroup, resource[/subresource], verb) of one request; None for discovery paths."""
    parts = [p for p in path.split("/") if p]
    if not parts or parts[0] not in ("api", "apis"):
        return None  # /version, /healthz...
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = (parts[1] if len(parts) > 1 else ""), parts[3:]
    if not rest:
        return None  # /api, /api/v1, /apis, /apis/<group>, /apis/<group>/<version>
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]  # a namespaced resource: /namespaces/<ns>/<resource>/...
    resource, name, subresource = rest[0], (rest[1] if len(rest) > 1 else None), rest[2:]
    if subresource:
        # nodes/NAME/proxy/stats/summary is the subresource proxy: the rest is its path.
        resource = f"{resource}/{subresource[0] if subresource[0] == 'proxy' else '/'.join(subresource)}"
    watch = query.get("watch") in ("true", "1")
    verb = {
        "GET": "watch" if watch else ("get" if name else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }[method]
    return group, resource, verb
