"""Issue 18's input items, as a user meets them: input held to the API server's own rules (the
types of the CRD's structural schema, YAML read as kubectl reads it, label keys and values,
tolerations, the CEL literal range, RuntimeClass names two policies share), the class whose
limit-less pods Kata refuses, and input that used to end in a traceback or a wrong answer.
Each test fails on the code before the fix (the `layout` commit). tests/api/test_real_inputs.py
shows the API server deciding the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from kata_sizing.cli import main
from kata_sizing.controller.policy_webhook import admission_problems, pod_to_route
from kata_sizing.core import podfit
from kata_sizing.core.model import PolicyError, parse_policy
from kata_sizing.core.render import render_policy
from kata_sizing.core.sizing import size_policy
from tests.support.paths import ROOT

EXAMPLE = ROOT / "examples" / "qemu-runtime-rs.yaml"
INT64_MAX = 2**63 - 1


def run(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.fixture
def write(tmp_path, monkeypatch):
    """Files in the test's directory, named relatively: messages start with the name given."""
    monkeypatch.chdir(tmp_path)

    def write(text: str, name: str = "policy.yaml") -> Path:
        path = Path(name)
        path.write_text(textwrap.dedent(text))
        return path

    return write


def policy_text(spec_lines: str, name: str = "p") -> str:
    return (f"apiVersion: katasizing.dev/v1alpha1\nkind: KataSizingPolicy\nmetadata: {{name: {name}}}\n"
            "spec:\n  shim: qemu-runtime-rs\n" + textwrap.indent(textwrap.dedent(spec_lines).rstrip("\n") + "\n", "  "))


# --- the CEL literal range --------------------------------------------------------------------


def test_a_class_cpu_past_int64_millicores_is_refused_naming_the_field(capsys, write):
    code, _, err = run(capsys, "validate", write(policy_text('classes: [{name: s, cpu: "1e16", memory: 1Gi}]')))
    assert code == 1
    assert err == ("error: policy.yaml: spec.classes[0].cpu: 1e16 is 10000000000000000000 millicores; the admission "
                   f"policies compare CPU in int64 millicores, at most {INT64_MAX}m\n")
    code, _, err = run(capsys, "validate",
                       write(policy_text(f'classes: [{{name: s, cpu: "{INT64_MAX + 1}m", memory: 1Gi}}]')))
    assert code == 1 and "spec.classes[0].cpu:" in err


def test_the_largest_class_cpu_renders_the_largest_cel_literal(capsys, write):
    code, out, _ = run(capsys, "render", write(policy_text(f'classes: [{{name: s, cpu: "{INT64_MAX}m", memory: 1Gi}}]')))
    assert code == 0
    (params,) = [d for d in yaml.safe_load_all(out) if d["metadata"]["name"] == "p-dropins"]
    # The shared CEL reads it with int(), which takes every int64.
    assert params["data"]["classCpu"] == str(INT64_MAX)


# --- types the API server refuses ---------------------------------------------------------------


