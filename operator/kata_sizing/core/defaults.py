"""Every default number kata-sizing uses, each with its source.

Sources (docs/sizing-model.md lists them with every default):
- [kd-values]  kata-deploy Helm chart values.yaml and its built-in podFixed table
               (kata-containers commit 7c6ba40c, tools/packaging/kata-deploy/helm-chart).
- [rs-make]    src/runtime-rs/Makefile: shipped runtime-rs overhead_vcpus/overhead_memory,
               default_memory 2048, default_vcpus 1.
- [go-make]    src/runtime/Makefile: shipped Go-runtime default_memory 2048, default_vcpus 1,
               sandbox_cgroup_only, static_sandbox_resource_mgmt.
- [survey]     the Contrast node-installer survey (Go runtime, CLH on AKS with SEV-SNP):
               guest daemons < 56-70 MiB, kernel-kept memory linear in VM size,
               host side constant at about 50 MiB; recommends default_memory 256Mi,
               podFixed 320Mi and sandbox_cgroup_only = true.
- [go-src]     src/runtime/virtcontainers/hypervisor.go (MinHypervisorMemory = 256) and
               src/runtime/pkg/katautils/config.go defaultMemSz(): the Go runtime silently
               replaces a default_memory below 256 MiB with its built-in 2048 MiB.
- [rs-ratio]   Kata derived the runtime-rs overhead_* defaults as about 80% of the Pod
               Overhead, so the host side is about 20% of podFixed.
- [kubevirt-9228] kubevirt/kubevirt pull request 9228: KubeVirt's virtiofsd container was
               OOM-killed at its 40M limit under intensive disk use; 71M the most it was seen to
               use; the limit raised to 80M.
- [kuasar-bench] kuasar-io/kuasar tests/benchmark/Benchmark.md: with Kata 2.5.2 and Cloud
               Hypervisor, each pod's containerd-shim-kata-v2 has a Pss of about 18 MB.
- [k8s-139627] kubernetes/kubernetes#139627: from v1.37.0 (k8s.io/component-helpers resource
               PodRequests) the scheduler and the kubelet's admission charge a running pod its
               overhead twice once the kubelet reports the pod-level status.allocatedResources
               (which already holds it), with InPlacePodLevelResourcesVerticalScaling on (beta,
               on by default since 1.36). Seen on the real node: docs/testing.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from fractions import Fraction


class Runtime(str, Enum):
    RUST = "Rust"
    GO = "Go"


class Family(str, Enum):
    STANDARD = "standard"
    TEE = "tee"
    IBM_SE = "ibm-se"
    NVIDIA_GPU = "nvidia-gpu"
    NVIDIA_CPU = "nvidia-cpu"


@dataclass(frozen=True)
class OverheadParameters:
    """unusable(V) = base + ratio x V MiB of a V MiB VM, plus constant guest CPU and host side."""

    guest_memory_base_mib: int
    guest_memory_ratio: Decimal
    guest_cpu: Decimal
    host_memory_mib: int
    host_cpu: Decimal
    margin: Decimal


@dataclass(frozen=True)
class OverheadDefaults(OverheadParameters):
    sources: str


# [survey]: the upper envelope of the survey table has slope 0.135 (the kernel keeps
# about 13.5% of the VM); 0.14 rounds it up. Its intercept at that slope is 94 MiB
# (the 306 MiB VM keeps 136 MiB), so 96 MiB as an even figure.
_SURVEY_RATIO = Decimal("0.14")
_SURVEY_BASE_MIB = 96
# [survey]: host side constant, about 50 MiB worst case.
_HOST_MEMORY_MIB = 50
# [rs-ratio]: 0.2 vCPU shipped overhead is ~80% of kata-deploy's 250m podFixed -> 50m host.
_HOST_CPU = Decimal("0.05")
# Project choice: 10% head-room on the guest budget.
DEFAULT_MARGIN = Decimal("0.10")
_MARGIN = DEFAULT_MARGIN

OVERHEAD_DEFAULTS: dict[Family, OverheadDefaults] = {
    Family.STANDARD: OverheadDefaults(
        _SURVEY_BASE_MIB, _SURVEY_RATIO, Decimal("0.2"), _HOST_MEMORY_MIB, _HOST_CPU, _MARGIN,
        "base/ratio/host: [survey]; guest CPU 0.2: [rs-make] qemu/clh/dragonball/openvmm",
    ),
    Family.TEE: OverheadDefaults(
        128, _SURVEY_RATIO, Decimal("0.4"), _HOST_MEMORY_MIB, _HOST_CPU, _MARGIN,
        "base 128 MiB and CPU 0.4: [rs-make] SNP/TDX; ratio/host: [survey] (SEV-SNP)",
    ),
    Family.IBM_SE: OverheadDefaults(
        768, _SURVEY_RATIO, Decimal("0.2"), _HOST_MEMORY_MIB, _HOST_CPU, _MARGIN,
        "base 768 MiB incl. 512 MiB swiotlb: [rs-make] IBM SE; ratio/host: [survey]",
    ),
    Family.NVIDIA_GPU: OverheadDefaults(
        512, _SURVEY_RATIO, Decimal("0.5"), _HOST_MEMORY_MIB, _HOST_CPU, _MARGIN,
        "base 512 MiB and CPU 0.5: [rs-make] NVIDIA GPU; ratio/host: [survey]",
    ),
    Family.NVIDIA_CPU: OverheadDefaults(
        128, _SURVEY_RATIO, Decimal("0.2"), _HOST_MEMORY_MIB, _HOST_CPU, _MARGIN,
        "base 128 MiB: [rs-make] NVIDIA CPU-only; ratio/host: [survey]",
    ),
}

# [survey]: default_memory 256Mi for pods without limits; default_vcpus 1: [rs-make]/[go-make].
FALLBACK_CPU = "1"
FALLBACK_MEMORY = "256Mi"

# [go-make]/[rs-make]: what an unconfigured shim boots with.
SHIPPED_DEFAULT_MEMORY_MIB = 2048
SHIPPED_DEFAULT_VCPUS = 1

# [go-src]: the smallest default_memory the Go runtime keeps; below it the VM gets 2048 MiB.
GO_MIN_DEFAULT_MEMORY_MIB = 256

# [survey]: sandbox_cgroup_only = true so the pod cgroup really holds shim and VMM.
SANDBOX_CGROUP_ONLY = True


@dataclass(frozen=True)
class ShimInfo:
    name: str
    runtime: Runtime
    hypervisor: str
    family: Family
    # [kd-values] built-in RuntimeClass overhead.podFixed for this shim.
    kata_deploy_pod_fixed_memory: str
    kata_deploy_pod_fixed_cpu: str
    # [rs-make] shipped overhead_* for runtime-rs shims; None for Go shims.
    shipped_overhead_vcpus: Decimal | None
    shipped_overhead_memory_mib: int | None
    # [go-make] static_sandbox_resource_mgmt / sandbox_cgroup_only as shipped.
    shipped_static_sizing: bool
    shipped_sandbox_cgroup_only: bool


def _rs(name, hypervisor, family, pf_mem, pf_cpu, ov_cpu, ov_mem) -> ShimInfo:
    # runtime-rs ships static_sandbox_resource_mgmt = true [rs-make].
    nvidia = family in (Family.NVIDIA_GPU, Family.NVIDIA_CPU)
    return ShimInfo(name, Runtime.RUST, hypervisor, family, pf_mem, pf_cpu,
                    Decimal(ov_cpu), ov_mem, True, nvidia)


def _go(name, hypervisor, family, pf_mem, pf_cpu) -> ShimInfo:
    # [go-make]: static sizing on for TEE and NVIDIA shims; sandbox_cgroup_only on for NVIDIA.
    static = family in (Family.TEE, Family.IBM_SE, Family.NVIDIA_GPU, Family.NVIDIA_CPU)
    nvidia = family in (Family.NVIDIA_GPU, Family.NVIDIA_CPU)
    return ShimInfo(name, Runtime.GO, hypervisor, family, pf_mem, pf_cpu, None, None,
                    static, nvidia)


SHIMS: dict[str, ShimInfo] = {s.name: s for s in (
    _go("clh", "clh", Family.STANDARD, "130Mi", "250m"),
    _go("clh-azure", "clh", Family.STANDARD, "130Mi", "250m"),
    _go("fc", "firecracker", Family.STANDARD, "130Mi", "250m"),
    _go("stratovirt", "stratovirt", Family.STANDARD, "130Mi", "250m"),
    _go("qemu", "qemu", Family.STANDARD, "320Mi", "250m"),
    _go("qemu-coco-dev", "qemu", Family.STANDARD, "160Mi", "250m"),
    _go("qemu-nvidia-cpu", "qemu", Family.NVIDIA_CPU, "320Mi", "250m"),
    _go("qemu-se", "qemu", Family.IBM_SE, "1024Mi", "1"),
    _go("qemu-snp", "qemu", Family.TEE, "2048Mi", "1"),
    _go("qemu-tdx", "qemu", Family.TEE, "2048Mi", "1"),
    _go("qemu-nvidia-gpu", "qemu", Family.NVIDIA_GPU, "10240Mi", "1"),
    _go("qemu-nvidia-gpu-snp", "qemu", Family.NVIDIA_GPU, "10240Mi", "1"),
    _go("qemu-nvidia-gpu-tdx", "qemu", Family.NVIDIA_GPU, "10240Mi", "1"),
    _rs("clh-runtime-rs", "clh", Family.STANDARD, "130Mi", "250m", "0.2", 32),
    _rs("clh-azure-runtime-rs", "clh", Family.STANDARD, "130Mi", "250m", "0.2", 32),
    _rs("dragonball", "dragonball", Family.STANDARD, "130Mi", "250m", "0.2", 32),
    _rs("openvmm-azure-runtime-rs", "openvmm", Family.STANDARD, "130Mi", "250m", "0.2", 32),
    _rs("qemu-runtime-rs", "qemu", Family.STANDARD, "320Mi", "250m", "0.2", 32),
    _rs("qemu-coco-dev-runtime-rs", "qemu", Family.STANDARD, "320Mi", "250m", "0.2", 32),
    _rs("qemu-nvidia-cpu-runtime-rs", "qemu", Family.NVIDIA_CPU, "320Mi", "250m", "0.2", 128),
    _rs("qemu-se-runtime-rs", "qemu", Family.IBM_SE, "1024Mi", "1", "0.2", 768),
    _rs("qemu-snp-runtime-rs", "qemu", Family.TEE, "2048Mi", "1", "0.4", 128),
    _rs("qemu-tdx-runtime-rs", "qemu", Family.TEE, "2048Mi", "1", "0.4", 128),
    _rs("qemu-nvidia-gpu-runtime-rs", "qemu", Family.NVIDIA_GPU, "10240Mi", "1", "0.5", 512),
    _rs("qemu-nvidia-gpu-snp-runtime-rs", "qemu", Family.NVIDIA_GPU, "10240Mi", "1", "0.5", 512),
    _rs("qemu-nvidia-gpu-tdx-runtime-rs", "qemu", Family.NVIDIA_GPU, "10240Mi", "1", "0.5", 512),
)}

# [kd-values]: peer pods run no local VM; kata-sizing has nothing to size there.
OUT_OF_SCOPE_SHIMS = {"remote": "remote (peer pods) runs no local VM and is out of scope"}

# In kata-deploy's podFixed table [kd-values] (so the audit knows its RuntimeClass) but not a shim of the
# chart at 7c6ba40c: a custom runtime's baseConfig could not name it.
NOT_CHART_SHIMS = {"stratovirt"}

HYPERVISORS = ("qemu", "clh", "dragonball", "firecracker", "stratovirt", "openvmm")

# [k8s-139627] Kubelet minor versions that make a running pod's podFixed count twice, and the
# kubelet feature gate whose "false" stops it (the kubelet then reports no pod-level allocated
# resources, and the scheduler and the kubelet fall back to the containers'). Through v1.37.2,
# the newest release when this was written; 1.36 reports the field but does not read it back.
OVERHEAD_COUNTED_TWICE_KUBELET_MINORS = frozenset({(1, 37)})
OVERHEAD_COUNTED_TWICE_GATE = "InPlacePodLevelResourcesVerticalScaling"

# Hypervisors whose guest RAM is not a file on /dev/shm (Cloud Hypervisor uses memfd;
# docs/sizing-model.md, Nodes). Firecracker and dragonball back guest RAM with anonymous memory.
SHM_BACKED_HYPERVISORS = ("qemu", "stratovirt")


@dataclass(frozen=True)
class ClassEnvelope:
    name: str
    cpu: str
    memory: str


# Project choice, not upstream: each step is 4x the memory of the one before (2x-4x CPU),
# so the guest budget of one class (which grows with its largest pod) is never more than
# a few times what its smallest pods would need.
DEFAULT_CLASSES = (
    ClassEnvelope("s", "1", "1Gi"),
    ClassEnvelope("m", "2", "4Gi"),
    ClassEnvelope("l", "4", "16Gi"),
    ClassEnvelope("xl", "16", "64Gi"),
)

# kata-deploy labels the nodes it installed on with this [kd-values].
KATA_NODE_LABEL = {"katacontainers.io/kata-runtime": "true"}

# A 256 GiB node example: 248 GiB allocatable (docs/sizing-model.md, Nodes).
NODE_SYSTEM_RESERVED = "4Gi"
NODE_KUBE_RESERVED = "2Gi"
NODE_EVICTION_HARD = "2Gi"

# The measurement of running pods (docs/measurement.md).
# [metrics-server]: it reads every kubelet once per --metric-resolution, 60 s by default, and
# advises against less than the kubelet's own resolution; the kubelet refreshes its cAdvisor
# figures every 10 s, stretched up to 15 s when nothing changes ([kubelet-cadvisor]:
# pkg/kubelet/cadvisor/cadvisor_linux.go, defaultHousekeepingInterval, maxHousekeepingInterval).
MEASUREMENT_INTERVAL_S = 60
KUBELET_MAX_REFRESH_S = 15
MEASUREMENT_MIN_INTERVAL_S = KUBELET_MAX_REFRESH_S
# [metrics-server]: --kubelet-request-timeout, 10 s by default.
KUBELET_REQUEST_TIMEOUT_S = 10
# Project choice: 60 readings of each node at the default interval; what changes shows within the hour.
MEASUREMENT_WINDOW_S = 3600
# Project choice: a VMM is close to an OOM kill once the pod cgroup has less left than a tenth of what
# podFixed holds beyond the guest budget (the host side's share, the part no VM fills even when fully
# resident; docs/measurement.md says why the line is not a share of the whole podFixed).
HEADROOM_WARNING = "10%"

# The guest memory ratio a fit or a policy may have: at ratio r a VM grows by 1/(1 - r) MiB per
# MiB of limit, so r near 1 means the budget diverges; 0.9 already means a 10x VM and is a
# broken measurement, not a guest (calibrate, sizing).
MAX_GUEST_MEMORY_RATIO = Fraction(9, 10)

# --- the parts of a pod's memory (calibrate: docs/sizing-model.md, "What each row saw") ---------------
# What calibrate adds for a part of the pod that a row did not see. None is lowered below these by a
# row that could not see the part; survey rows of live Kata pods measure all of them.
# [survey]: "guest daemons stay under 70 MiB even for large VMs" (free's `used` 26-47 MiB in its rows;
# 56 MiB its bound for containers under 2 GiB): the larger bound, for every VM size.
GUEST_USERLAND_MIB = 70
GUEST_USERLAND_SOURCE = "the Contrast survey: guest daemons stay under 70 MiB at every VM size"
# [kubevirt-9228]: 71M (MB) the most virtiofsd was seen to use under intensive disk use, rounded up to MiB
# and past it: a pod's virtiofsd under the same load, in the pod cgroup with sandbox_cgroup_only.
VIRTIOFSD_MIB = 72
VIRTIOFSD_SOURCE = "KubeVirt PR 9228: virtiofsd used up to 71M under intensive disk use (OOM-killed at 40M)"
# [kuasar-bench]: about 18 MB Pss per pod's shim; Pss shares the binary's pages among shims, and the first
# shim on a node is charged the pages it touches first: 20 MiB, the project's rounding up.
SHIM_MIB = 20
SHIM_SOURCE = "the Kuasar benchmark: about 18 MB Pss per Kata 2.5 shim (containerd-shim-kata-v2)"
# Project choice: a TCG row's host side holds QEMU's translation cache (its tb-size), which a KVM node
# has not. Without the cache measured apart, a row whose tb-size is at most this gives the VMM's share
# with the cache counted in (overstated by at most this much, the safe side); a larger one gives none.
TCG_CACHE_COUNTED_MAX_MIB = 8
# QEMU's tb-size is in MiB; no host QEMU runs on takes a translation cache above 4 GiB.
TCG_TB_SIZE_MAX_MIB = 4096
# Project choice: a host side larger than its own VM and than this is not a sandbox's (a cgroup other
# than the pod's, a figure in another unit): five times the [survey]'s worst case of 50 MiB, so no small
# VM's ordinary host side is refused.
HOST_SIDE_FLOOR_MIB = 256
