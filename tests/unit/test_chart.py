"""The Helm chart (charts/kata-sizing/) with the real helm binary: it lints, every object it
renders is valid for Kubernetes, it installs the same objects as `kubectl apply -k manifests/`
(and, with the webhook, as overlays/webhook/), and its values do what values.yaml says."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from kata_sizing.controller import metrics
from tests.support.chart import CHART, EVERYTHING_ON, find_tool
from tests.support.paths import ROOT

RELEASE, NAMESPACE = "kata-sizing", "kata-sizing"
SCHEMA_VERSIONS = ("1.25", ".".join(kubernetes_validate.latest_version().split(".")[:2]))
# Labels the chart adds to what manifests/ has, as every Helm chart does.
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
               "app.kubernetes.io/version"}
# Groups kubernetes-validate has no schema for (the Prometheus Operator's, cert-manager's).
CUSTOM_GROUPS = ("monitoring.coreos.com", "cert-manager.io")
# The alerts read what the ServiceMonitor makes Prometheus scrape: the chart refuses one without the other.
ALERTS = ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true"]


@pytest.fixture(scope="module")
def helm() -> str:
    found = find_tool("helm")
    if found is None:
        pytest.skip("helm not at .tools/helm nor on PATH (run `make tools`)")
    return found


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60, check=False)


def template(helm: str, *args: str) -> list[dict]:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def kustomize(path: Path) -> list[dict]:
    kubectl = find_tool("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not at .tools/kubectl nor on PATH (run `make tools`)")
    result = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def without_helm_labels(obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    labels = obj["metadata"].get("labels") or {}
    if labels.get("app.kubernetes.io/managed-by") == "Helm":  # the shared admission policies say kata-sizing
        for key in HELM_LABELS:
            labels.pop(key, None)
    return obj


def by_key(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def one(objects: list[dict], kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


@pytest.fixture(scope="module")
def default_objects(helm: str) -> list[dict]:
    return template(helm)


@pytest.fixture(scope="module")
def all_objects(helm: str) -> list[dict]:
    return template(helm, "--include-crds", *EVERYTHING_ON)


# --- helm itself ------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [[], EVERYTHING_ON, ["--set", "logFormat=json", "--set",
                                                        "webhook.enabled=true", "--set",
                                                        "webhook.certManager.enabled=false",
                                                        "--set", "webhook.caBundle=Zm9v",
                                                        "--set", "webhook.tlsSecretName=mine"]],
                         ids=["defaults", "everything-on", "webhook-with-own-ca"])
def test_helm_lint_strict_passes(helm: str, values: list[str]) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), *values)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_chart_and_app_version_follow_the_project(default_objects: list[dict]) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    with (ROOT / "pyproject.toml").open("rb") as stream:
        version = tomllib.load(stream)["project"]["version"]
    assert chart["version"] == chart["appVersion"] == version
    container = one(default_objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"ghcr.io/kata-sizing/kata-sizing:{version}"


def test_the_charts_crd_is_the_generated_one() -> None:
    # Helm installs crds/ before the templates; `make crds` writes both copies.
    assert (CHART / "crds" / "katasizingpolicies.katasizing.dev.yaml").read_text() == \
        (ROOT / "crds" / "katasizingpolicies.katasizing.dev.yaml").read_text(), "stale: run `make crds`"


# --- every object valid -----------------------------------------------------------------------


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_rendered_object_is_valid_for_kubernetes(helm: str, version: str) -> None:
    checked, problems = 0, []
    for obj in template(helm, "--include-crds", "--kube-version", version, *EVERYTHING_ON):
        if obj["apiVersion"].split("/")[0] in CUSTOM_GROUPS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
            checked += 1
        except kubernetes_validate.ValidationError as error:
            problems.append(f"{obj['kind']} {obj['metadata']['name']}: {error.message} at {list(error.path)}")
    assert not problems, "\n".join(problems)
    assert checked >= 11  # CRD, Namespace, ServiceAccount, 3 ClusterRoles, binding, Deployment, 2 Services, webhook


def test_custom_resources_have_the_fields_their_operators_need(all_objects: list[dict]) -> None:
    # No schema for these in kubernetes-validate: check the keys that matter.
    monitor = one(all_objects, "ServiceMonitor")
    service = by_key(all_objects)["Service", "kata-sizing-metrics"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    certificate = one(all_objects, "Certificate")
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": one(all_objects, "Issuer")["metadata"]["name"]}
    assert "kata-sizing-webhook.kata-sizing.svc" in certificate["spec"]["dnsNames"]


def test_the_drift_alert_uses_a_metric_the_operator_exports(helm: str) -> None:
    objects = template(helm, *ALERTS,
                       "--set", "metrics.prometheusRule.driftCorrectionsPerHour=7")
    rules = {r["alert"]: r for g in one(objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    drift = rules["KataSizingDriftFought"]
    assert "increase(kata_sizing_drift_corrected_total[1h])" in drift["expr"]
    assert drift["expr"].endswith("> 7")
    assert "{{ $labels.kind }}" in drift["annotations"]["summary"]  # left for Prometheus to fill in
    exported = {m.name for m in metrics.REGISTRY.collect()}
    assert "kata_sizing_drift_corrected" in exported  # Counter family name, without _total
    assert "kata_sizing_policies" in exported
    assert 'kata_sizing_policies{condition="Ready",status="False"}' in rules["KataSizingPolicyNotReady"]["expr"]


# --- the same install as manifests/ -----------------------------------------------------------


def test_the_chart_installs_the_same_objects_as_manifests(helm: str) -> None:
    chart = by_key([without_helm_labels(o) for o in template(helm, "--include-crds", "--set", "namespace.create=true")])
    base = by_key(kustomize(ROOT / "manifests"))
    assert sorted(chart) == sorted(base)
    for key, obj in base.items():
        assert chart[key] == obj, f"{key} differs between the chart and manifests/"


VAP, MAP = "ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"
VAPB, MAPB = VAP + "Binding", MAP + "Binding"  # the keep-alive bindings (docs/admission.md)


@pytest.mark.parametrize("args, kinds", [
    (["--kube-version", "1.37.0"], [MAP, MAPB, VAP, VAP, VAPB, VAPB]),
    (["--kube-version", "1.35.0"], [VAP, VAP, VAPB, VAPB]),  # no MutatingAdmissionPolicy in v1 before 1.36
    (["--kube-version", "1.29.0"], []),
    # What discovery says wins over the version (helm install, Flux, Argo CD's --api-versions).
    (["--kube-version", "1.35.0", "--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",
      "--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicyBinding"],
     [MAP, MAPB, VAP, VAP, VAPB, VAPB]),
    (["--kube-version", "1.37.0", "--set", "admissionPolicies.create=false"], []),
], ids=["1.37", "1.35", "1.29", "served-by-discovery", "owned-elsewhere"])
def test_the_chart_creates_the_shared_admission_policies_the_server_serves(helm: str, args: list[str],
                                                                          kinds: list[str]) -> None:
    objects = [o for o in template(helm, *args) if o["kind"] in (VAP, MAP, VAPB, MAPB)]
    assert sorted(o["kind"] for o in objects) == kinds
    # As `kata-sizing render --shared` prints them (an install and upgrade add Helm's own marks).
    shared = by_key(list(yaml.safe_load_all((CHART / "files" / "admission-policies.yaml").read_text())))
    for obj in objects:
        assert obj == shared[obj["kind"], obj["metadata"]["name"]]


def notes(helm: str, *args: str) -> str:
    result = run_helm(helm, "install", "--dry-run=client", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.partition("NOTES:\n")[2]


def test_the_notes_name_the_shared_admission_policies_and_how_to_uninstall(helm: str) -> None:
    # The objects templates/admission-policies.yaml creates (one helper decides), here those of
    # Helm's own Kubernetes version (1.36 and later: all three).
    text = notes(helm)
    assert ("  ValidatingAdmissionPolicy kata-sizing-memory-limit-v1\n  ValidatingAdmissionPolicy kata-sizing-envelope-v1\n"
            "  MutatingAdmissionPolicy kata-sizing-route-v1\n") in text
    assert f"helm uninstall {RELEASE} -n {NAMESPACE}" in text
    assert "  ValidatingAdmissionPolicyBinding kata-sizing-envelope-v1-keep-alive\n" in text
    assert ("kubectl delete validatingadmissionpolicies,mutatingadmissionpolicies,validatingadmissionpolicybindings,"
            "mutatingadmissionpolicybindings -l katasizing.dev/shared=admission") in text
    assert f"kubectl -n {NAMESPACE} delete lease kata-sizing" in text  # helm uninstall leaves it
    assert "kata-sizing-envelope-v1" not in notes(helm, "--set", "admissionPolicies.create=false")


def test_configmap_writes_can_be_limited_to_the_output_namespaces(helm: str) -> None:
    def rules(objects: list[dict], kind: str, name: str) -> set[tuple[str, str]]:
        return {(resource, verb) for o in objects if o["kind"] == kind and o["metadata"]["name"] == name
                for rule in o["rules"] for resource in rule["resources"] for verb in rule["verbs"]}

    everywhere = template(helm)
    assert {("configmaps", v) for v in ("create", "update", "delete")} <= rules(everywhere, "ClusterRole", "kata-sizing")
    assert not [o for o in everywhere if o["metadata"]["name"] == "kata-sizing-output"]
    scoped = template(helm, "--set", "rbac.outputNamespaces={kata-sizing,kube-system}")
    configmaps = {v for r, v in rules(scoped, "ClusterRole", "kata-sizing") if r == "configmaps"}
    assert configmaps == {"get", "list", "watch"}
    roles = [o for o in scoped if o["kind"] == "Role" and o["metadata"]["name"] == "kata-sizing-output"]
    assert [r["metadata"]["namespace"] for r in roles] == ["kata-sizing", "kube-system"]
    assert all(rules([r], "Role", "kata-sizing-output") == {("configmaps", v) for v in ("create", "update", "delete")}
               for r in roles)
    bindings = [o for o in scoped if o["kind"] == "RoleBinding" and o["metadata"]["name"] == "kata-sizing-output"]
    assert [b["subjects"] for b in bindings] == [[{"kind": "ServiceAccount", "name": "kata-sizing",
                                                   "namespace": NAMESPACE}]] * 2
    result = run_helm(helm, "template", RELEASE, str(CHART), "--set", "rbac.outputNamespaces={Kube_System}")
    assert result.returncode != 0 and "outputNamespaces" in result.stderr


def test_with_the_webhook_the_chart_installs_the_same_objects_as_the_overlay(helm: str) -> None:
    chart = by_key([without_helm_labels(o) for o in template(
        helm, "--include-crds", "--set", "namespace.create=true", "--set", "webhook.enabled=true")])
    overlay = by_key(kustomize(ROOT / "overlays" / "webhook"))
    assert sorted(chart) == sorted(overlay)
    for key, obj in overlay.items():
        assert chart[key] == obj, f"{key} differs between the chart and overlays/webhook/"


def test_with_kubelet_access_through_the_api_server_the_chart_installs_the_overlay(helm: str) -> None:
    chart = by_key([without_helm_labels(o) for o in template(
        helm, "--include-crds", "--set", "namespace.create=true", "--set", "measurement.kubeletAccess=apiserver")])
    overlay = by_key(kustomize(ROOT / "overlays" / "kubelet-via-apiserver"))
    assert sorted(chart) == sorted(overlay)
    for key, obj in overlay.items():
        assert chart[key] == obj, f"{key} differs between the chart and overlays/kubelet-via-apiserver/"
    rules = [r for r in overlay["ClusterRole", "kata-sizing"]["rules"] if any(x.startswith("nodes/") for x in r["resources"])]
    assert rules == [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]


def test_kubelet_tls_verification_can_be_skipped_for_self_signed_kubelets(helm: str) -> None:
    container = one(template(helm, "--set", "measurement.kubeletInsecureSkipTLSVerify=true"),
                    "Deployment")["spec"]["template"]["spec"]["containers"][0]
    from kata_sizing.cli import build_parser

    args = build_parser().parse_args(container["args"])
    assert (args.kubelet_access, args.kubelet_insecure_skip_tls_verify) == ("direct", True)


def test_without_create_the_namespace_is_helms_to_make(default_objects: list[dict]) -> None:
    assert "Namespace" not in {o["kind"] for o in default_objects}
    assert {o["metadata"].get("namespace") for o in default_objects if o["kind"] in
            ("Deployment", "ServiceAccount", "Service")} == {NAMESPACE}


# --- values -----------------------------------------------------------------------------------


def test_values_reach_the_deployment(helm: str) -> None:
    objects = template(
        helm, "--namespace", "ops",
        "--set", "image.repository=registry.example/kata-sizing",
        "--set", "image.digest=sha256:" + "a" * 64,
        "--set", "logFormat=json",
        "--set", "resources.limits.memory=512Mi",
        "--set-string", "nodeSelector.node-role\\.kubernetes\\.io/control-plane=",
        "--set", "tolerations[0].key=node-role.kubernetes.io/control-plane",
        "--set", "tolerations[0].operator=Exists",
        "--set", "tolerations[0].effect=NoSchedule",
    )
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry.example/kata-sizing@sha256:" + "a" * 64
    assert "--log-format=json" in container["args"]
    assert container["resources"]["limits"]["memory"] == "512Mi"
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert pod["tolerations"] == [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                                   "effect": "NoSchedule"}]
    # --namespace moves every namespaced object and the binding's subject.
    assert deployment["metadata"]["namespace"] == "ops"
    assert one(objects, "ClusterRoleBinding")["subjects"][0]["namespace"] == "ops"


def test_the_deployments_args_parse_with_the_real_cli(helm: str) -> None:
    from kata_sizing.cli import build_parser

    container = one(template(helm, "--set", "webhook.enabled=true", "--set", "logFormat=json"),
                    "Deployment")["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (args.metrics_port, args.webhook_port, args.log_format) == (ports["metrics"], ports["webhook"], "json")


@pytest.mark.parametrize(("kube_version", "reviewed_only_on_spec_change"), [("1.27", False), ("1.28", True),
                                                                          ("1.37", True)])
def test_the_webhook_is_called_only_for_spec_changes_where_the_server_can_say_so(
        helm: str, kube_version: str, reviewed_only_on_spec_change: bool) -> None:
    """Metadata changes (labels, an older operator's finalizer removed) must not wait for the webhook
    (on the real node kopf's patches failed with 500 until its Service answered): matchConditions,
    from 1.28."""
    (hook,) = one(template(helm, "--kube-version", kube_version, *EVERYTHING_ON),
                  "ValidatingWebhookConfiguration")["webhooks"]
    conditions = hook.get("matchConditions")
    assert bool(conditions) is reviewed_only_on_spec_change
    if conditions:
        assert conditions == yaml.safe_load((ROOT / "overlays/webhook/validatingwebhookconfiguration.yaml").read_text())[
            "webhooks"][0]["matchConditions"]


@pytest.mark.parametrize("kube_version", ["1.27", "1.37"])
def test_the_routing_webhook_is_called_only_for_pods_it_could_route(helm: str, kube_version: str) -> None:
    """A pod that names its class never reaches the webhook where the server can say so (the
    MutatingAdmissionPolicy's own match condition, one text); webhook.routeNamespaceSelector narrows
    both webhooks to the policies' namespaces, on top of the opt-in label."""
    from kata_sizing.core.podfit import shared_admission_specs

    (mutating,) = [spec for _, kind, _, spec in shared_admission_specs() if kind == "MutatingAdmissionPolicy"]
    selector = {"matchLabels": {"kata": "yes"}, "matchExpressions": [{"key": "tier", "operator": "NotIn",
                                                                       "values": ["system"]}]}
    values = ["--set-json", f"webhook.routeNamespaceSelector={json.dumps(selector)}"]
    hooks = {h["name"]: h for h in one(template(helm, "--kube-version", kube_version, *EVERYTHING_ON, *values),
                                       "MutatingWebhookConfiguration")["webhooks"]}
    for hook in hooks.values():
        if kube_version == "1.27":
            assert "matchConditions" not in hook
        else:
            assert hook["matchConditions"] == mutating["matchConditions"]
    assert hooks["route-pod.katasizing.dev"]["namespaceSelector"] == selector
    assert hooks["route-namespace-pod.katasizing.dev"]["namespaceSelector"] == {
        "matchLabels": {"kata": "yes"},
        "matchExpressions": [{"key": "katasizing.dev/policy", "operator": "Exists"}, *selector["matchExpressions"]]}
    # The default: every namespace (as overlays/webhook/).
    default = {h["name"]: h for h in one(template(helm, *EVERYTHING_ON), "MutatingWebhookConfiguration")["webhooks"]}
    assert "namespaceSelector" not in default["route-pod.katasizing.dev"]


@pytest.mark.parametrize(("values", "drain"), [
    ([], 5), (["--set", "webhook.drainSeconds=12"], 12), (["--set", "webhook.drainSeconds=0"], None)])
def test_a_stopping_replica_answers_reviews_until_it_is_out_of_the_service(
        helm: str, values: list[str], drain: int | None) -> None:
    """With the webhook, a replica keeps answering reviews for webhook.drainSeconds after its
    SIGTERM and has kopf's 30 s of stopping after that; 0: neither."""
    pod = one(template(helm, *EVERYTHING_ON, *values), "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    drains = [arg for arg in container["args"] if arg.startswith("--webhook-drain-seconds")]
    if drain is None:
        assert not drains and "terminationGracePeriodSeconds" not in pod
    else:
        assert drains == [f"--webhook-drain-seconds={drain}"]
        assert pod["terminationGracePeriodSeconds"] == drain + 30
    without = one(template(helm, *values), "Deployment")["spec"]["template"]["spec"]
    assert "terminationGracePeriodSeconds" not in without  # no webhook: nothing to keep answering
    assert not any(arg.startswith("--webhook") for arg in without["containers"][0]["args"])


def test_a_webhook_with_its_own_ca_needs_no_cert_manager(helm: str) -> None:
    objects = template(helm, "--set", "webhook.enabled=true", "--set", "webhook.certManager.enabled=false",
                       "--set", "webhook.caBundle=Q0FCVU5ETEU=", "--set", "webhook.tlsSecretName=my-tls")
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"Certificate", "Issuer"}
    configuration = one(objects, "ValidatingWebhookConfiguration")
    assert "cert-manager.io/inject-ca-from" not in (configuration["metadata"].get("annotations") or {})
    assert configuration["webhooks"][0]["clientConfig"]["caBundle"] == "Q0FCVU5ETEU="
    volumes = one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-tls", "secret": {"secretName": "my-tls"}} in volumes


@pytest.mark.parametrize("values, message", [
    # values.schema.json: each value's own type and range, named by its path.
    (["--set", "replcas=3"], "additional properties 'replcas' not allowed"),
    (["--set", "replicas=0"], "at '/replicas': minimum: got 0, want 1"),
    (["--set", "logFormat=xml"], "at '/logFormat'"),
    (["--set", "metrics.port=0"], "at '/metrics/port': minimum: got 0, want 1"),
    (["--set", "metrics.serviceMonitor.interval=30 seconds"], "at '/metrics/serviceMonitor/interval'"),
    (["--set", "webhook.timeoutSeconds=60"], "at '/webhook/timeoutSeconds': maximum: got 60, want 30"),
    (["--set", "webhook.failurePolicy=fail"], "at '/webhook/failurePolicy'"),
    (["--set", "webhook.certManager.issuerRef.nmae=ca"], "additional properties 'nmae' not allowed"),
    (["--set", "image.digest=sha256:abc"], "at '/image/digest'"),
    (["--set-string", "replicas=2"], "at '/replicas': got string, want integer"),
    (["--set", "measurement.kubeletAccess=proxy"], "at '/measurement/kubeletAccess'"),
    (["--set-string", "measurement.kubeletInsecureSkipTLSVerify=yes"], "at '/measurement/kubeletInsecureSkipTLSVerify'"),
    # The templates: rules across values.
    (["--set", "webhook.enabled=true", "--set", "webhook.certManager.enabled=false"],
     "webhook.caBundle is required"),
    (["--set", "webhook.enabled=true", "--set", "webhook.certManager.enabled=false", "--set",
      "webhook.caBundle=Zm9v"], "webhook.tlsSecretName is required"),
    (["--set", "webhook.enabled=true", "--set", "replicas=1"],
     "replicas: at least 2 with webhook.failurePolicy Fail"),
    (["--set", "healthPort=8081"], "healthPort: 8081 is metrics.port too"),
    (["--set", "metrics.port=8080"], "healthPort: 8080 is metrics.port too"),
    (["--set", "webhook.enabled=true", "--set", "webhook.port=8081"], "webhook.port: 8081 is healthPort or metrics.port"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v[1::2]))
def test_bad_values_fail_with_a_message_naming_the_value(helm: str, values: list[str], message: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART), *values)
    assert result.returncode != 0
    assert message in result.stderr
    assert "panic" not in result.stderr


def test_helm_lint_refuses_what_install_would_refuse(helm: str) -> None:
    """Before the schema, a misspelt key was silently dropped and a port of 0 passed lint."""
    for values in (["--set", "replcas=3"], ["--set", "healthPort=0"]):
        result = run_helm(helm, "lint", "--strict", str(CHART), *values)
        assert result.returncode != 0, values
        assert "don't meet the specifications of the schema" in result.stdout + result.stderr


def test_every_default_value_has_a_schema() -> None:
    """additionalProperties: false wherever the chart owns the keys, and every key of values.yaml
    declared: the schema and values.yaml cannot drift apart."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value: object, node: dict, path: str) -> None:
        node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else node
        if isinstance(value, dict) and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path or '/'} admits any key"
            for key, inner in value.items():
                assert key in node["properties"], f"{path}/{key} is not in values.schema.json"
                walk(inner, node["properties"][key], f"{path}/{key}")

    walk(values, schema, "")


# --- replicas: spreading and the disruption budget --------------------------------------------


def test_two_replicas_spread_over_nodes_and_drain_one_at_a_time(default_objects: list[dict]) -> None:
    deployment = one(default_objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    [spread] = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["maxSkew"] == 1
    # ScheduleAnyway: a one-node cluster still runs both replicas.
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    budget = one(default_objects, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_one_replica_has_no_budget_that_would_block_a_drain(helm: str) -> None:
    objects = template(helm, "--set", "replicas=1")
    assert "PodDisruptionBudget" not in {o["kind"] for o in objects}
    assert "topologySpreadConstraints" not in one(objects, "Deployment")["spec"]["template"]["spec"]
    # A webhook that lets unchecked policies through may run on one replica.
    template(helm, "--set", "replicas=1", "--set", "webhook.enabled=true", "--set", "webhook.failurePolicy=Ignore")


def test_own_spreading_replaces_the_default(helm: str) -> None:
    zone = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "kata-sizing"}}}
    values = {"topologySpreadConstraints": [zone]}
    objects = template(helm, "--set-json", f"topologySpreadConstraints={json.dumps(values['topologySpreadConstraints'])}")
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["topologySpreadConstraints"] == [zone]


# --- alerts -------------------------------------------------------------------------------------


def alerts(objects: list[dict]) -> dict[str, dict]:
    return {r["alert"]: r for g in one(objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}


def test_every_alert_links_a_runbook_section_that_exists(helm: str) -> None:
    from tests.support.markdown import anchors

    rules = alerts(template(helm, *ALERTS))
    assert set(rules) == {"KataSizingOperatorDown", "KataSizingDriftFought", "KataSizingPolicyNotReady",
                          "KataSizingPodHeadroomLow", "KataSizingTaskFailing"}
    sections = anchors((ROOT / "docs" / "operation.md").read_text())
    for name, rule in rules.items():
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        # The main branch: no release is tagged yet (docs/operation.md#alerts).
        assert page == "https://github.com/kata-sizing/kata-sizing/blob/main/docs/operation.md"
        assert anchor == name.lower() and anchor in sections, url
    moved = alerts(template(helm, *ALERTS,
                            "--set", "metrics.prometheusRule.runbookBaseURL=https://wiki.example/kata-sizing"))
    assert {r["annotations"]["runbook_url"] for r in moved.values()} == {
        f"https://wiki.example/kata-sizing#{name.lower()}" for name in rules}


def test_the_alerts_are_refused_without_the_scrape_they_read(helm: str) -> None:
    result = run_helm(helm, "template", RELEASE, str(CHART), "--set", "metrics.prometheusRule.enabled=true")
    assert result.returncode != 0
    assert "metrics.prometheusRule.enabled needs metrics.serviceMonitor.enabled" in result.stderr


def test_the_headroom_alert_reads_the_gauge_the_measurement_exports(helm: str) -> None:
    rule = alerts(template(helm, *ALERTS))["KataSizingPodHeadroomLow"]
    assert rule["expr"] == "sum by (policy, class) (kata_sizing_pods_headroom_low) > 0"
    assert "{{ $labels.policy }}" in rule["annotations"]["summary"]  # left for Prometheus to fill in
    assert "kata_sizing_pods_headroom_low" in {m.name for m in metrics.REGISTRY.collect()}


def test_the_operator_down_alert_looks_for_a_gauge_every_running_replica_exports(helm: str) -> None:
    rule = alerts(template(helm, "--namespace", "ops", *ALERTS))[
        "KataSizingOperatorDown"]
    assert rule["expr"] == 'absent(kata_sizing_informer_objects{namespace="ops"})'
    assert "kata_sizing_informer_objects" in {m.name for m in metrics.REGISTRY.collect()}


# --- what Go reads ------------------------------------------------------------------------------


def test_names_and_values_go_yaml_would_misread_stay_strings(helm: str) -> None:
    """A release `y` in namespace `n`, and values such as `on` or `yes`: kubectl (go-yaml, YAML 1.1)
    reads every object exactly as PyYAML does, each such string a string."""
    kubectl = find_tool("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not at .tools/kubectl nor on PATH (run `make tools`)")
    result = run_helm(helm, "template", "y", str(CHART), "--namespace", "n", *EVERYTHING_ON,
                      "--set", "serviceAccount.name=on", "--set", "priorityClassName=yes",
                      "--set", "metrics.prometheusRule.severity=off", "--set", "image.tag=1e3",
                      "--set", "metrics.serviceMonitor.labels.release=y")
    assert result.returncode == 0, result.stderr
    # kubectl's local mode decodes each object as the API server would (go-yaml, YAML 1.1: a
    # bare y, n, on, yes or 1e3 is no string), needs no server, and prints what it read.
    read_by_go = subprocess.run(
        [kubectl, "label", "--local", "-f", "-", "-o", "json", "kata-sizing.test/read=go"],
        input=result.stdout, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "KUBECONFIG": os.devnull})
    assert read_by_go.returncode == 0, read_by_go.stderr
    go_objects, decoder, text = [], json.JSONDecoder(), read_by_go.stdout.strip()
    while text:
        obj, end = decoder.raw_decode(text)
        del obj["metadata"]["labels"]["kata-sizing.test/read"]
        go_objects.append(obj)
        text = text[end:].strip()
    py_objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    assert by_key(go_objects) == by_key(py_objects)
    deployment = one(go_objects, "Deployment")
    assert deployment["metadata"]["namespace"] == "n"
    assert deployment["metadata"]["labels"]["app.kubernetes.io/instance"] == "y"
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "on"
    assert deployment["spec"]["template"]["spec"]["priorityClassName"] == "yes"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":1e3")
    assert {r["labels"]["severity"] for r in alerts(go_objects).values()} == {"off"}


def test_aggregated_roles_can_be_turned_off(helm: str) -> None:
    names = {o["metadata"]["name"] for o in template(helm, "--set", "rbac.aggregateToDefaultRoles=false")
             if o["kind"] == "ClusterRole"}
    assert names == {"kata-sizing"}


def test_the_task_failure_alert_reads_the_counter_every_background_task_has_from_its_start(helm: str) -> None:
    rule = alerts(template(helm, *ALERTS))["KataSizingTaskFailing"]
    assert rule["expr"] == "sum by (task) (increase(kata_sizing_task_failures_total[1h])) > 0"
    assert "{{ $labels.task }}" in rule["annotations"]["summary"]  # left for Prometheus to fill in
    metrics.track_task("guidance-check")  # as retry.keep_running does when the task starts
    assert metrics.REGISTRY.get_sample_value("kata_sizing_task_failures_total", {"task": "guidance-check"}) is not None
