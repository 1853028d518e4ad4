"""Desired against live, field by field: which fields differ and the body that puts them back.

Pure. The rules of what counts as the operator's field live here and only here: quantities
compare by value (the API server may print 1Gi for 1024Mi), other people's labels and
annotations are not drift, on a chart's RuntimeClass (KataDeploy mode, `guarded`) only what the
policy decides is, on an admission object a field the server filled in at its default is not,
and on the install's shared admission objects only the spec is (their labels and annotations are
their installer's, who also keeps the API server's record of who wrote each field: `Installer`).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.quantity import QuantityError, parse_quantity
from ..core.render import MANAGED_BY_LABEL, POLICY_LABEL, SHARED_ADMISSION, SHARED_LABEL
from .kinds import is_admission_kind


def _same_quantity(a: Any, b: Any) -> bool:
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
    `app.kubernetes.io/managed-by: Helm` over ours: that key is Helm's there, not drift. On the
    install's shared admission objects none: every label there is the installer's (the one that
    makes them the install's, `katasizing.dev/shared`, is how they are recognised: `is_shared`)."""
    if is_shared(desired):
        return {}
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


# The same desired admission object against the same live one, compared again: every pass
# compares each of its objects, and the echo of every write is compared once more; the shared
# admission policies are about 25 KB of CEL each, field by field (docs/performance.md). Objects
# are never changed in place (a cache replaces a live object on each event; the desired ones are
# built per generation), so their identity stands for their content; the entries hold them.
_COMPARED: OrderedDict[tuple[int, int], tuple[dict, dict, list[str]]] = OrderedDict()
COMPARED_ENTRIES = 256


def _admission_spec_differences(desired: dict, live: dict) -> list[str]:
    key = (id(desired), id(live))
    found = _COMPARED.get(key)
    if found is not None and found[0] is desired and found[1] is live:
        _COMPARED.move_to_end(key)
        return list(found[2])
    differing = spec_differences(desired.get("spec") or {}, live.get("spec") or {})
    _COMPARED[key] = (desired, live, differing)
    if len(_COMPARED) > COMPARED_ENTRIES:
        _COMPARED.popitem(last=False)
    return list(differing)


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
        found += _admission_spec_differences(desired, live)
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
    wanted = desired["metadata"].get("ownerReferences") or []
    # A reference to an earlier policy of the same name (deleted and made again before the garbage
    # collector reached this object) is replaced by ours: the API server refuses an object with
    # two controllers, and the object is this policy's now.
    owners = [o for o in meta.get("ownerReferences") or []
              if not any(_same_owner_named(o, w) and o.get("uid") != w["uid"] for w in wanted)]
    owner_uids = {o.get("uid") for o in owners}
    for owner in wanted:
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


def _same_owner_named(live: dict, wanted: dict) -> bool:
    return all(live.get(k) == wanted.get(k) for k in ("apiVersion", "kind", "name"))


def is_shared(obj: dict | None) -> bool:
    """One of the install's shared admission objects (the admission policies every policy's
    bindings name, and whatever else `kata-sizing render --shared` prints), by the label the
    install promises, whoever installed it: kubectl, Helm and Flux's helm-controller (which stamp
    `app.kubernetes.io/managed-by: Helm` and `meta.helm.sh/release-*` over the chart's), Flux's
    kustomize-controller, Argo CD. Their names carry the contract version (`-v1`), so the name a
    policy's render wants is the version its parameters are written for."""
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(SHARED_LABEL) == SHARED_ADMISSION


def is_ours(live: dict, policy_name: str, policy_uid: str | None) -> bool:
    """Labelled for this policy, or owned by it, or one of the install's shared admission objects.
    Otherwise the managed-by label is not looked at: Helm replaces it with its own on the
    RuntimeClasses the kata-deploy chart creates from our values, and on the shared objects."""
    meta = live.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(POLICY_LABEL) == policy_name:
        return True
    if is_shared(live):
        return True
    return bool(policy_uid) and any(o.get("uid") == policy_uid for o in meta.get("ownerReferences") or [])


# --- writing a shared object as its installer wrote it --------------------------------------------

# An annotation that describes one object only (client-side `kubectl apply`'s record of what it
# applied there): never copied from one shared object onto another.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


@dataclass(frozen=True)
class Installer:
    """Who wrote a shared admission object, read from a copy of it (docs/gitops.md, one owner):
    the field manager that set its `katasizing.dev/shared` label in the API server's record
    (`metadata.managedFields`), whether that manager applies server-side (Helm 4, `kubectl apply
    --server-side`, Argo CD with ServerSideApply) or writes whole objects (client-side `kubectl
    apply`, Helm 3 and Flux's helm-controller), and the labels and annotations it set. `manager`
    None: the copy says nothing of it (no managedFields), and the operator writes in its own
    name; `labels` None: there is no copy, and the object is written as the render prints it."""

    manager: str | None = None
    server_side: bool = False
    labels: Mapping[str, str] | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)


def _owned_keys(fields: Mapping, section: str) -> set[str] | None:
    owned = ((fields.get("f:metadata") or {}).get(f"f:{section}"))
    if owned is None:
        return None
    return {k.removeprefix("f:") for k in owned if k.startswith("f:")}


def installer_of(copy_of: dict, same_object: bool = True) -> Installer:
    """The installer of a shared object, from a copy of it (`same_object`), or of the shared set
    it belongs to, from a copy of another of its objects (whose per-object annotations are not
    this object's). Of the managers that set the install's label, one that applies server-side
    and the latest of those: a later server-side apply is what the next upgrade repeats."""
    meta = copy_of.get("metadata") or {}
    labels, annotations = dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})
    if not same_object:
        annotations.pop(LAST_APPLIED, None)
    setters = [e for e in meta.get("managedFields") or []
               if SHARED_LABEL in (_owned_keys(e.get("fieldsV1") or {}, "labels") or set())]
    if not setters:
        return Installer(labels=labels, annotations=annotations)
    entry = max(setters, key=lambda e: (e.get("operation") == "Apply", e.get("time") or ""))
    fields = entry.get("fieldsV1") or {}
    owned_labels, owned_annotations = _owned_keys(fields, "labels") or set(), _owned_keys(fields, "annotations") or set()
    return Installer(
        manager=entry.get("manager") or None, server_side=entry.get("operation") == "Apply",
        labels={k: v for k, v in labels.items() if k in owned_labels},
        annotations={k: v for k, v in annotations.items() if k in owned_annotations})


def as_installed(desired: dict, installer: Installer) -> dict:
    """`desired` as its installer writes it: the installer's labels and annotations (those the
    render prints where nothing is known of them), the policy's spec. For a server-side installer
    this is the apply configuration the operator applies in the installer's name; otherwise the
    object it creates."""
    meta: dict[str, Any] = {"name": desired["metadata"]["name"]}
    if installer.labels is None:
        labels, annotations = desired["metadata"].get("labels") or {}, desired["metadata"].get("annotations") or {}
    else:
        labels, annotations = installer.labels, installer.annotations
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": desired["apiVersion"], "kind": desired["kind"], "metadata": meta,
            "spec": copy.deepcopy(desired.get("spec") or {})}
