"""Reading pods: the pod spec of a Pod or a workload, and its effective limits.

Effective limits are Kubernetes' own (k8s.io/component-helpers resource.PodLimits): the
regular containers summed plus the restartable init containers (sidecars); the larger of that
and, for each other init container, its limit plus the sidecars started before it; a
pod-level `spec.resources.limits` entry replaces the aggregate for its resource. Only the
limits that are set are summed, as the kubelet does when it sizes the sandbox (which is what
Kata boots the VM from). A memory limit is *missing* when some container (init containers
included) sets none or zero and there is no non-zero pod-level one: the kubelet then leaves
the pod cgroup without a memory limit (pkg/kubelet/cm ResourceConfigForPod). podfit.py holds
the rule these limits are judged by.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .quantity import QuantityError, cpu_cores, memory_bytes, shown

# How the pod rule's messages print figures; the admission policies' CEL prints them the same way.
MEMORY_UNITS = ((2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki"))


def show_memory_bytes(size: int | None) -> str:
    """Memory as the admission messages print it (podfit's CEL does the same, _CEL_MEMORY_TEXT)."""
    if size is None:
        return "none"
    if size == 0:
        return "0"
    for factor, suffix in MEMORY_UNITS:
        if size % factor == 0:
            return f"{size // factor}{suffix}"
    return str(size)


def show_cpu_millis(millis: int | None) -> str:
    if millis is None:
        return "none"
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController")


class PodInputError(ValueError):
    """A document that is not a Pod or a workload with a pod template, or unreadable limits."""


# --- reading pods ----------------------------------------------------------------------------


def pod_spec_of(obj: object) -> dict:
    """The pod spec of a Pod, a PodTemplate, a Deployment/StatefulSet/DaemonSet/ReplicaSet/Job
    template, or a CronJob's job template."""
    if not isinstance(obj, Mapping):
        raise PodInputError(f"expected a mapping (a Pod or a workload), got {type(obj).__name__}")
    kind = obj.get("kind")
    spec = obj.get("spec")
    if kind == "PodTemplate":
        spec = {"template": obj.get("template")}
        kind = "Deployment"
    if kind == "CronJob":
        spec = mapping_or_empty(mapping_or_empty(spec).get("jobTemplate")).get("spec")
        kind = "Job"
    if kind in WORKLOAD_KINDS:
        template = spec.get("template") if isinstance(spec, Mapping) else None
        spec = template.get("spec") if isinstance(template, Mapping) else None
        where = "spec.jobTemplate.spec.template.spec" if obj.get("kind") == "CronJob" else "spec.template.spec"
    elif kind in (None, "Pod"):
        where = "spec"
    else:
        raise PodInputError(f"kind {shown(kind)} is not a Pod or a workload with a pod template "
                            f"(Pod, {', '.join(WORKLOAD_KINDS)}, CronJob)")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("containers"), list):
        raise PodInputError(f"{where}.containers: missing; not a pod spec")
    return dict(spec)


def mapping_or_empty(value: object) -> Mapping:
    return value if isinstance(value, Mapping) else {}


def pod_metadata_of(obj: object) -> dict:
    """The metadata the pods of `obj` get (a workload's template metadata, else the object's);
    anything that is not a mapping where one belongs reads as empty."""
    obj = mapping_or_empty(obj)
    kind = obj.get("kind")
    spec = mapping_or_empty(obj.get("spec"))
    own = mapping_or_empty(obj.get("metadata"))
    if kind == "CronJob":
        spec = mapping_or_empty(mapping_or_empty(spec.get("jobTemplate")).get("spec"))
    if kind in (*WORKLOAD_KINDS, "CronJob", "PodTemplate"):
        template = obj.get("template") if kind == "PodTemplate" else spec.get("template")
        meta = dict(mapping_or_empty(mapping_or_empty(template).get("metadata")))
        meta.setdefault("namespace", own.get("namespace"))
        meta.setdefault("name", own.get("name"))
        return meta
    return dict(own)


