"""The reconcile functions without kopf and without a server: a fake API that keeps objects in
dicts, records every call, and raises AssertionError on any call a test did not allow."""

from __future__ import annotations

import asyncio
import copy
import inspect
import itertools
import uuid

import jsonpatch
import pytest

from kata_sizing.controller import conditions as cond
from kata_sizing.controller import reconcile as rc
from kata_sizing.controller.kube import Conflict, Invalid, KubeApi, NotFound
from kata_sizing.core.model import parse_policy
from kata_sizing.core.render import CLASS_LABEL, MANAGED_BY, MANAGED_BY_LABEL, POLICY_LABEL, render_policy
from kata_sizing.core.sizing import size_policy
from tests.operator_helpers import example

NAME = "qemu-rs"
UID = "0e3c9a4e-0000-4000-8000-000000000001"
READS = frozenset({"list_runtime_classes", "list_config_maps", "read_runtime_class", "read_config_map", "read_policy",
                   "list_admission_objects", "read_admission_object"})
WRITES = frozenset({
    "create_runtime_class", "replace_runtime_class", "delete_runtime_class",
    "create_config_map", "replace_config_map", "delete_config_map", "patch_policy_status",
    "create_admission_object", "replace_admission_object", "delete_admission_object",
})
# What a 1.37 server serves (kube.KubeApi.served_admission_versions fills the real one's).
SERVED_ADMISSION = {"ValidatingAdmissionPolicy": "v1", "ValidatingAdmissionPolicyBinding": "v1",
                    "MutatingAdmissionPolicy": "v1", "MutatingAdmissionPolicyBinding": "v1"}


def _matches(obj: dict, selector: str | None) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in (selector or "").split(","):
        if term:
            key, _, value = term.partition("=")
            if labels.get(key) != value:
                return False
    return True


