"""The operator and the admission objects, on both API tiers where both can run a scenario: it
writes each policy's bindings and guards the shared ValidatingAdmissionPolicies and
MutatingAdmissionPolicy they name (the install's), puts back a hand edit or deletion, leaves a
foreign object alone, rewrites a policy's parameters rather than the CEL, removes them with the
policy (as the garbage collector does with the operator stopped too), rebinds what an older
operator left, and lists in status.podAudit the pods stored against the rules with a Warning event.

The emulator alone injects faults (a burst of server errors, a lost race, a dropped watch) and
serves no MutatingAdmissionPolicy as Kubernetes 1.30 to 1.33 do; the real API server alone keeps
managedFields (server-side apply by a GitOps tool or the install), enforces the policies at
admission and calls a registered MutatingWebhookConfiguration. The admission rules themselves are
tests/api/test_real_admission.py's.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time

import pytest
import yaml

from kata_sizing.controller import conditions as cond
from kata_sizing.controller.compare import spec_differences
from kata_sizing.core.model import parse_policy
from kata_sizing.core.podfit import KEEP_ALIVE_NAMES, SHARED_NAMES
from kata_sizing.core.render import render_policy, shared_admission_objects
from tests.support.admission import ADMISSION, writers
from tests.support.harness.emulator import default_resources
from tests.support.paths import ROOT
from tests.support.policies import explicit_classes_policy
from tests.support.realcluster import ControlPlane, free_port
from tests.support.routing import SCOPE_NAMESPACES, SCOPES, routed_by_the_bindings, scope_pods, scope_policy
from tests.support.tiers import CONFIG_MAPS, MAP, MAPB, PODS, POLICIES, RUNTIME_CLASSES, VAP, VAPB, Kind, Kube
from tests.support.webhook import registered_as_the_overlay, write_self_signed_cert

KINDS: dict[str, Kind] = {"ValidatingAdmissionPolicy": VAP, "ValidatingAdmissionPolicyBinding": VAPB,
                          "MutatingAdmissionPolicy": MAP, "MutatingAdmissionPolicyBinding": MAPB}
# The install's: the shared policies and the keep-alive binding of each.
SHARED = set(SHARED_NAMES.values()) | set(KEEP_ALIVE_NAMES.values())


def admission_objects(kube: Kube, policy: str) -> dict[tuple[str, str], dict]:
    """The policy's own admission objects: its bindings."""
    return {(kind, name): obj for kind, k in KINDS.items()
            for name, obj in kube.objects(k, labels=f"katasizing.dev/policy={policy}").items()}


def shared_objects(kube: Kube) -> dict[tuple[str, str], dict]:
    """The admission policies every policy binds, and their keep-alive bindings."""
    return {(kind, name): obj for kind, k in KINDS.items()
            for name, obj in kube.objects(k, labels="katasizing.dev/shared=admission").items()}


def expected_admission(body: dict) -> dict[tuple[str, str], dict]:
    """The policy's bindings (`kata-sizing render`) and the shared admission policies they name
    (`render --shared`), which it guards."""
    objects = [*shared_admission_objects(), *render_policy(parse_policy(body)).admission]
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def params(kube: Kube, policy: str) -> dict | None:
    """The drop-ins ConfigMap, which holds the admission parameters."""
    return kube.get(CONFIG_MAPS, f"{policy}-dropins")


def all_corrections(kube: Kube) -> int:
    """status.driftCorrections summed over every policy: a shared object put back counts on the
    policy whose pass put it back."""
    return sum(int((p.get("status") or {}).get("driftCorrections") or 0) for p in kube.objects(POLICIES).values())


def pod(name: str, runtime_class: str | None = None, labels: dict | None = None, namespace: str = "default",
        **limits: str) -> dict:
    spec: dict = {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                  "resources": {"limits": limits} if limits else {}}]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": namespace, **({"labels": labels} if labels else {})}, "spec": spec}


def audit_events(kube: Kube) -> list[dict]:
    """The PodAudit events, oldest first."""
    return kube.events(cond.EVENT_POD_AUDIT)


# --- the admission objects as managed outputs ------------------------------------------------------


