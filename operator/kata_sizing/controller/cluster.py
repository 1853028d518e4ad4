"""Node facts from live Node and Pod objects, for node guidance (docs/sizing-model.md, Nodes).

Pure functions over API-shaped dicts. The operator feeds them from kopf indexes (filled by
watches), so recomputing guidance costs no API call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from decimal import Decimal

from ..core.guidance import NodeFacts
from ..core.labels import POLICY_LABEL
from ..core.measure import KataPod, kata_pod
from ..core.podread import PodInputError, PodLimits, pod_limits
from ..core.quantity import QuantityError, cpu_cores, memory_bytes


@dataclass(frozen=True)
class NodeSummary:
    name: str
    labels: tuple[tuple[str, str], ...]
    capacity_memory_bytes: int
    capacity_cpu: Decimal | None
    allocatable_memory_bytes: int | None
    allocatable_cpu: Decimal | None
    # Where its kubelet answers (controller/kubelet.py): the first address of the preferred
    # types, and status.daemonEndpoints.kubeletEndpoint.Port.
    kubelet_address: str | None = None
    kubelet_port: int | None = None
    kubelet_version: str | None = None

    def matches(self, selector: Mapping[str, str]) -> bool:
        labels = dict(self.labels)
        return all(labels.get(key) == value for key, value in selector.items())


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What the operator keeps of a pod: for node guidance, a scheduled pod's effective memory
    request and runtime class; for the pod audit, the effective limits of a pod with a
    runtimeClassName (or that asks a policy to route it), scheduled or not. A few dozen bytes
    per pod (slots, no per-instance dict): 100,000 pods stay a few MiB."""

    pod: str  # namespace/name
    runtime_class: str | None
    memory_request_bytes: int
    cpu_request: Decimal = Decimal(0)  # cores, as the scheduler counts them (overhead included)
    node: str | None = None
    limits: PodLimits | None = None  # only for pods the audit may look at
    routed_by: str | None = None  # the katasizing.dev/policy label of a pod without runtimeClassName
    # Only for a scheduled pod with a runtimeClassName: what the measurement needs (uid,
    # cgroup limit, podFixed, container names), see core/measure.
    kata: KataPod | None = None


def _memory(value: str | int | None) -> int:
    try:
        return memory_bytes(value) if value is not None else 0
    except QuantityError:
        return 0


def _cpu(value: str | int | float | None) -> Decimal | None:
    try:
        return cpu_cores(value) if value is not None else None
    except QuantityError:
        return None


# The address types tried for the kubelet, in order: metrics-server's chart default
# (--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname); a Hostname rarely
# resolves from inside a pod.
KUBELET_ADDRESS_TYPES = ("InternalIP", "ExternalIP", "Hostname")
KUBELET_DEFAULT_PORT = 10250


def kubelet_endpoint(status: Mapping) -> tuple[str | None, int | None]:
    addresses = [a for a in status.get("addresses") or [] if isinstance(a, Mapping)]
    address = next((a.get("address") for kind in KUBELET_ADDRESS_TYPES for a in addresses
                    if a.get("type") == kind and a.get("address")), None)
    endpoint = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    port = endpoint if isinstance(endpoint, int) and not isinstance(endpoint, bool) and 0 < endpoint < 65536 \
        else KUBELET_DEFAULT_PORT
    return (str(address) if address else None), (port if address else None)


def summarize_node(node: Mapping) -> NodeSummary | None:
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or {}
    if not meta.get("name") or capacity.get("memory") is None:
        return None
    address, port = kubelet_endpoint(status)
    return NodeSummary(
        name=meta["name"],
        labels=tuple(sorted((meta.get("labels") or {}).items())),
        capacity_memory_bytes=_memory(capacity.get("memory")),
        capacity_cpu=_cpu(capacity.get("cpu")),
        allocatable_memory_bytes=_memory(allocatable["memory"]) if "memory" in allocatable else None,
        allocatable_cpu=_cpu(allocatable.get("cpu")),
        kubelet_address=address,
        kubelet_port=port,
        kubelet_version=(status.get("nodeInfo") or {}).get("kubeletVersion") or None,
    )