class FakeApi:
    """Speaks KubeApi's interface (checked below) over dicts. Only methods in `allow` may be
    called; anything else, including a method KubeApi does not have, fails the test."""

    def __init__(self, *objects: dict, policy: dict | None = None, allow=READS) -> None:
        self.allow = set(allow)
        self.calls: list[tuple] = []
        self.fail: dict[str, list[Exception]] = {}  # method -> errors to raise on the next calls
        self._versions = itertools.count(100)
        self.rcs: dict[str, dict] = {}
        self.cms: dict[tuple[str, str], dict] = {}
        self.adm: dict[tuple[str, str], dict] = {}  # (kind, name): the admission objects
        self.admission_versions = dict(SERVED_ADMISSION)
        self.policy = copy.deepcopy(policy)
        for obj in objects:
            self._store(self._stamped(obj))

    def __getattr__(self, name: str):
        raise AssertionError(f"the code called {name}(), which the API wrapper does not have")

    # bookkeeping

    def _call(self, method: str, *args) -> None:
        if method not in self.allow:
            raise AssertionError(f"unexpected API call {method}{args!r}; allowed: {sorted(self.allow)}")
        self.calls.append((method, *args))
        if self.fail.get(method):
            raise self.fail[method].pop(0)

    def _stamped(self, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = str(next(self._versions))
        return obj

    def _store(self, obj: dict) -> None:
        meta = obj["metadata"]
        if obj["kind"] == "RuntimeClass":
            self.rcs[meta["name"]] = obj
        elif obj["kind"] in SERVED_ADMISSION:
            self.adm[(obj["kind"], meta["name"])] = obj
        else:
            self.cms[(meta["namespace"], meta["name"])] = obj

    def _replace(self, table: dict, key, body: dict) -> dict:
        old = table.get(key)
        if old is None:
            raise NotFound(404, f"{key} not found")
        if body["metadata"].get("resourceVersion") not in (None, old["metadata"]["resourceVersion"]):
            raise Conflict(409, f"{key}: the object has been modified")
        if old.get("handler") != body.get("handler") and old.get("kind") == "RuntimeClass":
            raise Invalid(422, "handler: field is immutable")
        new = self._stamped(body)
        new["metadata"]["uid"] = old["metadata"]["uid"]
        table[key] = new
        return copy.deepcopy(new)

    @property
    def writes(self) -> list[tuple]:
        return [c for c in self.calls if c[0] in WRITES]

    # RuntimeClasses

    async def list_runtime_classes(self, label_selector=None):
        self._call("list_runtime_classes", label_selector)
        return [copy.deepcopy(o) for o in self.rcs.values() if _matches(o, label_selector)]

    async def read_runtime_class(self, name):
        self._call("read_runtime_class", name)
        return copy.deepcopy(self.rcs.get(name))

    async def create_runtime_class(self, body):
        self._call("create_runtime_class", body["metadata"]["name"])
        if body["metadata"]["name"] in self.rcs:
            raise Conflict(409, "already exists")
        obj = self._stamped({**body, "kind": "RuntimeClass"})
        self._store(obj)
        return copy.deepcopy(obj)

    async def replace_runtime_class(self, body):
        self._call("replace_runtime_class", body["metadata"]["name"])
        return self._replace(self.rcs, body["metadata"]["name"], {**body, "kind": "RuntimeClass"})

    async def delete_runtime_class(self, name, uid=None):
        self._call("delete_runtime_class", name)
        self.rcs.pop(name, None)

    # ConfigMaps

    async def list_config_maps(self, label_selector=None):
        self._call("list_config_maps", label_selector)
        return [copy.deepcopy(o) for o in self.cms.values() if _matches(o, label_selector)]

    async def read_config_map(self, namespace, name):
        self._call("read_config_map", namespace, name)
        return copy.deepcopy(self.cms.get((namespace, name)))

    async def create_config_map(self, body):
        meta = body["metadata"]
        self._call("create_config_map", meta["namespace"], meta["name"])
        if (meta["namespace"], meta["name"]) in self.cms:
            raise Conflict(409, "already exists")
        obj = self._stamped({**body, "kind": "ConfigMap"})
        self._store(obj)
        return copy.deepcopy(obj)

    async def replace_config_map(self, body):
        meta = body["metadata"]
        self._call("replace_config_map", meta["namespace"], meta["name"])
        return self._replace(self.cms, (meta["namespace"], meta["name"]), {**body, "kind": "ConfigMap"})

    async def delete_config_map(self, namespace, name, uid=None):
        self._call("delete_config_map", namespace, name)
        self.cms.pop((namespace, name), None)

    # admission objects

    async def list_admission_objects(self, kind, label_selector=None):
        self._call("list_admission_objects", kind, label_selector)
        return [copy.deepcopy(o) for (k, _), o in self.adm.items() if k == kind and _matches(o, label_selector)]

    async def read_admission_object(self, kind, name):
        self._call("read_admission_object", kind, name)
        return copy.deepcopy(self.adm.get((kind, name)))

    async def create_admission_object(self, body):
        self._call("create_admission_object", body["kind"], body["metadata"]["name"])
        if (body["kind"], body["metadata"]["name"]) in self.adm:
            raise Conflict(409, "already exists")
        obj = self._stamped(body)
        self._store(obj)
        return copy.deepcopy(obj)

    async def replace_admission_object(self, body):
        self._call("replace_admission_object", body["kind"], body["metadata"]["name"])
        return self._replace(self.adm, (body["kind"], body["metadata"]["name"]), body)

    async def delete_admission_object(self, kind, name, uid=None):
        self._call("delete_admission_object", kind, name)
        self.adm.pop((kind, name), None)

    # the policy

    async def read_policy(self, name):
        self._call("read_policy", name)
        return copy.deepcopy(self.policy)

    async def patch_policy_status(self, name, patch):
        self._call("patch_policy_status", name, copy.deepcopy(patch))
        if self.policy is None:
            raise NotFound(404, "gone")
        if isinstance(patch, list):
            try:
                self.policy = jsonpatch.JsonPatch(patch).apply(self.policy)
            except jsonpatch.JsonPatchTestFailed as exc:
                raise Invalid(422, str(exc)) from None
        else:
            self.policy["status"] = {**(self.policy.get("status") or {}), **patch["status"]}
        return copy.deepcopy(self.policy)


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def __call__(self, ref: dict, type_: str, reason: str, message: str) -> None:
        assert ref["metadata"]["name"] == NAME and ref["kind"] == "KataSizingPolicy"
        self.events.append((type_, reason, message))

    def reasons(self) -> list[tuple[str, str]]:
        return [(t, r) for t, r, _ in self.events]


def run(coro):
    return asyncio.run(coro)


def policy_body(**spec) -> dict:
    body = example()
    body["metadata"].update(uid=UID, generation=1)
    body["spec"].update(spec)
    return body


def desired_objects(body: dict) -> tuple[list[dict], list[dict]]:
    """(the RuntimeClasses, every other object: ConfigMaps and admission objects)."""
    rendered = render_policy(parse_policy(body))
    return rendered.runtime_classes, rendered.configmaps + rendered.admission


def in_sync_cluster(body: dict, allow=READS) -> FakeApi:
    rcs, cms = desired_objects(body)
    return FakeApi(*rcs, *cms, policy=body, allow=allow)


def test_the_fake_speaks_exactly_the_api_wrappers_interface():
    public = {n for n, f in inspect.getmembers(KubeApi, inspect.iscoroutinefunction) if not n.startswith("_")}
    public -= {"connect", "close"}
    faked = {n for n, f in inspect.getmembers(FakeApi, inspect.iscoroutinefunction) if not n.startswith("_")}
    assert READS | WRITES <= faked
    for name in faked & public:
        real = list(inspect.signature(getattr(KubeApi, name)).parameters)
        fake = list(inspect.signature(getattr(FakeApi, name)).parameters)
        assert fake == real, name
    missing = (READS | WRITES) - public
    assert not missing, f"KubeApi lost {missing}; the operator code calls them"
    with pytest.raises(AssertionError, match="does not have"):
        FakeApi().patch_runtime_class  # noqa: B018


# --- differences ---------------------------------------------------------------------------


def _rc(**changes) -> dict:
    obj = {
        "kind": "RuntimeClass", "apiVersion": "node.k8s.io/v1", "handler": "kata-qemu-rs-m",
        "metadata": {
            "name": "kata-qemu-rs-m",
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: NAME, CLASS_LABEL: "m"},
            "ownerReferences": [{"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy",
                                 "name": NAME, "uid": UID, "controller": True}],
        },
        "overhead": {"podFixed": {"cpu": "250m", "memory": "1Gi"}},
        "scheduling": {"nodeSelector": {"katacontainers.io/kata-runtime": "true"}},
    }
    for path, value in changes.items():
        target = obj
        *parents, leaf = path.split("__")
        for part in parents:
            target = target.setdefault(part, {})
        if value is None:
            target.pop(leaf, None)
        else:
            target[leaf] = value
    return obj


