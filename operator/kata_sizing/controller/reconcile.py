"""Reconciliation as plain async functions: read, call the core, diff, write the difference.

No kopf here: the handlers module calls these with a `KubeApi` (or a fake in tests) and an
event sink. The desired state of every policy is kept in a `DesiredCache`, which is also the
index from a managed child object back to its policy for drift handling.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Literal, Protocol

from . import conditions as cond
from . import metrics
from .kube import ADMISSION_PLURALS, Conflict, Invalid, NotFound
from ..core.model import API_VERSION, KIND, KataSizingPolicy, PolicyError, parse_policy
from ..core.quantity import QuantityError, format_cpu, format_mib, format_vcpus, parse_quantity
from ..core.render import MANAGED_BY, MANAGED_BY_LABEL, POLICY_LABEL, Rendered, configmap_names, render_policy
from ..core.guidance import NodeFacts
from ..core.sizing import PolicySizing, Severity, size_policy

Trigger = Literal["apply", "resync"]
ObjKey = tuple[str, str | None, str]  # (kind, namespace, name)

CONFLICT_RETRIES = 5


class EventSink(Protocol):
    def __call__(self, policy_ref: dict, type_: str, reason: str, message: str) -> None: ...


def obj_key(obj: dict) -> ObjKey:
    meta = obj.get("metadata") or {}
    return (obj.get("kind") or "", meta.get("namespace"), meta.get("name") or "")


def describe(key: ObjKey) -> str:
    kind, namespace, name = key
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def policy_ref(body: dict) -> dict:
    meta = body.get("metadata") or {}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": meta.get("name"), "uid": meta.get("uid")}}


# --- comparing desired and live ---------------------------------------------------------


def _same_quantity(a: object, b: object) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)  # the API server may print 1Gi for 1024Mi
    except QuantityError:
        return a == b


def _pod_fixed_equal(desired: dict | None, live: dict | None) -> bool:
    desired = (desired or {}).get("podFixed") or {}
    live = (live or {}).get("podFixed") or {}
    if set(desired) != set(live):
        return False
    return all(_same_quantity(desired[k], live[k]) for k in desired)


def _toleration(t: dict) -> dict:
    return {k: v for k, v in t.items() if v is not None}


def _scheduling_view(scheduling: dict | None) -> tuple:
    scheduling = scheduling or {}
    tolerations = [_toleration(t) for t in scheduling.get("tolerations") or []]
    return (scheduling.get("nodeSelector") or {}, tolerations)


def _decided_labels(desired: dict, guarded: bool) -> dict:
    """The labels the operator puts on an object. On the chart's RuntimeClasses Helm stamps
    `app.kubernetes.io/managed-by: Helm` over ours: that key is Helm's there, not drift."""
    labels = desired["metadata"].get("labels") or {}
    return {k: v for k, v in labels.items() if not (guarded and k == MANAGED_BY_LABEL)}


def _guarded_scheduling_differences(desired: dict, live: dict) -> list[str]:
    """KataDeploy mode: only the selector keys and tolerations the policy sets. The chart adds
    its ownership gate (`katacontainers.io/kata-runtime`, `kata-deploy.katacontainers.io/<instance>`)
    and may add more; those keys are the chart's."""
    (want_selector, want_tolerations) = _scheduling_view(desired.get("scheduling"))
    (have_selector, have_tolerations) = _scheduling_view(live.get("scheduling"))
    found = [f"scheduling.nodeSelector[{k}]" for k, v in want_selector.items() if have_selector.get(k) != v]
    if any(t not in have_tolerations for t in want_tolerations):
        found.append("scheduling.tolerations")
    return found


def _guarded_pod_fixed_differences(desired: dict, live: dict) -> list[str]:
    """KataDeploy mode: the podFixed resources the policy sizes (cpu, memory); others the chart
    may request there (a TEE key slot such as `sev-snp.amd.com/esids`) are the chart's."""
    want = ((desired.get("overhead") or {}).get("podFixed")) or {}
    have = ((live.get("overhead") or {}).get("podFixed")) or {}
    if all(k in have and _same_quantity(v, have[k]) for k, v in want.items()):
        return []
    return ["overhead.podFixed"]


# What the API server fills in on an admission object's spec where the policy leaves a field out
# (admissionregistration/v1 defaults.go): a field at exactly this value is the server's, not drift;
# at any other value (a hand-made objectSelector, failurePolicy Ignore) it is drift.
SERVER_DEFAULTS: dict[str, object] = {
    "failurePolicy": "Fail", "matchPolicy": "Equivalent", "namespaceSelector": {}, "objectSelector": {},
    "scope": "*", "reinvocationPolicy": "Never", "parameterNotFoundAction": "Deny",
}


def is_admission_kind(kind: str) -> bool:
    return kind in ADMISSION_PLURALS


def spec_differences(desired: object, live: object, path: str = "spec") -> list[str]:
    """Where `live` differs from `desired`: every value the desired object sets, lists element by
    element and of the same length, and no key the desired object leaves out unless the server
    put it there (SERVER_DEFAULTS)."""
    if isinstance(desired, dict) and isinstance(live, dict):
        found = []
        for key, want in desired.items():
            if key not in live:
                found.append(f"{path}.{key}")
            else:
                found += spec_differences(want, live[key], f"{path}.{key}")
        found += [f"{path}.{key}" for key, value in live.items()
                  if key not in desired and not (key in SERVER_DEFAULTS and SERVER_DEFAULTS[key] == value)]
        return found
    if isinstance(desired, list) and isinstance(live, list):
        if len(desired) != len(live):
            return [path]
        return [d for i, (w, h) in enumerate(zip(desired, live)) for d in spec_differences(w, h, f"{path}[{i}]")]
    return [] if desired == live else [path]


