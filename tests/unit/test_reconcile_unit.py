"""A pass (gather, plan, execute, conclude) without kopf and without a server: a fake API that
keeps objects in dicts, records every call, and raises AssertionError on any call a test did
not allow; a fake child cache over the same objects, as the operator's watch-fed cache is."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import itertools
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import jsonpatch
import pytest

from kata_sizing.controller import compare, metrics
from kata_sizing.controller import conditions as cond
from kata_sizing.controller import reconcile as rc
from kata_sizing.controller import status as st
from kata_sizing.controller.events import EventSink
from kata_sizing.controller.execute import WRITES_PER_PASS
from kata_sizing.controller.informer import ChildCache, HeldNames, Informer
from kata_sizing.controller.kinds import ADMISSION_KINDS, obj_key, policy_key
from kata_sizing.controller.kube import Conflict, Invalid, KubeApi, NotFound, PermanentApiError, TransientApiError
from kata_sizing.controller.plan import build_desired
from kata_sizing.controller.retry import RetryLater
from kata_sizing.controller.state import DesiredCache, OperatorState, PolicyRecord
from kata_sizing.core import podfit
from kata_sizing.core.model import KIND, parse_policy
from kata_sizing.core.render import CLASS_LABEL, MANAGED_BY, MANAGED_BY_LABEL, POLICY_LABEL, render_policy
from kata_sizing.core.sizing import size_policy
from kata_sizing.core.statusmodel import KataSizingPolicyStatus, PodAuditStatus
from tests.support.policies import example

NAME = "qemu-rs"
UID = "0e3c9a4e-0000-4000-8000-000000000001"
READS = frozenset({"read"})
WRITES = frozenset({"create", "replace", "apply", "delete", "patch_status"})
NAMESPACE = "kata-sizing"


class FakeApi:
    """Speaks KubeApi's interface (checked below) over dicts. Only methods in `allow` may be
    called; anything else, including a method KubeApi does not have, fails the test."""

    def __init__(self, *objects: dict, policy: dict | None = None, allow=READS, namespaces=(NAMESPACE,)) -> None:
        self.allow = set(allow)
        self.calls: list[tuple] = []
        self.fail: dict[str, list[Exception]] = {}  # method -> errors to raise on the next calls
        self._versions = itertools.count(100)
        self.objects: dict[tuple, dict] = {}
        self.namespaces = set(namespaces)
        self.managers: list[tuple[str, tuple, str]] = []  # (method, key, the field manager it wrote as)
        for obj in objects:
            self._store(self._stamped(obj))
        if policy is not None:
            self._store(self._stamped({**policy, "kind": KIND}))

    def __getattr__(self, name: str):
        raise AssertionError(f"the code called {name}(), which the API wrapper does not have")

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
        self.objects[obj_key(obj)] = obj

    @property
    def policy(self) -> dict | None:
        return copy.deepcopy(self.objects.get(policy_key(NAME)))

    @property
    def writes(self) -> list[tuple]:
        return [c for c in self.calls if c[0] in WRITES]

    def written(self, method: str, kind: str | None = None) -> list[tuple]:
        return [c for c in self.writes if c[0] == method and (kind is None or c[1][0] == kind)]

    async def create(self, body, field_manager="kata-sizing"):
        key = obj_key(body)
        self._call("create", key)
        self.managers.append(("create", key, field_manager))
        if key in self.objects:
            raise Conflict(409, "already exists")
        if key[1] is not None and key[1] not in self.namespaces:
            raise NotFound(404, f'create {key[0]} {key[1]}/{key[2]}: namespaces "{key[1]}" not found')
        obj = self._stamped(body)
        self._store(obj)
        return copy.deepcopy(obj)

    async def read(self, key):
        self._call("read", key)
        return copy.deepcopy(self.objects.get(tuple(key)))

    async def apply(self, body, field_manager):
        """A server-side apply as the fake's objects can hold it: the configuration's labels,
        annotations and spec over the object (created when missing)."""
        key = obj_key(body)
        self._call("apply", key)
        self.managers.append(("apply", key, field_manager))
        assert "resourceVersion" not in body["metadata"] and "managedFields" not in body["metadata"], body
        old = copy.deepcopy(self.objects.get(key)) or {"apiVersion": body["apiVersion"], "kind": body["kind"],
                                                       "metadata": {"name": key[2]}}
        for part in ("labels", "annotations"):
            if part in body["metadata"]:
                old["metadata"][part] = {**(old["metadata"].get(part) or {}), **body["metadata"][part]}
        old["spec"] = copy.deepcopy(body["spec"])
        new = self._stamped(old)
        self._store(new)
        return copy.deepcopy(new)

    async def replace(self, body, field_manager="kata-sizing"):
        key = obj_key(body)
        self._call("replace", key)
        self.managers.append(("replace", key, field_manager))
        old = self.objects.get(key)
        if old is None:
            raise NotFound(404, f"{key} not found")
        if body["metadata"].get("resourceVersion") not in (None, old["metadata"]["resourceVersion"]):
            raise Conflict(409, f"{key}: the object has been modified")
        if key[0] == "RuntimeClass" and old.get("handler") != body.get("handler"):
            raise Invalid(422, "handler: field is immutable")
        new = self._stamped(body)
        new["metadata"]["uid"] = old["metadata"]["uid"]
        self._store(new)
        return copy.deepcopy(new)

    async def delete(self, key, uid=None):
        self._call("delete", key)
        self.objects.pop(tuple(key), None)

    async def patch_status(self, key, patch):
        self._call("patch_status", key, copy.deepcopy(patch))
        obj = self.objects.get(tuple(key))
        if obj is None:
            raise NotFound(404, "gone")
        if isinstance(patch, list):
            try:
                new = jsonpatch.JsonPatch(patch).apply(obj)
            except jsonpatch.JsonPatchTestFailed as exc:
                raise Invalid(422, str(exc)) from None
        else:
            new = {**obj, "status": {**(obj.get("status") or {}), **patch["status"]}}
        new = self._stamped(new)
        self._store(new)
        return copy.deepcopy(new)


class FakeChildren(HeldNames):
    """The operator's child cache over the fake's objects: every RuntimeClass and admission
    object, and the ConfigMaps labelled managed-by kata-sizing (a ConfigMap without that label
    is not in the real cache either), with the real cache's record of names held by others."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.runtime_classes = SimpleNamespace(synced=_set_event(), version=0, items={})
        self.held_by_others = set()
        self.remembered: dict = {}

    def _cached(self, obj: dict) -> bool:
        if obj["kind"] == "ConfigMap":
            return (obj["metadata"].get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY
        return obj["kind"] in ("RuntimeClass", *ADMISSION_KINDS)

    def get(self, key):
        obj = self.api.objects.get(tuple(key))
        return copy.deepcopy(obj) if obj is not None and self._cached(obj) else None

    def complete(self, key) -> bool:
        return key[0] != "ConfigMap"

    def of_policy(self, policy_name: str) -> dict:
        return {k: copy.deepcopy(o) for k, o in self.api.objects.items()
                if self._cached(o) and (o["metadata"].get("labels") or {}).get(POLICY_LABEL) == policy_name}

    def runtime_classes_except(self, names):
        return [copy.deepcopy(o) for k, o in sorted(self.api.objects.items(), key=lambda item: item[0][2])
                if k[0] == "RuntimeClass" and k[2] not in names]

    def record(self, obj: dict) -> None:
        pass  # the fake's store is the cache's truth

    def forget(self, key) -> None:
        pass

    def informers(self) -> list:
        return []


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


def make_state(api: FakeApi) -> OperatorState:
    """No node and no pod in the cluster (so node guidance is rendered for no node, and the pod
    audit finds nothing), every admission kind served."""
    def idle() -> Informer:  # what a pass reads of an informer: synced, its version, its items
        return cast(Informer, SimpleNamespace(synced=_set_event(), version=0, items={}, collection="idle"))
    # The fakes stand for the caches and the event poster by the attributes a pass reads.
    return OperatorState(api=cast(KubeApi, api), admission_versions={k: "v1" for k in ADMISSION_KINDS},
                         children=cast(ChildCache, FakeChildren(api)), nodes=idle(), pods=idle(),
                         events=cast(EventSink, Sink()))


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


def desired_objects(body: dict) -> list[dict]:
    """What a pass writes for `body` in a cluster without nodes: copies, for a test to change (a
    render's objects are never changed in place; the shared ones are built once per routing)."""
    rendered = render_policy(parse_policy(body), nodes=[])
    runtime_classes = rendered.runtime_classes if rendered.creates_runtime_classes else []
    return copy.deepcopy([*runtime_classes, *rendered.configmaps, *rendered.shared, *rendered.admission])


def in_sync_cluster(body: dict, allow=READS, **kwargs) -> FakeApi:
    return FakeApi(*desired_objects(body), policy=body, allow=allow, **kwargs)


def seen(state: OperatorState, body: dict) -> PolicyRecord:
    """The policy's record as the policy watch leaves it: the latest body."""
    name = body["metadata"]["name"]
    record = state.records.get(name)
    if record is None:
        record = state.records[name] = PolicyRecord(name, body)
    record.body = body
    return record


async def pass_of(state: OperatorState, trigger: str, sink: Sink | None = None, landed: list | None = None):
    """A pass of the fake's policy, as the queue runs it once the watch delivered its latest body;
    `sink` gets its events, `landed` the writes that landed (also when the pass fails)."""
    policy = cast(FakeApi, state.api).policy
    assert policy is not None, "the fake holds no policy to pass"
    seen(state, policy)
    state.events = cast(EventSink, sink or Sink())
    if landed is None:
        return await rc.run_pass(state, NAME, trigger)
    original = metrics.reconcile_pass

    @contextlib.contextmanager
    def recorded(policy: str, trigger: str) -> Iterator[metrics.Pass]:
        with original(policy, trigger) as current:
            try:
                yield current
            finally:
                landed.extend(current.writes)

    metrics.reconcile_pass = recorded
    try:
        return await rc.run_pass(state, NAME, trigger)
    finally:
        metrics.reconcile_pass = original


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
        FakeApi().replace_runtime_class  # noqa: B018


# --- differences ---------------------------------------------------------------------------


def _rc(**changes) -> dict:
    obj: dict[str, Any] = {
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
    assert compare.differences(_rc(), live) == expected


@pytest.mark.parametrize("live, expected", [
    (_cm({"a": "1", "b": "2"}), []),
    (_cm({"a": "1", "b": "changed"}), ["data[b]"]),
    (_cm({"a": "1"}), ["data[b]"]),
    (_cm({"a": "1", "b": "2", "c": "added by hand"}), ["data[c]"]),
    (_cm({"a": "1", "b": "2"}, annotations={"x": "y"}), []),
])
def test_differences_of_a_configmap(live, expected):
    assert compare.differences(_cm({"a": "1", "b": "2"}), live) == expected


def test_tolerations_compare_without_nulls_the_client_adds():
    want = _rc(scheduling={"nodeSelector": {}, "tolerations": [{"key": "kata", "operator": "Exists"}]})
    live = _rc(scheduling={"nodeSelector": {}, "tolerations": [
        {"key": "kata", "operator": "Exists", "effect": None, "value": None, "tolerationSeconds": None}]})
    assert compare.differences(want, live) == []


def test_corrected_puts_back_our_fields_and_keeps_everyone_elses():
    live = _rc(overhead={"podFixed": {"cpu": "1", "memory": "1Mi"}},
               metadata__labels={"team": "x"}, metadata__annotations={"note": "n"},
               metadata__ownerReferences=[{"uid": "other"}], metadata__resourceVersion="9")
    body = compare.corrected(_rc(), live)
    assert compare.differences(_rc(), body) == []
    assert body["metadata"]["labels"]["team"] == "x"
    assert body["metadata"]["annotations"] == {"note": "n"}
    assert [o["uid"] for o in body["metadata"]["ownerReferences"]] == ["other", UID]
    assert body["metadata"]["resourceVersion"] == "9"  # so a concurrent edit is a 409, not lost


def test_corrected_replaces_the_owner_reference_of_an_earlier_policy_of_the_same_name():
    """A policy deleted and made again before the garbage collector reached its objects: the
    objects are the new policy's, its reference replaces the old one (the API server refuses an
    object with two controllers, seen on the real server) and somebody else's stays."""
    earlier = {**_rc()["metadata"]["ownerReferences"][0], "uid": "an-earlier-uid"}
    live = _rc(metadata__ownerReferences=[earlier, {"uid": "other", "kind": "Thing", "name": "x"}])
    assert compare.differences(_rc(), live) == ["metadata.ownerReferences"]
    body = compare.corrected(_rc(), live)
    assert [o["uid"] for o in body["metadata"]["ownerReferences"]] == ["other", UID]
    assert [o.get("controller") for o in body["metadata"]["ownerReferences"]].count(True) == 1


# --- the install's shared admission objects ------------------------------------------------------

SHARED_VAP = ("ValidatingAdmissionPolicy", None, podfit.SHARED_NAMES["memory"])
HELM_META = {"labels": {MANAGED_BY_LABEL: "Helm"},
             "annotations": {"meta.helm.sh/release-name": "kata-sizing", "meta.helm.sh/release-namespace": "kata-sizing"}}


def _fields(keys) -> dict:
    return {".": {}, **{f"f:{k}": {} for k in keys}}


def installed(obj: dict, manager: str, operation: str, extra: dict | None = None,
              others: list[dict] | None = None) -> dict:
    """`obj` as an installer wrote it: its labels and annotations plus `extra`'s (Helm's own), and
    managedFields saying `manager` set them, with `operation` (Apply: server-side)."""
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    for part in ("labels", "annotations"):
        meta[part] = {**(meta.get(part) or {}), **((extra or {}).get(part) or {})}
    meta["managedFields"] = [*(others or []), {
        "manager": manager, "operation": operation, "apiVersion": "admissionregistration.k8s.io/v1",
        "time": "2026-12-05T08:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": _fields(meta["labels"]), "f:annotations": _fields(meta["annotations"])},
                     "f:spec": {"f:failurePolicy": {}}}}]
    return obj