def _cm(data: dict, **meta) -> dict:
    return {"kind": "ConfigMap", "apiVersion": "v1", "data": data, "metadata": {
        "name": "x", "namespace": "kata-sizing",
        "labels": {MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: NAME}, **meta}}


@pytest.mark.parametrize("live, expected", [
    (_rc(), []),
    (_rc(overhead={"podFixed": {"cpu": "250m", "memory": "1024Mi"}}), []),
    (_rc(overhead={"podFixed": {"cpu": "0.25", "memory": "1073741824"}}), []),
    (_rc(overhead={"podFixed": {"cpu": "250m", "memory": "1000Mi"}}), ["overhead.podFixed"]),
    (_rc(overhead={"podFixed": {"memory": "1Gi"}}), ["overhead.podFixed"]),
    (_rc(overhead={"podFixed": {"cpu": "250m", "memory": "1Gi", "ephemeral-storage": "1Gi"}}),
     ["overhead.podFixed"]),
    (_rc(overhead=None), ["overhead.podFixed"]),
    (_rc(metadata__labels={MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: NAME, CLASS_LABEL: "m", "team": "x"}), []),
    (_rc(metadata__annotations={"note": "by someone else"}), []),
    (_rc(metadata__labels={POLICY_LABEL: NAME, CLASS_LABEL: "m"}), [f"metadata.labels[{MANAGED_BY_LABEL}]"]),
    (_rc(metadata__ownerReferences=[{"uid": "someone-else"}, {"uid": UID}]), []),
    (_rc(metadata__ownerReferences=None), ["metadata.ownerReferences"]),
    (_rc(metadata__resourceVersion="7", metadata__managedFields=[{"manager": "kubectl"}]), []),
    (_rc(handler="other"), ["handler"]),
    (_rc(scheduling={"nodeSelector": {}}), ["scheduling"]),
    (_rc(scheduling__tolerations=[]), []),
], ids=lambda v: None if isinstance(v, dict) else str(v))
def test_differences_of_a_runtime_class(live, expected):
    assert rc.differences(_rc(), live) == expected


@pytest.mark.parametrize("live, expected", [
    (_cm({"a": "1", "b": "2"}), []),
    (_cm({"a": "1", "b": "changed"}), ["data[b]"]),
    (_cm({"a": "1"}), ["data[b]"]),
    (_cm({"a": "1", "b": "2", "c": "added by hand"}), ["data[c]"]),
    (_cm({"a": "1", "b": "2"}, annotations={"x": "y"}), []),
])
def test_differences_of_a_configmap(live, expected):
    assert rc.differences(_cm({"a": "1", "b": "2"}), live) == expected


def test_tolerations_compare_without_nulls_the_client_adds():
    want = _rc(scheduling={"nodeSelector": {}, "tolerations": [{"key": "kata", "operator": "Exists"}]})
    live = _rc(scheduling={"nodeSelector": {}, "tolerations": [
        {"key": "kata", "operator": "Exists", "effect": None, "value": None, "tolerationSeconds": None}]})
    assert rc.differences(want, live) == []


def test_corrected_puts_back_our_fields_and_keeps_everyone_elses():
    live = _rc(overhead={"podFixed": {"cpu": "1", "memory": "1Mi"}},
               metadata__labels={"team": "x"}, metadata__annotations={"note": "n"},
               metadata__ownerReferences=[{"uid": "other"}], metadata__resourceVersion="9")
    body = rc.corrected(_rc(), live)
    assert rc.differences(_rc(), body) == []
    assert body["metadata"]["labels"]["team"] == "x"
    assert body["metadata"]["annotations"] == {"note": "n"}
    assert [o["uid"] for o in body["metadata"]["ownerReferences"]] == ["other", UID]
    assert body["metadata"]["resourceVersion"] == "9"  # so a concurrent edit is a 409, not lost


