"""The GitOps examples and the chart's optional objects against the real schemas: Flux's
(source-, kustomize- and helm-controller), Argo CD's, the Prometheus Operator's and
cert-manager's CRDs at the versions scripts/fetch-crds.py pins, created on the real kube-apiserver
of the suite; every object applied with server-side field validation (Strict: an unknown or
misspelt field is an error, as are the CRDs' enums, patterns and CEL rules).

An empty cluster of its own (only Kubernetes' namespaces and the one Flux's or Argo CD's install
creates) shows that each path applies in its own order from nothing. The Argo CD health check runs
on the status the operator really writes (the suite's control plane and operator).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.argocd_health import HEALTH, health
from tests.support.chart import CHART, EVERYTHING_ON, find_tool
from tests.support.gitops import ARGOCD, FLUX, RENDERS, documents, objects, wave
from tests.support.paths import ROOT
from tests.support.realcluster import (
    CRD_NAME,
    POLICIES,
    REQUIRE_ENV,
    ControlPlane,
    RealOperator,
    poll,
    require_binary,
)

pytestmark = pytest.mark.realserver

CRDS = ROOT / ".tools" / "crds"
CHART_CRDS = CHART / "crds"


def require_crds() -> None:
    if not (CRDS / "VERSIONS").exists():
        reason = "the third-party CRDs are not fetched (.tools/crds; `make tools`): schema tests skipped"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)


def apply(cp: ControlPlane, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """`kubectl apply` with the API server's strict field validation."""
    return cp.kubectl("apply", "--validate=strict", *args, input=input, check=check)


def helm_template(*args: str) -> str:
    helm = find_tool("helm")
    if helm is None:
        pytest.fail("the real helm is missing (.tools/helm; `make tools`)")
    result = subprocess.run([helm, "template", *args], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def ensure_namespace(cp: ControlPlane, name: str) -> None:
    """What createNamespace (Flux) and CreateNamespace=true (Argo CD) do before an install."""
    if cp.kubectl("get", "namespace", name, check=False).returncode != 0:
        cp.kubectl("create", "namespace", name)


def install_crds(cp: ControlPlane, *directories: Path) -> None:
    # Server-side: Argo CD's and the Prometheus Operator's CRDs are too large for the
    # last-applied annotation of client-side apply.
    cp.kubectl("apply", "--server-side", "--field-manager=kata-sizing-tests",
               *(arg for directory in directories for arg in ("-f", str(directory))))
    names = [crd["metadata"]["name"] for directory in directories
             for file in sorted(directory.glob("*.yaml")) for crd in documents(file)]
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{name}" for name in names))


@pytest.fixture(scope="module")
def empty_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of its own with nothing of kata-sizing on it: Flux's and Argo CD's CRDs
    and namespaces (what installing them creates), and no other CRD (the GitOps examples apply
    with only those); no kata-sizing CRD, no kata-sizing namespace."""
    require_binary()
    require_crds()
    cp = ControlPlane(tmp_path_factory.mktemp("empty-cluster"))
    try:
        cp.start()
        install_crds(cp, *(CRDS / project for project in ("flux", "argocd")))
        for namespace in ("flux-system", "argocd"):
            cp.kubectl("create", "namespace", namespace)
        # Established is not yet servable for a moment (429 "storage is (re)initializing").
        poll(lambda: cp.kubectl("get", "kustomizations,applications", "-A", check=False).returncode == 0, 30,
             "the third-party CRDs are served")
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def monitoring_crds(empty_cluster: ControlPlane) -> ControlPlane:
    """The Prometheus Operator's and cert-manager's CRDs, for the chart's optional objects (after
    the GitOps paths, which must apply without them)."""
    cp = empty_cluster
    install_crds(cp, *(CRDS / project for project in ("prometheus-operator", "cert-manager")))
    poll(lambda: cp.kubectl("get", "servicemonitors,certificates", "-A", check=False).returncode == 0, 30,
         "the Prometheus Operator's and cert-manager's CRDs are served")
    return cp


def only_gitops_crds(cp: ControlPlane) -> bool:
    """No CRD but Flux's, Argo CD's and kata-sizing's own (the Prometheus Operator's and
    cert-manager's are not installed)."""
    groups = {name.rpartition("/")[2].partition(".")[2] for name in cp.kubectl("get", "crd", "-o", "name").stdout.split()}
    return groups <= {"toolkit.fluxcd.io", "source.toolkit.fluxcd.io", "kustomize.toolkit.fluxcd.io",
                      "helm.toolkit.fluxcd.io", "argoproj.io", "katasizing.dev"}