def _shared(body: dict) -> dict:
    return next(o for o in desired_objects(body) if obj_key(o) == SHARED_VAP)


def test_a_shared_admission_object_is_the_installs_by_its_label_whoever_manages_it():
    body = policy_body()
    by_helm = installed(_shared(body), "helm", "Apply", HELM_META)
    assert compare.is_shared(by_helm) and compare.is_ours(by_helm, "any", None)
    # Helm's managed-by label and release annotations, or any other label, are the installer's: not drift.
    assert compare.differences(_shared(body), by_helm) == []
    unlabelled = copy.deepcopy(by_helm)
    del unlabelled["metadata"]["labels"][compare.SHARED_LABEL]
    assert not compare.is_shared(unlabelled) and not compare.is_ours(unlabelled, NAME, UID)
    changed = copy.deepcopy(by_helm)
    changed["spec"]["failurePolicy"] = "Ignore"
    assert compare.differences(_shared(body), changed) == ["spec.failurePolicy"]


def test_the_installer_of_a_shared_object_is_the_manager_that_set_the_install_label():
    want = _shared(policy_body())
    status = {"manager": "validatingadmissionpolicy-status", "operation": "Apply", "subresource": "status",
              "fieldsV1": {"f:status": {"f:typeChecking": {}}}}
    helm = compare.installer_of(installed(want, "helm", "Apply", HELM_META, others=[status]))
    assert (helm.manager, helm.server_side) == ("helm", True)
    assert helm.labels == {**want["metadata"]["labels"], MANAGED_BY_LABEL: "Helm"}
    assert helm.annotations == {**want["metadata"]["annotations"], **HELM_META["annotations"]}
    # A label set by somebody else is not the installer's to write again.
    other = installed(want, "kubectl", "Apply")
    other["metadata"]["labels"]["team"] = "x"
    assert "team" not in compare.installer_of(other).labels
    # Client-side kubectl apply: a whole-object writer, whose record of what it applied is the object's own.
    client_side = installed(want, "kubectl-client-side-apply", "Update",
                            {"annotations": {compare.LAST_APPLIED: "{...}"}})
    own = compare.installer_of(client_side)
    assert (own.manager, own.server_side, own.annotations[compare.LAST_APPLIED]) == (
        "kubectl-client-side-apply", False, "{...}")
    assert compare.LAST_APPLIED not in compare.installer_of(client_side, same_object=False).annotations
    # Of two server-side appliers, the later: its apply is what the next upgrade repeats.
    both = installed(want, "kubectl", "Apply")
    both["metadata"]["managedFields"].append({**both["metadata"]["managedFields"][0], "manager": "argocd-controller",
                                              "time": "2026-12-05T09:00:00Z"})
    assert compare.installer_of(both).manager == "argocd-controller"
    # No record (an emulator): the copy's labels and annotations, the operator's own name.
    bare = compare.installer_of({**want, "metadata": {**want["metadata"], "labels": {"a": "b"}}})
    assert (bare.manager, bare.labels) == (None, {"a": "b"})
    # Nothing known at all: written as the render prints it.
    assert compare.as_installed(want, compare.Installer())["metadata"] == {
        k: want["metadata"][k] for k in ("name", "labels", "annotations")}