# --- conditions and status -------------------------------------------------------------------


def test_merge_conditions_keeps_the_transition_time_unless_the_status_flips():
    before = [
        {"type": "Ready", "status": "True", "reason": "InSync", "message": "", "lastTransitionTime": "T0"},
        {"type": "Valid", "status": "True", "reason": "PolicyValid", "message": "", "lastTransitionTime": "T0"},
    ]
    now = [
        cond.condition("Ready", False, "Conflict", "x", 2),
        cond.condition("Valid", True, "PolicyValid", "a new message", 2),
        cond.condition("Conflict", True, "UnmanagedRuntimeClass", "x", 2),
    ]
    merged = {c["type"]: c for c in cond.merge_conditions(before, now, "T1")}
    assert merged["Ready"]["lastTransitionTime"] == "T1"
    assert merged["Valid"]["lastTransitionTime"] == "T0"
    assert merged["Valid"]["message"] == "a new message" and merged["Valid"]["observedGeneration"] == 2
    assert merged["Conflict"]["lastTransitionTime"] == "T1"
    assert cond.merge_conditions(None, now, "T2")[0]["lastTransitionTime"] == "T2"


def _status(result: rc.PassResult, body: dict | None = None) -> dict[str, dict]:
    body = body or policy_body()
    sizing = None if result.invalid else size_policy(parse_policy(body))
    status = rc.compute_status(body, result, sizing)
    assert status["observedGeneration"] == 1
    return {c["type"]: c for c in status["conditions"]}


@pytest.mark.parametrize("result, expected", [
    (rc.PassResult(), {"Valid": ("True", cond.REASON_VALID), "Conflict": ("False", cond.REASON_NO_CONFLICT),
                       "InSync": ("True", cond.REASON_IN_SYNC), "Ready": ("True", cond.REASON_IN_SYNC)}),
    (rc.PassResult(invalid=["spec.classes[0] (s): podFixed.memory 1Mi must be above overhead_memory 2Mi"]),
     {"Valid": ("False", cond.REASON_INVALID), "InSync": ("False", cond.REASON_NOT_APPLIED),
      "Ready": ("False", cond.REASON_INVALID)}),
    (rc.PassResult(conflicts=["RuntimeClass kata-qemu-rs-m exists and is not managed"]),
     {"Valid": ("True", cond.REASON_VALID), "Conflict": ("True", cond.REASON_CONFLICT),
      "InSync": ("False", cond.REASON_CONFLICT), "Ready": ("False", cond.REASON_CONFLICT)}),
    (rc.PassResult(missing=["kata-qemu-rs-m"]),
     {"InSync": ("False", cond.REASON_RUNTIME_CLASS_MISSING), "Ready": ("False", cond.REASON_RUNTIME_CLASS_MISSING)}),
    (rc.PassResult(drifted=["RuntimeClass kata-qemu-rs-m: overhead.podFixed"]),
     {"InSync": ("False", cond.REASON_DRIFT_REPORTED), "Ready": ("False", cond.REASON_DRIFT_REPORTED)}),
], ids=["valid", "invalid", "conflict", "missing", "drifted"])
def test_compute_status(result, expected):
    conditions = _status(result)
    for type_, (status, reason) in expected.items():
        assert (conditions[type_]["status"], conditions[type_]["reason"]) == (status, reason), type_
    for message in result.invalid + result.conflicts + result.drifted + result.missing:
        assert any(message in c["message"] for c in conditions.values())


def test_an_invalid_pass_keeps_the_last_valid_classes_in_status():
    body = policy_body()
    body["status"] = {"classes": [{"name": "kept"}]}
    status = rc.compute_status(body, rc.PassResult(invalid=["x"]), None)
    assert status["classes"] == [{"name": "kept"}]


# --- reconcile ---------------------------------------------------------------------------------


def test_first_pass_creates_every_object_and_writes_status_once():
    body = policy_body()
    api = FakeApi(policy=body, allow=READS | {"create_runtime_class", "create_config_map", "create_admission_object",
                                                 "patch_policy_status"})
    sink = Sink()
    result = run(rc.reconcile(api, body, "apply", rc.DesiredCache(), sink))
    rcs, cms = desired_objects(body)
    assert sorted(c[1] for c in api.writes if c[0] == "create_runtime_class") == sorted(
        o["metadata"]["name"] for o in rcs)
    assert len([c for c in api.writes if c[0] == "create_config_map"]) == len([o for o in cms if o["kind"] == "ConfigMap"])
    assert sorted(c[1:] for c in api.writes if c[0] == "create_admission_object") == sorted(
        (o["kind"], o["metadata"]["name"]) for o in cms if o["kind"] != "ConfigMap")
    assert [c[0] for c in api.writes].count("patch_policy_status") == 1
    assert sink.reasons() == [("Normal", cond.EVENT_APPLIED)]
    assert not result.conflicts and not result.invalid


