"""The GitOps paths of examples/gitops/ as Flux and Argo CD would take them from an empty
cluster: Flux Kustomizations applying the operator, then the policies (dependsOn), and
kata-deploy from an OCIRepository with the operator's values ConfigMap (valuesFrom); an Argo CD
app of apps with sync waves, the overlay committed by `kata-sizing render --values-only`, and
health checks in Lua, run here as Argo CD runs them. The keys these controllers act on are
checked against what the operator and the CLI produce; tests/api/test_gitops_real.py checks every
object against Flux's, Argo CD's, the Prometheus Operator's and cert-manager's real CRDs on the
real API server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from kata_sizing.core.model import parse_policy
from kata_sizing.core.render import FLUX_WATCH_LABEL, VALUES_KEY, render_policy
from tests.support.argocd_health import HEALTH, health
from tests.support.chart import CHART, find_tool
from tests.support.gitops import (
    ARGOCD,
    CLI,
    EMPTY_CLUSTER_NAMESPACES,
    FLUX,
    GITOPS,
    POLICY,
    RENDERS,
    documents,
    objects,
    wave,
)
from tests.support.paths import ROOT


def find(found: list[dict], kind: str, name: str | None = None) -> dict:
    (match,) = [d for d in found if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return match


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)


@pytest.fixture(scope="module")
def policy():
    return parse_policy(documents(POLICY)[0])


def test_every_example_is_a_kubernetes_object() -> None:
    found = objects(GITOPS)
    assert len(found) >= 12
    for doc in found:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
        assert doc["metadata"].get("name"), doc


def test_the_policy_is_valid_and_lets_the_chart_own_the_runtime_classes(policy) -> None:
    result = run_cli("validate", str(POLICY))
    assert result.returncode == 0, result.stderr
    # With the chart installing the overlay, the chart must create the RuntimeClasses.
    assert policy.spec.runtime_class.managed_by == "KataDeploy"


# --- Flux ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kustomizations() -> dict[str, dict]:
    return {k["metadata"]["name"]: k for k in documents(FLUX / "kustomizations.yaml") if k["kind"] == "Kustomization"}


def test_flux_applies_the_operator_then_the_policies_then_kata_deploy_from_git(kustomizations) -> None:
    assert set(kustomizations) == {"kata-sizing", "kata-sizing-policies", "kata-deploy"}
    source = find(documents(FLUX / "kustomizations.yaml"), "GitRepository")
    applied = {}
    for name, kustomization in kustomizations.items():
        spec = kustomization["spec"]
        assert spec["sourceRef"] == {"kind": "GitRepository", "name": source["metadata"]["name"]}
        assert kustomization["metadata"]["namespace"] == source["metadata"]["namespace"] == "flux-system"
        path = ROOT / spec["path"]
        assert path.is_dir() and spec["path"].startswith("./"), spec["path"]
        applied[name] = {o["kind"] for o in objects(path)}
    assert applied == {"kata-sizing": {"Namespace", "HelmRelease"}, "kata-sizing-policies": {"KataSizingPolicy"},
                       "kata-deploy": {"OCIRepository", "HelmRelease"}}
    # The policies wait for the operator's Kustomization to be Ready, which with wait: true
    # means its HelmRelease is: the CRD installed, the operator rolled out.
    assert kustomizations["kata-sizing-policies"]["spec"]["dependsOn"] == [{"name": "kata-sizing"}]
    assert kustomizations["kata-sizing"]["spec"]["wait"] is True
    # kata-deploy must not wait for the policies' health: a KataDeploy policy is Ready only
    # after kata-deploy has created its classes.
    assert "dependsOn" not in kustomizations["kata-deploy"]["spec"]


def test_flux_objects_sit_in_namespaces_an_empty_cluster_has(kustomizations) -> None:
    """The defect this replaces: a HelmRelease in the namespace its own createNamespace was to create."""
    for path in [FLUX / "kustomizations.yaml", *(ROOT / k["spec"]["path"] for k in kustomizations.values())]:
        for obj in objects(path) if path.is_dir() else documents(path):
            namespace = obj["metadata"].get("namespace")
            if obj["kind"] in ("KataSizingPolicy", "Namespace"):
                assert namespace is None  # cluster-scoped
            else:
                assert namespace in EMPTY_CLUSTER_NAMESPACES, f"{obj['kind']} {obj['metadata']['name']} in {namespace}"
    operator = find(objects(FLUX / "operator"), "HelmRelease")
    assert operator["spec"]["targetNamespace"] == "kata-sizing" != operator["metadata"]["namespace"]
    # The Kustomization applies the target namespace itself (Flux applies Namespaces first), with
    # the Pod Security level the operator pod meets, as manifests/ and the Argo CD path give it.
    namespace = find(objects(FLUX / "operator"), "Namespace")
    assert namespace["metadata"]["name"] == operator["spec"]["targetNamespace"]
    assert namespace["metadata"]["labels"] == documents(ROOT / "manifests" / "namespace.yaml")[0]["metadata"]["labels"]
    argo = find(objects(ARGOCD / "apps"), "Application", "kata-sizing")["spec"]["syncPolicy"]
    assert argo["managedNamespaceMetadata"]["labels"].items() <= namespace["metadata"]["labels"].items()
    assert "createNamespace" not in operator["spec"].get("install", {})
    # The release keeps the plain name, so its objects are named as manifests/ names them.
    assert operator["spec"]["releaseName"] == "kata-sizing"
    assert operator["spec"]["chart"]["spec"]["sourceRef"] == {"kind": "GitRepository", "name": "kata-sizing"}


def test_flux_values_from_names_the_configmap_the_operator_writes(policy) -> None:
    release = find(objects(FLUX / "kata-deploy"), "HelmRelease")
    assert release["apiVersion"] == "helm.toolkit.fluxcd.io/v2"
    [ref] = release["spec"]["valuesFrom"]
    values_cm = render_policy(policy).configmaps[0]
    assert ref["kind"] == "ConfigMap"
    assert ref["name"] == values_cm["metadata"]["name"]
    assert ref["valuesKey"] == VALUES_KEY and VALUES_KEY in values_cm["data"]
    # Flux reads valuesFrom only in the HelmRelease's namespace: the policy must write there.
    assert values_cm["metadata"]["namespace"] == release["metadata"]["namespace"] == policy.spec.output.namespace
    # ...and upgrades at once when the ConfigMap changes only if it carries Flux's watch label.
    assert values_cm["metadata"]["labels"][FLUX_WATCH_LABEL] == "Enabled"


def test_flux_kata_deploy_comes_from_an_oci_repository() -> None:
    found = objects(FLUX / "kata-deploy")
    release, repository = find(found, "HelmRelease"), find(found, "OCIRepository")
    # chartRef to an OCIRepository, not a HelmRepository of type oci (deprecated by Flux).
    assert "chart" not in release["spec"]
    assert release["spec"]["chartRef"] == {"kind": "OCIRepository", "name": repository["metadata"]["name"]}
    assert repository["metadata"]["namespace"] == release["metadata"]["namespace"]
    assert repository["spec"]["url"] == "oci://ghcr.io/kata-containers/kata-deploy-charts/kata-deploy"
    assert repository["spec"]["layerSelector"]["mediaType"] == "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
    assert not any(o["kind"] == "HelmRepository" for o in objects(GITOPS))
    assert release["spec"]["interval"]


# --- Argo CD ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def applications() -> dict[str, dict]:
    return {a["metadata"]["name"]: a for a in objects(ARGOCD / "apps")}


def test_argo_cd_root_application_syncs_the_apps_in_waves(applications) -> None:
    root = find(documents(ARGOCD / "root.yaml"), "Application")
    assert ROOT / root["spec"]["source"]["path"] == ARGOCD / "apps"
    assert {a["kind"] for a in applications.values()} == {"Application"}
    assert set(applications) == {"kata-sizing", "kata-deploy", "kata-sizing-policies"}
    for application in applications.values():
        assert application["metadata"]["namespace"] == root["metadata"]["namespace"] == "argocd"
    policies = applications["kata-sizing-policies"]
    # The operator (the CRD) and kata-deploy (the RuntimeClasses) before the policies.
    assert wave(applications["kata-sizing"]) < wave(policies)
    assert wave(applications["kata-deploy"]) < wave(policies)
    assert ROOT / policies["spec"]["source"]["path"] == POLICY.parent
    retry = policies["spec"]["syncPolicy"]["retry"]
    assert retry["limit"] >= 3 and retry["backoff"]["duration"]


def test_argo_cd_commits_exactly_what_values_only_renders(applications) -> None:
    committed = ARGOCD / "values" / "kata-sizing-values.yaml"
    result = run_cli("render", str(POLICY), "--values-only")
    assert result.returncode == 0, result.stderr
    assert committed.read_text() == result.stdout, (
        f"stale: kata-sizing render {POLICY.relative_to(ROOT)} --values-only > {committed.relative_to(ROOT)}")
    app = applications["kata-deploy"]
    chart_source, values_source = app["spec"]["sources"]
    [value_file] = chart_source["helm"]["valueFiles"]
    assert value_file == f"${values_source['ref']}/{committed.relative_to(ROOT)}"
    assert chart_source["chart"] == "kata-deploy"
    # Argo CD's OCI Helm sources name the registry without the oci:// scheme, and the
    # registry is declared as a helm repository with OCI enabled.
    assert chart_source["repoURL"] == "ghcr.io/kata-containers/kata-deploy-charts"
    repository = find(documents(ARGOCD / "root.yaml"), "Secret")
    assert repository["metadata"]["labels"]["argocd.argoproj.io/secret-type"] == "repository"
    assert repository["stringData"] | {"name": None} == {
        "name": None, "type": "helm", "url": chart_source["repoURL"], "enableOCI": "true"}


def test_argocd_cm_carries_the_health_checks_verbatim() -> None:
    config = find(documents(ARGOCD / "argocd-cm.yaml"), "ConfigMap")
    assert config["metadata"] == {"name": "argocd-cm", "namespace": "argocd"}
    assert config["data"] == {
        "resource.customizations.health.katasizing.dev_KataSizingPolicy": (HEALTH / "katasizingpolicy.lua").read_text(),
        "resource.customizations.health.argoproj.io_Application": (HEALTH / "application.lua").read_text(),
    }


def test_the_docs_show_the_health_check_argo_cd_runs() -> None:
    gitops = (ROOT / "docs" / "gitops.md").read_text()
    assert f"```lua\n{(HEALTH / 'katasizingpolicy.lua').read_text()}```" in gitops


# What the operator writes (conditions as tests/api/test_gitops_real.py reads them from the real API
# server, abridged); a policy before its first pass has no status at all.
def policy_with(generation: int, observed: int | None, ready: tuple[str, str, str] | None) -> dict:
    obj = {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy",
           "metadata": {"name": "qemu-rs", "generation": generation}, "spec": {"shim": "qemu-runtime-rs"}}
    if observed is not None:
        conditions = [{"type": "Valid", "status": "True", "reason": "PolicyValid", "message": "all sizing rules hold"}]
        if ready and ready[1] == "PolicyInvalid":  # the operator says why in Valid, and only that in Ready
            conditions = [{"type": "Valid", "status": "False", "reason": "PolicyInvalid",
                           "message": "class s: podFixed.memory 256Mi is not above overhead_memory 512Mi"}]
        if ready:
            conditions.append({"type": "Ready", "status": ready[0], "reason": ready[1], "message": ready[2]})
        obj["status"] = {"observedGeneration": observed, "conditions": conditions}
    return obj


@pytest.mark.parametrize("obj, expected", [
    (policy_with(1, None, None), ("Progressing", "waiting for the kata-sizing operator")),
    (policy_with(3, 2, ("True", "InSync", "")),
     ("Progressing", "waiting for the kata-sizing operator to reconcile generation 3")),
    (policy_with(2, 2, None), ("Progressing", "waiting for the kata-sizing operator")),
    (policy_with(2, 2, ("True", "InSync", "")), ("Healthy", "InSync")),
    (policy_with(2, 2, ("False", "PolicyInvalid", "the policy is invalid")),
     ("Degraded", "PolicyInvalid: class s: podFixed.memory 256Mi is not above overhead_memory 512Mi")),
    (policy_with(2, 2, ("False", "RuntimeClassMissing", "kata-deploy has not created RuntimeClass kata-qemu-rs-s")),
     ("Progressing", "RuntimeClassMissing: kata-deploy has not created RuntimeClass kata-qemu-rs-s")),
    (policy_with(2, 2, ("Unknown", "Pending", "")), ("Progressing", "Pending")),
], ids=["no-status", "older-generation", "no-ready", "ready", "invalid", "waiting-for-kata-deploy", "unknown"])
def test_the_policy_health_check_maps_ready_to_argo_cd_health(obj: dict, expected: tuple[str, str]) -> None:
    result = health(HEALTH / "katasizingpolicy.lua", obj)
    assert (result["status"], result["message"]) == expected


@pytest.mark.parametrize("status, expected", [
    (None, ("Progressing", "")),
    ({"health": {"status": "Healthy"}}, ("Healthy", "")),
    ({"health": {"status": "Degraded", "message": "KataSizingPolicy qemu-rs: PolicyInvalid"}},
     ("Degraded", "KataSizingPolicy qemu-rs: PolicyInvalid")),
])
def test_the_application_health_check_passes_the_childs_health_up(status, expected) -> None:
    obj = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"name": "x"}}
    if status is not None:
        obj["status"] = status
    result = health(HEALTH / "application.lua", obj)
    assert (result["status"], result["message"]) == expected


# --- the operator's chart as the examples install it ------------------------------------------


@pytest.mark.parametrize("path, kind", [
    (FLUX / "operator" / "kata-sizing.yaml", "HelmRelease"),
    (ARGOCD / "apps" / "kata-sizing.yaml", "Application"),
])
def test_the_operator_chart_renders_with_the_examples_values(tmp_path: Path, path: Path, kind: str) -> None:
    helm = find_tool("helm")
    if helm is None:
        pytest.skip("helm not at .tools/helm nor on PATH (run `make tools`)")
    obj = find(documents(path), kind)
    if kind == "HelmRelease":
        assert obj["spec"]["chart"]["spec"]["chart"] == "./charts/kata-sizing"
        values, namespace = obj["spec"]["values"], obj["spec"]["targetNamespace"]
    else:
        assert obj["spec"]["source"]["path"] == "charts/kata-sizing"
        values, namespace = obj["spec"]["source"]["helm"]["valuesObject"], obj["spec"]["destination"]["namespace"]
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    result = subprocess.run([helm, "template", "kata-sizing", str(CHART), "-n", namespace, "-f", str(values_file)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(result.stdout) if d}
    # With only Flux's or Argo CD's CRDs in the cluster: nothing of the Prometheus Operator's.
    assert "Deployment" in kinds and not {"ServiceMonitor", "PrometheusRule"} & kinds
    assert {"ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"} <= kinds  # the shared admission policies


# --- kata-sizing render --values-only ----------------------------------------------------------


def test_values_only_prints_the_overlay_the_configmap_holds(policy) -> None:
    result = run_cli("render", str(POLICY), "--values-only")
    assert result.returncode == 0, result.stderr
    assert result.stdout == render_policy(policy).values_yaml
    assert result.stderr == ""  # no note about RuntimeClasses: none are printed anyway


def test_values_only_merges_several_policies_into_one_overlay(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text((ROOT / "examples" / "qemu-runtime-rs.yaml").read_text() + "---\n"
                    + (ROOT / "examples" / "clh-snp-go.yaml").read_text())
    result = run_cli("render", str(both), "--values-only", "-o", "json")
    assert result.returncode == 0, result.stderr
    overlay = json.loads(result.stdout)
    runtimes = overlay["customRuntimes"]["runtimes"]
    assert overlay["customRuntimes"]["enabled"] is True
    assert {"kata-qemu-rs-s", "kata-qemu-rs-xl"} <= set(runtimes)
    assert any(name.startswith("kata-clh-snp") for name in runtimes)
    as_yaml = run_cli("render", str(both), "--values-only")
    assert yaml.safe_load(as_yaml.stdout) == overlay


def test_values_only_refuses_two_policies_rendering_the_same_runtime(tmp_path: Path) -> None:
    first = (ROOT / "examples" / "qemu-runtime-rs.yaml").read_text()
    doc = yaml.safe_load(first)
    doc["metadata"]["name"] = "other"
    doc["spec"]["runtimeClass"]["namePrefix"] = "kata-qemu-rs"  # the same names as qemu-rs's
    clash = tmp_path / "clash.yaml"
    clash.write_text(first + "---\n" + yaml.safe_dump(doc))
    result = run_cli("render", str(clash), "--values-only")
    assert result.returncode == 1
    # Refused when the file is read (model.policy_set_problems), before any overlay is made.
    assert ("RuntimeClass kata-qemu-rs-s (class s) is also RuntimeClass kata-qemu-rs-s of policy 'qemu-rs'"
            in result.stderr)
    assert "Traceback" not in result.stderr


# --- without the operator: committed renders, one application per team ---------------------------

def test_each_team_commits_exactly_what_render_prints() -> None:
    committed = RENDERS / "team-a" / "team-a.yaml"
    result = run_cli("render", str(RENDERS / "policies" / "team-a.yaml"))
    assert result.returncode == 0, result.stderr
    assert committed.read_text() == result.stdout, (
        f"stale: kata-sizing render {(RENDERS / 'policies' / 'team-a.yaml').relative_to(ROOT)} > "
        f"{committed.relative_to(ROOT)}")
    kustomization = documents(RENDERS / "team-a" / "kustomization.yaml")[0]
    assert kustomization["resources"] == [committed.name]


def _granted(rules: list[dict]) -> dict[str, tuple[set[str], set[str]]]:
    """{resource: (names, verbs)} of a role's rules (each rule names one resource here)."""
    found = {}
    for rule in rules:
        (resource,) = rule["resources"]
        found[resource] = (set(rule["resourceNames"]), set(rule["verbs"]))
    return found


