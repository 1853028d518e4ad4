"""Rendered objects: parse back, pass real Kubernetes schemas, and say what kata-deploy reads."""

from __future__ import annotations

import functools
import tomllib
from decimal import Decimal
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from kata_sizing.core import defaults, podfit
from kata_sizing.core.guidance import NodeFacts
from kata_sizing.core.model import PolicyError, parse_policy
from kata_sizing.core.quantity import MIB
from kata_sizing.core.render import render_policy
from tests.support.paths import FIXTURES, ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CHART = yaml.safe_load((FIXTURES / "kata-deploy-chart-facts.yaml").read_text())
SCHEMA_VERSIONS = ("1.25", ".".join(kubernetes_validate.latest_version().split(".")[:2]))
GIB = 1024 * MIB
UID = "0b7d6a51-3c1f-4e8e-a3a5-2f1d9c0e7b11"

RUST_DROP_IN = {
    "hypervisor": {"default_vcpus", "default_memory", "default_maxmemory", "overhead_vcpus",
                   "overhead_memory", "enable_hugepages"},
    "runtime": {"sandbox_cgroup_only", "static_sandbox_resource_mgmt"},
}
GO_DROP_IN = {
    "hypervisor": {"default_vcpus", "default_memory", "enable_hugepages"},
    "runtime": {"sandbox_cgroup_only"},
}


def _policy(spec: dict, name: str = "p", uid: str | None = None):
    metadata = {"name": name, **({"uid": uid} if uid else {})}
    return parse_policy({"metadata": metadata, "spec": spec})


def _example(path: Path):
    return parse_policy(yaml.safe_load(path.read_text()))


def _node(capacity: str = "256Gi", cpu: str | None = "64", **extra) -> NodeFacts:
    from kata_sizing.core.quantity import cpu_cores, memory_bytes

    return NodeFacts(
        name="node-a", capacity_memory_bytes=memory_bytes(capacity),
        capacity_cpu=cpu_cores(cpu) if cpu else None, **extra,
    )