def test_the_pinned_versions_are_the_ones_fetched() -> None:
    require_crds()
    fetched = (CRDS / "VERSIONS").read_text().split("\n")
    assert "flux github.com/fluxcd/helm-controller v1.6.4" in fetched
    assert "argocd github.com/argoproj/argo-cd/v3 v3.6.2" in fetched
    assert "prometheus-operator github.com/prometheus-operator/prometheus-operator v0.94.0" in fetched
    assert "cert-manager github.com/cert-manager/cert-manager v1.21.2" in fetched


# --- Flux ---------------------------------------------------------------------------------------


def dependency_order(kustomizations: list[dict]) -> list[dict]:
    by_name = {k["metadata"]["name"]: k for k in kustomizations}
    ordered: list[dict] = []

    def visit(name: str) -> None:
        if by_name[name] in ordered:
            return
        for dependency in by_name[name]["spec"].get("dependsOn", []):
            visit(dependency["name"])
        ordered.append(by_name[name])

    for name in by_name:
        visit(name)
    return ordered


def test_the_flux_path_applies_from_an_empty_cluster(empty_cluster: ControlPlane, tmp_path: Path) -> None:
    """As Flux would: the entry file into flux-system, then each Kustomization's path in dependsOn
    order, and for a HelmRelease what the helm-controller installs (its namespace created, the
    chart's CRDs, the chart's objects). Every object is really created; none is a dry run."""
    cp = empty_cluster
    assert only_gitops_crds(cp)
    entry = FLUX / "kustomizations.yaml"
    apply(cp, "-f", str(entry))
    kustomizations = [d for d in documents(entry) if d["kind"] == "Kustomization"]
    order = [k["metadata"]["name"] for k in dependency_order(kustomizations)]
    assert order.index("kata-sizing") < order.index("kata-sizing-policies")
    for kustomization in dependency_order(kustomizations):
        path = ROOT / kustomization["spec"]["path"]
        for file in sorted(path.rglob("*.yaml")):
            apply(cp, "-f", str(file))
        for release in (o for o in objects(path) if o["kind"] == "HelmRelease" and "chart" in o["spec"]):
            spec = release["spec"]
            namespace = spec.get("targetNamespace", release["metadata"]["namespace"])
            if spec["install"].get("createNamespace"):
                ensure_namespace(cp, namespace)
            assert spec["chart"]["spec"]["chart"] == "./charts/kata-sizing"
            values = tmp_path / "values.yaml"
            values.write_text(yaml.safe_dump(spec.get("values") or {}))
            cp.kubectl("apply", "--server-side", "--field-manager=helm-controller", "-f", str(CHART_CRDS))
            cp.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
            poll(lambda: cp.kubectl("get", "ksp", check=False).returncode == 0, 30, "kubectl get ksp works")
            apply(cp, "-f", "-", input=helm_template(spec["releaseName"], str(CHART), "-n", namespace,
                                                        "-f", str(values)))
    # What Flux now holds, and the policy on the server.
    assert set(cp.items("/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations")) == {
        "kata-sizing", "kata-sizing-policies", "kata-deploy"}
    assert set(cp.items("/apis/helm.toolkit.fluxcd.io/v2/namespaces/flux-system/helmreleases")) == {"kata-sizing"}
    assert set(cp.items("/apis/helm.toolkit.fluxcd.io/v2/namespaces/kube-system/helmreleases")) == {"kata-deploy"}
    assert set(cp.items("/apis/source.toolkit.fluxcd.io/v1/namespaces/kube-system/ocirepositories")) == {"kata-deploy"}
    assert "qemu-rs" in cp.items(POLICIES)
    assert set(cp.items("/apis/apps/v1/namespaces/kata-sizing/deployments")) == {"kata-sizing"}


def test_the_old_flux_layout_is_what_an_empty_cluster_refuses(empty_cluster: ControlPlane) -> None:
    """The example this replaces put the operator's HelmRelease in kata-sizing, the namespace its
    own createNamespace was to create: on an empty cluster the API server refuses it."""
    release = next(o for o in objects(FLUX / "operator") if o["kind"] == "HelmRelease")
    release = {**release, "metadata": {**release["metadata"], "namespace": "kata-sizing-not-yet"}}
    result = apply(empty_cluster, "-f", "-", input=yaml.safe_dump(release), check=False)
    assert result.returncode != 0
    assert 'namespaces "kata-sizing-not-yet" not found' in result.stderr


# --- Argo CD ------------------------------------------------------------------------------------


