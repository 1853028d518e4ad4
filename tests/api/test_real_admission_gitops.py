"""Policies as GitOps applications without the operator, on the real kube-apiserver
(tests/support/realcluster.py): each application applies one policy's `kata-sizing render` server-side
with a field manager of its own; the shared admission policies its bindings name are the
install's (`kubectl apply -k manifests/` put them there, as the chart would). Pruning one
application, as Flux and Argo CD prune (every object of its render, nothing else), leaves every
pod of the other judged exactly as before: refused, warned about, routed, word for word.
No operator runs in these tests.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from kata_sizing.core import podfit
from kata_sizing.core.model import parse_policy
from kata_sizing.core.sizing import size_policy
from tests.support.admission import cli, dry_run, verdicts
from tests.support.pods import POLICY, Case, limits
from tests.support.realcluster import ControlPlane, poll

pytestmark = pytest.mark.realserver

SHARED = "katasizing.dev/shared=admission"


def application_policy(name: str) -> dict:
    """tests/unit/test_podfit.py's policy under another name, classes and namespace."""
    body = copy.deepcopy(POLICY)
    body["metadata"]["name"] = name
    body["spec"]["admission"]["namespaces"] = {"names": [name]}
    return body


def render(tmp_path: Path, body: dict) -> Path:
    """What the application's pipeline commits: `kata-sizing render POLICY.yaml > NAME.yaml`."""
    source = tmp_path / f"{body['metadata']['name']}-policy.yaml"
    source.write_text(yaml.safe_dump(body))
    proc = cli("render", str(source))
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / f"{body['metadata']['name']}.yaml"
    out.write_text(proc.stdout)
    return out


def pods_of(name: str) -> list[dict]:
    """Pods in the application's namespace, one per verdict the policy gives."""
    rc = f"kata-{name}-s"
    opted = {podfit.POLICY_LABEL: name}
    return [
        Case("fits", (limits("1", "1Gi"),), None, None, runtime_class=rc, namespace=name).pod(),
        Case("too-big", (limits("1", "3Gi"),), None, None, runtime_class=rc, namespace=name).pod(),
        Case("no-memory-limit", (limits("500m"),), None, None, runtime_class=rc, namespace=name).pod(),
        Case("routed", (limits("1500m", "2Gi"),), None, None, runtime_class=None, namespace=name, labels=opted).pod(),
        Case("fits-no-class", (limits("8", "1Gi"),), None, None, runtime_class=None, namespace=name,
             labels=opted).pod(),
    ]


def judged(cp: ControlPlane, pods: list[dict]) -> dict[str, tuple[list[tuple[str, str, str]], str | None]]:
    """{pod: (its verdicts, the class the routing gave it)} as the API server says, one dry run each
    (so a refused pod does not hide the others' answers)."""
    seen: dict[str, tuple[list[tuple[str, str, str]], str | None]] = {}
    for pod in pods:
        proc = dry_run(cp, [pod], "-o", "json")
        routed = json.loads(proc.stdout)["spec"].get("runtimeClassName") if proc.returncode == 0 else None
        seen[pod["metadata"]["name"]] = (sorted(verdicts(proc).get(pod["metadata"]["name"], set())), routed)
    return seen


def apply_as(cp: ControlPlane, manager: str, path: Path) -> None:
    """An application's sync: server-side apply with its own field manager (Argo CD forces)."""
    cp.kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={manager}", "-f", str(path))


def managers(cp: ControlPlane, path: Path) -> dict[tuple[str, str], set[str]]:
    """{(kind, name): the field managers of the live object} for every object of a render."""
    live = json.loads(cp.kubectl("get", "--show-managed-fields", "-o", "json", "-f", str(path)).stdout)
    return {(o["kind"], o["metadata"]["name"]): {m["manager"] for m in o["metadata"]["managedFields"]}
            for o in live["items"]}


@pytest.fixture
def applications(control_plane: ControlPlane, tmp_path: Path):
    """`make(name)`: the application's namespace and its committed render; all removed after the test."""
    cp = control_plane
    made: list[tuple[dict, Path]] = []

    def make(name: str) -> Path:
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        cp.apply(namespace)
        made.append((namespace, render(tmp_path, application_policy(name))))
        return made[-1][1]

    try:
        yield cp, make
    finally:
        for namespace, path in made:
            cp.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", str(path), check=False)
            cp.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=yaml.safe_dump(namespace),
                       check=False)


