"""Rendering: sized classes -> the desired Kubernetes objects, built as dicts.

Pure: no client, no I/O beyond reading the node guidance summary's template. Objects are data
(pure builders, serialized once by whoever writes them); text is made only where text is the
product: the TOML drop-in, the kata-deploy values overlay (YAML through the one writer,
`yamlout`, with the RuntimeClass string inside it), the node guidance documents and their
summary (a jinja2 template, loaded only when nodes are given).
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from . import podfit, yamlout
from .labels import (  # noqa: F401
    CLASS_LABEL,
    FLUX_WATCH_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    POLICY_LABEL,
    SHARED_ADMISSION,
    SHARED_ANNOTATIONS,
    SHARED_LABEL,
)
from .model import API_VERSION, KIND, KataSizingPolicy
from .quantity import format_cpu, format_mib
from .sizing import ClassSizing, PolicySizing, Problem, size_policy

if TYPE_CHECKING:  # guidance loads only when nodes are given (the CLI's default render has none)
    from .guidance import NodeFacts, NodeGroupGuidance


VALUES_KEY = "values.yaml"
SUMMARY_KEY = "summary.txt"
SUMMARY_TEMPLATE = "node-guidance-summary.txt.j2"

REPOSITORY_TEMPLATES = Path(__file__).resolve().parents[3] / "templates"


def templates_dir() -> Path:
    """`templates/` at the repository root, or $KATA_SIZING_TEMPLATES in an image."""
    override = os.environ.get("KATA_SIZING_TEMPLATES")
    return Path(override) if override else REPOSITORY_TEMPLATES


_SUMMARY: dict[Path, object] = {}


def _summary_template(directory: Path):
    """The summary's jinja2 template, compiled once per process (only guidance needs jinja2)."""
    if directory not in _SUMMARY:
        import jinja2

        environment = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(directory)), undefined=jinja2.StrictUndefined,
            autoescape=False, keep_trailing_newline=True)
        _SUMMARY[directory] = environment.get_template(SUMMARY_TEMPLATE)
    return _SUMMARY[directory]


@dataclass
class Rendered:
    sizing: PolicySizing
    runtime_classes: list[dict]
    configmaps: list[dict]
    drop_ins: dict[str, str]
    values_yaml: str
    # The same overlay as data (values_yaml is it written out, with its comments).
    values: dict = field(default_factory=dict)
    guidance: list[NodeGroupGuidance] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    # The policy's bindings of the shared admission policies (podfit.py); the parameters they
    # name are keys of its drop-ins ConfigMap.
    admission: list[dict] = field(default_factory=list)
    # The shared admission policies those bindings name: the install's (the chart, manifests/,
    # or the one application that applies `render --shared`); the operator guards them.
    shared: list[dict] = field(default_factory=list)

    @property
    def creates_runtime_classes(self) -> bool:
        return self.sizing.policy.spec.runtime_class.managed_by == "Operator"

    def objects(self) -> list[dict]:
        """The policy's own objects, in apply order: what `kata-sizing render` prints and the
        operator creates and owns (it guards `shared` besides)."""
        runtime_classes = self.runtime_classes if self.creates_runtime_classes else []
        return [*self.configmaps, *runtime_classes, *self.admission]


def owner_reference(policy: KataSizingPolicy) -> list[dict]:
    if not policy.metadata.uid:
        return []
    return [{
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": policy.name,
        "uid": policy.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }]


def policy_labels(policy: KataSizingPolicy) -> dict[str, str]:
    return {MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: policy.name}


def runtime_class(policy: KataSizingPolicy, sized: ClassSizing, owned: bool = True) -> dict:
    """A class's RuntimeClass; `owned=False` leaves out the ownerReference (the chart's copy)."""
    spec = policy.spec.runtime_class
    metadata: dict = {"name": sized.runtime_class, "labels": {**policy_labels(policy), CLASS_LABEL: sized.name}}
    owners = owner_reference(policy) if owned else []
    if owners:
        metadata["ownerReferences"] = owners
    scheduling: dict = {"nodeSelector": dict(spec.node_selector)}
    tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    if tolerations:
        scheduling["tolerations"] = tolerations
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": metadata,
        "handler": sized.runtime_class,
        "overhead": {"podFixed": {"cpu": sized.pod_fixed["cpu"], "memory": sized.pod_fixed["memory"]}},
        "scheduling": scheduling,
    }