def test_the_argo_cd_path_applies_from_an_empty_cluster(empty_cluster: ControlPlane, tmp_path: Path) -> None:
    """The health checks merged into an existing argocd-cm, the root Application, its Applications
    wave by wave, and what each one syncs (server-side dry runs: the Flux test created the same)."""
    cp = empty_cluster
    assert only_gitops_crds(cp)
    cp.kubectl("create", "configmap", "argocd-cm", "-n", "argocd", "--from-literal=url=https://argocd.example")
    cp.kubectl("patch", "configmap", "argocd-cm", "-n", "argocd", "--patch-file", str(ARGOCD / "argocd-cm.yaml"))
    data = json.loads(cp.kubectl("get", "configmap", "argocd-cm", "-n", "argocd", "-o", "json").stdout)["data"]
    assert data["url"] == "https://argocd.example"  # the install's own settings stay
    assert data["resource.customizations.health.katasizing.dev_KataSizingPolicy"] == \
        (HEALTH / "katasizingpolicy.lua").read_text()

    apply(cp, "-f", str(ARGOCD / "root.yaml"))
    applications = sorted(objects(ARGOCD / "apps"), key=wave)
    for application in applications:
        apply(cp, "-f", "-", input=yaml.safe_dump(application))
    stored = cp.items("/apis/argoproj.io/v1alpha1/namespaces/argocd/applications")
    assert set(stored) == {"kata-sizing-root", "kata-sizing", "kata-deploy", "kata-sizing-policies"}
    assert stored["kata-sizing-policies"]["spec"]["syncPolicy"]["retry"]["limit"] == 5

    operator = stored["kata-sizing"]["spec"]
    ensure_namespace(cp, operator["destination"]["namespace"])
    cp.kubectl("apply", "--server-side", "--field-manager=argocd-controller", "-f", str(CHART_CRDS))
    cp.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(operator["source"]["helm"]["valuesObject"]))
    rendered = helm_template("kata-sizing", str(CHART), "-n", operator["destination"]["namespace"], "-f", str(values))
    # Argo CD's server-side sync forces conflicts (the Flux test installed the same objects).
    apply(cp, "--dry-run=server", "--server-side", "--force-conflicts", "--field-manager=argocd-controller",
          "-f", "-", input=rendered)
    poll(lambda: cp.kubectl("get", "ksp", check=False).returncode == 0, 30, "kubectl get ksp works")
    apply(cp, "--dry-run=server", "-f", str(ROOT / stored["kata-sizing-policies"]["spec"]["source"]["path"]))


# --- without the operator: a team's render as the team's identity --------------------------------


