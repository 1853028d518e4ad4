"""A policy's life with the operator, judged by what a user would see: the objects in the cluster,
the policy's status conditions, the Events, and the writes the operator made to get there (the
emulator's request log, or the real API server's audit log of the operator's identity). Each
scenario runs on both API tiers (tests/support/tiers.py) unless it says why not: the emulator
alone runs without a garbage collector or lets a write through that the CRD's schema refuses; the
real API server alone decides the CRD's schema, CEL rules and printer columns, namespaces, and
calls a registered admission webhook."""

from __future__ import annotations

import copy
import time

import pytest
import yaml

from kata_sizing.controller import conditions as cond
from kata_sizing.core import podfit
from kata_sizing.core.model import parse_policy
from kata_sizing.core.render import CLASS_LABEL, MANAGED_BY, MANAGED_BY_LABEL, POLICY_LABEL, render_policy
from kata_sizing.core.sizing import size_policy
from tests.support.policies import example, explicit_classes_policy
from tests.support.realcluster import free_port
from tests.support.tiers import (
    CONFIG_MAPS,
    NODES,
    OUTPUT_NAMESPACE,
    POLICIES,
    RUNTIME_CLASSES,
    ApiError,
    Kube,
)
from tests.support.webhook import invalid_body, registered_as_the_overlay, write_self_signed_cert

NAME = "qemu-rs"
CLASSES = ("s", "m", "l", "xl")
RC_NAMES = {f"kata-qemu-rs-{c}" for c in CLASSES}
# The values overlay, the drop-ins (with the admission parameters) and the node guidance, which
# exists with no Kata node in the cluster too (it says so).
CM_NAMES = {f"{NAME}-kata-deploy-values", f"{NAME}-dropins", f"{NAME}-node-guidance"}
# The ConfigMap every namespace of a real cluster holds (its controller publishes the cluster's CA).
NOT_OURS = {"kube-root-ca.crt"}


def runtime_classes(kube: Kube) -> dict[str, dict]:
    return kube.objects(RUNTIME_CLASSES)


def config_maps(kube: Kube) -> dict[str, dict]:
    return {n: o for n, o in kube.objects(CONFIG_MAPS, OUTPUT_NAMESPACE).items() if n not in NOT_OURS}


def pod_fixed(kube: Kube, name: str) -> dict | None:
    return ((kube.get(RUNTIME_CLASSES, name) or {}).get("overhead") or {}).get("podFixed")


def versions(objects: dict[str, dict]) -> dict[str, str]:
    return {name: o["metadata"]["resourceVersion"] for name, o in objects.items()}


def snapshot(kube: Kube) -> dict:
    """Every RuntimeClass and every ConfigMap of the output namespace, whole (resourceVersion too)."""
    return {"rc": runtime_classes(kube), "cm": config_maps(kube)}


def rendered_for(kube: Kube, name: str = NAME):
    """What `kata-sizing render` gives for the live policy (its uid included): the guidance for no
    node, as neither tier has one."""
    body = kube.policy(name)
    assert body is not None
    return render_policy(parse_policy(body), nodes=[])


def named_writes(kube: Kube, since: int, kind) -> list[tuple[str, int, str]]:
    return [(w.verb, w.code, w.name) for w in kube.writes(since, kind)]


def _rc_memory(obj: dict) -> None:
    obj["overhead"]["podFixed"]["memory"] = "1Mi"


# --- create ----------------------------------------------------------------------------------


def test_create_makes_four_runtime_classes_three_configmaps_status_and_an_applied_event(kube):
    kube.start()
    mark = kube.mark()
    body = kube.applied(example())
    uid = body["metadata"]["uid"]
    rendered = rendered_for(kube)

    live = runtime_classes(kube)
    assert set(live) == RC_NAMES
    for want in rendered.runtime_classes:
        name = want["metadata"]["name"]
        have = live[name]
        assert have["handler"] == want["handler"] == name
        assert have["overhead"] == want["overhead"]
        assert have["scheduling"] == want["scheduling"] == {"nodeSelector": {"katacontainers.io/kata-runtime": "true"}}
        assert have["metadata"]["labels"] == want["metadata"]["labels"] == {
            MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: NAME, CLASS_LABEL: name.rsplit("-", 1)[1]}
        assert [(o["kind"], o["name"], o["uid"], o["controller"]) for o in have["metadata"]["ownerReferences"]] \
            == [("KataSizingPolicy", NAME, uid, True)]

    cms = config_maps(kube)
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
        podfit.params_data(size_policy(parse_policy(body))))

    st = kube.status(NAME)
    assert st["observedGeneration"] == body["metadata"]["generation"] == 1
    assert (st["runtime"], st["classNames"]) == ("Rust", "s,m,l,xl")  # kubectl get ksp: MODE, CLASSES
    assert kube.conditions(NAME) == {"Ready": "True", "Valid": "True", "InSync": "True", "Conflict": "False"}
    for c in st["conditions"]:
        assert c["observedGeneration"] == 1 and c["lastTransitionTime"] and c["reason"]
    assert [(c["name"], c["runtimeClass"], c["podFixed"]) for c in st["classes"]] == [
        (c, f"kata-qemu-rs-{c}", live[f"kata-qemu-rs-{c}"]["overhead"]["podFixed"]) for c in CLASSES]

    [applied] = kube.wait_for(lambda: kube.events(cond.EVENT_APPLIED))
    assert applied["type"] == "Normal"
    assert applied["involvedObject"]["name"] == NAME and applied["involvedObject"]["uid"] == uid
    for name in RC_NAMES | CM_NAMES:
        assert name in applied["message"]
    assert not kube.events(type_="Warning")

    # Exactly the creates: no update, no delete.
    assert sorted(named_writes(kube, mark, RUNTIME_CLASSES)) == sorted(("create", 201, n) for n in RC_NAMES)
    assert sorted(named_writes(kube, mark, CONFIG_MAPS)) == sorted(("create", 201, n) for n in CM_NAMES)


