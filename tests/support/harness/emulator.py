"""
A strict Kubernetes API emulator for tests: kmock 0.8 plus the server semantics it lacks.

It serves HTTP on 127.0.0.1 from its own thread and event loop, so synchronous tests,
the `kubernetes` client and a kopf operator running in yet another thread can all use it.
kmock is pinned exactly (0.8); this module relies on its internals: the request parsing
of ``RawHandler.__call__`` (and its ``parse_path``, mended for the namespaces collection below),
the ``_handle`` hook, and ``ResourcesArray``/``ResourceInfo`` as the registry of served resources.
"""
from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import dataclasses
import json
import pathlib
import re
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import aiohttp.web
import kmock
import yarl
from kmock._internal import parsing as kmock_parsing

from .selectors import Matcher, SelectorError, parse_field_selector, parse_label_selector
from .store import DEFAULT_VALIDATORS, ApiError, JsonObject, ObjectStore, ResourceType, Validator

ALL_VERBS = ('create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch')
WRITE_METHODS = frozenset({'POST', 'PUT', 'PATCH', 'DELETE'})
SERVER_VERSION = {
    'major': '1', 'minor': '34', 'gitVersion': 'v1.34.0', 'gitCommit': 'kmock-emulator',
    'gitTreeState': 'clean', 'buildDate': '2026-01-01T00:00:00Z', 'goVersion': 'go1.24.0',
    'compiler': 'gc', 'platform': 'linux/amd64',
}
PATCH_TYPES = {
    'application/json-patch+json': 'json',
    'application/merge-patch+json': 'merge',
    'application/strategic-merge-patch+json': 'strategic',
}


_kmock_parse_path = kmock_parsing.parse_path


def _parse_path(path: str) -> kmock_parsing.ParsedPath:
    """kmock 0.8 takes the `namespaces` of ``/api/v1/namespaces`` (the list and watch of namespaces)
    for the prefix of a namespace's objects and fails on the name missing after it (a 500 for every
    list of namespaces); that path is the collection itself."""
    parts = path.strip('/').split('/')
    if len(parts) == 3 and parts[0] == 'api' and parts[2] == 'namespaces':
        return kmock_parsing.ParsedPath(group='', version=parts[1], plural='namespaces')
    return _kmock_parse_path(path)


kmock_parsing.parse_path = _parse_path


def _info(kind: str, *, namespaced: bool, shortnames: tuple[str, ...] = (),
          subresources: tuple[str, ...] = ()) -> kmock.ResourceInfo:
    return kmock.ResourceInfo(kind=kind, singular=kind.lower(), namespaced=namespaced, verbs=set(ALL_VERBS),
                              shortnames=set(shortnames), subresources=set(subresources))


def default_resources() -> dict[str, kmock.ResourceInfo]:
    """The resources served unless the caller passes its own; extend with ``add_resource``."""
    return {
        'v1/namespaces': _info('Namespace', namespaced=False, shortnames=('ns',), subresources=('status',)),
        'v1/configmaps': _info('ConfigMap', namespaced=True, shortnames=('cm',)),
        'v1/events': _info('Event', namespaced=True, shortnames=('ev',)),
        'v1/nodes': _info('Node', namespaced=False, shortnames=('no',), subresources=('status',)),
        'v1/pods': _info('Pod', namespaced=True, shortnames=('po',), subresources=('status',)),
        'node.k8s.io/v1/runtimeclasses': _info('RuntimeClass', namespaced=False),
        'katasizing.dev/v1alpha1/katasizingpolicies': _info(
            'KataSizingPolicy', namespaced=False, shortnames=('ksp',), subresources=('status',)),
        'apiextensions.k8s.io/v1/customresourcedefinitions': _info(
            'CustomResourceDefinition', namespaced=False, shortnames=('crd', 'crds'), subresources=('status',)),
        'events.k8s.io/v1/events': _info('Event', namespaced=True, shortnames=('ev',)),
        'coordination.k8s.io/v1/leases': _info('Lease', namespaced=True),
        # The generated admission objects (issue 10), as a 1.37 server serves them.
        'admissionregistration.k8s.io/v1/validatingadmissionpolicies': _info(
            'ValidatingAdmissionPolicy', namespaced=False, subresources=('status',)),
        'admissionregistration.k8s.io/v1/validatingadmissionpolicybindings': _info(
            'ValidatingAdmissionPolicyBinding', namespaced=False),
        'admissionregistration.k8s.io/v1/mutatingadmissionpolicies': _info(
            'MutatingAdmissionPolicy', namespaced=False),
        'admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings': _info(
            'MutatingAdmissionPolicyBinding', namespaced=False),
    }


