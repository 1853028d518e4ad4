"""The optional validating admission webhook: the rules it applies (`admission`), the
`operator --webhook-*` flags, the overlay overlays/webhook/ (real kubectl kustomize, strict
schemas, wiring between its objects), and AdmissionReviews posted over HTTPS to the real
operator running against the emulator."""

from __future__ import annotations

import copy
import json
import subprocess
import urllib.error
import urllib.request
from collections import Counter

import kopf
import kubernetes_validate
import pytest
import yaml

from kata_sizing import cli
from kata_sizing.controller import operator_main
from kata_sizing.controller.handlers import build_registry
from kata_sizing.controller.operator_main import WebhookOptions
from kata_sizing.controller.policy_webhook import VALIDATE_HANDLER_ID, admission_problems, needs_review
from kata_sizing.core.model import GROUP, PLURAL, VERSION
from tests.support.manifests import (
    ADMISSION_SERVED_FROM,
    CRD_FILE,
    EXPECTED_KINDS,
    MANIFESTS,
    SCHEMA_VERSIONS,
    find_kubectl,
    granted_permissions,
    load_documents,
    request_triple,
)
from tests.support.operator_helpers import POLICIES, wait_observed
from tests.support.paths import ROOT
from tests.support.policies import example
from tests.support.realcluster import free_port
from tests.support.webhook import Webhook, invalid_body, write_kubeconfig, write_self_signed_cert

OVERLAY = ROOT / "overlays" / "webhook"
CERT_MANAGER_GROUP = "cert-manager.io"
WEBHOOK_KINDS = Counter({"Service": 1, "Issuer": 1, "Certificate": 1, "ValidatingWebhookConfiguration": 1,
                         "MutatingWebhookConfiguration": 1})


def bad_quantity_body() -> dict:
    body = example()
    body["spec"]["nodes"]["systemReserved"] = "lots"
    return body


# ---- the rules (admission.py) ----


def test_a_valid_policy_has_no_problems() -> None:
    assert admission_problems(example()) == ([], [])


def test_every_broken_rule_is_an_error_naming_class_values_and_rule() -> None:
    errors, _ = admission_problems(invalid_body())
    assert errors == [
        "spec.classes[0] (s): podFixed.memory 64Mi must be above overhead_memory 96Mi: "
        "podFixed covers the guest side (overhead_memory) plus the host side",
        "spec.classes[0] (s): podFixed.cpu 100m must be above overhead_vcpus 0.2: "
        "podFixed covers the guest side (overhead_vcpus) plus the host side",
    ]


def test_the_under_accounting_rule_is_a_warning_not_an_error() -> None:
    errors, warnings = admission_problems(example("measured-classes"))
    assert errors == []
    (warning,) = warnings
    assert warning.startswith("spec.classes[1] (m): podFixed.memory 160Mi is below default_memory 1Gi")
    assert "under-accounted" in warning


def test_malformed_fields_are_named_one_line_each() -> None:
    body = bad_quantity_body()
    body["spec"]["surplus"] = True
    errors, warnings = admission_problems(body)
    assert warnings == []
    assert len(errors) == 2
    assert any(e.startswith("spec.nodes.systemReserved: 'lots' is not a Kubernetes quantity") for e in errors)
    assert any(e.startswith("spec.surplus: unknown field") for e in errors)


def test_server_fields_of_a_live_object_are_not_problems() -> None:
    body = example()
    body["metadata"].update(uid="u-1", resourceVersion="7", generation=2, managedFields=[{"manager": "kubectl"}],
                            finalizers=["katasizing.dev/cleanup"])
    body["status"] = {"conditions": [{"type": "Valid", "status": "False"}]}
    assert admission_problems(body) == ([], [])


@pytest.mark.parametrize("operation, old, new, expected", [
    ("CREATE", None, {"spec": {"shim": "a"}}, True),
    ("UPDATE", {"spec": {"shim": "a"}}, {"spec": {"shim": "b"}}, True),
    # Metadata only (labels, an older operator's finalizer and its removal on deletion).
    ("UPDATE", {"metadata": {}, "spec": {"shim": "a"}},
     {"metadata": {"finalizers": ["katasizing.dev/cleanup"]}, "spec": {"shim": "a"}}, False),
])
def test_only_spec_changes_are_reviewed(operation, old, new, expected) -> None:
    assert needs_review(operation, old, new) is expected


