"""podfit: a table of pods through the Python rule (tests/api/test_real_admission.py runs the same
table through the CEL on the real API server and compares the two verdicts pod by pod)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from kata_sizing.core import podfit, podread
from kata_sizing.core.model import PolicyError, parse_policy
from kata_sizing.core.render import render_policy
from kata_sizing.core.sizing import size_policy
from tests.support.pods import (
    CASE_IDS,
    CASES,
    EXCEEDED,
    GI,
    IN,
    MISSING,
    NOT_ROUTED,
    POLICY,
    ROUTED,
    SHARED_OBJECTS,
    Case,
    limits,
)


def sizing_of(spec_changes: dict | None = None):
    body = json.loads(json.dumps(POLICY))
    body["spec"]["admission"].update(spec_changes or {})
    return size_policy(parse_policy(body))


def findings_of(case: Case, sizing=None) -> list[podfit.PodFinding]:
    return podfit.check_pod(case.pod(), sizing or sizing_of())


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_effective_limits(case: Case) -> None:
    got = podread.pod_limits(case.pod())
    assert (got.cpu_millis, got.memory_bytes) == (case.expect_cpu, case.expect_memory)
    assert got.memory_missing == (MISSING in case.rules or case.name == "out-of-scope-without-limits")


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_rule_verdict(case: Case) -> None:
    findings = findings_of(case)
    assert {f.rule for f in findings} == case.rules
    for finding in findings:
        assert finding.smallest_fit == case.smallest_fit
        assert finding.namespace == case.namespace and finding.name == case.name
        assert finding.action == ("Warn" if finding.rule == MISSING else "Deny")
        assert f"pod {case.namespace}/{case.name}" in finding.message


def test_messages_name_the_figures_the_envelope_and_the_smallest_fit() -> None:
    by_name = {c.name: c for c in CASES}
    [finding] = findings_of(by_name["one-byte-above"])
    assert finding.message == (
        "pod fit-in/one-byte-above on RuntimeClass kata-fit-s: limits cpu 1, memory 1073741825 exceed class s "
        "(cpu 1, memory 1Gi), whose podFixed does not cover the guest overhead of a VM that large; "
        "the smallest class that fits is kata-fit-m")
    [finding] = findings_of(by_name["fits-no-class"])
    assert finding.message.endswith("no class of policy fit fits (the largest is kata-fit-l: cpu 4, memory 16Gi)")
    [finding] = findings_of(by_name["cpu-only"])
    assert "has no memory limit" in finding.message and "limits cpu 500m, memory none" in finding.message


@pytest.mark.parametrize("cpu, memory, expected", [
    ("1", "1Gi", "kata-fit-s"),
    ("1", str(GI + 1), "kata-fit-m"),
    ("1001m", "1Gi", "kata-fit-m"),
    ("2", "4Gi", "kata-fit-m"),
    ("2001m", "4Gi", "kata-fit-l"),
    ("2", str(4 * GI + 1), "kata-fit-l"),
    ("4", "16Gi", "kata-fit-l"),
    ("4001m", "16Gi", None),
    ("4", str(16 * GI + 1), None),
    (None, None, "kata-fit-s"),
])
def test_route_picks_the_smallest_class_at_every_boundary(cpu, memory, expected) -> None:
    sizing = sizing_of()
    fit = podfit.route(podread.pod_limits({"containers": [limits(cpu, memory)]}), sizing)
    assert (fit.runtime_class if fit else None) == expected
    pod = Case("r", (limits(cpu, memory),), None, None, runtime_class=None, namespace=ROUTED,
               labels={podfit.POLICY_LABEL: "fit"}).pod()
    patch = podfit.route_patch(pod, sizing)
    assert patch == ([{"op": "add", "path": "/spec/runtimeClassName", "value": expected}] if expected else [])
    routed = podfit.check_pod(pod, sizing, routed=True)
    assert [f.rule for f in routed] == ([NOT_ROUTED] if expected is None else [MISSING] if cpu is None else [])


def test_routing_needs_the_label_with_this_policys_name_or_the_namespace_label() -> None:
    sizing = sizing_of()
    pod = Case("r", (limits("1", "1Gi"),), None, None, runtime_class=None, namespace=ROUTED).pod()
    assert podfit.route_patch(pod, sizing) == []
    assert podfit.route_patch(pod, sizing, namespace_labels={podfit.POLICY_LABEL: "fit"})
    pod["metadata"]["labels"] = {podfit.POLICY_LABEL: "other"}
    assert podfit.route_patch(pod, sizing) == []
    pod["spec"]["runtimeClassName"] = "kata-fit-m"
    pod["metadata"]["labels"] = {podfit.POLICY_LABEL: "fit"}
    assert podfit.route_patch(pod, sizing) == []


def test_an_unrouted_opted_in_pod_is_refused_with_the_reason() -> None:
    sizing = sizing_of()
    pod = Case("r", (limits("1", "1Gi"),), None, None, runtime_class=None, namespace=ROUTED,
               labels={podfit.POLICY_LABEL: "fit"}).pod()
    [finding] = podfit.check_pod(pod, sizing)
    assert finding.rule == NOT_ROUTED and finding.action == "Deny"
    assert "the smallest class that fits, kata-fit-s, was not set" in finding.message


def test_actions_and_namespaces_come_from_spec_admission() -> None:
    sizing = sizing_of({"memoryLimitMissing": "Deny", "envelopeExceeded": "Audit",
                        "namespaces": {"selector": {"matchLabels": {"team": "a"}}}})
    case = {c.name: c for c in CASES}["second-container-without-memory"]
    assert podfit.check_pod(case.pod(), sizing) == []  # namespace without the label
    findings = podfit.check_pod(case.pod(), sizing, namespace_labels={"team": "a"})
    assert {(f.rule, f.action) for f in findings} == {(MISSING, "Deny"), (EXCEEDED, "Audit")}
    disabled = sizing_of({"enabled": False})
    assert podfit.check_pod(case.pod(), disabled) == []
    assert render_policy(disabled.policy).admission == []


@pytest.mark.parametrize("kind, wrap", [
    ("Deployment", lambda spec, meta: {"spec": {"template": {"metadata": meta, "spec": spec}}}),
    ("StatefulSet", lambda spec, meta: {"spec": {"template": {"metadata": meta, "spec": spec}}}),
    ("DaemonSet", lambda spec, meta: {"spec": {"template": {"metadata": meta, "spec": spec}}}),
    ("ReplicaSet", lambda spec, meta: {"spec": {"template": {"metadata": meta, "spec": spec}}}),
    ("Job", lambda spec, meta: {"spec": {"template": {"metadata": meta, "spec": spec}}}),
    ("CronJob", lambda spec, meta: {"spec": {"jobTemplate": {"spec": {"template": {"metadata": meta, "spec": spec}}}}}),
])
def test_workload_templates_are_read_like_pods(kind, wrap) -> None:
    pod = {c.name: c for c in CASES}["init-after-a-sidecar-counts-it"].pod()
    workload = {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "w", "namespace": IN},
                **wrap(pod["spec"], {"labels": {"app": "w"}})}
    assert podread.pod_spec_of(workload) == pod["spec"]
    [finding] = podfit.check_pod(workload, sizing_of())
    assert finding.rule == EXCEEDED and finding.name == "w" and finding.namespace == IN


@pytest.mark.parametrize("document, message", [
    ({"kind": "Service", "spec": {}}, "is not a Pod or a workload"),
    ({"kind": "Pod", "spec": {}}, "spec.containers: missing"),
    ({"kind": "Deployment", "spec": {"template": {}}}, "spec.template.spec.containers: missing"),
    ({"kind": "Pod", "spec": {"containers": [{"resources": {"limits": {"memory": "5Zi"}}}]}},
     "spec.containers[0].resources.limits.memory: '5Zi' is not a Kubernetes quantity"),
    ({"kind": "Pod", "spec": {"containers": [{"resources": {"limits": ["x"]}}]}},
     "spec.containers[0].resources.limits: not a mapping"),
])
def test_unreadable_pods_name_the_field(document, message) -> None:
    with pytest.raises(podread.PodInputError, match=None) as caught:
        podread.pod_limits(document)
    assert message in str(caught.value)


def test_spec_admission_is_validated() -> None:
    body = json.loads(json.dumps(POLICY))
    body["spec"]["admission"] = {"envelopeExceeded": "Refuse", "namespaces": {"names": ["Not_A_Name"]}}
    with pytest.raises(PolicyError) as caught:
        parse_policy(body)
    text = "\n".join(caught.value.problems)
    assert "spec.admission.envelopeExceeded" in text and "spec.admission.namespaces.names" in text


def test_rendered_admission_objects() -> None:
    rendered = render_policy(parse_policy(POLICY))
    assert [(o["kind"], o["metadata"]["name"]) for o in rendered.shared] == SHARED_OBJECTS
    assert [(o["kind"], o["metadata"]["name"]) for o in rendered.admission] == [
        ("ValidatingAdmissionPolicyBinding", "kata-sizing-fit-memory-limit"),
        ("ValidatingAdmissionPolicyBinding", "kata-sizing-fit-envelope"),
        ("MutatingAdmissionPolicyBinding", "kata-sizing-fit-route"),
    ]
    for obj in rendered.shared:
        assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "kata-sizing",
                                             "katasizing.dev/shared": "admission"}
        # No GitOps application's prune takes them (docs/gitops.md).
        assert obj["metadata"]["annotations"] == {"kustomize.toolkit.fluxcd.io/prune": "disabled",
                                                  "argocd.argoproj.io/sync-options": "Prune=false"}
        text = json.dumps(obj["spec"])
        assert "kata-fit-" not in text and '\\"fit\\"' not in text and "policy fit" not in text  # nothing of this policy
    for obj in rendered.admission:
        assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "kata-sizing",
                                             "katasizing.dev/policy": "fit"}
        assert "ownerReferences" not in obj["metadata"]
    policies = [o for o in rendered.shared if not o["kind"].endswith("Binding")]
    assert all(o["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"} for o in policies)
    bindings = {o["metadata"]["name"]: o["spec"] for o in rendered.admission}
    assert [b["policyName"] for b in bindings.values()] == [o["metadata"]["name"] for o in policies]
    # The install's keep-alive binding of each shared policy (docs/admission.md) judges no object
    # and names parameters that no policy has, in a namespace only administrators write.
    keep_alive = [o["spec"] for o in rendered.shared if o["kind"].endswith("Binding")]
    assert [b["policyName"] for b in keep_alive] == [o["metadata"]["name"] for o in policies]
    for spec in keep_alive:
        assert spec["paramRef"] == {"name": "kata-sizing-keep-alive", "namespace": "kube-system",
                                    "parameterNotFoundAction": "Allow"}
        assert spec["matchResources"]["objectSelector"] == {"matchExpressions": [
            {"key": "katasizing.dev/policy", "operator": "Exists"},
            {"key": "katasizing.dev/policy", "operator": "DoesNotExist"}]}
        assert spec.get("validationActions", ["Audit"]) == ["Audit"]
    assert bindings["kata-sizing-fit-memory-limit"]["validationActions"] == ["Warn"]
    assert bindings["kata-sizing-fit-envelope"]["validationActions"] == ["Deny"]
    assert bindings["kata-sizing-fit-route"]["matchResources"]["namespaceSelector"] == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                              "values": ["fit-in", "fit-routed"]}]}
    for spec in bindings.values():
        assert spec["paramRef"] == {"name": "fit-dropins", "namespace": "kata-sizing",
                                    "parameterNotFoundAction": "Allow"}
    params = next(c for c in rendered.configmaps if c["metadata"]["name"] == "fit-dropins")
    assert params["metadata"]["namespace"] == "kata-sizing"
    assert params["data"]["runtimeClasses"] == ",".join(c.runtime_class for c in size_policy(parse_policy(POLICY)).classes)
    # The parameters are written before the bindings that name them; the shared objects are not the policy's.
    assert rendered.objects()[-len(rendered.admission):] == rendered.admission
    assert not [o for o in rendered.objects() if o in rendered.shared]
    webhook = render_policy(parse_policy({**POLICY, "spec": {**POLICY["spec"], "admission": {"routing": "Webhook"}}}))
    assert [o["kind"] for o in webhook.admission + webhook.shared if "Mutating" in o["kind"]] == []
    off = render_policy(parse_policy({**POLICY, "spec": {**POLICY["spec"], "admission": {"enabled": False}}}))
    assert (off.admission, off.shared) == ([], [])
    assert set(off.configmaps[1]["data"]) == {f"{c}.toml" for c in ("s", "m", "l")}


# The parameters each version of the admission contract reads (podfit.ADMISSION_CONTRACT): a
# change to these keys, or to what one means, is a new version (docs/gitops.md, upgrades).
CONTRACT_KEYS = {"v1": {"classCpu", "classEnvelopes", "classMemory", "classNames", "defaultZero", "largestText",
                        "overheadZero", "policy", "runtimeClasses", "sandboxZeroMessage"}}


def test_the_parameters_are_the_keys_of_the_contract_the_shared_objects_are_named_for() -> None:
    sizing = size_policy(parse_policy(POLICY))
    assert set(podfit.params_data(sizing)) == CONTRACT_KEYS[podfit.ADMISSION_CONTRACT]
    assert all(name.endswith(f"-{podfit.ADMISSION_CONTRACT}") for name in podfit.SHARED_NAMES.values())
    cel = json.dumps(podfit.shared_admission_specs()).replace('\\"', "'")  # literals double-quoted
    read = set(re.findall(r"params\.data\['(\w+)'\]", cel))
    assert read == CONTRACT_KEYS[podfit.ADMISSION_CONTRACT]  # the CEL reads every key, and only those


def test_owned_like_the_runtime_classes_when_the_policy_has_a_uid_and_the_shared_ones_by_none() -> None:
    body = json.loads(json.dumps(POLICY))
    body["metadata"]["uid"] = "0b7d6a51-3c1f-4e8e-a3a5-2f1d9c0e7b11"
    rendered = render_policy(parse_policy(body))
    owners = rendered.runtime_classes[0]["metadata"]["ownerReferences"]
    assert all(o["metadata"]["ownerReferences"] == owners for o in rendered.admission + rendered.configmaps)
    assert all("ownerReferences" not in o["metadata"] for o in rendered.shared)


def test_admission_objects_pass_the_kubernetes_schemas_strictly() -> None:
    import kubernetes_validate

    version = ".".join(kubernetes_validate.latest_version().split(".")[:2])
    rendered = render_policy(parse_policy(POLICY))
    for obj in rendered.shared + rendered.admission:
        kubernetes_validate.validate(obj, version, strict=True)


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    from kata_sizing.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


@pytest.fixture
def files(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    pods = tmp_path / "pods.yaml"
    pods.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [c.pod() for c in CASES]}))
    return policy, pods, tmp_path


def test_audit_pods_lists_findings_and_counts_per_class(capsys, files) -> None:
    policy, pods, _ = files
    code, out, _ = run_cli(capsys, "audit", "--pods", pods, "--policy", policy, "-o", "json")
    assert code == 1
    report = json.loads(out)
    expected = [f for c in CASES for f in findings_of(c)]
    assert [(f["name"], f["rule"]) for f in report["findings"]] == [(f.name, f.rule) for f in expected]
    assert report["summary"] == {"pods": len(CASES), "errors": sum(f.is_error for f in expected),
                                 "warnings": sum(not f.is_error for f in expected)}
    in_class = [c for c in CASES if c.runtime_class == "kata-fit-m"]
    assert report["classes"]["kata-fit-m"]["pods"] == len(in_class)
    code, out, _ = run_cli(capsys, "audit", "--pods", pods, "--policy", policy)
    assert "RUNTIMECLASS  PODS  OVER_ENVELOPE  NO_MEMORY_LIMIT" in out


def test_audit_pods_exit_codes(capsys, files) -> None:
    policy, _, tmp = files
    clean = tmp / "clean.yaml"
    clean.write_text(yaml.safe_dump_all([CASES[0].pod()]))
    assert run_cli(capsys, "audit", "--pods", clean, "--policy", policy)[0] == 0
    warned = tmp / "warned.yaml"
    warned.write_text(yaml.safe_dump_all([{c.name: c for c in CASES}["no-limits"].pod()]))
    assert run_cli(capsys, "audit", "--pods", warned, "--policy", policy)[0] == 0
    assert run_cli(capsys, "audit", "--pods", warned, "--policy", policy, "--strict")[0] == 1
    bad = tmp / "bad.yaml"
    bad.write_text("kind: List\nitems:\n- metadata: {namespace: fit-in}\n  spec: {runtimeClassName: kata-fit-s, "
                   "containers: [{resources: {limits: {memory: 5Zi}}}]}\n")
    code, _, err = run_cli(capsys, "audit", "--pods", bad, "--policy", policy)
    assert code == 2 and "items[0]: spec.containers[0].resources.limits.memory" in err
    code, _, err = run_cli(capsys, "audit", "--pods", clean)
    assert code == 2 and "--policy" in err
    assert run_cli(capsys, "audit", "--pods", tmp / "missing.yaml", "--policy", policy)[0] == 2


def test_audit_pods_reads_namespace_labels_for_a_selector(capsys, files) -> None:
    _, pods, tmp = files
    body = json.loads(json.dumps(POLICY))
    body["spec"]["admission"]["namespaces"] = {"selector": {"matchLabels": {"kata": "checked"}}}
    policy = tmp / "selector.yaml"
    policy.write_text(yaml.safe_dump(body))
    code, out, _ = run_cli(capsys, "audit", "--pods", pods, "--policy", policy, "-o", "json")
    assert (code, json.loads(out)["findings"]) == (0, [])
    namespaces = tmp / "ns.yaml"
    namespaces.write_text(yaml.safe_dump({"kind": "List", "items": [
        {"kind": "Namespace", "metadata": {"name": IN, "labels": {"kata": "checked"}}}]}))
    code, out, _ = run_cli(capsys, "audit", "--pods", pods, "--policy", policy, "--namespaces", namespaces, "-o", "json")
    assert code == 1 and {f["namespace"] for f in json.loads(out)["findings"]} == {IN}


def test_explain_pod_says_class_vm_accounting_and_admission(capsys, files) -> None:
    policy, _, tmp = files
    pod = tmp / "pod.yaml"
    pod.write_text(yaml.safe_dump({c.name: c for c in CASES}["one-byte-above"].pod()))
    code, out, _ = run_cli(capsys, "explain", "--pod", pod, "--policy", policy, "-o", "json")
    report = json.loads(out)
    assert code == 1 and report["admission"]["allowed"] is False
    assert (report["runtimeClass"], report["class"], report["smallestFit"]) == ("kata-fit-s", "s", "kata-fit-m")
    assert report["vm"] and report["accounted"] and report["podFixed"]
    code, out, _ = run_cli(capsys, "explain", "--pod", pod, "--policy", policy)
    assert "admission:            refused [pod-envelope-exceeded]" in out
    routed = tmp / "routed.yaml"
    routed.write_text(yaml.safe_dump(Case("r", (limits("1500m", "2Gi"),), None, None, runtime_class=None,
                                          namespace=ROUTED, labels={podfit.POLICY_LABEL: "fit"}).pod()))
    code, out, _ = run_cli(capsys, "explain", "--pod", routed, "--policy", policy, "-o", "json")
    assert code == 0 and json.loads(out)["routed"] is True and json.loads(out)["runtimeClass"] == "kata-fit-m"
    code, _, err = run_cli(capsys, "explain", policy, "--pod", routed, "--class", "s")
    assert code == 2 and "--pod takes the class" in err


@pytest.mark.parametrize("cel, expected", [
    ("l['memory'] == 'x'", 'l["memory"] == "x"'),
    ("'it\\'s' + \"a'b\"", "\"it's\" + \"a'b\""),
    ("'say \"hi\"'", '"say \\"hi\\""'),
    ("size(x) > 0 ? 'a' : ''", 'size(x) > 0 ? "a" : ""'),
])
def test_cel_literals_are_double_quoted_for_readable_yaml(cel, expected) -> None:
    assert podfit._double_quoted(cel) == expected


def test_rendered_cel_has_no_single_quoted_literal() -> None:
    def expressions(value):
        if isinstance(value, dict):
            for key, item in value.items():
                if key in ("expression", "messageExpression"):
                    yield item
                else:
                    yield from expressions(item)
        elif isinstance(value, list):
            for item in value:
                yield from expressions(item)

    found = list(expressions(render_policy(parse_policy(POLICY)).shared))
    assert len(found) > 30 and not [e for e in found if "'" in e]
