"""List+watch caches (informers): Nodes and Pods for node guidance and the pod audit, and the
RuntimeClasses, ConfigMaps and admission objects the operator manages, so a reconcile reads its
live children from memory.

kopf's per-object machinery (one worker per object) is made for handlers; for 20,000 pods
whose only use is a sum per node it is far too slow at start-up. An informer keeps one
summary per object (only the fields the operator uses) from a paginated list, then follows
a watch from that list's resourceVersion, re-listing on 410 Gone; a dropped connection backs
off (capped, with jitter) and resumes the watch. Memory is bounded by the summaries, not by
the cluster's objects: the list is read a page at a time and each page is dropped once
summarized.

A raise that is not an API failure (a bug: in a summary, or in the `on_change` of a consumer)
ends `run`, which `retry.keep_running` says and starts again after its back-off; a change the
consumer did not take is undone in the cache first, so the fresh list that starts the next run
finds it again and tells it then: a raise loses no change.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable, Hashable
from collections.abc import Set as AbstractSet
from typing import Generic, TypeVar, cast

from ..core.crdgen import CRD_NAME
from ..core.render import MANAGED_BY, MANAGED_BY_LABEL, POLICY_LABEL
from .api_errors import ApiError
from .compare import is_shared
from .kinds import ADMISSION_GROUP, KINDS, ObjKey
from .retry import WATCH_RETRY_BASE_S, WATCH_RETRY_CAP_S, backoff_s

log = logging.getLogger("kata_sizing.informer")

T = TypeVar("T")
# Each watch asks the server to end it after between this and twice this many seconds, as
# client-go's reflector does (5 to 10 minutes), so reconnects of many clients spread out.
WATCH_TIMEOUT_S = int(os.environ.get("KATA_SIZING_WATCH_TIMEOUT_SECONDS", "300"))
# Objects per list page: 500 is what client-go's reflector asks for (its pager's default).
PAGE_SIZE = 500

ChangeCallback = Callable[[Hashable, "T | None", "T | None"], None]


def uid_key(obj: dict) -> Hashable:
    meta = obj.get("metadata") or {}
    return meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"


class Informer(Generic[T]):
    """`items` maps key(obj) to summarize(obj) for every object of `kind` (a summary of None
    leaves the object out). `on_change(key, before, after)` is called for every change after the
    first sync, and for every difference a re-list finds. `collection` names it in metrics and
    logs (the kind's plural by default)."""

    def __init__(
        self, api, kind: str, summarize: Callable[[dict], T | None], *,
        key: Callable[[dict], Hashable] = uid_key, label_selector: str | None = None,
        on_change: ChangeCallback | None = None, page_size: int = PAGE_SIZE, collection: str | None = None,
        field_selector: str | None = None,
    ):
        self.api = api
        self.kind = kind
        self.collection = collection or KINDS[kind].plural
        self.summarize = summarize
        self.key = key
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.on_change = on_change
        self.page_size = page_size
        self.items: dict[Hashable, T] = {}
        self.synced = asyncio.Event()
        self.version = 0  # bumps on every change, so consumers can tell whether to recompute
        self.resource_version = ""

    def _changed(self, key: Hashable, before: T | None, after: T | None) -> None:
        self.version += 1
        if self.on_change is not None and self.synced.is_set():
            self.on_change(key, before, after)

    def _put(self, key: Hashable, summary: T | None) -> None:
        if summary is None:
            self.items.pop(key, None)
        else:
            self.items[key] = summary

    def _deliver(self, changes: list[tuple[Hashable, T | None, T | None]]) -> None:
        """Report changes the cache holds already, in order; when `on_change` raises, the ones it
        did not take are undone in the cache (the next list finds them again), and the raise goes on."""
        for taken, (key, before, after) in enumerate(changes):
            try:
                self._changed(key, before, after)
            except Exception:
                for untaken, was, _ in changes[taken:]:
                    self._put(untaken, was)
                raise

    def _apply(self, event_type: str, obj: dict) -> None:
        key = self.key(obj)
        summary = None if event_type == "DELETED" else self.summarize(obj)
        before = self.items.get(key)
        self._put(key, summary)
        if before != summary:
            self._deliver([(key, before, summary)])

    def record(self, obj: dict) -> None:
        """Write-through: the operator's own write, so a reconcile right after it does not
        see the older object (the watch event for it comes a moment later, with the same
        content). Not reported to on_change: it is not somebody else's edit."""
        key = self.key(obj)
        summary = self.summarize(obj)
        if summary is None:
            self.items.pop(key, None)
        else:
            self.items[key] = summary
        self.version += 1

    def forget(self, obj: dict) -> None:
        self.items.pop(self.key(obj), None)
        self.version += 1

    async def _relist(self) -> None:
        fresh: dict[Hashable, T] = {}
        continue_token = None
        while True:
            page, list_version, continue_token = await self.api.list_page(
                self.kind, limit=self.page_size, continue_token=continue_token,
                label_selector=self.label_selector, field_selector=self.field_selector,
            )
            for obj in page:
                summary = self.summarize(obj)
                if summary is not None:
                    fresh[self.key(obj)] = summary
            del page
            if not continue_token:
                break
        self.resource_version = list_version
        before, self.items = self.items, fresh
        if self.synced.is_set():
            self._deliver([(key, before.get(key), fresh.get(key)) for key in before.keys() | fresh.keys()
                           if before.get(key) != fresh.get(key)])
        else:
            self.version += 1
        self.synced.set()

    async def run(self) -> None:
        failures = 0
        need_list = True
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                timeout_s = random.randint(WATCH_TIMEOUT_S, 2 * WATCH_TIMEOUT_S)
                async for event in self.api.watch_raw(
                    self.kind, self.resource_version, timeout_s, label_selector=self.label_selector,
                    field_selector=self.field_selector,
                ):
                    event_type, obj = event.get("type"), event.get("object") or {}
                    if event_type == "ERROR":
                        # 410 Gone: our resourceVersion is older than the server keeps.
                        need_list = True
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self.resource_version = rv
                    if event_type in ("ADDED", "MODIFIED", "DELETED"):
                        self._apply(event_type, obj)
                failures = 0
            except ApiError as exc:
                need_list = need_list or exc.status == 410
                delay = backoff_s(failures, WATCH_RETRY_BASE_S, WATCH_RETRY_CAP_S)
                failures += 1
                log.warning("%s informer: %s; retrying in %.2fs", self.collection, exc, delay)
                await asyncio.sleep(delay)


def policy_crd(api, on_gone: Callable[[], None]) -> Informer:
    """The policies' own CustomResourceDefinition, followed by name: `on_gone` is called when the
    CRD the operator saw is being deleted (its deletionTimestamp set: the API server deletes every
    policy, then the CRD) or is gone. kopf's watch of the policies would meet 404 once it is."""
    def changed(_key: Hashable, before: dict | None, after: dict | None) -> None:
        if before is not None and not before["deleting"] and (after is None or after["deleting"]):
            on_gone()

    return Informer(api, "CustomResourceDefinition",
                    lambda crd: {"deleting": bool((crd.get("metadata") or {}).get("deletionTimestamp"))},
                    key=name_key, on_change=changed, field_selector=f"metadata.name={CRD_NAME}")


# --- the managed children: slim copies, indexed by policy ----------------------------------

# Fields the operator never reads nor writes back. A replace (PUT) without managedFields
# keeps the server's; everything else of an object is kept so a PUT built from the cached
# copy loses nothing somebody else wrote. The install's shared admission objects keep theirs: they
# say who installed them, in whose name the operator writes them (compare.Installer).
_DROPPED_METADATA = ("managedFields",)


def slim_child(kind: str) -> Callable[[dict], dict]:
    def summarize(obj: dict) -> dict:
        meta = obj.get("metadata") or {}
        if not is_shared(obj):
            meta = {k: v for k, v in meta.items() if k not in _DROPPED_METADATA}
        return {**{k: v for k, v in obj.items() if k != "metadata"}, "kind": kind, "metadata": meta}

    return summarize


def name_key(obj: dict) -> Hashable:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace"), meta.get("name"))


class HeldNames:
    """Names of a label-selected kind (ConfigMaps) last found held by somebody else's object, which
    the cache does not hold. Any other miss in the cache is taken as absent, and a create that
    finds the name taken (409) reads it then (execute): creating a policy's ConfigMaps costs no
    read (docs/performance.md); a name found taken is read by each pass until it is free."""

    held_by_others: set[ObjKey]

    def complete(self, key: ObjKey) -> bool:
        raise NotImplementedError

    def hides(self, key: ObjKey) -> bool:
        """Whether a miss in the cache may hide an object that exists."""
        return not self.complete(key) and key in self.held_by_others

    def held(self, key: ObjKey, by_another: bool) -> None:
        """What a read or a write found at `key`: somebody else's object, or not (ours, or none)."""
        if by_another:
            self.held_by_others.add(key)
        else:
            self.held_by_others.discard(key)


class ChildCache(HeldNames):
    """The RuntimeClasses (every one: the audit looks at all Kata classes), the managed
    ConfigMaps (selected by the managed-by label on the server) and the admission objects (every
    one), as reconcile reads them: `get(key)` and `of_policy(name)`, both from memory.

    `admission_versions` ({kind: version}, from discovery) says which admission kinds the server
    serves; only those are followed (a kind the server does not serve would 404 forever)."""

    def __init__(self, api, on_change: Callable[[ObjKey, dict | None, dict | None], None] | None = None,
                 admission_versions: dict[str, str] | None = None):
        self._on_change = on_change
        managed = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
        self.runtime_classes = Informer(
            api, "RuntimeClass", slim_child("RuntimeClass"), key=name_key, on_change=self._changed("RuntimeClass"))
        self.config_maps = Informer(
            api, "ConfigMap", slim_child("ConfigMap"), key=name_key,
            label_selector=managed, on_change=self._changed("ConfigMap"))
        self.admission_versions = dict(admission_versions or {})
        # Every admission object, not only ours (a cluster holds few): a name missing from the
        # cache is then free, as for RuntimeClasses, and creating a policy's six costs no read.
        self.admission = {
            kind: Informer(
                api, kind, slim_child(kind), key=name_key, on_change=self._changed(kind),
                collection=f"{ADMISSION_GROUP}/{version}/{KINDS[kind].plural}")
            for kind, version in sorted(self.admission_versions.items())
        }
        self._by_kind: dict[str, Informer] = {
            "RuntimeClass": self.runtime_classes, "ConfigMap": self.config_maps, **self.admission}
        self.by_policy: dict[str, set[ObjKey]] = {}
        self.held_by_others: set[ObjKey] = set()
        # The install's shared admission objects that were deleted, as last seen (with who wrote
        # them): a put-back writes what their installer had written (plan.shared_installer).
        self.remembered: dict[ObjKey, dict] = {}
        # (the names last given to runtime_classes_except, them as the cache's keys).
        self._excluded: tuple[AbstractSet[str], frozenset[Hashable]] | None = None

    def informers(self) -> list[Informer]:
        return list(self._by_kind.values())

    def kinds(self) -> list[str]:
        return list(self._by_kind)

    def _changed(self, kind: str) -> ChangeCallback:
        def changed(key: Hashable, before: dict | None, after: dict | None) -> None:
            namespace, name = cast(tuple[str | None, str], key)
            obj_key = (kind, namespace, name)
            self._index(obj_key, before, after)
            if after is not None:
                self.remembered.pop(obj_key, None)
            elif before is not None and is_shared(before):
                self.remembered[obj_key] = before
            if self._on_change is not None:
                self._on_change(obj_key, before, after)

        return changed

    def _index(self, key: ObjKey, before: dict | None, after: dict | None) -> None:
        old, new = _policy_of(before), _policy_of(after)
        if old and old != new:
            self.by_policy.get(old, set()).discard(key)
        if new:
            self.by_policy.setdefault(new, set()).add(key)

    def _informer(self, kind: str) -> Informer | None:
        return self._by_kind.get(kind)

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers()))
        if not self.by_policy:
            self.reindex()

    def reindex(self) -> None:
        self.by_policy = {}
        for kind, informer in self._by_kind.items():
            for key, obj in informer.items.items():
                namespace, name = cast(tuple[str | None, str], key)
                self._index((kind, namespace, name), None, obj)

    def get(self, key: ObjKey) -> dict | None:
        kind, namespace, name = key
        informer = self._informer(kind)
        return informer.items.get((namespace, name)) if informer is not None else None

    def complete(self, key: ObjKey) -> bool:
        """Whether a miss in the cache means the object does not exist: true for RuntimeClasses
        and admission objects (all are cached); a ConfigMap without our label is not cached."""
        return key[0] == "RuntimeClass" or key[0] in self.admission

    def of_policy(self, policy_name: str) -> dict[ObjKey, dict]:
        found = {}
        for key in list(self.by_policy.get(policy_name, ())):
            obj = self.get(key)
            if obj is not None and _policy_of(obj) == policy_name:
                found[key] = obj
        return found

    def runtime_classes_except(self, names: AbstractSet[str]) -> list[dict]:
        """The RuntimeClasses whose names are not in `names`, by name: a set difference of the
        cache's keys (with `names` as keys kept while the same set is given), not a scan of its
        objects, which every pass after a RuntimeClass write paid at 200 policies' 800 classes."""
        if self._excluded is None or self._excluded[0] is not names:
            self._excluded = (names, frozenset((None, name) for name in names))
        items = self.runtime_classes.items
        # The keys are name_key's (None, name): sorted, by name.
        return [items[key] for key in sorted(cast(set[tuple[None, str]], items.keys() - self._excluded[1]))]

    def record(self, obj: dict) -> None:
        meta = obj.get("metadata") or {}
        key = (obj.get("kind") or "", meta.get("namespace"), meta.get("name") or "")
        informer = self._informer(key[0])
        if informer is None:
            return
        before = informer.items.get((key[1], key[2]))
        informer.record(obj)
        self.remembered.pop(key, None)
        self._index(key, before, informer.items.get((key[1], key[2])))

    def forget(self, key: ObjKey) -> None:
        informer = self._informer(key[0])
        if informer is None:
            return
        before = informer.items.pop((key[1], key[2]), None)
        informer.version += 1
        self._index(key, before, None)


def _policy_of(obj: dict | None) -> str | None:
    if not obj:
        return None
    return ((obj.get("metadata") or {}).get("labels") or {}).get(POLICY_LABEL)
