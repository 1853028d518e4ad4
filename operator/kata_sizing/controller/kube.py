"""The one module that talks to the Kubernetes API (the `kubernetes` asyncio client).

Generic over the table of kinds in `kinds`: `create`, `read`, `replace`, `delete`, `patch` and
`patch_status` take and return plain dicts in the API's own JSON shape, so the rest of the
operator never sees the client's models. Errors come out as the kinds of `api_errors`:
NotFound, Conflict (409: re-read and retry), Invalid (422), TransientApiError (5xx, 429,
timeouts, broken connections: back off and retry) and PermanentApiError for the rest.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import aiohttp
from kubernetes.aio import client, config
from kubernetes.aio.client.exceptions import ApiException
from yarl import URL

from ..core import bounded
from . import metrics
from .api_errors import (  # noqa: F401  (re-exported: the error kinds are the wrapper's contract)
    ApiError,
    Conflict,
    Invalid,
    NotFound,
    PermanentApiError,
    TransientApiError,
)
from .kinds import ADMISSION_GROUP, ADMISSION_KINDS, ADMISSION_VERSIONS, KINDS, Kind, ObjKey, describe

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML: the client sends the dict as JSON
REQUEST_TIMEOUT_S = 30
# A write waits for the API server's own answer: the server ends a request at its
# --request-timeout (60 s by default) with 504, and may have stored the object all the same.
# Giving up sooner sends the write again while the first is still being done: on a 2-core test
# machine at 200 policies the server took over 30 s for some admission objects' creates
# (it compiles their CEL), and each retry met 409 and a read, more load where there was too
# much (docs/performance.md).
WRITE_TIMEOUT_S = 65
# Connections this client may hold to the API server (the client's default is 100). Each
# informer's watch keeps one for as long as it runs; the rest serve requests, which queue for
# a free connection rather than open another: over TLS each costs about 300 KiB (asyncio's
# 256 KiB read buffer plus OpenSSL's state), and a cold start of 200 policies opened about 200.
CONNECTIONS = 24
FIELD_MANAGER = "kata-sizing"
# Connections for kubelet Summaries read through the API server, apart from the pool above: a
# kubelet that does not answer holds its connection until the timeout, and must not hold up
# the operator's writes and watches.
SUMMARY_CONNECTIONS = 8


def _message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
        return body.get("message") or exc.reason or str(exc.status)
    except (ValueError, AttributeError):
        return f"{exc.status} {exc.reason}"


def _translate(exc: BaseException, what: str) -> ApiError:
    metrics.api_error(exc.status if isinstance(exc, ApiException) else None)
    if isinstance(exc, ApiException):
        status = exc.status or 0
        text = f"{what}: {_message(exc)}"
        if status == 404:
            return NotFound(status, text)
        if status == 409:
            return Conflict(status, text)
        if status == 422:
            return Invalid(status, text)
        if status == 429 or status >= 500:
            return TransientApiError(status, text)
        return PermanentApiError(status, text)
    return TransientApiError(None, f"{what}: {type(exc).__name__}: {exc}")


_NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


def _proxy_looked_up_once(configuration: client.Configuration) -> None:
    """The client's session trusts the environment (HTTP(S)_PROXY, NO_PROXY, ~/.netrc), which
    aiohttp then looks up on every request, reading ~/.netrc twice in a thread of its executor:
    a seventh of the operator's CPU in a cold start of 50 policies (py-spy, docs/performance.md).
    The API server's address does not change, so its proxy is looked up here, once, as kubectl
    honours it (HTTPS_PROXY unless NO_PROXY names the host, through the standard library's
    reading of the environment), and the session does not look again."""
    extra = dict(getattr(configuration, "client_session_kwargs", None) or {})
    configuration.client_session_kwargs = {**extra, "trust_env": False}
    if configuration.proxy:
        return
    host = URL(configuration.host)
    proxy = urllib.request.getproxies().get(host.scheme or "https")
    if not proxy or urllib.request.proxy_bypass(host.host or ""):
        return  # no proxy for this host
    proxy_url = URL(proxy)
    configuration.proxy = str(proxy_url.with_user(None))
    if proxy_url.user is not None:
        credentials = aiohttp.BasicAuth(proxy_url.user, proxy_url.password or "")
        configuration.proxy_headers = {"Proxy-Authorization": credentials.encode()}


@dataclass
class KubeApi:
    api_client: client.ApiClient
    # {kind: version} of the admission kinds the server serves; filled by served_admission_versions().
    admission_versions: dict = field(default_factory=dict)
    # How this client reaches the API server (server, CA, credentials); the kubelet client
    # (controller/kubelet.py) presents the same credentials.
    configuration: client.Configuration | None = None
    _summary_client: client.ApiClient | None = None

    @classmethod
    async def connect(cls) -> KubeApi:
        """Connect the way kubectl does: in-cluster service account, else KUBECONFIG/~/.kube/config."""
        configuration = client.Configuration()
        configuration.connection_pool_maxsize = CONNECTIONS
        if os.environ.get("KUBERNETES_SERVICE_HOST") and Path(
            "/var/run/secrets/kubernetes.io/serviceaccount/token"
        ).exists():
            config.load_incluster_config(client_configuration=configuration)
        else:
            # The client caches ~/.kube/config's location at import; KUBECONFIG is read now.
            await config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG") or None, client_configuration=configuration
            )
        _proxy_looked_up_once(configuration)
        return cls(client.ApiClient(configuration), configuration=configuration)

    async def close(self) -> None:
        await self.api_client.close()
        if self._summary_client is not None:
            await self._summary_client.close()

    def identify(self, identity: str) -> None:
        """Name this replica in the User-Agent, so the API server's audit log tells replicas apart."""
        self.api_client.user_agent = f"kata-sizing/{identity}"

    # --- paths and requests ------------------------------------------------------------

    def kind(self, name: str, api_version: str | None = None) -> Kind:
        """The kind's table entry, at the version given or, for an admission kind, the one served."""
        found = KINDS[name]
        if api_version:
            return found.at(api_version.rpartition("/")[2])
        if name in ADMISSION_KINDS:
            return found.at(self.admission_versions.get(name, ADMISSION_VERSIONS[0]))
        return found

    @staticmethod
    def path(kind: Kind, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
        if kind.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{kind.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
        if subresource:
            base += f"/{subresource}"
        return base

    async def _send(self, method: str, path: str, what: str, *, query: dict | None = None, body: object = None,
                    content_type: str = "application/json", timeout: float | None = None):
        """One request; the response unread (its status checked: an error status raises)."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        try:
            # The body goes to the request as it is: it is JSON data already (the operator's builders,
            # the API's own answers), and the client's sanitize_for_serialization would copy every
            # one of them, key by key (about a tenth of a pass's CPU: docs/performance.md).
            method, url, header_params, _, post_params = await self.api_client.param_serialize(
                method=method, resource_path=path, query_params=params, header_params=headers, body=None,
                auth_settings=["BearerToken"])
            response = await self.api_client.call_api(method, url, header_params, body, post_params,
                                                       _request_timeout=timeout or REQUEST_TIMEOUT_S)
            if response.status >= 400:
                text = (await response.read()).decode("utf-8", "replace")
                raise ApiException(status=response.status, reason=response.reason, body=text)
            return response
        except (ApiException, *_NETWORK_ERRORS) as exc:
            raise _translate(exc, what) from None

    async def _json(self, method: str, path: str, what: str, **kwargs) -> dict:
        response = await self._send(method, path, what, **kwargs)
        try:
            data = await response.read()
        except _NETWORK_ERRORS as exc:
            raise _translate(exc, what) from None
        try:
            return json.loads(data) if data else {}
        except ValueError as exc:
            raise TransientApiError(response.status, f"{what}: not JSON: {exc}") from None

    @staticmethod
    def _typed(obj: dict, kind_name: str, kind: Kind) -> dict:
        return {**obj, "kind": obj.get("kind") or kind_name, "apiVersion": obj.get("apiVersion") or kind.api_version}

    # --- the generic verbs -------------------------------------------------------------

    async def create(self, body: dict, field_manager: str = FIELD_MANAGER) -> dict:
        """POST. `field_manager`: whose write the API server records it as (managedFields)."""
        kind = self.kind(body["kind"], body.get("apiVersion"))
        meta = body.get("metadata") or {}
        what = "create " + describe((body["kind"], meta.get("namespace"), meta.get("name") or ""))
        created = await self._json("POST", self.path(kind, meta.get("namespace")), what, body=body,
                                   query={"fieldManager": field_manager}, timeout=WRITE_TIMEOUT_S)
        return self._typed(created, body["kind"], kind)

    async def apply(self, body: dict, field_manager: str) -> dict:
        """A server-side apply of `body` (an apply configuration: the fields `field_manager` sets)
        as `field_manager`, taking those fields from whoever changed them since (force): creates
        the object if it is gone."""
        kind = self.kind(body["kind"], body.get("apiVersion"))
        meta = body["metadata"]
        key = (body["kind"], meta.get("namespace"), meta["name"])
        applied = await self._json("PATCH", self.path(kind, meta.get("namespace"), meta["name"]),
                                   f"apply {describe(key)}", body=body, content_type=APPLY_PATCH,
                                   query={"fieldManager": field_manager, "force": "true"}, timeout=WRITE_TIMEOUT_S)
        return self._typed(applied, body["kind"], kind)

    async def read(self, key: ObjKey) -> dict | None:
        """The object, or None when there is none of that name."""
        kind_name, namespace, name = key
        kind = self.kind(kind_name)
        try:
            found = await self._json("GET", self.path(kind, namespace, name), f"read {describe(key)}")
        except NotFound:
            return None
        return self._typed(found, kind_name, kind)

    async def replace(self, body: dict, field_manager: str = FIELD_MANAGER) -> dict:
        """PUT with the body's resourceVersion: a stale one is a Conflict, never a lost edit."""
        kind = self.kind(body["kind"], body.get("apiVersion"))
        meta = body["metadata"]
        key = (body["kind"], meta.get("namespace"), meta["name"])
        replaced = await self._json("PUT", self.path(kind, meta.get("namespace"), meta["name"]),
                                    f"replace {describe(key)}", body=body, query={"fieldManager": field_manager},
                                    timeout=WRITE_TIMEOUT_S)
        return self._typed(replaced, body["kind"], kind)

    async def delete(self, key: ObjKey, uid: str | None = None) -> None:
        """Delete the object; with `uid`, only that object (a precondition: never its successor)."""
        kind_name, namespace, name = key
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}} if uid else None
        try:
            await self._json("DELETE", self.path(self.kind(kind_name), namespace, name), f"delete {describe(key)}",
                             body=body, timeout=WRITE_TIMEOUT_S)
        except NotFound:
            pass

    async def patch(self, key: ObjKey, patch: dict | list) -> dict:
        """A merge patch (dict) or a JSON patch (list, which may carry `test` operations)."""
        return await self._patch(key, patch)

    async def patch_status(self, key: ObjKey, patch: dict | list) -> dict:
        """`patch`, of the status subresource."""
        return await self._patch(key, patch, "status")

    async def _patch(self, key: ObjKey, patch: dict | list, subresource: str | None = None) -> dict:
        kind_name, namespace, name = key
        kind = self.kind(kind_name)
        patched = await self._json(
            "PATCH", self.path(kind, namespace, name, subresource),
            f"patch {describe(key)}{' ' + subresource if subresource else ''}", body=patch,
            content_type=JSON_PATCH if isinstance(patch, list) else MERGE_PATCH, timeout=WRITE_TIMEOUT_S)
        return self._typed(patched, kind_name, kind)

    # --- discovery ---------------------------------------------------------------------

    async def served_admission_versions(self) -> dict[str, str]:
        """{kind: version} of the admission kinds this server serves (discovery, which every
        authenticated user may read). A 1.29 server serves no ValidatingAdmissionPolicy at v1;
        MutatingAdmissionPolicy is v1 from Kubernetes 1.36 (v1beta1 from 1.34, off by default)."""
        served: dict[str, str] = {}
        plurals = {KINDS[kind].plural: kind for kind in ADMISSION_KINDS}
        for version in ADMISSION_VERSIONS:
            try:
                found = await self._json("GET", f"/apis/{ADMISSION_GROUP}/{version}",
                                         f"discover {ADMISSION_GROUP}/{version}")
            except NotFound:
                continue
            for resource in found.get("resources") or []:
                kind = plurals.get(resource.get("name"))
                if kind is not None and kind not in served:
                    served[kind] = version
        self.admission_versions = served
        return served

    # --- kubelet Summaries through the API server's node proxy (needs nodes/proxy get) ---

    async def read_node_summary(self, node: str, timeout_s: float) -> object:
        """The kubelet's Summary of `node` (GET /api/v1/nodes/NODE/proxy/stats/summary), as
        `kubectl get --raw` prints it, parsed within its size bound (docs/inputs.md), on a
        connection pool of its own."""
        if self._summary_client is None:
            configuration = copy.copy(self.configuration or self.api_client.configuration)
            configuration.connection_pool_maxsize = SUMMARY_CONNECTIONS
            self._summary_client = client.ApiClient(configuration)
        api_client = self._summary_client
        what = f"read the Summary of node {node}"
        try:
            serialized = await api_client.param_serialize(
                method="GET", resource_path=f"/api/v1/nodes/{quote(node, safe='')}/proxy/stats/summary",
                header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
            response = await api_client.call_api(*serialized, _request_timeout=timeout_s)
            data = await response.read()
        except (ApiException, *_NETWORK_ERRORS) as exc:
            raise _translate(exc, what) from None
        if response.status >= 400:
            text = data.decode("utf-8", "replace")[:1000]
            raise _translate(ApiException(status=response.status, reason=response.reason, body=text), what)
        try:
            return bounded.load_json(data, f"the Summary of node {node}", walk=False)
        except bounded.InputError as exc:
            raise TransientApiError(None, str(exc)) from None

    async def list_all(self, kind_name: str, label_selector: str | None = None, page_size: int = 500) -> list[dict]:
        """Every object of a collection, read a page at a time (for the CLI's one-off survey)."""
        found: list[dict] = []
        continue_token = None
        while True:
            page, _, continue_token = await self.list_page(kind_name, page_size, continue_token, label_selector)
            found.extend(page)
            if not continue_token:
                return found

    # --- list and watch for the informers (no model round-trip: 20,000 pods stay cheap) ----

    async def list_page(
        self, kind_name: str, limit: int, continue_token: str | None = None, label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[dict], str, str | None]:
        """One page of a collection: (objects as plain dicts, the list's resourceVersion, the
        continue token or None on the last page). Pages keep the peak memory of a 100,000-pod
        list at one page's worth of JSON, not the whole collection's."""
        kind = self.kind(kind_name)
        body = await self._json(
            "GET", self.path(kind), f"list {kind.plural}", timeout=REQUEST_TIMEOUT_S * 2,
            query={"limit": limit, "continue": continue_token, "labelSelector": label_selector,
                   "fieldSelector": field_selector})
        meta = body.get("metadata") or {}
        return body.get("items") or [], meta.get("resourceVersion") or "", meta.get("continue") or None

    async def watch_raw(self, kind_name: str, resource_version: str, timeout_s: int, label_selector: str | None = None,
                        field_selector: str | None = None):
        """Watch events ({type, object}) from a resourceVersion until the server ends the stream."""
        kind = self.kind(kind_name)
        response = await self._send(
            "GET", self.path(kind), f"watch {kind.plural}", timeout=timeout_s + REQUEST_TIMEOUT_S,
            query={"watch": "true", "resourceVersion": resource_version, "timeoutSeconds": timeout_s,
                   "allowWatchBookmarks": "true", "labelSelector": label_selector, "fieldSelector": field_selector})
        stream = response.response
        try:
            async for line in stream.content:
                if line.strip():
                    yield json.loads(line)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise TransientApiError(None, f"watch {kind.plural}: {exc}") from None
        finally:
            stream.release()
