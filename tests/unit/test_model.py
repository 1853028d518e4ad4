"""The KataSizingPolicy model: per-shim defaults and one line per problem, with its path."""

from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError

from kata_sizing.core import defaults
from kata_sizing.core.defaults import Runtime
from kata_sizing.core.model import PolicyError, parse_policy


def _doc(spec: dict, name: str = "p", **metadata) -> dict:
    return {
        "apiVersion": "katasizing.dev/v1alpha1",
        "kind": "KataSizingPolicy",
        "metadata": {"name": name, **metadata},
        "spec": spec,
    }


def _problems(document: object) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(document)
    assert str(info.value) == "; ".join(info.value.problems)
    return info.value.problems


@pytest.mark.parametrize(
    ("shim", "runtime", "hypervisor"),
    [
        ("qemu-runtime-rs", Runtime.RUST, "qemu"),
        ("clh-runtime-rs", Runtime.RUST, "clh"),
        ("dragonball", Runtime.RUST, "dragonball"),
        ("openvmm-azure-runtime-rs", Runtime.RUST, "openvmm"),
        ("qemu-snp-runtime-rs", Runtime.RUST, "qemu"),
        ("qemu-nvidia-gpu-tdx-runtime-rs", Runtime.RUST, "qemu"),
        ("qemu", Runtime.GO, "qemu"),
        ("clh", Runtime.GO, "clh"),
        ("fc", Runtime.GO, "firecracker"),
        ("qemu-snp", Runtime.GO, "qemu"),
        ("qemu-se", Runtime.GO, "qemu"),
        ("qemu-coco-dev", Runtime.GO, "qemu"),
        ("qemu-nvidia-gpu", Runtime.GO, "qemu"),
    ],
)
def test_runtime_and_hypervisor_default_from_the_shim(shim, runtime, hypervisor):
    spec = parse_policy(_doc({"shim": shim})).spec
    assert spec.effective_runtime is runtime
    assert spec.effective_hypervisor == hypervisor


def test_every_known_shim_follows_domain_naming_rule():
    # docs/sizing-model.md: -runtime-rs, dragonball and openvmm-azure-runtime-rs are Rust.
    for name, info in defaults.SHIMS.items():
        rust = name.endswith("-runtime-rs") or name == "dragonball"
        assert info.runtime is (Runtime.RUST if rust else Runtime.GO), name


def test_explicit_runtime_and_hypervisor_override_the_shim():
    spec = parse_policy(_doc({"shim": "qemu", "runtime": "Rust", "hypervisor": "stratovirt"})).spec
    assert spec.effective_runtime is Runtime.RUST
    assert spec.effective_hypervisor == "stratovirt"


def test_default_classes_are_s_m_l_xl_with_documented_envelopes():
    spec = parse_policy(_doc({"shim": "qemu-runtime-rs"})).spec
    assert [(c.name, c.cpu, c.memory) for c in spec.effective_classes] == [
        ("s", "1", "1Gi"),
        ("m", "2", "4Gi"),
        ("l", "4", "16Gi"),
        ("xl", "16", "64Gi"),
    ]


def test_other_defaults():
    policy = parse_policy(_doc({"shim": "qemu-runtime-rs"}, name="qemu-rs"))
    spec = policy.spec
    assert policy.runtime_class_prefix == "kata-qemu-rs"
    assert spec.sandbox_cgroup_only is True
    assert spec.hugepages is False
    assert (spec.fallback.cpu, spec.fallback.memory) == ("1", "256Mi")
    assert spec.runtime_class.managed_by == "Operator"
    assert spec.runtime_class.node_selector == {"katacontainers.io/kata-runtime": "true"}
    assert (spec.nodes.system_reserved, spec.nodes.kube_reserved, spec.nodes.eviction_hard) == (
        "4Gi", "2Gi", "2Gi")
    assert spec.nodes.infra_pod_memory == "auto"
    assert spec.output.namespace == "kata-sizing"
    assert spec.drift_policy == "Correct"


