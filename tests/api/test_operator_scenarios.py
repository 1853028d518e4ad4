"""The operator against the Kubernetes API emulator, judged by what a user would see: the
objects in the cluster, the policy's status conditions, the Events, and how many writes the
operator made to get there (from the emulator's request log). What a real API server proves as
well (a prefix rename, a deleted object put back, a rule violation keeping the last good objects)
lives in tests/api/test_real_operator.py only."""

from __future__ import annotations

import copy
import logging
import re

import pytest

from kata_sizing.controller import conditions as cond
from kata_sizing.core import podfit
from kata_sizing.core.model import parse_policy
from kata_sizing.core.render import CLASS_LABEL, MANAGED_BY, MANAGED_BY_LABEL, POLICY_LABEL, render_policy
from kata_sizing.core.sizing import size_policy
from tests.support.operator_helpers import (
    CM_PATH,
    CONFIG_MAPS,
    EVENT_PATH,
    OUTPUT_NAMESPACE,
    POLICIES,
    RC_PATH,
    RUNTIME_CLASSES,
    STATUS_PATH,
    condition,
    conditions,
    config_maps,
    counter,
    describe_writes,
    edit,
    event_messages,
    events,
    get_cm,
    get_rc,
    named,
    passes,
    pod_fixed,
    policy,
    runtime_classes,
    settle,
    status,
    stays,
    update_spec,
    versions,
    wait_for,
    wait_observed,
    writes,
)
from tests.support.policies import example, explicit_classes_policy

pytestmark = pytest.mark.emulator

NAME = "qemu-rs"
CLASSES = ("s", "m", "l", "xl")
RC_NAMES = {f"kata-qemu-rs-{c}" for c in CLASSES}
# The node guidance ConfigMap exists even with no Kata nodes in the cluster (it says so).
# The values overlay, the drop-ins (with the admission parameters) and the node guidance.
CM_NAMES = {f"{NAME}-kata-deploy-values", f"{NAME}-dropins", f"{NAME}-node-guidance"}
# Generous functional bounds; how fast drift is put back is the bench's business.
DRIFT_TIMEOUT_S = 5


def rendered_for(emu, name: str = NAME):
    """What `kata-sizing render` gives for the live policy (its uid included); the emulator has
    no Nodes, so the guidance is for none."""
    return render_policy(parse_policy(policy(emu, name)), nodes=[])


def applied(cluster, body: dict, **expected: str) -> dict:
    """Create the policy, wait for its status, and let the operator go quiet."""
    cluster.create(body)
    name = body["metadata"]["name"]
    wait_observed(cluster.emu, name, **(expected or {"Ready": "True"}))
    settle(cluster.emu)
    return policy(cluster.emu, name)


def snapshot(emu) -> dict:
    """Every RuntimeClass and every ConfigMap, whole (resourceVersion included)."""
    return {"rc": runtime_classes(emu), "cm": config_maps(emu)}


def drift_corrected(emu, before: int) -> bool:
    return counter(emu, NAME, "driftCorrections") > before and bool(event_messages(emu, cond.EVENT_DRIFT_CORRECTED))


# --- 1. create ---------------------------------------------------------------------------


def test_create_makes_four_runtime_classes_three_configmaps_status_and_an_applied_event(cluster):
    emu = cluster.emu
    cluster.start()
    body = applied(cluster, example())
    uid = body["metadata"]["uid"]
    rendered = rendered_for(emu)

    live = runtime_classes(emu)
    assert set(live) == RC_NAMES
    for want in rendered.runtime_classes:
        name = want["metadata"]["name"]
        have = live[name]
        assert have["handler"] == name
        assert have["overhead"]["podFixed"] == want["overhead"]["podFixed"]
        assert have["scheduling"] == {"nodeSelector": {"katacontainers.io/kata-runtime": "true"}}
        assert have["metadata"]["labels"] == {
            MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: NAME, CLASS_LABEL: name.rsplit("-", 1)[1]}
        assert [(o["kind"], o["name"], o["uid"], o["controller"]) for o in have["metadata"]["ownerReferences"]] \
            == [("KataSizingPolicy", NAME, uid, True)]

    cms = config_maps(emu)
    assert set(cms) == CM_NAMES
    for want in rendered.configmaps:
        have = cms[want["metadata"]["name"]]
        assert have["metadata"]["namespace"] == OUTPUT_NAMESPACE
        assert have["data"] == want["data"]
        flux = {"reconcile.fluxcd.io/watch": "Enabled"} if want["metadata"]["name"].endswith("-values") else {}
        assert have["metadata"]["labels"] == {MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: NAME, **flux}
        assert [o["uid"] for o in have["metadata"]["ownerReferences"]] == [uid]
    # One drop-in per class, and the admission parameters the bindings name.
    assert set(cms[f"{NAME}-dropins"]["data"]) == {f"{c}.toml" for c in CLASSES} | set(
        podfit.params_data(size_policy(parse_policy(policy(emu, NAME)))))

    st = status(emu, NAME)
    assert st["observedGeneration"] == body["metadata"]["generation"] == 1
    assert (st["runtime"], st["classNames"]) == ("Rust", "s,m,l,xl")  # kubectl get ksp: MODE, CLASSES
    assert conditions(emu, NAME) == {"Ready": "True", "Valid": "True", "InSync": "True", "Conflict": "False"}
    for c in st["conditions"]:
        assert c["observedGeneration"] == 1 and c["lastTransitionTime"] and c["reason"]
    assert [(c["name"], c["runtimeClass"], c["podFixed"]) for c in st["classes"]] == [
        (c, f"kata-qemu-rs-{c}", live[f"kata-qemu-rs-{c}"]["overhead"]["podFixed"]) for c in CLASSES]

    [applied_event] = events(emu, cond.EVENT_APPLIED)
    assert applied_event["type"] == "Normal"
    assert applied_event["involvedObject"]["name"] == NAME and applied_event["involvedObject"]["uid"] == uid
    for name in RC_NAMES | CM_NAMES:
        assert name in applied_event["message"]
    assert not events(emu, type_="Warning")

    # Exactly the creates: no update, no delete, one status write per pass.
    assert sorted(named(writes(emu, RC_PATH))) == sorted(RC_NAMES)
    assert {r.method for r in writes(emu, RC_PATH) + writes(emu, CM_PATH)} == {"POST"}
    assert sorted(named(writes(emu, CM_PATH))) == sorted(CM_NAMES)


