"""Pods and their class: the one home of the pod-fit rule (docs/admission.md).

A Kata pod must stay within the envelope of the class it runs in (the largest pod that
class's podFixed was sized for) and must set a memory limit; a pod that opts in with the
label `katasizing.dev/policy: <policy>` and no runtimeClassName is routed to the smallest
class that covers it. The rule exists twice by necessity, and both copies are written here
so that they cannot drift apart:

- in Python (`pod_limits`, `check_pod`, `route`), for `kata-sizing explain --pod`,
  `kata-sizing audit --pods`, the operator's audit of running pods and its webhook fallback;
- as CEL for the API server (`shared_admission_specs`): a ValidatingAdmissionPolicy per rule (a
  binding's validationActions apply to every validation of its policy, and each rule has its
  own action) and a MutatingAdmissionPolicy for the routing, the same for every policy, with
  `paramKind: ConfigMap`, named for the parameters' contract (ADMISSION_CONTRACT); each policy
  binds them to its own figures (`binding_specs`, `params_data`). tests/unit/test_podfit.py runs a
  table of pods through both, the CEL on the real API server.

Pods are read by podread.py (`pod_spec_of`, `pod_limits`: Kubernetes' own effective limits).

Interface (used by the operator, the webhook, the CLI):

- `pod_spec_of(obj) -> dict`: the pod spec of a Pod or of a workload's pod template.
- `pod_limits(pod_or_spec) -> PodLimits`: effective limits (millicores, bytes; None: none set).
- `route(limits, sizing) -> ClassSizing | None`: the smallest class whose envelope covers them.
- `check_limits(limits, runtime_class, sizing, ...) -> list[PodFinding]`: the rule on figures
  (with, for a runtime-rs class of a 0 MiB default_memory or overhead_memory, the pods Kata
  would refuse to start: rule pod-sandbox-memory-zero, docs/rules.md).
- `check_pod(pod, sizing, namespace_labels=None) -> list[PodFinding]`: the rule on a Pod.
- `route_patch(pod, sizing, namespace_labels=None) -> list[dict]`: the JSON patch the routing
  applies (only runtimeClassName; see `route_patch`), in the policy's namespaces (`in_scope`, the
  one scope rule: the bindings' namespaceSelector is `namespace_selector`), for a pod that opted in
  (`policies_opted_into`).
- `shared_admission_specs(routing) -> [(apiVersion, kind, name, spec)]`: the shared VAPs and MAP,
  and the keep-alive binding of each;
  `binding_specs(sizing, params_name)`: a policy's bindings; `params_data(sizing)`: its
  parameters (render.py makes them objects: the shared ones owned by no policy, the bindings with
  the policy's labels and owner, the parameters in its drop-ins ConfigMap).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from typing import TYPE_CHECKING, cast

from .labels import NAMESPACE_NAME_LABEL, POLICY_LABEL  # noqa: F401  (re-exported: the rule's label)
from .model import LabelSelector
from .podread import (
    MEMORY_UNITS,
    PodLimits,
    mapping_or_empty,
    pod_limits,
    pod_metadata_of,
    pod_spec_of,
    show_cpu_millis,
    show_memory_bytes,
)
from .quantity import MIB

if TYPE_CHECKING:
    from .model import KataSizingPolicy
    from .sizing import ClassSizing, PolicySizing

ADMISSION_API_VERSION = "admissionregistration.k8s.io/v1"
# The MutatingAdmissionPolicy version Kubernetes 1.37 serves: admissionregistration.k8s.io/v1
# only (v1beta1 and v1alpha1 are off by default), checked on the real control plane by
# tests/api/test_real_admission.py.
MUTATING_API_VERSION = "admissionregistration.k8s.io/v1"

RULE_MEMORY_LIMIT_MISSING = "pod-memory-limit-missing"
RULE_ENVELOPE_EXCEEDED = "pod-envelope-exceeded"
RULE_NOT_ROUTED = "pod-not-routed"
RULE_SANDBOX_MEMORY_ZERO = "pod-sandbox-memory-zero"


# --- the rule ----------------------------------------------------------------------------------

def envelope_millis(sized: ClassSizing) -> int:
    return int(sized.envelope_cpu * 1000)


def envelope_bytes(sized: ClassSizing) -> int:
    return sized.envelope_memory_bytes


def covers(sized: ClassSizing, limits: PodLimits) -> bool:
    """The class's envelope (spec.classes[].cpu / .memory) covers these limits."""
    return ((limits.cpu_millis or 0) <= envelope_millis(sized)
            and (limits.memory_bytes or 0) <= envelope_bytes(sized))


def route(limits: PodLimits, sizing: PolicySizing) -> ClassSizing | None:
    """The smallest class (first in the policy's order, which increases in memory) that covers
    the limits, or None when none does."""
    for sized in sizing.classes:
        if covers(sized, limits):
            return sized
    return None


def _envelope_text(sized: ClassSizing) -> str:
    return f"cpu {show_cpu_millis(envelope_millis(sized))}, memory {show_memory_bytes(envelope_bytes(sized))}"


def _largest_text(sizing: PolicySizing) -> str:
    largest = sizing.classes[-1]
    return f"the largest is {largest.runtime_class}: {_envelope_text(largest)}"


