"""The admission objects of a policy on the real kube-apiserver (tests/support/realcluster.py).

What only the API server can decide: that it accepts the shared ValidatingAdmissionPolicies and
MutatingAdmissionPolicy (the install's, `render --shared`) and a policy's bindings (schema, CEL
compilation, type checking against the Pod schema); what their CEL says about every pod of
tests/unit/test_podfit.py's table, word for word
against podfit's Python rule, `kata-sizing explain --pod` and `audit --pods`; each action
(Deny, Warn, Audit) as kubectl shows it; the routing of opted-in pods at every envelope
boundary, with the overhead and scheduling the RuntimeClass admission plugin adds; in-place
resize held to the same envelope. Pods are only stored (no kubelet); most are created with
`--dry-run=server`, which runs the whole admission chain.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections import defaultdict

import pytest
import yaml

from kata_sizing.core import podfit, podread
from kata_sizing.core.model import parse_policy
from kata_sizing.core.sizing import size_policy
from tests.support.admission import cli, dry_run, rendered_objects, verdicts
from tests.support.pods import CASES, IN, OUT, POLICY, ROUTED, Case, limits
from tests.support.realcluster import ControlPlane, poll

pytestmark = pytest.mark.realserver

TOLERATION = {"key": "kata", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}
POLICY_BODY = copy.deepcopy(POLICY)
POLICY_BODY["spec"]["runtimeClass"] = {"nodeSelector": {"katacontainers.io/kata-runtime": "true"},
                                       "tolerations": [TOLERATION]}
NAMESPACE_OPTED = "fit-ns-opted"
POLICY_BODY["spec"]["admission"]["namespaces"]["names"].append(NAMESPACE_OPTED)
# The policies kubectl names in a verdict: the shared ones (each with this policy's binding).
NAMES = podfit.SHARED_NAMES
PAUSE = "registry.k8s.io/pause:3.10"

def expected_verdicts(pods: list[dict], sizing) -> dict[str, set[tuple[str, str, str]]]:
    """What podfit says the API server will say, in the same shape (the routing applied first)."""
    expected: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    vap = {podfit.RULE_MEMORY_LIMIT_MISSING: NAMES["memory"], podfit.RULE_ENVELOPE_EXCEEDED: NAMES["envelope"],
           podfit.RULE_NOT_ROUTED: NAMES["envelope"]}
    for pod in pods:
        labels = {podfit.POLICY_LABEL: "fit"} if pod["metadata"]["namespace"] == NAMESPACE_OPTED else None
        for finding in podfit.check_pod(pod, sizing, namespace_labels=labels, routed=True):
            if finding.action in ("Deny", "Warn"):
                expected[finding.name].add((vap[finding.rule], finding.action, finding.message))
    return expected


@pytest.fixture(scope="module")
def fit_cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory):
    """The policy's RuntimeClasses and admission objects, applied as `render` prints them."""
    cp = control_plane
    tmp = tmp_path_factory.mktemp("admission")
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
                  for name in (IN, OUT, ROUTED)]
    namespaces.append({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": NAMESPACE_OPTED, "labels": {podfit.POLICY_LABEL: "fit"}}})
    # Not the kata-deploy values; the drop-ins, which hold the admission parameters the bindings
    # name, yes. The shared admission policies are the install's (manifests/admission/).
    objects = [o for o in rendered_objects(tmp, POLICY_BODY)
               if o["kind"] != "ConfigMap" or o["metadata"]["name"] == "fit-dropins"]
    # The parameters' namespace, created if missing, never applied over: an apply would take the
    # Pod Security labels off the operator's own namespace.
    cp.kubectl("create", "namespace", objects[-1]["spec"]["paramRef"]["namespace"], check=False)
    cp.apply(*namespaces, *objects)
    # The admission plugins learn of new policies through informers: wait until one refuses.
    probe = Case("probe", (limits("8", "1Gi"),), None, None).pod()
    poll(lambda: cp.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(probe),
                            check=False).returncode != 0, 30, "the envelope policy refuses a pod")
    for opted in (Case("probe", (limits("1", "1Gi"),), None, None, runtime_class=None, namespace=ROUTED,
                       labels={podfit.POLICY_LABEL: "fit"}).pod(),
                  Case("probe", (limits("1", "1Gi"),), None, None, runtime_class=None,
                       namespace=NAMESPACE_OPTED).pod()):
        poll(lambda: "runtimeClassName" in cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                                                      input=yaml.safe_dump(opted), check=False).stdout,
             30, f"the routing policy sets a class in namespace {opted['metadata']['namespace']}")
    yield cp, tmp, objects
    cp.kubectl("delete", "--wait=false", "--ignore-not-found", "-f", "-",
               input=yaml.safe_dump_all(objects + namespaces), check=False)


