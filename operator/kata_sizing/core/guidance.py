"""Per-node guidance: kubelet reservations, /dev/shm size and how many VMs fit.

docs/sizing-model.md, Nodes. Pure: the operator (from Node and Pod objects) and the CLI (from
`--node-capacity`) both hand in `NodeFacts`; nodes with identical facts form one group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal

from . import defaults
from .quantity import MIB, format_cpu, format_memory, memory_bytes
from .rules import Problem, Rule, Severity
from .sizing import PolicySizing

GIB = 1024 * MIB


@dataclass(frozen=True)
class NodeFacts:
    name: str
    capacity_memory_bytes: int
    capacity_cpu: Decimal | None = None
    # What the kubelet reports; None offline (then the policy's own arithmetic is shown).
    allocatable_memory_bytes: int | None = None
    allocatable_cpu: Decimal | None = None
    # Sum of non-Kata pod memory requests; None when unknown (infraPodMemory: auto offline).
    infra_pod_memory_bytes: int | None = None
    # Sum of non-Kata pod CPU requests (cores); None when unknown (offline). The scheduler
    # counts them against allocatable CPU as it counts their memory against allocatable memory.
    infra_pod_cpu: Decimal | None = None
    # status.nodeInfo.kubeletVersion (v1.37.2); None offline without --kubelet-version.
    kubelet_version: str | None = None

    def group_key(self) -> tuple:
        # Infra requests differ from node to node; they are not part of a group's identity.
        return (
            self.capacity_memory_bytes, self.capacity_cpu, self.allocatable_memory_bytes,
            self.allocatable_cpu, kubelet_feature_gates(self.kubelet_version),
        )


@dataclass(frozen=True)
class ClassFit:
    name: str
    accounted_memory: str
    vm_memory: str
    by_allocatable: int
    by_cpu: int | None
    by_shm: int | None
    fit: int


@dataclass
class NodeGroupGuidance:
    key: str
    nodes: list[str]
    capacity_memory: str
    capacity_cpu: str | None
    system_reserved: str
    kube_reserved: str
    eviction_hard: str
    allocatable_memory: str
    observed_allocatable_memory: str | None
    infra_pod_memory: str
    infra_pod_memory_by_node: dict[str, str]
    shm_applies: bool
    shm_size: str | None
    shm_size_bytes: int | None
    fstab_line: str | None
    remount_command: str | None
    shm_reason: str | None
    fits: list[ClassFit]
    warnings: list[str] = field(default_factory=list)
    # Gates the kubelet configuration sets (kubelet_feature_gates), and why, one line each.
    kubelet_feature_gates: tuple[tuple[str, bool], ...] = ()
    kubelet_feature_gate_reasons: list[str] = field(default_factory=list)


def kubelet_minor(kubelet_version: str | None) -> tuple[int, int] | None:
    """(1, 37) of v1.37.2, v1.37.2-eks-1a2b or 1.37.2+k3s1; None when unknown."""
    match = re.match(r"v?(\d+)\.(\d+)", kubelet_version or "")
    return (int(match[1]), int(match[2])) if match else None


def kubelet_feature_gates(kubelet_version: str | None) -> tuple[tuple[str, bool], ...]:
    """The feature gates a node's KubeletConfiguration must set for the VMs-per-class figures to
    hold on that kubelet (docs/sizing-model.md, Nodes)."""
    if kubelet_minor(kubelet_version) in defaults.OVERHEAD_COUNTED_TWICE_KUBELET_MINORS:
        return ((defaults.OVERHEAD_COUNTED_TWICE_GATE, False),)
    return ()


def tmpfs_size(size_bytes: int) -> str:
    """A tmpfs `size=` value: mount(8) takes k, m or g suffixes, not Kubernetes' Mi/Gi."""
    if size_bytes % GIB == 0:
        return f"{size_bytes // GIB}g"
    return f"{size_bytes // MIB}m"


def shm_not_applicable_reason(sizing: PolicySizing) -> str | None:
    spec = sizing.policy.spec
    if spec.hugepages:
        return "enable_hugepages = true: guest RAM comes from /dev/hugepages, not /dev/shm"
    if sizing.hypervisor == "clh":
        return "Cloud Hypervisor backs guest RAM with memfd, not a file on /dev/shm"
    if sizing.hypervisor not in defaults.SHM_BACKED_HYPERVISORS:
        return f"{sizing.hypervisor} does not back guest RAM with a file on /dev/shm"
    return None


def _group_key(facts: NodeFacts) -> str:
    key = f"capacity-{format_memory(facts.capacity_memory_bytes)}"
    if facts.capacity_cpu is not None:
        key += f"-cpu-{format_cpu(facts.capacity_cpu)}"
    return key.lower()