def _fit_text(limits: PodLimits, sizing: PolicySizing) -> str:
    fit = route(limits, sizing)
    if fit is not None:
        return f"the smallest class that fits is {fit.runtime_class}"
    return f"no class of policy {sizing.policy.name} fits ({_largest_text(sizing)})"


def zero_sandbox_classes(sizing: PolicySizing) -> tuple[list[bool], list[bool]]:
    """Per class: (default_memory is 0, overhead_memory is 0) in runtime-rs, where Kata boots a
    pod without limits with default_memory and a pod with limits with its memory limit plus
    overhead_memory, and refuses a 0 MiB sandbox (sizing.simulate_rust). The Go runtime never
    boots 0 MiB (it replaces a default_memory below 256 MiB)."""
    from .defaults import Runtime

    if sizing.runtime is not Runtime.RUST:
        return [False] * len(sizing.classes), [False] * len(sizing.classes)
    return ([c.default_memory_mib == 0 for c in sizing.classes],
            [c.overhead_memory_mib == 0 for c in sizing.classes])


def _kata_refusal(limits: PodLimits, sized: ClassSizing, sizing: PolicySizing) -> str | None:
    """Why Kata refuses to start this pod on its class (the class is one of a zero sandbox), or None."""
    from .sizing import SandboxRefused, simulate_rust

    index = sizing.classes.index(sized)
    default_zero, overhead_zero = zero_sandbox_classes(sizing)
    if not (default_zero[index] or overhead_zero[index]):
        return None
    cpu = None if limits.cpu_millis is None else Decimal(limits.cpu_millis) / 1000
    try:
        simulate_rust(cpu, limits.memory_bytes, sized.overhead_vcpus, sized.overhead_memory_mib,
                      sized.default_vcpus, sized.default_memory_mib, sizing.hypervisor)
    except SandboxRefused as exc:
        boots = (_BOOTS_WITHOUT_LIMITS if limits.cpu_millis is None and limits.memory_bytes is None
                 else _BOOTS_WITH_LIMITS)
        return f"{exc} (class {sized.name} {boots}, which is 0; {_figures(limits)})"
    return None


_BOOTS_WITHOUT_LIMITS = "boots a pod without limits with default_memory"
_BOOTS_WITH_LIMITS = "boots a pod with limits with its memory limit in MiB plus overhead_memory"


def _figures(limits: PodLimits) -> str:
    return f"limits cpu {show_cpu_millis(limits.cpu_millis)}, memory {show_memory_bytes(limits.memory_bytes)}"


@dataclass(frozen=True)
class PodFinding:
    namespace: str
    name: str
    runtime_class: str  # "" when the pod has none (a pod that opted in and was not routed)
    class_name: str | None  # the policy's class of runtime_class
    rule: str
    action: str  # Deny, Warn or Audit: what spec.admission configures for the rule
    message: str
    smallest_fit: str | None  # the RuntimeClass of the smallest class that covers the pod
    limits: PodLimits = field(compare=False, default=PodLimits(None, None, False))

    @property
    def is_error(self) -> bool:
        return self.action == "Deny"

    def as_dict(self) -> dict:
        return {"namespace": self.namespace, "name": self.name, "runtimeClass": self.runtime_class,
                "class": self.class_name, "rule": self.rule, "action": self.action, "message": self.message,
                "smallestFit": self.smallest_fit, "limits": self.limits.as_dict()}


def _who(namespace: str, name: str) -> str:
    return f"pod {namespace}/{name}"