def test_the_server_serves_the_admission_apis_it_is_given(fit_cluster) -> None:
    cp, _, _ = fit_cluster
    objects = [o for o in yaml.safe_load_all(cli("render", "--shared").stdout)]  # what the install holds
    resources = cp.kubectl("api-resources", "--api-group=admissionregistration.k8s.io", "-o", "name").stdout.split()
    assert "mutatingadmissionpolicies.admissionregistration.k8s.io" in resources
    versions = cp.kubectl("api-versions").stdout.split()
    assert podfit.MUTATING_API_VERSION in versions and podfit.ADMISSION_API_VERSION in versions
    # kube-controller-manager's ValidatingAdmissionPolicy status controller type-checks each
    # policy's CEL against the Pod schema and writes what it finds to status.typeChecking (no
    # controller does that for MutatingAdmissionPolicies). It is checked on copies under names of
    # this test's own: the install's policies are deleted and put back by other tests while the
    # operator runs, and the controller applies a status by name, without the object's uid, so an
    # apply for the deleted object can land on its re-created twin with the old observedGeneration
    # (which then never matches the new object's generation again).
    copies = []
    for obj in objects:
        if obj["kind"] == "ValidatingAdmissionPolicy":
            twin = copy.deepcopy(obj)
            twin["metadata"] = {"name": f"typecheck-{obj['metadata']['name']}"}  # no binding: enforces nothing
            copies.append(twin)
    assert copies
    cp.apply(*copies)
    try:
        for twin in copies:
            name = twin["metadata"]["name"]

            def type_checked(name: str = name) -> tuple[dict] | None:
                live = json.loads(cp.kubectl("get", "validatingadmissionpolicy", name, "-o", "json").stdout)
                status = live.get("status") or {}
                if status.get("observedGeneration") != live["metadata"]["generation"] or "typeChecking" not in status:
                    return None
                return (status["typeChecking"],)  # {} when the CEL checked clean
            (checking,) = poll(type_checked, 60, f"status.typeChecking of ValidatingAdmissionPolicy {name}",
                               interval=0.5)
            assert not checking.get("expressionWarnings"), checking
    finally:
        cp.kubectl("delete", "--ignore-not-found", "-f", "-", input=yaml.safe_dump_all(copies), check=False)


def test_every_pod_of_the_table_gets_the_verdict_podfit_gives(fit_cluster) -> None:
    cp, _, _ = fit_cluster
    pods = [c.pod() for c in CASES]
    proc = dry_run(cp, pods)
    got = verdicts(proc)
    expected = expected_verdicts(pods, size_policy(parse_policy(POLICY_BODY)))
    assert dict(got) == dict(expected)
    created = {m for m in re.findall(r"pod/(\S+) created \(server dry run\)", proc.stdout)}
    refused = {name for name, v in expected.items() if any(kind == "Deny" for _, kind, _ in v)}
    assert created == {c.name for c in CASES} - refused


MEMORY_FORMS = ("512Mi", "1Gi", str(1024**3 + 1), "0.5Gi", "1.5Gi", "1536Mi", "1000Mi", "100M", "3Gi", "4Gi",
                str(4 * 1024**3 + 1), "1073741824", "0")
CPU_FORMS = ("100m", "250m", "0.5", "1", "1001m", "1.5", "2", "2001m", "3", "1000500u", "0.001", "4", "4001m")


