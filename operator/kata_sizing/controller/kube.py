"""The one module that talks to the Kubernetes API (the `kubernetes` asyncio client).

Everything returns and takes plain dicts in the API's own JSON shape, so the rest of the
operator never sees the client's models. Errors come out as three kinds: NotFound,
Conflict (409: re-read and retry) and TransientApiError (5xx, 429, timeouts, broken
connections: back off and retry). Anything else is a PermanentApiError.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from kubernetes.aio import client, config
from kubernetes.aio.client.exceptions import ApiException

from . import metrics
from ..core import bounded
from ..core.model import GROUP, PLURAL, VERSION

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
REQUEST_TIMEOUT_S = 30
# Connections this client may hold to the API server (the client's default is 100). Each
# informer's watch keeps one for as long as it runs; the rest serve requests, which queue for
# a free connection rather than open another: over TLS each costs about 300 KiB (asyncio's
# 256 KiB read buffer plus OpenSSL's state), and a cold start of 200 policies opened about 200.
CONNECTIONS = 24
FIELD_MANAGER = "kata-sizing"

ADMISSION_GROUP = "admissionregistration.k8s.io"
# The generated admission objects (issue 10), all cluster-scoped: kind -> plural. Their version
# is the one the rendered object names and the server serves (see served_admission_versions).
ADMISSION_PLURALS = {
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
    "MutatingAdmissionPolicy": "mutatingadmissionpolicies",
    "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings",
}
# Checked in this order; the first served version of a kind is used.
ADMISSION_VERSIONS = ("v1", "v1beta1")
# Connections for kubelet Summaries read through the API server, apart from the pool above: a
# kubelet that does not answer holds its connection until the timeout, and must not hold up
# the operator's writes and watches.
SUMMARY_CONNECTIONS = 8


class ApiError(Exception):
    def __init__(self, status: int | None, message: str):
        super().__init__(message)
        self.status = status


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409 (stale resourceVersion, or the object already exists) or 422 on a failed test."""


class Invalid(ApiError):
    """422: the server refused the object (for example a changed immutable field)."""


class TransientApiError(ApiError):
    """Worth retrying after a back-off: 5xx, 429, timeouts, dropped connections."""