def test_pruning_one_application_leaves_the_others_pods_judged_as_before(applications) -> None:
    cp, make = applications
    renders = {name: make(name) for name in ("app-a", "app-b")}
    shared = cp.kubectl("get", "validatingadmissionpolicies,mutatingadmissionpolicies", "-l", SHARED, "-o", "name")
    assert shared.stdout.split() == [
        f"validatingadmissionpolicy.admissionregistration.k8s.io/{podfit.SHARED_NAMES['envelope']}",
        f"validatingadmissionpolicy.admissionregistration.k8s.io/{podfit.SHARED_NAMES['memory']}",
        f"mutatingadmissionpolicy.admissionregistration.k8s.io/{podfit.SHARED_NAMES['route']}",
    ], "the install (manifests/admission/) holds the shared admission policies"
    for name, path in renders.items():
        apply_as(cp, name, path)
    # Two applications, no object in common: each render's objects have its manager only.
    for name, path in renders.items():
        owners = managers(cp, path)
        assert owners and all(found == {name} for found in owners.values()), owners

    b_pods = pods_of("app-b")
    expected = {  # (the verdicts, the pod's class once admitted; None: refused)
        "fits": ([], "kata-app-b-s"),
        "too-big": ([(podfit.SHARED_NAMES["envelope"], "Deny")], None),
        "no-memory-limit": ([(podfit.SHARED_NAMES["memory"], "Warn")], "kata-app-b-s"),
        "routed": ([], "kata-app-b-m"),
        "fits-no-class": ([(podfit.SHARED_NAMES["envelope"], "Deny")], None),
    }

    def b_as_expected() -> dict | None:
        seen = judged(cp, b_pods)
        shape = {pod: ([(policy, kind) for policy, kind, _ in found], routed) for pod, (found, routed) in seen.items()}
        return seen if shape == expected else None
    # The admission plugins learn of new bindings and parameters through informers.
    before = poll(b_as_expected, 30, "application B's pods are judged by its policy")
    sizing = size_policy(parse_policy(application_policy("app-b")))
    for pod in b_pods:
        messages = {message for _, _, message in before[pod["metadata"]["name"]][0]}
        said = {f.message for f in podfit.check_pod(pod, sizing, routed=True) if f.action in ("Deny", "Warn")}
        assert messages == said, pod["metadata"]["name"]  # word for word what podfit says
        routed = podfit.route_patch(pod, sizing)
        if routed:
            assert before[pod["metadata"]["name"]][1] == routed[0]["value"]
    a_pod = Case("too-big", (limits("1", "3Gi"),), None, None, runtime_class="kata-app-a-s", namespace="app-a").pod()
    poll(lambda: dry_run(cp, [a_pod]).returncode != 0, 30, "application A's too-big pod is refused")

    # Prune application A as Flux and Argo CD do: every object of its render goes.
    cp.kubectl("delete", "--wait=true", "-f", str(renders["app-a"]))
    assert cp.kubectl("get", "validatingadmissionpolicies,mutatingadmissionpolicies", "-l", SHARED,
                      "-o", "name").stdout.split() == shared.stdout.split()
    # (Its RuntimeClass is gone too, so the RuntimeClass plugin refuses such a pod now.)
    poll(lambda: "ValidatingAdmissionPolicy" not in dry_run(cp, [a_pod]).stderr, 30, "A's pods are no longer judged")
    # B's pods: the same verdicts, word for word, and the same routing.
    assert judged(cp, b_pods) == before


def test_without_the_shared_policies_the_bindings_of_an_application_judge_nothing(applications) -> None:
    """Why the shared policies must outlive every application: a binding whose policy is missing
    is ignored by the API server (here shown with a binding of a policy that does not exist)."""
    cp, make = applications
    rendered = make("app-c")
    apply_as(cp, "app-c", rendered)
    pod = pods_of("app-c")[1]
    poll(lambda: dry_run(cp, [pod]).returncode != 0, 30, "the too-big pod is refused")
    orphan = next(o for o in yaml.safe_load_all(rendered.read_text())
                  if o["kind"] == "ValidatingAdmissionPolicyBinding" and "envelope" in o["metadata"]["name"])
    orphan["spec"]["policyName"] = "kata-sizing-envelope-v0-missing"
    cp.apply(orphan)
    poll(lambda: dry_run(cp, [pod]).returncode == 0, 30, "a binding to a missing policy refuses nothing")


def test_without_its_parameters_an_applications_bindings_refuse_no_pod(applications) -> None:
    """A GitOps prune, a teardown or a deleted output namespace can remove a policy's drop-ins
    ConfigMap (its admission parameters) before its bindings: they then judge nothing
    (parameterNotFoundAction: Allow). With Deny the API server, which looks the parameters up
    before any match condition, refuses every pod of the binding's namespaces, Kata or not."""
    cp, make = applications
    rendered = make("app-d")
    apply_as(cp, "app-d", rendered)
    plain = Case("plain", (limits("1", "3Gi"),), None, None, runtime_class=None, namespace="app-d").pod()
    too_big = pods_of("app-d")[1]
    poll(lambda: dry_run(cp, [too_big]).returncode != 0, 30, "the too-big pod is refused")
    assert dry_run(cp, [plain]).returncode == 0
    params = next(o for o in yaml.safe_load_all(rendered.read_text()) if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"] == "app-d-dropins")
    cp.kubectl("delete", "configmap", "-n", params["metadata"]["namespace"], "app-d-dropins")
    poll(lambda: dry_run(cp, [too_big]).returncode == 0, 30, "the policy's bindings judge nothing")
    assert dry_run(cp, [plain]).returncode == 0, "a pod that is no Kata pod is admitted"
    # What Deny would do: refuse the plain pod, which no rule of the policy is about.
    binding = next(o for o in yaml.safe_load_all(rendered.read_text()) if o["kind"] == "MutatingAdmissionPolicyBinding")
    binding["spec"]["paramRef"]["parameterNotFoundAction"] = "Deny"
    cp.apply(binding)
    refused = poll(lambda: (lambda p: p if p.returncode != 0 else None)(dry_run(cp, [plain])), 30,
                   "with Deny, the plain pod refused")
    assert "no params found for policy binding with `Deny` parameterNotFoundAction" in refused.stderr