# ---- the operator's flags ----


def webhook_handler_ids(registry: kopf.OperatorRegistry) -> list[str]:
    return [handler.id for handler in registry._webhooks.get_all_handlers()]


def test_the_admission_handler_is_registered_only_when_asked() -> None:
    # kopf refuses to start with admission handlers and no webhook server.
    assert webhook_handler_ids(build_registry()) == []
    assert webhook_handler_ids(build_registry(admission=True)) == [VALIDATE_HANDLER_ID]


@pytest.fixture
def captured_operator(monkeypatch, tmp_path) -> dict:
    """What `kata-sizing operator ...` hands to kopf.operator(), without running it."""
    seen: dict = {}
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path)))

    async def fake_operator(**kwargs) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(kopf, "operator", fake_operator)
    monkeypatch.setattr(operator_main.logging, "basicConfig", lambda **_: None)
    return seen


def test_without_webhook_flags_nothing_is_served(captured_operator) -> None:
    assert cli.main(["operator", "--standalone"]) == 0
    assert captured_operator["settings"].admission.server is None
    assert webhook_handler_ids(captured_operator["registry"]) == []


def test_webhook_flags_configure_kopfs_server_and_leave_the_configuration_unmanaged(
    captured_operator, tmp_path
) -> None:
    cert, key = write_self_signed_cert(tmp_path)
    assert cli.main(["operator", "--standalone", "--webhook-port", str(free_port()), "--webhook-cert", str(cert),
                     "--webhook-key", str(key), "--webhook-addr", "0.0.0.0"]) == 0
    admission = captured_operator["settings"].admission
    assert isinstance(admission.server, kopf.WebhookServer)
    assert admission.server.addr == "0.0.0.0"
    assert (admission.server.certfile, admission.server.pkeyfile) == (str(cert), str(key))
    assert admission.server.insecure is False
    # kopf would otherwise create and patch the ValidatingWebhookConfiguration (more RBAC).
    assert admission.managed is None
    assert webhook_handler_ids(captured_operator["registry"]) == [VALIDATE_HANDLER_ID]


@pytest.mark.parametrize("flags, message", [
    (["--webhook-port", "9443"], "--webhook-port needs --webhook-cert and --webhook-key"),
    (["--webhook-cert", "c"], "--webhook-cert need --webhook-port"),
    (["--webhook-port", "9443", "--webhook-cert", "/nonexistent/tls.crt", "--webhook-key", "/nonexistent/tls.key"],
     "/nonexistent/tls.crt: no such file"),
    (["--webhook-port", "9443", "--webhook-insecure", "--webhook-cert", "c"],
     "--webhook-insecure serves plain HTTP; drop --webhook-cert and --webhook-key"),
])
def test_bad_webhook_flags_are_one_line_and_exit_2(captured_operator, capsys, flags, message) -> None:
    assert cli.main(["operator", *flags]) == cli.EXIT_UNREADABLE
    assert capsys.readouterr().err == f"error: {message}\n"
    assert captured_operator == {}, "the operator must not start"


def test_the_insecure_flag_is_hidden_from_help(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["operator", "--help"])
    help_text = capsys.readouterr().out
    assert "--webhook-port" in help_text and "--webhook-cert" in help_text and "--webhook-key" in help_text
    assert "--webhook-insecure" not in help_text


# ---- the overlay: overlays/webhook/ ----


