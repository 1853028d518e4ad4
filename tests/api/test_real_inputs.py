"""Issue 18's input items on the real kube-apiserver (tests/support/realcluster.py): what `kata-sizing
validate` refuses, the API server refuses too, and what it accepts, the API server accepts; the
grammar the property tests draw from (tests/support/apiserver_grammar.py) is the server's; the largest
class CPU's CEL literal is accepted and one past it is not; a pod Kata would refuse to start is
refused at admission with podfit's message, word for word.

Every object is sent the way a user sends it: YAML text through `kubectl apply --dry-run=server`,
which runs decoding, the CRD's structural schema, validation and admission, and stores nothing.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import textwrap
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kata_sizing.cli import main as cli_main
from kata_sizing.core import podfit
from kata_sizing.core.model import parse_policy
from kata_sizing.core.sizing import size_policy
from tests.support import apiserver_grammar as grammar
from tests.support.realcluster import ApiError, ControlPlane, poll

pytestmark = pytest.mark.realserver

INT64_MAX = 2**63 - 1
DENIED = re.compile(r"ValidatingAdmissionPolicy '([^']+)' with binding '[^']+' denied request: (.*)$")


def cli(tmp_path: Path, command: str, text: str, *args: str) -> subprocess.CompletedProcess:
    """`kata-sizing COMMAND policy.yaml ARGS` in this process (cli.main, what the console script
    runs; tests/unit/test_startup.py holds the two equal): the table runs it some forty times, and a
    new interpreter for each took most of this module's time."""
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    argv = [command, str(path), *args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(argv)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def dry_run(cp: ControlPlane, documents: list[str]) -> tuple[set[str], str]:
    """`kubectl apply --dry-run=server` of YAML documents as written: (the names the server
    accepted, everything kubectl said on stderr)."""
    # kubectl reads a stream that starts with "{" as JSON values one after the other, else as YAML.
    json_stream = all(d.lstrip().startswith("{") for d in documents)
    proc = cp.kubectl("apply", "--dry-run=server", "-o", "name", "-f", "-",
                      input=("\n" if json_stream else "---\n").join(documents), check=False)
    return {line.rsplit("/", 1)[-1] for line in proc.stdout.split()}, proc.stderr


def policy_text(name: str, spec_lines: str) -> str:
    return (f"apiVersion: katasizing.dev/v1alpha1\nkind: KataSizingPolicy\nmetadata: {{name: {name}}}\n"
            "spec:\n  shim: qemu-runtime-rs\n" + textwrap.indent(textwrap.dedent(spec_lines).strip("\n") + "\n", "  "))


def as_sent(obj: dict) -> str:
    """An object as a document of its own, in JSON: every string stays a string to kubectl (YAML
    written by PyYAML would leave `1e3` unquoted, which go-yaml reads as a number; writing YAML
    for Go readers is render's business, tested with kubectl in tests/unit/test_render.py)."""
    return json.dumps(obj)


def runtime_class(name: str, scheduling: dict) -> str:
    return as_sent({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
                           "handler": "kata", "scheduling": scheduling})


# --- the grammar of tests/support/apiserver_grammar.py is the API server's ------------------------------


KEYS = ["kata", "example.com/kata", "/team", "a/b/c", "Example.com/a", "example.com/", "", "k" * 63, "k" * 64,
        "a.b-c_d", "-a", "a-", "a b", "a\nb", "a" * 253 + "/b", "a" * 254 + "/b", "a..b/c", "1e3", "true"]
VALUES = ["", "true", "v" * 63, "v" * 64, "-v", "v-", "a_b.c", "a b", "a/b", "1e3"]
TOLERATIONS: list[dict] = [
    {"operator": "Exists"}, {"key": "kata", "operator": "Exists", "value": "x"},
    {"key": "kata", "operator": "Exists", "tolerationSeconds": 60},
    {"key": "kata", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": -1},
    {"operator": "Equal", "value": "x"}, {}, {"key": "kata"}, {"key": "kata", "value": "bad value"},
    {"key": "/kata", "operator": "Exists"}, {"key": "kata", "operator": "Equal", "value": "v" * 64},
    {"key": "kata", "value": "true", "effect": "NoSchedule"}, {"value": "x"},
]


def _grammar_cases(keys: list[str], values: list[str], tolerations: list[dict]) -> list[tuple[str, str, bool]]:
    cases = [(f"key-{i}", runtime_class(f"key-{i}", {"nodeSelector": {key: "v"}}), grammar.label_key_ok(key))
             for i, key in enumerate(keys)]
    cases += [(f"value-{i}", runtime_class(f"value-{i}", {"nodeSelector": {"k": value}}), grammar.label_value_ok(value))
              for i, value in enumerate(values)]
    cases += [(f"tol-{i}", runtime_class(f"tol-{i}", {"tolerations": [t]}), grammar.toleration_ok(t))
              for i, t in enumerate(tolerations)]
    return cases


def _check_grammar(cp: ControlPlane, cases: list[tuple[str, str, bool]]) -> None:
    accepted, stderr = dry_run(cp, [document for _, document, _ in cases])
    wrong = [(name, expected) for name, _, expected in cases if (name in accepted) != expected]
    assert not wrong, f"the grammar says otherwise than the server for {wrong}:\n{stderr}"


def test_the_grammar_the_property_tests_draw_from_is_the_api_servers(control_plane: ControlPlane):
    cases = _grammar_cases(KEYS, VALUES, TOLERATIONS)
    cases.append(("dup", runtime_class("dup", {"tolerations": [{"key": "k", "operator": "Exists"}] * 2}),
                  grammar.tolerations_unique([{"key": "k", "operator": "Exists"}] * 2)))
    cases.append(("equal-and-absent", runtime_class("equal-and-absent", {"tolerations": [
        {"key": "k", "value": "v"}, {"key": "k", "operator": "Equal", "value": "v"}]}), True))
    for i, name in enumerate(["kata-a-s", "Kata", "a" * 63, "a" * 64, "a.b", "1e-5", "-a"]):
        document = as_sent({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                            "metadata": {"name": f"handler-{i}"}, "handler": name})
        cases.append((f"handler-{i}", document, grammar.dns_label_ok(name)))
    _check_grammar(control_plane, cases)


@settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(grammar.label_keys(), min_size=30, max_size=30),
       values=st.lists(grammar.label_values(), min_size=20, max_size=20),
       tolerations=st.lists(grammar.tolerations(), min_size=20, max_size=20))
def test_what_the_strategies_draw_the_server_judges_as_the_grammar_does(control_plane, keys, values, tolerations):
    _check_grammar(control_plane, _grammar_cases(keys, values, tolerations))


SCALAR_FIELDS = {
    "boolean": ("hugepages: {}", ("hugepages",)),
    "positive": ('classes: [{{name: s, cpu: "1", memory: 1Gi, defaultVcpus: {}}}]', ("classes", 0, "defaultVcpus")),
    "integer": ("runtimeClass: {{tolerations: [{{key: k, operator: Exists, effect: NoExecute, tolerationSeconds: {}}}]}}",
                ("runtimeClass", "tolerations", 0, "tolerationSeconds")),
    # The CRD types a nodeSelector value as a string; the label grammar is the RuntimeClass's (above).
    "string": ("runtimeClass: {{nodeSelector: {{kata: {}}}}}", ("runtimeClass", "nodeSelector", "kata")),
    "quantity": ("nodes: {{kubeReserved: {}}}", ("nodes", "kubeReserved")),
}
SCALARS = ([grammar.Scalar(w, True) for w in grammar.GO_TRUE] + [grammar.Scalar(w, False) for w in grammar.GO_FALSE]
           + [grammar.Scalar(t, v) for t, v in [("0x1F", 31), ("0o17", 15), ("017", 15), ("0b101", 5), ("1_000", 1000),
                                                ("+5", 5), ("-3", -3), ("0", 0), (str(INT64_MAX), INT64_MAX)]]
           + [grammar.Scalar(t, v) for t, v in [("1e3", 1000), ("2.0", 2), ("1.5", 1.5), ("15e-3", 0.015),
                                                ("1e21", 1e21), (str(INT64_MAX + 1), float(INT64_MAX + 1))]]
           + [grammar.Scalar(t, t) for t in ["kata", "Gi", "1Gi", "2024-01-02", "1:20", "0x", ".5_0x", "yes-no"]]
           + [grammar.quoted(t) for t in ["y", "1e3", "512Mi", "1.5", "-1Gi", "lots", ""]])


def test_unquoted_yaml_scalars_mean_to_the_server_what_the_grammar_says(control_plane: ControlPlane):
    """go-yaml's booleans and numbers, as kubectl sends them: the server's verdict and the value it
    stores are the grammar's (apiserver_grammar.Scalar)."""
    cases = []
    for kind, (line, path) in SCALAR_FIELDS.items():
        for i, scalar in enumerate(SCALARS):
            name = f"{kind}-{i}"
            cases.append((name, kind, scalar, path, policy_text(name, line.format(scalar.text))))
    accepted, stderr = dry_run(control_plane, [c[4] for c in cases])
    # kubectl prints objects only when every one was accepted: ask again for the accepted ones.
    proc = control_plane.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-",
                                 input="---\n".join(c[4] for c in cases if c[0] in accepted))
    answer = json.loads(proc.stdout)
    stored = {item["metadata"]["name"]: item for item in (answer["items"] if "items" in answer else [answer])}
    wrong: list[tuple] = []
    for name, kind, scalar, path, _ in cases:
        expected = grammar.schema_accepts(kind, scalar)
        if (name in stored) != expected:
            wrong.append((name, scalar.text, expected))
        elif expected:
            value = stored[name]["spec"]
            for part in path:
                value = value[part]
            if value != scalar.value:
                wrong.append((name, scalar.text, value, scalar.value))
    assert not wrong, f"{wrong}\n{stderr}"