@dataclass(frozen=True)
class PodLimits:
    """A pod's effective limits, as Kubernetes computes them (see the module docstring).

    `cpu_millis` / `memory_bytes`: the aggregate of the limits that are set, or None when no
    container and no pod-level limit sets one. `memory_missing`: some container has no memory
    limit (so the pod has none as a whole) and there is no pod-level one."""

    cpu_millis: int | None
    memory_bytes: int | None
    memory_missing: bool

    def as_dict(self) -> dict:
        return {"cpu": show_cpu_millis(self.cpu_millis), "memory": show_memory_bytes(self.memory_bytes),
                "memoryLimitMissing": self.memory_missing}


def _limits_of(container: object, where: str) -> Mapping:
    if not isinstance(container, Mapping):
        raise PodInputError(f"{where}: not a container (a mapping)")
    resources = container.get("resources")
    if resources is None:
        return {}
    if not isinstance(resources, Mapping):
        raise PodInputError(f"{where}.resources: not a mapping")
    limits = resources.get("limits")
    if limits is None:
        return {}
    if not isinstance(limits, Mapping):
        raise PodInputError(f"{where}.resources.limits: not a mapping")
    return limits


def _millis(value: object, where: str) -> int:
    try:
        return int(cpu_cores(value) * 1000)  # exact to the millicore, rounded up as Kubernetes does
    except QuantityError as exc:
        raise PodInputError(f"{where}: {exc}") from None


def _bytes(value: object, where: str) -> int:
    try:
        return memory_bytes(value)
    except QuantityError as exc:
        raise PodInputError(f"{where}: {exc}") from None


def _aggregate(containers: list[Mapping], inits: list[tuple[bool, Mapping]], key: str, parse,
               paths: tuple[list[str], list[str]]) -> int | None:
    present = False
    regular = 0
    for limits, where in zip(containers, paths[0]):
        if key in limits:
            present = True
            regular += parse(limits[key], f"{where}.resources.limits.{key}")
    sidecars = 0
    peak = 0
    for (sidecar, limits), where in zip(inits, paths[1]):
        value = 0
        if key in limits:
            present = True
            value = parse(limits[key], f"{where}.resources.limits.{key}")
        if sidecar:
            regular += value
            sidecars += value
        else:
            peak = max(peak, value + sidecars)
    return max(regular, peak) if present else None


def pod_limits(pod_or_spec: Mapping) -> PodLimits:
    """The effective limits of a Pod (a dict with `spec`) or of a pod spec (with `containers`)."""
    if not isinstance(pod_or_spec, Mapping):
        raise PodInputError("expected a Pod or a pod spec (a mapping)")
    spec = pod_or_spec if "containers" in pod_or_spec else pod_spec_of(pod_or_spec)
    containers = spec.get("containers") or []
    if not isinstance(containers, list):
        raise PodInputError("spec.containers: not a list")
    init_containers = spec.get("initContainers") or []
    if not isinstance(init_containers, list):
        raise PodInputError("spec.initContainers: not a list")
    container_paths = [f"spec.containers[{i}]" for i in range(len(containers))]
    init_paths = [f"spec.initContainers[{i}]" for i in range(len(init_containers))]
    regular = [_limits_of(c, p) for c, p in zip(containers, container_paths)]
    # _limits_of refuses an init container that is not a mapping before its restartPolicy is read.
    init_limits = [(_limits_of(c, p), c) for c, p in zip(init_containers, init_paths)]
    inits = [(c.get("restartPolicy") == "Always", limits) for limits, c in init_limits]
    pod_resources = spec.get("resources") or {}
    if not isinstance(pod_resources, Mapping):
        raise PodInputError("spec.resources: not a mapping")
    pod_level = pod_resources.get("limits") or {}
    if not isinstance(pod_level, Mapping):
        raise PodInputError("spec.resources.limits: not a mapping")

    paths = (container_paths, init_paths)
    cpu = (_millis(pod_level["cpu"], "spec.resources.limits.cpu") if "cpu" in pod_level
           else _aggregate(regular, inits, "cpu", _millis, paths))
    memory = (_bytes(pod_level["memory"], "spec.resources.limits.memory") if "memory" in pod_level
              else _aggregate(regular, inits, "memory", _bytes, paths))
    every = [*regular, *(limits for _, limits in inits)]
    container_missing = any(
        "memory" not in limits or _bytes(limits["memory"], "resources.limits.memory") == 0 for limits in every)
    pod_level_set = "memory" in pod_level and memory != 0
    return PodLimits(cpu, memory, container_missing and not pod_level_set)