def render_drop_in(sizing: PolicySizing, sized: ClassSizing) -> str:
    """The class's TOML drop-in: a header saying what it sizes, then the settings as written by
    rules.KataConfig.to_toml (the code that reads drop-ins writes them)."""
    pod_fixed = sized.pod_fixed
    header = [
        f"# Rendered by kata-sizing from KataSizingPolicy {json.dumps(sizing.policy.name)}, "
        f"class {json.dumps(sized.name)}:",
        f"# pods with limits up to {format_cpu(sized.envelope_cpu)} CPU and "
        f"{format_mib(sized.envelope_memory_mib)} memory.",
        f"# RuntimeClass {sized.runtime_class} accounts podFixed cpu {pod_fixed['cpu']}, "
        f"memory {pod_fixed['memory']}.",
        "# runtime-rs static sizing: VM = limits + overhead_*; pods without limits boot default_*."
        if sizing.runtime.value == "Rust" else
        "# Go runtime: VM = default_memory + limits; default_memory is the guest budget.",
    ]
    return "\n".join(header) + "\n\n" + sized.kata_config.to_toml()


def values_overlay(policy: KataSizingPolicy, sizing: PolicySizing, drop_ins: dict[str, str]) -> dict:
    """The kata-deploy values overlay: one custom runtime per class. The chart takes each
    runtime's containerd handler from the `handler:` line of its runtimeClass string, as text,
    and creates that RuntimeClass from the string (docs/outputs.md)."""
    return {"customRuntimes": {"enabled": True, "runtimes": {
        c.runtime_class: {
            "baseConfig": policy.spec.shim,
            "inheritBaseOverhead": False,
            "dropIn": drop_ins[f"{c.name}.toml"],
            # The chart creates this object itself, so no ownerReference in it.
            "runtimeClass": _yaml_text(json.dumps(runtime_class(policy, c, owned=False))),
        }
        for c in sizing.classes
    }}}


@lru_cache(maxsize=512)
def _yaml_text(json_text: str) -> str:
    """An object's YAML, by its JSON: a new generation of a policy mostly leaves its classes'
    RuntimeClasses as they were, and dumping YAML is most of rendering the values overlay."""
    return yamlout.dump(json.loads(json_text))


def values_overlay_yaml(policy: KataSizingPolicy, overlay: dict) -> str:
    return yamlout.dump(overlay, comments=[
        f"kata-deploy values overlay rendered by kata-sizing from KataSizingPolicy {policy.name}.",
        "Use with: helm upgrade kata-deploy <chart> --reuse-values -f values.yaml",
        "The chart creates each RuntimeClass below from its runtimeClass string.",
    ])


def configmap(
    policy: KataSizingPolicy, name: str, data: dict[str, str], extra_labels: dict[str, str] | None = None,
) -> dict:
    metadata: dict = {
        "name": name,
        "namespace": policy.spec.output.namespace,
        "labels": {**policy_labels(policy), **(extra_labels or {})},
    }
    owners = owner_reference(policy)
    if owners:
        metadata["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": dict(data)}


def configmap_names(policy_name: str) -> dict[str, str]:
    return {
        "values": f"{policy_name}-kata-deploy-values",
        "dropins": f"{policy_name}-dropins",
        "guidance": f"{policy_name}-node-guidance",
    }


def render_policy(
    policy: KataSizingPolicy,
    nodes: list[NodeFacts] | None = None,
    sizing: PolicySizing | None = None,
) -> Rendered:
    """All desired objects for a policy; `nodes` adds the node-guidance ConfigMap."""
    sizing = sizing or size_policy(policy)
    names = configmap_names(policy.name)
    runtime_classes = [runtime_class(policy, c) for c in sizing.classes]
    drop_ins = {f"{c.name}.toml": render_drop_in(sizing, c) for c in sizing.classes}
    values = values_overlay(policy, sizing, drop_ins)
    values_yaml = values_overlay_yaml(policy, values)
    admits = policy.spec.admission.enabled and bool(sizing.classes)
    configmaps = [
        configmap(policy, names["values"], {VALUES_KEY: values_yaml}, {FLUX_WATCH_LABEL: "Enabled"}),
        # The admission parameters live beside the drop-ins: the same classes' figures, one
        # object fewer per policy (docs/admission.md).
        configmap(policy, names["dropins"], {**drop_ins, **(podfit.params_data(sizing) if admits else {})}),
    ]
    guidance: list[NodeGroupGuidance] = []
    problems = list(sizing.problems)
    if nodes is not None:
        from .guidance import node_guidance

        guidance, guidance_problems = node_guidance(sizing, nodes)
        problems.extend(guidance_problems)
        data = {g.key + ".yaml": guidance_document_yaml(policy.name, g) for g in guidance}
        data[SUMMARY_KEY] = _summary_template(templates_dir()).render(
            policy=policy.name,
            groups=guidance,
            node_count=sum(len(g.nodes) for g in guidance),
        )
        configmaps.append(configmap(policy, names["guidance"], data))
    bindings = render_bindings(sizing, names["dropins"]) if admits else []
    shared = shared_admission_objects(policy.spec.admission.routing) if admits else []
    return Rendered(sizing, runtime_classes, configmaps, drop_ins, values_yaml, values, guidance, problems,
                    bindings, shared)