# --- validate against the server: the CR, the rendered objects, or the object a value lands in -----


def rendered(tmp_path: Path, text: str) -> list[dict]:
    proc = cli(tmp_path, "render", text)
    assert proc.returncode == 0, proc.stderr
    return [o for o in yaml.safe_load_all(proc.stdout) if o]


def _in_runtime_classes(field: str, value: object) -> Callable[[list[dict]], list[dict]]:
    def land(objects: list[dict]) -> list[dict]:
        classes = [o for o in objects if o["kind"] == "RuntimeClass"]
        for rc in classes:
            rc["scheduling"][field] = value
        return classes
    return land


def _in_bindings(selector: dict) -> Callable[[list[dict]], list[dict]]:
    def land(objects: list[dict]) -> list[dict]:
        bindings = [o for o in objects if o["kind"].endswith("Binding")]
        for binding in bindings:
            binding["spec"]["matchResources"] = {"namespaceSelector": selector}
        return bindings
    return land


def _in_node_selector_query(selector: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in selector.items())


ONE_CLASS = 'classes: [{name: s, cpu: "1", memory: 1Gi}]'
# (id, spec lines, where the value lands when the CR itself is accepted: a function of the base
# policy's rendered objects, a label selector the operator lists nodes with, or None)
AGREEMENT = [
    ("example", "", None),
    ("enabled-n", "admission: {enabled: n}", None),
    ("hugepages-y", "hugepages: y", None),
    ("cpu-hex", "classes: [{name: s, cpu: 0x10, memory: 16Gi}]", None),
    ("vcpus-octal", 'classes: [{name: s, cpu: "1", memory: 1Gi, defaultVcpus: 0o17}]', None),
    ("vcpus-float-whole", 'classes: [{name: s, cpu: "1", memory: 1Gi, defaultVcpus: 2.0}]', None),
    ("tolerate-all", "runtimeClass: {tolerations: [{operator: Exists}]}", None),
    ("toleration-seconds", "runtimeClass: {tolerations: [{key: kata, operator: Exists, effect: NoExecute, "
                           "tolerationSeconds: 60}]}", None),
    ("prefixed-key", 'runtimeClass: {nodeSelector: {example.com/kata: "true"}}', None),
    ("namespace-selector", "admission: {namespaces: {selector: {matchLabels: {team: a}, matchExpressions: "
                           "[{key: example.com/tier, operator: In, values: [gold, '']}]}}}", None),
    ("largest-cpu", f'classes: [{{name: s, cpu: "{INT64_MAX}m", memory: 1Gi}}]', None),
    ("enabled-string", 'admission: {enabled: "false"}', None),
    ("cgroup-string", 'sandboxCgroupOnly: "false"', None),
    ("vcpus-string", 'classes: [{name: s, cpu: "1", memory: 1Gi, defaultVcpus: "2"}]', None),
    ("vcpus-fraction", 'classes: [{name: s, cpu: "1", memory: 1Gi, defaultVcpus: 2.5}]', None),
    ("cpu-fraction", "classes: [{name: s, cpu: 1.5, memory: 1Gi}]", None),
    ("ratio-number", "overhead: {guestMemoryRatio: 0.14}", None),
    ("selector-booleans", "runtimeClass: {nodeSelector: {y: n}}", None),
    ("empty-prefix", "runtimeClass: {nodeSelector: {/team: a}}", _in_runtime_classes("nodeSelector", {"/team": "a"})),
    ("two-slashes", "runtimeClass: {nodeSelector: {a/b/c: x}}", _in_runtime_classes("nodeSelector", {"a/b/c": "x"})),
    ("long-key", f"runtimeClass: {{nodeSelector: {{{'k' * 64}: x}}}}",
     _in_runtime_classes("nodeSelector", {"k" * 64: "x"})),
    ("bad-value", "runtimeClass: {nodeSelector: {a: -v}}", _in_runtime_classes("nodeSelector", {"a": "-v"})),
    ("exists-with-value", "runtimeClass: {tolerations: [{key: k, operator: Exists, value: x}]}",
     _in_runtime_classes("tolerations", [{"key": "k", "operator": "Exists", "value": "x"}])),
    ("seconds-without-noexecute", "runtimeClass: {tolerations: [{key: k, operator: Exists, tolerationSeconds: 5}]}",
     _in_runtime_classes("tolerations", [{"key": "k", "operator": "Exists", "tolerationSeconds": 5}])),
    ("equal-without-key", "runtimeClass: {tolerations: [{operator: Equal, value: x}]}",
     _in_runtime_classes("tolerations", [{"operator": "Equal", "value": "x"}])),
    ("neither-key-nor-operator", "runtimeClass: {tolerations: [{effect: NoSchedule}]}",
     _in_runtime_classes("tolerations", [{"effect": "NoSchedule"}])),
    ("toleration-twice", "runtimeClass: {tolerations: [{key: k, operator: Exists}, {key: k, operator: Exists}]}",
     _in_runtime_classes("tolerations", [{"key": "k", "operator": "Exists"}] * 2)),
    ("namespace-empty-prefix", "admission: {namespaces: {selector: {matchLabels: {/team: a}}}}",
     _in_bindings({"matchLabels": {"/team": "a"}})),
    ("expression-empty-prefix", "admission: {namespaces: {selector: {matchExpressions: [{key: /team, operator: Exists}]}}}",
     _in_bindings({"matchExpressions": [{"key": "/team", "operator": "Exists"}]})),
    ("nodes-empty-prefix", "nodes: {selector: {/team: a}}", {"/team": "a"}),
    # A class CPU past int64 millicores lands in the admission parameters, where the server stores
    # it and the shared CEL cannot read it: test_the_largest_class_cpu_... shows that on the server.
]


