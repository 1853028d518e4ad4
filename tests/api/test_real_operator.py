"""The operator against the real kube-apiserver (tests/support/realcluster.py), with the identity of its
ServiceAccount, so the real authorizer enforces manifests/clusterrole.yaml.

What the API server itself decides is proven here: the CRD's schema, enums and CEL rules, the
printer columns, RuntimeClass.handler immutability, resourceVersion conflicts, label selectors,
finalizers, the garbage collector and the namespace controller, RBAC. Each test starts its own
operator and leaves no policy behind (the `real_operator` fixture), and fails on any 403.
"""

from __future__ import annotations

import copy
import json
import time

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.realcluster import (
    OPERATOR_NAMESPACE,
    POLICIES,
    RUNTIME_CLASSES,
    ApiError,
    ControlPlane,
    cm_path,
    configmaps,
    create_ready,
    pod_fixed,
    policy_configmaps,
    poll,
    qemu_rs,
    quiet,
    rc_path,
    render,
    runtime_classes,
    status,
    versions,
    wait_observed,
)

pytestmark = pytest.mark.realserver

NAMESPACE = OPERATOR_NAMESPACE
CLASSES = ("s", "m", "l", "xl")


# --- the custom resource as the API server enforces it ---------------------------------------------


@pytest.mark.parametrize("change, field, words", [
    (lambda s: s.update(runtime="Java"), "spec.runtime", "Unsupported value"),
    (lambda s: s["overhead"].update(guestMemoryRatio="0.95"), "spec.overhead.guestMemoryRatio", "0.9"),
    (lambda s: s["classes"].append({"name": "s", "cpu": "32", "memory": "128Gi"}), "spec.classes",
     "class names must be unique"),
    (lambda s: s.pop("shim"), "spec.shim", "Required value"),
    (lambda s: s.update(driftPolicy="Ignore"), "spec.driftPolicy", "Unsupported value"),
    (lambda s: s["runtimeClass"].update(managedBy="Helm"), "spec.runtimeClass.managedBy", "Unsupported value"),
    (lambda s: s.update(surprise=True), "spec.surprise", "unknown field"),
], ids=["runtime-enum", "ratio-cel", "unique-classes-cel", "shim-required", "drift-enum",
        "managedBy-enum", "unknown-field"])
def test_the_api_server_refuses_a_malformed_policy_naming_the_field(control_plane, change, field, words):
    body = qemu_rs("malformed")
    body["spec"].setdefault("overhead", {"guestMemoryRatio": "0.14"})
    body["spec"].setdefault("runtimeClass", {})
    change(body["spec"])
    result = control_plane.apply(body, check=False)
    assert result.returncode != 0, f"the server accepted it: {result.stdout}"
    assert field in result.stderr and words in result.stderr, result.stderr
    assert control_plane.get(f"{POLICIES}/malformed") is None


def test_kubectl_get_ksp_shows_the_printer_columns(control_plane, real_operator):
    real_operator.start()
    create_ready(control_plane, qemu_rs("columns"))
    out = control_plane.kubectl("get", "ksp", "columns").stdout.splitlines()
    header = out[0].split()
    row = dict(zip(header, out[1].split()))
    assert header[:5] == ["NAME", "SHIM", "MODE", "CLASSES", "READY"], out
    assert row["SHIM"] == "qemu-runtime-rs" and row["MODE"] == "Rust" and row["READY"] == "True", out
    assert row["CLASSES"].split(",") == list(CLASSES), out


# --- reconcile -----------------------------------------------------------------------------------


def test_create_writes_what_render_prints(control_plane, real_operator, tmp_path):
    real_operator.start()
    body = qemu_rs("created")
    create_ready(control_plane, body)
    expected = render(body, tmp_path)
    live_rcs = runtime_classes(control_plane, "created")
    assert sorted(live_rcs) == [f"kata-qemu-rs-{c}" for c in sorted(CLASSES)] or \
        sorted(live_rcs) == sorted(n for k, n in expected if k == "RuntimeClass")
    for (kind, name), obj in expected.items():
        if kind == "RuntimeClass":
            live = live_rcs[name]
            assert live["handler"] == obj["handler"] == name
            assert live["overhead"] == obj["overhead"]
            assert live["scheduling"] == obj["scheduling"]
            assert live["metadata"]["labels"] == obj["metadata"]["labels"]
            # The real server keeps the ownerReference to the cluster-scoped policy.
            assert live["metadata"]["ownerReferences"][0]["kind"] == "KataSizingPolicy"
        elif kind == "ConfigMap" and not name.endswith("node-guidance"):
            assert control_plane.get(cm_path(name))["data"] == obj["data"], name
    assert set(policy_configmaps(control_plane, "created")) == {
        "created-kata-deploy-values", "created-dropins", "created-node-guidance"}


