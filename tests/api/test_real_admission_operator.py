"""The operator and the admission objects against the real kube-apiserver: it writes each
policy's bindings and guards the shared ValidatingAdmissionPolicies and MutatingAdmissionPolicy
they name (the install's), puts back a hand edit or deletion, leaves a foreign object alone, removes
them with the policy (and the real garbage
collector does when the operator is stopped); the pods the server stored against the rules are
listed in status.podAudit with a Warning event; and the webhook fallback routes a pod through a real
MutatingWebhookConfiguration. The admission rules themselves are tests/api/test_real_admission.py's.
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kata_sizing.controller.compare import spec_differences
from kata_sizing.core import podfit
from tests.support.admission import ADMISSION, writers
from tests.support.paths import ROOT
from tests.support.realcluster import (
    POLICIES,
    ControlPlane,
    create_ready,
    free_port,
    poll,
    qemu_rs,
    quiet,
    render,
    status,
    wait_observed,
)

pytestmark = pytest.mark.realserver

KINDS = {
    "ValidatingAdmissionPolicy": f"{ADMISSION}/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": f"{ADMISSION}/validatingadmissionpolicybindings",
    "MutatingAdmissionPolicy": f"{ADMISSION}/mutatingadmissionpolicies",
    "MutatingAdmissionPolicyBinding": f"{ADMISSION}/mutatingadmissionpolicybindings",
}
PODS = "/api/v1/namespaces/default/pods"
# The install's: the shared policies and the keep-alive binding of each.
SHARED = set(podfit.SHARED_NAMES.values()) | set(podfit.KEEP_ALIVE_NAMES.values())


def admission_objects(cp: ControlPlane, policy: str) -> dict[tuple[str, str], dict]:
    """The policy's own admission objects: its bindings."""
    return {(kind, name): obj for kind, path in KINDS.items()
            for name, obj in cp.items(path, f"katasizing.dev/policy={policy}").items()}


def shared_objects(cp: ControlPlane) -> dict[tuple[str, str], dict]:
    """The admission policies every policy binds, and their keep-alive bindings."""
    return {(kind, name): obj for kind, path in KINDS.items()
            for name, obj in cp.items(path, "katasizing.dev/shared=admission").items()}


def render_shared() -> str:
    """`kata-sizing render --shared`: the shared admission policies the install holds."""
    return subprocess.run([sys.executable, "-m", "kata_sizing.cli", "render", "--shared"],
                          capture_output=True, text=True, check=True).stdout


def expected_admission(body: dict, tmp_path: Path) -> dict[tuple[str, str], dict]:
    """The policy's bindings and the shared admission policies they name (which it guards)."""
    shared = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(render_shared())}
    return {key: obj for key, obj in {**shared, **render(body, tmp_path)}.items() if key[0] in KINDS}


def params_path(policy: str) -> str:
    """The drop-ins ConfigMap, which holds the admission parameters."""
    return f"/api/v1/namespaces/kata-sizing/configmaps/{policy}-dropins"


def all_corrections(cp: ControlPlane) -> int:
    """status.driftCorrections summed over every policy: a shared object put back counts on the
    policy whose pass put it back."""
    return sum(int((p.get("status") or {}).get("driftCorrections") or 0) for p in cp.items(POLICIES).values())


def path_of(key: tuple[str, str]) -> str:
    return f"{KINDS[key[0]]}/{key[1]}"


def pod(name: str, runtime_class: str | None = None, labels: dict | None = None, namespace: str = "default",
        **limits: str) -> dict:
    spec: dict = {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                  "resources": {"limits": limits} if limits else {}}]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": namespace, **({"labels": labels} if labels else {})}, "spec": spec}


def events(cp: ControlPlane, reason: str) -> list[dict]:
    """Events about policies (kopf posts those of cluster-scoped objects into "default")."""
    found = cp.items("/api/v1/namespaces/default/events")
    return [e for e in found.values() if e.get("reason") == reason]


def audit_events(cp: ControlPlane) -> list[dict]:
    """The PodAudit events, oldest first."""
    return sorted(events(cp, "PodAudit"), key=lambda e: int(e["metadata"]["resourceVersion"]))


def delete_pods(cp: ControlPlane, *paths: str) -> None:
    for path in paths:
        cp.delete(path)