def test_integers_written_without_quotes_are_kept_as_quantity_text():
    # int-or-string: the API server stores an integer there, and so does the model, as text.
    spec = parse_policy(_doc({"shim": "qemu", "classes": [{"name": "s", "cpu": 2, "memory": 1073741824}]})).spec
    assert (spec.classes[0].cpu, spec.classes[0].memory) == ("2", "1073741824")


def test_numbers_the_api_server_refuses_are_refused_with_the_field_named():
    # Checked on the real API server (tests/api/test_real_inputs.py): a string field given a
    # number and an int-or-string field given a fraction are refused by the CRD's schema.
    with pytest.raises(PolicyError) as error:
        parse_policy(_doc({
            "shim": "qemu",
            "overhead": {"guestMemoryRatio": 0.14, "margin": 0},
            "classes": [{"name": "s", "cpu": 1.5, "memory": "1Gi"}],
        }))
    assert error.value.problems == [
        "spec.overhead.guestMemoryRatio: must be a string (the CRD's type string), not the number 0.14; "
        "YAML reads it as a number: quote it",
        "spec.overhead.margin: must be a string (the CRD's type string), not the integer 0; "
        "YAML reads it as a number: quote it",
        "spec.classes[0].cpu: the number 1.5 is not an integer, and the API server takes only an integer or a "
        "string here (x-kubernetes-int-or-string): write \"1.5\" in quotes",
    ]


def _classes(*envelopes) -> list[dict]:
    return [{"name": name, "cpu": "1", "memory": memory} for name, memory in envelopes]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"shim": "qemu", "classes": _classes(("s", "1Gi"), ("m", "5Zi"))},
            "spec.classes[1].memory: '5Zi' is not a Kubernetes quantity",
        ),
        (
            {"shim": "qemu", "classes": [{"name": "s", "cpu": "lots", "memory": "1Gi"}]},
            "spec.classes[0].cpu: 'lots' is not a Kubernetes quantity",
        ),
        (
            {"shim": "qemu", "classes": _classes(("s", "-1Gi"))},
            "spec.classes[0].memory: '-1Gi' is negative; memory must be zero or more",
        ),
        (
            {"shim": "qemu", "overhead": {"guestMemoryRatio": "0.9"}},
            "spec.overhead.guestMemoryRatio: 0.9 is not in [0, 0.9)",
        ),
        (
            {"shim": "qemu", "overhead": {"guestMemoryRatio": "-0.1"}},
            "spec.overhead.guestMemoryRatio: '-0.1' must be a finite number >= 0",
        ),
        (
            {"shim": "qemu", "overhead": {"guestMemoryRatio": "many"}},
            "spec.overhead.guestMemoryRatio: 'many' is not a decimal number",
        ),
        (
            {"shim": "qemu", "overhead": {"margin": "1.5"}},
            "spec.overhead.margin: 1.5 is above 1.0",
        ),
        (
            {"shim": "qemu", "overhead": {"hostMemory": "0"}},
            "spec.overhead.hostMemory: must be above 0",
        ),
        (
            {"shim": "qemu", "overhead": {"hostCpu": "0m"}},
            "spec.overhead.hostCpu: must be above 0",
        ),
        (
            {"shim": "qemu", "fallback": {"cpu": "1.5"}},
            "spec.fallback.cpu: 1.5 must be a whole number of vCPUs, at least 1",
        ),
        (
            {"shim": "qemu", "classez": []},
            "spec.classez: unknown field (not part of KataSizingPolicy)",
        ),
        (
            {"shim": "qemu", "overhead": {"guestMemory": "64Mi"}},
            "spec.overhead.guestMemory: unknown field (not part of KataSizingPolicy)",
        ),
        (
            {"shim": "qemu", "classes": _classes(("s", "1Gi"), ("s", "2Gi"))},
            "spec.classes: class name 's' is used twice; names must be unique",
        ),
        (
            {"shim": "qemu", "classes": _classes(("s", "2Gi"), ("m", "2Gi"))},
            "spec.classes: class 'm' memory 2Gi is not above class 's' memory 2Gi: "
            "envelopes must strictly increase",
        ),
        (
            {"shim": "qemu", "classes": _classes(("s", "2Gi"), ("m", "1Gi"))},
            "spec.classes: class 'm' memory 1Gi is not above class 's' memory 2Gi",
        ),
        (
            {"shim": "qemu", "classes": []},
            "spec.classes: must list at least one class",
        ),
        (
            {"shim": "qemu", "classes": _classes(("Small", "1Gi"))},
            "spec.classes[0].name: 'Small' is not a DNS label",
        ),
        (
            {"shim": "qemu", "classes": _classes(("-s", "1Gi"))},
            "spec.classes[0].name: '-s' is not a DNS label",
        ),
        (
            {"shim": "qemu", "classes": _classes(("s", "512Ki"))},
            "spec.classes[0].memory: 512Ki is below 1Mi",
        ),
        (
            {"shim": "qemu", "runtimeClass": {"namePrefix": "Kata_QEMU"}},
            "spec.runtimeClass.namePrefix: 'Kata_QEMU' is not a DNS label",
        ),
        (
            {"shim": "remote"},
            "spec.shim: remote (peer pods) runs no local VM and is out of scope",
        ),
        (
            {"shim": "qemu-foo"},
            "spec.shim: 'qemu-foo' is not a kata-deploy shim (one of: clh, ",
        ),
        (
            {"shim": "qemu", "runtime": "Java"},
            "spec.runtime: Input should be 'Rust' or 'Go'",
        ),
        (
            {"shim": "qemu", "hypervisor": "xen"},
            "spec.hypervisor: Input should be 'qemu', 'clh'",
        ),
        (
            {"shim": "qemu", "output": {"namespace": "Kata Sizing"}},
            "spec.output.namespace: 'Kata Sizing' is not a valid namespace name",
        ),
        (
            {"shim": "qemu", "nodes": {"infraPodMemory": "lots"}},
            "spec.nodes.infraPodMemory: 'lots' is not a Kubernetes quantity",
        ),
        (
            {"shim": "qemu", "driftPolicy": "Ignore"},
            "spec.driftPolicy: Input should be 'Correct' or 'Report'",
        ),
        (
            {"classes": _classes(("s", "1Gi"))},
            "spec.shim: required field is missing",
        ),
    ],
)
def test_each_problem_is_one_line_naming_its_path(spec, expected):
    problems = _problems(_doc(spec))
    assert len(problems) == 1, problems
    assert problems[0].startswith(expected), problems[0]