def _request(container: Mapping, resource: str):
    value = ((container.get("resources") or {}).get("requests") or {}).get(resource)
    return _memory(value) if resource == "memory" else (_cpu(value) or Decimal(0))


def effective_request(spec: Mapping, resource: str):
    """Kubernetes' effective pod request of `resource` ("memory": bytes, "cpu": cores): the
    larger of the app containers (plus sidecars) and the largest init container (plus the
    sidecars started before it), plus overhead. Sidecars are init containers with
    restartPolicy Always (KEP-753)."""
    sidecars = 0
    init_peak = 0
    for init in spec.get("initContainers") or []:
        request = _request(init, resource)
        if init.get("restartPolicy") == "Always":
            sidecars += request
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, request + sidecars)
    app = sum((_request(c, resource) for c in spec.get("containers") or []), sidecars)
    overhead = _request({"resources": {"requests": spec.get("overhead") or {}}}, resource)
    return max(app, init_peak) + overhead


def summarize_pod(pod: Mapping) -> PodRequest | None:
    """The summary of a pod that holds memory on a node or that the pod audit looks at (a
    runtimeClassName, or the label asking a policy to route it); None otherwise, and for a pod
    that has finished (Succeeded, Failed)."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName") or None
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    meta = pod.get("metadata") or {}
    runtime_class = spec.get("runtimeClassName") or None
    routed_by = None if runtime_class else (meta.get("labels") or {}).get(POLICY_LABEL)
    if node is None and runtime_class is None and routed_by is None:
        return None
    limits = None
    if runtime_class is not None or routed_by is not None:
        try:
            limits = pod_limits(spec)
        except PodInputError:
            limits = None  # the API server validated it; nothing the audit can judge
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    return PodRequest(
        pod=name,
        runtime_class=runtime_class,
        memory_request_bytes=effective_request(spec, "memory") if node is not None else 0,
        cpu_request=effective_request(spec, "cpu") if node is not None else Decimal(0),
        node=node,
        limits=limits,
        routed_by=routed_by,
        kata=kata_pod(pod, None, limits) if runtime_class is not None and node is not None and limits else None,
    )


def namespace_labels(namespace: Mapping) -> dict[str, str]:
    """A Namespace's labels, what the routing webhook reads of it (its scope and opt-in label)."""
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


def is_kata_class(runtime_class: str | None, kata_classes: AbstractSet[str]) -> bool:
    # kata-deploy names its RuntimeClasses kata-<shim> (and `kata` for the default one).
    if not runtime_class:
        return False
    return runtime_class in kata_classes or runtime_class == "kata" or runtime_class.startswith("kata-")


def facts_for_nodes(
    nodes: Iterable[NodeSummary],
    pods_by_node: Mapping[str, Iterable[PodRequest]],
    selector: Mapping[str, str],
    kata_classes: AbstractSet[str],
) -> list[NodeFacts]:
    facts = []
    for node in nodes:
        if not node.matches(selector):
            continue
        infra_pods = [p for p in pods_by_node.get(node.name, ()) if not is_kata_class(p.runtime_class, kata_classes)]
        facts.append(NodeFacts(
            name=node.name,
            capacity_memory_bytes=node.capacity_memory_bytes,
            capacity_cpu=node.capacity_cpu,
            allocatable_memory_bytes=node.allocatable_memory_bytes,
            allocatable_cpu=node.allocatable_cpu,
            infra_pod_memory_bytes=sum(p.memory_request_bytes for p in infra_pods),
            infra_pod_cpu=sum((p.cpu_request for p in infra_pods), Decimal(0)),
            kubelet_version=node.kubelet_version,
        ))
    return sorted(facts, key=lambda f: f.name)
