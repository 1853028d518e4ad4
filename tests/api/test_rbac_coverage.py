"""The shipped ClusterRole against the requests the operator really makes, on each API tier.

On the emulator, a broad scenario (create, update, drift of every kind, a conflict, Report and
KataDeploy modes, node guidance inputs, deletion, and the lost races only the emulator can cause on
purpose), every request in its log mapped to (apiGroup, resource, verb):
- each one must be granted by manifests/clusterrole.yaml (else: 403 in a real cluster);
- each application grant must be used by some request (else the role grants more than the
  operator needs), apart from the documented exceptions below.

On the real API server, the whole session's audit log of the operator's identity (this test runs
after every other real-server test): the real authorizer refused nothing, and every grant was used.
"""

from __future__ import annotations

from functools import partial

import pytest

from kata_sizing.controller.leader import LeaseOptions
from kata_sizing.core.podfit import SHARED_NAMES
from kata_sizing.core.render import MANAGED_BY_LABEL
from tests.support import realcluster as real
from tests.support.harness import KubernetesApiEmulator
from tests.support.manifests import (
    APPLICATION_PERMISSIONS,
    FRAMEWORK_PERMISSIONS,
    LEADER_ELECTION_PERMISSIONS,
    Triple,
    granted_permissions,
    request_triple,
)
from tests.support.operator_helpers import (
    CONFIG_MAPS,
    OUTPUT_NAMESPACE,
    POLICIES,
    RUNTIME_CLASSES,
    edit,
    get_rc,
    pod_fixed,
    settle,
    update_spec,
    wait_for,
    wait_observed,
)
from tests.support.policies import example, explicit_classes_policy

# Application grants the scenario cannot exercise, each with the reason it is still needed.
NOT_EXERCISED_BUT_NEEDED: dict[Triple, str] = {
    ("", "nodes/stats", "get"): "the measurement reads Summaries on each kubelet's own port and the kubelet, not the "
                                "API server, asks whether the operator may (a SubjectAccessReview for get nodes/stats); "
                                "tests/node/test_node_measurement.py shows the real kubelet granting it and refusing it "
                                "to a ServiceAccount without it",
    **{("", "namespaces", verb): "the routing webhook's cache of namespace labels; this scenario runs no webhook "
                                 "(tests/api/test_webhook_routing.py and tests/api/test_admission_objects.py do)"
       for verb in ("get", "list", "watch")},
    **{("admissionregistration.k8s.io", plural, "patch"): (
        "a shared admission object whose installer applied it server-side is put back by a server-side apply in "
        "the installer's name, which the API server's managedFields say and the emulator does not keep; "
        "tests/api/test_admission_objects.py puts each kind back on the real server")
       for plural in ("validatingadmissionpolicies", "mutatingadmissionpolicies",
                      "validatingadmissionpolicybindings", "mutatingadmissionpolicybindings")},
    ("katasizing.dev", "katasizingpolicies", "get"): (
        "a drift-counter update that lost a race reads the policy again; that does not happen here "
        "(tests/api/test_operator_faults.py loses that race on purpose)"),
}



@pytest.mark.parametrize("method, path, query, expected", [
    ("GET", "/api", {}, None),
    ("GET", "/apis", {}, None),
    ("GET", "/apis/katasizing.dev", {}, None),
    ("GET", "/apis/node.k8s.io/v1", {}, None),
    ("GET", "/version", {}, None),
    ("GET", "/api/v1/configmaps", {"labelSelector": "a=b"}, ("", "configmaps", "list")),
    ("GET", "/api/v1/configmaps", {"watch": "true"}, ("", "configmaps", "watch")),
    ("GET", "/api/v1/namespaces/ns/configmaps/x", {}, ("", "configmaps", "get")),
    ("POST", "/api/v1/namespaces/default/events", {}, ("", "events", "create")),
    ("GET", "/api/v1/namespaces", {}, ("", "namespaces", "list")),
    ("GET", "/api/v1/namespaces/kube-system", {}, ("", "namespaces", "get")),
    ("PATCH", "/apis/katasizing.dev/v1alpha1/katasizingpolicies/p/status", {},
     ("katasizing.dev", "katasizingpolicies/status", "patch")),
    ("DELETE", "/apis/node.k8s.io/v1/runtimeclasses/x", {}, ("node.k8s.io", "runtimeclasses", "delete")),
    ("PUT", "/apis/node.k8s.io/v1/runtimeclasses/x", {}, ("node.k8s.io", "runtimeclasses", "update")),
    ("GET", "/api/v1/nodes/n1/proxy/stats/summary", {}, ("", "nodes/proxy", "get")),
])
def test_request_triples(method, path, query, expected):
    assert request_triple(method, path, query) == expected