# --- the admission objects as managed outputs ------------------------------------------------------


def test_the_operator_writes_the_admission_policies_and_puts_back_hand_edits_and_deletions(
        control_plane, real_operator, tmp_path):
    cp = control_plane
    real_operator.start()
    body = qemu_rs("gate")
    create_ready(cp, body)
    expected = expected_admission(body, tmp_path)
    assert {k for k, _ in expected} == set(KINDS), sorted(expected)
    shared = shared_objects(cp)
    assert sorted(shared) == [("MutatingAdmissionPolicy", podfit.SHARED_NAMES["route"]),
                              ("MutatingAdmissionPolicyBinding", podfit.KEEP_ALIVE_NAMES["route"]),
                              ("ValidatingAdmissionPolicy", podfit.SHARED_NAMES["envelope"]),
                              ("ValidatingAdmissionPolicy", podfit.SHARED_NAMES["memory"]),
                              ("ValidatingAdmissionPolicyBinding", podfit.KEEP_ALIVE_NAMES["envelope"]),
                              ("ValidatingAdmissionPolicyBinding", podfit.KEEP_ALIVE_NAMES["memory"])]
    live = {**shared, **admission_objects(cp, "gate")}
    assert sorted(live) == sorted(expected)
    uid = cp.get(f"{POLICIES}/gate")["metadata"]["uid"]
    params = cp.get(params_path("gate"))
    rendered_params = render(body, tmp_path)[("ConfigMap", "gate-dropins")]
    assert params["data"] == rendered_params["data"]
    for key, obj in [*live.items(), (("ConfigMap", "gate-dropins"), params)]:
        owners = [(o["kind"], o["uid"], o.get("controller")) for o in obj["metadata"].get("ownerReferences") or []]
        if key in shared:
            # Bound by every policy, owned by none: deleting one policy leaves the others' rule.
            assert owners == [], key
        else:
            # Owned by the cluster-scoped policy: the garbage collector removes them with it.
            assert owners == [("KataSizingPolicy", uid, True)], key
        if key[0] == "ConfigMap":
            continue
        assert obj["metadata"]["labels"] == expected[key]["metadata"]["labels"]
        # What render prints, which holds every field the server defaults (matchPolicy, empty
        # selectors, each rule's scope, failurePolicy): the server added nothing.
        assert obj["spec"] == expected[key]["spec"], key
        assert spec_differences(expected[key]["spec"], obj["spec"]) == [], key
    quiet(cp)
    corrections = all_corrections(cp)

    envelope = ("ValidatingAdmissionPolicy", podfit.SHARED_NAMES["envelope"])
    binding = ("ValidatingAdmissionPolicyBinding", "kata-sizing-gate-memory-limit")
    route = ("MutatingAdmissionPolicyBinding", "kata-sizing-gate-route")
    good = copy.deepcopy(live)
    cp.edit(path_of(envelope), lambda o: o["spec"]["validations"][0].update(expression="true"))
    poll(lambda: cp.get(path_of(envelope))["spec"]["validations"] == good[envelope]["spec"]["validations"], 10,
         "the envelope validation put back")
    cp.edit(path_of(binding), lambda o: o["spec"].update(validationActions=["Audit"]))
    poll(lambda: cp.get(path_of(binding))["spec"]["validationActions"] == good[binding]["spec"]["validationActions"],
         10, "the binding's action put back")
    # Somebody else's parameters, which refuse every pod of the namespaces while missing: put back.
    cp.edit(path_of(binding), lambda o: o["spec"].update(paramRef={"name": "x", "parameterNotFoundAction": "Deny"}))
    poll(lambda: cp.get(path_of(binding))["spec"]["paramRef"] == good[binding]["spec"]["paramRef"], 10,
         "the binding's paramRef put back")
    # A selector the server would default to {} but somebody narrowed: the routing would stop.
    cp.edit(path_of(route), lambda o: o["spec"].update(matchResources={"objectSelector": {"matchLabels": {"a": "b"}}}))
    poll(lambda: "matchResources" not in cp.get(path_of(route))["spec"], 10, "the narrowed binding put back")
    mutating = ("MutatingAdmissionPolicy", podfit.SHARED_NAMES["route"])
    cp.edit(path_of(mutating), lambda o: o["spec"].update(failurePolicy="Ignore"))
    poll(lambda: cp.get(path_of(mutating))["spec"]["failurePolicy"] == good[mutating]["spec"]["failurePolicy"], 10,
         "the routing's failurePolicy put back")
    # Whoever may write ConfigMaps in the output namespace could widen the envelopes there: put back.
    cp.edit(params_path("gate"), lambda o: o["data"].update(classMemory="9" * 18))
    poll(lambda: cp.get(params_path("gate"))["data"] == params["data"], 10, "the widened parameters put back")
    for deleted in live:  # every object, each kind
        cp.delete(path_of(deleted))
        poll(lambda deleted=deleted: cp.get(path_of(deleted)), 10, f"the deleted {deleted} re-created")
    cp.delete(params_path("gate"))
    poll(lambda: cp.get(params_path("gate")), 10, "the deleted parameters re-created")
    # Somebody else's label is not drift.
    cp.edit(path_of(envelope), lambda o: o["metadata"]["labels"].update({"team": "platform"}))
    total = corrections + 6 + len(live) + 1
    poll(lambda: all_corrections(cp) >= total, 10, lambda: f"corrections {all_corrections(cp)} < {total}")
    quiet(cp)
    assert cp.get(path_of(envelope))["metadata"]["labels"]["team"] == "platform"
    assert all_corrections(cp) == total
    # The shared policy outlives this test: leave it as the operator wrote it.
    cp.edit(path_of(envelope), lambda o: o["metadata"]["labels"].pop("team"))


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _comparable(obj: dict) -> dict:
    """An object without what every write changes (resourceVersion, managedFields) and kubectl's
    copy of what it last applied, which a server-side apply rewrites (the install's `kubectl apply
    -k manifests/` left one on the shared admission policies)."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "managedFields")}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    if annotations or "annotations" in meta:
        meta["annotations"] = annotations
    return {**obj, "metadata": meta}


def test_render_applied_server_side_by_a_gitops_tool_over_the_operators_objects_is_a_no_op(
        control_plane, real_operator, tmp_path):
    """Argo CD (or Flux) applies `kata-sizing render`'s output with server-side apply over the
    objects the operator wrote: no conflict on .spec.matchConstraints (an atomic struct whose
    defaulted fields render now writes out), nothing changed, and the operator does not answer."""
    cp = control_plane
    real_operator.start()
    body = qemu_rs("gitops")
    path = tmp_path / "gitops.yaml"
    path.write_text(yaml.safe_dump(body))
    create_ready(cp, body)
    quiet(cp)
    # The policy's render and the shared admission policies (the install's, applied by the same tool).
    written = subprocess.run([sys.executable, "-m", "kata_sizing.cli", "render", str(path)],
                             capture_output=True, text=True, check=True).stdout + render_shared()
    keys = [(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(written)]
    assert {k[0] for k in keys} >= set(KINDS) | {"RuntimeClass", "ConfigMap"}

    def live() -> dict[tuple[str, str], dict]:
        found = {}
        for kind, name in keys:
            if kind in KINDS:
                found[(kind, name)] = cp.get(path_of((kind, name)))
            elif kind == "RuntimeClass":
                found[(kind, name)] = cp.get(f"/apis/node.k8s.io/v1/runtimeclasses/{name}")
            else:
                found[(kind, name)] = cp.get(f"/api/v1/namespaces/kata-sizing/configmaps/{name}")
        return found

    # What the server did with the same objects before it defaulted nothing render leaves out:
    # with a rule's scope and the selectors left to the server, the apply conflicts.
    old_style = [o for o in yaml.safe_load_all(written) if o["kind"] == "ValidatingAdmissionPolicy"][0]
    old_style["spec"]["matchConstraints"] = {"resourceRules": [
        {k: v for k, v in rule.items() if k != "scope"} for rule in old_style["spec"]["matchConstraints"]["resourceRules"]]}
    refused = cp.kubectl("apply", "--server-side", "--field-manager=argocd", "--dry-run=server", "-f", "-",
                         input=yaml.safe_dump(old_style), check=False)
    assert refused.returncode != 0 and ".spec.matchConstraints" in refused.stderr, refused.stderr

    before = live()
    mark = cp.audit_offset()
    cp.kubectl("apply", "--server-side", "--field-manager=argocd", "-f", "-", input=written)
    after = live()
    for key in keys:
        assert _comparable(after[key]) == _comparable(before[key]), key
        managers = {m["manager"] for m in after[key]["metadata"]["managedFields"]}
        # The shared admission policies may have been written by another test's apply first.
        assert ({"argocd"} if key[1] in SHARED else {"kata-sizing", "argocd"}) <= managers, key
    quiet(cp)
    assert cp.operator_writes(mark) == [], "the operator answered the GitOps apply"
    # Applied again (a GitOps tool's next sync): not even managedFields move.
    versions = {key: obj["metadata"]["resourceVersion"] for key, obj in live().items()}
    cp.kubectl("apply", "--server-side", "--field-manager=argocd", "-f", "-", input=written)
    assert {key: obj["metadata"]["resourceVersion"] for key, obj in live().items()} == versions


def test_a_shared_policy_the_install_applied_server_side_is_put_back_as_it_applied_it_and_applies_again(
        control_plane, real_operator):
    """`kubectl apply --server-side -k manifests/`: a deleted shared admission object (a policy and
    a keep-alive binding of each kind) is put back in kubectl's name, as kubectl applied it, and the
    next server-side apply of manifests/ succeeds without --force-conflicts (Helm 4's upgrade, which
    applies server-side too, failed with a conflict on .metadata.labels with the operator's put-back)."""
    cp = control_plane
    manifests = str(ROOT / "manifests")
    cp.kubectl("apply", "--server-side", "-k", manifests)
    real_operator.start()
    create_ready(cp, qemu_rs("applied"))
    for key in (("ValidatingAdmissionPolicy", podfit.SHARED_NAMES["memory"]),
                ("MutatingAdmissionPolicy", podfit.SHARED_NAMES["route"]),
                ("ValidatingAdmissionPolicyBinding", podfit.KEEP_ALIVE_NAMES["envelope"]),
                ("MutatingAdmissionPolicyBinding", podfit.KEEP_ALIVE_NAMES["route"])):
        before = cp.get(path_of(key))
        assert ("kubectl", "Apply") in writers(before)
        cp.delete(path_of(key))
        back = poll(lambda key=key: cp.get(path_of(key)), 10, f"{key} put back")
        # In the name of one of the server-side appliers that set it (another test's Argo CD-like
        # apply of the same objects may share it with kubectl), nothing in the operator's.
        assert len(writers(back)) == 1 and writers(back) <= {w for w in writers(before) if w[1] == "Apply"}, (
            writers(before), back["metadata"]["managedFields"])
        assert back["metadata"]["labels"] == before["metadata"]["labels"]
        assert _comparable(back)["metadata"].get("annotations") == _comparable(before)["metadata"].get("annotations")
        assert back["spec"] == before["spec"]
    wait_observed(cp, "applied", Ready="True")
    again = cp.kubectl("apply", "--server-side", "-k", manifests, check=False)
    assert again.returncode == 0, again.stderr
    writes = cp.operator_writes(real_operator.started_at_offset)
    assert {(w.verb, w.resource) for w in writes if w.name in SHARED} == {
        ("patch", "validatingadmissionpolicies"), ("patch", "mutatingadmissionpolicies"),
        ("patch", "validatingadmissionpolicybindings"), ("patch", "mutatingadmissionpolicybindings")}


def test_a_policy_change_rewrites_its_parameters_not_the_cel_and_routing_webhook_removes_its_mutating_binding(
        control_plane, real_operator, tmp_path):
    cp = control_plane
    real_operator.start()
    body = qemu_rs("reshape")
    create_ready(cp, body)
    quiet(cp)
    shared_before = {key: obj["metadata"]["resourceVersion"] for key, obj in shared_objects(cp).items()}
    params_before = cp.get(params_path("reshape"))["data"]
    body["spec"]["classes"][0]["memory"] = "2Gi"
    body["spec"]["admission"] = {"routing": "Webhook", "envelopeExceeded": "Warn"}
    cp.apply(body)
    wait_observed(cp, "reshape", Ready="True")
    expected = {key: obj for key, obj in expected_admission(body, tmp_path).items() if key[1] not in SHARED}
    poll(lambda: sorted(admission_objects(cp, "reshape")) == sorted(expected), 10,
         lambda: f"{sorted(admission_objects(cp, 'reshape'))} != {sorted(expected)}")
    live = admission_objects(cp, "reshape")
    assert not any(kind.startswith("Mutating") for kind, _ in live)
    binding = live[("ValidatingAdmissionPolicyBinding", "kata-sizing-reshape-envelope")]
    assert binding["spec"]["validationActions"] == ["Warn"]
    # The class's new envelope is in the parameters; no CEL was rewritten (the shared routing
    # policy stays for the policies that bind it).
    params = cp.get(params_path("reshape"))["data"]
    assert params["classMemory"].split(",")[0] == str(2 * 1024**3) != params_before["classMemory"].split(",")[0]
    quiet(cp)
    assert {key: obj["metadata"]["resourceVersion"] for key, obj in shared_objects(cp).items()} == shared_before
    # Webhook asked for no MAP; but this operator serves no webhook, and the status says so.
    assert [w for w in status(cp, "reshape").get("warnings") or [] if "admission" in w] == [
        "admission: opted-in pods are routed by the operator's webhook here, but it runs without --webhook-port "
        "(install overlays/webhook/ or the chart's webhook.enabled): they are not routed, and the envelope "
        "policy refuses them (pod-not-routed)"]


def test_a_foreign_admission_policy_with_one_of_its_names_is_a_conflict_and_never_touched(
        control_plane, real_operator):
    cp = control_plane
    foreign = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": "kata-sizing-taken-envelope"},
               "spec": {"policyName": "somebody-elses", "validationActions": ["Audit"]}}
    created = cp.create(KINDS["ValidatingAdmissionPolicyBinding"], foreign)
    try:
        real_operator.start()
        cp.apply(qemu_rs("taken"))
        st = wait_observed(cp, "taken", Conflict="True")
        assert "kata-sizing-taken-envelope" in json.dumps(st["conditions"])
        live = cp.get(f"{KINDS['ValidatingAdmissionPolicyBinding']}/kata-sizing-taken-envelope")
        assert live["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
        writes = cp.operator_writes(real_operator.started_at_offset, "validatingadmissionpolicybindings")
        assert all(w.name != "kata-sizing-taken-envelope" for w in writes), writes
        assert events(cp, "Conflict")
    finally:
        cp.delete(f"{KINDS['ValidatingAdmissionPolicyBinding']}/kata-sizing-taken-envelope")


def test_report_mode_reports_a_hand_edit_of_an_admission_policy_and_leaves_it(control_plane, real_operator):
    cp = control_plane
    real_operator.start()
    create_ready(cp, qemu_rs("watched", driftPolicy="Report"))
    quiet(cp)
    path = f"{KINDS['ValidatingAdmissionPolicyBinding']}/kata-sizing-watched-envelope"
    cp.edit(path, lambda o: o["spec"].update(validationActions=["Audit"]))
    poll(lambda: int(status(cp, "watched").get("driftDetected") or 0) >= 1, 10,
         lambda: f"status: {status(cp, 'watched')}")
    time.sleep(1.5)
    assert cp.get(path)["spec"]["validationActions"] == ["Audit"]
    writes = cp.operator_writes(real_operator.started_at_offset, "validatingadmissionpolicybindings")
    assert [w.verb for w in writes] == ["create", "create"], writes


def test_the_garbage_collector_removes_a_deleted_policys_bindings_and_parameters_and_the_shared_ones_stay(
        control_plane, real_operator):
    cp = control_plane
    real_operator.start()
    create_ready(cp, qemu_rs("first"))
    create_ready(cp, qemu_rs("second"))
    assert len(admission_objects(cp, "first")) == len(admission_objects(cp, "second")) == 3
    assert cp.get(params_path("first")) and cp.get(params_path("second"))
    cp.kubectl("delete", "ksp", "first", "--timeout=30s")
    poll(lambda: admission_objects(cp, "first") == {} and cp.get(params_path("first")) is None, 60,
         lambda: f"left by the garbage collector: {sorted(admission_objects(cp, 'first'))}")
    # The shared admission policies stay: the other policy binds them.
    assert len(shared_objects(cp)) == 6

    real_operator.stop()
    cp.kubectl("delete", "ksp", "second", "--timeout=30s")  # nothing holds it, operator or not
    poll(lambda: admission_objects(cp, "second") == {} and cp.get(params_path("second")) is None, 60,
         lambda: f"left by the garbage collector: {sorted(admission_objects(cp, 'second'))}")


def test_an_operator_upgraded_from_per_policy_admission_policies_rebinds_and_deletes_them(
        control_plane, real_operator):
    """What the operator before the shared admission policies left for a policy: its own
    ValidatingAdmissionPolicy with a binding of the same name. The upgraded operator rewrites the
    binding to the shared policy and its parameters (a binding's policyName and paramRef can be
    changed in place) and deletes the policy's own, which it no longer renders."""
    cp = control_plane
    body = qemu_rs("upgraded")
    created = cp.create(POLICIES, body)
    labels = {"app.kubernetes.io/managed-by": "kata-sizing", "katasizing.dev/policy": "upgraded"}
    owner = [{"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy", "name": "upgraded",
              "uid": created["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    old = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
           "metadata": {"name": "kata-sizing-upgraded-envelope", "labels": labels, "ownerReferences": owner},
           "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{
               "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
               "validations": [{"expression": "!has(object.spec.runtimeClassName) || "
                                              "object.spec.runtimeClassName != 'kata-upgraded-s'"}]}}
    cp.create(KINDS["ValidatingAdmissionPolicy"], old)
    cp.create(KINDS["ValidatingAdmissionPolicyBinding"], {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "kata-sizing-upgraded-envelope", "labels": labels, "ownerReferences": owner},
        "spec": {"policyName": "kata-sizing-upgraded-envelope", "validationActions": ["Deny"]}})
    cp.create(KINDS["MutatingAdmissionPolicy"], {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": "kata-sizing-upgraded-route", "labels": labels, "ownerReferences": owner},
        "spec": {"failurePolicy": "Fail", "matchConstraints": old["spec"]["matchConstraints"],
                 "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": "Object{}"}}],
                 "reinvocationPolicy": "Never"}})
    real_operator.start()
    wait_observed(cp, "upgraded", Ready="True")
    for kind in ("ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"):
        name = "kata-sizing-upgraded-" + ("envelope" if kind.startswith("Validating") else "route")
        poll(lambda kind=kind, name=name: cp.get(f"{KINDS[kind]}/{name}") is None, 20,
             f"the policy's own {kind} deleted")
    binding = cp.get(f"{KINDS['ValidatingAdmissionPolicyBinding']}/kata-sizing-upgraded-envelope")
    assert binding["spec"]["policyName"] == podfit.SHARED_NAMES["envelope"]
    assert binding["spec"]["paramRef"]["name"] == "upgraded-dropins"
    assert int(status(cp, "upgraded").get("driftCorrections") or 0) == 0  # an upgrade, not a hand edit