# --- 2. update one class --------------------------------------------------------------------


def test_changing_one_class_rewrites_only_that_runtime_class_and_the_configmaps(cluster):
    emu = cluster.emu
    cluster.start()
    applied(cluster, explicit_classes_policy())
    before = snapshot(emu)
    emu.reset_request_log()

    update_spec(emu, NAME, lambda spec: spec["classes"][1].update(memory="6Gi"))
    wait_observed(emu, NAME, Ready="True")
    settle(emu)

    rc_writes, cm_writes = writes(emu, RC_PATH), writes(emu, CM_PATH)
    assert describe_writes(rc_writes) == ["PUT /apis/node.k8s.io/v1/runtimeclasses/kata-qemu-rs-m -> 200"]
    # The values overlay and the drop-ins (with the admission parameters) name the class's sizes;
    # the guidance (no nodes) does not. The admission policies' CEL is not rewritten, nor any binding.
    changed_cms = {f"{NAME}-kata-deploy-values", f"{NAME}-dropins"}
    assert sorted(describe_writes(cm_writes)) == sorted(
        f"PUT /api/v1/namespaces/{OUTPUT_NAMESPACE}/configmaps/{n} -> 200" for n in changed_cms)
    assert describe_writes(writes(emu, re.compile("/apis/admissionregistration"))) == []
    assert len(writes(emu, STATUS_PATH)) == 1

    after = snapshot(emu)
    for name in RC_NAMES - {"kata-qemu-rs-m"}:
        assert after["rc"][name] == before["rc"][name]
    for name in CM_NAMES - changed_cms:
        assert after["cm"][name] == before["cm"][name]
    want = {o["metadata"]["name"]: o for o in rendered_for(emu).runtime_classes}
    assert pod_fixed(emu, "kata-qemu-rs-m") == want["kata-qemu-rs-m"]["overhead"]["podFixed"]
    assert pod_fixed(emu, "kata-qemu-rs-m") != before["rc"]["kata-qemu-rs-m"]["overhead"]["podFixed"]
    assert "6Gi" in after["cm"][f"{NAME}-dropins"]["data"]["m.toml"]
    assert status(emu, NAME)["observedGeneration"] == 2


# --- 3. add and remove a class --------------------------------------------------------------


def test_adding_and_removing_a_class_creates_and_deletes_its_runtime_class(cluster):
    emu = cluster.emu
    cluster.start()
    applied(cluster, explicit_classes_policy(classes=[
        {"name": "s", "cpu": "1", "memory": "1Gi"},
        {"name": "m", "cpu": "2", "memory": "4Gi"},
        {"name": "l", "cpu": "4", "memory": "16Gi"},
    ]))
    assert set(runtime_classes(emu)) == {"kata-qemu-rs-s", "kata-qemu-rs-m", "kata-qemu-rs-l"}
    before = versions(runtime_classes(emu))
    emu.reset_request_log()

    def drop_s_add_xl(spec):
        spec["classes"] = spec["classes"][1:] + [{"name": "xl", "cpu": "16", "memory": "64Gi"}]
    update_spec(emu, NAME, drop_s_add_xl)
    wait_observed(emu, NAME, Ready="True")
    settle(emu)

    after = runtime_classes(emu)
    assert set(after) == {"kata-qemu-rs-m", "kata-qemu-rs-l", "kata-qemu-rs-xl"}
    assert {n: v for n, v in versions(after).items() if n != "kata-qemu-rs-xl"} == {
        n: before[n] for n in ("kata-qemu-rs-m", "kata-qemu-rs-l")}
    assert sorted((r.method, n) for r, n in zip(writes(emu, RC_PATH), named(writes(emu, RC_PATH)))) == [
        ("DELETE", "kata-qemu-rs-s"), ("POST", "kata-qemu-rs-xl")]
    assert {k for k in config_maps(emu)[f"{NAME}-dropins"]["data"] if k.endswith(".toml")} == {
        "m.toml", "l.toml", "xl.toml"}
    assert [c["name"] for c in status(emu, NAME)["classes"]] == ["m", "l", "xl"]
    # The event is posted by kopf's poster, after the status write.
    message = wait_for(lambda: next((m for m in event_messages(emu, cond.EVENT_APPLIED)
                                     if "deleted RuntimeClass kata-qemu-rs-s" in m), None), DRIFT_TIMEOUT_S)
    assert "created RuntimeClass kata-qemu-rs-xl" in message