def _helm_installed(body: dict, allow) -> tuple[FakeApi, OperatorState]:
    objects = [installed(o, "helm", "Apply", HELM_META) if compare.is_shared(o) else o for o in desired_objects(body)]
    api = FakeApi(*objects, policy=body, allow=allow | {"patch_status"})
    state = make_state(api)
    run(pass_of(state, "resync"))
    assert api.writes == [("patch_status", *api.writes[0][1:])]  # Helm's labels are not drift: only the status
    api.calls.clear()
    api.allow = set(allow)
    return api, state


def test_a_deleted_shared_policy_is_put_back_as_its_installer_wrote_it_in_its_name():
    api, state = _helm_installed(policy_body(), READS | {"apply", "patch_status"})
    gone = api.objects.pop(SHARED_VAP)
    state.children.remembered[SHARED_VAP] = gone  # what the watch last held of it
    sink = Sink()
    run(pass_of(state, "drift", sink))
    assert api.managers == [("apply", SHARED_VAP, "helm")]
    back = api.objects[SHARED_VAP]
    assert (back["metadata"]["labels"], back["metadata"]["annotations"], back["spec"]) == (
        gone["metadata"]["labels"], gone["metadata"]["annotations"], gone["spec"])
    assert sink.reasons() == [("Normal", cond.EVENT_DRIFT_CORRECTED)] and api.policy["status"]["driftCorrections"] == 1


def test_a_shared_policy_the_operator_never_saw_is_put_back_as_the_other_shared_objects_installer_wrote_them():
    api, state = _helm_installed(policy_body(), READS | {"apply", "patch_status"})
    api.objects.pop(SHARED_VAP)  # gone before the operator started: nothing remembered
    run(pass_of(state, "drift"))
    assert api.managers == [("apply", SHARED_VAP, "helm")]
    assert api.objects[SHARED_VAP]["metadata"]["labels"][MANAGED_BY_LABEL] == "Helm"


def test_a_hand_edit_of_a_shared_policys_spec_goes_back_by_an_apply_in_its_installers_name():
    api, state = _helm_installed(policy_body(), READS | {"apply", "patch_status"})
    want = copy.deepcopy(api.objects[SHARED_VAP]["spec"])
    _edit(api, SHARED_VAP, lambda o: o["spec"].update(failurePolicy="Ignore"))
    run(pass_of(state, "drift"))
    assert api.managers == [("apply", SHARED_VAP, "helm")] and api.objects[SHARED_VAP]["spec"] == want


def test_a_shared_policy_of_a_whole_object_writer_is_put_back_by_a_create_in_its_name():
    body = policy_body()
    objects = [installed(o, "kubectl-client-side-apply", "Update", {"annotations": {compare.LAST_APPLIED: "{}"}})
               if compare.is_shared(o) else o for o in desired_objects(body)]
    api = FakeApi(*objects, policy=body, allow=READS | {"create", "patch_status"})
    state = make_state(api)
    run(pass_of(state, "resync"))
    api.managers.clear()
    state.children.remembered[SHARED_VAP] = api.objects.pop(SHARED_VAP)
    run(pass_of(state, "drift"))
    assert api.managers == [("create", SHARED_VAP, "kubectl-client-side-apply")]
    assert api.objects[SHARED_VAP]["metadata"]["annotations"][compare.LAST_APPLIED] == "{}"


def test_a_shared_name_held_without_the_install_label_is_a_conflict_named_for_its_kind():
    body = policy_body()
    objects = desired_objects(body)
    for obj in objects:
        if obj_key(obj) == SHARED_VAP:
            del obj["metadata"]["labels"][compare.SHARED_LABEL]
    api = FakeApi(*objects, policy=body, allow=READS | {"patch_status"})
    done = run(pass_of(make_state(api), "resync"))
    assert done.findings.conflicts == [
        f"ValidatingAdmissionPolicy {SHARED_VAP[2]} exists and is not the install's shared admission object "
        "(no label katasizing.dev/shared=admission); left untouched"]
    conditions = {c["type"]: c for c in api.policy["status"]["conditions"]}
    assert conditions["Ready"]["reason"] == conditions["Conflict"]["reason"] == "UnmanagedAdmissionPolicy"


# --- conditions and status -------------------------------------------------------------------


def test_merge_conditions_keeps_the_transition_time_unless_the_status_flips():
    before = KataSizingPolicyStatus.model_validate({"conditions": [
        {"type": "Ready", "status": "True", "reason": "InSync", "message": "", "lastTransitionTime": "T0"},
        {"type": "Valid", "status": "True", "reason": "PolicyValid", "message": "", "lastTransitionTime": "T0"},
    ]}).conditions
    now = [
        cond.condition("Ready", False, "Conflict", "x", 2),
        cond.condition("Valid", True, "PolicyValid", "a new message", 2),
        cond.condition("Conflict", True, "UnmanagedRuntimeClass", "x", 2),
    ]
    merged = {c.type: c for c in cond.merge_conditions(before, now, "T1")}
    assert merged["Ready"].last_transition_time == "T1"
    assert merged["Valid"].last_transition_time == "T0"
    assert merged["Valid"].message == "a new message" and merged["Valid"].observed_generation == 2
    assert merged["Conflict"].last_transition_time == "T1"
    assert cond.merge_conditions([], now, "T2")[0].last_transition_time == "T2"


def _status(result: st.Findings, body: dict | None = None) -> dict[str, dict]:
    body = body or policy_body()
    sizing = None if result.invalid else size_policy(parse_policy(body))
    status = st.status_fields(st.compute_status(st.read_status(body), 1, result, sizing))
    assert status["observedGeneration"] == 1
    return {c["type"]: c for c in status["conditions"]}