def test_the_operator_writes_the_admission_policies_and_puts_back_hand_edits_and_deletions(kube):
    kube.start()
    body = explicit_classes_policy("gate")
    kube.applied(body)
    expected = expected_admission(body)
    assert {k for k, _ in expected} == set(KINDS), sorted(expected)
    shared = shared_objects(kube)
    assert sorted(shared) == [("MutatingAdmissionPolicy", SHARED_NAMES["route"]),
                              ("MutatingAdmissionPolicyBinding", KEEP_ALIVE_NAMES["route"]),
                              ("ValidatingAdmissionPolicy", SHARED_NAMES["envelope"]),
                              ("ValidatingAdmissionPolicy", SHARED_NAMES["memory"]),
                              ("ValidatingAdmissionPolicyBinding", KEEP_ALIVE_NAMES["envelope"]),
                              ("ValidatingAdmissionPolicyBinding", KEEP_ALIVE_NAMES["memory"])]
    live = {**shared, **admission_objects(kube, "gate")}
    assert sorted(live) == sorted(expected)
    uid = kube.policy("gate")["metadata"]["uid"]
    parameters = params(kube, "gate")
    assert parameters is not None
    assert parameters["data"] == next(o for o in render_policy(parse_policy(body)).configmaps
                                      if o["metadata"]["name"] == "gate-dropins")["data"]
    for key, obj in [*live.items(), (("ConfigMap", "gate-dropins"), parameters)]:
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
        # selectors, each rule's scope, failurePolicy): the real server added nothing.
        assert obj["spec"] == expected[key]["spec"], key
        assert spec_differences(expected[key]["spec"], obj["spec"]) == [], key
    kube.settle()
    corrections = all_corrections(kube)

    envelope = ("ValidatingAdmissionPolicy", SHARED_NAMES["envelope"])
    binding = ("ValidatingAdmissionPolicyBinding", "kata-sizing-gate-memory-limit")
    route = ("MutatingAdmissionPolicyBinding", "kata-sizing-gate-route")
    mutating = ("MutatingAdmissionPolicy", SHARED_NAMES["route"])
    good = copy.deepcopy(live)

    def get(key: tuple[str, str]) -> dict:
        return kube.get(KINDS[key[0]], key[1]) or {}

    def edit(key: tuple[str, str], change) -> None:
        kube.edit(KINDS[key[0]], key[1], change)

    edit(envelope, lambda o: o["spec"]["validations"][0].update(expression="true"))
    kube.wait_for(lambda: get(envelope)["spec"]["validations"] == good[envelope]["spec"]["validations"],
                  message="the envelope validation put back")
    edit(binding, lambda o: o["spec"].update(validationActions=["Audit"]))
    kube.wait_for(lambda: get(binding)["spec"]["validationActions"] == good[binding]["spec"]["validationActions"],
                  message="the binding's action put back")
    # Somebody else's parameters, which refuse every pod of the namespaces while missing: put back.
    edit(binding, lambda o: o["spec"].update(paramRef={"name": "x", "parameterNotFoundAction": "Deny"}))
    kube.wait_for(lambda: get(binding)["spec"]["paramRef"] == good[binding]["spec"]["paramRef"],
                  message="the binding's paramRef put back")
    # A selector the server would default to {} but somebody narrowed: the routing would stop.
    edit(route, lambda o: o["spec"].update(matchResources={"objectSelector": {"matchLabels": {"a": "b"}}}))
    kube.wait_for(lambda: "matchResources" not in get(route)["spec"], message="the narrowed binding put back")
    edit(mutating, lambda o: o["spec"].update(failurePolicy="Ignore"))
    kube.wait_for(lambda: get(mutating)["spec"]["failurePolicy"] == good[mutating]["spec"]["failurePolicy"],
                  message="the routing's failurePolicy put back")
    # Whoever may write ConfigMaps in the output namespace could widen the envelopes there: put back.
    kube.edit(CONFIG_MAPS, "gate-dropins", lambda o: o["data"].update(classMemory="9" * 18))
    kube.wait_for(lambda: params(kube, "gate")["data"] == parameters["data"], message="the widened parameters put back")
    for deleted in live:  # every object, each kind
        kube.delete(KINDS[deleted[0]], deleted[1])
        kube.wait_for(lambda deleted=deleted: get(deleted), message=f"the deleted {deleted} re-created")
    kube.delete(CONFIG_MAPS, "gate-dropins")
    kube.wait_for(lambda: params(kube, "gate"), message="the deleted parameters re-created")
    # Somebody else's label is not drift.
    edit(envelope, lambda o: o["metadata"]["labels"].update({"team": "platform"}))
    total = corrections + 6 + len(live) + 1
    kube.wait_for(lambda: all_corrections(kube) >= total,
                  message=lambda: f"corrections {all_corrections(kube)} < {total}")
    kube.settle()
    assert get(envelope)["metadata"]["labels"]["team"] == "platform"
    assert all_corrections(kube) == total
    # The shared policy outlives this test on the real server: leave it as the operator wrote it.
    edit(envelope, lambda o: o["metadata"]["labels"].pop("team"))