def check_limits(limits: PodLimits, runtime_class: str, sizing: PolicySizing, namespace: str = "",
                 name: str = "", opted_in: bool = False) -> list[PodFinding]:
    """The rule on a pod's figures: empty when it fits its class, or when runtime_class is not
    one of the policy's classes (and the pod did not opt in to be routed by this policy).
    Namespace scope is the caller's (see `in_scope`)."""
    admission = sizing.policy.spec.admission
    fit = route(limits, sizing)
    fit_name = fit.runtime_class if fit else None
    who = _who(namespace, name)
    by_runtime_class = {c.runtime_class: c for c in sizing.classes}
    sized = by_runtime_class.get(runtime_class) if runtime_class else None
    findings = []
    if sized is not None:
        if limits.memory_missing:
            findings.append(PodFinding(
                namespace, name, runtime_class, sized.name, RULE_MEMORY_LIMIT_MISSING,
                admission.memory_limit_missing,
                f"{who} on RuntimeClass {runtime_class} has no memory limit (a container without "
                f"limits.memory and no pod-level limit): Kata sizes the VM from the limits that are set "
                f"and Kubernetes accounts only those plus podFixed; set limits.memory ({_figures(limits)}; "
                f"class {sized.name}: {_envelope_text(sized)}; {_fit_text(limits, sizing)})",
                fit_name, limits))
        refusal = _kata_refusal(limits, sized, sizing)
        if refusal:
            # Admitted, it would never start; the envelope policy refuses it (docs/rules.md).
            findings.append(PodFinding(
                namespace, name, runtime_class, sized.name, RULE_SANDBOX_MEMORY_ZERO, admission.envelope_exceeded,
                f"{who} on RuntimeClass {runtime_class}: Kata refuses to start it: {refusal}", fit_name, limits))
        if not covers(sized, limits):
            findings.append(PodFinding(
                namespace, name, runtime_class, sized.name, RULE_ENVELOPE_EXCEEDED,
                admission.envelope_exceeded,
                f"{who} on RuntimeClass {runtime_class}: {_figures(limits)} exceed class {sized.name} "
                f"({_envelope_text(sized)}), whose podFixed does not cover the guest overhead of a VM "
                f"that large; {_fit_text(limits, sizing)}",
                fit_name, limits))
    elif not runtime_class and opted_in:
        reason = (f"the smallest class that fits, {fit_name}, was not set (is the routing installed?)"
                  if fit else f"{_figures(limits)} fit no class ({_largest_text(sizing)})")
        findings.append(PodFinding(
            namespace, name, "", None, RULE_NOT_ROUTED, admission.envelope_exceeded,
            f"{who} asks for a class of policy {sizing.policy.name} (label {POLICY_LABEL}) and has no "
            f"runtimeClassName: {reason}",
            fit_name, limits))
    return findings


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics: every matchLabels pair and every expression holds."""
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return False
    for requirement in selector.match_expressions:
        present = requirement.key in labels
        found = labels.get(requirement.key)
        values = requirement.values or []
        if requirement.operator == "In" and not (present and found in values):
            return False
        if requirement.operator == "NotIn" and present and found in values:
            return False
        if requirement.operator == "Exists" and not present:
            return False
        if requirement.operator == "DoesNotExist" and present:
            return False
    return True


def in_scope(policy: KataSizingPolicy, namespace: str, namespace_labels: Mapping[str, str] | None = None) -> bool:
    """The namespace is one spec.admission applies to. Without its labels, only the name is
    known (the label kubernetes.io/metadata.name, which the API server sets on every namespace)."""
    labels = dict(namespace_labels or {})
    # The API server sets this label to the namespace's name itself (NamespaceDefaultLabelName);
    # a file that says otherwise is wrong, and the name decides.
    labels[NAMESPACE_NAME_LABEL] = namespace
    return selector_matches(namespace_selector(policy), labels)


def namespace_selector(policy: KataSizingPolicy) -> LabelSelector:
    """spec.admission.namespaces as one namespaceSelector (names become an In expression)."""
    scope = policy.spec.admission.namespaces
    selector = scope.selector or LabelSelector()
    if scope.names:
        from .model import LabelSelectorRequirement

        selector = LabelSelector(
            match_labels=selector.match_labels,
            match_expressions=[*selector.match_expressions, LabelSelectorRequirement(
                key=NAMESPACE_NAME_LABEL, operator="In", values=list(scope.names))],
        )
    return selector


def policies_opted_into(metadata: Mapping, namespace_labels: Mapping[str, str] | None = None) -> list[str]:
    """The policies a pod asks to be routed by: its own label's, then its namespace's."""
    asked = (mapping_or_empty(mapping_or_empty(metadata).get("labels")).get(POLICY_LABEL),
             mapping_or_empty(namespace_labels).get(POLICY_LABEL))
    return list(dict.fromkeys(name for name in asked if isinstance(name, str) and name))


def opted_in(metadata: Mapping, policy_name: str, namespace_labels: Mapping[str, str] | None = None) -> bool:
    return policy_name in policies_opted_into(metadata, namespace_labels)


def check_pod(pod: Mapping, sizing: PolicySizing, namespace_labels: Mapping[str, str] | None = None,
              routed: bool = False) -> list[PodFinding]:
    """What the admission policies of `sizing` say about this Pod (or workload template):
    its findings, empty when it fits (or is not one of the policy's pods or namespaces).
    `routed=True` first applies the routing, as the API server does before validating."""
    policy = sizing.policy
    if not policy.spec.admission.enabled:
        return []
    metadata = pod_metadata_of(pod)
    namespace = str(metadata.get("namespace") or "default")
    name = str(metadata.get("name") or metadata.get("generateName") or "")
    if not in_scope(policy, namespace, namespace_labels):
        return []
    spec = pod_spec_of(pod)
    limits = pod_limits(spec)
    runtime_class = spec.get("runtimeClassName") or ""
    wants = opted_in(metadata, policy.name, namespace_labels)
    if routed and not runtime_class and wants:
        fit = route(limits, sizing)
        runtime_class = fit.runtime_class if fit else ""
    return check_limits(limits, str(runtime_class), sizing, namespace, name, opted_in=wants)


def route_patch(pod: Mapping, sizing: PolicySizing, namespace_labels: Mapping[str, str] | None = None) -> list[dict]:
    """The JSON patch the routing applies to a Pod at CREATE: only `/spec/runtimeClassName`.

    Nothing else: a mutation by an admission policy or webhook makes the API server run the
    built-in mutating plugins again (reinvocation), and the RuntimeClass plugin then sets
    spec.overhead to the class's podFixed and merges its nodeSelector and tolerations, exactly
    as for a pod that named the class itself (proven on the real server). Setting
    spec.overhead here as well would be refused if it differed by a byte."""
    if not sizing.policy.spec.admission.enabled:
        return []
    metadata = pod_metadata_of(pod)
    spec = pod_spec_of(pod)
    namespace = str(metadata.get("namespace") or "default")
    if spec.get("runtimeClassName") or not opted_in(metadata, sizing.policy.name, namespace_labels):
        return []
    if not in_scope(sizing.policy, namespace, namespace_labels):
        return []
    fit = route(pod_limits(spec), sizing)
    if fit is None:
        return []
    return [{"op": "add", "path": "/spec/runtimeClassName", "value": fit.runtime_class}]


# --- the same rule in CEL --------------------------------------------------------------------------


def _cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cel_bytes(q: str) -> str:
    # A whole number of bytes as int; a fraction rounds up as Kubernetes rounds it.
    return (f"(quantity({q}).isInteger() ? quantity({q}).asInteger() : "
            f"int(quantity({q}).asApproximateFloat()) + 1)")


def _cel_millis(q: str) -> str:
    # Whole cores exactly; otherwise millicores rounded up (the float is exact to well below
    # a millicore for any CPU a node has; the tolerance absorbs its last-bit error).
    return (f"(quantity({q}).isInteger() ? quantity({q}).asInteger() * 1000 : "
            f"int(quantity({q}).asApproximateFloat() * 1000.0 - 0.0000001) + 1)")


# The init containers' sidecar limits are summed in blocks of this many: an init container's
# peak is its limit plus the sidecars started before it, and a prefix sum over the blocks before
# it and the sidecars of its own block keeps that linear in the pod (n·B + (n/B)² additions; a
# sum over every sidecar before each init container, which CEL would otherwise need, is n²/2:
# a pod of 500 init containers, half of them sidecars, exceeded the API server's per-expression
# cost limit; docs/admission.md).
_SIDECAR_BLOCK = 32


def _cel_aggregate(resource: str, per: str) -> list[tuple[str, str]]:
    """Variables computing one resource's effective limit (`variables.<resource>`)."""
    r = resource
    conv = _cel_bytes if r == "memory" else _cel_millis
    inits, sidecars, blocks, before = (f"variables.{r}Inits", f"variables.{r}Sidecars", f"variables.{r}SidecarBlocks",
                                       f"variables.{r}SidecarsBeforeBlock")
    b = _SIDECAR_BLOCK
    return [
        (f"{r}Containers", f"variables.containerLimits.map(l, '{r}' in l ? {conv(f'l[{_cel_string(r)}]')} : 0)"),
        (f"{r}Inits", f"variables.initLimits.map(l, '{r}' in l ? {conv(f'l[{_cel_string(r)}]')} : 0)"),
        # Each init container's limit if it is a sidecar, else 0.
        (f"{r}Sidecars", f"{inits}.transformList(i, v, variables.sidecars[i] ? v : 0)"),
        (f"{r}ContainersSum", f"variables.{r}Containers.sum()"),
        (f"{r}Regular", f"variables.{r}ContainersSum + {sidecars}.sum()"),
        (f"{r}SidecarBlocks",
         f"lists.range((size({sidecars}) + {b - 1}) / {b}).map(k, {sidecars}.slice(k * {b}, "
         f"[k * {b} + {b}, size({sidecars})].min()).sum())"),
        (f"{r}SidecarsBeforeBlock", f"lists.range(size({blocks})).map(k, {blocks}.slice(0, k).sum())"),
        (f"{r}InitPeak",
         f"([0] + lists.range(size({inits})).filter(i, !variables.sidecars[i])"
         f".map(i, {inits}[i] + (i < {b} ? 0 : {before}[i / {b}]) + {sidecars}.slice(i / {b} * {b}, i).sum())).max()"),
        (f"{r}Set",
         f"'{r}' in variables.podLimits || variables.containerLimits.exists(l, '{r}' in l) || "
         f"variables.initLimits.exists(l, '{r}' in l)"),
        # No init container above the regular containers' sum: none can peak above the regular
        # containers and sidecars (its peak is itself plus some of those sidecars), and the peaks
        # are not computed. Most pods' init containers are small.
        (r,
         f"'{r}' in variables.podLimits ? {conv(f'variables.podLimits[{_cel_string(r)}]')} : "
         f"(size({inits}) == 0 || {inits}.max() <= variables.{r}ContainersSum ? variables.{r}Regular : "
         f"(variables.{r}Regular > variables.{r}InitPeak ? variables.{r}Regular : variables.{r}InitPeak))"),
    ]


_CEL_MEMORY_TEXT = (
    "!variables.memorySet ? 'none' : variables.memory == 0 ? '0' : "
    + " : ".join(f"variables.memory % {factor} == 0 ? string(variables.memory / {factor}) + '{suffix}'"
                 for factor, suffix in MEMORY_UNITS)
    + " : string(variables.memory)"
)
_CEL_CPU_TEXT = ("!variables.cpuSet ? 'none' : variables.cpu % 1000 == 0 ? string(variables.cpu / 1000) : "
                 "string(variables.cpu) + 'm'")


# The figures of one policy the shared CEL reads (`params.data[...]`): podfit's own lists,
# joined by these separators (class names and RuntimeClass names are DNS labels, numbers digits;
# the envelope texts hold commas, "cpu 1, memory 1Gi", and no semicolon).
_PARAM_SEPARATORS = {"classNames": ",", "runtimeClasses": ",", "classCpu": ",", "classMemory": ",",
                     "classEnvelopes": ";", "defaultZero": ",", "overheadZero": ","}


def _param_list(key: str) -> str:
    return f"params.data['{key}'].split('{_PARAM_SEPARATORS[key]}')"


# The lists the routing and the messages read whole, as CEL variables (the validations read only
# the pod's own class's items: `_own_item`).
_PARAM_LISTS = {
    "classNames": _param_list("classNames"),
    "runtimeClasses": _param_list("runtimeClasses"),
    "classCpu": f"{_param_list('classCpu')}.map(x, int(x))",
    "classMemory": f"{_param_list('classMemory')}.map(x, int(x))",
    "classEnvelopes": _param_list("classEnvelopes"),
}


def params_data(sizing: PolicySizing) -> dict[str, str]:
    """The parameters the shared CEL reads (`params.data[...]`; ADMISSION_CONTRACT): keys of the
    policy's drop-ins ConfigMap, beside its `<class>.toml` keys (a key here has no dot)."""
    from .rules import sandbox_zero_message

    classes = sizing.classes
    default_zero, overhead_zero = zero_sandbox_classes(sizing)
    lists: dict[str, Sequence[object]] = {
        "classNames": [c.name for c in classes],
        "runtimeClasses": [c.runtime_class for c in classes],
        "classCpu": [envelope_millis(c) for c in classes],
        "classMemory": [envelope_bytes(c) for c in classes],
        "classEnvelopes": [_envelope_text(c) for c in classes],
        "defaultZero": ["true" if z else "false" for z in default_zero],
        "overheadZero": ["true" if z else "false" for z in overhead_zero],
    }
    data = {key: _PARAM_SEPARATORS[key].join(str(v) for v in values) for key, values in lists.items()}
    data.update({
        "policy": sizing.policy.name,
        "largestText": _largest_text(sizing),
        "sandboxZeroMessage": sandbox_zero_message(sizing.hypervisor),
    })
    return dict(sorted(data.items()))


def _own_item(key: str) -> str:
    """The pod's class's item of a parameter list (`variables.own` indexes it), as text."""
    return f"{_param_list(key)}[variables.own]"


def cel_variables() -> list[dict]:
    """The shared VAP/MAP `variables`: the pod's effective limits and, from the binding's
    parameters, the policy's classes."""
    variables = [
        ("podLimits", "has(object.spec.resources) && has(object.spec.resources.limits) ? "
                      "object.spec.resources.limits : {}"),
        ("containerLimits", "object.spec.containers.map(c, has(c.resources) && has(c.resources.limits) ? "
                            "c.resources.limits : {})"),
        ("initLimits", "has(object.spec.initContainers) ? object.spec.initContainers.map(c, "
                       "has(c.resources) && has(c.resources.limits) ? c.resources.limits : {}) : []"),
        ("sidecars", "has(object.spec.initContainers) ? object.spec.initContainers.map(c, "
                     "has(c.restartPolicy) && c.restartPolicy == 'Always') : []"),
        *_cel_aggregate("cpu", "millis"),
        *_cel_aggregate("memory", "bytes"),
        ("memoryMissing",
         "!('memory' in variables.podLimits && quantity(variables.podLimits['memory']).isGreaterThan(quantity('0'))) && "
         "(variables.containerLimits.exists(l, !('memory' in l && quantity(l['memory']).isGreaterThan(quantity('0')))) || "
         "variables.initLimits.exists(l, !('memory' in l && quantity(l['memory']).isGreaterThan(quantity('0')))))"),
        *_PARAM_LISTS.items(),
        ("fits", "lists.range(size(variables.classCpu)).filter(i, variables.cpu <= variables.classCpu[i] && "
                 "variables.memory <= variables.classMemory[i])"),
        ("own", "has(object.spec.runtimeClassName) ? "
                "variables.runtimeClasses.indexOf(object.spec.runtimeClassName) : -1"),
        # The figures of the pod's own class, read without building the lists of every class
        # (the validations need no other; the routing and the messages do).
        ("ownCpu", f"int({_own_item('classCpu')})"),
        ("ownMemory", f"int({_own_item('classMemory')})"),
        ("ownDefaultZero", f"{_own_item('defaultZero')} == 'true'"),
        ("ownOverheadZero", f"{_own_item('overheadZero')} == 'true'"),
        # namespaceObject is null in matchConditions (the API server passes no namespace to
        # them), so the namespace label is read here, in a variable.
        ("optedIn", _cel_opted_in()),
        ("who", "'pod ' + request.namespace + '/' + (has(object.metadata.name) ? object.metadata.name : "
                "(has(object.metadata.generateName) ? object.metadata.generateName : ''))"),
        ("figures", f"'limits cpu ' + ({_CEL_CPU_TEXT}) + ', memory ' + ({_CEL_MEMORY_TEXT})"),
        ("largestText", "params.data['largestText']"),
        ("fitText",
         "size(variables.fits) > 0 ? 'the smallest class that fits is ' + variables.runtimeClasses[variables.fits[0]] : "
         "'no class of policy ' + params.data['policy'] + ' fits (' + variables.largestText + ')'"),
    ]
    return [{"name": name, "expression": expression} for name, expression in variables]


def _cel_in_class() -> str:
    return "variables.own >= 0"


def _cel_opted_in() -> str:
    label = _cel_string(POLICY_LABEL)
    value = "params.data['policy']"
    return (f"(has(object.metadata.labels) && {label} in object.metadata.labels && "
            f"object.metadata.labels[{label}] == {value}) || "
            f"(namespaceObject != null && has(namespaceObject.metadata.labels) && "
            f"{label} in namespaceObject.metadata.labels && namespaceObject.metadata.labels[{label}] == {value})")


# A match condition may read the parameters (the API server passes them): a pod of another
# policy's class is not matched by this policy's binding.
_CEL_IN_CLASS_OF_PARAMS = ("has(object.spec.runtimeClassName) && "
                           "object.spec.runtimeClassName in params.data['runtimeClasses'].split(',')")


def _match_condition_without_class() -> dict:
    return {"name": "without-a-runtime-class", "expression": "!has(object.spec.runtimeClassName)"}


# Every field the API server would default is written out (admissionregistration/v1
# defaults.go: a rule's scope "*"; a MatchResources' matchPolicy Equivalent and empty
# namespaceSelector and objectSelector; a policy's failurePolicy Fail; a MutatingAdmissionPolicy's
# reinvocationPolicy Never). MatchResources is an atomic struct for server-side apply, so a GitOps
# tool applying `kata-sizing render`'s output over the operator's objects would otherwise own a
# different value of the whole field and conflict on .spec.matchConstraints (docs/admission.md).
_POD_RULES = [
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "*"},
    # In-place resize (GA in 1.35) changes limits through this subresource only.
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods/resize"],
     "scope": "*"},
]