def test_an_output_namespace_that_does_not_exist_yet_is_said_in_status_and_backed_off(control_plane, real_operator):
    """spec.output.namespace missing: the status says so with the server's message, the other
    objects are written, each ConfigMap is tried once a pass with the passes backing off (not
    five tries 55 ms apart), the log line of that pass counts the writes that landed, and once the
    namespace exists the ConfigMaps follow."""
    cp = control_plane
    real_operator.start("--log-format", "json")
    mark = cp.audit_offset()
    cp.apply(qemu_rs("early", output={"namespace": "not-yet"}))
    st = wait_observed(cp, "early", InSync="False")
    in_sync = {c["type"]: c for c in st["conditions"]}["InSync"]
    assert in_sync["reason"] == "OutputNamespaceMissing", in_sync
    assert 'namespaces "not-yet" not found' in in_sync["message"]
    assert len(runtime_classes(cp, "early")) == len(CLASSES)
    time.sleep(6)
    creates = [e for e in cp.operator_writes(mark, "configmaps") if e.verb == "create"]
    # Four ConfigMaps (the admission parameters too); passes after 0.2, 0.4, 0.8, 1.6, 3.2 s
    # (capped exponential, with jitter).
    assert 4 <= len(creates) <= 4 * 7, creates
    log = real_operator.log()
    assert "still conflicting" not in log
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    first = next(e for e in lines if e.get("policy") == "early" and e.get("trigger") == "apply")
    landed = [e for e in cp.operator_writes(mark) if e.verb == "create" and e.code == 201
              and e.resource in ("runtimeclasses", "validatingadmissionpolicies", "validatingadmissionpolicybindings",
                                 "mutatingadmissionpolicies", "mutatingadmissionpolicybindings")]
    # The RuntimeClasses, and the shared admission policies unless an earlier test left them; no
    # binding, whose parameters could not be written (it would deny every pod of the classes).
    assert not [e for e in landed if e.resource.endswith("bindings")], landed
    assert first["result"] == "error" and first["writes"] == len(landed) in (len(CLASSES), len(CLASSES) + 3), first

    cp.kubectl("create", "namespace", "not-yet")
    try:
        wait_observed(cp, "early", timeout=40, Ready="True")
        assert set(cp.items(configmaps("not-yet"), "katasizing.dev/policy=early")) == {
            "early-kata-deploy-values", "early-dropins", "early-node-guidance"}
        assert len(cp.items("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
                            "katasizing.dev/policy=early")) == 2
    finally:
        cp.kubectl("delete", "namespace", "not-yet", "--wait=false")


def test_update_add_and_remove_a_class_and_rename_the_prefix(control_plane, real_operator, tmp_path):
    real_operator.start()
    body = qemu_rs("changing")
    create_ready(control_plane, body)
    before = pod_fixed(control_plane, "kata-changing-s") or pod_fixed(control_plane, "kata-qemu-rs-s")
    prefix = next(iter(runtime_classes(control_plane, "changing"))).rsplit("-", 1)[0]

    # A bigger envelope for s: a bigger guest budget, a bigger podFixed.
    body["spec"]["classes"][0]["memory"] = "2Gi"
    body["spec"]["classes"].append({"name": "xxl", "cpu": "32", "memory": "128Gi"})
    del body["spec"]["classes"][2]  # l
    control_plane.apply(body)
    wait_observed(control_plane, "changing", Ready="True")
    expected = render(body, tmp_path)
    names = sorted(runtime_classes(control_plane, "changing"))
    assert names == sorted(n for k, n in expected if k == "RuntimeClass")
    assert f"{prefix}-l" not in names and f"{prefix}-xxl" in names
    assert pod_fixed(control_plane, f"{prefix}-s") == expected[("RuntimeClass", f"{prefix}-s")]["overhead"]["podFixed"]
    assert pod_fixed(control_plane, f"{prefix}-s") != before

    body["spec"].setdefault("runtimeClass", {})["namePrefix"] = "kata-renamed"
    control_plane.apply(body)
    wait_observed(control_plane, "changing", Ready="True")
    poll(lambda: sorted(runtime_classes(control_plane, "changing")) ==
         [f"kata-renamed-{c}" for c in sorted(["s", "m", "xl", "xxl"])], 20,
         lambda: f"RuntimeClasses: {sorted(runtime_classes(control_plane, 'changing'))}")
    assert not any(n.startswith(prefix + "-") for n in control_plane.items(RUNTIME_CLASSES))