@pytest.mark.parametrize("result, expected", [
    (st.Findings(), {"Valid": ("True", cond.REASON_VALID), "Conflict": ("False", cond.REASON_NO_CONFLICT),
                     "InSync": ("True", cond.REASON_IN_SYNC), "Ready": ("True", cond.REASON_IN_SYNC)}),
    (st.Findings(invalid=["spec.classes[0] (s): podFixed.memory 1Mi must be above overhead_memory 2Mi"]),
     {"Valid": ("False", cond.REASON_INVALID), "InSync": ("False", cond.REASON_NOT_APPLIED),
      "Ready": ("False", cond.REASON_INVALID)}),
    (st.Findings(conflicts=["RuntimeClass kata-qemu-rs-m exists and is not managed"]),
     {"Valid": ("True", cond.REASON_VALID), "Conflict": ("True", cond.REASON_CONFLICT),
      "InSync": ("False", cond.REASON_CONFLICT), "Ready": ("False", cond.REASON_CONFLICT)}),
    (st.Findings(missing=["kata-qemu-rs-m"]),
     {"InSync": ("False", cond.REASON_RUNTIME_CLASS_MISSING), "Ready": ("False", cond.REASON_RUNTIME_CLASS_MISSING)}),
    (st.Findings(failed=['ConfigMap x/y: namespaces "x" not found']),
     {"InSync": ("False", cond.REASON_OUTPUT_NAMESPACE_MISSING),
      "Ready": ("False", cond.REASON_OUTPUT_NAMESPACE_MISSING)}),
    (st.Findings(drifted=["RuntimeClass kata-qemu-rs-m: overhead.podFixed"]),
     {"InSync": ("False", cond.REASON_DRIFT_REPORTED), "Ready": ("False", cond.REASON_DRIFT_REPORTED)}),
], ids=["valid", "invalid", "conflict", "missing", "namespace-missing", "drifted"])
def test_compute_status(result, expected):
    conditions = _status(result)
    for type_, (status, reason) in expected.items():
        assert (conditions[type_]["status"], conditions[type_]["reason"]) == (status, reason), type_
    for message in result.invalid + result.conflicts + result.drifted + result.missing + result.failed:
        assert any(message in c["message"] for c in conditions.values())


def test_an_invalid_pass_keeps_the_last_valid_classes_in_status():
    body = policy_body()
    valid = st.compute_status(KataSizingPolicyStatus(), 1, st.Findings(), size_policy(parse_policy(body)))
    status = st.compute_status(valid, 2, st.Findings(invalid=["x"]), None)
    assert status.classes == valid.classes and [c.name for c in status.classes] == ["s", "m", "l", "xl"]
    assert st.status_fields(status)["classes"] == st.status_fields(valid)["classes"]


def test_the_status_is_written_as_the_crd_holds_it():
    """Dumped once, by the API's names, without the nulls of unset fields; a field the status does
    not have is null (a merge patch removes it); a status read back is the same status."""
    body = policy_body()
    status = st.compute_status(KataSizingPolicyStatus(), 1, st.Findings(), size_policy(parse_policy(body)))
    fields = st.status_fields(status)
    assert fields["observedGeneration"] == 1 and fields["classNames"] == "s,m,l,xl"
    assert fields["measurement"] is None and fields["proposal"] is None and fields["podAudit"] is None
    assert "driftCorrections" not in fields  # the counters are written by increments
    assert fields["classes"][1] == {
        "name": "m", "runtimeClass": "kata-qemu-rs-m", "podFixed": {"cpu": "250m", "memory": "908Mi"},
        "overheadVcpus": "0.2", "overheadMemory": "858Mi", "defaultVcpus": 1, "defaultMemory": "256Mi",
        "largestVm": {"vcpus": 3, "memoryMiB": 4954}}
    assert "null" not in str(fields["classes"]) and None not in fields["conditions"][0].values()
    read_back = st.read_status({"status": {k: v for k, v in fields.items() if v is not None}})
    assert not st.status_changed(status, read_back)


# --- passes ----------------------------------------------------------------------------------


ALL_WRITES = READS | {"create", "patch_status"}


def test_first_pass_creates_every_object_and_writes_status_once():
    body = policy_body()
    api = FakeApi(policy=body, allow=ALL_WRITES)
    sink = Sink()
    landed: list[str] = []
    done = run(pass_of(make_state(api), "apply", sink, landed))
    wanted = desired_objects(body)
    assert sorted(c[1] for c in api.written("create")) == sorted(obj_key(o) for o in wanted)
    assert len(landed) == len(wanted) and all(text.startswith("created ") for text in landed)
    assert [c[0] for c in api.writes].count("patch_status") == 1
    assert sink.reasons() == [("Normal", cond.EVENT_APPLIED)]
    assert done.result == "ok"


def test_a_resync_of_a_policy_in_sync_makes_no_request_and_no_event():
    body = policy_body()
    first = in_sync_cluster(body, allow=READS | {"patch_status"})
    state = make_state(first)
    run(pass_of(state, "resync"))

    api = in_sync_cluster(first.policy)  # reads only: any write raises
    state = make_state(api)
    sink = Sink()
    done = run(pass_of(state, "resync", sink))
    assert api.calls == [] and sink.events == [] and done.findings.writes == []


def test_an_invalid_policy_touches_no_child_and_says_so_once():
    body = policy_body(classes=[{"name": "s", "cpu": "1", "memory": "1Gi", "overheadVcpus": "0.2",
                                 "overheadMemory": "300Mi", "podFixed": {"cpu": "1", "memory": "100Mi"}}])
    api = FakeApi(policy=body, allow={"patch_status"})
    sink = Sink()
    done = run(pass_of(make_state(api), "apply", sink))
    assert done.findings.invalid and "podFixed.memory 100Mi must be above overhead_memory 300Mi" in done.findings.invalid[0]
    assert sink.reasons() == [("Warning", cond.EVENT_INVALID)]

    again = FakeApi(policy=api.policy, allow=set())
    sink = Sink()
    run(pass_of(make_state(again), "resync", sink))
    assert sink.events == [] and again.calls == []


def _theirs_m(body: dict) -> FakeApi:
    theirs = {"kind": "RuntimeClass", "apiVersion": "node.k8s.io/v1", "metadata": {"name": "kata-qemu-rs-m"},
              "handler": "kata-qemu-rs-m"}
    objects = [o for o in desired_objects(body) if o["metadata"]["name"] != "kata-qemu-rs-m"]
    return FakeApi(theirs, *objects, policy=body, allow=READS | {"patch_status"})


def test_an_unmanaged_runtime_class_is_never_written_and_a_conflict_in_status_is_said_once():
    body = policy_body()
    api = _theirs_m(body)
    before = copy.deepcopy(api.objects[("RuntimeClass", None, "kata-qemu-rs-m")])
    sink = Sink()
    done = run(pass_of(make_state(api), "resync", sink))
    assert api.objects[("RuntimeClass", None, "kata-qemu-rs-m")] == before
    assert len(done.findings.conflicts) == 1 and "kata-qemu-rs-m" in done.findings.conflicts[0]
    assert (("Warning", cond.EVENT_CONFLICT)) in sink.reasons()

    quiet = _theirs_m(api.policy)
    quiet.allow = set(READS)
    sink = Sink()
    run(pass_of(make_state(quiet), "resync", sink))
    assert [r for r in sink.reasons() if r[1] == cond.EVENT_CONFLICT] == [] and quiet.writes == []


def _edit(api: FakeApi, key: tuple, change) -> None:
    obj = api.objects[key]
    change(obj)
    obj["metadata"]["resourceVersion"] = str(next(api._versions))


def _pod_fixed_1mi(obj: dict) -> None:
    obj["overhead"]["podFixed"]["memory"] = "1Mi"


def _settled(body: dict, allow=READS) -> tuple[FakeApi, OperatorState]:
    """A cluster in sync whose operator has run its first pass (so it knows what it wanted)."""
    api = in_sync_cluster(body, allow=allow | {"patch_status"})
    state = make_state(api)
    run(pass_of(state, "resync"))
    api.calls.clear()
    api.allow = set(allow)
    return api, state