POLICIES = {
    **{path.stem: functools.partial(_example, path) for path in EXAMPLES},
    "default-rust": lambda: _policy({"shim": "qemu-runtime-rs"}, name="default-rust", uid=UID),
    "default-go": lambda: _policy({"shim": "qemu"}, name="default-go"),
    "tee-rust-hugepages": lambda: _policy(
        {"shim": "qemu-snp-runtime-rs", "hugepages": True, "sandboxCgroupOnly": False}, name="snp"),
    "dragonball": lambda: _policy(
        {"shim": "dragonball", "runtimeClass": {"tolerations": [
            {"key": "kata", "operator": "Equal", "value": "yes", "effect": "NoSchedule"},
            {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]}},
        name="db"),
}


@pytest.fixture(params=sorted(POLICIES), scope="module")
def rendered(request):
    return render_policy(POLICIES[request.param](), nodes=[_node()])


def _chart_handler(runtime_class_text: str) -> str:
    """The handler as kata-deploy's custom-runtimes.yaml takes it: the last line that starts
    with `handler:` after trimming, minus that prefix, trimmed. No YAML parsing."""
    handler = ""
    for line in runtime_class_text.split("\n"):
        line = line.strip()
        if line.startswith("handler:"):
            handler = line[len("handler:"):].strip()
    return handler


# --- everything parses back and passes the real schemas ----------------------------------


def test_every_object_passes_kubernetes_schemas_strictly(rendered):
    objects = rendered.configmaps + rendered.runtime_classes
    assert {o["kind"] for o in objects} == {"ConfigMap", "RuntimeClass"}
    for obj in objects:
        for version in SCHEMA_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    # admissionregistration.k8s.io/v1 has ValidatingAdmissionPolicy from 1.30 and
    # MutatingAdmissionPolicy from 1.36 (docs/admission.md): checked against the newest schemas.
    assert {o["kind"] for o in rendered.admission} == {
        "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicyBinding"}
    assert {o["kind"] for o in rendered.shared} == {"ValidatingAdmissionPolicy", "MutatingAdmissionPolicy",
                                                    "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicyBinding"}
    for obj in rendered.admission + rendered.shared:
        kubernetes_validate.validate(obj, SCHEMA_VERSIONS[-1], strict=True)
        if obj["kind"].startswith("Validating"):
            kubernetes_validate.validate(obj, "1.30", strict=True)


def test_every_embedded_document_parses(rendered):
    for configmap in rendered.configmaps:
        for key, text in configmap["data"].items():
            assert isinstance(text, str)
            if key.endswith(".toml"):
                assert isinstance(tomllib.loads(text), dict)
            elif key.endswith(".yaml"):
                assert isinstance(yaml.safe_load(text), dict)
            elif configmap is rendered.configmaps[1]:
                assert key in podfit.params_data(rendered.sizing)  # the admission parameters
            else:
                assert key == "summary.txt"
    values = yaml.safe_load(rendered.values_yaml)
    for runtime in values["customRuntimes"]["runtimes"].values():
        tomllib.loads(runtime["dropIn"])
        kubernetes_validate.validate(yaml.safe_load(runtime["runtimeClass"]), SCHEMA_VERSIONS[-1], strict=True)


def test_configmap_names_namespace_and_labels(rendered):
    policy = rendered.sizing.policy
    assert [c["metadata"]["name"] for c in rendered.configmaps] == [
        f"{policy.name}-kata-deploy-values", f"{policy.name}-dropins", f"{policy.name}-node-guidance"]
    ours = {"app.kubernetes.io/managed-by": "kata-sizing", "katasizing.dev/policy": policy.name}
    for configmap in rendered.configmaps:
        assert configmap["metadata"]["namespace"] == policy.spec.output.namespace
    # Flux's helm-controller reacts at once to a change of a valuesFrom ConfigMap with this label.
    assert rendered.configmaps[0]["metadata"]["labels"] == {**ours, "reconcile.fluxcd.io/watch": "Enabled"}
    for configmap in rendered.configmaps[1:]:
        assert configmap["metadata"]["labels"] == ours
    assert rendered.configmaps[0]["data"] == {"values.yaml": rendered.values_yaml}
    # The drop-ins, and the admission parameters the bindings name (no key of one has a dot).
    params = podfit.params_data(rendered.sizing)
    assert rendered.configmaps[1]["data"] == {**rendered.drop_ins, **params}
    assert not set(params) & set(rendered.drop_ins)
    for binding in rendered.admission:
        assert binding["spec"]["paramRef"]["name"] == f"{policy.name}-dropins"
        assert binding["spec"]["paramRef"]["namespace"] == policy.spec.output.namespace


# --- RuntimeClasses -----------------------------------------------------------------------


def test_runtime_classes_carry_pod_fixed_names_labels_and_scheduling(rendered):
    policy = rendered.sizing.policy
    spec = policy.spec.runtime_class
    assert len(rendered.runtime_classes) == len(rendered.sizing.classes)
    for obj, sized in zip(rendered.runtime_classes, rendered.sizing.classes):
        name = f"{policy.runtime_class_prefix}-{sized.name}"
        assert obj["apiVersion"] == "node.k8s.io/v1"
        assert obj["metadata"]["name"] == name
        assert obj["handler"] == name
        assert obj["metadata"]["labels"] == {
            "app.kubernetes.io/managed-by": "kata-sizing",
            "katasizing.dev/policy": policy.name,
            "katasizing.dev/class": sized.name,
        }
        assert obj["overhead"] == {"podFixed": sized.pod_fixed}
        assert obj["scheduling"]["nodeSelector"] == spec.node_selector
        expected_tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
        assert obj["scheduling"].get("tolerations", []) == expected_tolerations


def test_tolerations_are_rendered_in_kubernetes_shape():
    rendered = render_policy(POLICIES["dragonball"]())
    assert rendered.runtime_classes[0]["scheduling"]["tolerations"] == [
        {"key": "kata", "operator": "Equal", "value": "yes", "effect": "NoSchedule"},
        {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
    ]


def test_owner_references_only_when_the_policy_has_a_uid():
    owned = render_policy(_policy({"shim": "qemu-runtime-rs"}, name="qemu-rs", uid=UID))
    expected = [{
        "apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy", "name": "qemu-rs",
        "uid": UID, "controller": True, "blockOwnerDeletion": True,
    }]
    for obj in owned.runtime_classes + owned.configmaps:
        assert obj["metadata"]["ownerReferences"] == expected
    unowned = render_policy(_policy({"shim": "qemu-runtime-rs"}, name="qemu-rs"))
    for obj in unowned.runtime_classes + unowned.configmaps:
        assert "ownerReferences" not in obj["metadata"]


def test_managed_by_kata_deploy_leaves_runtime_classes_to_the_chart():
    operator = render_policy(_policy({"shim": "qemu-runtime-rs"}))
    chart = render_policy(_policy({"shim": "qemu-runtime-rs", "runtimeClass": {"managedBy": "KataDeploy"}}))
    admission = ["ValidatingAdmissionPolicyBinding"] * 2 + ["MutatingAdmissionPolicyBinding"]
    # At most 9 objects per policy (10 with node guidance): 4 classes, the values and drop-ins
    # ConfigMaps (the latter with the admission parameters), a binding per shared policy.
    assert [o["kind"] for o in operator.objects()] == ["ConfigMap"] * 2 + ["RuntimeClass"] * 4 + admission
    # The admission bindings hold pods to their class whoever creates the RuntimeClasses.
    assert [o["kind"] for o in chart.objects()] == ["ConfigMap"] * 2 + admission
    # The chart still gets every RuntimeClass, through the values overlay.
    assert len(yaml.safe_load(chart.values_yaml)["customRuntimes"]["runtimes"]) == 4


# --- drop-ins -----------------------------------------------------------------------------


def test_drop_in_keys_are_exactly_the_documented_ones_for_the_runtime(rendered):
    sizing = rendered.sizing
    expected = RUST_DROP_IN if sizing.runtime.value == "Rust" else GO_DROP_IN
    assert set(rendered.drop_ins) == {f"{c.name}.toml" for c in sizing.classes}
    for sized in sizing.classes:
        toml = tomllib.loads(rendered.drop_ins[f"{sized.name}.toml"])
        assert set(toml) == {"hypervisor", "runtime"}
        assert set(toml["hypervisor"]) == {sizing.hypervisor}
        assert set(toml["hypervisor"][sizing.hypervisor]) == expected["hypervisor"]
        assert set(toml["runtime"]) == expected["runtime"]


def test_drop_in_values_are_the_computed_ones(rendered):
    sizing = rendered.sizing
    spec = sizing.policy.spec
    for sized in sizing.classes:
        toml = tomllib.loads(rendered.drop_ins[f"{sized.name}.toml"])
        hypervisor = toml["hypervisor"][sizing.hypervisor]
        assert hypervisor["default_vcpus"] == sized.default_vcpus
        assert hypervisor["default_memory"] == sized.default_memory_mib
        assert hypervisor["enable_hugepages"] is spec.hugepages
        assert toml["runtime"]["sandbox_cgroup_only"] is spec.sandbox_cgroup_only
        if sizing.runtime.value == "Rust":
            assert hypervisor["default_maxmemory"] == sized.default_maxmemory_mib
            # TOML floats: 0.2 must stay 0.2, not 0.2000000001 or "0.2".
            assert Decimal(repr(hypervisor["overhead_vcpus"])) == sized.overhead_vcpus
            assert hypervisor["overhead_memory"] == sized.overhead_memory_mib
            assert toml["runtime"]["static_sandbox_resource_mgmt"] is True


def test_drop_in_for_default_rust_class_s_reads_as_expected():
    rendered = render_policy(_policy({"shim": "qemu-runtime-rs"}, name="qemu-rs"))
    assert tomllib.loads(rendered.drop_ins["s.toml"]) == {
        "hypervisor": {"qemu": {
            "default_vcpus": 1, "default_memory": 256, "default_maxmemory": 1332,
            "overhead_vcpus": 0.2, "overhead_memory": 308, "enable_hugepages": False,
        }},
        "runtime": {"sandbox_cgroup_only": True, "static_sandbox_resource_mgmt": True},
    }


# --- the kata-deploy values overlay -------------------------------------------------------


def _documented_custom_runtime_paths() -> set[str]:
    return set(CHART["customRuntimeKeys"])


def _dotted_paths(mapping: dict, prefix: str = "") -> set[str]:
    paths = set()
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            paths |= _dotted_paths(value, path + ".")
        else:
            paths.add(path)
    return paths


def test_values_overlay_sets_only_keys_the_chart_has(rendered):
    values = yaml.safe_load(rendered.values_yaml)
    assert set(values) <= set(CHART["topLevelKeys"])
    assert set(values) == {"customRuntimes"}
    assert set(values["customRuntimes"]) <= set(CHART["customRuntimesKeys"])
    assert values["customRuntimes"]["enabled"] is True
    for runtime in values["customRuntimes"]["runtimes"].values():
        assert _dotted_paths(runtime) <= _documented_custom_runtime_paths()
        required = {k for k, fact in CHART["customRuntimeKeys"].items() if fact["required"]}
        assert required <= set(runtime)


def test_values_overlay_runtimes_match_the_rendered_objects(rendered):
    policy = rendered.sizing.policy
    runtimes = yaml.safe_load(rendered.values_yaml)["customRuntimes"]["runtimes"]
    assert list(runtimes) == [obj["metadata"]["name"] for obj in rendered.runtime_classes]
    for obj, sized in zip(rendered.runtime_classes, rendered.sizing.classes):
        runtime = runtimes[obj["metadata"]["name"]]
        assert runtime["baseConfig"] == policy.spec.shim
        assert runtime["inheritBaseOverhead"] is False
        assert runtime["dropIn"] == rendered.drop_ins[f"{sized.name}.toml"]
        from_string = yaml.safe_load(runtime["runtimeClass"])
        expected = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "ownerReferences"}}
        assert from_string == expected
        # The chart creates the object itself: an ownerReference would point Helm's object at us.
        assert "ownerReferences" not in from_string["metadata"]