def test_a_policy_change_rewrites_its_parameters_not_the_cel_and_routing_webhook_removes_its_mutating_binding(kube):
    kube.start()
    body = explicit_classes_policy("reshape")
    kube.applied(body)
    shared_before = {key: obj["metadata"]["resourceVersion"] for key, obj in shared_objects(kube).items()}
    params_before = params(kube, "reshape")["data"]
    kube.update_spec("reshape", lambda spec: (spec["classes"][0].update(memory="2Gi"), spec.update(
        admission={"routing": "Webhook", "envelopeExceeded": "Warn"})))
    kube.wait_observed("reshape", Ready="True")
    body = kube.policy("reshape")
    expected = {key: obj for key, obj in expected_admission(body).items() if key[1] not in SHARED}
    kube.wait_for(lambda: sorted(admission_objects(kube, "reshape")) == sorted(expected),
                  message=lambda: f"{sorted(admission_objects(kube, 'reshape'))} != {sorted(expected)}")
    live = admission_objects(kube, "reshape")
    assert not any(kind.startswith("Mutating") for kind, _ in live)
    binding = live[("ValidatingAdmissionPolicyBinding", "kata-sizing-reshape-envelope")]
    assert binding["spec"]["validationActions"] == ["Warn"]
    # The class's new envelope is in the parameters; no CEL was rewritten (the shared routing
    # policy stays for the policies that bind it).
    now = params(kube, "reshape")["data"]
    assert now["classMemory"].split(",")[0] == str(2 * 1024**3) != params_before["classMemory"].split(",")[0]
    kube.settle()
    assert {key: obj["metadata"]["resourceVersion"] for key, obj in shared_objects(kube).items()} == shared_before
    # Webhook asked for no MAP; but this operator serves no webhook, and the status says so.
    assert [w for w in kube.status("reshape").get("warnings") or [] if "admission" in w] == [
        "admission: opted-in pods are routed by the operator's webhook here, but it runs without --webhook-port "
        "(install overlays/webhook/ or the chart's webhook.enabled): they are not routed, and the envelope "
        "policy refuses them (pod-not-routed)"]


def test_a_foreign_admission_policy_with_one_of_its_names_is_a_conflict_and_never_touched(kube):
    created = kube.create(VAPB, {"metadata": {"name": "kata-sizing-taken-envelope"},
                                 "spec": {"policyName": "somebody-elses", "validationActions": ["Audit"]}})
    kube.start()
    kube.create(POLICIES, explicit_classes_policy("taken"))
    st = kube.wait_observed("taken", Conflict="True")
    assert "kata-sizing-taken-envelope" in json.dumps(st["conditions"])
    assert kube.read(VAPB, "kata-sizing-taken-envelope")["metadata"]["resourceVersion"] == \
        created["metadata"]["resourceVersion"]
    assert not kube.writes(kind=VAPB, name="kata-sizing-taken-envelope")
    # The pass posts its event after the status it wrote.
    kube.wait_for(lambda: any("kata-sizing-taken-envelope" in m for m in kube.event_messages(cond.EVENT_CONFLICT)),
                  message=lambda: f"a Conflict event naming the binding; events: {kube.events()}")


def test_report_mode_reports_a_hand_edit_of_an_admission_policy_and_leaves_it(kube):
    kube.start()
    kube.applied(explicit_classes_policy("watched", driftPolicy="Report"))
    kube.edit(VAPB, "kata-sizing-watched-envelope", lambda o: o["spec"].update(validationActions=["Audit"]))
    kube.wait_for(lambda: kube.counter("watched", "driftDetected") >= 1, message=lambda: repr(kube.status("watched")))
    time.sleep(1.5)
    assert kube.read(VAPB, "kata-sizing-watched-envelope")["spec"]["validationActions"] == ["Audit"]
    assert [w.verb for w in kube.writes(kind=VAPB) if w.name.startswith("kata-sizing-watched-")] == [
        "create", "create"]


