"""A policy of three classes and a table of pods with what podfit's rule says of each: the Python
rule (tests/unit/test_podfit.py) and the API server's CEL (tests/api/test_real_admission.py) judge
the same pods."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kata_sizing.core import podfit

GI = 1024**3
MI = 1024**2

# Two classes with different CPU and memory steps, and a namespace scope.
POLICY: dict[str, Any] = {
    "apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy",
    "metadata": {"name": "fit"},
    "spec": {
        "shim": "qemu-runtime-rs",
        "classes": [{"name": "s", "cpu": "1", "memory": "1Gi"},
                    {"name": "m", "cpu": "2", "memory": "4Gi"},
                    {"name": "l", "cpu": "4", "memory": "16Gi"}],
        "admission": {"namespaces": {"names": ["fit-in", "fit-routed"]}},
    },
}
IN, OUT, ROUTED = "fit-in", "fit-out", "fit-routed"
# The install's shared admission objects, in the order they are rendered: the three policies every
# policy's bindings name, then a keep-alive binding of each (docs/admission.md#the-parameters-stay-followed).
SHARED_OBJECTS = [
    ("ValidatingAdmissionPolicy", "kata-sizing-memory-limit-v1"),
    ("ValidatingAdmissionPolicy", "kata-sizing-envelope-v1"),
    ("MutatingAdmissionPolicy", "kata-sizing-route-v1"),
    ("ValidatingAdmissionPolicyBinding", "kata-sizing-memory-limit-v1-keep-alive"),
    ("ValidatingAdmissionPolicyBinding", "kata-sizing-envelope-v1-keep-alive"),
    ("MutatingAdmissionPolicyBinding", "kata-sizing-route-v1-keep-alive"),
]


def limits(cpu: str | None = None, memory: str | None = None) -> dict:
    values = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"resources": {"limits": values}} if values else {}


@dataclass(frozen=True)
class Case:
    """One pod of the table and what the rule says about it."""

    name: str
    containers: tuple[dict, ...]
    expect_cpu: int | None
    expect_memory: int | None
    rules: frozenset[str] = frozenset()
    runtime_class: str | None = "kata-fit-s"
    init_containers: tuple[dict, ...] = ()
    pod_limits: dict | None = None
    namespace: str = IN
    labels: dict = field(default_factory=dict)
    smallest_fit: str | None = "kata-fit-s"

    def pod(self) -> dict:
        spec: dict = {"containers": [{"name": f"c{i}", "image": "registry.k8s.io/pause:3.10", **c}
                                     for i, c in enumerate(self.containers)]}
        if self.init_containers:
            spec["initContainers"] = [{"name": f"i{i}", "image": "registry.k8s.io/pause:3.10", **c}
                                      for i, c in enumerate(self.init_containers)]
        if self.pod_limits is not None:
            spec["resources"] = {"limits": self.pod_limits}
        if self.runtime_class:
            spec["runtimeClassName"] = self.runtime_class
        metadata = {"name": self.name, "namespace": self.namespace, **({"labels": self.labels} if self.labels else {})}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


MISSING, EXCEEDED, NOT_ROUTED = podfit.RULE_MEMORY_LIMIT_MISSING, podfit.RULE_ENVELOPE_EXCEEDED, podfit.RULE_NOT_ROUTED
SIDECAR = {"restartPolicy": "Always"}

CASES = [
    Case("at-envelope", (limits("1", "1Gi"),), 1000, GI),
    Case("one-byte-above", (limits("1", str(GI + 1)),), 1000, GI + 1, frozenset({EXCEEDED}), smallest_fit="kata-fit-m"),
    Case("one-millicore-above", (limits("1001m", "1Gi"),), 1001, GI, frozenset({EXCEEDED}), smallest_fit="kata-fit-m"),
    Case("sub-millicore-above", (limits("1000500u", "1Gi"),), 1001, GI, frozenset({EXCEEDED}),
         smallest_fit="kata-fit-m"),
    Case("fractional-cores", (limits("0.5", "512Mi"),), 500, 512 * MI),
    Case("no-limits", ({},), None, None, frozenset({MISSING})),
    Case("cpu-only", (limits("500m"),), 500, None, frozenset({MISSING})),
    Case("memory-only", (limits(memory="1Gi"),), None, GI),
    Case("zero-memory-limit", (limits("1", "0"),), 1000, 0, frozenset({MISSING})),
    Case("two-containers-at-envelope", (limits("500m", "512Mi"), limits("500m", "512Mi")), 1000, GI),
    Case("two-containers-above", (limits("500m", "512Mi"), limits("500m", "513Mi")), 1000, GI + MI,
         frozenset({EXCEEDED}), smallest_fit="kata-fit-m"),
    Case("second-container-without-memory", (limits("500m", "3Gi"), limits("100m")), 600, 3 * GI,
         frozenset({MISSING, EXCEEDED}), smallest_fit="kata-fit-m"),
    Case("init-container-is-the-peak", (limits("500m", "512Mi"),), 1500, 2 * GI, frozenset({EXCEEDED}),
         init_containers=(limits("1500m", "2Gi"),), smallest_fit="kata-fit-m"),
    Case("init-container-below-the-containers", (limits("1", "1Gi"),), 1000, GI,
         init_containers=(limits("1", "1Gi"),)),
    Case("init-container-without-memory", (limits("1", "1Gi"),), 1000, GI, frozenset({MISSING}),
         init_containers=(limits("100m"),)),
    Case("sidecar-adds-up-to-the-envelope", (limits("750m", "768Mi"),), 1000, GI,
         init_containers=({**SIDECAR, **limits("250m", "256Mi")},)),
    Case("sidecar-one-mebibyte-over", (limits("750m", "768Mi"),), 1000, GI + MI, frozenset({EXCEEDED}),
         init_containers=({**SIDECAR, **limits("250m", "257Mi")},), smallest_fit="kata-fit-m"),
    Case("init-after-a-sidecar-counts-it", (limits("100m", "100Mi"),), 1100, 1112 * MI, frozenset({EXCEEDED}),
         init_containers=({**SIDECAR, **limits("500m", "512Mi")}, limits("600m", "600Mi")),
         smallest_fit="kata-fit-m"),
    Case("init-before-a-sidecar-does-not", (limits("100m", "100Mi"),), 600, 612 * MI,
         init_containers=(limits("600m", "600Mi"), {**SIDECAR, **limits("500m", "512Mi")})),
    Case("pod-level-limits-at-envelope", ({},), 1000, GI, pod_limits={"cpu": "1", "memory": "1Gi"}),
    Case("pod-level-memory-above", (limits("500m", "512Mi"),), 500, 2 * GI, frozenset({EXCEEDED}),
         pod_limits={"memory": "2Gi"}, smallest_fit="kata-fit-m"),
    Case("class-m-at-its-envelope", (limits("2", "4Gi"),), 2000, 4 * GI, runtime_class="kata-fit-m",
         smallest_fit="kata-fit-m"),
    Case("cpu-needs-l-memory-fits-s", (limits("3", "1Gi"),), 3000, GI, frozenset({EXCEEDED}),
         runtime_class="kata-fit-m", smallest_fit="kata-fit-l"),
    Case("fits-no-class", (limits("5", "1Gi"),), 5000, GI, frozenset({EXCEEDED}), runtime_class="kata-fit-l",
         smallest_fit=None),
    Case("larger-class-than-needed", (limits("1", "1Gi"),), 1000, GI, runtime_class="kata-fit-l"),
    Case("no-runtime-class", (limits("8", "32Gi"),), 8000, 32 * GI, runtime_class=None, smallest_fit=None),
    Case("out-of-scope-namespace", (limits("8", "32Gi"),), 8000, 32 * GI, namespace=OUT, smallest_fit=None),
    Case("out-of-scope-without-limits", ({},), None, None, namespace=OUT),
]
CASE_IDS = [c.name for c in CASES]