def test_a_resync_of_a_policy_in_sync_makes_no_write_and_no_event():
    body = policy_body()
    first = in_sync_cluster(body, allow=READS | {"patch_policy_status"})
    run(rc.reconcile(first, body, "resync", rc.DesiredCache(), Sink()))
    body["status"] = first.policy["status"]

    api = in_sync_cluster(body)  # reads only: any write raises
    sink = Sink()
    result = run(rc.reconcile(api, body, "resync", rc.DesiredCache(), sink))
    assert api.writes == [] and sink.events == [] and result.writes == []
    assert {c[0] for c in api.calls} == {"list_runtime_classes", "list_config_maps", "list_admission_objects"}


def test_an_invalid_policy_touches_no_child_and_says_so_once():
    body = policy_body(classes=[{"name": "s", "cpu": "1", "memory": "1Gi", "overheadVcpus": "0.2",
                                 "overheadMemory": "300Mi", "podFixed": {"cpu": "1", "memory": "100Mi"}}])
    api = FakeApi(policy=body, allow={"patch_policy_status"})
    sink = Sink()
    result = run(rc.reconcile(api, body, "apply", rc.DesiredCache(), sink))
    assert result.invalid and "podFixed.memory 100Mi must be above overhead_memory 300Mi" in result.invalid[0]
    assert sink.reasons() == [("Warning", cond.EVENT_INVALID)]

    body["status"] = api.policy["status"]
    again = FakeApi(policy=body, allow=set())
    sink = Sink()
    run(rc.reconcile(again, body, "resync", rc.DesiredCache(), sink))
    assert sink.events == [] and again.calls == []


def test_an_unmanaged_runtime_class_is_never_written():
    body = policy_body()
    rcs, cms = desired_objects(body)
    theirs = {"kind": "RuntimeClass", "metadata": {"name": "kata-qemu-rs-m"}, "handler": "kata-qemu-rs-m"}
    others = [o for o in rcs if o["metadata"]["name"] != "kata-qemu-rs-m"]
    api = FakeApi(theirs, *others, *cms, policy=body, allow=READS | {"patch_policy_status"})
    before = copy.deepcopy(api.rcs["kata-qemu-rs-m"])
    sink = Sink()
    result = run(rc.reconcile(api, body, "resync", rc.DesiredCache(), sink))
    assert api.rcs["kata-qemu-rs-m"] == before
    assert len(result.conflicts) == 1 and "kata-qemu-rs-m" in result.conflicts[0]
    assert sink.reasons() == [("Warning", cond.EVENT_CONFLICT)]


def test_a_conflict_already_in_status_is_not_announced_again():
    body = policy_body()
    rcs, cms = desired_objects(body)
    theirs = {"kind": "RuntimeClass", "metadata": {"name": "kata-qemu-rs-m"}, "handler": "kata-qemu-rs-m"}
    others = [o for o in rcs if o["metadata"]["name"] != "kata-qemu-rs-m"]
    api = FakeApi(theirs, *others, *cms, policy=body, allow=READS | {"patch_policy_status"})
    run(rc.reconcile(api, body, "resync", rc.DesiredCache(), Sink()))
    body["status"] = api.policy["status"]

    quiet = FakeApi(theirs, *others, *cms, policy=body, allow=READS)
    sink = Sink()
    result = run(rc.reconcile(quiet, body, "resync", rc.DesiredCache(), sink))
    assert result.conflicts and sink.events == [] and quiet.writes == []


def test_report_mode_resync_reports_drift_once_and_writes_nothing_but_status():
    body = policy_body(driftPolicy="Report")
    api = in_sync_cluster(body, allow=READS | {"patch_policy_status"})
    api.rcs["kata-qemu-rs-s"]["overhead"]["podFixed"]["memory"] = "1Mi"
    cache, sink = rc.DesiredCache(), Sink()
    result = run(rc.reconcile(api, body, "resync", cache, sink))
    assert [c[0] for c in api.writes] == ["patch_policy_status"]
    assert result.drifted and "kata-qemu-rs-s" in result.drifted[0]
    assert sink.reasons() == [("Warning", cond.EVENT_DRIFT_DETECTED)]
    run(rc.reconcile(api, body, "resync", cache, sink))
    assert sink.reasons() == [("Warning", cond.EVENT_DRIFT_DETECTED)], "the same drift was reported twice"


def test_kata_deploy_mode_guards_without_owning():
    body = policy_body(runtimeClass={**example()["spec"]["runtimeClass"], "managedBy": "KataDeploy"})
    policy = parse_policy(body)
    desired = rc.build_desired(policy, render_policy(policy), body)
    # The operator owns what it creates: the ConfigMaps and the admission objects, not the chart's classes.
    assert {k[0] for k in desired.owned} == {"ConfigMap", "ValidatingAdmissionPolicy",
                                              "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy",
                                              "MutatingAdmissionPolicyBinding"}
    assert {k[2] for k in desired.guarded} == {f"kata-qemu-rs-{c}" for c in ("s", "m", "l", "xl")}
    for obj in desired.guarded.values():
        assert "ownerReferences" not in obj["metadata"]
        assert obj["metadata"]["labels"][POLICY_LABEL] == NAME