def test_chart_reads_the_handler_line_as_the_runtime_class_name(rendered):
    runtimes = yaml.safe_load(rendered.values_yaml)["customRuntimes"]["runtimes"]
    for name, runtime in runtimes.items():
        assert _chart_handler(runtime["runtimeClass"]) == name
        assert f"\nhandler: {name}\n" in runtime["runtimeClass"]


def _chart_shim_params():
    params = []
    for shim in sorted(set(defaults.SHIMS) - defaults.NOT_CHART_SHIMS):
        params.append(pytest.param(shim))
    return params


def test_shims_outside_the_chart_are_refused_as_policy_shims():
    assert defaults.NOT_CHART_SHIMS.isdisjoint(CHART["shims"])
    with pytest.raises(PolicyError, match="not a shim of the kata-deploy chart"):
        _policy({"shim": "stratovirt"})


@pytest.mark.parametrize("shim", _chart_shim_params())
def test_base_config_of_every_supported_shim_is_a_chart_shim(shim):
    rendered = render_policy(_policy({"shim": shim, "classes": [{"name": "s", "cpu": "1", "memory": "1Gi"}]}))
    (runtime,) = yaml.safe_load(rendered.values_yaml)["customRuntimes"]["runtimes"].values()
    assert runtime["baseConfig"] == shim
    assert runtime["baseConfig"] in CHART["shims"]