@pytest.mark.parametrize("lines, expected", [
    ("admission: {enabled: \"false\"}",
     "spec.admission.enabled: must be true or false (the CRD's type boolean), not the string 'false'; "
     "write false without quotes"),
    ("sandboxCgroupOnly: \"false\"", "spec.sandboxCgroupOnly: must be true or false"),
    ("hugepages: 1", "spec.hugepages: must be true or false (the CRD's type boolean), not the integer 1"),
    ("classes: [{name: s, cpu: \"1\", memory: 1Gi, defaultVcpus: \"2\"}]",
     "spec.classes[0].defaultVcpus: must be a whole number (the CRD's type integer), not the string '2'; "
     "write 2 without quotes"),
    ("classes: [{name: s, cpu: \"1\", memory: 1Gi, defaultVcpus: 2.5}]",
     "spec.classes[0].defaultVcpus: must be a whole number (the CRD's type integer), not the number 2.5"),
    ("classes: [{name: s, cpu: 1.5, memory: 1Gi}]", "spec.classes[0].cpu: the number 1.5 is not an integer"),
    ("overhead: {guestMemoryRatio: 0.14}",
     "spec.overhead.guestMemoryRatio: must be a string (the CRD's type string), not the number 0.14"),
    ("runtimeClass: {nodeSelector: {kata: yes}}",
     "spec.runtimeClass.nodeSelector.kata: must be a string (the CRD's type string), not the boolean true; "
     "YAML reads an unquoted y, n, yes, no, on, off, true or false as a boolean: quote it"),
    ("runtimeClass: {tolerations: [{key: kata, operator: Exists, effect: NoExecute, tolerationSeconds: \"60\"}]}",
     "spec.runtimeClass.tolerations[0].tolerationSeconds: must be a whole number"),
])
def test_a_type_the_crd_refuses_is_refused_naming_the_field(capsys, write, lines, expected):
    code, _, err = run(capsys, "validate", write(policy_text(lines)))
    assert code == 1
    assert f"error: policy.yaml: {expected}" in err, err


def test_enabled_false_as_a_string_no_longer_drops_the_admission_objects_silently(capsys, write):
    # Before: accepted, and render left out every admission object.
    code, out, _ = run(capsys, "render", write(policy_text('admission: {enabled: "false"}')))
    assert code == 1 and out == ""


@pytest.mark.parametrize("lines, path, value", [
    # go-yaml (kubectl, the API server) reads these unquoted words and numbers; so does the CLI.
    ("admission: {enabled: n}", ("admission", "enabled"), False),
    ("hugepages: y", ("hugepages",), True),
    ("classes: [{name: s, cpu: 1e3, memory: 1Gi}]", ("classes", 0, "cpu"), "1000"),
    ("classes: [{name: s, cpu: 0x10, memory: 1Gi}]", ("classes", 0, "cpu"), "16"),
    ("classes: [{name: s, cpu: 1_000, memory: 1Gi}]", ("classes", 0, "cpu"), "1000"),
    ("classes: [{name: s, cpu: \"1\", memory: 1Gi, defaultVcpus: 0o17}]", ("classes", 0, "defaultVcpus"), 15),
    ("classes: [{name: s, cpu: \"1\", memory: 1Gi, defaultVcpus: 2.0}]", ("classes", 0, "defaultVcpus"), 2),
])
def test_yaml_is_read_as_kubectl_reads_it(write, lines, path, value):
    from kata_sizing.cli import load_policies

    [policy] = load_policies(str(write(policy_text(lines))))
    spec = policy.spec.model_dump(by_alias=True)
    for part in path:
        spec = spec[part]
    assert spec == value


def test_a_yaml_boolean_key_becomes_the_text_kubectl_sends(capsys, write):
    # kubectl sends `y: n` as {"true": false}: a label value that is not a string.
    code, _, err = run(capsys, "validate", write(policy_text("runtimeClass: {nodeSelector: {y: n}}")))
    assert code == 1
    assert "spec.runtimeClass.nodeSelector.true: must be a string (the CRD's type string), not the boolean false" in err


def test_nan_cannot_be_sent_and_is_unreadable(capsys, write):
    code, _, err = run(capsys, "validate", write(policy_text("classes: [{name: s, cpu: .nan, memory: 1Gi}]")))
    assert code == 2
    assert err == ("error: policy.yaml: spec.classes[0].cpu: nan cannot be sent as JSON (kubectl: "
                   "\"json: unsupported value\"); quote it if it is text\n")


# --- label keys and values ------------------------------------------------------------------------