def _match_resources(resource_rules: list[dict] | None = None, namespace_selector: dict | None = None,
                     object_selector: dict | None = None) -> dict:
    """A MatchResources as the API server stores it (its defaults written out)."""
    match: dict = {"matchPolicy": "Equivalent", "namespaceSelector": namespace_selector or {},
                   "objectSelector": object_selector or {}}
    if resource_rules is not None:
        match["resourceRules"] = resource_rules
    return match


def admission_names(policy_name: str) -> dict[str, str]:
    """The names of a policy's bindings (one per shared policy, keyed as SHARED_NAMES)."""
    base = f"kata-sizing-{policy_name}"
    return {"memory": f"{base}-memory-limit", "envelope": f"{base}-envelope", "route": f"{base}-route"}


# The contract between the shared admission policies and a policy's parameters: the keys of
# `params_data` and what each means. The shared objects' names carry it, so a policy's bindings
# name the shared CEL that reads its parameters. Within a version the CEL changes only in ways
# that read the same keys the same way; a change that needs other parameters is a new version,
# whose shared objects the install carries beside the old ones until every policy's objects have
# moved (docs/gitops.md, upgrades). tests/unit/test_podfit.py holds the keys of each version.
ADMISSION_CONTRACT = "v1"

# The three admission policies every KataSizingPolicy shares (docs/admission.md): the CEL is the
# same for all; each policy's bindings name its parameters.
SHARED_NAMES = {key: f"kata-sizing-{rule}-{ADMISSION_CONTRACT}"
                for key, rule in (("memory", "memory-limit"), ("envelope", "envelope"), ("route", "route"))}