def random_pods(count: int, seed: int) -> list[dict]:
    """Pods drawn around the envelopes: 1 to 3 containers, up to 3 init containers (half of
    them sidecars), some limits unset, some pod-level limits, every quantity form in use."""
    import random

    rng = random.Random(seed)

    def some_limits() -> dict:
        values = {}
        if rng.random() < 0.8:
            values["cpu"] = rng.choice(CPU_FORMS)
        if rng.random() < 0.85:
            values["memory"] = rng.choice(MEMORY_FORMS)
        return {"resources": {"limits": values}} if values else {}

    pods = []
    for number in range(count):
        inits = tuple({**({"restartPolicy": "Always"} if rng.random() < 0.5 else {}), **some_limits()}
                      for _ in range(rng.randrange(4)))
        containers = tuple(some_limits() for _ in range(rng.randrange(1, 4)))
        pod_limits = None
        if rng.random() < 0.15:  # pod-level limits, with containers that set none
            containers = tuple({} for _ in containers)
            inits = tuple({k: v for k, v in i.items() if k == "restartPolicy"} for i in inits)
            pod_limits = {"cpu": rng.choice(CPU_FORMS[1:]), "memory": rng.choice(MEMORY_FORMS[:-1])}
        pods.append(Case(f"random-{seed}-{number}", containers, None, None, init_containers=inits,
                         pod_limits=pod_limits, runtime_class=rng.choice(("kata-fit-s", "kata-fit-m", "kata-fit-l")),
                         ).pod())
    return pods


def test_random_pods_get_the_verdict_podfit_gives(fit_cluster) -> None:
    cp, _, _ = fit_cluster
    pods = random_pods(80, seed=10)
    proc = dry_run(cp, pods)
    assert "is invalid" not in proc.stderr, proc.stderr  # every drawn pod is one the server accepts as a Pod
    expected = expected_verdicts(pods, size_policy(parse_policy(POLICY_BODY)))
    assert dict(verdicts(proc)) == dict(expected)
    assert expected, "the draw holds pods the rules refuse or warn about"


def test_explain_and_audit_agree_with_the_server_on_every_pod(fit_cluster) -> None:
    cp, tmp, _ = fit_cluster
    pods = [c.pod() for c in CASES]
    server = verdicts(dry_run(cp, pods))
    (tmp / "pods.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": pods}))
    (tmp / "pods-multi.yaml").write_text(yaml.safe_dump_all(pods))
    (tmp / "fit.yaml").write_text(yaml.safe_dump(POLICY_BODY))

    audit = cli("audit", "--pods", str(tmp / "pods.yaml"), "--policy", str(tmp / "fit.yaml"), "-o", "json")
    assert audit.returncode == 1, audit.stderr  # some pods are over their envelope (Deny)
    audited: dict[str, set[str]] = defaultdict(set)
    for finding in json.loads(audit.stdout)["findings"]:
        audited[finding["name"]].add(finding["message"])
    assert dict(audited) == {name: {message for _, _, message in v} for name, v in server.items()}

    explain = cli("explain", "--pod", str(tmp / "pods-multi.yaml"), "--policy", str(tmp / "fit.yaml"), "-o", "json")
    assert explain.returncode == 1, explain.stderr
    for report in json.loads(explain.stdout):
        name = report["pod"]["name"]
        said = {(f["action"], f["message"]) for f in report["admission"]["findings"]}
        assert said == {(kind, message) for _, kind, message in server.get(name, set())}, name
        assert report["admission"]["allowed"] == all(kind != "Deny" for _, kind, _ in server.get(name, set()))