def test_a_hand_edit_is_put_back_by_the_drift_pass_and_counted():
    api, state = _settled(policy_body(), allow=READS | {"replace", "patch_status"})
    key = ("RuntimeClass", None, "kata-qemu-rs-m")
    want = copy.deepcopy(api.objects[key]["overhead"])
    _edit(api, key, _pod_fixed_1mi)
    sink = Sink()
    run(pass_of(state, "drift", sink))
    assert api.objects[key]["overhead"] == want
    assert [c[0] for c in api.writes] == ["replace", "patch_status"]  # the object, then the counter
    assert sink.reasons() == [("Normal", cond.EVENT_DRIFT_CORRECTED)]
    assert api.policy["status"]["driftCorrections"] == 1


def test_a_stale_event_for_an_object_already_right_writes_and_counts_nothing():
    api, state = _settled(policy_body(), allow=READS | {"replace"})
    key = ("RuntimeClass", None, "kata-qemu-rs-m")
    right = copy.deepcopy(api.objects[key])
    _edit(api, key, _pod_fixed_1mi)
    # The pass reads the edited object, then somebody puts it back before the write lands.
    original_replace = api.replace

    async def raced(body):
        api.objects[key] = api._stamped(right)
        return await original_replace(body)

    api.replace = raced
    sink = Sink()
    run(pass_of(state, "drift", sink))
    assert [c[0] for c in api.calls] == ["replace", "read"]  # 409, re-read, already right: done
    assert sink.events == [] and "driftCorrections" not in api.policy["status"]


def test_a_deleted_object_is_recreated_and_counted():
    api, state = _settled(policy_body(), allow=READS | {"create", "patch_status"})
    key = ("ConfigMap", NAMESPACE, f"{NAME}-dropins")
    api.objects.pop(key)
    run(pass_of(state, "drift"))
    assert key in api.objects and api.policy["status"]["driftCorrections"] == 1


def test_report_mode_reports_and_counts_once_and_writes_only_status():
    api, state = _settled(policy_body(driftPolicy="Report"), allow=READS | {"patch_status"})
    key = ("RuntimeClass", None, "kata-qemu-rs-s")
    _edit(api, key, _pod_fixed_1mi)
    sink = Sink()
    done = run(pass_of(state, "drift", sink))
    assert done.findings.drifted and "kata-qemu-rs-s" in done.findings.drifted[0]
    assert {c[0] for c in api.writes} == {"patch_status"}
    assert sink.reasons() == [("Warning", cond.EVENT_DRIFT_DETECTED)]
    assert api.policy["status"]["driftDetected"] == 1
    run(pass_of(state, "resync", sink))
    assert sink.reasons() == [("Warning", cond.EVENT_DRIFT_DETECTED)], "the same drift was reported twice"
    assert api.policy["status"]["driftDetected"] == 1


def test_an_object_that_is_not_ours_is_never_touched():
    body = policy_body()
    api, state = _settled(body, allow=READS | {"patch_status"})
    key = ("RuntimeClass", None, "kata-qemu-rs-m")
    api.objects[key] = api._stamped({"kind": "RuntimeClass", "handler": "kata-qemu-rs-m",
                                     "metadata": {"name": "kata-qemu-rs-m", "labels": {"team": "x"}},
                                     "overhead": {"podFixed": {"cpu": "1", "memory": "1Gi"}}})
    theirs = copy.deepcopy(api.objects[key])
    run(pass_of(state, "drift"))
    assert api.objects[key] == theirs
    assert [c[0] for c in api.writes] == ["patch_status"]
    assert {c["type"]: c["status"] for c in api.policy["status"]["conditions"]}["Conflict"] == "True"


def test_creating_a_policy_reads_none_of_its_objects():
    # Every RuntimeClass and admission object is cached; a ConfigMap missing from the
    # label-selected cache is taken as absent (a create that finds it taken reads it then).
    api = FakeApi(policy=policy_body(), allow=ALL_WRITES)
    run(pass_of(make_state(api), "apply"))
    assert [c for c in api.calls if c[0] == "read"] == []
    assert len(api.written("create", "ConfigMap")) == 3  # values, drop-ins (with the admission parameters), guidance


def test_a_binding_is_created_after_its_admission_policy_and_its_parameters(monkeypatch):
    # The API server refuses a binding with a paramRef whose policy it cannot find (422), and a
    # binding whose parameters do not exist denies every pod of the policy's classes. With a
    # slot for every write, nothing but that order keeps a binding back.
    from kata_sizing.controller import execute

    monkeypatch.setattr(execute, "WRITES_PER_PASS", 64)
    api = FakeApi(policy=policy_body(), allow=ALL_WRITES)
    original, events = api.create, []

    async def create(body):  # every create takes a while: the order is what the executor waits for
        events.append(("start", obj_key(body)))
        await asyncio.sleep(0.02)
        created = await original(body)
        events.append(("end", obj_key(body)))
        return created

    api.create = create
    run(pass_of(make_state(api), "apply"))
    bindings = [k for what, k in events if what == "start" and k[0].endswith("Binding")]
    assert len(bindings) == 6  # the policy's three, and the install's keep-alive binding of each shared policy
    for binding in bindings:
        body = api.objects[binding]
        policy = (binding[0].removesuffix("Binding"), None, body["spec"]["policyName"])
        started = events.index(("start", binding))
        assert events.index(("end", policy)) < started, events
        if binding[2] in podfit.KEEP_ALIVE_NAMES.values():
            continue  # its parameters are nobody's: it matches no object and never reads them
        params = ("ConfigMap", body["spec"]["paramRef"]["namespace"], body["spec"]["paramRef"]["name"])
        assert events.index(("end", params)) < started, events


def test_passes_of_two_policies_at_once_create_each_shared_admission_policy_once():
    # A cold start runs every policy's pass at once, and each finds the shared admission policies
    # missing: one create serves them all, not one create and a 409 and a read per policy.
    api = FakeApi(policy=policy_body(), allow=ALL_WRITES)
    other = example()
    other["metadata"].update(name="other", uid="0b7d6a51-3c1f-4e8e-a3a5-2f1d9c0e7b12", generation=1)
    api._store(api._stamped({**other, "kind": KIND}))
    original = api.create

    async def create(body):
        await asyncio.sleep(0.02)
        return await original(body)

    api.create = create
    state = make_state(api)

    async def both():
        seen(state, api.policy)
        seen(state, copy.deepcopy(api.objects[policy_key("other")]))
        state.events = lambda ref, type_, reason, message: None
        await asyncio.gather(rc.run_pass(state, NAME, "apply"), rc.run_pass(state, "other", "apply"))

    run(both())
    install = {*podfit.SHARED_NAMES.values(), *podfit.KEEP_ALIVE_NAMES.values()}
    shared = [c[1] for c in api.written("create") if c[1][2] in install and c[1][1] is None]
    assert sorted(shared) == sorted(set(shared)) and len(shared) == 6, shared
    assert [c for c in api.calls if c[0] == "read"] == []
    bindings = [k for k in api.objects if k[0].endswith("PolicyBinding")]
    assert len(bindings) == 9  # three of each policy, and the three keep-alive ones