# The install's binding of each shared policy that keeps the API server following the
# parameters (docs/admission.md#the-parameters-stay-followed). kube-apiserver (seen on 1.37.2)
# stops its informer of a paramKind once no binding of a policy with that paramKind is left, for
# one refresh of about a second, and never starts it again: the parameters it then judges pods
# by are a stale copy, or a ConfigMap it reads from the API per binding per pod. A binding of
# each shared policy that matches no object keeps the informer running whatever the policies' own
# bindings do (the validating and the mutating plugin each count only their own bindings, and
# share the one informer, which either may stop).
KEEP_ALIVE_SUFFIX = "-keep-alive"
KEEP_ALIVE_NAMES = {key: name + KEEP_ALIVE_SUFFIX for key, name in SHARED_NAMES.items()}
# No object carries a label and lacks it: the binding judges nothing, so it never reads its
# parameters either; were it edited to match, it would find none and, with Allow, judge nothing.
_NO_OBJECT = {"matchExpressions": [{"key": POLICY_LABEL, "operator": "Exists"},
                                   {"key": POLICY_LABEL, "operator": "DoesNotExist"}]}
# A name no policy's parameters have (theirs end in -dropins), where only administrators write.
_NO_PARAMETERS = {"name": "kata-sizing-keep-alive", "namespace": "kube-system", "parameterNotFoundAction": "Allow"}