def differences(desired: dict, live: dict, guarded: bool = False) -> list[str]:
    """The fields the operator decides where `live` differs from `desired`; fields others own
    (their labels, annotations, and on a `guarded` object every key the chart adds) are ignored."""
    found = []
    d_meta, l_meta = desired["metadata"], live.get("metadata") or {}
    live_labels = l_meta.get("labels") or {}
    for label, value in _decided_labels(desired, guarded).items():
        if live_labels.get(label) != value:
            found.append(f"metadata.labels[{label}]")
    live_owner_uids = {o.get("uid") for o in l_meta.get("ownerReferences") or []}
    for owner in d_meta.get("ownerReferences") or []:
        if owner["uid"] not in live_owner_uids:
            found.append("metadata.ownerReferences")
    if desired["kind"] == "RuntimeClass":
        if desired.get("handler") != live.get("handler"):
            found.append("handler")
        if guarded:
            found += _guarded_pod_fixed_differences(desired, live)
            found += _guarded_scheduling_differences(desired, live)
        else:
            if not _pod_fixed_equal(desired.get("overhead"), live.get("overhead")):
                found.append("overhead.podFixed")
            if _scheduling_view(desired.get("scheduling")) != _scheduling_view(live.get("scheduling")):
                found.append("scheduling")
    elif is_admission_kind(desired["kind"]):
        found += spec_differences(desired.get("spec") or {}, live.get("spec") or {})
    else:
        if (desired.get("data") or {}) != (live.get("data") or {}):
            changed = sorted(
                k for k in set(desired.get("data") or {}) | set(live.get("data") or {})
                if (desired.get("data") or {}).get(k) != (live.get("data") or {}).get(k)
            )
            found.append("data[" + ", ".join(changed) + "]")
    return found


def corrected(desired: dict, live: dict, guarded: bool = False) -> dict:
    """`live` with our fields put back; labels, annotations and owners of others are kept, and on
    a `guarded` object every key the chart added as well."""
    body = copy.deepcopy(live)
    meta = body.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **_decided_labels(desired, guarded)}
    owners = [o for o in meta.get("ownerReferences") or []]
    owner_uids = {o.get("uid") for o in owners}
    for owner in desired["metadata"].get("ownerReferences") or []:
        if owner["uid"] not in owner_uids:
            owners.append(owner)
    if owners:
        meta["ownerReferences"] = owners
    if desired["kind"] == "RuntimeClass" and guarded:
        overhead = body.setdefault("overhead", {}) or {}
        body["overhead"] = overhead
        overhead["podFixed"] = {**(overhead.get("podFixed") or {}),
                                **copy.deepcopy((desired.get("overhead") or {}).get("podFixed") or {})}
        want_scheduling = desired.get("scheduling") or {}
        scheduling = body.get("scheduling") or {}
        body["scheduling"] = scheduling
        selector = {**(scheduling.get("nodeSelector") or {}), **(want_scheduling.get("nodeSelector") or {})}
        if selector:
            scheduling["nodeSelector"] = selector
        tolerations = list(scheduling.get("tolerations") or [])
        have = [_toleration(t) for t in tolerations]
        tolerations += [copy.deepcopy(t) for t in want_scheduling.get("tolerations") or [] if _toleration(t) not in have]
        if tolerations:
            scheduling["tolerations"] = tolerations
    elif desired["kind"] == "RuntimeClass":
        body["overhead"] = copy.deepcopy(desired.get("overhead"))
        body["scheduling"] = copy.deepcopy(desired.get("scheduling"))
    elif is_admission_kind(desired["kind"]):
        body["apiVersion"] = desired.get("apiVersion") or body.get("apiVersion")
        body["spec"] = copy.deepcopy(desired.get("spec") or {})
    else:
        body["data"] = copy.deepcopy(desired.get("data") or {})
    return body


def is_ours(live: dict, policy_name: str, policy_uid: str | None) -> bool:
    """Labelled for this policy, or owned by it. The managed-by label is not looked at: Helm
    replaces it with its own on the RuntimeClasses the kata-deploy chart creates from our values."""
    meta = live.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(POLICY_LABEL) == policy_name:
        return True
    return bool(policy_uid) and any(o.get("uid") == policy_uid for o in meta.get("ownerReferences") or [])


# --- the desired-state cache (also the child -> policy index) ----------------------------


@dataclass
class Desired:
    policy_name: str
    policy_uid: str | None
    drift_policy: str
    ref: dict
    namespace: str
    # Objects the operator creates and owns.
    owned: dict[ObjKey, dict]
    # KataDeploy mode: RuntimeClasses the chart creates; the operator guards their fields.
    guarded: dict[ObjKey, dict]
    # Names somebody else's object holds (found by the last pass): never written by drift handling.
    conflicts: set[ObjKey] = field(default_factory=set)
    # KataDeploy mode: chart RuntimeClasses the last pass did not find (status says so).
    missing: set[ObjKey] = field(default_factory=set)
    # Rendered admission objects of a kind (or version) the API server does not serve.
    unserved: list[str] = field(default_factory=list)
    routing: str = "Auto"

    def unserved_expected(self, what: str) -> bool:
        """A MutatingAdmissionPolicy the server does not serve is expected with routing Auto: the
        operator's webhook routes instead; not a warning."""
        return what.startswith("MutatingAdmissionPolicy") and self.routing == "Auto"

    def needs_pass(self, key: ObjKey) -> bool:
        """A change of `key` changes what the last pass reported (a conflict or a missing
        chart object), so the policy's status needs a new pass, not only a drift check."""
        return key in self.conflicts or key in self.missing

    def lookup(self, key: ObjKey) -> tuple[dict, bool] | None:
        if key in self.owned:
            return self.owned[key], True
        if key in self.guarded:
            return self.guarded[key], False
        return None


