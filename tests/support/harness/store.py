"""
The object store behind the emulator: the write semantics of a real kube-apiserver.

Everything here is synchronous and guarded by one re-entrant lock, so HTTP handlers
(in the emulator's event loop) and tests (in their own threads) can share it.
Watch streams are fed through per-stream asyncio queues owned by the emulator's loop.
"""
from __future__ import annotations

import asyncio
import builtins
import collections
import copy
import dataclasses
import datetime
import random
import string
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jsonpatch
import jsonpointer

from .selectors import Matcher

JsonObject = dict[str, Any]
ResourceKey = tuple[str, str, str]  # (group, version, plural)
ObjectKey = tuple[ResourceKey, str | None, str]  # (resource, namespace, name)


class ApiError(Exception):
    """An error that the HTTP layer renders as a ``kind: Status`` body with this code."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details or {})

    def as_status(self) -> JsonObject:
        status: JsonObject = {
            'kind': 'Status',
            'apiVersion': 'v1',
            'metadata': {},
            'status': 'Failure',
            'message': self.message,
            'reason': self.reason,
            'code': self.code,
        }
        if self.details:
            status['details'] = self.details
        return status


@dataclasses.dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: frozenset[str] = frozenset()

    @property
    def key(self) -> ResourceKey:
        return (self.group, self.version, self.plural)

    @property
    def api_version(self) -> str:
        return f'{self.group}/{self.version}' if self.group else self.version

    @property
    def qualified_plural(self) -> str:
        return f'{self.plural}.{self.group}' if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        return f'{self.kind}.{self.group}' if self.group else self.kind

    @property
    def has_status_subresource(self) -> bool:
        return 'status' in self.subresources


def not_found(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(404, 'NotFound', f'{rtype.qualified_plural} "{name}" not found',
                    {'name': name, 'group': rtype.group, 'kind': rtype.plural})


def already_exists(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(409, 'AlreadyExists', f'{rtype.qualified_plural} "{name}" already exists',
                    {'name': name, 'group': rtype.group, 'kind': rtype.plural})


def conflict(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(409, 'Conflict',
                    f'Operation cannot be fulfilled on {rtype.qualified_plural} "{name}": the object has been'
                    f' modified; please apply your changes to the latest version and try again',
                    {'name': name, 'group': rtype.group, 'kind': rtype.plural})


def invalid(rtype: ResourceType, name: str, field: str, cause: str, value: Any = None) -> ApiError:
    detail = f'Invalid value: {_go_quote(value)}: {cause}' if value is not None else cause
    return ApiError(422, 'Invalid', f'{rtype.qualified_kind} "{name}" is invalid: {field}: {detail}',
                    {'name': name, 'group': rtype.group, 'kind': rtype.kind,
                     'causes': [{'reason': 'FieldValueInvalid', 'message': detail, 'field': field}]})


def _go_quote(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


Validator = Callable[[ResourceType, JsonObject | None, JsonObject], None]


def runtimeclass_handler_rules(rtype: ResourceType, old: JsonObject | None, new: JsonObject) -> None:
    """RuntimeClass.handler is required and immutable (node.k8s.io/v1 validation)."""
    if rtype.group != 'node.k8s.io' or rtype.plural != 'runtimeclasses':
        return
    name = new.get('metadata', {}).get('name', '')
    handler = new.get('handler')
    if not handler:
        raise invalid(rtype, name, 'handler', 'Required value')
    if old is not None and old.get('handler') != handler:
        raise invalid(rtype, name, 'handler', 'field is immutable', handler)


DEFAULT_VALIDATORS: tuple[Validator, ...] = (runtimeclass_handler_rules,)


@dataclasses.dataclass(frozen=True)
class StoredEvent:
    resource_version: int
    resource: ResourceKey
    type: str  # ADDED | MODIFIED | DELETED
    object: JsonObject
    previous: JsonObject | None  # the state before, for selector transitions in watches

    @property
    def namespace(self) -> str | None:
        return self.object.get('metadata', {}).get('namespace')

    def as_seen_through(self, matcher: Matcher) -> JsonObject | None:
        """
        The event as a filtered watch sees it: an object that starts or stops
        matching the selectors arrives as ADDED or DELETED, like in the real API.
        """
        now_matches = matcher(self.object)
        before_matched = self.previous is not None and matcher(self.previous)
        if self.type == 'ADDED':
            kind = 'ADDED' if now_matches else None
        elif self.type == 'DELETED':
            kind = 'DELETED' if now_matches or before_matched else None
        elif now_matches and before_matched:
            kind = 'MODIFIED'
        elif now_matches:
            kind = 'ADDED'
        elif before_matched:
            kind = 'DELETED'
        else:
            kind = None
        return None if kind is None else {'type': kind, 'object': copy.deepcopy(self.object)}


class Watcher:
    """One open watch stream: events are handed over to the emulator's loop in commit order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, rtype: ResourceType, namespace: str | None) -> None:
        self.loop = loop
        self.resource = rtype
        self.namespace = namespace
        self.queue: asyncio.Queue[StoredEvent | None] = asyncio.Queue()

    def wants(self, event: StoredEvent) -> bool:
        return event.resource == self.resource.key and self.namespace in (None, event.namespace)

    def offer(self, event: StoredEvent | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is reading this stream any more
            pass

    def close(self) -> None:
        self.offer(None)


def now_timestamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; strategic-merge patches are treated the same way."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(copy.deepcopy(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if key.startswith('$'):  # strategic-merge directives have no merge-patch meaning
            continue
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _spec_content(obj: Mapping[str, Any], status_is_separate: bool) -> JsonObject:
    """What metadata.generation tracks: everything but metadata (and status, if a subresource)."""
    ignored = {'metadata', 'status'} if status_is_separate else {'metadata'}
    return {key: value for key, value in obj.items() if key not in ignored}


class ObjectStore:
    def __init__(
        self,
        *,
        history_limit: int = 10_000,
        validators: Iterable[Validator] = DEFAULT_VALIDATORS,
        garbage_collection: bool = True,
    ) -> None:
        self.lock = threading.RLock()
        self.validators: list[Validator] = list(validators)
        self.garbage_collection = garbage_collection
        self._history_limit = history_limit
        self._objects: dict[ObjectKey, JsonObject] = {}
        self._types: dict[ResourceKey, ResourceType] = {}
        self._resource_version = 0
        self._history: collections.deque[StoredEvent] = collections.deque()
        self._compacted_up_to = 0  # events with this or an older resourceVersion are forgotten
        self._watchers: set[Watcher] = set()

    # --- bookkeeping ---------------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        with self.lock:
            return str(self._resource_version)

    def _next_resource_version(self) -> str:
        self._resource_version += 1
        return str(self._resource_version)

    def _record(self, rtype: ResourceType, kind: str, obj: JsonObject, previous: JsonObject | None) -> None:
        event = StoredEvent(int(obj['metadata']['resourceVersion']), rtype.key, kind,
                            copy.deepcopy(obj), copy.deepcopy(previous))
        if len(self._history) >= self._history_limit:
            self._compacted_up_to = self._history.popleft().resource_version
        self._history.append(event)
        for watcher in list(self._watchers):
            if watcher.wants(event):
                watcher.offer(event)

    def compact(self) -> None:
        """Forget the whole event history, as etcd compaction does; older watches get 410 Gone."""
        with self.lock:
            self._history.clear()
            self._compacted_up_to = self._resource_version

    @staticmethod
    def _key(rtype: ResourceType, namespace: str | None, name: str) -> ObjectKey:
        return (rtype.key, namespace if rtype.namespaced else None, name)

    def _existing(self, rtype: ResourceType, namespace: str | None, name: str) -> JsonObject:
        obj = self._objects.get(self._key(rtype, namespace, name))
        if obj is None:
            raise not_found(rtype, name)
        return obj

    def _validate(self, rtype: ResourceType, old: JsonObject | None, new: JsonObject) -> None:
        for validator in self.validators:
            validator(rtype, old, new)

    # --- reading -------------------------------------------------------------------------------

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> JsonObject:
        with self.lock:
            return copy.deepcopy(self._existing(rtype, namespace, name))

    def list(
        self, rtype: ResourceType, namespace: str | None = None, matcher: Matcher | None = None,
        offset: int = 0, limit: int | None = None,
    ) -> tuple[builtins.list[JsonObject], str]:
        """Matching objects in (namespace, name) order; with `limit`, only that page is copied
        (a page of 500 out of 100,000 pods must not copy all of them)."""
        items, _, version = self.list_page(rtype, namespace, matcher, offset, limit)
        return items, version

    def list_page(
        self, rtype: ResourceType, namespace: str | None = None, matcher: Matcher | None = None,
        offset: int = 0, limit: int | None = None,
    ) -> tuple[builtins.list[JsonObject], int, str]:
        """(the page, how many matching objects follow it, the store's resourceVersion)."""
        with self.lock:
            matching = [
                obj for (rkey, obj_namespace, _), obj in sorted(
                    self._objects.items(), key=lambda item: (item[0][1] or '', item[0][2]))
                if rkey == rtype.key and namespace in (None, obj_namespace)
                if matcher is None or matcher(obj)
            ]
            end = len(matching) if limit is None else offset + limit
            page = [copy.deepcopy(obj) for obj in matching[offset:end]]
            return page, max(0, len(matching) - end), str(self._resource_version)

    def open_watch(
        self, loop: asyncio.AbstractEventLoop, rtype: ResourceType, namespace: str | None, since: str | None,
    ) -> tuple[builtins.list[StoredEvent], Watcher, str]:
        """
        The events a new watch starts with, the watcher for everything after them,
        and the resourceVersion at that moment.
        Both are taken under the store lock, so nothing falls between a list and a watch.
        """
        with self.lock:
            if since in (None, '', '0'):
                initial = [
                    StoredEvent(int(obj['metadata']['resourceVersion']), rkey, 'ADDED', copy.deepcopy(obj), None)
                    for (rkey, obj_namespace, _), obj in self._objects.items()
                    if rkey == rtype.key and namespace in (None, obj_namespace)
                ]
            else:
                try:
                    since_version = int(since)
                except ValueError:
                    raise ApiError(400, 'BadRequest', f'invalid resource version: {since!r}') from None
                if since_version < self._compacted_up_to:
                    raise ApiError(410, 'Expired', f'too old resource version: {since_version}'
                                                   f' ({self._compacted_up_to + 1})')
                initial = [event for event in self._history
                           if event.resource_version > since_version
                           if event.resource == rtype.key and namespace in (None, event.namespace)]
            watcher = Watcher(loop, rtype, namespace)
            self._watchers.add(watcher)
            return initial, watcher, str(self._resource_version)

    def close_watch(self, watcher: Watcher) -> None:
        with self.lock:
            self._watchers.discard(watcher)

    def drop_watches(self, resource_key: ResourceKey | None = None) -> int:
        with self.lock:
            dropped = [w for w in self._watchers if resource_key is None or w.resource.key == resource_key]
            for watcher in dropped:
                self._watchers.discard(watcher)
                watcher.close()
            return len(dropped)

    @property
    def open_watch_count(self) -> int:
        with self.lock:
            return len(self._watchers)

    # --- writing -------------------------------------------------------------------------------

    def create(
        self, rtype: ResourceType, namespace: str | None, body: Mapping[str, Any],
        *, dry_run: bool = False, enforce: bool = True,
    ) -> JsonObject:
        """POST a new object. With ``enforce=False`` (direct test writes) status and validation rules are skipped."""
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault('metadata', {})
        name = meta.get('name')
        if not name and meta.get('generateName'):
            name = meta['generateName'] + ''.join(random.choices(string.ascii_lowercase + string.digits, k=5))
        if not name:
            raise ApiError(422, 'Invalid', f'{rtype.qualified_kind} "" is invalid: metadata.name: Required value:'
                                           f' name or generateName is required')
        if rtype.namespaced:
            if namespace and meta.get('namespace') and meta['namespace'] != namespace:
                raise ApiError(400, 'BadRequest', 'the namespace of the provided object does not match'
                                                  ' the namespace sent on the request')
            namespace = namespace or meta.get('namespace')
            if not namespace:
                raise ApiError(400, 'BadRequest', f'a namespace is required for {rtype.qualified_plural}')
            meta['namespace'] = namespace
        else:
            meta.pop('namespace', None)
            namespace = None
        meta['name'] = name
        obj['apiVersion'] = rtype.api_version
        obj['kind'] = rtype.kind
        if enforce and rtype.has_status_subresource:
            obj.pop('status', None)
        for server_owned in ('deletionTimestamp', 'deletionGracePeriodSeconds', 'resourceVersion'):
            meta.pop(server_owned, None)
        meta['uid'] = str(uuid.uuid4())
        meta['creationTimestamp'] = now_timestamp()
        meta['generation'] = 1

        with self.lock:
            key = self._key(rtype, namespace, name)
            if key in self._objects:
                raise already_exists(rtype, name)
            if enforce:
                self._validate(rtype, None, obj)
            if dry_run:
                return obj
            meta['resourceVersion'] = self._next_resource_version()
            self._types[rtype.key] = rtype
            self._objects[key] = obj
            self._record(rtype, 'ADDED', obj, None)
            return copy.deepcopy(obj)

    def replace(
        self, rtype: ResourceType, namespace: str | None, name: str, body: Mapping[str, Any],
        *, subresource: str | None = None, dry_run: bool = False, enforce: bool = True,
    ) -> JsonObject:
        """PUT: a stale metadata.resourceVersion in the body is a 409 Conflict."""
        candidate = copy.deepcopy(dict(body))
        body_name = candidate.get('metadata', {}).get('name')
        if body_name and body_name != name:
            raise ApiError(400, 'BadRequest', f'the name of the object ({body_name}) does not match'
                                              f' the name on the URL ({name})')
        with self.lock:
            old = self._existing(rtype, namespace, name)
            expected_version = candidate.get('metadata', {}).get('resourceVersion')
            if expected_version and expected_version != old['metadata']['resourceVersion']:
                raise conflict(rtype, name)
            return self._commit_update(rtype, old, candidate, subresource=subresource,
                                       dry_run=dry_run, enforce=enforce)

    def patch(
        self, rtype: ResourceType, namespace: str | None, name: str, patch_type: str, patch: Any,
        *, subresource: str | None = None, dry_run: bool = False, enforce: bool = True,
    ) -> JsonObject:
        """PATCH with ``json`` (RFC 6902, with ``test``), ``merge`` (RFC 7386) or ``strategic`` (as merge)."""
        with self.lock:
            old = self._existing(rtype, namespace, name)
            if patch_type == 'json':
                if not isinstance(patch, list):
                    raise ApiError(400, 'BadRequest', 'json patch must be a list of operations')
                try:
                    candidate = jsonpatch.JsonPatch(patch).apply(copy.deepcopy(old))
                except jsonpatch.JsonPatchTestFailed as e:
                    raise ApiError(422, 'Invalid', 'the server rejected our request due to an error in our'
                                                   f' request: {e}', {'causes': [{'message': str(e)}]}) from e
                except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
                    raise ApiError(422, 'Invalid', f'the server rejected our request due to an error in our'
                                                   f' request: {e}', {'causes': [{'message': str(e)}]}) from e
            elif patch_type in ('merge', 'strategic'):
                if not isinstance(patch, Mapping):
                    raise ApiError(400, 'BadRequest', 'merge patch must be a JSON object')
                expected_version = (patch.get('metadata') or {}).get('resourceVersion')
                if expected_version and expected_version != old['metadata']['resourceVersion']:
                    raise conflict(rtype, name)
                candidate = merge_patch(old, patch)
            else:
                raise ApiError(415, 'UnsupportedMediaType', f'the patch type {patch_type!r} is not supported')
            return self._commit_update(rtype, old, candidate, subresource=subresource,
                                       dry_run=dry_run, enforce=enforce)

    def _commit_update(
        self, rtype: ResourceType, old: JsonObject, candidate: JsonObject,
        *, subresource: str | None, dry_run: bool, enforce: bool,
    ) -> JsonObject:
        status_is_separate = enforce and rtype.has_status_subresource
        if subresource == 'status':
            new = copy.deepcopy(old)
            if 'status' in candidate:
                new['status'] = candidate['status']
            else:
                new.pop('status', None)
        elif subresource is not None:
            raise not_found(rtype, old['metadata']['name'])
        else:
            new = candidate
            if status_is_separate:
                if 'status' in old:
                    new['status'] = copy.deepcopy(old['status'])
                else:
                    new.pop('status', None)

        old_meta = old['metadata']
        meta = new.setdefault('metadata', {})
        new['apiVersion'] = old['apiVersion']
        new['kind'] = old['kind']
        for immutable in ('name', 'namespace', 'uid', 'creationTimestamp', 'generation', 'resourceVersion',
                          'deletionTimestamp', 'deletionGracePeriodSeconds'):
            if immutable in old_meta:
                meta[immutable] = old_meta[immutable]
            else:
                meta.pop(immutable, None)
        if old_meta.get('deletionTimestamp'):
            added = set(meta.get('finalizers') or []) - set(old_meta.get('finalizers') or [])
            if added and enforce:
                raise ApiError(422, 'Invalid', f'{rtype.qualified_kind} "{old_meta["name"]}" is invalid:'
                                               f' metadata.finalizers: Forbidden: no new finalizers can be added'
                                               f' if the object is being deleted, found new finalizers'
                                               f' {sorted(added)}')
        if enforce:
            self._validate(rtype, old, new)
        if new == old:  # a no-op write changes nothing, not even the resourceVersion
            return copy.deepcopy(old)
        if subresource != 'status' and (_spec_content(new, status_is_separate)
                                         != _spec_content(old, status_is_separate)):
            meta['generation'] = int(old_meta.get('generation', 1)) + 1
        if dry_run:
            return new

        meta['resourceVersion'] = self._next_resource_version()
        key = self._key(rtype, meta.get('namespace'), meta['name'])
        if meta.get('deletionTimestamp') and not meta.get('finalizers'):
            self._remove(rtype, key, new, previous=old)
        else:
            self._objects[key] = new
            self._record(rtype, 'MODIFIED', new, old)
        return copy.deepcopy(new)

    def delete(
        self, rtype: ResourceType, namespace: str | None, name: str,
        *, preconditions: Mapping[str, Any] | None = None, dry_run: bool = False, force: bool = False,
    ) -> JsonObject:
        """An object with finalizers only gets a deletionTimestamp; ``force`` ignores finalizers."""
        with self.lock:
            old = self._existing(rtype, namespace, name)
            old_meta = old['metadata']
            preconditions = preconditions or {}
            for field in ('uid', 'resourceVersion'):
                if preconditions.get(field) and preconditions[field] != old_meta.get(field):
                    raise conflict(rtype, name)
            if dry_run:
                return copy.deepcopy(old)
            key = self._key(rtype, namespace, name)
            if old_meta.get('finalizers') and not force:
                if old_meta.get('deletionTimestamp'):
                    return copy.deepcopy(old)
                new = copy.deepcopy(old)
                new['metadata']['deletionTimestamp'] = now_timestamp()
                new['metadata']['deletionGracePeriodSeconds'] = 0
                new['metadata']['resourceVersion'] = self._next_resource_version()
                self._objects[key] = new
                self._record(rtype, 'MODIFIED', new, old)
                return copy.deepcopy(new)
            new = copy.deepcopy(old)
            new['metadata']['resourceVersion'] = self._next_resource_version()
            self._remove(rtype, key, new, previous=old)
            return copy.deepcopy(new)

    def _remove(self, rtype: ResourceType, key: ObjectKey, final: JsonObject, previous: JsonObject) -> None:
        del self._objects[key]
        self._record(rtype, 'DELETED', final, previous)
        if self.garbage_collection:
            self._collect_garbage(rtype, final)

    def _collect_garbage(self, rtype: ResourceType, removed: JsonObject) -> None:
        """
        Cascade like the garbage collector in the foreground: objects in a deleted namespace,
        and dependents whose every owner (by ownerReferences uid) is gone.
        """
        doomed: list[tuple[ResourceType, JsonObject]] = []
        if rtype.key == ('', 'v1', 'namespaces'):
            doomed += [(self._types[rkey], obj) for (rkey, namespace, _), obj in self._objects.items()
                       if namespace == removed['metadata']['name']]
        live_uids = {obj['metadata']['uid'] for obj in self._objects.values()}
        removed_uid = removed['metadata']['uid']
        for (rkey, _, _), obj in self._objects.items():
            owner_uids = {ref.get('uid') for ref in obj['metadata'].get('ownerReferences') or []}
            if removed_uid in owner_uids and not owner_uids & live_uids:
                doomed.append((self._types[rkey], obj))
        for doomed_type, obj in doomed:
            meta = obj['metadata']
            if self._key(doomed_type, meta.get('namespace'), meta['name']) in self._objects:
                self.delete(doomed_type, meta.get('namespace'), meta['name'])