def validations() -> dict[str, list[dict]]:
    """The validations of each shared VAP; their messages are check_limits' messages, word for word."""
    # The API server evaluates every messageExpression of a policy on every request, passing or not,
    # in an evaluation of its own that computes the variables it reads again (k8s.io/apiserver
    # 1.37, validating.validator.Validate): each message is built only when its validation fails.
    class_of = "variables.classNames[variables.own]"
    envelope_of = "variables.classEnvelopes[variables.own]"
    rc = "object.spec.runtimeClassName"
    no_limits = "(!variables.cpuSet && !variables.memorySet)"
    rules = {
        "memory": [{
            "expression": "!variables.memoryMissing",
            "messageExpression": (
                f"variables.who + ' on RuntimeClass ' + {rc} + ' has no memory limit (a container without "
                "limits.memory and no pod-level limit): Kata sizes the VM from the limits that are set and "
                "Kubernetes accounts only those plus podFixed; set limits.memory (' + variables.figures + "
                f"'; class ' + {class_of} + ': ' + {envelope_of} + '; ' + variables.fitText + ')'"),
            "reason": "Forbidden",
        }],
        "envelope": [
            {
                "expression": (f"!({_cel_in_class()}) || (variables.cpu <= variables.ownCpu && "
                               "variables.memory <= variables.ownMemory)"),
                "messageExpression": (
                    f"variables.who + ' on RuntimeClass ' + {rc} + ': ' + variables.figures + ' exceed class ' + "
                    f"{class_of} + ' (' + {envelope_of} + '), whose podFixed does not cover the guest overhead "
                    "of a VM that large; ' + variables.fitText"),
                "reason": "Forbidden",
            },
            {
                # A pod Kata would refuse to start (_kata_refusal): runtime-rs boots a 0 MiB sandbox
                # on a class whose default_memory (no limits) or overhead_memory (limits under 1 MiB)
                # is 0. Every flag is false for the other classes and for the Go runtime.
                "expression": (f"!({_cel_in_class()}) || !({no_limits} ? variables.ownDefaultZero : "
                               f"(variables.ownOverheadZero && variables.memory < {MIB}))"),
                "messageExpression": (
                    f"variables.who + ' on RuntimeClass ' + {rc} + ': Kata refuses to start it: ' + "
                    f"params.data['sandboxZeroMessage'] + ' (class ' + {class_of} + ' ' + ({no_limits} ? "
                    f"{_cel_string(_BOOTS_WITHOUT_LIMITS)} : {_cel_string(_BOOTS_WITH_LIMITS)}) + "
                    "', which is 0; ' + variables.figures + ')'"),
                "reason": "Forbidden",
            },
            {
                # Routing (the MutatingAdmissionPolicy, or the operator's webhook) ran before
                # validation: an opted-in pod still without a class fits none, or was not routed.
                "expression": "has(object.spec.runtimeClassName) || request.operation != 'CREATE' || "
                              "!variables.optedIn",
                "messageExpression": (
                    "variables.who + ' asks for a class of policy ' + params.data['policy'] + ' (label "
                    + POLICY_LABEL + ") and has no runtimeClassName: ' + (size(variables.fits) > 0 ? 'the "
                    "smallest class that fits, ' + variables.runtimeClasses[variables.fits[0]] + ', was not set "
                    "(is the routing installed?)' : variables.figures + ' fit no class (' + variables.largestText "
                    "+ ')')"),
                "reason": "Forbidden",
            },
        ],
    }
    return {key: [{**rule, "messageExpression": f"({rule['expression']}) ? '' : ({rule['messageExpression']})"}
                  for rule in checks] for key, checks in rules.items()}


