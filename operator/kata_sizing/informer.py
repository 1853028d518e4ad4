"""A small list+watch cache (an informer) for Nodes and Pods, feeding node guidance.

kopf's per-object machinery (one worker per object) is made for handlers; for 20,000 pods
whose only use is a sum per node it is far too slow at start-up. This keeps one summary per
object from a list, then follows a watch from that list's resourceVersion, re-listing on
410 Gone; a dropped connection backs off and resumes the watch.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Generic, TypeVar

from .kube import ApiError

log = logging.getLogger("kata_sizing.informer")

T = TypeVar("T")
WATCH_TIMEOUT_S = 300
BACKOFF_S = (0.1, 0.5, 1, 2, 5, 10)


class Informer(Generic[T]):
    def __init__(self, api, collection: str, summarize: Callable[[dict], T | None]):
        self.api = api
        self.collection = collection
        self.summarize = summarize
        self.items: dict[str, T] = {}
        self.synced = asyncio.Event()
        self.version = 0  # bumps on every change, so consumers can tell whether to recompute
        self.resource_version = ""

    def _key(self, obj: dict) -> str:
        meta = obj.get("metadata") or {}
        return meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"

    def _apply(self, event_type: str, obj: dict) -> None:
        key = self._key(obj)
        summary = None if event_type == "DELETED" else self.summarize(obj)
        before = self.items.get(key)
        if summary is None:
            self.items.pop(key, None)
        else:
            self.items[key] = summary
        if before != summary:
            self.version += 1

    async def _relist(self) -> None:
        items, self.resource_version = await self.api.list_raw(self.collection)
        fresh = {}
        for obj in items:
            summary = self.summarize(obj)
            if summary is not None:
                fresh[self._key(obj)] = summary
        if fresh != self.items:
            self.items = fresh
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
                async for event in self.api.watch_raw(self.collection, self.resource_version, WATCH_TIMEOUT_S):
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
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the cache must outlive any one failure
                if isinstance(exc, ApiError) and exc.status == 410:
                    need_list = True
                elif not isinstance(exc, ApiError):
                    need_list = True
                    log.exception("%s informer failed unexpectedly", self.collection)
                delay = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                failures += 1
                log.warning("%s informer: %s; retrying in %ss", self.collection, exc, delay)
                await asyncio.sleep(delay)