@pytest.mark.parametrize("lines, path", [
    ("runtimeClass: {nodeSelector: {/team: a}}", "spec.runtimeClass.nodeSelector"),
    ("nodes: {selector: {/team: a}}", "spec.nodes.selector"),
    ("admission: {namespaces: {selector: {matchLabels: {/team: a}}}}",
     "spec.admission.namespaces.selector.matchLabels"),
    ("admission: {namespaces: {selector: {matchExpressions: [{key: /team, operator: Exists}]}}}",
     "spec.admission.namespaces.selector.matchExpressions[0].key"),
])
def test_a_label_key_with_an_empty_prefix_is_refused(capsys, write, lines, path):
    code, _, err = run(capsys, "validate", write(policy_text(lines)))
    assert code == 1
    assert err == f"error: policy.yaml: {path}: '/team' is not a label key: the prefix before '/' is empty\n"


@pytest.mark.parametrize("selector, problem", [
    ({"a/b/c": "x"}, "'a/b/c' is not a label key: at most one '/' (prefix/name)"),
    ({"Example.com/a": "x"}, "the prefix must be a DNS subdomain"),
    ({"example.com/": "x"}, "'example.com/' is not a label key: the name is empty"),
    ({"k" * 64: "x"}, "is not a label key: the name must be at most 63"),
    ({"a": "v" * 64}, "is not a label value: at most 63"),
    ({"a": "-v"}, "'-v' is not a label value"),
])
def test_every_key_and_value_the_label_grammar_refuses_is_refused(selector, problem):
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["runtimeClass"]["nodeSelector"] = selector
    with pytest.raises(PolicyError) as error:
        parse_policy(body)
    assert any(problem in p for p in error.value.problems), error.value.problems


def test_the_validating_webhook_refuses_an_empty_prefix_too():
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["runtimeClass"]["nodeSelector"] = {"/team": "a"}
    errors, _ = admission_problems(body)
    assert errors == ["spec.runtimeClass.nodeSelector: '/team' is not a label key: the prefix before '/' is empty"]


def test_the_namespace_label_flag_uses_the_same_grammar(capsys):
    code, _, err = run(capsys, "explain", "--pod", ROOT / "examples" / "qemu-runtime-rs.yaml", "--policy", EXAMPLE,
                       "--namespace-label", "/team=a")
    assert code == 1
    assert err == "error: --namespace-label: '/team' is not a label key: the prefix before '/' is empty\n"


# --- tolerations (ValidateTolerations, as a RuntimeClass's scheduling gets it) --------------------


@pytest.mark.parametrize("toleration, problem", [
    ({"operator": "Exists", "value": "x", "key": "kata"}, "value must be empty when operator is Exists (got 'x')"),
    ({"key": "kata", "operator": "Exists", "tolerationSeconds": 60},
     "tolerationSeconds needs effect NoExecute"),
    ({"operator": "Equal", "value": "x"}, "operator must be Exists when key is empty"),
    ({}, "operator must be Exists when key is empty"),
    ({"key": "/kata", "operator": "Exists"}, "key: '/kata' is not a label key"),
    ({"key": "kata", "value": "not a value"}, "value: 'not a value' is not a label value"),
])
def test_a_toleration_kubernetes_refuses_is_refused(toleration, problem):
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["runtimeClass"]["tolerations"] = [toleration]
    with pytest.raises(PolicyError) as error:
        parse_policy(body)
    assert error.value.problems == [f"spec.runtimeClass.tolerations[0]: {problem}"] or any(
        p.startswith("spec.runtimeClass.tolerations[0]: ") and problem in p for p in error.value.problems)