@dataclass
class DesiredCache:
    by_policy: dict[str, Desired] = field(default_factory=dict)
    by_child: dict[ObjKey, str] = field(default_factory=dict)
    # Drift already reported in Report mode: (key, resourceVersion), so it is said once.
    reported: set[tuple[ObjKey, str]] = field(default_factory=set)
    # What was last posted as an Event, per (policy, reason): a pass that runs before the
    # status saying so has come back through the watch must not post it again.
    announced: dict[tuple[str, str], object] = field(default_factory=dict)

    def first_time(self, policy_name: str, reason: str, what: object) -> bool:
        """Record `what` as announced; False when it was the last thing announced."""
        key = (policy_name, reason)
        if not what:
            self.announced.pop(key, None)
            return False
        if self.announced.get(key) == what:
            return False
        self.announced[key] = what
        return True

    # Bumps when the set of RuntimeClass names some policy renders changes (not on every pass).
    version: int = 0

    def put(self, desired: Desired) -> None:
        old = self.by_policy.get(desired.policy_name)
        new_keys = {*desired.owned, *desired.guarded}
        if old is not None:
            self._release(desired.policy_name, {*old.owned, *old.guarded} - new_keys)
        self.by_policy[desired.policy_name] = desired
        for key in new_keys:
            self.by_child[key] = desired.policy_name
        if old is None or _rc_names(old) != _rc_names(desired):
            self.version += 1

    def drop(self, policy_name: str) -> Desired | None:
        old = self.by_policy.pop(policy_name, None)
        self.announced = {k: v for k, v in self.announced.items() if k[0] != policy_name}
        if old:
            self._release(policy_name, {*old.owned, *old.guarded})
            self.version += 1
        return old

    def _release(self, policy_name: str, keys: set[ObjKey]) -> None:
        for key in keys:
            if self.by_child.get(key) == policy_name:
                other = next((d.policy_name for d in self.by_policy.values()
                              if d.policy_name != policy_name and d.lookup(key)), None)
                if other:
                    self.by_child[key] = other
                else:
                    del self.by_child[key]

    def runtime_class_names(self) -> set[str]:
        """Every RuntimeClass some policy renders: the Kata classes the operator knows of."""
        return {key[2] for key in self.by_child if key[0] == "RuntimeClass"}

    def for_child(self, key: ObjKey, live: dict | None = None) -> Desired | None:
        """The policy that wants `key`; given the `live` object, the one it belongs to. Two
        policies may render the same name (one of them in Conflict), and the index holds only
        the last one put."""
        name = self.by_child.get(key)
        indexed = self.by_policy.get(name) if name else None
        if indexed is None or live is None or is_ours(live, indexed.policy_name, indexed.policy_uid):
            return indexed
        for desired in self.by_policy.values():
            if desired.lookup(key) is not None and is_ours(live, desired.policy_name, desired.policy_uid):
                return desired
        return indexed


def _rc_names(desired: Desired) -> set[str]:
    return {key[2] for key in [*desired.owned, *desired.guarded] if key[0] == "RuntimeClass"}