_VARIABLE_READ = re.compile(r"\bvariables\.(\w+)")


def variables_read(variables: list[dict], expressions: Sequence[str]) -> list[dict]:
    """The variables `expressions` read, directly or through other variables, in their order. The
    API server prepares every variable of a policy for each evaluation (lazily evaluated, but each
    one set up), so each shared policy declares only the ones its own expressions need."""
    by_name = {v["name"]: v["expression"] for v in variables}
    needed: set[str] = set()
    pending = [name for e in expressions for name in _VARIABLE_READ.findall(e)]
    while pending:
        name = pending.pop()
        if name not in needed:
            needed.add(name)
            pending.extend(_VARIABLE_READ.findall(by_name[name]))
    return [v for v in variables if v["name"] in needed]


_CEL_LITERAL = re.compile(r"'((?:[^'\\]|\\.)*)'" + r'|"((?:[^"\\]|\\.)*)"', re.S)


def _as_double_quoted(match: re.Match) -> str:
    if match[2] is not None:
        return match[0]
    return '"' + match[1].replace("\\'", "'").replace('"', '\\"') + '"'


def _double_quoted(expression: str) -> str:
    """The CEL with its string literals in double quotes. Same meaning; the YAML printed by
    `kata-sizing render` then quotes the expression once instead of doubling every quote in it."""
    return _CEL_LITERAL.sub(_as_double_quoted, expression)