# --- the audit of running pods -------------------------------------------------------------------


def test_pods_stored_against_the_rules_are_listed_in_status_with_one_warning_event_per_change(
        control_plane, real_operator):
    cp = control_plane
    real_operator.start()
    # Audit: the API server admits them and records an audit annotation; the operator lists them.
    create_ready(cp, qemu_rs("podaudit", admission={"memoryLimitMissing": "Audit", "envelopeExceeded": "Audit"}))
    names = {c["name"]: c["runtimeClass"] for c in status(cp, "podaudit")["classes"]}
    pods = [pod("audit-too-big", names["s"], cpu="1", memory="3Gi"),
            pod("audit-no-memory-limit", names["m"], cpu="1"),
            pod("audit-fits", names["s"], cpu="500m", memory="512Mi"),
            pod("audit-other-class", None, cpu="64", memory="512Gi")]
    try:
        # The ValidatingAdmissionPolicy may take a moment to be enforced; Audit admits either way.
        for p in pods:
            cp.apply(p)
        st = poll(lambda: (lambda a: a if a.get("pods") == 2 else None)(status(cp, "podaudit").get("podAudit") or {}),
                  20, lambda: f"status: {status(cp, 'podaudit').get('podAudit')}")
        assert st["counts"] == [
            {"class": "m", "rule": "pod-memory-limit-missing", "pods": 1},
            {"class": "s", "rule": "pod-envelope-exceeded", "pods": 1},
        ]
        by_pod = {row["pod"]: row for row in st["listed"]}
        assert sorted(by_pod) == ["default/audit-no-memory-limit", "default/audit-too-big"]
        too_big = by_pod["default/audit-too-big"]
        assert too_big["runtimeClass"] == names["s"] and too_big["action"] == "Audit"
        assert "3Gi" in too_big["message"] and names["m"] in too_big["message"], too_big["message"]
        assert st["truncated"] is False
        # One event per change of the list. The pods are created one by one, so the operator's
        # cache may see the list grow 1 -> 2 across an audit tick (two events; seen on a slow
        # machine) or reach 2 at once (one event); either way the last says both.
        said = poll(lambda: (lambda es: es if es and "2 Kata pod(s) outside their class" in es[-1]["message"]
                             else None)(audit_events(cp)), 10, lambda: f"events: {audit_events(cp)}")
        assert all(e["type"] == "Warning" and e.get("count", 1) == 1 for e in said), said
        assert [m["message"].split(" Kata pod(s)")[0] for m in said] in (["2"], ["1", "2"]), said
        time.sleep(3)  # three guidance ticks: nothing changed, so nothing is said again
        assert audit_events(cp) == said

        cp.delete(f"{PODS}/audit-too-big")
        poll(lambda: (status(cp, "podaudit").get("podAudit") or {}).get("pods") == 1, 20,
             lambda: f"status: {status(cp, 'podaudit').get('podAudit')}")
        after = poll(lambda: (lambda es: es if len(es) == len(said) + 1 else None)(audit_events(cp)), 10,
                     lambda: f"events: {audit_events(cp)}")
        assert after[-1]["message"].startswith("1 Kata pod(s) outside their class (1 pod-memory-limit-missing"), after
    finally:
        delete_pods(cp, *(f"{PODS}/{p['metadata']['name']}" for p in pods))