def test_a_config_map_of_somebody_else_is_found_by_the_create_and_then_read_until_the_name_is_free():
    key = ("ConfigMap", NAMESPACE, f"{NAME}-kata-deploy-values")
    theirs = {"kind": "ConfigMap", "apiVersion": "v1", "data": {"a": "b"},
              "metadata": {"name": key[2], "namespace": NAMESPACE, "labels": {"team": "x"}}}
    api = FakeApi(theirs, policy=policy_body(), allow=ALL_WRITES)
    stored = copy.deepcopy(api.objects[key])
    state = make_state(api)
    sink = Sink()
    done = run(pass_of(state, "apply", sink))
    # The create finds the name taken (409), the re-read finds somebody else's: never written.
    assert [c[0] for c in api.calls if c[1:] == (key,)] == ["create", "read"]
    assert api.objects[key] == stored
    assert done.findings.conflicts == [f"ConfigMap {NAMESPACE}/{key[2]} exists and is not managed by this policy; "
                                       "left untouched"]
    assert {c["type"]: c["status"] for c in api.policy["status"]["conditions"]}["Conflict"] == "True"
    assert ("Warning", cond.EVENT_CONFLICT) in sink.reasons()

    # A later pass knows the name is taken: it reads it, plans the same conflict, writes nothing.
    api.calls.clear()
    api.allow = set(READS)
    sink = Sink()
    done = run(pass_of(state, "resync", sink))
    assert [c[0] for c in api.calls if c[1:] == (key,)] == ["read"]
    assert api.writes == [] and sink.events == [] and len(done.findings.conflicts) == 1

    # Once the other ConfigMap is gone, the pass that reads the name free creates ours, and the
    # passes after it read nothing.
    del api.objects[key]
    api.calls.clear()
    api.allow = set(ALL_WRITES)
    run(pass_of(state, "resync"))
    assert [c[0] for c in api.calls if c[1:] == (key,)] == ["read", "create"]
    assert api.objects[key]["metadata"]["labels"][POLICY_LABEL] == NAME
    assert {c["type"]: c["status"] for c in api.policy["status"]["conditions"]}["Conflict"] == "False"
    api.calls.clear()
    run(pass_of(state, "resync"))
    assert [c for c in api.calls if c[0] == "read"] == []


def test_kata_deploy_mode_guards_without_owning():
    body = policy_body(runtimeClass={**example()["spec"]["runtimeClass"], "managedBy": "KataDeploy"})
    policy = parse_policy(body)
    desired = build_desired(policy, render_policy(policy), body)
    # The operator owns what it creates: the ConfigMaps and the admission objects, not the chart's classes.
    assert {k[0] for k in desired.owned} == {"ConfigMap", *ADMISSION_KINDS}
    assert {k[2] for k in desired.guarded} == {f"kata-qemu-rs-{c}" for c in ("s", "m", "l", "xl")}
    for obj in desired.guarded.values():
        assert "ownerReferences" not in obj["metadata"]
        assert obj["metadata"]["labels"][POLICY_LABEL] == NAME


def test_two_policies_with_the_same_names_each_keep_their_own_objects():
    first, second = policy_body(), policy_body()
    second["metadata"].update(name="copycat", uid="0e3c9a4e-0000-4000-8000-000000000002")
    second["spec"]["runtimeClass"] = {**second["spec"]["runtimeClass"], "namePrefix": "kata-qemu-rs"}
    cache = DesiredCache()
    for body in (first, second):
        policy = parse_policy(body)
        cache.put(build_desired(policy, render_policy(policy), body))
    key = ("RuntimeClass", None, "kata-qemu-rs-m")
    ours = cache.by_policy[NAME].owned[key]
    assert cache.for_child(key, ours).policy_name == NAME
    cache.drop("copycat")
    assert cache.for_child(key).policy_name == NAME
    cache.put(build_desired(parse_policy(second), render_policy(parse_policy(second)), second))
    cache.drop(NAME)
    assert cache.for_child(key).policy_name == "copycat"


def test_a_policy_warning_is_an_event_once_and_stays_in_status():
    # Worked-example class m: podFixed 160Mi is below default_memory 1Gi + host: pods without
    # limits are under-accounted. Valid, but said in status and once as a Warning event.
    body = policy_body(classes=[{"name": "m", "cpu": "2", "memory": "2Gi", "overheadVcpus": "0.5",
                                 "overheadMemory": "128Mi", "defaultVcpus": 2, "defaultMemory": "1024Mi",
                                 "podFixed": {"cpu": "600m", "memory": "160Mi"}}])
    api = FakeApi(policy=body, allow=ALL_WRITES)
    sink = Sink()
    run(pass_of(make_state(api), "apply", sink))
    assert ("Warning", cond.EVENT_WARNING) in sink.reasons()
    (warning,) = api.policy["status"]["warnings"]
    assert "podFixed.memory 160Mi is below default_memory 1Gi + host memory 50Mi" in warning
    assert {c["type"]: c["status"] for c in api.policy["status"]["conditions"]}["Valid"] == "True"

    again = in_sync_cluster(api.policy)
    sink = Sink()
    run(pass_of(make_state(again), "resync", sink))
    assert sink.events == [] and again.writes == []


# --- what the executor reports: refusals, a missing namespace, failures mid-pass ---------------


def test_an_admission_object_the_server_refuses_is_said_in_status_and_the_rest_is_written():
    body = policy_body()
    api = FakeApi(policy=body, allow=ALL_WRITES)
    # A server whose CEL library lacks a function the rule uses answers 422 on the policy.
    api.fail["create"] = [Invalid(422, "spec.validations[0].expression: compilation failed")]
    api.create = _fail_first_admission_create(api)
    done = run(pass_of(make_state(api), "apply"))
    assert len(api.written("create", "RuntimeClass")) == 4
    # The refused one and 8 more (the policy's 3 bindings, the install's 3 policies and 3 keep-alive bindings).
    assert len([c for c in api.written("create") if c[1][0] in ADMISSION_KINDS]) == 9
    assert len([k for k in api.objects if k[0] in ADMISSION_KINDS]) == 8
    conditions = {c["type"]: c for c in api.policy["status"]["conditions"]}
    assert conditions["InSync"]["status"] == "False" and conditions["InSync"]["reason"] == cond.REASON_REFUSED
    assert "compilation failed" in conditions["InSync"]["message"] and done.findings.refused


def test_a_configmap_the_operator_may_not_write_there_is_said_in_status_and_not_retried_in_a_loop():
    """The chart's rbac.outputNamespaces leaves out the namespace a policy names: 403 on its
    ConfigMaps, said in status (RefusedByServer), the other objects written."""
    body = policy_body()
    api = FakeApi(policy=body, allow=ALL_WRITES)
    forbidden = 'configmaps is forbidden: User "system:serviceaccount:kata-sizing:kata-sizing" cannot create resource'
    original = api.create

    async def create(obj):
        if obj["kind"] == "ConfigMap":
            api.calls.append(("create", obj_key(obj)))
            raise PermanentApiError(403, forbidden)
        return await original(obj)

    api.create = create
    done = run(pass_of(make_state(api), "apply"))  # no exception: nothing to retry soon
    assert len(api.written("create", "RuntimeClass")) == 4
    assert len([c for c in api.calls if c[0] == "create" and c[1][0] == "ConfigMap"]) == 3  # each tried once
    conditions = {c["type"]: c for c in api.policy["status"]["conditions"]}
    assert conditions["InSync"]["reason"] == cond.REASON_REFUSED and forbidden in conditions["InSync"]["message"]
    # The bindings wait for their parameters, refused with them (a binding without its
    # parameters would judge nothing); the install's keep-alive bindings read none.
    assert sorted(c[1][2] for c in api.calls if c[0] == "create" and c[1][0].endswith("Binding")) == sorted(
        podfit.KEEP_ALIVE_NAMES.values())
    assert conditions["Ready"]["status"] == "False" and len(done.findings.refused) == 3 + 3


def _fail_first_admission_create(api: FakeApi):
    original = api.create
    errors = api.fail.pop("create")

    async def create(body):
        if body["kind"] in ADMISSION_KINDS and errors:
            api.calls.append(("create", obj_key(body)))
            raise errors.pop(0)
        return await original(body)

    return create