class PermanentApiError(ApiError):
    pass


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
    async def connect(cls) -> "KubeApi":
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
        return cls(client.ApiClient(configuration), configuration=configuration)

    async def close(self) -> None:
        await self.api_client.close()
        if self._summary_client is not None:
            await self._summary_client.close()

    @property
    def _core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client)

    @property
    def _node(self) -> client.NodeV1Api:
        return client.NodeV1Api(self.api_client)

    @property
    def _custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api_client)

    @property
    def _admission_discovery(self) -> dict:
        return {
            "v1": client.AdmissionregistrationV1Api(self.api_client),
            "v1beta1": client.AdmissionregistrationV1beta1Api(self.api_client),
        }

    @property
    def _coordination(self) -> client.CoordinationV1Api:
        return client.CoordinationV1Api(self.api_client)

    def identify(self, identity: str) -> None:
        """Name this replica in the User-Agent, so the API server's audit log tells replicas apart."""
        self.api_client.user_agent = f"kata-sizing/{identity}"

    def _plain(self, obj: object) -> dict:
        return self.api_client.sanitize_for_serialization(obj)

    async def _call(self, what: str, call, *args, **kwargs):
        try:
            return await call(*args, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
        except (ApiException, *_NETWORK_ERRORS) as exc:
            raise _translate(exc, what) from None

    # --- RuntimeClasses (cluster-scoped) ---

    async def list_runtime_classes(self, label_selector: str | None = None) -> list[dict]:
        result = await self._call(
            "list RuntimeClasses", self._node.list_runtime_class, label_selector=label_selector
        )
        return [self._plain(item) for item in result.items]

    async def read_runtime_class(self, name: str) -> dict | None:
        try:
            return self._plain(await self._call(f"read RuntimeClass {name}", self._node.read_runtime_class, name))
        except NotFound:
            return None

    async def create_runtime_class(self, body: dict) -> dict:
        name = body["metadata"]["name"]
        return self._plain(await self._call(
            f"create RuntimeClass {name}", self._node.create_runtime_class, body, field_manager=FIELD_MANAGER
        ))

    async def replace_runtime_class(self, body: dict) -> dict:
        """PUT with the body's resourceVersion: a stale one is a Conflict, never a lost edit."""
        name = body["metadata"]["name"]
        return self._plain(await self._call(
            f"replace RuntimeClass {name}", self._node.replace_runtime_class, name, body,
            field_manager=FIELD_MANAGER,
        ))

    async def delete_runtime_class(self, name: str, uid: str | None = None) -> None:
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            await self._call(f"delete RuntimeClass {name}", self._node.delete_runtime_class, name, body=body)
        except NotFound:
            pass

    # --- ConfigMaps ---

    async def list_config_maps(self, label_selector: str | None = None) -> list[dict]:
        result = await self._call(
            "list ConfigMaps", self._core.list_config_map_for_all_namespaces, label_selector=label_selector
        )
        return [self._plain(item) for item in result.items]

    async def read_config_map(self, namespace: str, name: str) -> dict | None:
        try:
            return self._plain(await self._call(
                f"read ConfigMap {namespace}/{name}", self._core.read_namespaced_config_map, name, namespace
            ))
        except NotFound:
            return None

    async def create_config_map(self, body: dict) -> dict:
        meta = body["metadata"]
        return self._plain(await self._call(
            f"create ConfigMap {meta['namespace']}/{meta['name']}",
            self._core.create_namespaced_config_map, meta["namespace"], body, field_manager=FIELD_MANAGER,
        ))

    async def replace_config_map(self, body: dict) -> dict:
        meta = body["metadata"]
        return self._plain(await self._call(
            f"replace ConfigMap {meta['namespace']}/{meta['name']}",
            self._core.replace_namespaced_config_map, meta["name"], meta["namespace"], body,
            field_manager=FIELD_MANAGER,
        ))

    async def delete_config_map(self, namespace: str, name: str, uid: str | None = None) -> None:
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            await self._call(
                f"delete ConfigMap {namespace}/{name}", self._core.delete_namespaced_config_map,
                name, namespace, body=body,
            )
        except NotFound:
            pass

    # --- admission objects (ValidatingAdmissionPolicy and friends; cluster-scoped) ---

    async def served_admission_versions(self) -> dict[str, str]:
        """{kind: version} of the admission kinds this server serves (discovery, which every
        authenticated user may read). A 1.29 server serves no ValidatingAdmissionPolicy at v1;
        MutatingAdmissionPolicy is v1 from Kubernetes 1.36 (v1beta1 from 1.34, off by default)."""
        served: dict[str, str] = {}
        for version in ADMISSION_VERSIONS:
            try:
                found = await self._call(
                    f"discover {ADMISSION_GROUP}/{version}", self._admission_discovery[version].get_api_resources)
            except NotFound:
                continue
            for resource in found.resources or []:
                for kind, plural in ADMISSION_PLURALS.items():
                    if resource.name == plural and kind not in served:
                        served[kind] = version
        self.admission_versions = served
        return served

    def _admission_path(self, body_or_kind: dict | str) -> tuple[str, str, str]:
        if isinstance(body_or_kind, dict):
            group, _, version = (body_or_kind.get("apiVersion") or "").rpartition("/")
            return group, version, ADMISSION_PLURALS[body_or_kind["kind"]]
        version = self.admission_versions.get(body_or_kind, ADMISSION_VERSIONS[0])
        return ADMISSION_GROUP, version, ADMISSION_PLURALS[body_or_kind]

    async def list_admission_objects(self, kind: str, label_selector: str | None = None) -> list[dict]:
        group, version, plural = self._admission_path(kind)
        result = await self._call(
            f"list {kind}", self._custom.list_cluster_custom_object, group, version, plural,
            label_selector=label_selector)
        return [{**item, "kind": kind} for item in result.get("items") or []]

    async def read_admission_object(self, kind: str, name: str) -> dict | None:
        group, version, plural = self._admission_path(kind)
        try:
            return await self._call(
                f"read {kind} {name}", self._custom.get_cluster_custom_object, group, version, plural, name)
        except NotFound:
            return None

    async def create_admission_object(self, body: dict) -> dict:
        group, version, plural = self._admission_path(body)
        return await self._call(
            f"create {body['kind']} {body['metadata']['name']}", self._custom.create_cluster_custom_object,
            group, version, plural, body, field_manager=FIELD_MANAGER)

    async def replace_admission_object(self, body: dict) -> dict:
        """PUT with the body's resourceVersion: a stale one is a Conflict, never a lost edit."""
        group, version, plural = self._admission_path(body)
        name = body["metadata"]["name"]
        return await self._call(
            f"replace {body['kind']} {name}", self._custom.replace_cluster_custom_object,
            group, version, plural, name, body, field_manager=FIELD_MANAGER)

    async def delete_admission_object(self, kind: str, name: str, uid: str | None = None) -> None:
        group, version, plural = self._admission_path(kind)
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            await self._call(
                f"delete {kind} {name}", self._custom.delete_cluster_custom_object, group, version, plural, name,
                body=body)
        except NotFound:
            pass

    # --- Namespaces (the webhook fallback reads an opted-in namespace's label) ---

    async def read_namespace(self, name: str) -> dict | None:
        try:
            return self._plain(await self._call(f"read Namespace {name}", self._core.read_namespace, name))
        except NotFound:
            return None

    # --- KataSizingPolicy ---

    async def read_policy(self, name: str) -> dict | None:
        try:
            return await self._call(
                f"read KataSizingPolicy {name}", self._custom.get_cluster_custom_object,
                GROUP, VERSION, PLURAL, name,
            )
        except NotFound:
            return None

    async def patch_policy_status(self, name: str, patch: dict | list) -> dict:
        """A merge patch (dict) or a JSON patch (list, which may carry `test` operations)."""
        return await self._call(
            f"patch KataSizingPolicy {name} status", self._custom.patch_cluster_custom_object_status,
            GROUP, VERSION, PLURAL, name, patch,
            _content_type=JSON_PATCH if isinstance(patch, list) else MERGE_PATCH,
        )

    # --- Lease (leader election) ---

    async def read_lease(self, namespace: str, name: str) -> dict | None:
        try:
            return self._plain(await self._call(
                f"read Lease {namespace}/{name}", self._coordination.read_namespaced_lease, name, namespace))
        except NotFound:
            return None

    async def create_lease(self, body: dict) -> dict:
        meta = body["metadata"]
        return self._plain(await self._call(
            f"create Lease {meta['namespace']}/{meta['name']}", self._coordination.create_namespaced_lease,
            meta["namespace"], body, field_manager=FIELD_MANAGER))

    async def replace_lease(self, body: dict) -> dict:
        """PUT with the body's resourceVersion: two replicas taking the lease at once, one gets 409."""
        meta = body["metadata"]
        return self._plain(await self._call(
            f"replace Lease {meta['namespace']}/{meta['name']}", self._coordination.replace_namespaced_lease,
            meta["name"], meta["namespace"], body, field_manager=FIELD_MANAGER))

    # --- kubelet Summaries through the API server's node proxy (needs nodes/proxy get) ---

    def _summaries(self) -> client.ApiClient:
        if self._summary_client is None:
            configuration = copy.copy(self.configuration or self.api_client.configuration)
            configuration.connection_pool_maxsize = SUMMARY_CONNECTIONS
            self._summary_client = client.ApiClient(configuration)
        return self._summary_client

    async def read_node_summary(self, node: str, timeout_s: float) -> object:
        """The kubelet's Summary of `node` (GET /api/v1/nodes/NODE/proxy/stats/summary), as
        `kubectl get --raw` prints it, parsed within bounded's limits. The path is written out
        whole: the generated proxy method would send its '/' as %2F."""
        api_client = self._summaries()
        what = f"read the Summary of node {node}"
        try:
            method, url, headers, body, post = await api_client.param_serialize(
                "GET", "/api/v1/nodes/{name}/proxy/stats/summary", path_params={"name": node},
                header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
            response = await api_client.call_api(method, url, headers, body, post, _request_timeout=timeout_s)
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

    async def list_all(self, collection: str, label_selector: str | None = None, page_size: int = 500) -> list[dict]:
        """Every object of a collection, read a page at a time (for the CLI's one-off survey)."""
        found, continue_token = [], None
        while True:
            page, _, continue_token = await self.list_page(
                collection, page_size, continue_token, label_selector=label_selector)
            found.extend(page)
            if not continue_token:
                return found

    # --- raw list/watch for the informers (no model round-trip: 20,000 pods stay cheap) ---

    _COLLECTIONS = {
        "nodes": ("_core", "list_node_without_preload_content"),
        "pods": ("_core", "list_pod_for_all_namespaces_without_preload_content"),
        "runtimeclasses": ("_node", "list_runtime_class_without_preload_content"),
        "configmaps": ("_core", "list_config_map_for_all_namespaces_without_preload_content"),
    }

    async def _raw(self, collection: str, **params):
        if "/" in collection:
            # An admission kind: "<group>/<version>/<plural>", listed as any cluster-scoped object.
            group, version, plural = collection.split("/")
            call = functools.partial(self._custom.list_cluster_custom_object_without_preload_content,
                                     group, version, plural)
        else:
            group_api, method = self._COLLECTIONS[collection]
            call = getattr(getattr(self, group_api), method)
        params = {k: v for k, v in params.items() if v is not None}
        try:
            response = await call(**params)
        except (ApiException, *_NETWORK_ERRORS) as exc:
            raise _translate(exc, f"list {collection}") from None
        if response.status >= 400:
            text = await response.text()
            response.release()
            fake = ApiException(status=response.status, reason=response.reason, body=text)
            raise _translate(fake, f"list {collection}")
        return response

    async def list_page(
        self, collection: str, limit: int, continue_token: str | None = None, label_selector: str | None = None,
    ) -> tuple[list[dict], str, str | None]:
        """One page of a collection: (objects as plain dicts, the list's resourceVersion, the
        continue token or None on the last page). Pages keep the peak memory of a 100,000-pod
        list at one page's worth of JSON, not the whole collection's."""
        response = await self._raw(
            collection, limit=limit, _continue=continue_token, label_selector=label_selector,
            _request_timeout=REQUEST_TIMEOUT_S * 2,
        )
        try:
            body = await response.json()
        except (aiohttp.ClientError, ValueError, asyncio.TimeoutError) as exc:
            raise TransientApiError(None, f"list {collection}: {exc}") from None
        finally:
            response.release()
        meta = body.get("metadata") or {}
        return body.get("items") or [], meta.get("resourceVersion") or "", meta.get("continue") or None

    async def watch_raw(self, collection: str, resource_version: str, timeout_s: int, label_selector: str | None = None):
        """Watch events ({type, object}) from a resourceVersion until the server ends the stream."""
        response = await self._raw(
            collection, watch=True, resource_version=resource_version, timeout_seconds=timeout_s,
            allow_watch_bookmarks=True, label_selector=label_selector,
            _request_timeout=timeout_s + REQUEST_TIMEOUT_S,
        )
        try:
            async for line in response.content:
                if line.strip():
                    yield json.loads(line)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise TransientApiError(None, f"watch {collection}: {exc}") from None
        finally:
            response.release()