@pytest.mark.tiers("realserver", reason="printer columns are the API server's (the CRD's additionalPrinterColumns)")
def test_kubectl_get_ksp_shows_the_printer_columns(kube):
    kube.start()
    kube.applied(explicit_classes_policy("columns"))
    assert kube.cp is not None
    out = kube.cp.kubectl("get", "ksp", "columns").stdout.splitlines()
    header = out[0].split()
    row = dict(zip(header, out[1].split()))
    assert header[:5] == ["NAME", "SHIM", "MODE", "CLASSES", "READY"], out
    assert row["SHIM"] == "qemu-runtime-rs" and row["MODE"] == "Rust" and row["READY"] == "True", out
    assert row["CLASSES"].split(",") == list(CLASSES), out


@pytest.mark.tiers("realserver", reason="the CRD's schema, enums and CEL rules are the API server's; the "
                                        "emulator stores what it is given")
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
def test_the_api_server_refuses_a_malformed_policy_naming_the_field(kube, change, field, words):
    body = explicit_classes_policy("malformed")
    body["spec"].setdefault("overhead", {"guestMemoryRatio": "0.14"})
    body["spec"].setdefault("runtimeClass", {})
    change(body["spec"])
    assert kube.cp is not None
    result = kube.cp.apply(body, check=False)  # kubectl, with its server-side field validation
    assert result.returncode != 0, f"the server accepted it: {result.stdout}"
    assert field in result.stderr and words in result.stderr, result.stderr
    assert kube.policy("malformed") is None


@pytest.mark.tiers("realserver", reason="namespaces exist on the real API server only; the emulator stores a "
                                        "ConfigMap in any namespace")
def test_an_output_namespace_that_does_not_exist_yet_is_said_in_status_and_backed_off(kube):
    """spec.output.namespace missing: the status says so with the server's message, the other
    objects are written, each ConfigMap is tried once a pass with the passes backing off (not
    five tries 55 ms apart), the log line of that pass counts the writes that landed, and once the
    namespace exists the ConfigMaps follow."""
    cp = kube.cp
    assert cp is not None
    kube.start()
    mark = kube.mark()
    kube.create(POLICIES, explicit_classes_policy("early", output={"namespace": "not-yet"}))
    kube.wait_observed("early", InSync="False")
    in_sync = kube.condition("early", "InSync")
    assert in_sync["reason"] == cond.REASON_OUTPUT_NAMESPACE_MISSING, in_sync
    assert 'namespaces "not-yet" not found' in in_sync["message"]
    assert len(kube.objects(RUNTIME_CLASSES, labels="katasizing.dev/policy=early")) == len(CLASSES)
    time.sleep(6)
    creates = [w for w in kube.writes(mark, CONFIG_MAPS) if w.verb == "create"]
    # Four ConfigMaps (the admission parameters too); passes after 0.2, 0.4, 0.8, 1.6, 3.2 s
    # (capped exponential, with jitter).
    assert 4 <= len(creates) <= 4 * 7, creates
    assert "still conflicting" not in kube.log()
    first = next(e for e in kube.reconciles() if e["policy"] == "early" and e["trigger"] == "apply")
    landed = [w for w in kube.writes(mark) if w.verb == "create" and w.code == 201
              and w.resource in ("runtimeclasses", "validatingadmissionpolicies", "validatingadmissionpolicybindings",
                                 "mutatingadmissionpolicies", "mutatingadmissionpolicybindings")]
    # The RuntimeClasses, and the shared admission policies unless an earlier test left them; no
    # binding, whose parameters could not be written (it would deny every pod of the classes).
    assert not [w for w in landed if w.resource.endswith("bindings")], landed
    assert first["result"] == "error" and first["writes"] == len(landed) in (len(CLASSES), len(CLASSES) + 3), first

    cp.kubectl("create", "namespace", "not-yet")
    try:
        kube.wait_observed("early", timeout=40, Ready="True")
        assert set(kube.objects(CONFIG_MAPS, "not-yet", "katasizing.dev/policy=early")) == {
            "early-kata-deploy-values", "early-dropins", "early-node-guidance"}
        assert len(cp.items("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
                            "katasizing.dev/policy=early")) == 2
    finally:
        cp.kubectl("delete", "namespace", "not-yet", "--wait=false")


# --- changes ---------------------------------------------------------------------------------


def test_changing_one_class_rewrites_only_that_runtime_class_and_the_configmaps(kube):
    kube.start()
    kube.applied(explicit_classes_policy())
    before = snapshot(kube)
    mark = kube.mark()

    kube.update_spec(NAME, lambda spec: spec["classes"][1].update(memory="6Gi"))
    kube.wait_observed(NAME, Ready="True")
    kube.settle()

    assert named_writes(kube, mark, RUNTIME_CLASSES) == [("update", 200, "kata-qemu-rs-m")]
    # The values overlay and the drop-ins (with the admission parameters) name the class's sizes;
    # the guidance (no nodes) does not. The admission policies' CEL is not rewritten, nor any binding.
    changed_cms = {f"{NAME}-kata-deploy-values", f"{NAME}-dropins"}
    assert sorted(named_writes(kube, mark, CONFIG_MAPS)) == sorted(("update", 200, n) for n in changed_cms)
    assert [w for w in kube.writes(mark) if w.resource.endswith(("admissionpolicies", "admissionpolicybindings"))] == []
    assert len([w for w in kube.writes(mark, POLICIES) if w.resource.endswith("/status")]) == 1

    after = snapshot(kube)
    for name in RC_NAMES - {"kata-qemu-rs-m"}:
        assert after["rc"][name] == before["rc"][name]
    for name in CM_NAMES - changed_cms:
        assert after["cm"][name] == before["cm"][name]
    want = {o["metadata"]["name"]: o for o in rendered_for(kube).runtime_classes}
    assert pod_fixed(kube, "kata-qemu-rs-m") == want["kata-qemu-rs-m"]["overhead"]["podFixed"]
    assert pod_fixed(kube, "kata-qemu-rs-m") != before["rc"]["kata-qemu-rs-m"]["overhead"]["podFixed"]
    assert "6Gi" in after["cm"][f"{NAME}-dropins"]["data"]["m.toml"]
    assert kube.status(NAME)["observedGeneration"] == 2