# --- drift events --------------------------------------------------------------------------


def _drift_setup(body: dict | None = None, allow=READS):
    body = body or policy_body()
    api = in_sync_cluster(body, allow=allow)
    cache = rc.DesiredCache()
    policy = parse_policy(body)
    cache.put(rc.build_desired(policy, render_policy(policy), body))
    counted: list[tuple[str, str]] = []

    async def count(policy_name, field_name):
        counted.append((policy_name, field_name))
    return api, cache, Sink(), count, counted


def _edited(api: FakeApi, name: str) -> dict:
    obj = api.rcs[name]
    obj["overhead"]["podFixed"]["memory"] = "1Mi"
    obj["metadata"]["resourceVersion"] = str(next(api._versions))
    return {**copy.deepcopy(obj), "kind": "RuntimeClass"}


def test_a_drifted_runtime_class_is_put_back_and_counted():
    api, cache, sink, count, counted = _drift_setup(allow=READS | {"replace_runtime_class"})
    original = copy.deepcopy(cache.by_policy[NAME].owned[("RuntimeClass", None, "kata-qemu-rs-m")])
    event = _edited(api, "kata-qemu-rs-m")
    message = run(rc.handle_child_event(api, cache, "MODIFIED", event, sink, count))
    assert "kata-qemu-rs-m" in message
    assert api.rcs["kata-qemu-rs-m"]["overhead"] == original["overhead"]
    assert [c[0] for c in api.writes] == ["replace_runtime_class"]
    assert sink.reasons() == [("Normal", cond.EVENT_DRIFT_CORRECTED)]
    assert counted == [(NAME, "driftCorrections")]


def test_a_stale_event_for_an_object_already_right_writes_and_counts_nothing():
    api, cache, sink, count, counted = _drift_setup(allow=READS | {"replace_runtime_class"})
    stale = _edited(api, "kata-qemu-rs-m")
    api.rcs["kata-qemu-rs-m"] = api._stamped(cache.by_policy[NAME].owned[("RuntimeClass", None, "kata-qemu-rs-m")])
    assert run(rc.handle_child_event(api, cache, "MODIFIED", stale, sink, count)) is None
    assert [c[0] for c in api.calls] == ["replace_runtime_class", "read_runtime_class"]  # 409, re-read, done
    assert sink.events == [] and counted == []


def test_a_deleted_object_is_recreated():
    api, cache, sink, count, counted = _drift_setup(allow=READS | {"create_config_map"})
    key = ("kata-sizing", f"{NAME}-dropins")
    gone = {**api.cms.pop(key), "kind": "ConfigMap"}
    run(rc.handle_child_event(api, cache, "DELETED", gone, sink, count))
    assert key in api.cms and counted == [(NAME, "driftCorrections")]


def test_an_object_that_is_not_ours_is_never_touched():
    api, cache, sink, count, counted = _drift_setup(allow=set())
    theirs = {"kind": "RuntimeClass", "handler": "kata-qemu-rs-m",
              "metadata": {"name": "kata-qemu-rs-m", "resourceVersion": "1", "labels": {"team": "x"}},
              "overhead": {"podFixed": {"cpu": "1", "memory": "1Gi"}}}
    for event_type in ("ADDED", "MODIFIED", "DELETED"):
        assert run(rc.handle_child_event(api, cache, event_type, theirs, sink, count)) is None
    assert api.calls == [] and sink.events == [] and counted == []


def test_report_mode_counts_and_warns_but_does_not_write():
    api, cache, sink, count, counted = _drift_setup(policy_body(driftPolicy="Report"), allow=set())
    event = _edited(api, "kata-qemu-rs-s")
    run(rc.handle_child_event(api, cache, "MODIFIED", event, sink, count))
    assert api.calls == []
    assert sink.reasons() == [("Warning", cond.EVENT_DRIFT_DETECTED)]
    assert counted == [(NAME, "driftDetected")]


def test_two_policies_with_the_same_names_each_keep_their_own_objects():
    first, second = policy_body(), policy_body()
    second["metadata"].update(name="copycat", uid="0e3c9a4e-0000-4000-8000-000000000002")
    second["spec"]["runtimeClass"] = {**second["spec"]["runtimeClass"], "namePrefix": "kata-qemu-rs"}
    cache = rc.DesiredCache()
    for body in (first, second):
        policy = parse_policy(body)
        cache.put(rc.build_desired(policy, render_policy(policy), body))
    key = ("RuntimeClass", None, "kata-qemu-rs-m")
    ours = cache.by_policy[NAME].owned[key]
    assert cache.for_child(key, ours).policy_name == NAME
    cache.drop("copycat")
    assert cache.for_child(key).policy_name == NAME
    cache.put(rc.build_desired(parse_policy(second), render_policy(parse_policy(second)), second))
    cache.drop(NAME)
    assert cache.for_child(key).policy_name == "copycat"