def test_every_problem_is_reported_not_just_the_first():
    problems = _problems(_doc({
        "shim": "qemu",
        "bogus": 1,
        "overhead": {"guestMemoryRatio": "0.95"},
        "classes": [{"name": "s", "cpu": "1", "memory": "5Zi"}],
    }))
    paths = sorted(p.split(":")[0] for p in problems)
    assert paths == ["spec.bogus", "spec.classes[0].memory", "spec.overhead.guestMemoryRatio"]


def test_handler_names_longer_than_63_characters_are_refused():
    # <61 chars>-s is 63 characters and fits; <61 chars>-xl is 64: RuntimeClass.handler is a
    # DNS label (at most 63).
    problems = _problems(_doc({"shim": "qemu", "runtimeClass": {"namePrefix": "a" * 61}}))
    assert len(problems) == 1
    assert "spec.runtimeClass.namePrefix: RuntimeClass/handler '" + "a" * 61 + "-xl'" in problems[0]
    assert "is 64 characters; a handler is a DNS label of at most 63" in problems[0]


def test_a_handler_of_exactly_63_characters_is_accepted():
    prefix = "a" * 60  # the longest default class is "xl": 60 + 1 + 2 = 63
    policy = parse_policy(_doc({"shim": "qemu", "runtimeClass": {"namePrefix": prefix}}))
    assert policy.runtime_class_prefix == prefix