def test_adding_and_removing_a_class_creates_and_deletes_its_runtime_class(kube):
    kube.start()
    kube.applied(explicit_classes_policy(classes=[
        {"name": "s", "cpu": "1", "memory": "1Gi"},
        {"name": "m", "cpu": "2", "memory": "4Gi"},
        {"name": "l", "cpu": "4", "memory": "16Gi"},
    ]))
    assert set(runtime_classes(kube)) == {"kata-qemu-rs-s", "kata-qemu-rs-m", "kata-qemu-rs-l"}
    before = versions(runtime_classes(kube))
    mark = kube.mark()

    def drop_s_add_xl(spec):
        spec["classes"] = spec["classes"][1:] + [{"name": "xl", "cpu": "16", "memory": "64Gi"}]
    kube.update_spec(NAME, drop_s_add_xl)
    kube.wait_observed(NAME, Ready="True")
    kube.settle()

    after = runtime_classes(kube)
    assert set(after) == {"kata-qemu-rs-m", "kata-qemu-rs-l", "kata-qemu-rs-xl"}
    assert {n: v for n, v in versions(after).items() if n != "kata-qemu-rs-xl"} == {
        n: before[n] for n in ("kata-qemu-rs-m", "kata-qemu-rs-l")}
    assert sorted((verb, name) for verb, _, name in named_writes(kube, mark, RUNTIME_CLASSES)) == [
        ("create", "kata-qemu-rs-xl"), ("delete", "kata-qemu-rs-s")]
    assert {k for k in config_maps(kube)[f"{NAME}-dropins"]["data"] if k.endswith(".toml")} == {
        "m.toml", "l.toml", "xl.toml"}
    assert [c["name"] for c in kube.status(NAME)["classes"]] == ["m", "l", "xl"]
    # The event is posted by kopf's poster, after the status write.
    message = kube.wait_for(lambda: next((m for m in kube.event_messages(cond.EVENT_APPLIED)
                                          if "deleted RuntimeClass kata-qemu-rs-s" in m), None))
    assert "created RuntimeClass kata-qemu-rs-xl" in message


def test_a_new_name_prefix_makes_the_new_runtime_classes_and_deletes_the_old_ones(kube):
    kube.start()
    kube.applied(explicit_classes_policy())
    kube.update_spec(NAME, lambda spec: spec["runtimeClass"].update(namePrefix="kata-renamed"))
    kube.wait_observed(NAME, Ready="True")
    kube.wait_for(lambda: sorted(runtime_classes(kube)) == sorted(f"kata-renamed-{c}" for c in CLASSES),
                  message=lambda: f"RuntimeClasses: {sorted(runtime_classes(kube))}")
    assert [c["runtimeClass"] for c in kube.status(NAME)["classes"]] == [f"kata-renamed-{c}" for c in CLASSES]
    want = {o["metadata"]["name"]: o["overhead"] for o in rendered_for(kube).runtime_classes}
    assert {n: o["overhead"] for n, o in runtime_classes(kube).items()} == want


@pytest.mark.parametrize("operator", ["running", "stopped"])
def test_a_runtime_class_replaced_with_another_handler_is_recreated_and_never_sticks_on_422(kube, operator):
    """The handler is immutable (the server refuses the update with 422): whoever changes it must
    delete and re-create, while the operator runs or while it is stopped; the operator does the
    same to put it back, and never sends an update the server would refuse."""
    kube.start()
    kube.applied(example())
    mark = kube.mark()
    name = "kata-qemu-rs-m"
    theirs = copy.deepcopy(kube.get(RUNTIME_CLASSES, name))
    assert theirs is not None
    theirs["handler"] = "some-other-handler"
    with pytest.raises(ApiError) as refused:
        kube.replace(RUNTIME_CLASSES, theirs)
    assert refused.value.status == 422 and "immutable" in refused.value.message

    if operator == "stopped":
        kube.stop()
    for server_field in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"):
        theirs["metadata"].pop(server_field, None)
    # A running operator may put its own back between the delete and the create (the create then
    # finds the name taken): delete and create again until theirs is in.
    for _ in range(20):
        kube.delete(RUNTIME_CLASSES, name)
        try:
            kube.create(RUNTIME_CLASSES, theirs)
            break
        except ApiError as err:
            if err.status != 409 or operator == "stopped":
                raise
    else:
        pytest.fail(f"the operator put {name} back before every one of 20 creates")
    if operator == "stopped":
        kube.start()

    kube.wait_for(lambda: (kube.get(RUNTIME_CLASSES, name) or {}).get("handler") == name,
                  message=lambda: f"handler is {kube.get(RUNTIME_CLASSES, name)!r}")
    kube.settle()
    assert not [w for w in kube.writes(mark) if w.code == 422], "the operator sent a write the API refused"
    # Deleted once. A second delete may be tried by the drift pass with the old object's uid as a
    # precondition: the server answers 409 and nothing is lost.
    deleted = [w.code for w in kube.writes(mark, RUNTIME_CLASSES, name) if w.verb == "delete"]
    assert [c for c in deleted if c < 300] == [200] and all(c == 409 for c in deleted if c >= 300), deleted
    if operator == "running":
        assert kube.event_messages(cond.EVENT_DRIFT_CORRECTED)

    # Not stuck: a later change of the policy is applied as usual.
    kube.update_spec(NAME, lambda spec: spec.setdefault("overhead", {}).update(hostMemory="70Mi"))
    kube.wait_observed(NAME, Ready="True")
    want = {o["metadata"]["name"]: o for o in rendered_for(kube).runtime_classes}
    kube.wait_for(lambda: pod_fixed(kube, name) == want[name]["overhead"]["podFixed"])


# --- drift is put back ------------------------------------------------------------------------


def _cm_data(obj: dict) -> None:
    obj["data"]["m.toml"] = "# edited by hand\n"


def _drop_managed_by(obj: dict) -> None:
    del obj["metadata"]["labels"][MANAGED_BY_LABEL]


def _drop_class_label(obj: dict) -> None:
    del obj["metadata"]["labels"][CLASS_LABEL]