def test_pods_created_before_the_admission_policies_are_audited(control_plane, real_operator):
    cp = control_plane
    real_operator.start()
    body = qemu_rs("late", admission={"enabled": False})
    create_ready(cp, body)
    assert admission_objects(cp, "late") == {}
    runtime_class = {c["name"]: c["runtimeClass"] for c in status(cp, "late")["classes"]}["s"]
    big = pod("late-too-big", runtime_class, cpu="4", memory="1Gi")
    try:
        cp.apply(big)  # no admission policy yet: stored as it is
        body["spec"]["admission"] = {"enabled": True}
        cp.apply(body)
        wait_observed(cp, "late", Ready="True")
        audit = poll(lambda: (status(cp, "late").get("podAudit") or {}).get("listed"), 20,
                     lambda: f"status: {status(cp, 'late')}")
        assert [(r["pod"], r["rule"], r["action"]) for r in audit] == [
            ("default/late-too-big", "pod-envelope-exceeded", "Deny")]
        # The same pod is now refused at admission, with the same rule.
        again = pod("late-too-big-again", runtime_class, cpu="4", memory="1Gi")
        refused = poll(lambda: (lambda r: r if r.returncode != 0 else cp.delete(f"{PODS}/late-too-big-again"))(
            cp.apply(again, check=False)), 20, "the envelope policy refuses the pod")
        assert "kata-sizing-late-envelope" in refused.stderr, refused.stderr
    finally:
        delete_pods(cp, f"{PODS}/late-too-big", f"{PODS}/late-too-big-again")