def test_a_teams_render_applies_as_its_least_privilege_identity_on_an_empty_cluster(empty_cluster: ControlPlane) -> None:
    """As Flux applies examples/gitops/renders/flux.yaml: the platform's Kustomizations as Flux
    itself (the shared admission policies of manifests/admission/, the team's namespace and
    identity), then the team's committed render as the team's ServiceAccount, which Flux
    impersonates: each object read, every object dry-run server-side before any is applied (what
    Flux does), applied, judging the team's pods, and pruned; and nothing more is allowed."""
    cp = empty_cluster
    apply(cp, "-f", str(RENDERS / "flux.yaml"))
    apply(cp, "-k", str(ROOT / "manifests" / "admission"))
    apply(cp, "-k", str(RENDERS / "platform"))
    render = RENDERS / "team-a" / "team-a.yaml"
    team = "--as=system:serviceaccount:flux-system:kata-sizing-team-a"

    def as_team(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return cp.kubectl(*args, team, check=check, input=input)

    assert as_team("get", "--ignore-not-found", "-o", "name", "-f", str(render)).stdout == ""
    ssa = ("apply", "--server-side", "--field-manager=kustomize-controller")
    dry = as_team(*ssa, "--dry-run=server", "-f", str(render))
    assert dry.stdout.count("(server dry run)") == len(documents(render)) == 9, dry.stdout
    as_team(*ssa, "-f", str(render))
    too_big = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "too-big", "namespace": "team-a"},
               "spec": {"runtimeClassName": "kata-team-a-s", "containers": [{
                   "name": "c", "image": "registry.k8s.io/pause:3.10",
                   "resources": {"limits": {"cpu": "1", "memory": "3Gi"}}}]}}
    refused = poll(lambda: (lambda p: p if p.returncode != 0 else None)(cp.kubectl(
        "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(too_big), check=False)), 30,
        "the team's too-big pod refused")
    assert "ValidatingAdmissionPolicy 'kata-sizing-envelope-v1' with binding 'kata-sizing-team-a-envelope'" \
        in refused.stderr

    # Nothing beyond its render: another name, another namespace, the shared policies.
    for denied in (("create", "runtimeclasses/kata-team-b-s"), ("create", "configmaps", "-n", "kube-system"),
                   ("create", "validatingadmissionpolicybindings/kata-sizing-team-b-envelope"),
                   ("patch", "validatingadmissionpolicies/kata-sizing-envelope-v1"), ("list", "configmaps", "-n", "team-a")):
        assert as_team("auth", "can-i", *denied, check=False).stdout.strip() == "no", denied
    # A binding may name only parameters the identity may read: the API server checks it.
    binding = next(o for o in documents(render) if o["metadata"]["name"] == "kata-sizing-team-a-envelope")
    binding["spec"]["paramRef"]["name"] = "team-b-dropins"
    elsewhere = as_team(*ssa, "--dry-run=server", "-f", "-", input=yaml.safe_dump(binding), check=False)
    assert elsewhere.returncode != 0 and 'does not have "get" permission on the object referenced by paramRef' \
        in elsewhere.stderr, elsewhere.stderr

    # The team's prune: every object of its render, by the same identity.
    as_team("delete", "-f", str(render))
    assert cp.kubectl("get", "--ignore-not-found", "-o", "name", "-f", str(render)).stdout == ""
    assert cp.kubectl("get", "validatingadmissionpolicies", "-l", "katasizing.dev/shared=admission",
                      "-o", "name").stdout.split()  # the platform's stay


# --- the chart's optional objects ---------------------------------------------------------------


@pytest.mark.parametrize("values", [
    EVERYTHING_ON,
    [*EVERYTHING_ON, "--set", "webhook.certManager.issuerRef.kind=ClusterIssuer",
     "--set", "webhook.certManager.issuerRef.name=company-ca",
     "--set", "metrics.serviceMonitor.interval=1m", "--set", "metrics.serviceMonitor.labels.release=prometheus",
     "--set", "metrics.prometheusRule.labels.release=prometheus"],
    ["--set", "webhook.enabled=true", "--set", "webhook.certManager.enabled=false",
     "--set", "webhook.caBundle=Q0FCVU5ETEU=", "--set", "webhook.tlsSecretName=mine"],
], ids=["everything-on", "cluster-issuer", "own-ca"])
def test_every_chart_object_is_valid_on_the_real_server(monitoring_crds: ControlPlane, values: list[str]) -> None:
    """ServiceMonitor, PrometheusRule, Certificate and Issuer against their projects' CRDs, and
    everything else against the API server's own schemas."""
    cp = monitoring_crds
    ensure_namespace(cp, "kata-sizing")
    rendered = helm_template("kata-sizing", str(CHART), "-n", "kata-sizing", *values)
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered) if d}
    if "--set" in values and "metrics.serviceMonitor.enabled=true" in values:
        assert {"ServiceMonitor", "PrometheusRule", "Certificate"} <= kinds
    result = apply(cp, "--dry-run=server", "-f", "-", input=rendered)
    assert "(server dry run)" in result.stdout


def test_output_namespaces_limit_the_operators_configmap_writes_on_the_real_authorizer(
        empty_cluster: ControlPlane) -> None:
    """The chart's rbac.outputNamespaces, its RBAC objects created and asked (`kubectl auth
    can-i` as the operator's ServiceAccount): ConfigMap writes in the listed namespaces only,
    reads everywhere (the cache, and the paramKind check on creating a shared admission policy)."""
    cp = empty_cluster
    for namespace in ("scoped", "scoped-out"):
        ensure_namespace(cp, namespace)
    rendered = helm_template("scoped", str(CHART), "-n", "scoped", "--set", "rbac.outputNamespaces={scoped-out}",
                             "--set", "admissionPolicies.create=false")
    rbac = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in
            ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    apply(cp, "-f", "-", input=yaml.safe_dump_all(rbac))
    operator = "--as=system:serviceaccount:scoped:scoped-kata-sizing"

    def can(*args: str) -> str:
        return cp.kubectl("auth", "can-i", *args, operator, check=False).stdout.strip()
    assert [can(verb, "configmaps", "-n", "scoped-out") for verb in ("create", "update", "delete")] == ["yes"] * 3
    assert [can(verb, "configmaps", "-n", "kube-system") for verb in ("create", "update", "delete")] == ["no"] * 3
    assert [can(verb, "configmaps", "-A") for verb in ("get", "list", "watch")] == ["yes"] * 3