def test_the_garbage_collector_removes_a_deleted_policys_bindings_and_parameters_and_the_shared_ones_stay(kube):
    kube.start()
    kube.applied(explicit_classes_policy("first"))
    kube.applied(explicit_classes_policy("second"))
    assert len(admission_objects(kube, "first")) == len(admission_objects(kube, "second")) == 3
    assert params(kube, "first") and params(kube, "second")
    kube.delete(POLICIES, "first")
    kube.wait_for(lambda: admission_objects(kube, "first") == {} and params(kube, "first") is None, 60,
                  lambda: f"left by the garbage collector: {sorted(admission_objects(kube, 'first'))}")
    # The shared admission policies stay: the other policy binds them.
    assert len(shared_objects(kube)) == 6

    kube.stop()
    kube.delete(POLICIES, "second")  # nothing holds it, operator or not
    kube.wait_for(lambda: admission_objects(kube, "second") == {} and params(kube, "second") is None, 60,
                  lambda: f"left by the garbage collector: {sorted(admission_objects(kube, 'second'))}")


def test_an_operator_upgraded_from_per_policy_admission_policies_rebinds_and_deletes_them(kube):
    """What the operator before the shared admission policies left for a policy: its own
    ValidatingAdmissionPolicy with a binding of the same name. The upgraded operator rewrites the
    binding to the shared policy and its parameters (a binding's policyName and paramRef can be
    changed in place) and deletes the policy's own, which it no longer renders."""
    created = kube.create(POLICIES, explicit_classes_policy("upgraded"))
    labels = {"app.kubernetes.io/managed-by": "kata-sizing", "katasizing.dev/policy": "upgraded"}
    owner = [{"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy", "name": "upgraded",
              "uid": created["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    meta = {"labels": labels, "ownerReferences": owner}
    rules = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                "resources": ["pods"]}]}
    kube.create(VAP, {"metadata": {"name": "kata-sizing-upgraded-envelope", **meta}, "spec": {
        "failurePolicy": "Fail", "matchConstraints": rules,
        "validations": [{"expression": "!has(object.spec.runtimeClassName) || "
                                       "object.spec.runtimeClassName != 'kata-upgraded-s'"}]}})
    kube.create(VAPB, {"metadata": {"name": "kata-sizing-upgraded-envelope", **meta},
                       "spec": {"policyName": "kata-sizing-upgraded-envelope", "validationActions": ["Deny"]}})
    kube.create(MAP, {"metadata": {"name": "kata-sizing-upgraded-route", **meta}, "spec": {
        "failurePolicy": "Fail", "matchConstraints": rules, "reinvocationPolicy": "Never",
        "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": "Object{}"}}]}})
    kube.start()
    kube.wait_observed("upgraded", Ready="True")
    for kind, name in ((VAP, "kata-sizing-upgraded-envelope"), (MAP, "kata-sizing-upgraded-route")):
        kube.wait_for(lambda kind=kind, name=name: kube.get(kind, name) is None, 20, f"the policy's own {name} deleted")
    binding = kube.get(VAPB, "kata-sizing-upgraded-envelope")
    assert binding["spec"]["policyName"] == SHARED_NAMES["envelope"]
    assert binding["spec"]["paramRef"]["name"] == "upgraded-dropins"
    assert kube.counter("upgraded", "driftCorrections") == 0  # an upgrade, not a hand edit


# --- the audit of running pods -------------------------------------------------------------------