@pytest.mark.parametrize("rule, action", [
    (rule, action) for rule in ("memoryLimitMissing", "envelopeExceeded") for action in ("Deny", "Warn", "Audit")
])
def test_each_rule_with_each_action_as_kubectl_shows_it(fit_cluster, rule, action) -> None:
    cp, tmp, objects = fit_cluster
    body = copy.deepcopy(POLICY_BODY)
    body["spec"]["admission"].update({"memoryLimitMissing": "Audit", "envelopeExceeded": "Audit", rule: action})
    bindings = [o for o in rendered_objects(tmp, body) if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    cp.apply(*bindings)
    pod = (Case(f"act-{action.lower()}-m", ({},), None, None) if rule == "memoryLimitMissing"
           else Case(f"act-{action.lower()}-e", (limits("1", "2Gi"),), None, None)).pod()
    message = podfit.check_pod(pod, size_policy(parse_policy(body)))[0].message
    try:
        # The binding's new action reaches the admission plugin through its informer.
        def shows() -> bool:
            proc = dry_run(cp, [pod])
            seen = {v[1] for v in verdicts(proc).get(pod["metadata"]["name"], set())}
            return seen == ({action} if action != "Audit" else set())
        poll(shows, 20, f"{rule} acts as {action}")
        mark = cp.audit_offset()
        proc = cp.kubectl("create", "-f", "-", input=yaml.safe_dump(pod), check=False)
        if action == "Deny":
            assert proc.returncode != 0 and message in proc.stderr
            assert cp.get(f"/api/v1/namespaces/{IN}/pods/{pod['metadata']['name']}") is None
        else:
            assert proc.returncode == 0, proc.stderr
            assert ("Warning: Validation failed" in proc.stderr and message in proc.stderr) == (action == "Warn")
            stored = cp.get(f"/api/v1/namespaces/{IN}/pods/{pod['metadata']['name']}")
            assert stored is not None
            if action == "Audit":
                # The API server's audit log carries the failure as an annotation of the request.
                def audited() -> bool:
                    for entry in cp.audit_entries(mark):
                        ref = entry.get("objectRef") or {}
                        if ref.get("name") == pod["metadata"]["name"] and entry.get("verb") == "create":
                            notes = entry.get("annotations") or {}
                            if any(message in v for v in notes.values()):
                                return True
                    return False
                poll(audited, 10, "the audit log records the validation failure")
    finally:
        cp.kubectl("delete", "pod", "-n", IN, pod["metadata"]["name"], "--ignore-not-found", "--wait=false",
                   check=False)
        cp.apply(*[o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"])


@pytest.mark.parametrize("cpu, memory, expected", [
    ("1", "1Gi", "kata-fit-s"),
    ("1", str(1024**3 + 1), "kata-fit-m"),
    ("1001m", "1Gi", "kata-fit-m"),
    ("2", "4Gi", "kata-fit-m"),
    ("2001m", "4Gi", "kata-fit-l"),
    ("2", str(4 * 1024**3 + 1), "kata-fit-l"),
    ("4", "16Gi", "kata-fit-l"),
    ("4001m", "16Gi", None),
    ("4", str(16 * 1024**3 + 1), None),
])
def test_routing_at_every_envelope_boundary(fit_cluster, cpu, memory, expected) -> None:
    """An opted-in pod gets exactly what a pod naming the class gets: runtimeClassName, the
    class's podFixed as spec.overhead, its nodeSelector and tolerations (the RuntimeClass
    admission plugin runs again after the MutatingAdmissionPolicy changed the pod)."""
    cp, _, _ = fit_cluster
    sizing = size_policy(parse_policy(POLICY_BODY))
    tag = f"{cpu}-{memory}".lower().replace("m", "x")
    by_label = Case(f"route-{tag}", (limits(cpu, memory),), None, None, runtime_class=None, namespace=ROUTED,
                    labels={podfit.POLICY_LABEL: "fit"}).pod()
    by_namespace = Case(f"route-ns-{tag}", (limits(cpu, memory),), None, None, runtime_class=None,
                        namespace=NAMESPACE_OPTED).pod()
    for pod in (by_label, by_namespace):
        proc = dry_run(cp, [pod], "-o", "json")
        if expected is None:
            assert proc.returncode != 0, (
                f"{pod['metadata']['namespace']}/{pod['metadata']['name']} admitted with runtimeClassName "
                f"{json.loads(proc.stdout)['spec'].get('runtimeClassName')!r}; warnings: {proc.stderr!r}")
            [finding] = podfit.check_pod(pod, sizing, namespace_labels={podfit.POLICY_LABEL: "fit"}, routed=True)
            assert finding.rule == podfit.RULE_NOT_ROUTED and finding.message in proc.stderr
            continue
        assert proc.returncode == 0, proc.stderr
        routed = json.loads(proc.stdout)["spec"]
        named = copy.deepcopy(pod)
        named["spec"]["runtimeClassName"] = expected
        named["metadata"]["name"] += "-named"
        written = json.loads(dry_run(cp, [named], "-o", "json").stdout)["spec"]
        pod_fixed = next(c for c in sizing.classes if c.runtime_class == expected).pod_fixed
        assert routed["runtimeClassName"] == expected
        assert routed["overhead"] == pod_fixed == written["overhead"]
        assert routed["nodeSelector"] == {"katacontainers.io/kata-runtime": "true"} == written["nodeSelector"]
        assert TOLERATION in routed["tolerations"] and routed["tolerations"] == written["tolerations"]


def test_a_pod_outside_the_namespaces_is_neither_routed_nor_checked(fit_cluster) -> None:
    cp, _, _ = fit_cluster
    pod = Case("outside", (limits("8", "32Gi"),), None, None, runtime_class=None, namespace=OUT,
               labels={podfit.POLICY_LABEL: "fit"}).pod()
    proc = dry_run(cp, [pod], "-o", "json")
    assert proc.returncode == 0, proc.stderr
    assert "runtimeClassName" not in json.loads(proc.stdout)["spec"]


def test_in_place_resize_is_held_to_the_envelope(fit_cluster) -> None:
    cp, _, _ = fit_cluster
    pod = Case("resized", ({"resources": {"limits": {"cpu": "500m", "memory": "512Mi"},
                                          "requests": {"cpu": "500m", "memory": "512Mi"}}},), None, None).pod()
    cp.kubectl("create", "-f", "-", input=yaml.safe_dump(pod))
    try:
        def resize(cpu: str, memory: str) -> subprocess.CompletedProcess:
            patch = {"spec": {"containers": [{"name": "c0", "resources": {
                "limits": {"cpu": cpu, "memory": memory}, "requests": {"cpu": cpu, "memory": memory}}}]}}
            return cp.kubectl("patch", "pod", "-n", IN, "resized", "--subresource", "resize", "--type", "strategic",
                              "-p", json.dumps(patch), check=False)
        inside = resize("1", "1Gi")
        assert inside.returncode == 0, inside.stderr
        outside = resize("1", "2Gi")
        assert outside.returncode != 0
        assert "memory 2Gi exceed class s (cpu 1, memory 1Gi)" in outside.stderr
    finally:
        cp.kubectl("delete", "pod", "-n", IN, "resized", "--wait=false", check=False)


def test_a_pod_with_thousands_of_init_containers_stays_within_the_cel_cost_limit(fit_cluster) -> None:
    """The sidecar sums are prefix sums over blocks, linear in the pod: 3,000 init containers (half
    sidecars) are judged by the rule, not refused for CEL cost (a sum over every sidecar before
    each init container ran out of cost at about 460: docs/admission.md)."""
    cp, _, _ = fit_cluster
    inits = tuple({**({"restartPolicy": "Always"} if i % 2 else {}), **limits("1m", "1Mi")} for i in range(3000))
    inside = Case("many-inits", (limits("2500m", "1Gi"),), None, None, init_containers=inits,
                  runtime_class="kata-fit-l").pod()
    over = Case("many-inits-over", (limits("2501m", "1Gi"),), None, None, init_containers=inits,
                runtime_class="kata-fit-l").pod()
    assert podread.pod_limits(inside).cpu_millis == 4000
    proc = dry_run(cp, [inside, over])
    assert "pod/many-inits created (server dry run)" in proc.stdout, proc.stderr
    [finding] = podfit.check_pod(over, size_policy(parse_policy(POLICY_BODY)))
    assert finding.message in proc.stderr and "cost" not in proc.stderr


def many_init_containers(count: int, seed: int) -> list[dict]:
    """Pods of 33 to 140 init containers (more than one block of the CEL's sidecar sums), each a
    sidecar or not at random, with limits drawn so that the peak of some init container after
    many sidecars decides the pod's figures, which the messages print."""
    import random

    rng = random.Random(seed)
    pods = []
    for number in range(count):
        inits = []
        for _ in range(rng.randrange(33, 141)):
            sidecar = rng.random() < 0.5
            inits.append({**({"restartPolicy": "Always"} if sidecar else {}),
                          **limits(f"{rng.randrange(1, 60)}m", f"{rng.randrange(1, 200)}Mi")})
        # A large plain init container late in the list: its peak is its limit plus every sidecar before it.
        inits.insert(rng.randrange(len(inits) // 2, len(inits)), limits(f"{rng.randrange(1000, 3000)}m",
                                                                       f"{rng.randrange(2, 12)}Gi"))
        pods.append(Case(f"inits-{seed}-{number}", (limits("500m", "512Mi"),), None, None, init_containers=tuple(inits),
                         runtime_class=rng.choice(("kata-fit-s", "kata-fit-m"))).pod())
    return pods


def test_pods_with_many_init_containers_get_the_figures_and_verdict_podfit_gives(fit_cluster) -> None:
    """The effective limits over many init containers, word for word: every pod here exceeds its
    class (s or m) and the message prints the figures the CEL computed."""
    cp, _, _ = fit_cluster
    pods = many_init_containers(12, seed=34)
    expected = expected_verdicts(pods, size_policy(parse_policy(POLICY_BODY)))
    assert all(any(kind == "Deny" for _, kind, _ in v) for v in expected.values()) and len(expected) == len(pods)
    assert dict(verdicts(dry_run(cp, pods))) == dict(expected)