def test_names_go_yaml_would_misread_are_accepted_by_the_server(monitoring_crds: ControlPlane) -> None:
    """Release `y` in namespace `n`, with values `on`, `yes`, `off`: every object the server takes."""
    cp = monitoring_crds
    ensure_namespace(cp, "n")
    rendered = helm_template("y", str(CHART), "-n", "n", *EVERYTHING_ON, "--set", "serviceAccount.name=on",
                             "--set", "priorityClassName=yes", "--set", "metrics.prometheusRule.severity=off")
    result = apply(cp, "--dry-run=server", "-f", "-", input=rendered)
    assert 'serviceaccount/on created (server dry run)' in result.stdout


# --- the Argo CD health check on what the operator really writes -------------------------------


def read(cp: ControlPlane, name: str) -> dict:
    """The policy as Argo CD reads it from the API server."""
    return json.loads(cp.kubectl("get", "ksp", name, "-o", "json").stdout)


def settled(cp: ControlPlane, name: str, ready: str) -> dict:
    def done() -> bool:
        body = cp.get(f"{POLICIES}/{name}") or {}
        st = body.get("status") or {}
        found = {c["type"]: c["status"] for c in st.get("conditions") or []}
        return st.get("observedGeneration") == body["metadata"]["generation"] and found.get("Ready") == ready
    poll(done, 30, lambda: f"status of {name}: {(cp.get(f'{POLICIES}/{name}') or {}).get('status')}")
    return read(cp, name)


def test_the_health_check_reads_the_status_the_operator_writes(control_plane: ControlPlane,
                                                               real_operator: RealOperator) -> None:
    from tests.support.policies import explicit_classes_policy

    cp = control_plane
    healthy = explicit_classes_policy("argo-healthy")
    waiting = explicit_classes_policy("argo-waiting")
    waiting["spec"]["runtimeClass"]["managedBy"] = "KataDeploy"
    invalid = explicit_classes_policy("argo-invalid")
    invalid["spec"]["classes"][0].update(overheadMemory="512Mi", podFixed={"cpu": "2", "memory": "256Mi"})

    cp.apply(healthy, waiting, invalid)
    assert health(HEALTH / "katasizingpolicy.lua", read(cp, "argo-healthy"))["status"] == "Progressing"
    real_operator.start()

    result = health(HEALTH / "katasizingpolicy.lua", settled(cp, "argo-healthy", "True"))
    assert result == {"status": "Healthy", "message": "InSync"}

    result = health(HEALTH / "katasizingpolicy.lua", settled(cp, "argo-waiting", "False"))
    assert result["status"] == "Progressing"
    assert result["message"].startswith("RuntimeClassMissing: kata-deploy has not created RuntimeClass kata-argo-waiting-s")

    invalid_now = settled(cp, "argo-invalid", "False")
    result = health(HEALTH / "katasizingpolicy.lua", invalid_now)
    assert result["status"] == "Degraded"
    # Why it is invalid (the Valid condition's message), not only that it is.
    valid = next(c for c in invalid_now["status"]["conditions"] if c["type"] == "Valid")
    assert result["message"] == f"PolicyInvalid: {valid['message']}" and "podFixed" in valid["message"]

    # A change the operator has not seen yet (it is stopped): back to Progressing.
    real_operator.stop()
    cp.merge_patch(f"{POLICIES}/argo-healthy", {"spec": {"driftPolicy": "Report"}})
    body = read(cp, "argo-healthy")
    assert body["metadata"]["generation"] == body["status"]["observedGeneration"] + 1
    result = health(HEALTH / "katasizingpolicy.lua", body)
    assert result == {"status": "Progressing", "message":
                      f"waiting for the kata-sizing operator to reconcile generation {body['metadata']['generation']}"}


def test_the_application_health_check_reads_what_the_application_crd_holds(empty_cluster: ControlPlane) -> None:
    """An Application whose status says Degraded, stored through the real Application CRD."""
    cp = empty_cluster
    application = next(o for o in objects(ARGOCD / "apps") if o["metadata"]["name"] == "kata-sizing-policies")
    application = {**application, "metadata": {"name": "health-probe", "namespace": "argocd"},
                   "status": {"health": {"status": "Degraded", "message": "KataSizingPolicy qemu-rs is Degraded"}}}
    apply(cp, "-f", "-", input=yaml.safe_dump(application))
    stored = cp.read("/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/health-probe")
    assert health(HEALTH / "application.lua", stored) == {
        "status": "Degraded", "message": "KataSizingPolicy qemu-rs is Degraded"}