def test_pods_stored_against_the_rules_are_listed_in_status_with_one_warning_event_per_change(kube):
    kube.start(guidance_s=1)  # the audit of running pods is read at each guidance check
    # Audit: the API server admits them and records an audit annotation; the operator lists them.
    kube.applied(explicit_classes_policy("podaudit", admission={"memoryLimitMissing": "Audit",
                                                                "envelopeExceeded": "Audit"}))
    names = {c["name"]: c["runtimeClass"] for c in kube.status("podaudit")["classes"]}
    pods = [pod("audit-too-big", names["s"], cpu="1", memory="3Gi"),
            pod("audit-no-memory-limit", names["m"], cpu="1"),
            pod("audit-fits", names["s"], cpu="500m", memory="512Mi"),
            pod("audit-other-class", None, cpu="64", memory="512Gi")]
    for p in pods:
        # The ValidatingAdmissionPolicy may take a moment to be enforced; Audit admits either way.
        kube.create(PODS, p, "default")
    st = kube.wait_for(lambda: (lambda a: a if a.get("pods") == 2 else None)(kube.status("podaudit").get("podAudit") or {}),
                       message=lambda: f"status: {kube.status('podaudit').get('podAudit')}")
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
    # One event per change of the list. The pods are created one by one, so the operator's cache
    # may see the list grow 1 -> 2 across an audit tick (two events; seen on a slow machine) or
    # reach 2 at once (one event); either way the last says both.
    said = kube.wait_for(lambda: (lambda es: es if es and "2 Kata pod(s) outside their class" in es[-1]["message"]
                                  else None)(audit_events(kube)), message=lambda: f"events: {audit_events(kube)}")
    assert all(e["type"] == "Warning" and e.get("count", 1) == 1 for e in said), said
    assert [m["message"].split(" Kata pod(s)")[0] for m in said] in (["2"], ["1", "2"]), said
    time.sleep(3)  # three guidance ticks: nothing changed, so nothing is said again
    assert audit_events(kube) == said

    kube.delete(PODS, "audit-too-big", "default")
    kube.wait_for(lambda: (kube.status("podaudit").get("podAudit") or {}).get("pods") == 1,
                  message=lambda: f"status: {kube.status('podaudit').get('podAudit')}")
    after = kube.wait_for(lambda: (lambda es: es if len(es) == len(said) + 1 else None)(audit_events(kube)),
                          message=lambda: f"events: {audit_events(kube)}")
    assert after[-1]["message"].startswith("1 Kata pod(s) outside their class (1 pod-memory-limit-missing"), after


def test_pods_created_before_the_admission_policies_are_audited(kube):
    kube.start(guidance_s=1)  # the audit of running pods is read at each guidance check
    kube.applied(explicit_classes_policy("late", admission={"enabled": False}))
    assert admission_objects(kube, "late") == {}
    runtime_class = {c["name"]: c["runtimeClass"] for c in kube.status("late")["classes"]}["s"]
    kube.create(PODS, pod("late-too-big", runtime_class, cpu="4", memory="1Gi"), "default")  # stored as it is
    kube.update_spec("late", lambda spec: spec.update(admission={"enabled": True}))
    kube.wait_observed("late", Ready="True")
    audit = kube.wait_for(lambda: (kube.status("late").get("podAudit") or {}).get("listed"),
                          message=lambda: f"status: {kube.status('late')}")
    assert [(r["pod"], r["rule"], r["action"]) for r in audit] == [
        ("default/late-too-big", "pod-envelope-exceeded", "Deny")]
    if kube.cp is not None:  # the real API server enforces the policies at admission
        cp = kube.cp
        again = pod("late-too-big-again", runtime_class, cpu="4", memory="1Gi")
        try:
            refused = kube.wait_for(lambda: (lambda r: r if r.returncode != 0 else cp.delete(
                "/api/v1/namespaces/default/pods/late-too-big-again"))(cp.apply(again, check=False)),
                message="the envelope policy refuses the pod")
            assert "kata-sizing-late-envelope" in refused.stderr, refused.stderr
        finally:
            cp.delete("/api/v1/namespaces/default/pods/late-too-big-again")


# --- what the emulator alone can do: faults, and a server that serves no MutatingAdmissionPolicy -----

FAULTS = "the emulator alone injects server errors, lost races and dropped watches"


@pytest.mark.tiers("emulator", reason=FAULTS)
def test_a_burst_of_server_errors_on_admission_policy_writes_backs_off_and_then_writes_them_all(kube):
    burst = kube.emu.fail_next(3, status=500, method="POST", path="/validatingadmissionpolicies")
    kube.start()
    kube.create(POLICIES, explicit_classes_policy("gate"))
    kube.wait_observed("gate", timeout=15, Ready="True")
    kube.settle()
    assert burst.hits == 3
    assert {**shared_objects(kube), **admission_objects(kube, "gate")}.keys() == expected_admission(
        explicit_classes_policy("gate")).keys()
    # One retry per failure, through the back-off: 3 failed + 2 created.
    assert [w.code for w in kube.writes(kind=VAP) if w.verb == "create"] == [500, 500, 500, 201, 201]