def test_a_missing_output_namespace_is_in_status_with_the_servers_message_and_is_not_retried_in_a_loop():
    body = policy_body(output={"namespace": "not-yet"})
    api = FakeApi(policy=body, allow=ALL_WRITES, namespaces=())
    sink = Sink()
    landed: list[str] = []
    with pytest.raises(RetryLater, match='namespaces "not-yet" not found'):
        run(pass_of(make_state(api), "apply", sink, landed))
    configmap_creates = api.written("create", "ConfigMap")
    assert len(configmap_creates) == 3, "each ConfigMap is tried once a pass, not five times"
    # The other objects are written, and counted as written: the RuntimeClasses and the shared
    # admission policies with their keep-alive bindings. Not the policy's bindings: without their
    # parameters they would deny every pod of the classes.
    assert len(api.written("create", "RuntimeClass")) == 4
    own = f"kata-sizing-{NAME}-"
    assert len(landed) == 4 + 3 + 3 and not [t for t in landed if "ConfigMap" in t or own in t]
    assert [c for c in api.calls if c[0] == "create" and c[1][2].startswith(own)] == []
    status = api.policy["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["InSync"]["reason"] == cond.REASON_OUTPUT_NAMESPACE_MISSING
    assert 'namespaces "not-yet" not found' in conditions["InSync"]["message"]
    assert conditions["Ready"]["status"] == "False" and status["observedGeneration"] == 1
    assert ("Warning", cond.EVENT_WRITE_FAILED) in sink.reasons()
    assert "still conflicting" not in str(sink.events)


def test_a_pass_that_fails_midway_reports_the_writes_that_landed_and_counts_its_corrections():
    api, state = _settled(policy_body(), allow=READS | {"replace", "patch_status"})
    for name in ("kata-qemu-rs-s", "kata-qemu-rs-m", "kata-qemu-rs-l"):
        _edit(api, ("RuntimeClass", None, name), _pod_fixed_1mi)
    original = api.replace

    async def replace(body):
        if body["metadata"]["name"] == "kata-qemu-rs-l":
            api.calls.append(("replace", obj_key(body)))
            raise TransientApiError(503, "replace RuntimeClass kata-qemu-rs-l: unavailable")
        return await original(body)

    api.replace = replace
    landed: list[str] = []
    with pytest.raises(TransientApiError):
        run(pass_of(state, "drift", landed=landed))
    assert sorted(landed) == ["updated RuntimeClass kata-qemu-rs-m", "updated RuntimeClass kata-qemu-rs-s"]
    # The two corrections that landed are counted now; the retry finds only the third to do.
    assert api.policy["status"]["driftCorrections"] == 2
    api.replace = original
    run(pass_of(state, "drift"))
    assert api.policy["status"]["driftCorrections"] == 3


def test_at_most_writes_per_pass_are_in_flight_at_once():
    body = policy_body()
    api = FakeApi(policy=body, allow=ALL_WRITES)
    original, in_flight, peak = api.create, [0], [0]

    async def create(body):
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(0.01)
        in_flight[0] -= 1
        return await original(body)

    api.create = create
    run(pass_of(make_state(api), "apply"))
    assert peak[0] == WRITES_PER_PASS


# --- the drift counters ------------------------------------------------------------------


def test_a_counter_update_that_lost_a_race_is_retried_and_the_count_is_exact():
    api, state = _settled(policy_body(), allow=READS | {"replace", "patch_status"})
    api.objects[policy_key(NAME)]["status"]["driftCorrections"] = 2  # counted by an earlier pass
    state.records[NAME].body["status"]["driftCorrections"] = 2
    _edit(api, ("RuntimeClass", None, "kata-qemu-rs-m"), _pod_fixed_1mi)
    # Between the read and the patch somebody else added one (another replica's last pass).
    original = api.patch_status

    async def patch_status(key, patch):
        if isinstance(patch, list) and not getattr(patch_status, "raced", False):
            patch_status.raced = True
            api.objects[policy_key(NAME)]["status"]["driftCorrections"] = 3
        return await original(key, patch)

    api.patch_status = patch_status
    run(pass_of(state, "drift"))
    assert api.policy["status"]["driftCorrections"] == 4
    patches = [c[2] for c in api.calls if c[0] == "patch_status" and isinstance(c[2], list)]
    assert len(patches) == 2 and patches[-1][0] == {"op": "test", "path": "/status/driftCorrections", "value": 3}


def test_a_pass_that_corrects_drift_and_changes_status_writes_the_status_once():
    api, state = _settled(policy_body(), allow=READS | {"replace", "patch_status"})
    classes = copy.deepcopy(api.policy["status"]["classes"])
    for body in (api.objects[policy_key(NAME)], state.records[NAME].body):
        del body["status"]["classes"]  # a status the pass must write again
    state.records[NAME].status = None
    _edit(api, ("RuntimeClass", None, "kata-qemu-rs-m"), _pod_fixed_1mi)
    run(pass_of(state, "drift"))
    assert [c[0] for c in api.writes] == ["replace", "patch_status"]  # the object, then status and counter together
    assert api.policy["status"]["classes"] == classes and api.policy["status"]["driftCorrections"] == 1


def test_ten_hand_edits_in_a_row_count_ten_whatever_the_passes_between_them():
    api, state = _settled(policy_body(), allow=READS | {"replace", "patch_status"})
    names = ["kata-qemu-rs-s", "kata-qemu-rs-m", "kata-qemu-rs-l", "kata-qemu-rs-xl"]
    for i in range(10):
        _edit(api, ("RuntimeClass", None, names[i % 4]), _pod_fixed_1mi)
        # Whichever pass runs first puts it back: a drift event's, the resync's or the guidance's.
        run(pass_of(state, ("drift", "resync")[i % 2]))
        run(pass_of(state, "resync"))
    assert api.policy["status"]["driftCorrections"] == 10


# --- the pod audit in status ------------------------------------------------------------------------


def _finding(pod: str, rule: str = "pod-envelope-exceeded", class_name: str = "s") -> dict:
    return {"pod": pod, "runtimeClass": f"kata-qemu-rs-{class_name}", "class": class_name, "rule": rule,
            "action": "Deny", "message": f"{pod} is too big"}


def test_pod_audit_status_counts_every_pod_and_lists_a_bounded_sorted_few():
    findings = [_finding(f"ns/pod-{i:03d}") for i in range(st.POD_AUDIT_LISTED + 10)]
    findings += [_finding("ns/pod-000", "pod-memory-limit-missing"), _finding("a/x", class_name="m")]
    audit = st.pod_audit_status(findings).model_dump(by_alias=True)
    assert audit["pods"] == st.POD_AUDIT_LISTED + 11
    assert audit["counts"] == [
        {"class": "m", "rule": "pod-envelope-exceeded", "pods": 1},
        {"class": "s", "rule": "pod-envelope-exceeded", "pods": st.POD_AUDIT_LISTED + 10},
        {"class": "s", "rule": "pod-memory-limit-missing", "pods": 1},
    ]
    assert len(audit["listed"]) == st.POD_AUDIT_LISTED and audit["truncated"] is True
    assert [r["pod"] for r in audit["listed"][:3]] == ["a/x", "ns/pod-000", "ns/pod-000"]


def test_the_pod_audit_event_is_posted_when_the_list_changes_and_not_again_after_a_restart():
    said = st.Announcements({})
    one = st.pod_audit_status([_finding("ns/a")])
    assert st.pod_audit_event(said, None, one)
    assert st.pod_audit_event(said, None, one) is None  # the status write has not come back yet
    assert "1 Kata pod(s) outside their class (1 pod-envelope-exceeded on class s)" in st.pod_audit_event(
        st.Announcements({}), None, one)[2]
    two = st.pod_audit_status([_finding("ns/a"), _finding("ns/b")])
    assert st.pod_audit_event(said, one, two)
    assert st.pod_audit_event(said, two, st.pod_audit_status([])) is None
    # The same pods again after the list emptied: news again.
    assert st.pod_audit_event(said, st.pod_audit_status([]), two)
    restarted = st.Announcements({})
    assert st.pod_audit_event(restarted, two, two) is None
    assert isinstance(one, PodAuditStatus)


def test_a_policy_is_sized_and_rendered_once_per_generation_however_many_policies_there_are():
    """The guidance timer sizes its policy on every tick and every pass reads its intent; at 200
    policies (the bench's largest) each must still be sized and rendered once per generation, a new
    generation sized again, and a deleted policy's sizing dropped. (A bounded cache shared by the
    intents was cleared every 64 passes, and the node facts and audits went with it.)"""
    from kata_sizing.controller import gather

    state = make_state(FakeApi())
    bodies = []
    for i in range(200):
        body = policy_body()
        body["metadata"].update(name=f"p{i}", uid=f"uid-{i}", generation=1)
        bodies.append(body)
        seen(state, body)
    first = [gather.policy_sizing(state, b) for b in bodies]
    intents = [gather.intent(state, b, None) for b in bodies]
    assert all(s is not None for s in first)
    assert all(a is b for a, b in zip((gather.policy_sizing(state, b) for b in bodies), first))
    assert all(a is b for a, b in zip((gather.intent(state, b, None) for b in bodies), intents))
    assert len(state.derived) <= 2  # no per-policy value among the shared ones

    changed = copy.deepcopy(bodies[0])
    changed["metadata"]["generation"] = 2
    changed["spec"]["classes"] = [{"name": "s", "cpu": "1", "memory": "768Mi"}]
    resized = gather.policy_sizing(state, changed)
    assert resized is not first[0] and [c.name for c in resized.classes] == ["s"]

    invalid = copy.deepcopy(bodies[1])
    invalid["metadata"]["generation"] = 2
    invalid["spec"]["classes"] = [{"name": "s", "cpu": "1", "memory": "-1Gi"}]
    assert gather.policy_sizing(state, invalid) is None

    assert state.records["p3"].sizing is not None
    state.forget_policy("p2")
    assert "p2" not in state.records


def test_the_audit_of_unmanaged_runtime_classes_runs_again_only_when_one_of_them_changes(monkeypatch):
    """At a cold start every pass writes RuntimeClasses of its own; the audit looks only at those no
    policy renders, so those writes must not make each pass audit every class again (O(policies²)
    at 200 policies, docs/performance.md)."""
    from kata_sizing.controller import gather

    audited = []
    original = gather.audit_runtime_classes

    def counting(runtime_classes, managed_names):
        audited.append(sorted(rc["metadata"]["name"] for rc in runtime_classes))
        return original(runtime_classes, managed_names)

    monkeypatch.setattr(gather, "audit_runtime_classes", counting)
    theirs = {"kind": "RuntimeClass", "apiVersion": "node.k8s.io/v1", "handler": "kata-qemu",
              "metadata": {"name": "kata-qemu"}}
    api = FakeApi(theirs, allow=READS | {"create", "patch_status"})
    state = make_state(api)
    state.events = lambda ref, type_, reason, message: None
    rcs = state.children.runtime_classes
    rcs.items = {}

    def follow() -> None:  # the RuntimeClass cache as the informer keeps it: a version per change
        rcs.items = {k: o for k, o in api.objects.items() if k[0] == "RuntimeClass"}
        rcs.version += 1

    state.children.runtime_classes_except = lambda names: [o for k, o in rcs.items.items() if k[2] not in names]
    for i in range(3):
        body = policy_body()
        body["metadata"].update(name=f"p{i}", uid=f"uid-{i}")
        body["spec"]["runtimeClass"] = {**body["spec"]["runtimeClass"], "namePrefix": f"kata-p{i}"}
        api._store(api._stamped({**body, "kind": KIND}))
        follow()
        record = seen(state, copy.deepcopy(api.objects[policy_key(f"p{i}")]))
        run(rc.run_pass(state, record.name, "apply"))
        follow()
    assert audited == [["kata-qemu"]], audited  # the policies' own classes never made it run again
    api.objects[("RuntimeClass", None, "kata-qemu")]["metadata"]["resourceVersion"] = "999"
    follow()
    run(rc.run_pass(state, "p0", "resync"))
    assert audited == [["kata-qemu"], ["kata-qemu"]]  # the unmanaged one changed: audited again


def test_the_runtime_classes_no_policy_renders_are_read_by_name_from_the_cache():
    from kata_sizing.controller.informer import ChildCache

    children = ChildCache(api=None)
    children.runtime_classes.items = {(None, name): {"metadata": {"name": name}}
                                      for name in ("kata-p-s", "zeta", "kata-qemu", "kata-p-m")}
    managed = frozenset({"kata-p-s", "kata-p-m"})
    assert [rc["metadata"]["name"] for rc in children.runtime_classes_except(managed)] == ["kata-qemu", "zeta"]
    children.runtime_classes.items.pop((None, "zeta"))
    assert [rc["metadata"]["name"] for rc in children.runtime_classes_except(managed)] == ["kata-qemu"]
    assert [rc["metadata"]["name"] for rc in children.runtime_classes_except(frozenset({"kata-p-s"}))] == [
        "kata-p-m", "kata-qemu"]


# --- a change no pass of this replica has indexed yet ----------------------------------------------


class _Queue:
    def __init__(self) -> None:
        self.added: list[tuple[str, str]] = []

    def add(self, key: str, reason: str) -> None:
        self.added.append((key, reason))


@pytest.mark.parametrize("labels, queued", [
    ({MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: NAME}, [(NAME, "drift")]),
    ({MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: "unknown-policy"}, []),
    ({POLICY_LABEL: NAME}, []),  # not the operator's: a pod's opt-in label, or a copy
], ids=["ours", "a-policy-this-replica-does-not-know", "not-managed-by-us"])
def test_a_change_before_the_first_pass_indexed_the_policy_still_queues_its_pass(labels, queued):
    """A replica just made the leader can read its caches for its first pass before a hand edit
    arrives, and the edit's event before that pass has said what it wants: the edit goes to the
    pass of the policy its labels name, not dropped until the resync (seen in the suite as a
    replica's takeover that left a hand edit in place)."""
    from kata_sizing.controller import worker

    state = make_state(FakeApi())
    state.work = _Queue()  # type: ignore[assignment]
    state.records[NAME] = PolicyRecord(NAME, policy_body())
    edited = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
              "metadata": {"name": "kata-qemu-rs-m", "labels": labels}, "handler": "kata-qemu-rs-m"}
    assert state.desired.for_child(obj_key(edited), edited) is None  # no pass has run here
    worker.child_changed(state, obj_key(edited), None, edited)
    assert state.work.added == queued