# --- 4. handler changes ----------------------------------------------------------------


def test_a_runtime_class_replaced_with_another_handler_is_recreated_and_never_sticks_on_422(cluster):
    """The handler is immutable: whoever changes it must delete and re-create; the operator does
    the same to put it back, and never sends a PUT the API server would refuse."""
    emu = cluster.emu
    cluster.start()
    applied(cluster, example())
    name = "kata-qemu-rs-m"
    theirs = copy.deepcopy(get_rc(emu, name))
    theirs["handler"] = "some-other-handler"
    for server_field in ("uid", "resourceVersion", "creationTimestamp", "generation"):
        theirs["metadata"].pop(server_field)
    emu.objects(RUNTIME_CLASSES).delete(name)
    emu.objects(RUNTIME_CLASSES).create(theirs)

    wait_for(lambda: (get_rc(emu, name) or {}).get("handler") == name, DRIFT_TIMEOUT_S,
             lambda: f"handler is {get_rc(emu, name)!r}")
    settle(emu)
    assert get_rc(emu, name)["handler"] == name
    assert not [r for r in emu.request_log if r.status == 422], "the operator sent a write the API refused"
    assert event_messages(emu, cond.EVENT_DRIFT_CORRECTED)

    # Not stuck: a later change of the policy is applied as usual.
    update_spec(emu, NAME, lambda spec: spec["overhead"].update(hostMemory="70Mi")
                if "overhead" in spec else spec.update(overhead={"hostMemory": "70Mi"}))
    wait_observed(emu, NAME, Ready="True")
    want = {o["metadata"]["name"]: o for o in rendered_for(emu).runtime_classes}
    wait_for(lambda: pod_fixed(emu, name) == want[name]["overhead"]["podFixed"])


# --- 5./6. drift is put back ----------------------------------------------------------------


def _rc_memory(obj):
    obj["overhead"]["podFixed"]["memory"] = "1Mi"


def _cm_data(obj):
    obj["data"]["m.toml"] = "# edited by hand\n"


def _drop_managed_by(obj):
    del obj["metadata"]["labels"][MANAGED_BY_LABEL]


def _drop_class_label(obj):
    del obj["metadata"]["labels"][CLASS_LABEL]


def _drop_policy_label(obj):
    del obj["metadata"]["labels"][POLICY_LABEL]


@pytest.mark.parametrize("resource, name, change", [
    (RUNTIME_CLASSES, "kata-qemu-rs-m", _rc_memory),
    (CONFIG_MAPS, f"{NAME}-dropins", _cm_data),
    (RUNTIME_CLASSES, "kata-qemu-rs-l", _drop_class_label),
    (RUNTIME_CLASSES, "kata-qemu-rs-s", _drop_managed_by),
    (CONFIG_MAPS, f"{NAME}-kata-deploy-values", _drop_managed_by),
    (CONFIG_MAPS, f"{NAME}-dropins", _drop_policy_label),
], ids=["rc-podFixed", "cm-data", "rc-class-label", "rc-managed-by-label", "cm-managed-by-label",
        "cm-policy-label"])
def test_a_hand_edit_is_put_back_with_an_event_and_a_count(cluster, resource, name, change):
    emu = cluster.emu
    cluster.start()
    applied(cluster, example())
    namespace = OUTPUT_NAMESPACE if resource == CONFIG_MAPS else None
    original = emu.objects(resource).get(name, namespace)
    emu.reset_request_log()

    edit(emu, resource, name, change, namespace)

    def restored():
        now = emu.objects(resource).get(name, namespace)
        return {k: now.get(k) for k in ("data", "overhead", "handler")} == \
            {k: original.get(k) for k in ("data", "overhead", "handler")} \
            and now["metadata"]["labels"] == original["metadata"]["labels"]
    wait_for(restored, DRIFT_TIMEOUT_S, lambda: repr(emu.objects(resource).get(name, namespace)))
    wait_for(lambda: counter(emu, NAME, "driftCorrections") == 1, DRIFT_TIMEOUT_S,
             lambda: repr(status(emu, NAME)))
    # The event is posted by kopf's poster, after the status write.
    [message] = wait_for(lambda: event_messages(emu, cond.EVENT_DRIFT_CORRECTED, "Normal"), DRIFT_TIMEOUT_S)
    assert name in message
    settle(emu)
    # One PUT put it back (the hand edit itself is not in the log: it bypassed HTTP).
    child_path = RC_PATH if resource == RUNTIME_CLASSES else CM_PATH
    written = [(r.method, r.status, n) for r, n in zip(writes(emu, child_path), named(writes(emu, child_path)))]
    if resource == CONFIG_MAPS and change is _drop_managed_by:
        # Without that label the ConfigMap left the operator's cache (selected by it): the pass
        # took the name as free, its create was refused (409), the re-read found it ours.
        assert written == [("POST", 409, name), ("PUT", 200, name)]
    else:
        assert written == [("PUT", 200, name)]
    assert conditions(emu, NAME)["InSync"] == "True"


