"""The generated CRD: committed copy current, valid for Kubernetes, structural, and in
agreement with the pydantic models on what a policy may look like."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pydantic
import pytest
import yaml

from kata_sizing.core import crdgen, model, quantity, statusmodel
from tests.support.paths import ROOT

CRD_FILE = ROOT / "crds" / "katasizingpolicies.katasizing.dev.yaml"

# The oldest Kubernetes the install supports and the newest kubernetes-validate ships.
SCHEMA_VERSIONS = ("1.25", ".".join(kubernetes_validate.latest_version().split(".")[:2]))

# The spec of the README's example policy, every field set.
EXAMPLE_SPEC: dict[str, Any] = {
    "shim": "qemu-runtime-rs",
    "runtime": "Rust",
    "hypervisor": "qemu",
    "sandboxCgroupOnly": True,
    "hugepages": False,
    "overhead": {
        "guestMemoryBase": "64Mi",
        "guestMemoryRatio": "0.14",
        "guestCpu": "200m",
        "hostMemory": "50Mi",
        "hostCpu": "100m",
        "margin": "0.10",
    },
    "fallback": {"cpu": "1", "memory": "256Mi"},
    "classes": [
        {
            "name": "s",
            "cpu": "1",
            "memory": "512Mi",
            "overheadVcpus": "0.5",
            "overheadMemory": "128Mi",
            "defaultVcpus": 2,
            "defaultMemory": "1024Mi",
            "podFixed": {"cpu": "600m", "memory": "160Mi"},
        }
    ],
    "runtimeClass": {
        "namePrefix": "kata-qemu-rs",
        "nodeSelector": {"katacontainers.io/kata-runtime": "true"},
        "tolerations": [],
        "managedBy": "Operator",
    },
    "nodes": {
        "selector": {"katacontainers.io/kata-runtime": "true"},
        "systemReserved": "4Gi",
        "kubeReserved": "2Gi",
        "evictionHard": "2Gi",
        "infraPodMemory": "auto",
    },
    "output": {"namespace": "kata-sizing"},
    "driftPolicy": "Correct",
}


def policy(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj = {
        "apiVersion": model.API_VERSION,
        "kind": model.KIND,
        "metadata": {"name": "qemu-rs"},
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def with_change(path: str, value: Any) -> dict[str, Any]:
    """EXAMPLE_SPEC with one field replaced (a path like `classes.0.name`), or
    removed when value is `...`."""
    spec = copy.deepcopy(EXAMPLE_SPEC)
    *parents, last = path.split(".")
    node: Any = spec
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is ...:
        del node[int(last) if isinstance(node, list) else last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return spec


def without_kubernetes_extensions(schema: Any) -> Any:
    """The schema as plain JSON Schema: what jsonschema cannot evaluate (CEL, list types)
    removed."""
    if isinstance(schema, dict):
        return {
            key: without_kubernetes_extensions(value)
            for key, value in schema.items()
            if not key.startswith("x-kubernetes-")
        }
    if isinstance(schema, list):
        return [without_kubernetes_extensions(item) for item in schema]
    return schema


def schema_nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path or "(root)", node
    for name, sub in node.get("properties", {}).items():
        yield from schema_nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], f"{path}.*")


@pytest.fixture(scope="module")
def committed_text() -> str:
    assert CRD_FILE.exists(), f"{CRD_FILE.relative_to(ROOT)} is missing: run `make crds`"
    return CRD_FILE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def crd(committed_text: str) -> dict[str, Any]:
    return yaml.safe_load(committed_text)


@pytest.fixture(scope="module")
def version(crd: dict[str, Any]) -> dict[str, Any]:
    (only,) = crd["spec"]["versions"]
    return only


@pytest.fixture(scope="module")
def schema(version: dict[str, Any]) -> dict[str, Any]:
    return version["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="module")
def validator(schema: dict[str, Any]) -> jsonschema.Draft4Validator:
    # OpenAPI v3.0 schemas are JSON Schema draft 4 (boolean exclusiveMinimum) plus extensions.
    plain = without_kubernetes_extensions(schema)
    jsonschema.Draft4Validator.check_schema(plain)
    return jsonschema.Draft4Validator(plain)


# ---- the committed file ----


def test_committed_crd_is_current(committed_text: str) -> None:
    assert committed_text == crdgen.render(), (
        f"{CRD_FILE.relative_to(ROOT)} is stale (the models changed): run `make crds`"
    )


def test_committed_crd_says_it_is_generated(committed_text: str) -> None:
    assert committed_text.splitlines()[0] == crdgen.HEADER.strip()


def test_generation_is_deterministic() -> None:
    assert crdgen.render() == crdgen.render()


@pytest.mark.parametrize("k8s_version", SCHEMA_VERSIONS)
def test_crd_is_valid_for_kubernetes(crd: dict[str, Any], k8s_version: str) -> None:
    try:
        kubernetes_validate.validate(crd, k8s_version, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"invalid for Kubernetes {k8s_version}: {error.message} at {list(error.path)}")


def test_names_scope_and_version(crd: dict[str, Any], version: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{model.PLURAL}.{model.GROUP}"
    assert spec["group"] == model.GROUP
    assert spec["scope"] == "Cluster"
    assert spec["names"] == {
        "kind": model.KIND,
        "listKind": f"{model.KIND}List",
        "plural": model.PLURAL,
        "singular": "katasizingpolicy",
        "shortNames": [model.SHORT_NAME],
        "categories": ["kata"],
    }
    assert (version["name"], version["served"], version["storage"]) == (model.VERSION, True, True)
    assert version["subresources"] == {"status": {}}


def test_printer_columns(version: dict[str, Any]) -> None:
    columns = {c["name"]: (c["type"], c["jsonPath"]) for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Shim": ("string", ".spec.shim"),
        "Mode": ("string", ".status.runtime"),
        "Classes": ("string", ".status.classNames"),
        "Ready": ("string", '.status.conditions[?(@.type=="Ready")].status'),
        "Reason": ("string", '.status.conditions[?(@.type=="Ready")].reason'),
        "RuntimeClasses": ("string", ".spec.runtimeClass.managedBy"),
        "Age": ("date", ".metadata.creationTimestamp"),
    }


def test_owner_column_is_never_empty(schema: dict[str, Any]) -> None:
    # The RuntimeClasses column reads spec.runtimeClass.managedBy; the server fills it in
    # only when runtimeClass itself is defaulted to {}.
    runtime_class = schema["properties"]["spec"]["properties"]["runtimeClass"]
    assert runtime_class["default"] == {}
    assert runtime_class["properties"]["managedBy"]["default"] == "Operator"


def test_every_field_has_a_description(schema: dict[str, Any]) -> None:
    # `kubectl explain katasizingpolicy.spec...` prints these; a field without one reads blank.
    missing = [
        path
        for path, node in schema_nodes(schema)
        if path != "(root)" and not path.endswith("[]") and not path.endswith(".*")
        and path != ".metadata"  # the API server allows nothing there but {type: object}
        and not (node.get("description") or "").strip()
    ]
    assert missing == [], f"fields without a description: {missing}"
    assert len(list(schema_nodes(schema))) > 100  # the walk really reached the nested fields


# ---- structural schema ----


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    problems = []
    for path, node in schema_nodes(schema):
        if node.get("x-kubernetes-int-or-string"):
            extra = set(node) - {"x-kubernetes-int-or-string", "description", "pattern", "default"}
            if extra:
                problems.append(f"{path}: int-or-string node also has {sorted(extra)}")
            continue
        if "type" not in node:
            problems.append(f"{path}: no type")
        for key in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "const"):
            if key in node:
                problems.append(f"{path}: has {key}")
        if node.get("additionalProperties") is False:
            problems.append(f"{path}: additionalProperties: false")
        if "additionalProperties" in node and "properties" in node:
            problems.append(f"{path}: both properties and additionalProperties")
        if "default" in node and node["default"] is None:
            problems.append(f"{path}: default null")
        fields = {"properties", "additionalProperties"} & set(node)
        if node.get("type") == "object" and not fields and path != ".metadata":
            problems.append(f"{path}: object without fields")
        if node.get("type") == "array" and "items" not in node:
            problems.append(f"{path}: array without items")
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            if key in node and not isinstance(node[key], bool):
                problems.append(f"{path}: {key} must be a boolean in OpenAPI v3.0")
    assert not problems, "\n".join(problems)


def test_top_level_shape(schema: dict[str, Any]) -> None:
    assert schema["type"] == "object"
    assert schema["required"] == ["spec"]
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert schema["properties"]["metadata"]["type"] == "object"
    # A real kube-apiserver refuses a CRD with anything else there, a description included.
    assert schema["properties"]["metadata"] == {"type": "object"}
    assert "x-kubernetes-preserve-unknown-fields" not in str(schema)


def test_quantity_fields_are_int_or_string(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    memory = spec["classes"]["items"]["properties"]["memory"]
    assert memory["x-kubernetes-int-or-string"] is True
    assert memory["pattern"] == crdgen.QUANTITY_PATTERN
    assert spec["nodes"]["properties"]["infraPodMemory"]["default"] == "auto"


@pytest.mark.parametrize(
    "text",
    ["512Mi", "0.5Gi", "600m", "1.5", "1", "1e3", "2E-1", ".5", "1.", "+1Ki", "-1", "100k",
     "1Mb", "Mi", "1 Mi", "1mi", "one", "", "1e", "0x10", "1.5.5", "1e3.5"],
)
def test_quantity_pattern_matches_the_parser(text: str) -> None:
    try:
        quantity.parse_quantity(text)
        parses = True
    except quantity.QuantityError:
        parses = False
    assert bool(re.match(crdgen.QUANTITY_PATTERN, text)) == parses


def test_shim_dependent_fields_have_no_default(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]
    for name in ("runtime", "hypervisor", "classes"):
        assert "default" not in spec["properties"][name], name
    for name, node in spec["properties"]["overhead"]["properties"].items():
        assert "default" not in node, f"overhead.{name}"
    assert spec["required"] == ["shim"]


def test_model_defaults_are_kept(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    assert spec["driftPolicy"]["default"] == "Correct"
    assert spec["sandboxCgroupOnly"]["default"] is True
    assert spec["fallback"]["properties"]["memory"]["default"] == model.Fallback().memory


def test_cel_rules_and_their_cost_bounds(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    classes = spec["classes"]
    assert classes["x-kubernetes-validations"] == [
        {
            "rule": "self.all(c, self.exists_one(d, d.name == c.name))",
            "message": "class names must be unique",
        }
    ]
    # Without these bounds the API server estimates the rule's cost as unbounded.
    assert (classes["minItems"], classes["maxItems"]) == (1, 16)
    name = classes["items"]["properties"]["name"]
    assert name["maxLength"] == 63 and name["pattern"] == model.DNS_LABEL.pattern
    ratio = spec["overhead"]["properties"]["guestMemoryRatio"]
    assert ratio["x-kubernetes-validations"][0]["rule"] == "double(self) < 0.9"
    assert ratio["maxLength"] <= 64
    for path, node in schema_nodes(schema):
        if "x-kubernetes-validations" in node and node.get("type") == "array":
            assert "maxItems" in node, path
        if "x-kubernetes-validations" in node and node.get("type") == "string":
            assert "maxLength" in node, path
    spec_nodes = dict(schema_nodes(schema["properties"]["spec"], ".spec"))
    assert spec_nodes[".spec.overhead.samples"]["maxItems"] == 64
    assert spec_nodes[".spec.runtimeClass.tolerations"]["maxItems"] == 32


def test_conditions_are_a_map_keyed_by_type(schema: dict[str, Any]) -> None:
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


# ---- policies against the schema, and the models agreeing ----


def schema_errors(validator: jsonschema.Draft4Validator, obj: dict[str, Any]) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]


def model_accepts(spec: dict[str, Any]) -> bool:
    try:
        model.KataSizingPolicySpec.model_validate(spec)
    except pydantic.ValidationError:
        return False
    return True


def test_design_example_is_valid(validator: jsonschema.Draft4Validator) -> None:
    status = {
        "observedGeneration": 3,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Synced",
                "message": "",
                "observedGeneration": 3,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "classes": [
            {
                "name": "s",
                "runtimeClass": "kata-qemu-rs-s",
                "podFixed": {"cpu": "600m", "memory": "160Mi"},
                "overheadVcpus": "0.5",
                "overheadMemory": "128Mi",
                "defaultVcpus": 2,
                "defaultMemory": "1024Mi",
                "largestVm": {"vcpus": 2, "memoryMiB": 640},
            }
        ],
        "driftCorrections": 0,
        "warnings": [],
    }
    assert schema_errors(validator, policy(EXAMPLE_SPEC, status)) == []
    assert model_accepts(EXAMPLE_SPEC)
    statusmodel.KataSizingPolicyStatus.model_validate(status)


def test_minimal_policy_is_valid(validator: jsonschema.Draft4Validator) -> None:
    assert schema_errors(validator, policy({"shim": "qemu-runtime-rs"})) == []


def test_quantities_may_be_integers(validator: jsonschema.Draft4Validator) -> None:
    spec = with_change("fallback", {"cpu": 2, "memory": 268435456})
    assert schema_errors(validator, policy(spec)) == []
    assert model_accepts(spec)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("driftPolicy", "Ignore"),
        ("classes.0.name", ...),
        ("classes.0.name", "Small"),
        ("classes.0.name", "x" * 64),
        ("classes", []),
        ("classes.0.memory", "lots"),
        ("classes.0.defaultVcpus", 0),
        ("overhead.guestMemoryRatio", "-0.1"),
        ("overhead.hostCpu", "1 core"),
        ("nodes.infraPodMemory", "automatic"),
        ("runtime", "Java"),
        ("runtimeClass.managedBy", "Helm"),
        ("runtimeClass.namePrefix", "Kata_QEMU"),
        ("output.namespace", "Kata"),
        ("shim", ...),
        ("hugepages", "maybe"),
    ],
    ids=lambda v: "<removed>" if v is ... else str(v)[:20],
)
def test_invalid_policy_is_rejected_by_schema_and_model(
    validator: jsonschema.Draft4Validator, path: str, value: Any
) -> None:
    spec = with_change(path, value)
    assert schema_errors(validator, policy(spec)), f"the schema accepts {path}={value!r}"
    assert not model_accepts(spec), f"the model accepts {path}={value!r}"


def test_missing_spec_is_rejected(validator: jsonschema.Draft4Validator) -> None:
    obj = policy(EXAMPLE_SPEC)
    del obj["spec"]
    assert schema_errors(validator, obj)


# ---- the command ----


def run_crdgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kata_sizing.core.crdgen", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_command_prints_the_crd() -> None:
    result = run_crdgen()
    assert result.returncode == 0, result.stderr
    assert result.stdout == crdgen.render()


def test_check_passes_on_the_committed_crd() -> None:
    result = run_crdgen("--check", str(CRD_FILE.relative_to(ROOT)))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""


def test_check_fails_on_a_modified_copy(tmp_path: Path, committed_text: str) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text(committed_text.replace("maxItems: 16", "maxItems: 17"), encoding="utf-8")
    result = run_crdgen("--check", str(stale))
    assert result.returncode == 1
    first, *diff = result.stderr.splitlines()
    assert "make crds" in first
    assert any(line.startswith("-") and line.endswith("maxItems: 17") for line in diff)
    assert any(line.startswith("+") and line.endswith("maxItems: 16") for line in diff)
    assert len(diff) <= 41


def test_check_fails_on_a_missing_file(tmp_path: Path) -> None:
    result = run_crdgen("--check", str(tmp_path / "absent.yaml"))
    assert result.returncode == 1
    assert "make crds" in result.stderr