def test_a_teams_identity_may_write_exactly_the_objects_of_its_render() -> None:
    platform = documents(RENDERS / "platform" / "team-a.yaml")
    rendered = documents(RENDERS / "team-a" / "team-a.yaml")
    plurals = {"ConfigMap": "configmaps", "RuntimeClass": "runtimeclasses",
               "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
               "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings"}
    wanted: dict[str, set[str]] = {}
    for obj in rendered:
        wanted.setdefault(plurals[obj["kind"]], set()).add(obj["metadata"]["name"])
    role = find(platform, "Role")
    cluster_role = find(platform, "ClusterRole")
    granted = {**_granted(role["rules"]), **_granted(cluster_role["rules"])}
    assert {r: names for r, (names, _) in granted.items()} == wanted
    # What a server-side apply and a prune do, and nothing else (no list, no update, no escalate).
    assert all(verbs == {"get", "create", "patch", "delete"} for _, verbs in granted.values())
    namespaces = {o["metadata"]["namespace"] for o in rendered if o["kind"] == "ConfigMap"}
    assert namespaces == {role["metadata"]["namespace"]} == {find(platform, "Namespace")["metadata"]["name"]}
    account = find(platform, "ServiceAccount")
    subject = {"kind": "ServiceAccount", "name": account["metadata"]["name"],
               "namespace": account["metadata"]["namespace"]}
    assert find(platform, "RoleBinding")["subjects"] == find(platform, "ClusterRoleBinding")["subjects"] == [subject]