def test_what_validate_refuses_the_server_refuses_and_what_it_accepts_the_server_accepts(
        control_plane: ControlPlane, tmp_path: Path):
    cp = control_plane
    names = {case_id: f"agree-{i}" for i, (case_id, _, _) in enumerate(AGREEMENT)}
    texts = {case_id: policy_text(names[case_id], lines) for case_id, lines, _ in AGREEMENT}
    verdicts = {case_id: cli(tmp_path, "validate", text).returncode for case_id, text in texts.items()}
    assert set(verdicts.values()) <= {0, 1}, verdicts
    accepted_crs, cr_stderr = dry_run(cp, list(texts.values()))
    base_objects = rendered(tmp_path, policy_text("agree-base", ""))
    table = []
    for case_id, _, landing in AGREEMENT:
        cli_accepts = verdicts[case_id] == 0
        cr_accepted = names[case_id] in accepted_crs
        if cli_accepts:
            objects = rendered(tmp_path, texts[case_id])
            accepted, stderr = dry_run(cp, [as_sent(o) for o in objects])
            server_accepts = cr_accepted and accepted == {o["metadata"]["name"] for o in objects}
            why = stderr
        elif not cr_accepted or landing is None:
            server_accepts, why = cr_accepted, cr_stderr
        elif isinstance(landing, dict):  # a node selector: the operator lists Nodes with it
            query = urllib.parse.quote(_in_node_selector_query(landing))
            try:
                cp.request("GET", f"/api/v1/nodes?labelSelector={query}")
                server_accepts, why = True, ""
            except ApiError as error:
                server_accepts, why = False, str(error)
        else:
            objects = landing(json.loads(json.dumps(base_objects)))
            assert objects, case_id
            accepted, why = dry_run(cp, [as_sent(o) for o in objects])
            server_accepts = accepted == {o["metadata"]["name"] for o in objects}
        table.append((case_id, cli_accepts, server_accepts))
        assert cli_accepts == server_accepts, f"{case_id}: validate {'accepts' if cli_accepts else 'refuses'}, " \
                                              f"the server {'accepts' if server_accepts else 'refuses'}:\n{why}"
    assert sum(1 for _, ok, _ in table if ok) == 11 and sum(1 for _, ok, _ in table if not ok) == 19, table