def render_bindings(sizing: PolicySizing, params_name: str) -> list[dict]:
    """The policy's bindings of the shared admission policies (docs/admission.md), with the
    labels and ownerReference of its RuntimeClasses; their parameters are the ConfigMap
    `params_name` (the drop-ins', written before them)."""
    policy = sizing.policy
    labels = policy_labels(policy)
    owners = owner_reference(policy)
    objects = []
    for api_version, kind, name, spec in podfit.binding_specs(sizing, params_name):
        metadata: dict = {"name": name, "labels": dict(labels)}
        if owners:
            metadata["ownerReferences"] = [dict(o) for o in owners]
        objects.append({"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec})
    return objects


def shared_admission_objects(routing: str = "Auto") -> list[dict]:
    """The admission policies every policy's bindings name (two ValidatingAdmissionPolicies, one
    per rule, since a binding's action applies to every validation of its policy, and unless
    routing is Webhook the MutatingAdmissionPolicy that routes opted-in pods): the same for every
    policy, owned by none (deleting one policy must not delete what the others' bindings use),
    labelled as kata-sizing's and shared, and marked against a GitOps tool's prune. What
    `kata-sizing render --shared` prints and the install carries (manifests/admission/, the
    chart's files/). Built once per routing and shared by every render, as every rendered object
    is never changed in place (the executor writes copies)."""
    return list(_shared_admission_objects(routing))


@lru_cache(maxsize=4)
def _shared_admission_objects(routing: str) -> tuple[dict, ...]:
    return tuple({"apiVersion": api_version, "kind": kind,
                  "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY, SHARED_LABEL: SHARED_ADMISSION},
                               "annotations": dict(SHARED_ANNOTATIONS)},
                  # A copy of each: the specs share their CEL variables (YAML would print aliases).
                  "spec": copy.deepcopy(spec)}
                 for api_version, kind, name, spec in podfit.shared_admission_specs(routing))


def guidance_document(group: NodeGroupGuidance) -> dict:
    """A group's guidance (docs/sizing-model.md: kubelet reservations and /dev/shm)."""
    capacity = {"memory": group.capacity_memory}
    if group.capacity_cpu:
        capacity["cpu"] = group.capacity_cpu
    allocatable = {"memory": group.allocatable_memory}
    if group.observed_allocatable_memory:
        allocatable["observedMemory"] = group.observed_allocatable_memory
    if group.shm_applies:
        shm: dict = {"applies": True, "size": group.shm_size, "fstab": group.fstab_line,
                     "remount": group.remount_command}
    else:
        shm = {"applies": False, "reason": group.shm_reason}
    fits = {}
    for fit in group.fits:
        row: dict = {"largestPodAccounted": fit.accounted_memory, "largestVmMemory": fit.vm_memory,
                     "byAllocatable": fit.by_allocatable}
        if fit.by_cpu is not None:
            row["byCpu"] = fit.by_cpu
        if fit.by_shm is not None:
            row["byDevShm"] = fit.by_shm
        row["fit"] = fit.fit
        fits[fit.name] = row
    document: dict = {
        "nodes": list(group.nodes),
        "capacity": capacity,
        "kubeletConfiguration": {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "systemReserved": {"memory": group.system_reserved},
            "kubeReserved": {"memory": group.kube_reserved},
            "evictionHard": {"memory.available": group.eviction_hard},
            "enforceNodeAllocatable": ["pods"],
            **({"featureGates": dict(group.kubelet_feature_gates)} if group.kubelet_feature_gates else {}),
        },
        "allocatable": allocatable,
        "infraPodMemory": group.infra_pod_memory,
    }
    if group.infra_pod_memory_by_node:
        document["infraPodMemoryByNode"] = dict(group.infra_pod_memory_by_node)
    document.update({"devShm": shm, "vmsPerClass": fits})
    if group.kubelet_feature_gate_reasons:
        document["featureGateReasons"] = list(group.kubelet_feature_gate_reasons)
    document["warnings"] = list(group.warnings)
    return document


def guidance_document_yaml(policy_name: str, group: NodeGroupGuidance) -> str:
    return yamlout.dump(guidance_document(group), comments=[
        f"Node guidance rendered by kata-sizing from KataSizingPolicy {policy_name} (docs/sizing-model.md:",
        f"kubelet reservations and /dev/shm). Nodes: {', '.join(group.nodes)}",
    ])