# --- the webhook fallback of the routing -----------------------------------------------------------


def dry_run_all(cp: ControlPlane, pods: list[dict]) -> dict[str, dict | str]:
    """{pod: what the API server would store, or why it refused} for one `kubectl create
    --dry-run=server` of all of them (kubectl goes on past a refused one)."""
    proc = cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=yaml.safe_dump_all(pods),
                      check=False)
    stored, text, at = {}, proc.stdout, 0
    decoder = json.JSONDecoder()
    while text[at:].strip():
        obj, end = decoder.raw_decode(text[at:].lstrip())
        at += len(text[at:]) - len(text[at:].lstrip()) + end
        stored[obj["metadata"]["name"]] = obj
    refused = {line.split('pods "', 1)[1].split('"', 1)[0]: line for line in proc.stderr.splitlines()
               if 'pods "' in line}
    return {**refused, **stored}


def routed_classes(answers: dict[str, dict | str]) -> dict[str, str | None]:
    return {name: (obj["spec"].get("runtimeClassName") if isinstance(obj, dict) else f"refused: {obj}")
            for name, obj in answers.items()}


def test_the_webhook_and_the_mutating_admission_policy_route_the_same_pods_for_every_scope(
        control_plane, real_operator, tmp_path):
    """tests/api/test_webhook_routing.py's table (a policy per scope of spec.admission.namespaces: names,
    a selector, both, none; pods opted in by their label and by their namespace's) through the
    operator's webhook behind a real MutatingWebhookConfiguration, as overlays/webhook/ registers it,
    and then through the MutatingAdmissionPolicy: the same pods routed to the same classes, the
    ones the policies' bindings select."""
    from tests.support.routing import SCOPE_NAMESPACES, SCOPES, routed_by_the_bindings, scope_pods, scope_policy
    from tests.support.webhook import write_self_signed_cert

    cp = control_plane
    cert, key = write_self_signed_cert(tmp_path)
    port = free_port()
    real_operator.start("--webhook-port", str(port), "--webhook-addr", "127.0.0.1",
                        "--webhook-cert", str(cert), "--webhook-key", str(key))
    # As overlays/webhook/ registers it, with a URL instead of the Service (no pod network here)
    # and the caBundle set by the test (cert-manager's job in production).
    shipped = yaml.safe_load((ROOT / "overlays/webhook/mutatingwebhookconfiguration.yaml").read_text())
    config = copy.deepcopy(shipped)
    config["metadata"] = {"name": "kata-sizing-routing-test"}
    for hook in config["webhooks"]:
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{hook['clientConfig']['service']['path']}",
                                "caBundle": base64.b64encode(cert.read_bytes()).decode()}
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
                  for name, labels in SCOPE_NAMESPACES.items()]
    try:
        cp.apply(config, *namespaces)
        for name in SCOPE_NAMESPACES:
            poll(lambda name=name: cp.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"), 30,
                 f"the default ServiceAccount of {name}")
        for scope in SCOPES:
            cp.apply(scope_policy(scope, routing="Webhook"))
        for scope in SCOPES:
            wait_observed(cp, f"scope-{scope}", Ready="True")
        pods = scope_pods()
        expected = routed_by_the_bindings(pods)

        # The webhook (no MutatingAdmissionPolicyBinding exists): once the API server calls it.
        by_webhook = poll(lambda: (lambda got: got if routed_classes(got) == expected else None)(
            dry_run_all(cp, pods)), 20, lambda: f"{routed_classes(dry_run_all(cp, pods))} != {expected}")
        # The API server re-ran the RuntimeClass plugin after the webhook's mutation: the routed
        # pod has its class's podFixed and scheduling.
        routed = by_webhook["selector-in-kata"]
        assert isinstance(routed, dict)
        runtime_class = cp.get(f"/apis/node.k8s.io/v1/runtimeclasses/{routed['spec']['runtimeClassName']}")
        assert routed["spec"]["overhead"] == runtime_class["overhead"]["podFixed"]
        assert routed["spec"]["nodeSelector"] == {"katacontainers.io/kata-runtime": "true"}

        # The MutatingAdmissionPolicy, the same policies: the webhook leaves them to it.
        for scope in SCOPES:
            cp.apply(scope_policy(scope, routing="MutatingAdmissionPolicy"))
        for scope in SCOPES:
            wait_observed(cp, f"scope-{scope}", Ready="True")
        poll(lambda: routed_classes(dry_run_all(cp, pods)) == expected, 20,
             lambda: f"{routed_classes(dry_run_all(cp, pods))} != {expected}")
        assert len([k for scope in SCOPES for k in admission_objects(cp, f"scope-{scope}")
                    if k[0] == "MutatingAdmissionPolicyBinding"]) == len(SCOPES)

        # A pod that fits no class keeps no class, and the envelope policy refuses it with the reason.
        too_big = pod("too-big", labels={"katasizing.dev/policy": "scope-everywhere"}, cpu="64", memory="1Ti")
        assert "fit no class" in routed_classes(dry_run_all(cp, [too_big]))["too-big"]
    finally:
        cp.delete(f"{ADMISSION}/mutatingwebhookconfigurations/kata-sizing-routing-test")
        for namespace in namespaces:
            cp.delete(f"/api/v1/namespaces/{namespace['metadata']['name']}")