def _requote(value: object) -> object:
    if isinstance(value, dict):
        return {k: (_double_quoted(v) if k in ("expression", "messageExpression") else _requote(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_requote(v) for v in value]
    return value


def _selector_dict(selector: LabelSelector) -> dict:
    return selector.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)


_PARAM_KIND = {"apiVersion": "v1", "kind": "ConfigMap"}


@lru_cache(maxsize=4)
def shared_admission_specs(routing: str = "Auto") -> tuple[tuple[str, str, str, dict], ...]:
    """(apiVersion, kind, name, spec) of the shared admission objects: the two
    ValidatingAdmissionPolicies (one per rule: a binding's action applies to every validation of
    its policy) and, unless routing is Webhook, the MutatingAdmissionPolicy that routes; then the
    keep-alive binding of each (KEEP_ALIVE_NAMES). The same for every KataSizingPolicy; nothing in
    them is a policy's figure. Built once per routing (the operator renders them in every pass):
    the caller copies what it hands on."""
    # Each expression converted once; the objects share them (render_admission copies).
    variables = cast(list[dict], _requote(cel_variables()))
    checks = cast(dict[str, list[dict]], _requote(validations()))  # the same shape, requoted
    in_class = _double_quoted(_CEL_IN_CLASS_OF_PARAMS)
    specs = []
    for key, conditions in (
        ("memory", [{"name": "runs-in-a-class-of-this-policy", "expression": in_class}]),
        ("envelope", [{"name": "runs-in-a-class-of-this-policy-or-has-none",
                       "expression": f"!has(object.spec.runtimeClassName) || ({in_class})"}]),
    ):
        specs.append((ADMISSION_API_VERSION, "ValidatingAdmissionPolicy", SHARED_NAMES[key], {
            # A CEL error refuses the pod under Deny and warns under Warn: never a silent pass.
            "failurePolicy": "Fail",
            "paramKind": dict(_PARAM_KIND),
            "matchConstraints": _match_resources(_POD_RULES),
            "matchConditions": conditions,
            "variables": variables_read(variables, [e for rule in checks[key]
                                                    for e in (rule["expression"], rule["messageExpression"])]),
            "validations": checks[key],
        }))
    if routing != "Webhook":
        # A JSON patch, not an apply configuration: the API server applies an apply configuration
        # through structured-merge-diff over the whole typed pod, a quarter more of its CPU on a
        # pod of 400 init containers (docs/performance.md); the outcome is the same one field.
        mutation = ("variables.optedIn && size(variables.fits) > 0 ? [JSONPatch{op: 'add', path: "
                    "'/spec/runtimeClassName', value: variables.runtimeClasses[variables.fits[0]]}] : []")
        specs.append((MUTATING_API_VERSION, "MutatingAdmissionPolicy", SHARED_NAMES["route"], {
            "failurePolicy": "Fail",
            "paramKind": dict(_PARAM_KIND),
            "matchConstraints": _match_resources([_POD_RULES[0]]),
            "matchConditions": [cast(dict, _requote(_match_condition_without_class()))],
            "variables": variables_read(variables, [mutation]),
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": _double_quoted(mutation)}}],
            # The API server runs its built-in mutating plugins again after this mutation, so
            # the RuntimeClass plugin sets overhead and scheduling for the routed class.
            "reinvocationPolicy": "Never",
        }))
    return tuple(specs + [_keep_alive_binding(api_version, kind, name) for api_version, kind, name, _ in specs])


def _keep_alive_binding(api_version: str, policy_kind: str, policy_name: str) -> tuple[str, str, str, dict]:
    """The binding of a shared policy that judges nothing and keeps its paramKind's informer
    running (KEEP_ALIVE_NAMES). Audit: the mildest action, were it ever to judge."""
    spec: dict = {"policyName": policy_name, "paramRef": dict(_NO_PARAMETERS),
                  "matchResources": _match_resources(object_selector=_NO_OBJECT)}
    if policy_kind == "ValidatingAdmissionPolicy":
        spec["validationActions"] = ["Audit"]
    return api_version, f"{policy_kind}Binding", f"{policy_name}{KEEP_ALIVE_SUFFIX}", spec


def binding_specs(sizing: PolicySizing, params_name: str) -> list[tuple[str, str, str, dict]]:
    """(apiVersion, kind, name, spec) of a policy's bindings of the shared policies: its rule
    actions, its namespaces, and its parameters (the ConfigMap `params_name` in
    spec.output.namespace, which holds `params_data`).

    A binding whose parameters are missing judges nothing (`parameterNotFoundAction: Allow`). The
    API server looks the parameters up before it evaluates any match condition, so with Deny it
    refuses every pod of the binding's namespaces, Kata or not, for as long as the ConfigMap is
    missing (seen on the real server, tests/api/test_real_admission_gitops.py): while a GitOps prune
    or a teardown removes the ConfigMap before the binding, or for good once the output namespace
    is deleted under a policy that stays. The operator writes the parameters before the bindings
    and puts a deleted ConfigMap back; whoever may delete it could as well widen its envelopes."""
    policy = sizing.policy
    admission = policy.spec.admission
    names = admission_names(policy.name)
    selector = _selector_dict(namespace_selector(policy))
    match_resources = {"matchResources": _match_resources(namespace_selector=selector)} if selector else {}
    param_ref = {"name": params_name, "namespace": policy.spec.output.namespace,
                 "parameterNotFoundAction": "Allow"}
    specs = [
        (ADMISSION_API_VERSION, "ValidatingAdmissionPolicyBinding", names[key], {
            "policyName": SHARED_NAMES[key], "paramRef": dict(param_ref), "validationActions": [action],
            **match_resources,
        })
        for key, action in (("memory", admission.memory_limit_missing), ("envelope", admission.envelope_exceeded))
    ]
    if admission.routing != "Webhook":
        specs.append((MUTATING_API_VERSION, "MutatingAdmissionPolicyBinding", names["route"], {
            "policyName": SHARED_NAMES["route"], "paramRef": dict(param_ref), **match_resources,
        }))
    return specs