def test_out_of_scope_shims_are_chart_shims():
    assert set(defaults.OUT_OF_SCOPE_SHIMS) <= set(CHART["shims"])


# --- node guidance --------------------------------------------------------------------------


def _guidance(policy, node: NodeFacts):
    rendered = render_policy(policy, nodes=[node])
    (group,) = rendered.guidance
    configmap = rendered.configmaps[2]
    document = yaml.safe_load(configmap["data"][f"{group.key}.yaml"])
    return rendered, group, document, configmap["data"]["summary.txt"]


def test_node_guidance_for_a_256gi_node_with_domains_reservations():
    policy = _policy({"shim": "qemu-runtime-rs", "nodes": {
        "systemReserved": "4Gi", "kubeReserved": "2Gi", "evictionHard": "2Gi"}}, name="qemu-rs")
    rendered, group, document, summary = _guidance(policy, _node("256Gi", "64"))
    assert rendered.problems == []
    assert document["allocatable"] == {"memory": "248Gi"}
    assert document["kubeletConfiguration"] == {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "systemReserved": {"memory": "4Gi"},
        "kubeReserved": {"memory": "2Gi"},
        "evictionHard": {"memory.available": "2Gi"},
        "enforceNodeAllocatable": ["pods"],
    }
    assert document["devShm"] == {
        "applies": True,
        "size": "248Gi",
        "fstab": "none /dev/shm tmpfs defaults,nosuid,nodev,size=248g 0 0",
        "remount": "mount -o remount,size=248g /dev/shm",
    }
    # Largest pod of class s: 1Gi limit + 358Mi podFixed accounted, a VM of 1024 + 308 MiB;
    # 248Gi = 253952 MiB; 64 CPUs / (1 + 0.25).
    s = document["vmsPerClass"]["s"]
    assert s == {"largestPodAccounted": "1382Mi", "largestVmMemory": "1332Mi",
                 "byAllocatable": 253952 // 1382, "byCpu": 51, "byDevShm": 253952 // 1332, "fit": 51}
    assert {name: fit["fit"] for name, fit in document["vmsPerClass"].items()} == {
        "s": 51, "m": 28, "l": 13, "xl": 3}
    assert "none /dev/shm tmpfs defaults,nosuid,nodev,size=248g 0 0" in summary
    assert "VMs that fit: s=51 m=28 l=13 xl=3" in summary


def test_infra_pod_memory_shrinks_dev_shm():
    policy = _policy({"shim": "qemu-runtime-rs", "nodes": {"infraPodMemory": "1536Mi"}})
    _, group, document, _ = _guidance(policy, _node("256Gi", None))
    assert document["devShm"]["size"] == "252416Mi"  # 248Gi - 1.5Gi = 246.5Gi
    assert document["devShm"]["fstab"] == "none /dev/shm tmpfs defaults,nosuid,nodev,size=252416m 0 0"
    assert document["infraPodMemory"] == "1536Mi"
    assert "byCpu" not in document["vmsPerClass"]["s"]
    assert not any("infraPodMemory is auto" in w for w in document["warnings"])


def test_the_infra_pods_cpu_requests_come_off_the_cpu_a_class_fits_in():
    """The scheduler counts every pod's CPU request against allocatable: on a 2-CPU node whose
    infra pods request 100m, a class of 250m + podFixed 250m fits 3 times, not 4 (the real
    node of tests/node/test_node_operator.py admitted 3)."""
    from decimal import Decimal

    policy = _policy({"shim": "qemu-runtime-rs", "classes": [{"name": "m", "cpu": "250m", "memory": "1Gi"}]})
    node = _node("24Gi", "2", allocatable_cpu=Decimal(2), infra_pod_memory_bytes=320 * MIB)
    assert _guidance(policy, node)[2]["vmsPerClass"]["m"]["byCpu"] == 4
    crowded = _node("24Gi", "2", allocatable_cpu=Decimal(2), infra_pod_memory_bytes=320 * MIB,
                    infra_pod_cpu=Decimal("0.1"))
    assert _guidance(policy, crowded)[2]["vmsPerClass"]["m"]["byCpu"] == 3
    # Infra pods asking for more CPU than the node has leave no room, not a negative count.
    full = _node("24Gi", "2", allocatable_cpu=Decimal(2), infra_pod_cpu=Decimal(3))
    assert _guidance(policy, full)[2]["vmsPerClass"]["m"] == {
        **_guidance(policy, full)[2]["vmsPerClass"]["m"], "byCpu": 0, "fit": 0}


@pytest.mark.parametrize(("kubelet_version", "gates"), [
    ("v1.37.2", {"InPlacePodLevelResourcesVerticalScaling": False}),
    ("v1.37.0-eks-4f1b2c", {"InPlacePodLevelResourcesVerticalScaling": False}),
    ("v1.36.4", None),  # reports the pod-level field but does not read it back
    ("v1.38.0", None),
    (None, None),
])
def test_a_kubelet_that_charges_pod_fixed_twice_gets_the_feature_gate_that_stops_it(kubelet_version, gates):
    """kubernetes/kubernetes#139627: from v1.37 the scheduler and the kubelet charge a running
    pod its overhead twice while InPlacePodLevelResourcesVerticalScaling is on (the real node of
    tests/node/test_node_operator.py admitted 3 pods of a class where 5 fit); the guidance's kubelet
    configuration turns the gate off for such kubelets, and says why."""
    node = _node("256Gi", "64", kubelet_version=kubelet_version)
    _, group, document, summary = _guidance(_policy({"shim": "qemu-runtime-rs"}), node)
    assert document["kubeletConfiguration"].get("featureGates") == gates
    if gates:
        (reason,) = document["featureGateReasons"]
        assert reason.startswith(f"kubelet {kubelet_version} charges a running pod its podFixed twice")
        assert "kubernetes/kubernetes#139627" in reason and f"kubelet featureGates: {reason}" in summary
    else:
        assert "featureGateReasons" not in document and "featureGates" not in summary


def test_nodes_whose_kubelets_need_other_gates_are_guided_apart():
    from kata_sizing.core.guidance import node_guidance
    from kata_sizing.core.sizing import size_policy

    policy = _policy({"shim": "qemu-runtime-rs"})
    nodes = [NodeFacts("old", 256 * GIB, kubelet_version="v1.36.4"), NodeFacts("new", 256 * GIB, kubelet_version="v1.37.2"),
             NodeFacts("newer", 256 * GIB, kubelet_version="v1.37.1")]
    groups, _ = node_guidance(size_policy(policy), nodes)
    assert sorted((g.nodes, g.kubelet_feature_gates) for g in groups) == [
        (["new", "newer"], (("InPlacePodLevelResourcesVerticalScaling", False),)), (["old"], ())]


def test_auto_infra_pod_memory_offline_says_so():
    _, _, document, _ = _guidance(_policy({"shim": "qemu-runtime-rs"}), _node())
    assert any(w.startswith("infraPodMemory is auto but the infra pods' requests are unknown")
               for w in document["warnings"])


def test_observed_allocatable_mismatch_is_warned():
    node = _node(allocatable_memory_bytes=250 * GIB)
    _, _, document, _ = _guidance(_policy({"shim": "qemu-runtime-rs"}), node)
    assert document["allocatable"] == {"memory": "248Gi", "observedMemory": "250Gi"}
    assert any("the kubelet reports allocatable 250Gi but the policy's reservations give 248Gi" in w
               for w in document["warnings"])


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"shim": "clh"}, "Cloud Hypervisor backs guest RAM with memfd, not a file on /dev/shm"),
        ({"shim": "clh-runtime-rs"}, "Cloud Hypervisor backs guest RAM with memfd"),
        ({"shim": "qemu-runtime-rs", "hugepages": True},
         "enable_hugepages = true: guest RAM comes from /dev/hugepages, not /dev/shm"),
        ({"shim": "dragonball"}, "dragonball does not back guest RAM with a file on /dev/shm"),
    ],
)
def test_dev_shm_not_applicable(spec, reason):
    _, group, document, summary = _guidance(_policy(spec), _node())
    assert document["devShm"]["applies"] is False
    assert document["devShm"]["reason"].startswith(reason)
    assert "fstab" not in document["devShm"] and "size" not in document["devShm"]
    assert all("byDevShm" not in fit for fit in document["vmsPerClass"].values())
    assert "/dev/shm: not the limit here: " + document["devShm"]["reason"] in summary
    assert "mount -o remount" not in summary