@pytest.mark.parametrize("toleration", [
    {"operator": "Exists"},
    {"key": "kata", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
    {"key": "example.com/kata", "value": "true", "effect": "NoSchedule"},
    {"key": "kata", "operator": "Equal", "value": ""},
])
def test_a_toleration_kubernetes_accepts_is_accepted(toleration):
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["runtimeClass"]["tolerations"] = [toleration]
    parse_policy(body)


def test_the_same_toleration_twice_is_refused_as_the_runtime_class_would_be():
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["runtimeClass"]["tolerations"] = [{"key": "kata", "operator": "Exists"}] * 2
    with pytest.raises(PolicyError) as error:
        parse_policy(body)
    assert error.value.problems == [
        "spec.runtimeClass.tolerations: tolerations[1] repeats tolerations[0] (the same key, operator, value and "
        "effect); a RuntimeClass may not hold a toleration twice"]


# --- RuntimeClass names two policies of one file share --------------------------------------------


def test_an_explicit_prefix_equal_to_another_policys_default_is_refused(capsys, write):
    text = (policy_text("classes: [{name: s, cpu: \"1\", memory: 1Gi}]", name="a") + "---\n"
            + policy_text("runtimeClass: {namePrefix: kata-a}\nclasses: [{name: s, cpu: \"1\", memory: 1Gi}]",
                          name="b"))
    code, _, err = run(capsys, "validate", write(text))
    assert code == 1
    assert err == (
        "error: policy.yaml (document 2): spec.runtimeClass.namePrefix: RuntimeClass kata-a-s (class s) is also "
        "RuntimeClass kata-a-s of policy 'a' (class s, policy.yaml (document 1)): the two policies would overwrite "
        "each other's RuntimeClass and kata-deploy runtime; change a namePrefix or a class name\n")


def test_default_prefixes_that_meet_in_a_class_name_are_refused(capsys, write):
    # kata-a + class b-c and kata-a-b + class c are both kata-a-b-c.
    text = (policy_text("classes: [{name: b-c, cpu: \"1\", memory: 1Gi}]", name="a") + "---\n"
            + policy_text("classes: [{name: c, cpu: \"1\", memory: 1Gi}]", name="a-b"))
    code, _, err = run(capsys, "render", write(text))
    assert code == 1 and "RuntimeClass kata-a-b-c (class c) is also RuntimeClass kata-a-b-c of policy 'a'" in err


# --- a class whose limit-less pods Kata refuses -----------------------------------------------------


ZERO = policy_text("""\
    classes:
    - {name: s, cpu: "1", memory: 1Gi, defaultMemory: "0"}
    - {name: m, cpu: "2", memory: 4Gi, overheadMemory: "0", podFixed: {cpu: 500m, memory: 400Mi}}
    """, name="zero")


def _pod(name: str, runtime_class: str, **limits: str) -> dict:
    container = {"name": "c", "image": "x", **({"resources": {"limits": limits}} if limits else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "a"},
            "spec": {"runtimeClassName": runtime_class, "containers": [container]}}


@pytest.mark.parametrize("pod, refused", [
    (_pod("no-limits", "kata-zero-s"), True),
    (_pod("cpu-only", "kata-zero-s", cpu="1"), False),
    (_pod("cpu-only", "kata-zero-m", cpu="1"), True),
    (_pod("tiny-memory", "kata-zero-m", memory="1000Ki"), True),
    (_pod("one-mebibyte", "kata-zero-m", memory="1Mi"), False),
    (_pod("no-limits", "kata-zero-m"), False),
])
def test_pods_kata_refuses_to_start_are_refused_at_admission(pod, refused):
    sizing = size_policy(parse_policy(yaml.safe_load(ZERO)))
    findings = [f for f in podfit.check_pod(pod, sizing) if f.rule == podfit.RULE_SANDBOX_MEMORY_ZERO]
    assert bool(findings) is refused
    for finding in findings:
        assert finding.action == "Deny"
        assert finding.message.startswith(
            f"pod a/{pod['metadata']['name']} on RuntimeClass {pod['spec']['runtimeClassName']}: Kata refuses to start "
            "it: computed sandbox memory is 0 MiB for hypervisor qemu")


def test_the_policy_says_what_admission_does_with_them(capsys, write):
    code, _, err = run(capsys, "validate", write(ZERO))
    assert code == 0
    assert "(Kata refuses every pod of this class that has no limits); the admission policy refuses such pods" in err
    code, _, err = run(capsys, "validate", write(ZERO + "  admission: {envelopeExceeded: Warn}\n"))
    assert code == 0
    assert "spec.admission.envelopeExceeded is Warn, so such pods are admitted and then fail to start" in err


def test_every_policy_binds_the_same_cel_and_only_its_parameters_say_which_classes_kata_refuses():
    zero = render_policy(parse_policy(yaml.safe_load(ZERO)))
    example = render_policy(parse_policy(yaml.safe_load(EXAMPLE.read_text())))
    assert zero.shared == example.shared and len(zero.shared) == 6  # three policies, a keep-alive binding of each
    params = [r.configmaps[1]["data"] for r in (zero, example)]  # the drop-ins', with the parameters
    assert (params[0]["defaultZero"], params[0]["overheadZero"]) == ("true,false", "false,true")
    assert (params[1]["defaultZero"], params[1]["overheadZero"]) == ("false,false,false,false",) * 2


# --- tracebacks and wrong answers ----------------------------------------------------------------


@pytest.mark.parametrize("pod, where", [
    ({"kind": "Pod", "metadata": {"name": "p"}, "spec": {"initContainers": ["x"], "containers": []}},
     "spec.initContainers[0]: not a container (a mapping)"),
    ({"kind": "CronJob", "metadata": {"name": "c"}, "spec": {"jobTemplate": ["x"]}},
     "spec.jobTemplate.spec.template.spec.containers: missing; not a pod spec"),
])
def test_explain_and_audit_of_a_malformed_pod_say_what_is_wrong(capsys, write, pod, where):
    path = write(yaml.safe_dump(pod), "pod.yaml")
    code, _, err = run(capsys, "explain", "--pod", path, "--policy", EXAMPLE)
    assert (code, err) == (2, f"error: {path}: {where}\n")
    code, _, err = run(capsys, "audit", "--pods", path, "--policy", EXAMPLE)
    assert (code, err) == (2, f"error: {path}: {where}\n")


def test_a_malformed_pod_is_not_routed_and_never_crashes_the_routing():
    review = {"request": {"uid": "u", "operation": "CREATE", "kind": {"group": "", "kind": "Pod"},
                          "namespace": "a", "object": {"metadata": ["x"], "spec": {"containers": []}}}}
    pod, namespace = pod_to_route(review)
    assert (pod["metadata"], namespace) == ({"labels": {}, "namespace": "a"}, "a")
    review["request"]["object"] = {"metadata": {}, "spec": ["x"]}
    assert pod_to_route(review) is None


def test_overhead_vcpus_of_31_digits_is_a_field_problem(capsys, write):
    code, _, err = run(capsys, "validate", write(policy_text(
        'classes: [{name: s, cpu: "1", memory: 1Gi, overheadVcpus: "1234567890123456789012345678901"}]')))
    assert (code, err) == (1, "error: policy.yaml: spec.classes[0].overheadVcpus: 1234567890123456789012345678901 "
                              "is above 1024 vCPUs, the most a Kata drop-in is read with\n")


def test_a_31_digit_fraction_formats_exactly():
    from decimal import Decimal

    from kata_sizing.core.quantity import cpu_cores, format_cpu

    assert format_cpu(Decimal("1234567890123456789012345678901")) == "1234567890123456789012345678901"
    # Kubernetes rounds a quantity up to the millicore, however many digits follow.
    assert format_cpu(cpu_cores("1.000000000000000000000000000001")) == "1001m"


def test_audit_refuses_a_handler_that_is_not_a_dns_label(capsys, write):
    values = {"customRuntimes": {"enabled": True, "runtimes": {"bad": {
        "baseConfig": "qemu-runtime-rs",
        "runtimeClass": "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: bad}\nhandler: Bad_Handler\n"
                        "overhead: {podFixed: {memory: 4Gi, cpu: '1'}}\n"}}}}
    code, out, _ = run(capsys, "audit", write(yaml.safe_dump(values), "values.yaml"), "-o", "json")
    assert code == 1
    [finding] = [f for f in json.loads(out)["findings"] if f["rule"] == "runtime-class-invalid"]
    assert finding["message"] == ("handler 'Bad_Handler' is not a DNS label (at most 63 lower-case letters, digits "
                                  "and '-'): the API server refuses this RuntimeClass")


def _pods_file(write, *pods: dict) -> Path:
    return write(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(pods)}), "pods.yaml")


