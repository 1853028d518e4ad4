"""The kinds the operator reads and writes, in one table, and how an object is named.

No client here: `kube` turns the table into paths, `informer` into collections, `plan` and the
rest name objects by `ObjKey`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..core.model import GROUP, KIND, PLURAL, VERSION

ObjKey = tuple[str, str | None, str]  # (kind, namespace or None, name)

ADMISSION_GROUP = "admissionregistration.k8s.io"
# The generated admission objects (docs/admission.md), all cluster-scoped. Their version is the
# one the server serves (discovery, kube.KubeApi.served_admission_versions), checked in this order.
ADMISSION_KINDS = (
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
)
ADMISSION_VERSIONS = ("v1", "v1beta1")


@dataclass(frozen=True)
class Kind:
    group: str  # "" for the core group
    version: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def at(self, version: str) -> Kind:
        return replace(self, version=version)


KINDS: dict[str, Kind] = {
    "RuntimeClass": Kind("node.k8s.io", "v1", "runtimeclasses", namespaced=False),
    "ConfigMap": Kind("", "v1", "configmaps", namespaced=True),
    "Namespace": Kind("", "v1", "namespaces", namespaced=False),
    "Node": Kind("", "v1", "nodes", namespaced=False),
    "Pod": Kind("", "v1", "pods", namespaced=True),
    "Lease": Kind("coordination.k8s.io", "v1", "leases", namespaced=True),
    "Event": Kind("", "v1", "events", namespaced=True),
    KIND: Kind(GROUP, VERSION, PLURAL, namespaced=False),
    "CustomResourceDefinition": Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False),
    "ValidatingAdmissionPolicy": Kind(ADMISSION_GROUP, "v1", "validatingadmissionpolicies", namespaced=False),
    "ValidatingAdmissionPolicyBinding": Kind(
        ADMISSION_GROUP, "v1", "validatingadmissionpolicybindings", namespaced=False),
    "MutatingAdmissionPolicy": Kind(ADMISSION_GROUP, "v1", "mutatingadmissionpolicies", namespaced=False),
    "MutatingAdmissionPolicyBinding": Kind(ADMISSION_GROUP, "v1", "mutatingadmissionpolicybindings", namespaced=False),
}


def is_admission_kind(kind: str) -> bool:
    return kind in ADMISSION_KINDS


def obj_key(obj: dict) -> ObjKey:
    meta = obj.get("metadata") or {}
    return (obj.get("kind") or "", meta.get("namespace"), meta.get("name") or "")


def describe(key: ObjKey) -> str:
    kind, namespace, name = key
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def policy_key(name: str) -> ObjKey:
    return (KIND, None, name)