def test_reservations_not_below_capacity_are_an_error():
    policy = _policy({"shim": "qemu-runtime-rs", "nodes": {
        "systemReserved": "4Gi", "kubeReserved": "2Gi", "evictionHard": "2Gi"}})
    rendered = render_policy(policy, nodes=[_node("8Gi")])
    assert rendered.guidance == []
    assert [(p.severity, str(p)) for p in rendered.problems] == [(
        "error",
        "spec.nodes: systemReserved 4Gi + kubeReserved 2Gi + evictionHard 2Gi = 8Gi is not "
        "smaller than node capacity 8Gi (node-a)",
    )]


def test_a_class_that_does_not_fit_the_node_is_warned():
    _, _, document, _ = _guidance(_policy({"shim": "qemu-runtime-rs"}), _node("64Gi"))
    assert document["vmsPerClass"]["xl"]["fit"] == 0
    assert any(w.startswith("no VM of class xl fits") for w in document["warnings"])


def test_identical_nodes_form_one_group():
    nodes = [NodeFacts(name=n, capacity_memory_bytes=256 * GIB) for n in ("b", "a")]
    nodes.append(NodeFacts(name="c", capacity_memory_bytes=128 * GIB))
    rendered = render_policy(_policy({"shim": "qemu-runtime-rs"}), nodes=nodes)
    assert [(g.key, g.nodes) for g in rendered.guidance] == [
        ("capacity-256gi", ["a", "b"]), ("capacity-128gi", ["c"])]
    assert set(rendered.configmaps[2]["data"]) == {"capacity-256gi.yaml", "capacity-128gi.yaml", "summary.txt"}