# --- the drift counters ------------------------------------------------------------------


def test_increment_counter_is_a_guarded_json_patch_that_retries_a_lost_race():
    body = policy_body()
    body["status"] = {"driftCorrections": 2}
    api = FakeApi(policy=body, allow={"read_policy", "patch_policy_status"})
    api.fail["patch_policy_status"] = [Invalid(422, "test failed")]
    run(rc.increment_counter(api, NAME, "driftCorrections"))
    assert api.policy["status"]["driftCorrections"] == 3
    patches = [c[2] for c in api.calls if c[0] == "patch_policy_status"]
    assert len(patches) == 2
    assert patches[-1][0] == {"op": "test", "path": "/status/driftCorrections", "value": 2}


@pytest.mark.parametrize("status", [None, {}, {"observedGeneration": 1}])
def test_increment_counter_starts_at_one(status):
    body = policy_body()
    if status is not None:
        body["status"] = status
    api = FakeApi(policy=body, allow={"read_policy", "patch_policy_status"})
    run(rc.increment_counter(api, NAME, "driftDetected"))
    assert api.policy["status"]["driftDetected"] == 1


def test_increment_counter_of_a_deleted_policy_is_a_no_op():
    api = FakeApi(policy=None, allow={"read_policy"})
    run(rc.increment_counter(api, NAME, "driftDetected"))
    assert api.calls == [("read_policy", NAME)]


def test_a_policy_warning_is_an_event_once_and_stays_in_status():
    # Worked-example class m: podFixed 160Mi is below default_memory 1Gi + host: pods without
    # limits are under-accounted. Valid, but said in status and once as a Warning event.
    body = policy_body(classes=[{"name": "m", "cpu": "2", "memory": "2Gi", "overheadVcpus": "0.5",
                                 "overheadMemory": "128Mi", "defaultVcpus": 2, "defaultMemory": "1024Mi",
                                 "podFixed": {"cpu": "600m", "memory": "160Mi"}}])
    api = FakeApi(policy=body, allow=READS | {"create_runtime_class", "create_config_map", "create_admission_object",
                                                 "patch_policy_status"})
    sink = Sink()
    run(rc.reconcile(api, body, "apply", rc.DesiredCache(), sink))
    assert ("Warning", cond.EVENT_WARNING) in sink.reasons()
    (warning,) = api.policy["status"]["warnings"]
    assert "podFixed.memory 160Mi is below default_memory 1Gi + host memory 50Mi" in warning
    assert {c["type"]: c["status"] for c in api.policy["status"]["conditions"]}["Valid"] == "True"

    body["status"] = api.policy["status"]
    again = in_sync_cluster(body)
    sink = Sink()
    run(rc.reconcile(again, body, "resync", rc.DesiredCache(), sink))
    assert sink.events == [] and again.writes == []


# --- admission objects: what is drift and what is the server's default --------------------------


@pytest.mark.parametrize("live, expected", [
    ({"policyName": "p", "validationActions": ["Deny"]}, []),
    # The server's defaults, at their default values.
    ({"policyName": "p", "validationActions": ["Deny"], "matchResources": {}}, ["spec.matchResources"]),
    ({"policyName": "p", "validationActions": ["Audit"]}, ["spec.validationActions[0]"]),
    ({"policyName": "p", "validationActions": ["Deny", "Audit"]}, ["spec.validationActions"]),
    ({"validationActions": ["Deny"]}, ["spec.policyName"]),
    ({"policyName": "p", "validationActions": ["Deny"], "paramRef": {"name": "x"}}, ["spec.paramRef"]),
], ids=["equal", "added-block", "changed-value", "longer-list", "removed", "added-field"])
def test_spec_differences_of_a_binding(live, expected):
    assert rc.spec_differences({"policyName": "p", "validationActions": ["Deny"]}, live) == expected


def test_spec_differences_ignore_what_the_server_defaults_only_at_its_default_value():
    desired = {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "resources": ["pods"]}]}}
    defaulted = {"failurePolicy": "Fail", "matchConstraints": {
        "matchPolicy": "Equivalent", "namespaceSelector": {}, "objectSelector": {},
        "resourceRules": [{"apiGroups": [""], "resources": ["pods"], "scope": "*"}]}}
    assert rc.spec_differences(desired, defaulted) == []
    narrowed = copy.deepcopy(defaulted)
    narrowed["matchConstraints"]["objectSelector"] = {"matchLabels": {"team": "a"}}
    narrowed["failurePolicy"] = "Ignore"
    assert sorted(rc.spec_differences(desired, narrowed)) == ["spec.failurePolicy", "spec.matchConstraints.objectSelector"]