def test_a_changed_handler_is_deleted_and_recreated(control_plane, real_operator):
    """handler is immutable on the real server (422 on update): the operator must re-create."""
    real_operator.start()
    create_ready(control_plane, qemu_rs("handler"))
    name = sorted(runtime_classes(control_plane, "handler"))[0]
    live = control_plane.get(rc_path(name))
    changed = copy.deepcopy(live)
    changed["handler"] = "kata-something-else"
    with pytest.raises(ApiError) as refused:
        control_plane.request("PUT", rc_path(name), changed)
    assert refused.value.status == 422 and "immutable" in str(refused.value.body)

    # While the operator is down, someone replaces it with another handler, labels kept: the
    # operator must see that on resume and delete and re-create it.
    real_operator.stop()
    control_plane.delete(rc_path(name))
    for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
        changed["metadata"].pop(key, None)
    control_plane.create(RUNTIME_CLASSES, changed)
    real_operator.start()
    poll(lambda: (control_plane.get(rc_path(name)) or {}).get("handler") == name, 15,
         lambda: f"{name}: {control_plane.get(rc_path(name))}")
    # Deleted once. A second delete may be tried by the drift handler with the old object's uid
    # as a precondition: the real server answers 409 and nothing is lost.
    deleted = [w for w in control_plane.operator_writes(real_operator.started_at_offset, "runtimeclasses")
               if w.verb == "delete" and w.name == name]
    assert [w.code for w in deleted if w.code < 300] == [200], deleted
    assert all(w.code == 409 for w in deleted if w.code >= 300), deleted


def test_drift_of_every_managed_field_and_deletion_of_every_object_is_put_back(control_plane, real_operator):
    real_operator.start()
    create_ready(control_plane, qemu_rs("drift"))
    quiet(control_plane)
    rcs = runtime_classes(control_plane, "drift")
    cms = policy_configmaps(control_plane, "drift")
    first_rc = sorted(rcs)[0]
    good = {name: copy.deepcopy(obj) for name, obj in rcs.items()}

    edits = {
        "podFixed.cpu": lambda o: o["overhead"]["podFixed"].update(cpu="1m"),
        "podFixed.memory": lambda o: o["overhead"]["podFixed"].update(memory="1Mi"),
        "nodeSelector": lambda o: o.setdefault("scheduling", {}).update(nodeSelector={"other": "node"}),
        "tolerations": lambda o: o.setdefault("scheduling", {}).update(
            tolerations=[{"key": "x", "operator": "Exists", "effect": "NoSchedule"}]),
        "policy label": lambda o: o["metadata"]["labels"].update({"katasizing.dev/class": "zz"}),
    }
    for what, change in edits.items():
        control_plane.edit(rc_path(first_rc), change)
        poll(lambda: (lambda o: o["overhead"] == good[first_rc]["overhead"]
                      and o.get("scheduling") == good[first_rc].get("scheduling")
                      and o["metadata"]["labels"] == good[first_rc]["metadata"]["labels"])(
                          control_plane.get(rc_path(first_rc))), 10, f"{what} restored")

    for name, cm in cms.items():
        key = sorted(cm["data"])[0]
        control_plane.edit(cm_path(name), lambda o, key=key: o["data"].update({key: "edited by hand"}))
        poll(lambda name=name, key=key: control_plane.get(cm_path(name))["data"][key] == cm["data"][key]
             or name.endswith("node-guidance") and control_plane.get(cm_path(name))["data"][key] != "edited by hand",
             10, f"{name} data restored")

    for name in [*rcs, *cms]:
        path = rc_path(name) if name in rcs else cm_path(name)
        control_plane.delete(path)
        poll(lambda path=path: control_plane.get(path), 10, f"{name} re-created")
    # Every edit and deletion is counted once, whichever pass put it back: a drift event's, or
    # the guidance timer's (every second here), which may reach the guidance ConfigMap first.
    expected = len(edits) + len(rcs) + 2 * len(cms)
    poll(lambda: int(status(control_plane, "drift").get("driftCorrections") or 0) == expected, 10,
         lambda: f"driftCorrections {status(control_plane, 'drift').get('driftCorrections')}, expected {expected}")
    quiet(control_plane)
    assert int(status(control_plane, "drift")["driftCorrections"]) == expected