@pytest.mark.tiers("emulator", reason=FAULTS)
def test_a_lost_race_while_correcting_an_admission_binding_rereads_and_retries(kube):
    kube.start()
    kube.applied(explicit_classes_policy("gate"))
    name = "kata-sizing-gate-envelope"
    race = kube.emu.conflict_next(1, method="PUT", path=f"/validatingadmissionpolicybindings/{name}")
    mark = kube.mark()
    kube.edit(VAPB, name, lambda o: o["spec"].update(validationActions=["Audit"]))
    kube.wait_for(lambda: kube.read(VAPB, name)["spec"]["validationActions"] == ["Deny"])
    kube.wait_for(lambda: kube.counter("gate", "driftCorrections") == 1)
    kube.settle()
    assert race.hits == 1
    assert [w.code for w in kube.writes(mark, VAPB, name) if w.verb == "update"] == [409, 200]
    # The event is posted by kopf's poster, after the status write.
    kube.wait_for(lambda: kube.event_messages(cond.EVENT_DRIFT_CORRECTED))
    assert len(kube.event_messages(cond.EVENT_DRIFT_CORRECTED)) == 1


@pytest.mark.tiers("emulator", reason=FAULTS)
def test_after_a_dropped_watch_a_deleted_admission_policy_is_still_recreated(kube):
    kube.start()
    kube.applied(explicit_classes_policy("gate"))
    assert kube.emu.drop_watches(MAP.emulator_key) >= 1
    # The routing policy every policy binds: a pass of the policy that binds it puts it back.
    kube.delete(MAP, SHARED_NAMES["route"])
    kube.wait_for(lambda: kube.get(MAP, SHARED_NAMES["route"]), 10)
    kube.wait_for(lambda: kube.counter("gate", "driftCorrections") == 1)


@pytest.mark.tiers("emulator", reason="the real API server here serves MutatingAdmissionPolicy; the emulator serves "
                                      "what Kubernetes 1.30 to 1.33 serve")
@pytest.mark.emulator_options(resources={k: v for k, v in default_resources().items()
                                         if "mutatingadmissionpolic" not in k})