# --- 7. Report mode --------------------------------------------------------------------------


def test_report_mode_reports_drift_without_correcting_it_until_switched_back(cluster):
    emu = cluster.emu
    cluster.start(resync_s=0.5)
    applied(cluster, example() | {"spec": {**example()["spec"], "driftPolicy": "Report"}})
    name = "kata-qemu-rs-m"
    original = pod_fixed(emu, name)

    edit(emu, RUNTIME_CLASSES, name, _rc_memory)

    wait_for(lambda: counter(emu, NAME, "driftDetected") == 1, DRIFT_TIMEOUT_S, lambda: repr(status(emu, NAME)))
    [warning] = wait_for(lambda: event_messages(emu, cond.EVENT_DRIFT_DETECTED, "Warning"), DRIFT_TIMEOUT_S)
    assert name in warning and "overhead.podFixed" in warning
    in_sync = wait_for(lambda: condition(emu, NAME, "InSync") if conditions(emu, NAME)["InSync"] == "False"
                       else None, DRIFT_TIMEOUT_S)
    assert in_sync["reason"] == cond.REASON_DRIFT_REPORTED and name in in_sync["message"]
    assert conditions(emu, NAME)["Ready"] == "False"
    # Several resyncs later: still not corrected, reported once, counted once, nothing written.
    settle(emu)
    emu.reset_request_log()
    stays(lambda: pod_fixed(emu, name)["memory"] == "1Mi", 1.2, "Report mode corrected a hand edit")
    assert emu.write_requests() == [], describe_writes(emu.write_requests())
    assert counter(emu, NAME, "driftCorrections") == 0
    assert counter(emu, NAME, "driftDetected") == 1
    assert len(event_messages(emu, cond.EVENT_DRIFT_DETECTED)) == 1

    update_spec(emu, NAME, lambda spec: spec.update(driftPolicy="Correct"))
    wait_for(lambda: pod_fixed(emu, name) == original, DRIFT_TIMEOUT_S)
    wait_observed(emu, NAME, Ready="True", InSync="True")


# --- 8. a RuntimeClass somebody else owns ---------------------------------------------------