@pytest.fixture(scope="module")
def overlay_output() -> list[dict]:
    kubectl = find_kubectl()
    if kubectl is None:
        pytest.skip("kubectl not on PATH and not at .tools/kubectl (run `make tools`)")
    assert CRD_FILE.exists(), f"{CRD_FILE.relative_to(ROOT)} is missing: run `make crds`"
    result = subprocess.run([kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True,
                            check=False, timeout=60)
    assert result.returncode == 0, f"kubectl kustomize overlays/webhook/ failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


@pytest.fixture(scope="module")
def overlay_by_kind(overlay_output: list[dict]) -> dict[str, dict]:
    """One object per kind; for a kind the base has too (the metrics Service), the overlay's own."""
    base = {(o["kind"], o["metadata"]["name"]) for p in MANIFESTS.glob("*.yaml")
            if p.name != "kustomization.yaml" for o in load_documents(p)}
    by_kind: dict[str, dict] = {}
    for obj in overlay_output:
        if obj["kind"] not in by_kind or (obj["kind"], obj["metadata"]["name"]) not in base:
            by_kind[obj["kind"]] = obj
    return by_kind


@pytest.fixture(scope="module")
def webhook_container(overlay_by_kind: dict[str, dict]) -> dict:
    (container,) = overlay_by_kind["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


@pytest.fixture(scope="module")
def webhook_options(webhook_container: dict) -> WebhookOptions:
    """The overlay's container args, parsed by the real CLI parser."""
    args = cli.build_parser().parse_args(webhook_container["args"])
    assert args.webhook_port is not None, "the overlay does not turn the webhook on"
    return WebhookOptions(port=args.webhook_port, certfile=args.webhook_cert, pkeyfile=args.webhook_key,
                          addr=args.webhook_addr, insecure=args.webhook_insecure)


def test_overlay_adds_the_webhook_objects_to_the_base(overlay_output: list[dict]) -> None:
    assert Counter(obj["kind"] for obj in overlay_output) == EXPECTED_KINDS + WEBHOOK_KINDS


def test_overlay_changes_no_base_object_but_the_deployment(
    overlay_output: list[dict], overlay_by_kind: dict[str, dict]
) -> None:
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in overlay_output}
    for path in sorted(MANIFESTS.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for obj in load_documents(path):
            if obj["kind"] != "Deployment":
                key = (obj["kind"], obj["metadata"]["name"])
                assert by_name[key] == obj, f"the overlay changed the {key}"
    assert overlay_by_kind["CustomResourceDefinition"] == load_documents(CRD_FILE)[0]


def test_base_install_has_no_webhook() -> None:
    (deployment,) = load_documents(MANIFESTS / "deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert not any(arg.startswith("--webhook") for arg in container["args"])


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("kind", sorted(EXPECTED_KINDS + WEBHOOK_KINDS))
def test_overlay_objects_are_valid(overlay_by_kind: dict[str, dict], kind: str, version: str) -> None:
    obj = overlay_by_kind[kind]
    if obj["apiVersion"].startswith(f"{CERT_MANAGER_GROUP}/"):
        pytest.skip(f"{kind} is a cert-manager custom resource: kubernetes-validate has no schema for it")
    if kind.endswith("WebhookConfiguration") and version == SCHEMA_VERSIONS[0]:
        version = "1.28"  # their matchConditions (docs/install.md: the webhook overlay needs 1.28)
    if kind in ADMISSION_SERVED_FROM and version == SCHEMA_VERSIONS[0]:
        version = ".".join(map(str, ADMISSION_SERVED_FROM[kind]))  # the release that serves it
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{kind}/{obj['metadata']['name']} invalid for Kubernetes {version}: "
                    f"{error.message} at {'/'.join(map(str, error.path))}")


def test_webhook_reviews_creates_and_updates_of_policies(overlay_by_kind: dict[str, dict]) -> None:
    crd = overlay_by_kind["CustomResourceDefinition"]
    (webhook,) = overlay_by_kind["ValidatingWebhookConfiguration"]["webhooks"]
    assert webhook["rules"] == [{
        "apiGroups": [crd["spec"]["group"]],
        "apiVersions": [v["name"] for v in crd["spec"]["versions"] if v["served"]],
        "operations": ["CREATE", "UPDATE"],
        "resources": [crd["spec"]["names"]["plural"]],
        "scope": crd["spec"]["scope"],
    }]
    assert (GROUP, VERSION, PLURAL) == (crd["spec"]["group"], "v1alpha1", "katasizingpolicies")
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["sideEffects"] == "None"
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["timeoutSeconds"] == 5


def test_webhook_calls_the_path_kopf_serves_for_the_handler(overlay_by_kind: dict[str, dict]) -> None:
    (webhook,) = overlay_by_kind["ValidatingWebhookConfiguration"]["webhooks"]
    (handler_id,) = webhook_handler_ids(build_registry(admission=True))
    # kopf routes POST <server path>/{id} and runs only the handler with that id.
    assert webhook["clientConfig"]["service"]["path"] == f"/{handler_id}"


def test_service_reaches_the_operators_webhook_port(
    overlay_by_kind: dict[str, dict], webhook_container: dict, webhook_options: WebhookOptions
) -> None:
    service = overlay_by_kind["Service"]
    deployment = overlay_by_kind["Deployment"]
    (webhook,) = overlay_by_kind["ValidatingWebhookConfiguration"]["webhooks"]
    target = webhook["clientConfig"]["service"]
    assert (target["namespace"], target["name"]) == (service["metadata"]["namespace"], service["metadata"]["name"])
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == target["port"]]
    assert port["port"] == 443
    container_ports = {p["name"]: p["containerPort"] for p in webhook_container["ports"]}
    assert container_ports[port["targetPort"]] == webhook_options.port == 9443
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # Ready (in the Service's endpoints) only once /readyz says the webhook listens too.
    assert webhook_container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert webhook_options.addr is None, "the Service reaches the pod IP: listen on every interface"
    assert webhook_options.insecure is False


def test_certificate_is_mounted_where_the_operator_reads_it(
    overlay_by_kind: dict[str, dict], webhook_container: dict, webhook_options: WebhookOptions
) -> None:
    certificate, issuer = overlay_by_kind["Certificate"], overlay_by_kind["Issuer"]
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": issuer["metadata"]["name"]}
    assert "selfSigned" in issuer["spec"]
    assert certificate["metadata"]["namespace"] == issuer["metadata"]["namespace"]
    volumes = {v["name"]: v for v in overlay_by_kind["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in webhook_container["volumeMounts"]
                if volumes[m["name"]].get("secret", {}).get("secretName") == certificate["spec"]["secretName"]]
    assert mount["readOnly"] is True
    # cert-manager writes the serving pair as tls.crt and tls.key in the Secret.
    assert webhook_options.certfile == f"{mount['mountPath']}/tls.crt"
    assert webhook_options.pkeyfile == f"{mount['mountPath']}/tls.key"


def test_certificate_names_the_service_and_is_injected_as_the_ca(overlay_by_kind: dict[str, dict]) -> None:
    service, certificate = overlay_by_kind["Service"], overlay_by_kind["Certificate"]
    configuration = overlay_by_kind["ValidatingWebhookConfiguration"]
    service_dns = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert service_dns in certificate["spec"]["dnsNames"]
    assert configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{certificate['metadata']['namespace']}/{certificate['metadata']['name']}")


# ---- end to end: AdmissionReviews over HTTPS to the running operator ----


@pytest.mark.emulator
def test_an_invalid_policy_is_refused_with_every_violated_rule(webhook: Webhook) -> None:
    response = webhook.review("CREATE", invalid_body())
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    errors, _ = admission_problems(invalid_body())
    assert len(errors) == 2
    assert response["status"]["message"] == "; ".join(errors)
    assert "podFixed.memory 64Mi must be above overhead_memory 96Mi" in response["status"]["message"]
    assert "podFixed.cpu 100m must be above overhead_vcpus 0.2" in response["status"]["message"]


@pytest.mark.emulator
def test_valid_policies_are_allowed_and_warnings_passed_on(webhook: Webhook) -> None:
    response = webhook.review("CREATE", example())
    assert response["allowed"] is True
    assert "status" not in response and "warnings" not in response
    response = webhook.review("CREATE", example("measured-classes"))
    assert response["allowed"] is True
    (warning,) = response["warnings"]
    assert warning.startswith("spec.classes[1] (m): podFixed.memory 160Mi is below default_memory")
    assert "patch" not in response, "a validating webhook changes nothing"


@pytest.mark.emulator
def test_a_malformed_policy_is_refused_naming_the_field(webhook: Webhook) -> None:
    response = webhook.review("CREATE", bad_quantity_body())
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert response["status"]["message"].startswith("spec.nodes.systemReserved: 'lots' is not a Kubernetes quantity")


@pytest.mark.emulator
def test_updates_are_reviewed_when_the_spec_changes(webhook: Webhook) -> None:
    stored = invalid_body()  # e.g. created before the webhook was installed
    finalized = copy.deepcopy(stored)
    finalized["metadata"]["finalizers"] = ["katasizing.dev/cleanup"]
    assert webhook.review("UPDATE", finalized, old=stored)["allowed"] is True
    response = webhook.review("UPDATE", invalid_body(), old=example("measured-classes"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 422


@pytest.mark.emulator
def test_the_operator_with_the_webhook_still_reconciles_within_its_rbac(webhook: Webhook) -> None:
    emu = webhook.emu
    emu.objects(POLICIES).create(example())
    wait_observed(emu, "qemu-rs", Ready="True")
    granted = granted_permissions()
    refused = {
        triple for record in emu.request_log
        if (triple := request_triple(record.method, record.path, record.query)) is not None
        and triple not in granted
    }
    # managed=None: kopf never touches admissionregistration.k8s.io.
    assert refused == set()


# ---- hostile or broken requests: 400 for what is not a review, a review for the rest ----


def post_raw(webhook: Webhook, data: bytes) -> tuple[int, bytes]:
    http_request = urllib.request.Request(webhook.url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(http_request, context=webhook.context, timeout=5) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def a_review(obj: object, **request_fields: object) -> dict:
    request = {
        "uid": "u-1", "kind": {"group": GROUP, "version": VERSION, "kind": "KataSizingPolicy"},
        "resource": {"group": GROUP, "version": VERSION, "resource": PLURAL},
        "operation": "CREATE", "userInfo": {"username": "someone"}, "object": obj, "oldObject": None,
    }
    request.update(request_fields)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


MALFORMED_REVIEWS = {
    "not JSON": b"{not json",
    "empty": b"",
    "a list": b"[1, 2]",
    "NaN": b'{"apiVersion": NaN}',
    "integer past the digit limit": b'{"a": ' + b"9" * 5000 + b"}",
    "deep nesting": b"[" * 10000 + b"]" * 10000,
    "no request": json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
    "request not an object": json.dumps({**a_review({}), "request": "x"}).encode(),
    "no uid": json.dumps(a_review({}, uid=None)).encode(),
    "no userInfo": json.dumps(a_review({}, userInfo=None)).encode(),
    "no resource": json.dumps(a_review({}, resource=None)).encode(),
    "object not an object": json.dumps(a_review("a string")).encode(),
    "no object at all": json.dumps(a_review(None)).encode(),
    "other kind": json.dumps({**a_review({}), "kind": "Pod"}).encode(),
}


@pytest.mark.emulator
def test_bodies_that_are_not_reviews_get_400_and_reviews_always_get_a_review(webhook: Webhook) -> None:
    for name, data in MALFORMED_REVIEWS.items():
        status, body = post_raw(webhook, data)
        assert status == 400, (name, status, body[:200])
        assert b"Traceback" not in body
    # Well-formed reviews, however odd their object, get an AdmissionReview.
    odd_objects = {
        "empty object": {},
        "deep spec": {"metadata": {"name": "p"}, "spec": json.loads("[" * 40 + "]" * 40)},
        "huge number": {"metadata": {"name": "p"}, "spec": {"shim": "qemu", "classes": [
            {"name": "s", "cpu": 10**30, "memory": "1Gi"}]}},
        "name with a newline": {"metadata": {"name": "p\n"}, "spec": {"shim": "qemu"}},
        "quantity with spaces": {"metadata": {"name": "p"}, "spec": {"shim": "qemu", "nodes": {
            "systemReserved": " 4Gi"}}},
    }
    for name, obj in odd_objects.items():
        status, body = post_raw(webhook, json.dumps(a_review(obj)).encode())
        assert status == 200, (name, status, body[:200])
        review = json.loads(body)
        assert review["kind"] == "AdmissionReview" and review["response"]["uid"] == "u-1"
        assert review["response"]["allowed"] is False, name
        assert review["response"]["status"]["code"] == 422, (name, review)
    # A review of a resource the operator has no rule for is answered, and allowed.
    other = a_review({"metadata": {"name": "x"}}, resource={"group": "", "version": "v1", "resource": "pods"})
    status, body = post_raw(webhook, json.dumps(other).encode())
    assert status == 200 and json.loads(body)["response"]["allowed"] is True