def test_without_a_mutating_admission_policy_served_auto_routing_leaves_it_to_the_webhook(kube):
    kube.start()
    kube.create(POLICIES, explicit_classes_policy("gate"))
    kube.create(POLICIES, explicit_classes_policy("insists", admission={"routing": "MutatingAdmissionPolicy"}))
    kube.wait_observed("gate", Ready="True")
    # The validating policies are written; the routing is the webhook's, which this operator
    # (started without --webhook-port) does not serve: the status says so, once.
    found = {k: {o["metadata"]["name"] for o in kube.objects(KINDS[k]).values()}
             for k in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")}
    assert found == {"ValidatingAdmissionPolicy": {SHARED_NAMES["envelope"], SHARED_NAMES["memory"]},
                     "ValidatingAdmissionPolicyBinding": {"kata-sizing-gate-envelope", "kata-sizing-gate-memory-limit",
                                                          "kata-sizing-insists-envelope",
                                                          "kata-sizing-insists-memory-limit",
                                                          KEEP_ALIVE_NAMES["envelope"], KEEP_ALIVE_NAMES["memory"]}}
    warnings = kube.status("gate").get("warnings") or []
    assert len(warnings) == 1 and warnings[0].startswith("admission:") and "--webhook-port" in warnings[0], warnings
    # A policy that asks for the MutatingAdmissionPolicy by name is told it cannot have one.
    kube.wait_observed("insists", Ready="True")
    warnings = kube.status("insists").get("warnings") or []
    assert any(f"does not serve MutatingAdmissionPolicy {SHARED_NAMES['route']}" in w for w in warnings), warnings
    assert any("does not serve MutatingAdmissionPolicyBinding kata-sizing-insists-route" in w for w in warnings)


# --- what the real API server alone decides: managedFields, admission, a registered webhook --------

MANAGED_FIELDS = "server-side apply and managedFields are the real API server's; the emulator keeps neither"
ADMITTED_BY_THE_SERVER = ("the real API server calls the admission policies and a registered webhook; the emulator "
                          "stores pods as given")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
OBJECT_KINDS: dict[str, Kind] = {**KINDS, "RuntimeClass": RUNTIME_CLASSES, "ConfigMap": CONFIG_MAPS}


def _comparable(obj: dict) -> dict:
    """An object without what every write changes (resourceVersion, managedFields) and kubectl's
    copy of what it last applied, which a server-side apply rewrites (the install's `kubectl apply
    -k manifests/` left one on the shared admission policies)."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "managedFields")}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    if annotations or "annotations" in meta:
        meta["annotations"] = annotations
    return {**obj, "metadata": meta}


def _real(kube: Kube) -> ControlPlane:
    assert kube.cp is not None
    return kube.cp


@pytest.mark.tiers("realserver", reason=MANAGED_FIELDS)
def test_render_applied_server_side_by_a_gitops_tool_over_the_operators_objects_is_a_no_op(kube, tmp_path):
    """Argo CD (or Flux) applies `kata-sizing render`'s output with server-side apply over the
    objects the operator wrote: no conflict on .spec.matchConstraints (an atomic struct whose
    defaulted fields render now writes out), nothing changed, and the operator does not answer."""
    cp = _real(kube)
    kube.start()
    body = explicit_classes_policy("gitops")
    path = tmp_path / "gitops.yaml"
    path.write_text(yaml.safe_dump(body))
    kube.applied(body)
    # The policy's render and the shared admission policies (the install's, applied by the same tool).
    written = "".join(subprocess.run([sys.executable, "-m", "kata_sizing.cli", "render", *args],
                                     capture_output=True, text=True, check=True).stdout
                      for args in ([str(path)], ["--shared"]))
    keys = [(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(written)]
    assert {k[0] for k in keys} >= set(KINDS) | {"RuntimeClass", "ConfigMap"}

    def live() -> dict[tuple[str, str], dict | None]:
        return {(kind, name): kube.get(OBJECT_KINDS[kind], name) for kind, name in keys}

    # What the server did with the same objects before it defaulted nothing render leaves out:
    # with a rule's scope and the selectors left to the server, the apply conflicts.
    old_style = [o for o in yaml.safe_load_all(written) if o["kind"] == "ValidatingAdmissionPolicy"][0]
    old_style["spec"]["matchConstraints"] = {"resourceRules": [
        {k: v for k, v in rule.items() if k != "scope"} for rule in old_style["spec"]["matchConstraints"]["resourceRules"]]}
    refused = cp.kubectl("apply", "--server-side", "--field-manager=argocd", "--dry-run=server", "-f", "-",
                         input=yaml.safe_dump(old_style), check=False)
    assert refused.returncode != 0 and ".spec.matchConstraints" in refused.stderr, refused.stderr

    before = live()
    mark = kube.mark()
    cp.kubectl("apply", "--server-side", "--field-manager=argocd", "-f", "-", input=written)
    after = live()
    for key in keys:
        assert _comparable(after[key]) == _comparable(before[key]), key
        managers = {m["manager"] for m in after[key]["metadata"]["managedFields"]}
        # The shared admission policies may have been written by another test's apply first.
        assert ({"argocd"} if key[1] in SHARED else {"kata-sizing", "argocd"}) <= managers, key
    kube.settle()
    assert kube.writes(mark) == [], "the operator answered the GitOps apply"
    # Applied again (a GitOps tool's next sync): not even managedFields move.
    versions = {key: obj["metadata"]["resourceVersion"] for key, obj in live().items()}
    cp.kubectl("apply", "--server-side", "--field-manager=argocd", "-f", "-", input=written)
    assert {key: obj["metadata"]["resourceVersion"] for key, obj in live().items()} == versions


@pytest.mark.tiers("realserver", reason=MANAGED_FIELDS)
def test_a_shared_policy_the_install_applied_server_side_is_put_back_as_it_applied_it_and_applies_again(kube):
    """`kubectl apply --server-side -k manifests/`: a deleted shared admission object (a policy and
    a keep-alive binding of each kind) is put back in kubectl's name, as kubectl applied it, and the
    next server-side apply of manifests/ succeeds without --force-conflicts (Helm 4's upgrade, which
    applies server-side too, failed with a conflict on .metadata.labels with the operator's put-back)."""
    cp = _real(kube)
    manifests = str(ROOT / "manifests")
    cp.kubectl("apply", "--server-side", "-k", manifests)
    kube.start()
    kube.applied(explicit_classes_policy("applied"))
    for kind, name in ((VAP, SHARED_NAMES["memory"]), (MAP, SHARED_NAMES["route"]),
                       (VAPB, KEEP_ALIVE_NAMES["envelope"]), (MAPB, KEEP_ALIVE_NAMES["route"])):
        before = kube.get(kind, name)
        assert before is not None and ("kubectl", "Apply") in writers(before)
        kube.delete(kind, name)
        back = kube.wait_for(lambda kind=kind, name=name: kube.get(kind, name), 10, f"{name} put back")
        # In the name of one of the server-side appliers that set it (another test's Argo CD-like
        # apply of the same objects may share it with kubectl), nothing in the operator's.
        assert len(writers(back)) == 1 and writers(back) <= {w for w in writers(before) if w[1] == "Apply"}, (
            writers(before), back["metadata"]["managedFields"])
        assert back["metadata"]["labels"] == before["metadata"]["labels"]
        assert _comparable(back)["metadata"].get("annotations") == _comparable(before)["metadata"].get("annotations")
        assert back["spec"] == before["spec"]
    kube.wait_observed("applied", Ready="True")
    again = cp.kubectl("apply", "--server-side", "-k", manifests, check=False)
    assert again.returncode == 0, again.stderr
    assert {(w.verb, w.resource) for w in kube.writes() if w.name in SHARED} == {
        ("patch", "validatingadmissionpolicies"), ("patch", "mutatingadmissionpolicies"),
        ("patch", "validatingadmissionpolicybindings"), ("patch", "mutatingadmissionpolicybindings")}


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


@pytest.mark.tiers("realserver", reason=ADMITTED_BY_THE_SERVER)
def test_the_webhook_and_the_mutating_admission_policy_route_the_same_pods_for_every_scope(kube, tmp_path):
    """tests/api/test_webhook_routing.py's table (a policy per scope of spec.admission.namespaces: names,
    a selector, both, none; pods opted in by their label and by their namespace's) through the
    operator's webhook behind a real MutatingWebhookConfiguration, as overlays/webhook/ registers it,
    and then through the MutatingAdmissionPolicy: the same pods routed to the same classes, the
    ones the policies' bindings select."""
    cp = _real(kube)
    cert, key = write_self_signed_cert(tmp_path)
    port = free_port()
    kube.start(webhook=(port, cert, key))
    config = registered_as_the_overlay("mutatingwebhookconfiguration.yaml", "kata-sizing-routing-test", port, cert)
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
                  for name, labels in SCOPE_NAMESPACES.items()]
    try:
        cp.apply(config, *namespaces)
        for name in SCOPE_NAMESPACES:
            kube.wait_for(lambda name=name: cp.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"), 30,
                          f"the default ServiceAccount of {name}")
        for scope in SCOPES:
            cp.apply(scope_policy(scope, routing="Webhook"))
        for scope in SCOPES:
            kube.wait_observed(f"scope-{scope}", Ready="True")
        pods = scope_pods()
        expected = routed_by_the_bindings(pods)

        # The webhook (no MutatingAdmissionPolicyBinding exists): once the API server calls it.
        by_webhook = kube.wait_for(lambda: (lambda got: got if routed_classes(got) == expected else None)(
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
            kube.wait_observed(f"scope-{scope}", Ready="True")
        kube.wait_for(lambda: routed_classes(dry_run_all(cp, pods)) == expected, 20,
                      lambda: f"{routed_classes(dry_run_all(cp, pods))} != {expected}")
        assert len([k for scope in SCOPES for k in admission_objects(kube, f"scope-{scope}")
                    if k[0] == "MutatingAdmissionPolicyBinding"]) == len(SCOPES)

        # A pod that fits no class keeps no class, and the envelope policy refuses it with the reason.
        too_big = pod("too-big", labels={"katasizing.dev/policy": "scope-everywhere"}, cpu="64", memory="1Ti")
        assert "fit no class" in routed_classes(dry_run_all(cp, [too_big]))["too-big"]
    finally:
        cp.delete(f"{ADMISSION}/mutatingwebhookconfigurations/kata-sizing-routing-test")
        for namespace in namespaces:
            cp.delete(f"/api/v1/namespaces/{namespace['metadata']['name']}")