class RequestRecord(NamedTuple):
    method: str
    path: str
    query: Mapping[str, str]
    status: int
    body: Any = None  # the parsed JSON body of the request, if any
    user_agent: str = ''  # which client sent it (replicas of one operator name themselves here)
    at: float = 0.0  # time.monotonic() when the request came in

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS

    @property
    def is_watch(self) -> bool:
        return self.method == 'GET' and self.query.get('watch') in ('true', '1')


@dataclasses.dataclass
class FaultRule:
    """Requests matching all given regexes fail with ``status`` and/or wait ``latency`` seconds."""
    method: re.Pattern[str] | None
    path: re.Pattern[str] | None
    query: re.Pattern[str] | None
    remaining: int | None  # None: until cleared
    status: int | None = None
    reason: str | None = None
    message: str | None = None
    latency: float = 0.0
    hits: int = 0

    def matches(self, method: str, path: str, query_string: str) -> bool:
        return (
            (self.remaining is None or self.remaining > 0)
            and (self.method is None or self.method.fullmatch(method) is not None)
            and (self.path is None or self.path.search(path) is not None)
            and (self.query is None or self.query.search(query_string) is not None)
        )

    def consume(self) -> None:
        self.hits += 1
        if self.remaining is not None:
            self.remaining -= 1


def _compile(pattern: str | re.Pattern[str] | None, flags: int = 0) -> re.Pattern[str] | None:
    return None if pattern is None else pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, flags)


_NODE_PROXY = re.compile(r'/api/v1/nodes/([^/]+)/proxy/(.*)')

_FAULT_REASONS = {409: 'Conflict', 410: 'Expired', 429: 'TooManyRequests', 500: 'InternalError',
                  503: 'ServiceUnavailable', 504: 'Timeout', 403: 'Forbidden', 404: 'NotFound'}


class ResourceObjects:
    """
    Direct, thread-safe access to the stored objects of one resource, bypassing HTTP.
    Writes still stamp metadata and emit watch events, but skip validation and keep
    ``.status`` as given (these are the test's own "admin" writes).
    """

    def __init__(self, store: ObjectStore, rtype: ResourceType) -> None:
        self._store = store
        self.resource = rtype

    def get(self, name: str, namespace: str | None = None) -> JsonObject | None:
        with contextlib.suppress(ApiError):
            return self._store.get(self.resource, namespace, name)
        return None

    def list(self, namespace: str | None = None, label_selector: str | None = None) -> builtins.list[JsonObject]:
        return self._store.list(self.resource, namespace, parse_label_selector(label_selector))[0]

    def names(self, namespace: str | None = None) -> builtins.list[str]:
        return [obj['metadata']['name'] for obj in self.list(namespace)]

    def create(self, obj: Mapping[str, Any], namespace: str | None = None, *, enforce: bool = False) -> JsonObject:
        """With ``enforce``, as a client's POST: status dropped where it is a subresource, validation run."""
        return self._store.create(self.resource, namespace, obj, enforce=enforce)

    def replace(self, obj: Mapping[str, Any], namespace: str | None = None) -> JsonObject:
        """As a client's PUT: a stale metadata.resourceVersion is a 409, validation runs (a
        RuntimeClass's handler is immutable), status stays apart where it is a subresource."""
        meta = obj.get('metadata', {})
        return self._store.replace(self.resource, namespace or meta.get('namespace'), meta['name'], obj)

    def put(self, obj: Mapping[str, Any], namespace: str | None = None) -> JsonObject:
        """Create, or replace unconditionally (ignoring the body's resourceVersion)."""
        meta = obj.get('metadata', {})
        namespace = namespace or meta.get('namespace')
        if self.get(meta['name'], namespace) is None:
            return self.create(obj, namespace)
        body = dict(obj, metadata={k: v for k, v in meta.items() if k != 'resourceVersion'})
        return self._store.replace(self.resource, namespace, meta['name'], body, enforce=False)

    def patch(self, name: str, patch: Any, namespace: str | None = None, *,
              patch_type: str = 'merge', subresource: str | None = None) -> JsonObject:
        return self._store.patch(self.resource, namespace, name, patch_type, patch,
                                 subresource=subresource, enforce=False)

    def delete(self, name: str, namespace: str | None = None, *, force: bool = False) -> JsonObject | None:
        """Delete like the API does (finalizers only mark it), or remove outright with ``force``."""
        with contextlib.suppress(ApiError):
            return self._store.delete(self.resource, namespace, name, force=force)
        return None

    def __len__(self) -> int:
        return len(self.list())

    def __iter__(self) -> Iterator[JsonObject]:
        return iter(self.list())