def test_yaml_that_kubectl_cannot_send_is_unreadable_to_validate(control_plane: ControlPlane, tmp_path: Path):
    text = policy_text("agree-nan", "classes: [{name: s, cpu: .nan, memory: 1Gi}]")
    assert cli(tmp_path, "validate", text).returncode == 2
    proc = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=text, check=False)
    assert proc.returncode != 0 and "json: unsupported value: NaN" in proc.stderr


# --- the CEL literal range ------------------------------------------------------------------------


def _output_namespace(cp: ControlPlane) -> None:
    """The parameters' namespace, created if missing, never applied over: an apply would take the
    Pod Security labels off the operator's own namespace."""
    cp.kubectl("create", "namespace", "kata-sizing", check=False)


def test_the_largest_class_cpu_is_judged_by_the_server_and_one_past_it_is_refused(
        control_plane: ControlPlane, tmp_path: Path):
    cp = control_plane
    largest = policy_text("cel-max", f'classes: [{{name: s, cpu: "{INT64_MAX}m", memory: 1Gi}}]')
    objects = [o for o in rendered(tmp_path, largest)
               if o["kind"] != "ConfigMap" or o["metadata"]["name"] == "cel-max-dropins"]
    # The drop-ins (with the parameters) and the bindings; the shared policies are the install's.
    assert [o["kind"] for o in objects if o["kind"] != "RuntimeClass"] == [
        "ConfigMap", "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicyBinding"]
    params = next(o for o in objects if o["kind"] == "ConfigMap")
    assert params["data"]["classCpu"] == str(INT64_MAX)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "cel-max"}}
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "namespace": "cel-max"},
           "spec": {"runtimeClassName": "kata-cel-max-s", "containers": [{
               "name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": {"cpu": "64", "memory": "2Gi"}}}]}}
    try:
        # Created for real (the shared policies' CEL, which the API server compiled when the
        # install stored it, reads these parameters).
        _output_namespace(cp)
        cp.kubectl("apply", "-f", "-", input="\n".join(as_sent(o) for o in [namespace, *objects]))
        # The shared CEL reads the largest int64 from the parameters and compares with it: 64 CPUs
        # fit the envelope, 2Gi does not.
        message = (f"pod cel-max/big on RuntimeClass kata-cel-max-s: limits cpu 64, memory 2Gi exceed class s "
                   f"(cpu {INT64_MAX}m, memory 1Gi), whose podFixed does not cover the guest overhead of a VM that large; "
                   "no class of policy cel-max fits")
        poll(lambda: message in cp.kubectl("create", "--dry-run=server", "-f", "-", input=as_sent(pod),
                                           check=False).stderr, 30, "the envelope policy refuses the 2Gi pod")
        pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = "1Gi"
        assert cp.kubectl("create", "--dry-run=server", "-f", "-", input=as_sent(pod), check=False).returncode == 0
        # One past it, written into the parameters by hand (validate refuses such a policy, below):
        # the CEL cannot read it, and failurePolicy Fail refuses the pod instead of letting it pass.
        cp.edit("/api/v1/namespaces/kata-sizing/configmaps/cel-max-dropins",
                lambda o: o["data"].update(classCpu=str(INT64_MAX + 1)))
        refused = poll(lambda: (lambda p: p if p.returncode != 0 else None)(
            cp.kubectl("create", "--dry-run=server", "-f", "-", input=as_sent(pod), check=False)),
            30, "the pod refused once the parameters hold a CPU past int64")
        assert podfit.SHARED_NAMES["envelope"] in refused.stderr and "error" in refused.stderr, refused.stderr
        assert "exceed class" not in refused.stderr, refused.stderr
    finally:
        cp.kubectl("delete", "--wait=false", "--ignore-not-found", "-f", "-",
                   input="\n".join(as_sent(o) for o in [*objects, namespace]), check=False)
    one_past = policy_text("cel-max", f'classes: [{{name: s, cpu: "{INT64_MAX + 1}m", memory: 1Gi}}]')
    proc = cli(tmp_path, "validate", one_past)
    assert proc.returncode == 1
    assert proc.stderr.endswith(f"spec.classes[0].cpu: {INT64_MAX + 1}m is {INT64_MAX + 1} millicores; the admission "
                                f"policies compare CPU in int64 millicores, at most {INT64_MAX}m\n")
    assert cli(tmp_path, "validate", policy_text("cel-1e16", 'classes: [{name: s, cpu: "1e16", memory: 1Gi}]')
               ).returncode == 1