def test_a_corrected_admission_object_keeps_other_peoples_labels_and_takes_the_whole_spec():
    desired = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": "b", "labels": {MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: NAME}},
               "spec": {"policyName": "p", "validationActions": ["Deny"]}}
    live = copy.deepcopy(desired)
    live["metadata"].update(resourceVersion="7", labels={**desired["metadata"]["labels"], "team": "a"})
    live["spec"] = {"policyName": "p", "validationActions": ["Audit"], "paramRef": {"name": "x"}}
    assert rc.differences(desired, live) == ["spec.validationActions[0]", "spec.paramRef"]
    fixed = rc.corrected(desired, live)
    assert fixed["spec"] == desired["spec"] and fixed["metadata"]["resourceVersion"] == "7"
    assert fixed["metadata"]["labels"]["team"] == "a"
    assert rc.differences(desired, fixed) == []


# --- the pod audit in status ------------------------------------------------------------------------


def _finding(pod: str, rule: str = "pod-envelope-exceeded", class_name: str = "s") -> dict:
    return {"pod": pod, "runtimeClass": f"kata-qemu-rs-{class_name}", "class": class_name, "rule": rule,
            "action": "Deny", "message": f"{pod} is too big"}


def test_pod_audit_status_counts_every_pod_and_lists_a_bounded_sorted_few():
    findings = [_finding(f"ns/pod-{i:03d}") for i in range(rc.POD_AUDIT_LISTED + 10)]
    findings += [_finding("ns/pod-000", "pod-memory-limit-missing"), _finding("a/x", class_name="m")]
    audit = rc.pod_audit_status(findings)
    assert audit["pods"] == rc.POD_AUDIT_LISTED + 11
    assert audit["counts"] == [
        {"class": "m", "rule": "pod-envelope-exceeded", "pods": 1},
        {"class": "s", "rule": "pod-envelope-exceeded", "pods": rc.POD_AUDIT_LISTED + 10},
        {"class": "s", "rule": "pod-memory-limit-missing", "pods": 1},
    ]
    assert len(audit["listed"]) == rc.POD_AUDIT_LISTED and audit["truncated"] is True
    assert [r["pod"] for r in audit["listed"][:3]] == ["a/x", "ns/pod-000", "ns/pod-000"]


def test_the_pod_audit_event_is_posted_when_the_list_changes_and_not_again_after_a_restart():
    cache, sink = rc.DesiredCache(), Sink()
    ref = {"kind": "KataSizingPolicy", "metadata": {"name": NAME}}
    one = rc.pod_audit_status([_finding("ns/a")])
    rc.announce_pod_audit(cache, sink, ref, NAME, {}, one)
    rc.announce_pod_audit(cache, sink, ref, NAME, {}, one)  # the status write has not come back yet
    assert sink.reasons() == [("Warning", cond.EVENT_POD_AUDIT)]
    assert "1 Kata pod(s) outside their class (1 pod-envelope-exceeded on class s)" in sink.events[0][2]
    two = rc.pod_audit_status([_finding("ns/a"), _finding("ns/b")])
    rc.announce_pod_audit(cache, sink, ref, NAME, {"status": {"podAudit": one}}, two)
    assert len(sink.events) == 2
    rc.announce_pod_audit(cache, sink, ref, NAME, {"status": {"podAudit": two}}, rc.pod_audit_status([]))
    rc.announce_pod_audit(cache, sink, ref, NAME, {"status": {"podAudit": rc.pod_audit_status([])}}, two)
    assert len(sink.events) == 3  # the same pods again after the list emptied: news again
    restarted = rc.DesiredCache()
    rc.announce_pod_audit(restarted, sink, ref, NAME, {"status": {"podAudit": two}}, two)
    assert len(sink.events) == 3


def test_an_admission_object_the_server_refuses_is_said_in_status_and_the_rest_is_written():
    body = policy_body()
    api = FakeApi(policy=body, allow=READS | {"create_runtime_class", "create_config_map", "create_admission_object",
                                              "patch_policy_status"})
    # A server whose CEL library lacks a function the rule uses answers 422 on the policy.
    api.fail["create_admission_object"] = [Invalid(422, "spec.validations[0].expression: compilation failed")]
    result = run(rc.reconcile(api, body, "apply", rc.DesiredCache(), Sink()))
    assert len([c for c in api.writes if c[0] == "create_runtime_class"]) == 4
    assert len([c for c in api.writes if c[0] == "create_admission_object"]) == 6  # the refused one and 5 more
    assert len(api.adm) == 5
    conditions = {c["type"]: c for c in api.policy["status"]["conditions"]}
    assert conditions["InSync"]["status"] == "False" and conditions["InSync"]["reason"] == cond.REASON_REFUSED
    assert "compilation failed" in conditions["InSync"]["message"] and result.refused