class KubernetesApiEmulator(kmock.KubernetesScaffold):
    """
    Usage::

        with running_emulator() as emu:
            emu.kubeconfig  # a kubeconfig file for http://127.0.0.1:PORT, no auth
            emu.objects('runtimeclasses').put({...})
            emu.fail_next(3, status=500, method='PATCH', path='/runtimeclasses/')
            emu.request_log, emu.write_requests(), emu.reset_request_log()

    Paths that are neither discovery nor served resources fall through to kmock's own
    DSL (``emu['get /healthz'] << b'ok'``), and then to a 404.
    """

    def __init__(
        self,
        *,
        resources: Mapping[str, kmock.ResourceInfo] | None = None,
        validators: tuple[Validator, ...] = DEFAULT_VALIDATORS,
        history_limit: int = 10_000,
        garbage_collection: bool = True,
    ) -> None:
        super().__init__()
        for key, info in (default_resources() if resources is None else resources).items():
            self.resources[key] = info
        self.store = ObjectStore(history_limit=history_limit, validators=validators,
                                 garbage_collection=garbage_collection)
        self.server_errors: list[BaseException] = []  # emulator bugs, rendered as 500s
        self.kubeconfig: pathlib.Path | None = None
        self._faults: list[FaultRule] = []
        self._faults_lock = threading.Lock()
        self._log: list[RequestRecord] = []
        self._log_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._startup_error: BaseException | None = None
        self._port: int | None = None
        # GET /api/v1/nodes/NAME/proxy/PATH: see serve_node_proxy.
        self._node_proxy: Any = None

    def __repr__(self) -> str:
        return f'<{type(self).__name__} {self.base_url if self._port else "(not running)"}>'

    # --- resources -----------------------------------------------------------------------------

    def add_resource(self, key: str, *, kind: str, namespaced: bool, shortnames: tuple[str, ...] = (),
                     subresources: tuple[str, ...] = (), singular: str | None = None) -> ResourceType:
        """Serve one more resource, e.g. ``add_resource('apps/v1/deployments', kind='Deployment', ...)``."""
        info = _info(kind, namespaced=namespaced, shortnames=shortnames, subresources=subresources)
        info.singular = singular or kind.lower()
        self.resources[key] = info
        return self.resource_type(key)

    def resource_types(self) -> list[ResourceType]:
        types = []
        for resource in list(self.resources):
            assert isinstance(resource, kmock.resource)  # the registry's keys, whatever its hints say
            info = self.resources[resource]
            types.append(ResourceType(
                group=resource.group or '', version=resource.version or 'v1', plural=resource.plural or '',
                kind=info.kind or (resource.plural or '').capitalize(), namespaced=bool(info.namespaced),
                subresources=frozenset(info.subresources)))
        return types

    def resource_type(self, spec: str | ResourceType | kmock.resource) -> ResourceType:
        """
        Resolve ``'node.k8s.io/v1/runtimeclasses'``, ``'v1/configmaps'``, ``'runtimeclasses.node.k8s.io'``,
        a plural, a kind or a short name. An ambiguous name (``events``) means the core group.
        """
        if isinstance(spec, ResourceType):
            return spec
        types = self.resource_types()
        if isinstance(spec, kmock.resource) or '/' in spec:
            wanted = spec if isinstance(spec, kmock.resource) else kmock.resource(spec)
            candidates = [t for t in types if (t.group, t.version, t.plural) ==
                          (wanted.group or '', wanted.version or t.version, wanted.plural)]
        elif '.' in spec:
            plural, group = spec.split('.', 1)
            candidates = [t for t in types if t.plural == plural and t.group == group]
        else:
            lowered = spec.lower()
            candidates = [t for t in types if lowered in (t.plural, t.kind.lower())
                          or lowered in self.resources[kmock.resource(*t.key)].shortnames]
        if len(candidates) > 1:
            candidates = [t for t in candidates if t.group == ''] or candidates
        if len(candidates) != 1:
            raise LookupError(f"No single served resource matches {spec!r}: {candidates!r}")
        return candidates[0]

    def _served(self, group: str, version: str, plural: str) -> ResourceType | None:
        for rtype in self.resource_types():
            if rtype.key == (group, version, plural):
                return rtype
        return None

    def objects(self, resource: str | ResourceType | kmock.resource) -> ResourceObjects:
        return ResourceObjects(self.store, self.resource_type(resource))

    # --- fault injection and the request log (thread-safe) ---------------------------------------

    def fail_next(self, count: int | None = 1, *, status: int = 500, method: str | None = None,
                  path: str | re.Pattern[str] | None = None, query: str | re.Pattern[str] | None = None,
                  reason: str | None = None, message: str | None = None) -> FaultRule:
        """
        The next ``count`` requests (None: all, until ``clear_faults``) whose method fully matches
        ``method`` (a regex, case-insensitive) and whose path/query string contain ``path``/``query``
        (regexes) get ``status`` with a ``kind: Status`` body and change nothing.
        """
        rule = FaultRule(method=_compile(method, re.IGNORECASE), path=_compile(path), query=_compile(query),
                         remaining=count, status=status, reason=reason or _FAULT_REASONS.get(status, 'Failure'),
                         message=message or f'injected fault: HTTP {status}')
        with self._faults_lock:
            self._faults.append(rule)
        return rule

    def conflict_next(self, count: int | None = 1, *, method: str = 'PUT|PATCH',
                      path: str | re.Pattern[str] | None = None) -> FaultRule:
        """Simulate lost races: the next ``count`` matching writes get 409 Conflict."""
        return self.fail_next(count, status=409, method=method, path=path, reason='Conflict',
                              message='Operation cannot be fulfilled: the object has been modified;'
                                      ' please apply your changes to the latest version and try again')

    def add_latency(self, seconds: float, *, method: str | None = None, path: str | re.Pattern[str] | None = None,
                    query: str | re.Pattern[str] | None = None, count: int | None = None) -> FaultRule:
        rule = FaultRule(method=_compile(method, re.IGNORECASE), path=_compile(path), query=_compile(query),
                         remaining=count, latency=seconds)
        with self._faults_lock:
            self._faults.append(rule)
        return rule

    def serve_node_proxy(self, handler: Any) -> None:
        """Answer ``GET /api/v1/nodes/NAME/proxy/PATH`` (the API server's proxy to a kubelet) with
        ``await handler(name, path)``, which returns an ``aiohttp.web.Response``; it runs on the
        emulator's loop, so it may sleep (a kubelet that never answers). The node must exist, as
        the API server resolves it first; without a handler the path is 404."""
        self._node_proxy = handler

    def clear_faults(self) -> None:
        with self._faults_lock:
            self._faults.clear()

    def drop_watches(self, resource: str | ResourceType | kmock.resource | None = None) -> int:
        """Close the open watch streams (of one resource, or all); returns how many were closed."""
        key = None if resource is None else self.resource_type(resource).key
        return self.store.drop_watches(key)

    @property
    def open_watch_count(self) -> int:
        return self.store.open_watch_count

    def compact_history(self) -> None:
        """Forget all watch history: a watch from any older resourceVersion gets 410 Gone."""
        self.store.compact()

    @property
    def request_log(self) -> list[RequestRecord]:
        with self._log_lock:
            return list(self._log)

    def requests(self, method: str | None = None, path: str | re.Pattern[str] | None = None,
                 *, include_watches: bool = True) -> list[RequestRecord]:
        method_re, path_re = _compile(method, re.IGNORECASE), _compile(path)
        return [r for r in self.request_log
                if method_re is None or method_re.fullmatch(r.method)
                if path_re is None or path_re.search(r.path)
                if include_watches or not r.is_watch]

    def write_requests(self, path: str | re.Pattern[str] | None = None) -> list[RequestRecord]:
        """POST/PUT/PATCH/DELETE requests, e.g. to assert that a resync wrote nothing."""
        return self.requests('POST|PUT|PATCH|DELETE', path)

    def reset_request_log(self) -> None:
        with self._log_lock:
            self._log.clear()

    def _record_request(self, raw: aiohttp.web.BaseRequest, status: int, body: Any,
                        at: float | None = None) -> None:
        with self._log_lock:
            self._log.append(RequestRecord(raw.method, raw.path, dict(raw.query), status, body,
                                           raw.headers.get('User-Agent', ''), time.monotonic() if at is None else at))

    def _take_faults(self, raw: aiohttp.web.BaseRequest) -> tuple[float, FaultRule | None]:
        latency, failure = 0.0, None
        with self._faults_lock:
            for rule in self._faults:
                if not rule.matches(raw.method, raw.path, raw.query_string):
                    continue
                if rule.status is None:
                    latency += rule.latency
                    rule.consume()
                elif failure is None:
                    failure = rule
                    rule.consume()
        return latency, failure

    # --- HTTP ------------------------------------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None  # always set for requests that came over HTTP
        response: aiohttp.web.StreamResponse
        arrived = time.monotonic()
        try:
            latency, failure = self._take_faults(raw)
            if latency:
                await asyncio.sleep(latency)
            if failure is not None:
                raise ApiError(failure.status or 500, failure.reason or 'Failure', failure.message or '')
            response = await self._dispatch(request, raw)
        except ApiError as e:
            response = aiohttp.web.json_response(e.as_status(), status=e.code)
        except kmock.KubernetesError as e:
            response = aiohttp.web.json_response(
                ApiError(e.status, (e.reason or 'NotFound').replace(' ', ''), e.message or '').as_status(),
                status=e.status)
        except NotImplementedError:
            response = aiohttp.web.json_response(
                ApiError(404, 'NotFound', 'the server could not find the requested resource').as_status(),
                status=404)
        except Exception as e:
            self.server_errors.append(e)
            response = aiohttp.web.json_response(
                ApiError(500, 'InternalError', f'emulator failure: {e!r}').as_status(), status=500)
        if not response.prepared:  # streams are logged when they start, not when they end
            self._record_request(raw, response.status, request.data, arrived)
        return response

    async def _dispatch(self, request: kmock.Request, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        path = '/' + raw.path.strip('/')
        if raw.method == 'GET':
            discovery = self._discovery(path)
            if discovery is not None:
                return aiohttp.web.json_response(discovery)
        proxied = _NODE_PROXY.fullmatch(path)
        if proxied is not None and raw.method == 'GET':
            node, subpath = proxied.group(1), proxied.group(2)
            self.store.get(self.resource_type('v1/nodes'), None, node)  # 404 for a node that does not exist
            if self._node_proxy is None:
                raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
            return await self._node_proxy(node, subpath)
        route = self._route(path)
        if route is None:
            return await super()._handle(request)
        rtype, namespace, name, subresource = route
        query = raw.query
        dry_run = 'dryRun' in query

        if name is None:
            if raw.method == 'GET' and query.get('watch') in ('true', '1'):
                return await self._serve_watch(raw, rtype, namespace, None)
            if raw.method == 'GET':
                return aiohttp.web.json_response(self._serve_list(rtype, namespace, query))
            if raw.method == 'POST':
                body = self._json_body(request, raw)
                created = self.store.create(rtype, namespace, body, dry_run=dry_run)
                return aiohttp.web.json_response(created, status=201)
            if raw.method == 'DELETE':
                items, _ = self.store.list(rtype, namespace, self._matcher(query))
                for obj in items:
                    meta = obj['metadata']
                    self.store.delete(rtype, meta.get('namespace'), meta['name'], dry_run=dry_run)
                return aiohttp.web.json_response({'kind': f'{rtype.kind}List', 'apiVersion': rtype.api_version,
                                                  'metadata': {}, 'items': items})
            raise ApiError(405, 'MethodNotAllowed', f'the server does not allow this method on the requested'
                                                    f' resource: {raw.method}')

        if subresource not in (None, 'status') or (subresource == 'status' and not rtype.has_status_subresource):
            raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
        if raw.method == 'GET' and query.get('watch') in ('true', '1'):
            return await self._serve_watch(raw, rtype, namespace, name)
        if raw.method == 'GET':
            return aiohttp.web.json_response(self.store.get(rtype, namespace, name))
        if raw.method == 'PUT':
            body = self._json_body(request, raw)
            return aiohttp.web.json_response(self.store.replace(
                rtype, namespace, name, body, subresource=subresource, dry_run=dry_run))
        if raw.method == 'PATCH':
            patch_type = PATCH_TYPES.get(raw.content_type)
            if patch_type is None:
                raise ApiError(415, 'UnsupportedMediaType', f'the body of the request was in an unknown format'
                                                            f' - accepted media types include: {", ".join(PATCH_TYPES)}')
            body = self._json_body(request, raw, allow_list=True)
            return aiohttp.web.json_response(self.store.patch(
                rtype, namespace, name, patch_type, body, subresource=subresource, dry_run=dry_run))
        if raw.method == 'DELETE':
            options = request.data if isinstance(request.data, Mapping) else {}
            return aiohttp.web.json_response(self.store.delete(
                rtype, namespace, name, preconditions=options.get('preconditions'),
                dry_run=dry_run or bool(options.get('dryRun'))))
        raise ApiError(405, 'MethodNotAllowed', f'the server does not allow this method on the requested'
                                                f' resource: {raw.method}')

    @staticmethod
    def _json_body(request: kmock.Request, raw: aiohttp.web.BaseRequest, allow_list: bool = False) -> Any:
        if request.data is None or not isinstance(request.data, (dict, list)):
            raise ApiError(400, 'BadRequest', f'the request body is not JSON ({raw.content_type})')
        if isinstance(request.data, list) and not allow_list:
            raise ApiError(400, 'BadRequest', 'the request body must be a JSON object')
        return request.data

    def _route(self, path: str) -> tuple[ResourceType, str | None, str | None, str | None] | None:
        """Split an API path into (resource, namespace, name, subresource); None if not a resource path."""
        parts = path.strip('/').split('/')
        if parts[0] == 'api' and len(parts) >= 3:
            group, version, rest = '', parts[1], parts[2:]
        elif parts[0] == 'apis' and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 3 and rest[0] == 'namespaces' and self._served(group, version, rest[2]):
            namespace, rest = rest[1], rest[2:]
        rtype = self._served(group, version, rest[0])
        if rtype is None or (namespace is not None and not rtype.namespaced):
            raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
        name = rest[1] if len(rest) > 1 else None
        subresource = '/'.join(rest[2:]) or None
        return rtype, namespace, name, subresource

    @staticmethod
    def _matcher(query: Mapping[str, str], name: str | None = None) -> Matcher:
        try:
            labels = parse_label_selector(query.get('labelSelector'))
            fields = parse_field_selector(query.get('fieldSelector'))
        except SelectorError as e:
            raise ApiError(400, 'BadRequest', f'unable to parse requirement: {e}') from e
        if name is None:
            return lambda obj: labels(obj) and fields(obj)
        return lambda obj: labels(obj) and fields(obj) and obj.get('metadata', {}).get('name') == name

    def _serve_list(self, rtype: ResourceType, namespace: str | None, query: Mapping[str, str]) -> JsonObject:
        limit = int(query.get('limit') or 0) or None
        offset, token_version = 0, None
        if query.get('continue'):
            token = json.loads(base64.urlsafe_b64decode(query['continue']))
            offset, token_version = token['offset'], token['rv']
        items, remaining, resource_version = self.store.list_page(
            rtype, namespace, self._matcher(query), offset, limit)
        metadata: JsonObject = {'resourceVersion': token_version or resource_version}
        if limit and remaining:
            token = json.dumps({'offset': offset + limit, 'rv': metadata['resourceVersion']})
            metadata['continue'] = base64.urlsafe_b64encode(token.encode()).decode()
            metadata['remainingItemCount'] = remaining
        return {'kind': f'{rtype.kind}List', 'apiVersion': rtype.api_version, 'metadata': metadata, 'items': items}

    async def _serve_watch(self, raw: aiohttp.web.BaseRequest, rtype: ResourceType,
                           namespace: str | None, name: str | None) -> aiohttp.web.StreamResponse:
        """
        JSON lines of watch events. ``resourceVersion`` absent or "0": every current object
        as ADDED first; otherwise a replay of the history after it (410 as an ERROR event if
        it is compacted away). ``timeoutSeconds`` ends the stream; so does ``drop_watches``.
        """
        assert self._loop is not None
        query = raw.query
        matcher = self._matcher(query, name)
        timeout = float(query['timeoutSeconds']) if query.get('timeoutSeconds') else None
        send_initial_events = query.get('sendInitialEvents') == 'true'
        since = None if send_initial_events else query.get('resourceVersion')
        response = aiohttp.web.StreamResponse(status=200, headers={'Content-Type': 'application/json'})

        try:
            initial, watcher, opened_at = self.store.open_watch(self._loop, rtype, namespace, since)
        except ApiError as e:
            if e.code != 410:
                raise
            await response.prepare(raw)
            self._record_request(raw, 200, None)
            await response.write(json.dumps({'type': 'ERROR', 'object': e.as_status()}).encode() + b'\n')
            await response.write_eof()
            return response

        try:
            await response.prepare(raw)
            self._record_request(raw, 200, None)
            async with asyncio.timeout(timeout):
                for event in initial:
                    if (seen := event.as_seen_through(matcher)) is not None:
                        await response.write(json.dumps(seen).encode() + b'\n')
                if send_initial_events:
                    bookmark = {'kind': rtype.kind, 'apiVersion': rtype.api_version, 'metadata': {
                        'resourceVersion': opened_at,
                        'annotations': {'k8s.io/initial-events-end': 'true'}}}
                    await response.write(json.dumps({'type': 'BOOKMARK', 'object': bookmark}).encode() + b'\n')
                while (update := await watcher.queue.get()) is not None:
                    if (seen := update.as_seen_through(matcher)) is not None:
                        await response.write(json.dumps(seen).encode() + b'\n')
        except (TimeoutError, ConnectionError):
            pass  # the server-side timeout, or the client went away
        finally:
            self.store.close_watch(watcher)
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response

    def _discovery(self, path: str) -> JsonObject | None:
        types = self.resource_types()
        groups: dict[str, list[str]] = {}
        for rtype in types:
            if rtype.group and rtype.version not in groups.setdefault(rtype.group, []):
                groups[rtype.group].append(rtype.version)
        parts = path.strip('/').split('/')
        if path == '/':
            paths = {'/api', '/api/v1', '/apis', '/version'}
            paths |= {f'/apis/{group}' for group in groups}
            paths |= {f'/apis/{group}/{version}' for group, versions in groups.items() for version in versions}
            return {'paths': sorted(paths)}
        if path == '/version':
            return dict(SERVER_VERSION)
        if path == '/api':
            return {'kind': 'APIVersions', 'versions': ['v1'], 'serverAddressByClientCIDRs': [
                {'clientCIDR': '0.0.0.0/0', 'serverAddress': f'127.0.0.1:{self._port}'}]}
        if path == '/apis':
            return {'kind': 'APIGroupList', 'apiVersion': 'v1',
                    'groups': [self._api_group(group, versions) for group, versions in sorted(groups.items())]}
        if parts[0] == 'api' and len(parts) == 2:
            return self._api_resource_list(types, '', parts[1])
        if parts[0] == 'apis' and len(parts) == 2:
            if parts[1] not in groups:
                raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
            return dict(self._api_group(parts[1], groups[parts[1]]), kind='APIGroup', apiVersion='v1')
        if parts[0] == 'apis' and len(parts) == 3:
            return self._api_resource_list(types, parts[1], parts[2])
        return None

    @staticmethod
    def _api_group(group: str, versions: list[str]) -> JsonObject:
        listed = [{'groupVersion': f'{group}/{version}', 'version': version} for version in versions]
        return {'name': group, 'versions': listed, 'preferredVersion': listed[0]}

    def _api_resource_list(self, types: list[ResourceType], group: str, version: str) -> JsonObject:
        served = [t for t in types if (t.group, t.version) == (group, version)]
        if not served:
            raise ApiError(404, 'NotFound', 'the server could not find the requested resource')
        resources: list[JsonObject] = []
        for rtype in sorted(served, key=lambda t: t.plural):
            info = self.resources[kmock.resource(*rtype.key)]
            resources.append({
                'name': rtype.plural, 'singularName': info.singular or rtype.kind.lower(),
                'namespaced': rtype.namespaced, 'kind': rtype.kind, 'verbs': sorted(info.verbs or ALL_VERBS),
                'shortNames': sorted(info.shortnames), 'categories': sorted(info.categories),
            })
            for subresource in sorted(rtype.subresources):
                resources.append({'name': f'{rtype.plural}/{subresource}', 'singularName': '',
                                  'namespaced': rtype.namespaced, 'kind': rtype.kind,
                                  'verbs': ['get', 'patch', 'update']})
        return {'kind': 'APIResourceList', 'apiVersion': 'v1',
                'groupVersion': f'{group}/{version}' if group else version, 'resources': resources}

    # --- running in a thread -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("The emulator is not running.")
        return self._port

    @property
    def base_url(self) -> str:
        return f'http://127.0.0.1:{self.port}'

    @property
    def url(self) -> yarl.URL:  # overrides kmock's, which points to kmock's own servers
        return yarl.URL(self.base_url)

    def start(self, host: str = '127.0.0.1', port: int = 0, timeout: float = 10) -> None:
        if self._thread is not None:
            raise RuntimeError("The emulator is already started.")
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(host, port),),
                                        name='kubernetes-api-emulator', daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError("The emulator did not start in time.")
        if self._startup_error is not None:
            self._thread.join()
            raise self._startup_error

    def stop(self, timeout: float = 10) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("The emulator thread did not stop in time.")
        self._thread = None

    async def _serve(self, host: str, port: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            async with self:  # kmock's own machinery: the stream feeder and error collection
                server = aiohttp.web.Server(self, handler_cancellation=True)
                runner = aiohttp.web.ServerRunner(server)
                await runner.setup()
                try:
                    site = aiohttp.web.TCPSite(runner, host, port)
                    await site.start()
                    self._port = runner.addresses[0][1]
                    self._started.set()
                    await self._stopping.wait()
                    self.store.drop_watches()
                finally:
                    await runner.cleanup()
        except BaseException as e:
            if not self._started.is_set():
                self._startup_error = e
                self._started.set()
            else:
                raise

    def write_kubeconfig(self, path: str | pathlib.Path) -> pathlib.Path:
        """A kubeconfig for ``http://127.0.0.1:PORT`` without auth, like kubectl or kopf would read."""
        path = pathlib.Path(path)
        config = {
            'apiVersion': 'v1', 'kind': 'Config', 'preferences': {},
            'clusters': [{'name': 'emulator', 'cluster': {'server': self.base_url}}],
            'users': [{'name': 'emulator', 'user': {}}],
            'contexts': [{'name': 'emulator', 'context': {'cluster': 'emulator', 'user': 'emulator'}}],
            'current-context': 'emulator',
        }
        path.write_text(json.dumps(config, indent=2))  # JSON is valid YAML
        self.kubeconfig = path
        return path


@contextlib.contextmanager
def running_emulator(directory: str | pathlib.Path | None = None, **kwargs: Any) -> Iterator[KubernetesApiEmulator]:
    """Start an emulator on 127.0.0.1:<free port>, write ``emu.kubeconfig``, stop it afterwards."""
    emulator = KubernetesApiEmulator(**kwargs)
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix='kube-emulator-'))
        emulator.start()
        stack.callback(emulator.stop)
        emulator.write_kubeconfig(pathlib.Path(directory) / 'kubeconfig')
        yield emulator