def node_guidance(
    sizing: PolicySizing, nodes: list[NodeFacts]
) -> tuple[list[NodeGroupGuidance], list[Problem]]:
    spec = sizing.policy.spec.nodes
    system_reserved = memory_bytes(spec.system_reserved)
    kube_reserved = memory_bytes(spec.kube_reserved)
    eviction_hard = memory_bytes(spec.eviction_hard)
    reserved = system_reserved + kube_reserved + eviction_hard
    fixed_infra = None if spec.infra_pod_memory == "auto" else memory_bytes(spec.infra_pod_memory)
    shm_reason = shm_not_applicable_reason(sizing)

    grouped: dict[tuple, list[NodeFacts]] = {}
    for facts in nodes:
        grouped.setdefault(facts.group_key(), []).append(facts)

    groups, problems = [], []
    used_keys: dict[str, int] = {}
    for members in grouped.values():
        facts = members[0]
        names = sorted(m.name for m in members)
        capacity = facts.capacity_memory_bytes
        if reserved >= capacity:
            problems.append(Problem(Severity.ERROR, Rule.NODE_RESERVATIONS, "spec.nodes", (
                f"systemReserved {spec.system_reserved} + kubeReserved {spec.kube_reserved} + "
                f"evictionHard {spec.eviction_hard} = {format_memory(reserved)} is not smaller "
                f"than node capacity {format_memory(capacity)} ({', '.join(names)})")))
            continue
        allocatable = capacity - reserved
        warnings: list[str] = []
        if facts.allocatable_memory_bytes is not None and facts.allocatable_memory_bytes != allocatable:
            warnings.append(
                f"the kubelet reports allocatable {format_memory(facts.allocatable_memory_bytes)} "
                f"but the policy's reservations give {format_memory(allocatable)}: the kubelet is "
                "not configured as the policy says (apply kubeletConfiguration)"
            )
        # /dev/shm must hold every VM the kubelet admits, so the node of the group with the
        # least infra memory (the most room for Kata pods) sets it.
        measured = {m.name: m.infra_pod_memory_bytes for m in members if m.infra_pod_memory_bytes is not None}
        infra = fixed_infra if fixed_infra is not None else (min(measured.values()) if measured else None)
        infra_known = infra is not None
        infra = infra or 0
        room = max(0, allocatable - infra)
        shm_size = (room // MIB) * MIB
        fits = []
        cpu_total = facts.allocatable_cpu if facts.allocatable_cpu is not None else facts.capacity_cpu
        # The scheduler admits a pod while the CPU requests of the node's pods fit allocatable:
        # the infra pods' (every node runs some) come off first, as their memory does above.
        # Offline (no infra CPU known) the whole figure is shown.
        cpu_room = None if cpu_total is None else max(Decimal(0), cpu_total - (facts.infra_pod_cpu or 0))
        for sized in sizing.classes:
            accounted = (sized.envelope_memory_mib + sized.pod_fixed_memory_mib) * MIB
            vm_memory = sized.largest_vm.memory_mib * MIB
            by_allocatable = room // accounted
            by_cpu = None
            per_pod_cpu = sized.envelope_cpu + sized.pod_fixed_cpu
            # A class that accounts no CPU at all (an invalid policy being rendered for its
            # messages) is not limited by CPU: no division by its zero.
            if cpu_room is not None and per_pod_cpu > 0:
                by_cpu = int(cpu_room // per_pod_cpu)
            by_shm = None if shm_reason or vm_memory <= 0 else shm_size // vm_memory
            fit = min(v for v in (by_allocatable, by_cpu, by_shm) if v is not None)
            if fit == 0:
                warnings.append(
                    f"no VM of class {sized.name} fits: it needs {format_memory(accounted)} "
                    f"accounted and {format_memory(vm_memory)} of VM memory, the node has "
                    f"{format_memory(room)} after infra pods"
                )
            fits.append(ClassFit(
                sized.name, format_memory(accounted), format_memory(vm_memory),
                by_allocatable, by_cpu, by_shm, fit,
            ))
        gates = kubelet_feature_gates(facts.kubelet_version)
        gate_reasons = [
            f"kubelet {facts.kubelet_version} charges a running pod its podFixed twice (the "
            f"scheduler and the kubelet both, kubernetes/kubernetes#139627) while {gate} is on: "
            f"{gate}: false keeps the VMs per class above" for gate, _ in gates]
        if not infra_known:
            warnings.append(
                "infraPodMemory is auto but the infra pods' requests are unknown here; "
                "/dev/shm assumes none (the operator reads them from the cluster)"
            )
        key = _group_key(facts)
        used_keys[key] = used_keys.get(key, 0) + 1
        if used_keys[key] > 1:
            key = f"{key}-{used_keys[key]}"
        groups.append(NodeGroupGuidance(
            key=key,
            nodes=names,
            capacity_memory=format_memory(capacity),
            capacity_cpu=format_cpu(facts.capacity_cpu) if facts.capacity_cpu is not None else None,
            system_reserved=spec.system_reserved,
            kube_reserved=spec.kube_reserved,
            eviction_hard=spec.eviction_hard,
            allocatable_memory=format_memory(allocatable),
            observed_allocatable_memory=(
                format_memory(facts.allocatable_memory_bytes)
                if facts.allocatable_memory_bytes is not None else None
            ),
            infra_pod_memory=format_memory(infra),
            infra_pod_memory_by_node=(
                {name: format_memory(value) for name, value in sorted(measured.items())}
                if fixed_infra is None and len(measured) > 1 else {}
            ),
            shm_applies=shm_reason is None,
            shm_size=format_memory(shm_size) if shm_reason is None else None,
            shm_size_bytes=shm_size if shm_reason is None else None,
            fstab_line=(
                f"none /dev/shm tmpfs defaults,nosuid,nodev,size={tmpfs_size(shm_size)} 0 0"
                if shm_reason is None else None
            ),
            remount_command=(
                f"mount -o remount,size={tmpfs_size(shm_size)} /dev/shm" if shm_reason is None else None
            ),
            shm_reason=shm_reason,
            fits=fits,
            warnings=warnings,
            kubelet_feature_gates=gates,
            kubelet_feature_gate_reasons=gate_reasons,
        ))
    return groups, problems