def _drop_policy_label(obj: dict) -> None:
    del obj["metadata"]["labels"][POLICY_LABEL]


@pytest.mark.parametrize("kind, name, change", [
    (RUNTIME_CLASSES, "kata-qemu-rs-m", _rc_memory),
    (CONFIG_MAPS, f"{NAME}-dropins", _cm_data),
    (RUNTIME_CLASSES, "kata-qemu-rs-l", _drop_class_label),
    (RUNTIME_CLASSES, "kata-qemu-rs-s", _drop_managed_by),
    (CONFIG_MAPS, f"{NAME}-kata-deploy-values", _drop_managed_by),
    (CONFIG_MAPS, f"{NAME}-dropins", _drop_policy_label),
], ids=["rc-podFixed", "cm-data", "rc-class-label", "rc-managed-by-label", "cm-managed-by-label",
        "cm-policy-label"])
def test_a_hand_edit_is_put_back_with_an_event_and_a_count(kube, kind, name, change):
    kube.start()
    kube.applied(example())
    original = kube.get(kind, name)
    assert original is not None
    mark = kube.mark()

    kube.edit(kind, name, change)

    def restored() -> bool:
        now = kube.get(kind, name) or {}
        return {k: now.get(k) for k in ("data", "overhead", "handler")} == \
            {k: original.get(k) for k in ("data", "overhead", "handler")} \
            and now["metadata"]["labels"] == original["metadata"]["labels"]
    kube.wait_for(restored, message=lambda: repr(kube.get(kind, name)))
    kube.wait_for(lambda: kube.counter(NAME, "driftCorrections") == 1, message=lambda: repr(kube.status(NAME)))
    # The event is posted by kopf's poster, after the status write.
    [message] = kube.wait_for(lambda: kube.event_messages(cond.EVENT_DRIFT_CORRECTED, "Normal"))
    assert name in message
    kube.settle()
    # One update put it back (the hand edit is not the operator's: neither log counts it).
    written = named_writes(kube, mark, kind)
    if kind == CONFIG_MAPS and change is _drop_managed_by:
        # Without that label the ConfigMap left the operator's cache (selected by it): the pass
        # took the name as free, its create was refused (409), the re-read found it ours.
        assert written == [("create", 409, name), ("update", 200, name)]
    else:
        assert written == [("update", 200, name)]
    assert kube.conditions(NAME)["InSync"] == "True"


def test_drift_of_every_managed_field_and_deletion_of_every_object_is_put_back_and_counted(kube):
    kube.start()
    kube.applied(explicit_classes_policy())
    rcs, cms = runtime_classes(kube), config_maps(kube)
    first_rc = sorted(rcs)[0]
    good = copy.deepcopy(rcs[first_rc])

    edits = {
        "podFixed.cpu": lambda o: o["overhead"]["podFixed"].update(cpu="1m"),
        "podFixed.memory": lambda o: o["overhead"]["podFixed"].update(memory="1Mi"),
        "nodeSelector": lambda o: o.setdefault("scheduling", {}).update(nodeSelector={"other": "node"}),
        "tolerations": lambda o: o.setdefault("scheduling", {}).update(
            tolerations=[{"key": "x", "operator": "Exists", "effect": "NoSchedule"}]),
        "class label": lambda o: o["metadata"]["labels"].update({CLASS_LABEL: "zz"}),
    }
    for what, change in edits.items():
        kube.edit(RUNTIME_CLASSES, first_rc, change)
        kube.wait_for(lambda: (lambda o: o["overhead"] == good["overhead"]
                               and o.get("scheduling") == good.get("scheduling")
                               and o["metadata"]["labels"] == good["metadata"]["labels"])(
                                   kube.get(RUNTIME_CLASSES, first_rc)), message=f"{what} restored")

    for name, cm in cms.items():
        key = sorted(cm["data"])[0]
        kube.edit(CONFIG_MAPS, name, lambda o, key=key: o["data"].update({key: "edited by hand"}))
        kube.wait_for(lambda name=name, key=key: (kube.get(CONFIG_MAPS, name) or {})["data"][key] != "edited by hand",
                      message=f"{name} data restored")
        assert kube.read(CONFIG_MAPS, name)["data"] == cm["data"], name

    for kind, names in ((RUNTIME_CLASSES, rcs), (CONFIG_MAPS, cms)):
        for name in names:
            kube.delete(kind, name)
            kube.wait_for(lambda kind=kind, name=name: kube.get(kind, name), message=f"{name} re-created")
    # Every edit and deletion is counted once, whichever pass put it back: a drift event's, or
    # the guidance check's, which may reach the guidance ConfigMap first.
    expected = len(edits) + len(rcs) + 2 * len(cms)
    kube.wait_for(lambda: kube.counter(NAME, "driftCorrections") == expected,
                  message=lambda: f"driftCorrections {kube.counter(NAME, 'driftCorrections')}, expected {expected}")
    kube.settle()
    assert kube.counter(NAME, "driftCorrections") == expected


def test_ten_hand_edits_put_back_read_ten(kube):
    """status.driftCorrections is exact with passes running concurrently (the guidance check
    every second, a drift pass per edit): ten edits put back read ten, and stay ten."""
    kube.start(guidance_s=1)
    kube.applied(explicit_classes_policy())
    names = sorted(runtime_classes(kube))
    good = {name: pod_fixed(kube, name) for name in names}
    for i in range(10):
        name = names[i % len(names)]
        kube.edit(RUNTIME_CLASSES, name, lambda o, i=i: o["overhead"]["podFixed"].update(memory=f"{i + 1}Mi"))
        kube.wait_for(lambda name=name: pod_fixed(kube, name) == good[name], message=f"edit {i + 1} put back")
    kube.wait_for(lambda: kube.counter(NAME, "driftCorrections") >= 10, message=lambda: repr(kube.status(NAME)))
    kube.settle()
    assert kube.counter(NAME, "driftCorrections") == 10


