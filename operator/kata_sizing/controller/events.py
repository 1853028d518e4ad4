"""Kubernetes Events on the policies (docs/operation.md, Events), through the operator's own API
client: the passes' and the measurement's, one emitter for both.

core/v1 Events, as `kubectl describe ksp` and `kubectl get events` show them: a policy is
cluster-scoped, so its events live in namespace `default` (the API server takes an event of a
cluster-scoped object there, and kubectl looks for it there). Posting runs in the background: a
pass never waits for an event, and an event that cannot be posted is logged and dropped (events
are a record for people, not state). The same event (object, type, reason, message) again within
AGGREGATE_S raises the count of the one already posted (a merge patch of count and
lastTimestamp), as client-go's recorder does, instead of posting a second object.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from .api_errors import ApiError, NotFound

log = logging.getLogger("kata_sizing.events")

COMPONENT = "kata-sizing"
EVENT_NAMESPACE = "default"
# The API server keeps events an hour (--event-ttl); client-go aggregates within 10 minutes.
AGGREGATE_S = 600.0
# Events remembered for aggregation, and events waiting to be posted; beyond these the oldest
# is forgotten, or the newest dropped with a warning (a server that takes no event for long).
REMEMBERED = 1024
PENDING = 1024
# An event's message is cut to this many characters (the full text is in status).
MAX_MESSAGE_CHARS = 1000


class EventSink(Protocol):
    def __call__(self, ref: Mapping, type_: str, reason: str, message: str) -> None: ...


@dataclass
class _Posted:
    name: str
    count: int
    at: float  # when it was last posted or counted, by the poster's clock


def _timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventPoster:
    """`poster(ref, type_, reason, message)` queues an event on the object `ref` (apiVersion,
    kind, metadata.name and uid) and returns at once; `run()` posts them in order."""

    def __init__(self, api, instance: str = COMPONENT, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.instance = instance
        self.clock = clock
        self._pending: asyncio.Queue[tuple[Mapping, str, str, str] | None] = asyncio.Queue(PENDING)
        self._closed = False
        self._posted: OrderedDict[tuple, _Posted] = OrderedDict()
        self._serial = 0

    def __call__(self, ref: Mapping, type_: str, reason: str, message: str) -> None:
        if self._closed:
            log.info("event %s %s not posted (stopping): %s", type_, reason, message)
            return
        try:
            self._pending.put_nowait((ref, type_, reason, message[:MAX_MESSAGE_CHARS]))
        except asyncio.QueueFull:
            log.warning("event %s %s not posted (%d waiting): %s", type_, reason, PENDING, message)

    async def run(self) -> None:
        """Post the events in order, until `close()` (what was queued before it is posted)."""
        while (item := await self._pending.get()) is not None:
            ref, type_, reason, message = item
            try:
                await self.post(ref, type_, reason, message)
            except ApiError as exc:
                log.warning("event %s %s on %s not posted: %s", type_, reason,
                            (ref.get("metadata") or {}).get("name"), exc)

    def close(self) -> None:
        """No more events: `run()` posts what is queued and returns."""
        self._closed = True
        while True:
            try:
                self._pending.put_nowait(None)
                return
            except asyncio.QueueFull:
                self._pending.get_nowait()  # the newest is dropped rather than the stop

    async def post(self, ref: Mapping, type_: str, reason: str, message: str) -> None:
        meta = ref.get("metadata") or {}
        involved = {"apiVersion": ref.get("apiVersion"), "kind": ref.get("kind"), "name": meta.get("name"),
                    "uid": meta.get("uid")}
        key = (involved["kind"], involved["name"], involved["uid"], type_, reason, message)
        now, stamp = self.clock(), _timestamp()
        seen = self._posted.get(key)
        if seen is not None and now - seen.at < AGGREGATE_S:
            try:
                await self.api.patch(("Event", EVENT_NAMESPACE, seen.name),
                                     {"count": seen.count + 1, "lastTimestamp": stamp})
                seen.count, seen.at = seen.count + 1, now
                self._posted.move_to_end(key)
                return
            except NotFound:
                pass  # expired: post it anew
        self._serial += 1
        name = f"{involved['name']}.{time.time_ns():x}{self._serial:x}"
        await self.api.create({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": EVENT_NAMESPACE},
            "involvedObject": {k: v for k, v in involved.items() if v is not None},
            "type": type_, "reason": reason, "message": message,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT, "reportingInstance": self.instance,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        })
        self._posted[key] = _Posted(name, 1, now)
        self._posted.move_to_end(key)
        while len(self._posted) > REMEMBERED:
            self._posted.popitem(last=False)