def test_flux_applies_the_shared_policies_and_the_teams_identity_before_the_teams_render() -> None:
    found = documents(RENDERS / "flux.yaml")
    kustomizations = {k["metadata"]["name"]: k["spec"] for k in found if k["kind"] == "Kustomization"}
    assert kustomizations["kata-sizing-admission"]["path"] == "./manifests/admission"
    assert kustomizations["kata-sizing-tenants"]["path"] == "./examples/gitops/renders/platform"
    team = kustomizations["team-a"]
    assert team["dependsOn"] == [{"name": "kata-sizing-admission"}, {"name": "kata-sizing-tenants"}]
    assert team["serviceAccountName"] == find(documents(RENDERS / "platform" / "team-a.yaml"),
                                              "ServiceAccount")["metadata"]["name"]
    for spec in kustomizations.values():
        assert (ROOT / spec["path"]).is_dir() and spec["prune"] is True
    assert all(o["metadata"]["namespace"] in EMPTY_CLUSTER_NAMESPACES for o in found)


def _kustomize(directory: Path) -> subprocess.CompletedProcess:
    kubectl = find_tool("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not at .tools/kubectl nor on PATH (run `make tools`)")
    return subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60,
                          check=False)


def test_kustomize_accepts_a_kustomization_listing_several_policies_renders(tmp_path: Path) -> None:
    """Several teams' renders (and the shared admission policies) in one kustomization, as a Flux
    Kustomization builds it: every object once. A render that carried the shared policies too is
    what kustomize refuses."""
    policy = documents(RENDERS / "policies" / "team-a.yaml")[0]
    files = []
    for team in ("team-a", "team-b", "team-c"):
        body = json.loads(json.dumps(policy))
        body["metadata"]["name"] = team
        body["spec"]["output"]["namespace"] = team
        (tmp_path / f"{team}-policy.yaml").write_text(yaml.safe_dump(body))
        result = run_cli("render", str(tmp_path / f"{team}-policy.yaml"))
        assert result.returncode == 0, result.stderr
        (tmp_path / f"{team}.yaml").write_text(result.stdout)
        files.append(f"{team}.yaml")
    (tmp_path / "shared.yaml").write_text(run_cli("render", "--shared").stdout)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": [*files, "shared.yaml"]}))
    built = _kustomize(tmp_path)
    assert built.returncode == 0, built.stderr
    keys = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in yaml.safe_load_all(built.stdout)]
    assert len(keys) == len(set(keys)) == 3 * 9 + 6  # and the shared policies with their keep-alive bindings
    # A second copy of the shared policies (a render that printed them with each policy) is refused.
    (tmp_path / "again.yaml").write_text((tmp_path / "shared.yaml").read_text())
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": [*files, "shared.yaml", "again.yaml"]}))
    refused = _kustomize(tmp_path)
    assert refused.returncode != 0 and "already registered id" in refused.stderr