def test_report_mode_reports_drift_without_correcting_it_until_switched_back(kube):
    kube.start(resync_s=0.5)
    body = example()
    body["spec"]["driftPolicy"] = "Report"
    kube.applied(body)
    name = "kata-qemu-rs-m"
    original = pod_fixed(kube, name)

    kube.edit(RUNTIME_CLASSES, name, _rc_memory)

    kube.wait_for(lambda: kube.counter(NAME, "driftDetected") == 1, message=lambda: repr(kube.status(NAME)))
    [warning] = kube.wait_for(lambda: kube.event_messages(cond.EVENT_DRIFT_DETECTED, "Warning"))
    assert name in warning and "overhead.podFixed" in warning
    in_sync = kube.wait_for(lambda: kube.condition(NAME, "InSync")
                            if kube.conditions(NAME)["InSync"] == "False" else None)
    assert in_sync["reason"] == cond.REASON_DRIFT_REPORTED and name in in_sync["message"]
    assert kube.conditions(NAME)["Ready"] == "False"
    # Several resyncs later: still not corrected, reported once, counted once, nothing written.
    kube.settle()
    mark, resyncs = kube.mark(), kube.passes("resync")
    kube.stays(lambda: pod_fixed(kube, name)["memory"] == "1Mi", 1.5, "Report mode corrected a hand edit")
    assert kube.passes("resync") >= resyncs + 2
    assert kube.writes(mark) == []
    assert kube.counter(NAME, "driftCorrections") == 0
    assert kube.counter(NAME, "driftDetected") == 1
    assert len(kube.event_messages(cond.EVENT_DRIFT_DETECTED)) == 1

    kube.update_spec(NAME, lambda spec: spec.update(driftPolicy="Correct"))
    kube.wait_for(lambda: pod_fixed(kube, name) == original)
    kube.wait_observed(NAME, Ready="True", InSync="True")


# --- objects somebody else owns -----------------------------------------------------------------