def test_ten_hand_edits_restored_read_ten(control_plane, real_operator):
    """status.driftCorrections is exact with passes running concurrently (the guidance timer
    every second, a drift pass per edit): ten edits put back read ten, and stay ten."""
    real_operator.start()
    create_ready(control_plane, qemu_rs("counted"))
    quiet(control_plane)
    names = sorted(runtime_classes(control_plane, "counted"))
    good = {name: pod_fixed(control_plane, name) for name in names}
    for i in range(10):
        name = names[i % len(names)]
        control_plane.edit(rc_path(name), lambda o, i=i: o["overhead"]["podFixed"].update(memory=f"{i + 1}Mi"))
        poll(lambda name=name: pod_fixed(control_plane, name) == good[name], 10, f"edit {i + 1} put back")
    poll(lambda: int(status(control_plane, "counted").get("driftCorrections") or 0) >= 10, 10,
         lambda: f"status: {status(control_plane, 'counted')}")
    quiet(control_plane)
    assert int(status(control_plane, "counted")["driftCorrections"]) == 10


def test_report_mode_reports_and_leaves_the_edit(control_plane, real_operator):
    real_operator.start()
    create_ready(control_plane, qemu_rs("report", driftPolicy="Report"))
    quiet(control_plane)
    name = sorted(runtime_classes(control_plane, "report"))[0]
    control_plane.edit(rc_path(name), lambda o: o["overhead"]["podFixed"].update(memory="1Mi"))
    poll(lambda: int(status(control_plane, "report").get("driftDetected") or 0) >= 1, 10,
         lambda: f"status: {status(control_plane, 'report')}")
    time.sleep(1.5)
    assert pod_fixed(control_plane, name)["memory"] == "1Mi"
    assert not control_plane.operator_writes(resource="runtimeclasses",
                                             since=real_operator.started_at_offset)[4:], \
        "only the four creations were written to RuntimeClasses"
    events = control_plane.items("/api/v1/namespaces/default/events") | control_plane.items(
        f"/api/v1/namespaces/{NAMESPACE}/events")
    assert any(e.get("reason") == "DriftDetected" for e in events.values()), sorted(
        e.get("reason") for e in events.values())


def test_a_foreign_runtimeclass_is_a_conflict_and_never_touched(control_plane, real_operator):
    foreign = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
               "metadata": {"name": "kata-qemu-rs-s"}, "handler": "kata-qemu-rs-s"}
    created = control_plane.create(RUNTIME_CLASSES, foreign)
    real_operator.start()
    control_plane.apply(qemu_rs("conflicted", runtimeClass={"namePrefix": "kata-qemu-rs"}))
    st = wait_observed(control_plane, "conflicted", Conflict="True")
    assert "kata-qemu-rs-s" in json.dumps(st["conditions"])
    assert control_plane.get(rc_path("kata-qemu-rs-s"))["metadata"]["resourceVersion"] == \
        created["metadata"]["resourceVersion"]
    writes = control_plane.operator_writes(real_operator.started_at_offset, "runtimeclasses")
    assert all(w.name != "kata-qemu-rs-s" for w in writes), writes


def test_an_invalid_update_keeps_the_last_good_objects(control_plane, real_operator):
    real_operator.start()
    body = qemu_rs("keeps")
    create_ready(control_plane, body)
    quiet(control_plane)
    before_rcs, before_cms = runtime_classes(control_plane, "keeps"), policy_configmaps(control_plane, "keeps")
    # Valid for the schema, invalid for the sizing rules: podFixed below overhead_memory.
    body["spec"]["classes"][0].update(overheadMemory="512Mi", podFixed={"cpu": "2", "memory": "256Mi"})
    control_plane.apply(body)
    st = wait_observed(control_plane, "keeps", Valid="False")
    message = json.dumps(st["conditions"])
    assert "podFixed" in message and "classes[0]" in message or "class s" in message, message
    time.sleep(1)
    assert versions(runtime_classes(control_plane, "keeps")) == versions(before_rcs)
    assert {n: o["data"] for n, o in policy_configmaps(control_plane, "keeps").items()
            if not n.endswith("node-guidance")} == \
        {n: o["data"] for n, o in before_cms.items() if not n.endswith("node-guidance")}