def test_the_routing_webhook_reads_a_policy_its_watch_has_not_delivered_yet():
    """A replica is ready once its caches synced and its webhook listens, which can be a moment
    before kopf's watch has listed the policies: a pod opted into a policy the replica has no
    record of is routed from one read of the policy (not let through unrouted, to be refused as
    not routed), and a label naming no policy is let through unchanged."""
    import base64
    import json

    from kata_sizing.controller.handlers import route_pod
    from tests.support.policies import explicit_classes_policy
    from tests.support.routing import pod

    body = explicit_classes_policy("routed", admission={"routing": "Webhook"})
    api = FakeApi(body)
    state = make_state(api)
    assert "routed" not in state.records

    def review(obj: dict) -> dict:
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "team",
            "operation": "CREATE", "object": obj, "oldObject": None}}

    answer = run(route_pod(state, review(pod(labels={"katasizing.dev/policy": "routed"}, cpu="1500m",
                                            memory="2Gi"))))["response"]
    assert json.loads(base64.b64decode(answer["patch"])) == [
        {"op": "add", "path": "/spec/runtimeClassName", "value": "kata-routed-m"}]
    assert ("read", (KIND, None, "routed")) in api.calls
    unknown = run(route_pod(state, review(pod(labels={"katasizing.dev/policy": "no-such"}, cpu="1",
                                             memory="1Gi"))))["response"]
    assert unknown["allowed"] is True and "patch" not in unknown