# --- pods Kata would refuse to start, refused at admission ----------------------------------------


ZERO = policy_text("zero", """\
    classes:
    - {name: s, cpu: "1", memory: 1Gi, defaultMemory: "0"}
    - {name: m, cpu: "2", memory: 4Gi, overheadMemory: "0", podFixed: {cpu: 500m, memory: 400Mi}}
    admission: {namespaces: {names: [zero-ns]}}
    """)


def _zero_pod(name: str, runtime_class: str, init: dict | None = None, **limits: str) -> dict:
    container = {"name": "c", "image": "registry.k8s.io/pause:3.10",
                 **({"resources": {"limits": limits}} if limits else {})}
    spec = {"runtimeClassName": runtime_class, "containers": [container]}
    if init is not None:
        spec["initContainers"] = [{"name": "i", "image": "registry.k8s.io/pause:3.10", **init}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "zero-ns"}, "spec": spec}


ZERO_PODS = [
    _zero_pod("s-no-limits", "kata-zero-s"),
    _zero_pod("s-cpu-only", "kata-zero-s", cpu="1"),
    _zero_pod("s-memory", "kata-zero-s", cpu="1", memory="512Mi"),
    _zero_pod("m-no-limits", "kata-zero-m"),
    _zero_pod("m-cpu-only", "kata-zero-m", cpu="1"),
    _zero_pod("m-below-a-mebibyte", "kata-zero-m", memory="1048575"),
    _zero_pod("m-a-mebibyte", "kata-zero-m", memory="1Mi"),
    _zero_pod("m-init-memory-only", "kata-zero-m", init={"resources": {"limits": {"memory": "64Mi"}}}, cpu="1"),
    _zero_pod("m-zero-memory", "kata-zero-m", cpu="1", memory="0"),
]