def test_an_unmanaged_runtime_class_with_our_name_is_left_alone_and_reported(cluster, caplog):
    caplog.set_level(logging.DEBUG, logger="kata_sizing.reconcile")
    emu = cluster.emu
    theirs = emu.objects(RUNTIME_CLASSES).create({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": "kata-qemu-rs-m", "labels": {"team": "platform"}},
        "handler": "kata-qemu-rs-m", "overhead": {"podFixed": {"cpu": "1", "memory": "2Gi"}},
    })
    cluster.start(resync_s=0.5)
    cluster.create(example())

    wait_observed(emu, NAME, Conflict="True", Ready="False")
    wait_for(lambda: set(runtime_classes(emu)) == RC_NAMES)
    settle(emu)
    assert get_rc(emu, "kata-qemu-rs-m") == theirs
    conflict = condition(emu, NAME, "Conflict")
    assert conflict["reason"] == cond.REASON_CONFLICT and "kata-qemu-rs-m" in conflict["message"]
    assert condition(emu, NAME, "InSync")["status"] == "False"
    assert any("kata-qemu-rs-m" in m for m in event_messages(emu, cond.EVENT_CONFLICT, "Warning"))
    for other in RC_NAMES - {"kata-qemu-rs-m"}:
        assert get_rc(emu, other)["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
    assert not writes(emu, "/runtimeclasses/kata-qemu-rs-m")
    # Resyncs (every 0.5 s here) of a policy still in Conflict: no write, not even the event again.
    emu.reset_request_log()
    resyncs = passes(caplog, NAME, "resync")
    stays(lambda: not emu.write_requests(), 1.6, "a resync in Conflict wrote something")
    assert passes(caplog, NAME, "resync") >= resyncs + 2
    assert len(event_messages(emu, cond.EVENT_CONFLICT)) == 1, "the same conflict was announced again"

    # Their own edits of their object are theirs: not "corrected".
    edit(emu, RUNTIME_CLASSES, "kata-qemu-rs-m", lambda o: o["overhead"]["podFixed"].update(memory="3Gi"))
    theirs = get_rc(emu, "kata-qemu-rs-m")
    stays(lambda: get_rc(emu, "kata-qemu-rs-m") == theirs, 1.0, "the operator overwrote an unmanaged RuntimeClass")
    assert not writes(emu, "/runtimeclasses/kata-qemu-rs-m")

    emu.objects(RUNTIME_CLASSES).delete("kata-qemu-rs-m")
    wait_observed(emu, NAME, Conflict="False", Ready="True", InSync="True")
    ours = get_rc(emu, "kata-qemu-rs-m")
    assert ours["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
    assert ours["metadata"]["ownerReferences"][0]["uid"] == policy(emu, NAME)["metadata"]["uid"]


def test_a_second_policy_never_takes_the_runtime_classes_of_the_first(cluster):
    """Two policies that render the same RuntimeClass names: the first one's objects stay its
    own, even when edited by hand while the second one is in Conflict."""
    emu = cluster.emu
    cluster.start()
    first = applied(cluster, example())
    second = example()
    second["metadata"]["name"] = "copycat"
    second["spec"]["runtimeClass"]["namePrefix"] = "kata-qemu-rs"
    second["spec"]["output"] = {"namespace": "copycat"}
    cluster.create(second)
    wait_observed(emu, "copycat", Conflict="True", Ready="False")
    settle(emu)

    edit(emu, RUNTIME_CLASSES, "kata-qemu-rs-m", _rc_memory)
    wait_for(lambda: pod_fixed(emu, "kata-qemu-rs-m")["memory"] != "1Mi", DRIFT_TIMEOUT_S)
    settle(emu)
    for obj in runtime_classes(emu).values():
        assert obj["metadata"]["labels"][POLICY_LABEL] == NAME
        assert [o["uid"] for o in obj["metadata"]["ownerReferences"]] == [first["metadata"]["uid"]]
    assert conditions(emu, NAME)["Ready"] == "True"
    assert conditions(emu, "copycat")["Conflict"] == "True"


# --- 9. invalid policies ---------------------------------------------------------------------


def _bad_quantity(spec):
    spec["classes"][2]["memory"] = "16 gigs"


# A rule violation on a real API server: tests/api/test_real_operator.py (an invalid update keeps the
# last good objects). Here the admin-style write the schema would have caught.
@pytest.mark.parametrize("breaks, fixes, expected", [
    (_bad_quantity,
     lambda spec: spec["classes"][2].update(memory="16Gi"),
     ["spec.classes[2].memory", "16 gigs"]),
], ids=["bad-quantity"])
def test_an_invalid_update_leaves_the_last_valid_objects_exactly_as_they_were(cluster, breaks, fixes, expected):
    emu = cluster.emu
    cluster.start()
    applied(cluster, explicit_classes_policy())
    before = snapshot(emu)

    update_spec(emu, NAME, breaks)  # an admin-style write: no schema check in between
    wait_observed(emu, NAME, Valid="False", Ready="False")
    settle(emu)

    valid = condition(emu, NAME, "Valid")
    assert valid["reason"] == cond.REASON_INVALID and valid["observedGeneration"] == 2
    for fragment in expected:
        assert fragment in valid["message"], (fragment, valid["message"])
    assert condition(emu, NAME, "InSync")["reason"] == cond.REASON_NOT_APPLIED
    [warning] = wait_for(lambda: event_messages(emu, cond.EVENT_INVALID, "Warning"), DRIFT_TIMEOUT_S)
    for fragment in expected:
        assert fragment in warning
    assert snapshot(emu) == before
    # The last valid generation's classes stay reported.
    assert [c["name"] for c in status(emu, NAME)["classes"]] == list(CLASSES)

    update_spec(emu, NAME, fixes)
    wait_observed(emu, NAME, Valid="True", Ready="True", InSync="True")
    settle(emu)
    assert status(emu, NAME)["observedGeneration"] == 3
    want = {o["metadata"]["name"]: o for o in rendered_for(emu).runtime_classes}
    for name, obj in runtime_classes(emu).items():
        assert obj["overhead"]["podFixed"] == want[name]["overhead"]["podFixed"]
    assert len(event_messages(emu, cond.EVENT_INVALID)) == 1


def test_every_problem_of_an_invalid_policy_is_in_the_condition(cluster):
    emu = cluster.emu
    cluster.start()
    body = explicit_classes_policy()
    body["spec"]["classes"][0].update(overheadVcpus="0.5", overheadMemory="300Mi",
                                      podFixed={"cpu": "400m", "memory": "200Mi"})
    cluster.create(body)
    wait_observed(emu, NAME, Valid="False")
    message = condition(emu, NAME, "Valid")["message"]
    assert "podFixed.memory 200Mi must be above overhead_memory 300Mi" in message
    assert "podFixed.cpu 400m must be above overhead_vcpus 0.5" in message
    assert not runtime_classes(emu) and not config_maps(emu)


# --- 10. deleting the policy -----------------------------------------------------------------


def _deletion_setup(emu) -> dict:
    """Objects the deletion must leave alone: somebody else's with a name like ours, and ours of
    another policy."""
    return {
        ("cm", f"{NAME}-notes"): emu.objects(CONFIG_MAPS).create({
            "metadata": {"name": f"{NAME}-notes", "namespace": OUTPUT_NAMESPACE,
                         "labels": {MANAGED_BY_LABEL: "someone-else"}}, "data": {"a": "b"}}),
        ("rc", "kata-qemu-rs-m-gpu"): emu.objects(RUNTIME_CLASSES).create({
            "metadata": {"name": "kata-qemu-rs-m-gpu"}, "handler": "kata-qemu-rs-m-gpu"}),
        # Labelled like ours, for another policy: not this policy's to delete.
        ("cm", "other-dropins"): emu.objects(CONFIG_MAPS).create({
            "metadata": {"name": "other-dropins", "namespace": OUTPUT_NAMESPACE,
                         "labels": {MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: "other"}}, "data": {}}),
    }


def test_deleting_the_policy_leaves_its_objects_to_the_garbage_collector_and_nothing_else_goes(cluster, caplog):
    """No finalizer: the policy goes at once, and its objects follow through their ownerReferences
    (the emulator's garbage collector, as the real one: tests/api/test_real_operator.py). The operator
    writes nothing for it, re-creates nothing of it, and forgets it."""
    caplog.set_level(logging.INFO, logger="kata_sizing.worker")
    emu = cluster.emu
    others = _deletion_setup(emu)
    cluster.start()
    applied(cluster, example())
    assert RC_NAMES <= set(runtime_classes(emu))
    assert "finalizers" not in policy(emu, NAME)["metadata"]

    emu.reset_request_log()
    emu.objects(POLICIES).delete(NAME)
    assert policy(emu, NAME) is None  # at once: nothing holds it
    wait_for(lambda: any(r.getMessage().startswith(f"policy {NAME} deleted") for r in caplog.records),
             DRIFT_TIMEOUT_S, "the operator forgot the policy")
    settle(emu)
    assert set(runtime_classes(emu)) == {"kata-qemu-rs-m-gpu"}
    assert set(config_maps(emu)) == {f"{NAME}-notes", "other-dropins"}
    assert get_rc(emu, "kata-qemu-rs-m-gpu") == others["rc", "kata-qemu-rs-m-gpu"]
    assert get_cm(emu, f"{NAME}-notes") == others["cm", f"{NAME}-notes"]
    assert get_cm(emu, "other-dropins") == others["cm", "other-dropins"]
    assert [w for w in describe_writes(emu.write_requests()) if not EVENT_PATH.search(w.split()[1])] == [], \
        "the operator wrote for a deleted policy"


def test_without_a_garbage_collector_the_operator_deletes_nothing_of_a_deleted_policy(cluster_without_gc):
    """The contract, where no garbage collector runs: the operator leaves the objects of a deleted
    policy alone (it never deletes by label what the collector removes by owner)."""
    cluster = cluster_without_gc
    emu = cluster.emu
    cluster.start()
    applied(cluster, example())
    before = snapshot(emu)
    emu.reset_request_log()
    emu.objects(POLICIES).delete(NAME)
    settle(emu)
    assert snapshot(emu) == before
    assert [w for w in describe_writes(emu.write_requests()) if not EVENT_PATH.search(w.split()[1])] == []


def test_an_older_operators_finalizer_is_taken_off_by_the_first_pass(cluster):
    """Upgrade: a policy still carrying the finalizer and kopf's annotations of the operator
    before this one gets them removed by its first pass; one deleted while no operator ran
    (stuck on that finalizer) is released and goes."""
    emu = cluster.emu
    old = {"finalizers": ["katasizing.dev/cleanup", "example.com/theirs"],
           "annotations": {"katasizing.dev/last-handled-configuration": '{"spec": {}}', "team": "x"}}
    kept = example()
    kept["metadata"].update(copy.deepcopy(old))
    cluster.create(kept)
    stuck = example()
    stuck["metadata"].update(name="stuck", finalizers=["katasizing.dev/cleanup"])
    stuck["spec"]["runtimeClass"] = {**stuck["spec"]["runtimeClass"], "namePrefix": "kata-stuck"}
    cluster.create(stuck)
    emu.objects(POLICIES).delete("stuck")
    assert policy(emu, "stuck")["metadata"].get("deletionTimestamp")  # held by the old finalizer

    cluster.start()
    wait_observed(emu, NAME, Ready="True")
    meta = policy(emu, NAME)["metadata"]
    assert meta["finalizers"] == ["example.com/theirs"]  # somebody else's stays
    assert meta["annotations"] == {"team": "x"}
    wait_for(lambda: policy(emu, "stuck") is None, DRIFT_TIMEOUT_S, lambda: repr(policy(emu, "stuck")))
    assert not [n for n in runtime_classes(emu) if n.startswith("kata-stuck")], "a deleted policy was passed"


# --- 11. restarts ----------------------------------------------------------------------------


def test_a_restarted_operator_resumes_without_writing_and_still_corrects_drift(cluster, caplog):
    caplog.set_level(logging.DEBUG, logger="kata_sizing.reconcile")
    emu = cluster.emu
    cluster.start()
    applied(cluster, example())
    before = snapshot(emu)
    before_policy = policy(emu, NAME)
    cluster.stop()
    emu.reset_request_log()

    caplog.clear()
    cluster.start()
    # The first pass reads the children from the caches; wait for it, then for quiet.
    wait_for(lambda: passes(caplog, NAME, "resync"), DRIFT_TIMEOUT_S)
    settle(emu, quiet_s=0.6)
    # Nothing at all: no child, no status, no event, and no kopf bookkeeping on the policy.
    assert emu.write_requests() == [], describe_writes(emu.write_requests())
    assert snapshot(emu) == before
    assert policy(emu, NAME)["status"] == before_policy["status"]

    edit(emu, RUNTIME_CLASSES, "kata-qemu-rs-m", _rc_memory)
    wait_for(lambda: pod_fixed(emu, "kata-qemu-rs-m") == before["rc"]["kata-qemu-rs-m"]["overhead"]["podFixed"],
             DRIFT_TIMEOUT_S)
    wait_for(lambda: counter(emu, NAME, "driftCorrections") == 1, DRIFT_TIMEOUT_S)


def test_a_change_made_while_the_operator_was_down_is_applied_on_start(cluster):
    emu = cluster.emu
    cluster.start()
    applied(cluster, explicit_classes_policy())
    cluster.stop()
    update_spec(emu, NAME, lambda spec: spec["classes"][1].update(memory="6Gi"))
    emu.reset_request_log()

    cluster.start()
    wait_observed(emu, NAME, Ready="True")
    settle(emu)
    assert status(emu, NAME)["observedGeneration"] == 2
    want = {o["metadata"]["name"]: o for o in rendered_for(emu).runtime_classes}
    assert pod_fixed(emu, "kata-qemu-rs-m") == want["kata-qemu-rs-m"]["overhead"]["podFixed"]
    # A drift event that raced the pass may try once more with a stale resourceVersion (409);
    # it must then see that the object is right and neither write nor claim a correction.
    assert [w for w in describe_writes(writes(emu, RC_PATH)) if not w.endswith("409")] == [
        "PUT /apis/node.k8s.io/v1/runtimeclasses/kata-qemu-rs-m -> 200"]
    assert not event_messages(emu, cond.EVENT_DRIFT_CORRECTED)
    assert counter(emu, NAME, "driftCorrections") == 0


# --- 12. periodic resync ---------------------------------------------------------------------


def test_the_periodic_resync_of_an_unchanged_policy_writes_nothing(cluster, caplog):
    caplog.set_level(logging.DEBUG, logger="kata_sizing.reconcile")
    emu = cluster.emu
    cluster.start(resync_s=0.3)
    applied(cluster, example())
    settle(emu, quiet_s=0.7)
    emu.reset_request_log()

    resyncs = passes(caplog, NAME, "resync")
    wait_for(lambda: passes(caplog, NAME, "resync") >= resyncs + 4, DRIFT_TIMEOUT_S,
             "the resync did not come four times")
    assert emu.write_requests() == [], describe_writes(emu.write_requests())
    # Read from the watch-fed caches: a resync costs no request at all.
    assert emu.requests(include_watches=False) == [], describe_writes(emu.requests(include_watches=False))


# --- 13. managedBy: KataDeploy ---------------------------------------------------------------


def kata_deploy_policy() -> dict:
    body = example()
    body["spec"]["runtimeClass"]["managedBy"] = "KataDeploy"
    return body


def chart_runtime_classes(emu) -> list[dict]:
    """The RuntimeClasses as the kata-deploy chart creates them: from the values overlay's strings."""
    import yaml

    values = yaml.safe_load(get_cm(emu, f"{NAME}-kata-deploy-values")["data"]["values.yaml"])
    runtimes = values["customRuntimes"]["runtimes"]
    items = runtimes.values() if isinstance(runtimes, dict) else runtimes
    return [yaml.safe_load(r["runtimeClass"]) for r in items]


def test_kata_deploy_mode_guards_the_charts_runtime_classes_but_never_creates_or_deletes_them(cluster):
    emu = cluster.emu
    cluster.start(resync_s=0.5)
    cluster.create(kata_deploy_policy())

    wait_observed(emu, NAME, InSync="False", Valid="True")
    in_sync = condition(emu, NAME, "InSync")
    assert in_sync["reason"] == cond.REASON_RUNTIME_CLASS_MISSING
    for name in RC_NAMES:
        assert name in in_sync["message"]
    assert set(config_maps(emu)) == CM_NAMES
    assert runtime_classes(emu) == {}
    settle(emu)
    emu.reset_request_log()
    stays(lambda: not emu.write_requests(), 1.2, "a resync waiting for the chart wrote something")

    created = chart_runtime_classes(emu)
    assert {o["metadata"]["name"] for o in created} == RC_NAMES
    for obj in created:
        assert "ownerReferences" not in obj["metadata"]
        emu.objects(RUNTIME_CLASSES).create(obj)
    wait_observed(emu, NAME, InSync="True", Ready="True")
    settle(emu)
    # The chart's objects as the chart made them: the policy does not adopt them.
    assert sorted(runtime_classes(emu).values(), key=lambda o: o["metadata"]["name"]) == sorted(
        (emu.objects(RUNTIME_CLASSES).get(o["metadata"]["name"]) for o in created),
        key=lambda o: o["metadata"]["name"])
    assert all("ownerReferences" not in o["metadata"] for o in runtime_classes(emu).values())
    assert not writes(emu, RC_PATH)
    assert not event_messages(emu, cond.EVENT_DRIFT_CORRECTED)

    name = "kata-qemu-rs-m"
    original = pod_fixed(emu, name)
    edit(emu, RUNTIME_CLASSES, name, _rc_memory)
    wait_for(lambda: pod_fixed(emu, name) == original, DRIFT_TIMEOUT_S)
    [corrected] = wait_for(lambda: event_messages(emu, cond.EVENT_DRIFT_CORRECTED), DRIFT_TIMEOUT_S)
    assert name in corrected
    assert "ownerReferences" not in get_rc(emu, name)["metadata"]

    emu.objects(POLICIES).delete(NAME)
    wait_for(lambda: policy(emu, NAME) is None, DRIFT_TIMEOUT_S)
    assert set(runtime_classes(emu)) == RC_NAMES
    assert config_maps(emu) == {}
    assert not [r for r in emu.write_requests(RC_PATH) if r.method in ("POST", "DELETE")]


# --- 14. logs an administrator can read ------------------------------------------------------


def operators(record: logging.LogRecord) -> bool:
    """A line of the operator's own log (not the emulator's access log, which another test's
    logging set-up may let through to the capture)."""
    return record.name.split(".")[0] in ("kata_sizing", "kopf")


def test_at_info_the_operator_says_what_it_changed_and_nothing_per_policy_per_tick(cluster, caplog, monkeypatch):
    """Three policies, the guidance check every 0.2 s and the resync every 0.3 s: while nothing
    changes, no line at INFO (kopf used to log "Timer 'guidance' succeeded" for every policy at
    every tick); a hand edit is one INFO line naming what was written and why."""
    from kata_sizing.controller import worker

    monkeypatch.setattr(worker, "GUIDANCE_INTERVAL_S", 0.2)
    caplog.set_level(logging.INFO, logger="kopf")
    caplog.set_level(logging.DEBUG, logger="kata_sizing")  # last: it sets the capture's level too
    emu = cluster.emu
    cluster.start(resync_s=0.3)
    for name, prefix in (("a", "kata-a"), ("b", "kata-b"), (NAME, "kata-qemu-rs")):
        body = example()
        body["metadata"]["name"] = name
        body["spec"]["runtimeClass"] = {**body["spec"]["runtimeClass"], "namePrefix": prefix}
        body["spec"]["output"] = {"namespace": OUTPUT_NAMESPACE}
        applied(cluster, body)
    # The node guidance's inputs move as well: a node comes, the check passes each policy once.
    emu.objects("nodes").create({"metadata": {"name": "n1", "labels": {"katacontainers.io/kata-runtime": "true"}},
                                 "status": {"capacity": {"memory": "64Gi", "cpu": "16"},
                                            "allocatable": {"memory": "60Gi", "cpu": "15"}}})
    wait_for(lambda: "n1" in str(get_cm(emu, f"{NAME}-node-guidance")["data"]), DRIFT_TIMEOUT_S)
    settle(emu)
    caplog.clear()
    stays(lambda: True, 1.2)  # six guidance ticks and four resyncs of three policies in sync
    said = [f"{r.name}: {r.getMessage()}" for r in caplog.records if operators(r) and r.levelno >= logging.INFO]
    assert said == [], said
    skipped = [r for r in caplog.records if r.name == "kata_sizing.reconcile" and r.trigger == "resync"]
    assert len({r.policy for r in skipped}) == 3 and all(r.levelno == logging.DEBUG for r in skipped)

    edit(emu, RUNTIME_CLASSES, "kata-qemu-rs-m", _rc_memory)
    wait_for(lambda: counter(emu, NAME, "driftCorrections") == 1, DRIFT_TIMEOUT_S)
    settle(emu)
    said = [r.getMessage() for r in caplog.records if operators(r) and r.levelno >= logging.INFO]
    assert len(said) == 1, said
    assert said[0].startswith(f"reconciled {NAME}: trigger=drift result=ok writes=1 duration=")
    assert said[0].endswith("(updated RuntimeClass kata-qemu-rs-m; status written)")