def absent(emu: KubernetesApiEmulator, resource: str, name: str) -> bool:
    return emu.objects(resource).get(name) is None


def present(emu: KubernetesApiEmulator, resource: str, name: str) -> bool:
    return emu.objects(resource).get(name) is not None


def has_spec(emu: KubernetesApiEmulator, resource: str, name: str, field: str, value: str) -> bool:
    return ((emu.objects(resource).get(name) or {}).get("spec") or {}).get(field) == value

def _triples(table: dict[tuple[str, str], tuple[str, ...]]) -> set[Triple]:
    return {(group, resource, verb) for (group, resource), verbs in table.items() for verb in verbs}


def _broad_scenario(cluster) -> None:
    emu = cluster.emu
    emu.objects("v1/nodes").create({"metadata": {"name": "kata-1", "labels": {
        "katacontainers.io/kata-runtime": "true"}}, "status": {
        "capacity": {"cpu": "32", "memory": "128Gi"}, "allocatable": {"cpu": "31", "memory": "120Gi"}}})
    emu.objects("v1/pods").create({"metadata": {"name": "infra", "namespace": "kube-system"}, "spec": {
        "nodeName": "kata-1", "containers": [{"name": "c", "resources": {"requests": {"memory": "1Gi"}}}]}})
    # Somebody else's RuntimeClass with a name a policy wants: a conflict.
    emu.objects(RUNTIME_CLASSES).create({"metadata": {"name": "kata-taken-m"}, "handler": "kata-taken-m"})
    # What an operator before the shared admission policies wrote for a policy: its own policies,
    # which the upgraded operator deletes (their bindings it rewrites to the shared ones).
    labels = {MANAGED_BY_LABEL: "kata-sizing", "katasizing.dev/policy": "qemu-rs"}
    for kind, name, spec in (
            ("validatingadmissionpolicies", "kata-sizing-qemu-rs-envelope",
             {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": []}, "validations": []}),
            ("mutatingadmissionpolicies", "kata-sizing-qemu-rs-route",
             {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": []}, "mutations": []})):
        emu.objects(f"admissionregistration.k8s.io/v1/{kind}").create(
            {"metadata": {"name": name, "labels": labels}, "spec": spec})
    # ...and its parameters ConfigMap, which the drop-ins ConfigMap holds now: the upgraded
    # operator deletes it.
    emu.objects(CONFIG_MAPS).create({"metadata": {"name": "qemu-rs-admission", "namespace": OUTPUT_NAMESPACE,
                                                  "labels": labels}, "data": {"policy": "qemu-rs"}}, OUTPUT_NAMESPACE)
    # As the Deployment runs it: leader-elected (the Lease's verbs are exercised too).
    cluster.start(resync_s=0.5, lease=LeaseOptions(namespace=OUTPUT_NAMESPACE, identity="rbac-check"))
    wait_for(lambda: emu.objects("leases").get("kata-sizing", OUTPUT_NAMESPACE), 10)

    cluster.create(explicit_classes_policy())
    wait_observed(emu, "qemu-rs", Ready="True")
    for kind, name in (("validatingadmissionpolicies", "kata-sizing-qemu-rs-envelope"),
                       ("mutatingadmissionpolicies", "kata-sizing-qemu-rs-route")):
        wait_for(partial(absent, emu, f"admissionregistration.k8s.io/v1/{kind}", name))
    wait_for(lambda: emu.objects(CONFIG_MAPS).get("qemu-rs-admission", OUTPUT_NAMESPACE) is None)
    taken = example()
    taken["metadata"]["name"] = "taken"
    taken["spec"]["output"] = {"namespace": "other"}
    cluster.create(taken)
    wait_observed(emu, "taken", Conflict="True")
    report = example()
    # Upgraded from an operator that set a finalizer: the first pass takes it off (patch).
    report["metadata"].update(name="report", finalizers=["katasizing.dev/cleanup"])
    report["spec"].update(driftPolicy="Report", output={"namespace": "report"})
    cluster.create(report)
    wait_observed(emu, "report", Ready="True")
    wait_for(lambda: not emu.objects(POLICIES).get("report")["metadata"].get("finalizers"))
    chart = example()
    chart["metadata"]["name"] = "chart"
    chart["spec"]["runtimeClass"]["managedBy"] = "KataDeploy"
    chart["spec"]["output"] = {"namespace": "chart"}
    cluster.create(chart)
    wait_observed(emu, "chart", InSync="False")

    # Update: one class changes, one is added, the prefix of another policy changes.
    update_spec(emu, "qemu-rs", lambda spec: spec["classes"][1].update(memory="6Gi"))
    wait_observed(emu, "qemu-rs", Ready="True")
    update_spec(emu, "qemu-rs", lambda spec: spec["classes"].append({"name": "xxl", "cpu": "32", "memory": "128Gi"}))
    wait_observed(emu, "qemu-rs", Ready="True")
    update_spec(emu, "qemu-rs", lambda spec: spec["classes"].pop())
    wait_observed(emu, "qemu-rs", Ready="True")

    # Drift of every kind, and Report mode. A lost race (409) while putting an object back makes
    # the operator read it again (get) before it writes.
    original = pod_fixed(emu, "kata-qemu-rs-m")
    emu.fail_next(1, status=409, method="PUT", path="/runtimeclasses/kata-qemu-rs-m")
    edit(emu, RUNTIME_CLASSES, "kata-qemu-rs-m", lambda o: o["overhead"]["podFixed"].update(memory="1Mi"))
    wait_for(lambda: pod_fixed(emu, "kata-qemu-rs-m") == original)
    # The same edit again: the same DriftCorrected event, counted on the one posted (patch events).
    edit(emu, RUNTIME_CLASSES, "kata-qemu-rs-m", lambda o: o["overhead"]["podFixed"].update(memory="1Mi"))
    wait_for(lambda: pod_fixed(emu, "kata-qemu-rs-m") == original)
    edit(emu, CONFIG_MAPS, "qemu-rs-dropins", lambda o: o["data"].update({"m.toml": "#"}), OUTPUT_NAMESPACE)
    wait_for(lambda: emu.objects(CONFIG_MAPS).get("qemu-rs-dropins", OUTPUT_NAMESPACE)["data"]["m.toml"] != "#")
    emu.objects(CONFIG_MAPS).delete("qemu-rs-kata-deploy-values", OUTPUT_NAMESPACE)
    wait_for(lambda: emu.objects(CONFIG_MAPS).get("qemu-rs-kata-deploy-values", OUTPUT_NAMESPACE))
    # A ConfigMap whose managed-by label is removed leaves the operator's cache: the pass takes its
    # name as free, the create meets 409, and the operator reads it (get) before it writes.
    edit(emu, CONFIG_MAPS, "qemu-rs-node-guidance", lambda o: o["metadata"]["labels"].pop(MANAGED_BY_LABEL),
         OUTPUT_NAMESPACE)
    wait_for(lambda: MANAGED_BY_LABEL in emu.objects(CONFIG_MAPS).get("qemu-rs-node-guidance",
                                                                      OUTPUT_NAMESPACE)["metadata"]["labels"])
    emu.objects(RUNTIME_CLASSES).delete("kata-qemu-rs-s")
    wait_for(lambda: get_rc(emu, "kata-qemu-rs-s"))
    handler_changed = dict(get_rc(emu, "kata-qemu-rs-l") or {}, handler="elsewhere")
    emu.objects(RUNTIME_CLASSES).put(handler_changed)
    wait_for(lambda: (get_rc(emu, "kata-qemu-rs-l") or {}).get("handler") == "kata-qemu-rs-l")
    # A hand deletion of each admission kind, and a create that meets 409 (somebody made one of
    # that name meanwhile): the operator reads it (get) before it writes again.
    for kind, name in (("validatingadmissionpolicies", SHARED_NAMES["envelope"]),
                       ("validatingadmissionpolicybindings", "kata-sizing-qemu-rs-memory-limit"),
                       ("mutatingadmissionpolicies", SHARED_NAMES["route"]),
                       ("mutatingadmissionpolicybindings", "kata-sizing-qemu-rs-route")):
        emu.fail_next(1, status=409, method="POST", path=f"/{kind}$")
        emu.objects(f"admissionregistration.k8s.io/v1/{kind}").delete(name)
        wait_for(partial(present, emu, f"admissionregistration.k8s.io/v1/{kind}", name))
    # A hand edit of each shared admission policy is put back (update).
    for kind, name in (("validatingadmissionpolicies", SHARED_NAMES["envelope"]),
                       ("mutatingadmissionpolicies", SHARED_NAMES["route"])):
        path = f"admissionregistration.k8s.io/v1/{kind}"
        edit(emu, path, name, lambda o: o["spec"].update(failurePolicy="Ignore"))
        wait_for(partial(has_spec, emu, path, name, "failurePolicy", "Fail"))
    for binding in ("validatingadmissionpolicybindings", "mutatingadmissionpolicybindings"):
        path = f"admissionregistration.k8s.io/v1/{binding}"
        name, shared = (("kata-sizing-qemu-rs-envelope", SHARED_NAMES["envelope"]) if binding.startswith("validating")
                        else ("kata-sizing-qemu-rs-route", SHARED_NAMES["route"]))
        edit(emu, path, name, lambda o: o["spec"].update(policyName="elsewhere"))
        wait_for(partial(has_spec, emu, path, name, "policyName", shared))
    edit(emu, RUNTIME_CLASSES, "kata-report-m", lambda o: o["overhead"]["podFixed"].update(memory="1Mi"))
    wait_for(lambda: (emu.objects(POLICIES).get("report").get("status") or {}).get("driftDetected"))
    # Admission switched off: the policy's bindings are deleted.
    update_spec(emu, "qemu-rs", lambda spec: spec.update(admission={"enabled": False}))
    wait_for(lambda: emu.objects("admissionregistration.k8s.io/v1/validatingadmissionpolicybindings").get(
        "kata-sizing-qemu-rs-envelope") is None)
    settle(emu)

    # Deletion: nothing of the operator's (the garbage collector removes what it made).
    for name in ("qemu-rs", "taken", "report", "chart"):
        emu.objects(POLICIES).delete(name)
    wait_for(lambda: not emu.objects(POLICIES).list(), 10)
    settle(emu)
    cluster.stop()  # a clean stop releases the Lease


@pytest.fixture
def exercised(cluster) -> dict[Triple, list[str]]:
    _broad_scenario(cluster)
    found: dict[Triple, list[str]] = {}
    for record in cluster.emu.request_log:
        triple = request_triple(record.method, record.path, record.query)
        if triple is not None:
            found.setdefault(triple, []).append(f"{record.method} {record.path} -> {record.status}")
    return found


@pytest.mark.emulator
def test_every_request_is_granted_and_every_application_grant_is_used(exercised):
    granted = granted_permissions() | _triples(LEADER_ELECTION_PERMISSIONS)
    refused = {t: calls[:3] for t, calls in exercised.items() if t not in granted}
    assert not refused, f"requests a real API server would refuse with 403: {refused}"
    # The Role covers the Lease in the operator's namespace only.
    lease_calls = [c for t, calls in exercised.items() if t[1] == "leases" for c in calls]
    assert lease_calls and all(f"/namespaces/{OUTPUT_NAMESPACE}/leases" in c for c in lease_calls), lease_calls

    framework_only = _triples(FRAMEWORK_PERMISSIONS) - _triples(APPLICATION_PERMISSIONS)
    application = (granted & (_triples(APPLICATION_PERMISSIONS) | _triples(LEADER_ELECTION_PERMISSIONS))) \
        - framework_only
    unused = application - set(exercised) - set(NOT_EXERCISED_BUT_NEEDED)
    assert not unused, f"the ClusterRole grants more than the operator uses: {sorted(unused)}"


# --- RBAC: the real authorizer against the shipped ClusterRole ------------------------------------


@pytest.mark.realserver
def test_every_grant_of_the_clusterrole_is_used_and_nothing_was_refused(control_plane, real_operator):
    """Over the whole session's audit log (this runs after the other real-server tests, and
    adds a scenario of its own with leader election): the API server refused the operator
    nothing, and every (group, resource, verb) the ClusterRole grants was used. Some grants
    serve only rarer paths that other tests take, so run alone this test may find them unused."""
    from tests.support.manifests import LEADER_ELECTION_PERMISSIONS, granted_permissions

    real_operator.start("--leader-elect")  # as the Deployment runs it: the Role's Lease grants are used too
    body = real.qemu_rs("rbac")
    # What an operator before the shared admission policies left for a policy: its parameters
    # ConfigMap, which the drop-ins ConfigMap holds now. The upgraded operator deletes it.
    control_plane.create(real.configmaps(real.OPERATOR_NAMESPACE), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "rbac-admission", "labels": {
        "app.kubernetes.io/managed-by": "kata-sizing", "katasizing.dev/policy": "rbac"}}, "data": {"policy": "rbac"}})
    real.create_ready(control_plane, body)
    real.poll(lambda: control_plane.get(real.cm_path("rbac-admission")) is None, 10, "the old parameters ConfigMap deleted")
    name = sorted(real.runtime_classes(control_plane, "rbac"))[0]
    right = real.pod_fixed(control_plane, name)
    for _ in range(2):  # the same edit twice: the second DriftCorrected counts on the first (patch events)
        control_plane.edit(real.rc_path(name), lambda o: o["overhead"]["podFixed"].update(memory="1Mi"))
        real.poll(lambda: real.pod_fixed(control_plane, name) == right, 10, "the edit put back")
    control_plane.delete(real.cm_path("rbac-dropins"))
    real.poll(lambda: control_plane.get(real.cm_path("rbac-dropins")), 10, "drop-ins re-created")
    # Without its managed-by label a ConfigMap leaves the operator's cache: the create meets 409
    # and the operator reads it (get configmaps) before it puts the label back.
    control_plane.edit(real.cm_path("rbac-node-guidance"),
                       lambda o: o["metadata"]["labels"].pop("app.kubernetes.io/managed-by"))
    real.poll(lambda: "app.kubernetes.io/managed-by" in
              control_plane.read(real.cm_path("rbac-node-guidance"))["metadata"]["labels"],
              10, "the managed-by label put back")
    body["spec"]["classes"].pop()
    control_plane.apply(body)
    real.wait_observed(control_plane, "rbac", Ready="True")
    # Admission switched off: the policy's bindings go (delete).
    body["spec"]["admission"] = {"enabled": False}
    control_plane.apply(body)
    real.poll(lambda: not control_plane.items("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
                                         "katasizing.dev/policy=rbac"), 10, "the bindings deleted")
    control_plane.kubectl("delete", "ksp", "rbac", "--timeout=30s")
    # The leader renews its Lease (an update) every 2 s; run alone, the scenario can end first.
    real.poll(lambda: any(r.permission == ("coordination.k8s.io", "leases", "update")
                     for r in control_plane.operator_requests()), 15, "the leader renewed its Lease")

    requests = control_plane.operator_requests()
    refused = [r for r in requests if r.code == 403]
    assert not refused, refused
    used = {r.permission for r in requests if r.resource}
    granted = granted_permissions() | {
        (group, resource, verb) for (group, resource), verbs in LEADER_ELECTION_PERMISSIONS.items() for verb in verbs}
    assert used <= granted, f"used but not granted (impossible without a 403): {used - granted}"
    # A write that loses a race (409) reads the object again; a real server gives no way to
    # lose one on purpose, so tests/api/test_rbac_coverage.py injects those 409s on the emulator.
    after_a_lost_race = {("node.k8s.io", "runtimeclasses", "get"), ("katasizing.dev", "katasizingpolicies", "get")} | {
        ("admissionregistration.k8s.io", plural, "get") for plural in (
            "validatingadmissionpolicies", "validatingadmissionpolicybindings",
            "mutatingadmissionpolicies", "mutatingadmissionpolicybindings")}
    # The kubelets, not the API server, check this one (their SubjectAccessReviews are the
    # kubelet's requests): tests/node/test_node_measurement.py shows a kubelet granting and refusing it.
    kubelet_authorized = {("", "nodes/stats", "get")}
    # The routing webhook reads a namespace its cache has not seen yet (created a moment before its
    # first pod): tests/api/test_webhook_routing.py makes that happen.
    cache_miss = {("", "namespaces", "get")}
    unused = granted - used - after_a_lost_race - kubelet_authorized - cache_miss
    assert unused == set(), f"granted but never used by the operator: {sorted(unused)}"