def test_pods_kata_would_refuse_are_refused_by_the_server_as_podfit_says(control_plane: ControlPlane, tmp_path: Path):
    cp = control_plane
    objects = [o for o in rendered(tmp_path, ZERO)
               if o["kind"] != "ConfigMap" or o["metadata"]["name"] == "zero-dropins"]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "zero-ns"}}
    _output_namespace(cp)
    cp.apply(namespace, *objects)
    try:
        probe = yaml.safe_dump(_zero_pod("probe", "kata-zero-s"))
        poll(lambda: "denied request" in cp.kubectl("create", "--dry-run=server", "-f", "-", input=probe,
                                                    check=False).stderr, 30, "the envelope policy is in force")
        proc = cp.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(ZERO_PODS), check=False)
        denied = {}
        for line in proc.stderr.splitlines():
            match = DENIED.search(line)
            who = re.match(r"pod [^/]+/(\S+)", match[2]) if match else None
            if match and who:
                denied[who[1]] = (match[1], match[2])
        sizing = size_policy(parse_policy(yaml.safe_load(ZERO)))
        expected = {}
        for pod in ZERO_PODS:
            for finding in podfit.check_pod(pod, sizing):
                if finding.action == "Deny":
                    expected[pod["metadata"]["name"]] = (podfit.SHARED_NAMES["envelope"], finding.message)
        assert denied == expected, proc.stderr
        assert set(expected) == {"s-no-limits", "m-cpu-only", "m-below-a-mebibyte", "m-zero-memory"}
        created = set(re.findall(r"pod/(\S+) created \(server dry run\)", proc.stdout))
        assert created == {p["metadata"]["name"] for p in ZERO_PODS} - set(expected)
    finally:
        cp.kubectl("delete", "--wait=false", "--ignore-not-found", "-f", "-",
                   input=yaml.safe_dump_all([*objects, namespace]), check=False)