def test_default_prefix_from_a_long_policy_name_is_checked_too():
    problems = _problems(_doc({"shim": "qemu"}, name="p" * 58))
    assert any("is 65 characters" in p for p in problems), problems


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (["not", "a", "mapping"], "(policy): expected a mapping (a KataSizingPolicy), got list"),
        ("just text", "(policy): expected a mapping (a KataSizingPolicy), got str"),
        (None, "(policy): expected a mapping (a KataSizingPolicy), got NoneType"),
        ({"metadata": {"name": "p"}}, "spec: required field is missing"),
        ({"spec": {"shim": "qemu"}}, "metadata: required field is missing"),
        ({"metadata": {"name": "P_1"}, "spec": {"shim": "qemu"}}, "metadata.name: 'P_1' is not a DNS label"),
        ({"metadata": {"name": "p"}, "spec": {"shim": "qemu"}, "kind": "Pod"},
         "kind: Input should be 'KataSizingPolicy'"),
        ({"metadata": {"name": "p"}, "spec": {"shim": "qemu"}, "apiVersion": "katasizing.dev/v1"},
         "apiVersion: Input should be 'katasizing.dev/v1alpha1'"),
        ({"metadata": {"name": "p"}, "spec": {"shim": "qemu"}, "data": {}}, "data: unknown top-level field"),
    ],
)
def test_document_level_problems(document, expected):
    problems = _problems(document)
    assert any(p.startswith(expected) for p in problems), problems


def _live_object() -> dict:
    """A policy as the API server returns it: server metadata, a status, defaulted fields."""
    return {
        "apiVersion": "katasizing.dev/v1alpha1",
        "kind": "KataSizingPolicy",
        "metadata": {
            "name": "qemu-rs",
            "uid": "6f0c3e7a-1d2b-4c5e-9f00-123456789abc",
            "generation": 3,
            "resourceVersion": "48213",
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
            "labels": {"team": "platform"},
            "finalizers": ["kopf.zalando.org/KopfFinalizerMarker"],
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"shim": "qemu-runtime-rs", "classes": [{"name": "s", "cpu": "1", "memory": "1Gi"}]},
        "status": {
            "observedGeneration": 2,
            "conditions": [{"type": "Valid", "status": "True", "reason": "Valid", "message": "",
                            "lastTransitionTime": "2026-12-01T10:00:01Z"}],
            "driftCorrections": 4,
            "somethingAnOlderOperatorWrote": True,
        },
    }


def test_parse_policy_accepts_live_objects_with_server_metadata_and_status():
    live = _live_object()
    before = copy.deepcopy(live)
    policy = parse_policy(live)
    assert policy.name == "qemu-rs"
    assert policy.metadata.uid == "6f0c3e7a-1d2b-4c5e-9f00-123456789abc"
    assert policy.metadata.generation == 3
    assert [c.name for c in policy.spec.effective_classes] == ["s"]
    # Status is the operator's own output, not input.
    assert policy.status is None
    assert live == before, "parse_policy must not mutate the caller's object"


def test_a_live_object_with_a_bad_spec_still_reports_the_spec_path():
    live = _live_object()
    live["spec"]["classes"][0]["memory"] = "lots"
    assert _problems(live) == ["spec.classes[0].memory: 'lots' is not a Kubernetes quantity "
                               "(examples: 512Mi, 2Gi, 600m, 1.5)"]


def test_policies_are_immutable():
    policy = parse_policy(_doc({"shim": "qemu"}))
    with pytest.raises(ValidationError, match="frozen"):
        policy.spec.shim = "clh"  # type: ignore[misc]


def test_unknown_keys_of_mixed_types_are_listed_not_crashed():
    problems = _problems({1: "x", "extra": 2, "metadata": {"name": "p"}, "spec": {"shim": "qemu"}})
    assert problems == ["1: unknown top-level field", "extra: unknown top-level field"]


@pytest.mark.parametrize("key", ["a\nb", "tab\there", " padded", ""])
def test_odd_keys_keep_each_problem_on_one_line(key):
    problems = _problems(_doc({"shim": "qemu", key: 1}))
    assert problems == [f"spec.{key!r}: unknown field (not part of KataSizingPolicy)"]