def test_audit_pods_counts_a_policy_given_twice_once(capsys, write):
    pods = _pods_file(write, _pod("big", "kata-qemu-rs-s", cpu="1", memory="3Gi"))
    code, out, _ = run(capsys, "audit", "--pods", pods, "--policy", EXAMPLE, "--policy", EXAMPLE, "-o", "json")
    report = json.loads(out)
    assert code == 1
    assert report["classes"]["kata-qemu-rs-s"]["pods"] == 1
    assert [f["rule"] for f in report["findings"]] == ["pod-envelope-exceeded"]


def test_two_different_policies_of_one_name_are_refused(capsys, write):
    other = write(EXAMPLE.read_text().replace("cpu: \"1\"", "cpu: \"2\"") + "\n", "other.yaml")
    pods = _pods_file(write, _pod("big", "kata-qemu-rs-s", cpu="1", memory="3Gi"))
    code, _, err = run(capsys, "audit", "--pods", pods, "--policy", EXAMPLE, "--policy", other)
    assert code == 1
    assert f"error: {other}: metadata.name: a policy named 'qemu-rs' is already in {EXAMPLE}; names must be unique" \
        in err


def test_a_namespace_label_that_contradicts_the_name_does_not_put_a_pod_in_scope(capsys, write):
    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["admission"] = {"namespaces": {"names": ["prod"]}}
    policy = write(yaml.safe_dump(body))
    pods = _pods_file(write, {**_pod("big", "kata-qemu-rs-s", cpu="1", memory="3Gi"),
                              "metadata": {"name": "big", "namespace": "dev"}})
    namespaces = write(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": "dev", "labels": {"kubernetes.io/metadata.name": "prod"}}}]}), "ns.yaml")
    code, out, _ = run(capsys, "audit", "--pods", pods, "--policy", policy, "--namespaces", namespaces, "-o", "json")
    assert (code, json.loads(out)["findings"]) == (0, [])
    pod = write(yaml.safe_dump(yaml.safe_load(pods.read_text())["items"][0]), "pod.yaml")
    code, out, _ = run(capsys, "explain", "--pod", pod, "--policy", policy,
                       "--namespace-label", "kubernetes.io/metadata.name=prod", "-o", "json")
    assert code == 0 and json.loads(out)["admission"]["inScope"] is False


def test_pod_names_cannot_forge_lines_of_a_text_report(capsys, write):
    forged = "x\nerror: forged line\x1b[2J\u202e"
    pods = _pods_file(write, {**_pod("x", "kata-qemu-rs-s", cpu="1", memory="3Gi"),
                              "metadata": {"name": forged, "namespace": "a"}})
    code, out, _ = run(capsys, "audit", "--pods", pods, "--policy", EXAMPLE)
    assert code == 1
    lines = out.splitlines()
    assert not any(line.startswith("error: forged") for line in lines)
    assert r"pod a/x\nerror: forged line\x1b[2J\u202e on RuntimeClass kata-qemu-rs-s" in lines[0]
    assert "\x1b" not in out and "\u202e" not in out
    pod = write(yaml.safe_dump(yaml.safe_load(pods.read_text())["items"][0]), "pod.yaml")
    code, out, _ = run(capsys, "explain", "--pod", pod, "--policy", EXAMPLE)
    assert code == 1
    assert r"Pod a/x\nerror: forged line\x1b[2J\u202e (policy qemu-rs)" == out.splitlines()[0]
    assert "\x1b" not in out


def test_validate_json_names_the_field_in_a_file_whose_name_holds_a_colon(capsys, tmp_path):
    path = tmp_path / "policy: v2.yaml"
    path.write_text(policy_text("hugepages: \"true\""))
    code, out, _ = run(capsys, "validate", path, "-o", "json")
    assert code == 1
    [problem] = json.loads(out)["problems"]
    assert problem["path"] == "spec.hugepages"
    assert problem["message"].startswith("must be true or false (the CRD's type boolean)")


# --- the operator without a cluster -----------------------------------------------------------------


def _operator(tmp_path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    environment = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    environment.update({"HOME": str(tmp_path), **env})
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kata_sizing.cli", "operator", "--standalone", *args],
                          capture_output=True, text=True, timeout=60, env=environment)
    return proc, time.monotonic() - started


def test_the_operator_without_a_kubeconfig_exits_at_once_with_one_line(tmp_path):
    proc, took = _operator(tmp_path)
    assert proc.returncode == 2 and took < 20
    assert proc.stderr == (
        "error: no cluster to connect to: not in a pod (no service account token at "
        "/var/run/secrets/kubernetes.io/serviceaccount/token) and no kubeconfig (~/.kube/config: "
        f"{tmp_path}/.kube/config does not exist)\n")


def test_the_operator_with_a_kubeconfig_without_a_context_exits_at_once(tmp_path):
    config = tmp_path / "config"
    config.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    proc, took = _operator(tmp_path, KUBECONFIG=str(config))
    assert proc.returncode == 2 and took < 20
    assert proc.stderr == f"error: the kubeconfig ({config}) sets no current-context\n"


@pytest.mark.parametrize("args, message", [
    (["--metrics-port", "99999"], "error: --metrics-port: 99999 is not a TCP port (1 to 65535)\n"),
    (["--webhook-port", "70000", "--webhook-insecure"], "error: --webhook-port: 70000 is not a TCP port (1 to 65535)\n"),
    (["--webhook-port", "9443", "--webhook-insecure", "--webhook-drain-seconds", "90"],
     "error: --webhook-drain-seconds: 90 is not between 0 and 60 (the seconds a stopping replica keeps answering "
     "reviews)\n"),
    (["--webhook-drain-seconds", "5"], "error: --webhook-drain-seconds need --webhook-port\n"),
])
def test_the_operator_with_a_bad_port_or_drain_exits_at_once(tmp_path, args, message):
    proc, took = _operator(tmp_path, *args)
    assert (proc.returncode, proc.stderr) == (2, message) and took < 20


def test_the_operator_with_an_unreadable_certificate_exits_at_once(tmp_path):
    cert = tmp_path / "tls.crt"
    cert.write_text("not a certificate\n")
    proc, took = _operator(tmp_path, "--webhook-port", "9443", "--webhook-cert", str(cert), "--webhook-key", str(cert))
    assert proc.returncode == 2 and took < 20
    assert proc.stderr.startswith(f"error: --webhook-cert/--webhook-key: {cert} and {cert} are not a PEM "
                                  "certificate and its private key (")
    assert len(proc.stderr.splitlines()) == 1


def test_explain_says_kata_refuses_a_limitless_pod_of_a_zero_class(capsys, write):
    policy = write(ZERO)
    pod = write(yaml.safe_dump(_pod("no-limits", "kata-zero-s")), "pod.yaml")
    code, out, _ = run(capsys, "explain", "--pod", pod, "--policy", policy)
    assert code == 1
    assert ("  admission:            refused [pod-sandbox-memory-zero]: pod a/no-limits on RuntimeClass kata-zero-s: "
            "Kata refuses to start it: computed sandbox memory is 0 MiB") in out