def test_an_unmanaged_runtime_class_with_our_name_is_left_alone_and_reported(kube):
    theirs = kube.create(RUNTIME_CLASSES, {
        "metadata": {"name": "kata-qemu-rs-m", "labels": {"team": "platform"}},
        "handler": "kata-qemu-rs-m", "overhead": {"podFixed": {"cpu": "1", "memory": "2Gi"}},
    })
    kube.start(resync_s=0.5)
    mark = kube.mark()
    kube.create(POLICIES, example())

    kube.wait_observed(NAME, Conflict="True", Ready="False")
    kube.wait_for(lambda: set(runtime_classes(kube)) == RC_NAMES)
    kube.settle()
    assert kube.get(RUNTIME_CLASSES, "kata-qemu-rs-m") == theirs
    conflict = kube.condition(NAME, "Conflict")
    assert conflict["reason"] == cond.REASON_CONFLICT and "kata-qemu-rs-m" in conflict["message"]
    assert kube.condition(NAME, "InSync")["status"] == "False"
    assert any("kata-qemu-rs-m" in m for m in kube.event_messages(cond.EVENT_CONFLICT, "Warning"))
    for other in RC_NAMES - {"kata-qemu-rs-m"}:
        assert kube.read(RUNTIME_CLASSES, other)["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
    assert not kube.writes(mark, RUNTIME_CLASSES, "kata-qemu-rs-m")
    # Resyncs (every 0.5 s here) of a policy still in Conflict: no write, not even the event again.
    quiet, resyncs = kube.mark(), kube.passes("resync")
    kube.stays(lambda: not kube.writes(quiet), 1.6, "a resync in Conflict wrote something")
    assert kube.passes("resync") >= resyncs + 2
    assert len(kube.event_messages(cond.EVENT_CONFLICT)) == 1, "the same conflict was announced again"

    # Their own edits of their object are theirs: not "corrected".
    kube.edit(RUNTIME_CLASSES, "kata-qemu-rs-m", lambda o: o["overhead"]["podFixed"].update(memory="3Gi"))
    theirs = kube.get(RUNTIME_CLASSES, "kata-qemu-rs-m")
    kube.stays(lambda: kube.get(RUNTIME_CLASSES, "kata-qemu-rs-m") == theirs, 1.0,
               "the operator overwrote an unmanaged RuntimeClass")
    assert not kube.writes(mark, RUNTIME_CLASSES, "kata-qemu-rs-m")

    kube.delete(RUNTIME_CLASSES, "kata-qemu-rs-m")
    kube.wait_observed(NAME, Conflict="False", Ready="True", InSync="True")
    ours = kube.wait_for(lambda: kube.get(RUNTIME_CLASSES, "kata-qemu-rs-m"))
    assert ours["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
    assert ours["metadata"]["ownerReferences"][0]["uid"] == kube.policy(NAME)["metadata"]["uid"]


def test_a_second_policy_never_takes_the_runtime_classes_of_the_first(kube):
    """Two policies that render the same RuntimeClass names: the first one's objects stay its
    own, even when edited by hand while the second one is in Conflict."""
    kube.start()
    first = kube.applied(example())
    second = example()
    second["metadata"]["name"] = "copycat"
    second["spec"]["runtimeClass"]["namePrefix"] = "kata-qemu-rs"
    kube.create(POLICIES, second)
    kube.wait_observed("copycat", Conflict="True", Ready="False")
    kube.settle()

    kube.edit(RUNTIME_CLASSES, "kata-qemu-rs-m", _rc_memory)
    kube.wait_for(lambda: pod_fixed(kube, "kata-qemu-rs-m")["memory"] != "1Mi")
    kube.settle()
    for obj in runtime_classes(kube).values():
        assert obj["metadata"]["labels"][POLICY_LABEL] == NAME
        assert [o["uid"] for o in obj["metadata"]["ownerReferences"]] == [first["metadata"]["uid"]]
    assert kube.conditions(NAME)["Ready"] == "True"
    assert kube.conditions("copycat")["Conflict"] == "True"


# --- invalid policies --------------------------------------------------------------------------


def _bad_quantity(spec: dict) -> None:
    spec["classes"][2]["memory"] = "16 gigs"


def _pod_fixed_below_overhead(spec: dict) -> None:
    spec["classes"][0].update(overheadMemory="512Mi", podFixed={"cpu": "2", "memory": "256Mi"})


@pytest.mark.parametrize("breaks, fixes, expected", [
    pytest.param(_bad_quantity, lambda spec: spec["classes"][2].update(memory="16Gi"),
                 ["spec.classes[2].memory", "16 gigs"], id="bad-quantity",
                 marks=pytest.mark.tiers("emulator", reason="the CRD's schema refuses it on the real server: only a "
                                                            "server without it stores such a write")),
    pytest.param(_pod_fixed_below_overhead, lambda spec: spec["classes"][0].pop("podFixed"),
                 ["spec.classes[0]", "podFixed.memory 256Mi must be above overhead_memory 512Mi"],
                 id="podFixed-below-overhead"),
])
def test_an_invalid_update_leaves_the_last_valid_objects_exactly_as_they_were(kube, breaks, fixes, expected):
    kube.start()
    kube.applied(explicit_classes_policy())
    before = snapshot(kube)

    kube.update_spec(NAME, breaks)
    kube.wait_observed(NAME, Valid="False", Ready="False")
    kube.settle()

    valid = kube.condition(NAME, "Valid")
    assert valid["reason"] == cond.REASON_INVALID and valid["observedGeneration"] == 2
    for fragment in expected:
        assert fragment in valid["message"], (fragment, valid["message"])
    assert kube.condition(NAME, "InSync")["reason"] == cond.REASON_NOT_APPLIED
    [warning] = kube.wait_for(lambda: kube.event_messages(cond.EVENT_INVALID, "Warning"))
    for fragment in expected:
        assert fragment in warning
    assert snapshot(kube) == before
    # The last valid generation's classes stay reported.
    assert [c["name"] for c in kube.status(NAME)["classes"]] == list(CLASSES)

    kube.update_spec(NAME, fixes)
    kube.wait_observed(NAME, Valid="True", Ready="True", InSync="True")
    kube.settle()
    assert kube.status(NAME)["observedGeneration"] == 3
    want = {o["metadata"]["name"]: o for o in rendered_for(kube).runtime_classes}
    for name, obj in runtime_classes(kube).items():
        assert obj["overhead"]["podFixed"] == want[name]["overhead"]["podFixed"]
    assert len(kube.event_messages(cond.EVENT_INVALID)) == 1


def test_every_problem_of_an_invalid_policy_is_in_the_condition(kube):
    kube.start()
    body = explicit_classes_policy()
    body["spec"]["classes"][0].update(overheadVcpus="0.5", overheadMemory="300Mi",
                                      podFixed={"cpu": "400m", "memory": "200Mi"})
    kube.create(POLICIES, body)
    kube.wait_observed(NAME, Valid="False")
    message = kube.condition(NAME, "Valid")["message"]
    assert "podFixed.memory 200Mi must be above overhead_memory 300Mi" in message
    assert "podFixed.cpu 400m must be above overhead_vcpus 0.5" in message
    assert not runtime_classes(kube) and not config_maps(kube)


@pytest.mark.tiers("realserver", reason="the API server calls a registered admission webhook; on the emulator "
                                        "the webhook is posted to by the test (tests/api/test_webhook.py)")
def test_the_api_server_refuses_a_policy_that_breaks_a_sizing_rule_through_the_webhook(kube, tmp_path):
    cp = kube.cp
    assert cp is not None
    cert, key = write_self_signed_cert(tmp_path)
    port = free_port()
    kube.start(webhook=(port, cert, key))
    cp.apply(registered_as_the_overlay("validatingwebhookconfiguration.yaml", "kata-sizing-test", port, cert))
    try:
        body = invalid_body()
        body["metadata"]["name"] = "refused"
        # The API server may take a moment to see a new webhook configuration.
        result = kube.wait_for(lambda: (lambda r: r if r.returncode != 0 else None)(cp.apply(body, check=False))
                               or kube.delete(POLICIES, "refused"), message="the webhook refuses the policy")
        assert 'admission webhook "validate-policy.katasizing.dev" denied the request' in result.stderr, result.stderr
        assert "podFixed.memory 64Mi must be above overhead_memory 96Mi" in result.stderr
        assert "podFixed.cpu 100m must be above overhead_vcpus 0.2" in result.stderr
        assert kube.policy("refused") is None
        # A valid policy passes the same webhook, and its warning reaches kubectl.
        ok = cp.apply(explicit_classes_policy("admitted"))
        assert "katasizingpolicy.katasizing.dev/admitted created" in ok.stdout
    finally:
        cp.delete("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/kata-sizing-test")


# --- deleting the policy -----------------------------------------------------------------------


def _deletion_setup(kube: Kube) -> dict:
    """Objects the deletion must leave alone: somebody else's with a name like ours, and ours of
    another policy."""
    return {
        ("cm", f"{NAME}-notes"): kube.create(CONFIG_MAPS, {
            "metadata": {"name": f"{NAME}-notes", "labels": {MANAGED_BY_LABEL: "someone-else"}}, "data": {"a": "b"}}),
        ("rc", "kata-qemu-rs-m-gpu"): kube.create(RUNTIME_CLASSES, {
            "metadata": {"name": "kata-qemu-rs-m-gpu"}, "handler": "kata-qemu-rs-m-gpu"}),
        # Labelled like ours, for another policy: not this policy's to delete.
        ("cm", "other-dropins"): kube.create(CONFIG_MAPS, {
            "metadata": {"name": "other-dropins", "labels": {MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: "other"}},
            "data": {}}),
    }


def test_deleting_the_policy_leaves_its_objects_to_the_garbage_collector_and_nothing_else_goes(kube):
    """No finalizer: the policy goes at once, even while the guidance check passes it all the
    time, and its objects follow through their ownerReferences. The operator writes nothing for
    it, re-creates nothing of it, and forgets it."""
    others = _deletion_setup(kube)
    kube.start(guidance_s=0.1)
    kube.applied(example())
    assert RC_NAMES <= set(runtime_classes(kube))
    assert "finalizers" not in kube.policy(NAME)["metadata"]

    mark = kube.mark()
    started = time.monotonic()
    kube.delete(POLICIES, NAME)
    kube.wait_for(lambda: kube.policy(NAME) is None)
    assert time.monotonic() - started < 5, "the deletion waited for the operator"
    kube.wait_for(lambda: f"policy {NAME} deleted" in kube.log(), message="the operator forgot the policy")
    kube.wait_for(lambda: set(runtime_classes(kube)) == {"kata-qemu-rs-m-gpu"}
                  and set(config_maps(kube)) == {f"{NAME}-notes", "other-dropins"},
                  message=lambda: f"left: {sorted(runtime_classes(kube))} {sorted(config_maps(kube))}")
    kube.settle()
    assert kube.get(RUNTIME_CLASSES, "kata-qemu-rs-m-gpu") == others["rc", "kata-qemu-rs-m-gpu"]
    assert kube.get(CONFIG_MAPS, f"{NAME}-notes") == others["cm", f"{NAME}-notes"]
    assert kube.get(CONFIG_MAPS, "other-dropins") == others["cm", "other-dropins"]
    assert [w for w in kube.writes(mark) if w.resource != "events"] == [], "the operator wrote for a deleted policy"


@pytest.mark.tiers("emulator", reason="a real API server always runs its garbage collector")
@pytest.mark.emulator_options(garbage_collection=False)
def test_without_a_garbage_collector_the_operator_deletes_nothing_of_a_deleted_policy(kube):
    """The contract, where no garbage collector runs: the operator leaves the objects of a deleted
    policy alone (it never deletes by label what the collector removes by owner)."""
    kube.start()
    kube.applied(example())
    before = snapshot(kube)
    mark = kube.mark()
    kube.delete(POLICIES, NAME)
    kube.settle()
    assert snapshot(kube) == before
    assert [w for w in kube.writes(mark) if w.resource != "events"] == []


def test_an_older_operators_finalizer_is_taken_off_by_the_first_pass(kube):
    """Upgrade: a policy still carrying the finalizer and kopf's annotations of the operator
    before this one gets them removed by the first pass (somebody else's finalizer stays); one an
    older operator finalized and that was deleted while no operator ran waits on that finalizer,
    is released at start, and the garbage collector removes what was made for it."""
    kube.start()
    kube.applied(explicit_classes_policy("upgraded", runtimeClass={"namePrefix": "kata-upgraded"}))
    kube.stop()
    kube.edit(POLICIES, "upgraded", lambda o: o["metadata"].update(
        finalizers=["katasizing.dev/cleanup"],
        annotations={"katasizing.dev/last-handled-configuration": '{"spec": {}}'}))
    kube.delete(POLICIES, "upgraded")
    assert kube.policy("upgraded")["metadata"].get("deletionTimestamp")  # held by the old finalizer
    kept = example()
    kept["metadata"].update(finalizers=["katasizing.dev/cleanup", "example.com/theirs"],
                            annotations={"katasizing.dev/last-handled-configuration": '{"spec": {}}', "team": "x"})
    kube.create(POLICIES, kept)

    mark = kube.mark()
    kube.start()
    kube.wait_observed(NAME, Ready="True")
    meta = kube.policy(NAME)["metadata"]
    assert meta["finalizers"] == ["example.com/theirs"]  # somebody else's stays
    assert meta["annotations"] == {"team": "x"}
    kube.wait_for(lambda: kube.policy("upgraded") is None, message=lambda: repr(kube.policy("upgraded")))
    kube.wait_for(lambda: not kube.objects(RUNTIME_CLASSES, labels="katasizing.dev/policy=upgraded")
                  and not kube.objects(CONFIG_MAPS, OUTPUT_NAMESPACE, "katasizing.dev/policy=upgraded"),
                  timeout=60, message="the garbage collector left objects of the deleted policy")
    assert [(w.verb, w.resource) for w in kube.writes(mark, POLICIES, "upgraded")] == [
        ("patch", "katasizingpolicies")], "a deleted policy was passed"
    kube.edit(POLICIES, NAME, lambda o: o["metadata"].update(finalizers=[]))  # theirs, done with it


# --- restarts -----------------------------------------------------------------------------------


def test_a_restarted_operator_resumes_without_writing_and_still_corrects_drift(kube):
    kube.start(guidance_s=1)
    kube.applied(example())
    before = snapshot(kube)
    before_status = kube.status(NAME)
    kube.stop()

    mark = kube.mark()
    kube.start(guidance_s=1)
    # Its first pass reads the children from the caches: wait for it, then for quiet.
    kube.wait_for(lambda: kube.passes("resync") >= 1)
    kube.settle()
    # Nothing at all: no child, no status, no event, and no kopf bookkeeping on the policy.
    assert kube.writes(mark) == []
    assert snapshot(kube) == before
    assert kube.status(NAME) == before_status

    kube.edit(RUNTIME_CLASSES, "kata-qemu-rs-m", _rc_memory)
    kube.wait_for(lambda: pod_fixed(kube, "kata-qemu-rs-m") == before["rc"]["kata-qemu-rs-m"]["overhead"]["podFixed"])
    kube.wait_for(lambda: kube.counter(NAME, "driftCorrections") == 1)


def test_a_change_made_while_the_operator_was_down_is_applied_on_start(kube):
    kube.start()
    kube.applied(explicit_classes_policy())
    kube.stop()
    kube.update_spec(NAME, lambda spec: spec["classes"][1].update(memory="6Gi"))
    mark = kube.mark()

    kube.start()
    kube.wait_observed(NAME, Ready="True")
    kube.settle()
    assert kube.status(NAME)["observedGeneration"] == 2
    want = {o["metadata"]["name"]: o for o in rendered_for(kube).runtime_classes}
    assert pod_fixed(kube, "kata-qemu-rs-m") == want["kata-qemu-rs-m"]["overhead"]["podFixed"]
    # A drift event that raced the pass may try once more with a stale resourceVersion (409);
    # it must then see that the object is right and neither write nor claim a correction.
    assert [w for w in named_writes(kube, mark, RUNTIME_CLASSES) if w[1] != 409] == [
        ("update", 200, "kata-qemu-rs-m")]
    assert not kube.event_messages(cond.EVENT_DRIFT_CORRECTED)
    assert kube.counter(NAME, "driftCorrections") == 0


def test_the_periodic_resync_of_an_unchanged_policy_writes_nothing_and_asks_nothing(kube):
    kube.start(resync_s=0.3)
    kube.applied(example())
    kube.settle()
    mark, resyncs = kube.mark(), kube.passes("resync")
    kube.wait_for(lambda: kube.passes("resync") >= resyncs + 4, message="the resync did not come four times")
    assert kube.writes(mark) == []
    # Read from the watch-fed caches: a resync costs no request at all (a watch's reconnect aside).
    if kube.emu is not None:
        asked = [r for r in kube.emu.request_log[mark:] if not r.is_watch]
        assert asked == [], asked
    else:
        assert kube.cp is not None
        asked = [e for e in kube.cp.operator_requests(mark) if e.verb != "watch"]
        assert asked == [], asked


# --- managedBy: KataDeploy ---------------------------------------------------------------------


def chart_runtime_classes(kube: Kube) -> list[dict]:
    """The RuntimeClasses as the kata-deploy chart creates them: from the values overlay's strings."""
    values = yaml.safe_load(kube.read(CONFIG_MAPS, f"{NAME}-kata-deploy-values")["data"]["values.yaml"])
    runtimes = values["customRuntimes"]["runtimes"]
    items = runtimes.values() if isinstance(runtimes, dict) else runtimes
    return [yaml.safe_load(r["runtimeClass"]) for r in items]


def test_kata_deploy_mode_guards_the_charts_runtime_classes_but_never_creates_or_deletes_them(kube):
    kube.start(resync_s=0.5)
    body = example()
    body["spec"]["runtimeClass"]["managedBy"] = "KataDeploy"
    kube.create(POLICIES, body)

    kube.wait_observed(NAME, InSync="False", Valid="True")
    in_sync = kube.condition(NAME, "InSync")
    assert in_sync["reason"] == cond.REASON_RUNTIME_CLASS_MISSING
    for name in RC_NAMES:
        assert name in in_sync["message"]
    kube.wait_for(lambda: set(config_maps(kube)) == CM_NAMES)
    assert runtime_classes(kube) == {}
    kube.settle()
    mark = kube.mark()
    kube.stays(lambda: not kube.writes(mark), 1.2, "a resync waiting for the chart wrote something")

    created = chart_runtime_classes(kube)
    assert {o["metadata"]["name"] for o in created} == RC_NAMES
    for obj in created:
        assert "ownerReferences" not in obj["metadata"]
        kube.create(RUNTIME_CLASSES, obj)
    kube.wait_observed(NAME, InSync="True", Ready="True")
    kube.settle()
    # The chart's objects as the chart made them: the policy does not adopt them.
    assert all("ownerReferences" not in o["metadata"] for o in runtime_classes(kube).values())
    assert not kube.writes(mark, RUNTIME_CLASSES)
    assert not kube.event_messages(cond.EVENT_DRIFT_CORRECTED)

    name = "kata-qemu-rs-m"
    original = pod_fixed(kube, name)
    kube.edit(RUNTIME_CLASSES, name, _rc_memory)
    kube.wait_for(lambda: pod_fixed(kube, name) == original)
    [corrected] = kube.wait_for(lambda: kube.event_messages(cond.EVENT_DRIFT_CORRECTED))
    assert name in corrected
    assert "ownerReferences" not in kube.read(RUNTIME_CLASSES, name)["metadata"]

    kube.delete(POLICIES, NAME)
    kube.wait_for(lambda: kube.policy(NAME) is None)
    kube.wait_for(lambda: config_maps(kube) == {}, message=lambda: f"left: {sorted(config_maps(kube))}")
    assert set(runtime_classes(kube)) == RC_NAMES
    assert not [w for w in kube.writes(mark, RUNTIME_CLASSES) if w.verb in ("create", "delete")]


# --- logs an administrator can read ------------------------------------------------------------


def test_at_info_the_operator_says_what_it_changed_and_nothing_per_policy_per_tick(kube):
    """Three policies, the guidance check every 0.2 s and the resync every 0.3 s: while nothing
    changes, no line at INFO (kopf used to log "Timer 'guidance' succeeded" for every policy at
    every tick); a hand edit is one INFO line naming what was written and why."""
    kube.start(resync_s=0.3, guidance_s=0.2)
    for name, prefix in (("a", "kata-a"), ("b", "kata-b"), (NAME, "kata-qemu-rs")):
        body = example()
        body["metadata"]["name"] = name
        body["spec"]["runtimeClass"] = {**body["spec"]["runtimeClass"], "namePrefix": prefix}
        body["spec"]["output"] = {"namespace": OUTPUT_NAMESPACE}
        kube.applied(body)
    # The node guidance's inputs move as well: a node comes, the check passes each policy once.
    kube.create(NODES, {"metadata": {"name": "n1", "labels": {"katacontainers.io/kata-runtime": "true"}},
                        "status": {"capacity": {"memory": "64Gi", "cpu": "16"},
                                   "allocatable": {"memory": "60Gi", "cpu": "15"}}})
    kube.wait_for(lambda: "n1" in str(kube.read(CONFIG_MAPS, f"{NAME}-node-guidance")["data"]))
    kube.settle()
    said_before, resyncs = len(kube.log_lines()), kube.passes("resync")
    time.sleep(1.2)  # six guidance checks and four resyncs of three policies in sync
    said = kube.log_lines()[said_before:]
    assert said == [], said
    assert kube.passes("resync") >= resyncs + 3
    if kube.emu is not None:  # passes that changed nothing log at DEBUG, which only this process keeps
        assert {p for p in ("a", "b", NAME) if kube.passes_of(p, "resync")} == {"a", "b", NAME}

    kube.edit(RUNTIME_CLASSES, "kata-qemu-rs-m", _rc_memory)
    kube.wait_for(lambda: kube.counter(NAME, "driftCorrections") == 1)
    kube.settle()
    said = kube.log_lines()[said_before:]
    assert len(said) == 1, said
    assert said[0].startswith(f"info: reconciled {NAME}: trigger=drift result=ok writes=1 duration=")
    assert said[0].endswith("(updated RuntimeClass kata-qemu-rs-m; status written)")