def _without_owner_references(obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("ownerReferences", None)
    return obj


def admission_objects(
    rendered: Rendered, admission_versions: dict[str, str] | None,
) -> tuple[dict[ObjKey, dict], list[dict]]:
    """(the rendered admission objects the server can store, those it cannot). With
    `admission_versions` None (the CLI's fake APIs, unit tests) every one is kept; otherwise an
    object is kept when the server serves its kind at the version it is rendered with."""
    kept: dict[ObjKey, dict] = {}
    left_out: list[dict] = []
    for obj in rendered.admission:
        version = (obj.get("apiVersion") or "").rpartition("/")[2]
        if admission_versions is None or admission_versions.get(obj["kind"]) == version:
            kept[obj_key(obj)] = obj
        else:
            left_out.append(obj)
    return kept, left_out


def build_desired(
    policy: KataSizingPolicy, rendered: Rendered, body: dict, admission_versions: dict[str, str] | None = None,
) -> Desired:
    runtime_classes = {obj_key(o): o for o in rendered.runtime_classes}
    owned = {obj_key(o): o for o in rendered.configmaps}
    guarded: dict[ObjKey, dict] = {}
    if rendered.creates_runtime_classes:
        owned.update(runtime_classes)
    else:
        # The chart's objects: never owned by the policy, or deleting the policy would make
        # the garbage collector delete them (and drift correction would add the reference).
        guarded = {key: _without_owner_references(o) for key, o in runtime_classes.items()}
    admission, left_out = admission_objects(rendered, admission_versions)
    owned.update(admission)
    return Desired(
        policy_name=policy.name,
        policy_uid=policy.metadata.uid,
        drift_policy=policy.spec.drift_policy,
        ref=policy_ref(body),
        namespace=policy.spec.output.namespace,
        owned=owned,
        guarded=guarded,
        unserved=[f"{o['kind']} {o['metadata']['name']} ({o.get('apiVersion')})" for o in left_out],
        routing=policy.spec.admission.routing,
    )


# --- one pass -----------------------------------------------------------------------------


class LiveChildren(Protocol):
    """Where a pass reads the live children: the operator's watch-fed cache (informer.ChildCache),
    so a reconcile costs no list request whatever the number of policies."""

    def get(self, key: ObjKey) -> dict | None: ...
    def complete(self, key: ObjKey) -> bool: ...
    def of_policy(self, policy_name: str) -> dict[ObjKey, dict]: ...
    def record(self, obj: dict) -> None: ...
    def forget(self, key: ObjKey) -> None: ...


class NotOurs(Exception):
    """The object with this name belongs to somebody else (found on a re-read)."""


# Writes one pass has in flight at once. More would shorten a single policy's creation a little
# further, but at a cold start every policy's pass runs at once, and each waiting write holds its
# request: with all ten at once, 200 policies peaked 30 MiB higher against the real API server.
WRITES_PER_PASS = 4


@dataclass
class PassResult:
    writes: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    drifted: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    nodes: dict | None = None
    unmanaged: list[dict] | None = None
    pod_audit: dict | None = None
    refused: list[str] = field(default_factory=list)
    # status.measurement: None leaves it as it was, {} removes it (the measurement switched off).
    measurement: dict | None = None
    # status.proposal: None leaves it as it was, {} removes it (no spec.overhead.survey).
    proposal: dict | None = None


def _remember(children: LiveChildren | None, kind: str, written: dict | None) -> None:
    if children is not None and written:
        children.record({**written, "kind": kind})


async def _write_with_retry(
    api, key: ObjKey, desired: dict, live: dict | None, create: bool = True, guarded: bool = False,
    children: LiveChildren | None = None, owner: tuple[str, str | None] | None = None,
) -> str | None:
    """Create or replace one object; a 409 re-reads and retries. Returns what was done. With
    `owner` (policy name, uid), an object found on a re-read that is not that policy's raises
    NotOurs instead of being overwritten."""
    kind, namespace, name = key
    for _ in range(CONFLICT_RETRIES):
        try:
            if live is None:
                if not create:
                    return None
                written = await _create(api, kind, desired)
                _remember(children, kind, written)
                return f"created {describe(key)}"
            body = corrected(desired, live, guarded)
            if kind == "RuntimeClass":
                written = await api.replace_runtime_class(body)
            elif is_admission_kind(kind):
                written = await api.replace_admission_object(body)
            else:
                written = await api.replace_config_map(body)
            _remember(children, kind, written)
            return f"updated {describe(key)}"
        except Conflict:
            live = await _read(api, key)
            if live is not None and owner is not None and not is_ours(live, *owner):
                raise NotOurs(describe(key)) from None
            _remember(children, kind, live)
            if live is not None and not differences(desired, live, guarded):
                return None  # somebody (our own earlier pass, often) already wrote what we want
        except NotFound:
            live = None
    raise Conflict(409, f"{describe(key)}: still conflicting after {CONFLICT_RETRIES} attempts")


async def _create(api, kind: str, body: dict) -> dict:
    if kind == "RuntimeClass":
        return await api.create_runtime_class(body)
    if is_admission_kind(kind):
        return await api.create_admission_object(body)
    return await api.create_config_map(body)


async def _read(api, key: ObjKey) -> dict | None:
    kind, namespace, name = key
    if kind == "RuntimeClass":
        found = await api.read_runtime_class(name)
    elif is_admission_kind(kind):
        found = await api.read_admission_object(kind, name)
    else:
        found = await api.read_config_map(namespace, name)
    return {**found, "kind": kind} if found is not None else None


async def _delete(api, key: ObjKey, uid: str | None, children: LiveChildren | None = None) -> None:
    kind, namespace, name = key
    if kind == "RuntimeClass":
        await api.delete_runtime_class(name, uid)
    elif is_admission_kind(kind):
        await api.delete_admission_object(kind, name, uid)
    else:
        await api.delete_config_map(namespace, name, uid)
    if children is not None:
        children.forget(key)


async def _recreate(api, key: ObjKey, want: dict, have: dict, children: LiveChildren | None) -> None:
    """RuntimeClass.handler is immutable: delete and create."""
    await _delete(api, key, (have.get("metadata") or {}).get("uid"), children)
    _remember(children, "RuntimeClass", await api.create_runtime_class(want))


async def _listed_children(api, policy_name: str) -> dict[ObjKey, dict]:
    """Without a cache (the CLI's tests, a fake API): one label-selected list per kind."""
    selector = f"{POLICY_LABEL}={policy_name}"
    runtime_classes, config_maps = await asyncio.gather(
        api.list_runtime_classes(selector), api.list_config_maps(selector)
    )
    live = {}
    for obj in runtime_classes:
        live[("RuntimeClass", None, obj["metadata"]["name"])] = {**obj, "kind": "RuntimeClass"}
    for obj in config_maps:
        meta = obj["metadata"]
        live[("ConfigMap", meta.get("namespace"), meta["name"])] = {**obj, "kind": "ConfigMap"}
    for kind in getattr(api, "admission_versions", None) or ():
        for obj in await api.list_admission_objects(kind, selector):
            live[(kind, None, obj["metadata"]["name"])] = {**obj, "kind": kind}
    return live


async def _live_children(api, policy_name: str, children: LiveChildren | None) -> dict[ObjKey, dict]:
    if children is not None:
        return children.of_policy(policy_name)
    return await _listed_children(api, policy_name)


async def _current(api, key: ObjKey, children: LiveChildren | None) -> dict | None:
    """The live object with this name, whoever's it is: from the cache when the cache holds
    every object of the kind, else one read."""
    if children is not None:
        cached = children.get(key)
        if cached is not None or children.complete(key):
            return cached
    return await _read(api, key)


async def apply_desired(
    api, desired: Desired, trigger: Trigger, cache: DesiredCache, sink: EventSink,
    children: LiveChildren | None = None,
) -> PassResult:
    result = PassResult()
    live = await _live_children(api, desired.policy_name, children)
    write_drift = trigger == "apply" or desired.drift_policy == "Correct"
    owner = (desired.policy_name, desired.policy_uid)
    desired.conflicts, desired.missing = set(), set()

    def conflict(key: ObjKey, text: str, into: PassResult = result) -> None:
        desired.conflicts.add(key)
        into.conflicts.append(text)

    async def apply_owned(key: ObjKey, want: dict) -> PassResult:
        part = PassResult()
        have = live.get(key)
        if have is None:
            # Not labelled as ours, but the name may be taken by somebody else's object.
            have = await _current(api, key, children)
            if have is not None:
                if not is_ours(have, *owner):
                    conflict(key, f"{describe(key)} exists and is not managed by this policy; left untouched", part)
                    return part
                live[key] = have
        if have is not None and key[0] == "RuntimeClass" and have.get("handler") != want.get("handler"):
            await _recreate(api, key, want, have, children)
            part.writes.append(f"re-created {describe(key)} (handler changed)")
            return part
        diff = differences(want, have) if have is not None else ["(missing)"]
        if not diff:
            return part
        if not write_drift:
            part.drifted.append(f"{describe(key)}: {', '.join(diff)}")
            _report_once(cache, sink, desired, key, have, diff)
            return part
        try:
            done = await _write_with_retry(api, key, want, have, children=children, owner=owner)
        except NotOurs:
            conflict(key, f"{describe(key)} exists and is not managed by this policy; left untouched", part)
            return part
        except Invalid as exc:
            if not is_admission_kind(key[0]):
                raise
            # A server whose CEL library lacks something the rule uses refuses the object (422):
            # said in status, and the other objects are still written.
            part.refused.append(f"{describe(key)}: {exc}")
            return part
        if done:
            part.writes.append(done)
        return part

    # The owned objects are independent of each other (a binding may name its policy before
    # the policy exists), so up to WRITES_PER_PASS are written at once: a new policy's ten
    # objects cost three round trips of latency, not ten. Every write finishes before the pass
    # goes on or fails (no write outlives its pass); results keep the policy's order.
    slots = asyncio.Semaphore(WRITES_PER_PASS)

    async def bounded(key: ObjKey, want: dict) -> PassResult:
        async with slots:
            return await apply_owned(key, want)

    parts = await asyncio.gather(
        *(bounded(key, want) for key, want in desired.owned.items()), return_exceptions=True)
    for part in parts:
        if isinstance(part, BaseException):
            raise part
    for part in parts:
        for name in ("writes", "conflicts", "drifted", "refused"):
            getattr(result, name).extend(getattr(part, name))

    for key, want in desired.guarded.items():
        have = live.get(key) or await _current(api, key, children)
        if have is None:
            desired.missing.add(key)
            result.missing.append(key[2])
            continue
        if not is_ours(have, *owner):
            conflict(key, f"{describe(key)} is not labelled for this policy; left untouched")
            continue
        diff = [d for d in differences(want, have, guarded=True) if d != "handler"]
        if have.get("handler") != want.get("handler"):
            result.drifted.append(f"{describe(key)}: handler {have.get('handler')!r} (immutable; fix the chart)")
        if diff and write_drift:
            done = await _write_with_retry(
                api, key, want, have, create=False, guarded=True, children=children, owner=owner)
            if done:
                result.writes.append(done)
        elif diff:
            result.drifted.append(f"{describe(key)}: {', '.join(diff)}")
            _report_once(cache, sink, desired, key, have, diff)

    wanted = set(desired.owned) | set(desired.guarded)
    guidance_name = configmap_names(desired.policy_name)["guidance"]
    guidance_rendered = any(k[0] == "ConfigMap" and k[2] == guidance_name for k in desired.owned)
    for key, have in live.items():
        if key in wanted:
            continue
        if key[0] == "ConfigMap" and key[2] == guidance_name and not guidance_rendered and key[1] == desired.namespace:
            continue  # node facts not known yet (informers syncing): keep the last guidance
        if key[0] == "RuntimeClass" and key not in desired.owned and desired.guarded:
            continue  # the chart's object (KataDeploy mode): never deleted by the operator
        if not is_ours(have, *owner):
            continue
        await _delete(api, key, (have.get("metadata") or {}).get("uid"), children)
        result.writes.append(f"deleted {describe(key)} (no longer in the policy)")
    return result


def _report_once(cache: DesiredCache, sink: EventSink, desired: Desired, key: ObjKey, have: dict | None, diff: list[str]) -> None:
    version = ((have or {}).get("metadata") or {}).get("resourceVersion") or "missing"
    if (key, version) in cache.reported:
        return
    cache.reported.add((key, version))
    sink(desired.ref, "Warning", cond.EVENT_DRIFT_DETECTED,
         f"{describe(key)} differs from the policy ({', '.join(diff)}); driftPolicy is Report, not corrected")


# --- status ---------------------------------------------------------------------------------


def class_status(sizing: PolicySizing) -> list[dict]:
    rows = []
    for c in sizing.classes:
        row = {
            "name": c.name,
            "runtimeClass": c.runtime_class,
            "podFixed": c.pod_fixed,
            "defaultVcpus": c.default_vcpus,
            "defaultMemory": format_mib(c.default_memory_mib),
            "largestVm": {"vcpus": c.largest_vm.vcpus, "memoryMiB": c.largest_vm.memory_mib},
        }
        if c.overhead_vcpus is not None:
            row["overheadVcpus"] = format_vcpus(c.overhead_vcpus)
            row["overheadMemory"] = format_mib(c.overhead_memory_mib)
        rows.append(row)
    return rows


OWNED_STATUS_FIELDS = (
    "observedGeneration", "runtime", "classNames", "conditions", "classes", "warnings", "overhead", "nodes",
    "unmanagedRuntimeClasses", "podAudit", "measurement", "proposal",
)
# status.podAudit lists at most this many pods (the counts cover them all): a status object
# stays far below etcd's 1.5 MiB request limit whatever the number of pods breaking a rule.
POD_AUDIT_LISTED = 50


def pod_audit_status(findings: list[dict]) -> dict:
    """Counts per class and rule over every finding, and the first POD_AUDIT_LISTED findings
    (by namespace/name). Each finding: {pod, runtimeClass, class, rule, message}."""
    counts: dict[tuple[str, str], set[str]] = {}
    for f in findings:
        counts.setdefault((f["class"], f["rule"]), set()).add(f["pod"])
    rows = sorted(findings, key=lambda f: (f["pod"], f["rule"]))
    return {
        "pods": len({f["pod"] for f in findings}),
        "counts": [{"class": c, "rule": r, "pods": len(p)} for (c, r), p in sorted(counts.items())],
        "listed": rows[:POD_AUDIT_LISTED],
        "truncated": len(rows) > POD_AUDIT_LISTED,
    }


def unmanaged_status(findings) -> list[dict]:
    keys = ("runtimeClass", "handler", "severity", "rule", "message", "fix")
    rows = [{k: v for k, v in f.as_dict().items() if k in keys and v is not None} for f in findings]
    return sorted(rows, key=lambda r: (r["runtimeClass"], r["rule"]))


def overhead_status(sizing: PolicySizing) -> dict:
    fn = sizing.overhead
    return {
        "guestMemoryBase": format_mib(fn.guest_memory_base_mib),
        "guestMemoryRatio": format(fn.guest_memory_ratio.normalize(), "f"),
        "guestCpu": format_cpu(fn.guest_cpu),
        "hostMemory": format_mib(fn.host_memory_mib),
        "hostCpu": format_cpu(fn.host_cpu),
        "margin": format(fn.margin.normalize(), "f"),
        "fitted": fn.fitted,
    }


def nodes_status(rendered: Rendered) -> dict:
    return {
        "seen": sum(len(g.nodes) for g in rendered.guidance),
        "groups": len(rendered.guidance),
        "withWarnings": sum(len(g.nodes) for g in rendered.guidance if g.warnings),
    }


def compute_status(body: dict, result: PassResult, sizing: PolicySizing | None) -> dict:
    meta = body.get("metadata") or {}
    generation = meta.get("generation")
    previous = body.get("status") or {}
    valid = not result.invalid
    current = []
    if valid:
        current.append(cond.condition(
            cond.VALID, True, cond.REASON_VALID,
            "; ".join(result.warnings) or "all sizing rules hold", generation))
    else:
        current.append(cond.condition(cond.VALID, False, cond.REASON_INVALID, "; ".join(result.invalid), generation))
    current.append(cond.condition(
        cond.CONFLICT, bool(result.conflicts),
        cond.REASON_CONFLICT if result.conflicts else cond.REASON_NO_CONFLICT,
        "; ".join(result.conflicts), generation))
    if not valid:
        in_sync = cond.condition(
            cond.IN_SYNC, False, cond.REASON_NOT_APPLIED,
            "this generation is invalid; the objects of the last valid generation are kept as they were",
            generation)
    elif result.conflicts:
        in_sync = cond.condition(cond.IN_SYNC, False, cond.REASON_CONFLICT, "; ".join(result.conflicts), generation)
    elif result.missing:
        in_sync = cond.condition(
            cond.IN_SYNC, False, cond.REASON_RUNTIME_CLASS_MISSING,
            "kata-deploy has not created RuntimeClass " + ", ".join(result.missing)
            + " (apply the values overlay with helm)", generation)
    elif result.refused:
        in_sync = cond.condition(
            cond.IN_SYNC, False, cond.REASON_REFUSED, "the API server refused " + "; ".join(result.refused), generation)
    elif result.drifted:
        in_sync = cond.condition(cond.IN_SYNC, False, cond.REASON_DRIFT_REPORTED, "; ".join(result.drifted), generation)
    else:
        in_sync = cond.condition(cond.IN_SYNC, True, cond.REASON_IN_SYNC, "every managed object matches the policy", generation)
    current.append(in_sync)
    ready = valid and in_sync["status"] == "True"
    current.append(cond.condition(
        cond.READY, ready, in_sync["reason"] if valid else cond.REASON_INVALID,
        "" if ready else (in_sync["message"] if valid else "the policy is invalid"), generation))
    status = {
        "observedGeneration": generation,
        "conditions": cond.merge_conditions(previous.get("conditions"), current, cond.now_rfc3339()),
        "classes": class_status(sizing) if sizing is not None else previous.get("classes") or [],
        "warnings": result.warnings,
    }
    if sizing is not None:
        status["overhead"] = overhead_status(sizing)
        status["runtime"] = sizing.runtime.value
        status["classNames"] = ",".join(c.name for c in sizing.classes)
    else:
        for kept in ("overhead", "runtime", "classNames"):
            if previous.get(kept) is not None:
                status[kept] = previous[kept]
    nodes = result.nodes if result.nodes is not None else previous.get("nodes")
    if nodes is not None:
        status["nodes"] = nodes
    unmanaged = result.unmanaged if result.unmanaged is not None else previous.get("unmanagedRuntimeClasses")
    if unmanaged is not None:
        status["unmanagedRuntimeClasses"] = unmanaged
    pod_audit = result.pod_audit if result.pod_audit is not None else previous.get("podAudit")
    if pod_audit is not None:
        status["podAudit"] = pod_audit
    for key, value in (("measurement", result.measurement), ("proposal", result.proposal)):
        if value is None:
            if previous.get(key) is not None:
                status[key] = previous[key]
        elif value:
            status[key] = value
        elif previous.get(key) is not None:
            status[key] = None  # a merge patch's null removes the field
    return status


def status_changed(body: dict, status: dict) -> bool:
    previous = body.get("status") or {}
    return any(previous.get(k) != status.get(k) for k in OWNED_STATUS_FIELDS)


# --- the entry points the handlers call ------------------------------------------------------


async def reconcile(
    api, body: dict, trigger: Trigger, cache: DesiredCache, sink: EventSink,
    nodes: list[NodeFacts] | None = None,
    audit_findings: list | None = None,
    children: LiveChildren | None = None,
    admission_versions: dict[str, str] | None = None,
    pod_findings: list[dict] | None = None,
    webhook_serving: bool | None = None,
    measurement: dict | None = None,
    proposal: dict | None = None,
) -> PassResult:
    """One pass for one policy: validate, render, apply the difference, write status if changed."""
    name = (body.get("metadata") or {}).get("name")
    ref = policy_ref(body)
    result = PassResult()
    sizing = None
    try:
        policy = parse_policy(body)
        sizing = size_policy(policy)
        result.invalid = [str(p) for p in sizing.errors]
        result.warnings = [str(p) for p in sizing.warnings]
    except PolicyError as exc:
        result.invalid = list(exc.problems)

    if result.invalid:
        # Nothing is written: the objects of the last valid generation stay exactly as they were.
        previous_valid = (body.get("status") or {}).get("conditions") or []
        already_said = any(
            c.get("type") == cond.VALID and c.get("status") == "False"
            and c.get("observedGeneration") == (body.get("metadata") or {}).get("generation")
            for c in previous_valid
        )
        if not already_said:
            sink(ref, "Warning", cond.EVENT_INVALID, "; ".join(result.invalid))
        await _write_status(api, name, body, compute_status(body, result, None))
        return result

    rendered = render_policy(policy, nodes=nodes, sizing=sizing)
    guidance_errors = [str(p) for p in rendered.problems if p.severity == Severity.ERROR and p not in sizing.errors]
    desired = build_desired(policy, rendered, body, admission_versions)
    cache.put(desired)  # before writing, so our own writes never look like drift
    applied = await apply_desired(api, desired, trigger, cache, sink, children)
    applied.warnings = result.warnings + [f"node guidance: {e}" for e in guidance_errors] + [
        f"admission: the API server does not serve {what}; not written" for what in desired.unserved
        if not desired.unserved_expected(what)] + routing_warnings(policy, desired, webhook_serving)
    applied.nodes = nodes_status(rendered) if nodes is not None else None
    if audit_findings is not None:
        applied.unmanaged = unmanaged_status(audit_findings)
        if (applied.unmanaged != (body.get("status") or {}).get("unmanagedRuntimeClasses")
                and cache.first_time(name, cond.EVENT_UNMANAGED, applied.unmanaged)):
            errors = [r for r in applied.unmanaged if r["severity"] == "error"]
            sink(ref, "Warning" if errors else "Normal", cond.EVENT_UNMANAGED, (
                f"{len(applied.unmanaged)} finding(s) on Kata RuntimeClasses no policy manages "
                f"({len(errors)} error(s)); see status.unmanagedRuntimeClasses. First: "
                f"{applied.unmanaged[0]['runtimeClass']}: {applied.unmanaged[0]['message']}"))
    if pod_findings is not None:
        applied.pod_audit = pod_audit_status(pod_findings)
        announce_pod_audit(cache, sink, ref, name, body, applied.pod_audit)
    applied.measurement, applied.proposal = measurement, proposal
    if applied.writes:
        sink(ref, "Normal", cond.EVENT_APPLIED, "; ".join(applied.writes))
    if applied.warnings != (body.get("status") or {}).get("warnings") and cache.first_time(
            name, cond.EVENT_WARNING, applied.warnings):
        # Valid, but an administrator should hear of it once (docs/rules.md: status, events, validate).
        sink(ref, "Warning", cond.EVENT_WARNING, "; ".join(applied.warnings))
    if not _conflict_already_said(body, applied.conflicts) and cache.first_time(
            name, cond.EVENT_CONFLICT, "; ".join(applied.conflicts)):
        sink(ref, "Warning", cond.EVENT_CONFLICT, "; ".join(applied.conflicts))
    await _write_status(api, name, body, compute_status(body, applied, sizing))
    return applied


def routing_warnings(policy: KataSizingPolicy, desired: Desired, webhook_serving: bool | None) -> list[str]:
    """The routing falls to the operator's webhook (routing Webhook, or Auto without a served
    MutatingAdmissionPolicy) but this operator serves none (`--webhook-port`): nobody routes."""
    if webhook_serving is not False or not policy.spec.admission.enabled:
        return []
    falls_to_webhook = desired.routing == "Webhook" or any(
        w.startswith("MutatingAdmissionPolicy") for w in desired.unserved if desired.unserved_expected(w))
    if not falls_to_webhook:
        return []
    return ["admission: opted-in pods are routed by the operator's webhook here, but it runs without "
            "--webhook-port (install overlays/webhook/ or the chart's webhook.enabled): they are not routed, "
            "and the envelope policy refuses them (pod-not-routed)"]


def announce_pod_audit(cache: DesiredCache, sink: EventSink, ref: dict, name: str, body: dict, audit: dict) -> None:
    """A Warning event when the list of pods outside their class changes (not on every pass, nor
    again after a restart when the status already shows the same list)."""
    listed = audit["listed"]
    said = [(row["pod"], row["rule"]) for row in listed]
    previous = ((body.get("status") or {}).get("podAudit") or {})
    if previous.get("listed") == listed and previous.get("pods") == audit["pods"]:
        cache.first_time(name, cond.EVENT_POD_AUDIT, (audit["pods"], tuple(said)))
        return
    if not listed:
        cache.first_time(name, cond.EVENT_POD_AUDIT, None)  # forget: the next finding is news again
        return
    if not cache.first_time(name, cond.EVENT_POD_AUDIT, (audit["pods"], tuple(said))):
        return
    counts = ", ".join(f"{c['pods']} {c['rule']} on class {c['class']}" for c in audit["counts"])
    first = listed[0]
    sink(ref, "Warning", cond.EVENT_POD_AUDIT, (
        f"{audit['pods']} Kata pod(s) outside their class ({counts}); see status.podAudit. "
        f"First: {first['pod']}: {first['message']}"))


def _conflict_already_said(body: dict, conflicts: list[str]) -> bool:
    """The status already reports these conflicts: a resync must not post the event again."""
    for c in (body.get("status") or {}).get("conditions") or []:
        if c.get("type") == cond.CONFLICT:
            return c.get("status") == "True" and c.get("message") == "; ".join(conflicts)
    return False


async def _write_status(api, name: str, body: dict, status: dict) -> None:
    metrics.policy_status(name, status)
    if status_changed(body, status):
        try:
            await api.patch_policy_status(name, {"status": status})
        except NotFound:
            pass  # the policy is gone; nothing to report on


async def delete_children(api, body: dict, cache: DesiredCache, children: LiveChildren | None = None) -> list[str]:
    """On policy deletion: remove what the operator created, nothing else."""
    meta = body.get("metadata") or {}
    name, uid = meta.get("name"), meta.get("uid")
    desired = cache.drop(name)
    live = await _live_children(api, name, children)
    chart_owned = bool(desired and desired.guarded) or (
        ((body.get("spec") or {}).get("runtimeClass") or {}).get("managedBy") == "KataDeploy"
    )
    removed = []
    for key, have in live.items():
        if not is_ours(have, name, uid):
            continue
        if key[0] == "RuntimeClass" and chart_owned:
            continue
        await _delete(api, key, (have.get("metadata") or {}).get("uid"), children)
        removed.append(describe(key))
    return removed


async def handle_child_event(
    api, cache: DesiredCache, event_type: str | None, obj: dict, sink: EventSink,
    count_drift: Callable[[str, str], Awaitable[None]], children: LiveChildren | None = None,
) -> str | None:
    """A watched RuntimeClass or ConfigMap changed (`obj`, or for DELETED the last state seen):
    put it back (Correct) or report it (Report)."""
    key = obj_key(obj)
    desired = cache.for_child(key, obj)
    if desired is None:
        return None
    found = desired.lookup(key)
    if found is None:
        return None
    want, owned = found
    guarded = not owned
    owner = (desired.policy_name, desired.policy_uid)
    deleted = event_type == "DELETED"
    if deleted:
        if not is_ours(obj, *owner):
            return None  # somebody else's object with our name went away: the next pass creates ours
        # Also what a label-selected watch sends when our label was removed: the watch may lag; trust the API.
        have = await _read(api, key)
        if have is not None and not differences(want, have, guarded):
            return None
        diff = ["(deleted)"] if have is None else differences(want, have, guarded)
    else:
        have = obj
        diff = differences(want, have, guarded)
        if not diff:
            return None
    if have is not None and not is_ours(have, *owner):
        # Neither our labels nor our ownerReference: somebody else's object that has one of our
        # names (a Conflict the next pass reports). Never overwrite it.
        return None
    if key[0] == "RuntimeClass" and have is not None and have.get("handler") != want.get("handler"):
        if owned and desired.drift_policy == "Correct":
            await _recreate(api, key, want, have, children)
            message = f"{describe(key)}: handler changed by hand; re-created"
            sink(desired.ref, "Normal", cond.EVENT_DRIFT_CORRECTED, message)
            await count_drift(desired.policy_name, "driftCorrections")
            return message
    if desired.drift_policy == "Report" or (have is None and not owned):
        _report_once(cache, sink, desired, key, have, diff)
        await count_drift(desired.policy_name, "driftDetected")
        return f"reported {describe(key)}: {', '.join(diff)}"
    try:
        done = await _write_with_retry(
            api, key, want, have, create=owned, guarded=guarded, children=children, owner=owner)
    except NotOurs:
        return None
    if done is None:
        return None
    message = f"{describe(key)} was changed by hand ({', '.join(diff)}); {done.split(' ')[0]} from the policy"
    sink(desired.ref, "Normal", cond.EVENT_DRIFT_CORRECTED, message)
    await count_drift(desired.policy_name, "driftCorrections")
    return message


async def increment_counter(api, policy_name: str, field_name: str) -> None:
    """status.<field> += 1 without losing a concurrent increment: JSON patch with a test."""
    for _ in range(CONFLICT_RETRIES):
        body = await api.read_policy(policy_name)
        if body is None:
            return
        current = (body.get("status") or {}).get(field_name)
        if current is None:
            ops = [{"op": "add", "path": f"/status/{field_name}", "value": 1}]
            if body.get("status") is None:
                ops = [{"op": "add", "path": "/status", "value": {field_name: 1}}]
            else:
                ops.insert(0, {"op": "test", "path": "/status", "value": body["status"]})
        else:
            ops = [
                {"op": "test", "path": f"/status/{field_name}", "value": current},
                {"op": "replace", "path": f"/status/{field_name}", "value": current + 1},
            ]
        try:
            await api.patch_policy_status(policy_name, ops)
            return
        except (Conflict, Invalid):
            continue
        except NotFound:
            return