def test_a_restarted_operator_writes_nothing(control_plane, real_operator):
    real_operator.start()
    create_ready(control_plane, qemu_rs("restart"))
    quiet(control_plane)
    real_operator.stop()
    real_operator.start()
    mark = real_operator.started_at_offset
    time.sleep(4)  # startup, resume handlers, a guidance tick (1 s) and informer lists
    assert control_plane.operator_writes(mark) == []
    assert control_plane.operator_requests(mark), "the restarted operator made no request at all"


# --- deletion, garbage collection, uninstall ------------------------------------------------------


def _gone(cp: ControlPlane, policy: str) -> None:
    """The garbage collector removed what the operator made for `policy` (ownerReferences)."""
    poll(lambda: not policy_configmaps(cp, policy) and not runtime_classes(cp, policy), 60,
         lambda: f"left: {sorted(policy_configmaps(cp, policy))} {sorted(runtime_classes(cp, policy))}")


def test_a_deleted_policy_goes_at_once_and_the_garbage_collector_removes_what_was_made(control_plane, real_operator):
    """No finalizer: `kubectl delete` returns at once, even while the guidance check passes the
    policy all the time, and the objects follow through their ownerReferences."""
    real_operator.start(guidance_s=0.1)
    for i in range(2):
        create_ready(control_plane, qemu_rs(f"gone-{i}"))
        assert not control_plane.get(f"{POLICIES}/gone-{i}")["metadata"].get("finalizers")
        started = time.monotonic()
        control_plane.kubectl("delete", "ksp", f"gone-{i}", "--timeout=20s")
        assert time.monotonic() - started < 5, "the deletion waited for the operator"
        _gone(control_plane, f"gone-{i}")
    mark = control_plane.audit_offset()
    time.sleep(1)
    assert control_plane.operator_writes(mark) == [], "the operator wrote for a deleted policy"


def test_a_policy_deleted_while_the_operator_is_stopped_is_not_stuck(control_plane, real_operator):
    real_operator.start()
    create_ready(control_plane, qemu_rs("orphaned"))
    real_operator.stop()
    control_plane.kubectl("delete", "ksp", "orphaned", "--timeout=20s")  # nothing holds it
    assert control_plane.get(f"{POLICIES}/orphaned") is None
    _gone(control_plane, "orphaned")


def test_an_older_operators_finalizer_is_released_by_the_first_pass(control_plane, real_operator):
    """Upgrade: a policy an older operator finalized, deleted while no operator ran, waits on that
    finalizer; the operator takes it off at start, and the garbage collector does the rest."""
    real_operator.start()
    create_ready(control_plane, qemu_rs("upgraded"))
    real_operator.stop()
    control_plane.merge_patch(f"{POLICIES}/upgraded", {"metadata": {
        "finalizers": ["katasizing.dev/cleanup"],
        "annotations": {"katasizing.dev/last-handled-configuration": '{"spec": {}}'}}})
    control_plane.kubectl("delete", "ksp", "upgraded", "--wait=false")
    assert control_plane.get(f"{POLICIES}/upgraded")["metadata"].get("deletionTimestamp")
    mark = control_plane.audit_offset()
    real_operator.start()
    poll(lambda: control_plane.get(f"{POLICIES}/upgraded") is None, 20, "the old finalizer still holds the policy")
    _gone(control_plane, "upgraded")
    assert [(w.verb, w.resource) for w in control_plane.operator_writes(mark)] == [("patch", "katasizingpolicies")]


# --- the admission webhook, registered with the real API server -----------------------------------


def test_the_api_server_refuses_a_policy_that_breaks_a_sizing_rule_through_the_webhook(
        control_plane, real_operator, tmp_path):
    import base64

    from tests.support.realcluster import free_port
    from tests.support.webhook import invalid_body, write_self_signed_cert

    cert, key = write_self_signed_cert(tmp_path)
    port = free_port()
    real_operator.start("--webhook-port", str(port), "--webhook-addr", "127.0.0.1",
                        "--webhook-cert", str(cert), "--webhook-key", str(key))
    # As overlays/webhook/ registers it, with a URL instead of the Service (no pod network here)
    # and the caBundle set by the test (cert-manager's job in production).
    shipped = yaml.safe_load((ROOT / "overlays/webhook/validatingwebhookconfiguration.yaml").read_text())
    config = copy.deepcopy(shipped)
    config["metadata"] = {"name": "kata-sizing-test"}
    hook = config["webhooks"][0]
    hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{shipped['webhooks'][0]['clientConfig']['service']['path']}",
                            "caBundle": base64.b64encode(cert.read_bytes()).decode()}
    control_plane.apply(config)
    try:
        body = invalid_body()
        body["metadata"]["name"] = "refused"
        # The API server may take a moment to see a new webhook configuration.
        result = poll(lambda: (lambda r: r if r.returncode != 0 else None)(control_plane.apply(body, check=False))
                      or control_plane.delete(f"{POLICIES}/refused"), 20, "the webhook refuses the policy")
        assert 'admission webhook "validate-policy.katasizing.dev" denied the request' in result.stderr, result.stderr
        assert "podFixed.memory 64Mi must be above overhead_memory 96Mi" in result.stderr
        assert "podFixed.cpu 100m must be above overhead_vcpus 0.2" in result.stderr
        assert control_plane.get(f"{POLICIES}/refused") is None
        # A valid policy passes the same webhook, and its warning reaches kubectl.
        ok = control_plane.apply(qemu_rs("admitted"))
        assert "katasizingpolicy.katasizing.dev/admitted created" in ok.stdout
    finally:
        control_plane.delete("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/kata-sizing-test")


# --- RBAC: the real authorizer against the shipped ClusterRole ------------------------------------


def test_every_grant_of_the_clusterrole_is_used_and_nothing_was_refused(control_plane, real_operator):
    """Over the whole session's audit log (this runs after the other real-server tests, and
    adds a scenario of its own with leader election): the API server refused the operator
    nothing, and every (group, resource, verb) the ClusterRole grants was used. Some grants
    serve only rarer paths that other tests take, so run alone this test may find them unused."""
    from tests.support.manifests import LEADER_ELECTION_PERMISSIONS, granted_permissions

    real_operator.start("--leader-elect")  # as the Deployment runs it: the Role's Lease grants are used too
    body = qemu_rs("rbac")
    # What an operator before the shared admission policies left for a policy: its parameters
    # ConfigMap, which the drop-ins ConfigMap holds now. The upgraded operator deletes it.
    control_plane.create(configmaps(NAMESPACE), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "rbac-admission", "labels": {
        "app.kubernetes.io/managed-by": "kata-sizing", "katasizing.dev/policy": "rbac"}}, "data": {"policy": "rbac"}})
    create_ready(control_plane, body)
    poll(lambda: control_plane.get(cm_path("rbac-admission")) is None, 10, "the old parameters ConfigMap deleted")
    name = sorted(runtime_classes(control_plane, "rbac"))[0]
    right = pod_fixed(control_plane, name)
    for _ in range(2):  # the same edit twice: the second DriftCorrected counts on the first (patch events)
        control_plane.edit(rc_path(name), lambda o: o["overhead"]["podFixed"].update(memory="1Mi"))
        poll(lambda: pod_fixed(control_plane, name) == right, 10, "the edit put back")
    control_plane.delete(cm_path("rbac-dropins"))
    poll(lambda: control_plane.get(cm_path("rbac-dropins")), 10, "drop-ins re-created")
    # Without its managed-by label a ConfigMap leaves the operator's cache: the create meets 409
    # and the operator reads it (get configmaps) before it puts the label back.
    control_plane.edit(cm_path("rbac-node-guidance"),
                       lambda o: o["metadata"]["labels"].pop("app.kubernetes.io/managed-by"))
    poll(lambda: "app.kubernetes.io/managed-by" in control_plane.get(cm_path("rbac-node-guidance"))["metadata"]["labels"],
         10, "the managed-by label put back")
    body["spec"]["classes"].pop()
    control_plane.apply(body)
    wait_observed(control_plane, "rbac", Ready="True")
    # Admission switched off: the policy's bindings go (delete).
    body["spec"]["admission"] = {"enabled": False}
    control_plane.apply(body)
    poll(lambda: not control_plane.items("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
                                         "katasizing.dev/policy=rbac"), 10, "the bindings deleted")
    control_plane.kubectl("delete", "ksp", "rbac", "--timeout=30s")
    # The leader renews its Lease (an update) every 2 s; run alone, the scenario can end first.
    poll(lambda: any(r.permission == ("coordination.k8s.io", "leases", "update")
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
