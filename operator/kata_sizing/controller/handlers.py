"""Every kopf decorator of the operator, in one place. kopf logs in, runs the startup and
cleanup, watches the policies and serves the admission webhook; nothing more (docs/operation.md,
What kopf does). Its policy handler only records the body and queues a pass (`worker`); passes,
retries, the resync, the guidance check, drift and deletion are the operator's own work queue.
No finalizer, no annotation, no patch of kopf's on a policy: the garbage collector removes what
the operator made for a deleted policy (every such object carries an ownerReference to it).

`build_registry()` returns a fresh registry so tests run each operator with its own; the
`operator` subcommand runs kopf with it. `build_registry(admission=True)` adds the validating
admission handler, for operators started with a webhook server (`operator --webhook-port`).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import kopf

from ..core.crdgen import CRD_NAME
from ..core.model import GROUP, KIND, PLURAL, VERSION
from ..core.podfit import policies_opted_into, route_patch
from ..core.podread import PodInputError
from ..core.sizing import PolicySizing
from . import gather, metrics, retry, worker
from . import policy_webhook as adm
from .api_errors import ApiError, TransientApiError
from .cluster import namespace_labels, summarize_node, summarize_pod
from .events import EventPoster
from .informer import ChildCache, Informer, name_key, policy_crd
from .kube import KubeApi
from .kubelet import DirectKubelets, KubeletOptions
from .leader import LeaderElector
from .measurement import Clock, MeasurementLoop
from .state import OperatorState

log = logging.getLogger("kata_sizing")

# How long cleanup lets a pass in progress finish before it is cancelled and the client closed.
SHUTDOWN_GRACE_S = 5
# Connections kopf may hold to the API server (its own session has no limit): it holds one
# watch (the policies) and makes no other request.
KOPF_CONNECTIONS = 2
# kopf says "Handler 'x' succeeded." at INFO for every event its handlers take: one line per
# policy status write, which tells an administrator nothing. Its warnings and errors stay.
KOPF_OBJECT_LOG_LEVEL = logging.WARNING
# What the operator says, once, when the policies' CRD goes while it runs (docs/install.md).
CRD_GONE = ("CustomResourceDefinition %s was deleted, and every KataSizingPolicy with it: the operator stops "
            "(restarted, it waits for the CRD to come back); what the policies made is left to the garbage "
            "collector and the uninstall's sweep")


def stop_when_the_crd_goes(stop: asyncio.Event) -> None:
    """Say that the policies' CRD went, and stop kopf (before its watch of the policies meets 404)."""
    if not stop.is_set():
        log.warning(CRD_GONE, CRD_NAME)
        stop.set()


def _bounded_login(login):
    """kopf's login function, with the session it would build given a connection limit."""

    async def bounded_login(**kwargs) -> kopf.AiohttpSession | None:
        info = login(**kwargs)
        if info is None:
            return None
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=KOPF_CONNECTIONS, ssl=info.as_ssl_context()),
            headers=info.as_http_headers(), proxy=info.proxy_url, trust_env=info.trust_env,
        )
        return kopf.AiohttpSession(
            server=info.server, default_namespace=info.default_namespace, priority=info.priority,
            expiration=info.expiration, aiohttp_session=session,
        )

    return bounded_login


def login_in_cluster(**kwargs) -> kopf.ConnectionInfo | None:
    """kopf's service-account login, addressed as client-go's in-cluster configuration addresses
    it: the kubernetes Service's IP and port from the environment the kubelet sets, not the name
    `kubernetes.default.svc`, which needs cluster DNS (a node without it left kopf retrying DNS
    lookups while the operator's own client, already on the Service IP, worked: docs/testing.md)."""
    info = kopf.login_with_service_account(**kwargs)
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if info is None or not host or not port:
        return info
    # An IPv6 Service address in brackets, as net.JoinHostPort writes it.
    return dataclasses.replace(info, server=f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}")


def _plain(body: kopf.Body) -> dict:
    return copy.deepcopy(dict(body))


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf keeps the last handled state of an object for its change handlers, which this
    operator has none of (its status and its queue hold what it needs): nothing is stored, and
    nothing built. kopf's default deep-copies every event's body, the status included (a twentieth
    of the operator's CPU in a cold start of 200 policies, docs/performance.md)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


async def on_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    settings.posting.enabled = False  # the operator posts its own events (events.py)
    settings.persistence.diffbase_storage = NoDiffBase()
    logging.getLogger("kopf.objects").setLevel(max(KOPF_OBJECT_LOG_LEVEL, logging.getLogger("kopf.objects").level))
    api = await KubeApi.connect()
    options = getattr(memo, "lease", None)
    leader = None
    if options is not None:
        # Two replicas: only the Lease holder's queue runs passes; both follow the cluster.
        api.identify(options.identity)
        leader = LeaderElector(api, options)
    # Which admission kinds (ValidatingAdmissionPolicy, MutatingAdmissionPolicy and their
    # bindings) this server serves, at which version: only those are written and followed.
    admission_versions = await _discover_admission(api)
    events = EventPoster(api, instance=options.identity if options is not None else "kata-sizing")
    state = OperatorState(
        api=api, admission_versions=admission_versions,
        children=ChildCache(api, on_change=lambda key, before, after: worker.child_changed(
            memo.state, key, before, after), admission_versions=admission_versions),
        nodes=Informer(api, "Node", summarize_node), pods=Informer(api, "Pod", summarize_pod), leader=leader,
        events=events,
    )
    memo.state = state
    state.work = worker.new_queue(state)
    if leader is not None:
        leader.listen(lambda leading: worker.leadership_changed(state, leading))
    install_pod_routing(settings, state)
    state.measurement = _measurement_loop(state, memo)
    metrics.track_measurement(state.measurement)
    metrics.track_task(worker.POLICY_WATCH)
    # run_operator's stop flag: with it, the operator stops cleanly when its CRD is deleted.
    crd_stop: asyncio.Event | None = getattr(memo, "crd_stop", None)
    # Each task goes on after a raise (said at ERROR, counted, started again: retry.keep_running).
    state.background = [
        *([_background("crd-informer", policy_crd(api, lambda: stop_when_the_crd_goes(crd_stop)).run)]
          if crd_stop is not None else []),
        *([_background("leader-election", leader.run)] if leader else []),
        *(_background(f"{i.collection}-informer", i.run) for i in state.informers()),
        _background("pass-queue", state.work.run),
        _background("guidance-check", lambda: worker.watch_guidance(state)),
        _background("measurement", state.measurement.run),
        _background("events", events.run),
    ]


def _background(task: str, run: Callable[[], Awaitable[object]]) -> asyncio.Task:
    return asyncio.create_task(retry.keep_running(task, run), name=task)


def _measurement_loop(state: OperatorState, memo: kopf.Memo) -> MeasurementLoop:
    """The loop that reads kubelet Summaries (controller/measurement.py), directly from each
    kubelet or through the API server's node proxy (memo.kubelet, a KubeletOptions); only the
    leader's runs."""
    options = getattr(memo, "kubelet", None) or KubeletOptions()
    state.kubelets = DirectKubelets(state.api.configuration, options) if options.access == "direct" else None

    async def read(node: str) -> object:
        if state.kubelets is None:
            return await state.api.read_node_summary(node, options.timeout_s)
        found = gather.memoized(state, "nodes-by-name", state.nodes.version,
                                lambda: {n.name: n for n in state.nodes.items.values()}).get(node)
        return await state.kubelets.read(node, found.kubelet_address if found else None,
                                         found.kubelet_port if found else None)

    return MeasurementLoop(read, state.pods, events=state.events,
                           clock=getattr(memo, "measurement_clock", None) or Clock(),
                           gate=state.leader.wait_leading if state.leader else None)


async def _discover_admission(api: KubeApi) -> dict[str, str]:
    """Discovery, retried with back-off until it answers (an API server starting up)."""
    failures = 0
    while True:
        try:
            return await api.served_admission_versions()
        except TransientApiError as exc:
            delay = retry.backoff_s(failures)
            failures += 1
            log.warning("discovery of the admission kinds failed: %s; retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)


# The background tasks that are the leader's work: stopped before the Lease is given up.
LEADER_WORK = ("pass-queue", "guidance-check", "measurement")


async def step_down(state: OperatorState) -> None:
    """Stop this replica's leading and give the Lease up, leaving the informers (what the webhook
    reads) running: no acquire or renew after this, the pass in progress finishes (its writes
    land, its status is written) and no other starts, then the Lease is released so the other
    replica takes over at its next try, not after the lease expires. On cleanup, and at the start
    of a SIGTERM's drain (operator_main.install_drain)."""
    elector = [task for task in state.background if task.get_name() == "leader-election"]
    for task in elector:
        task.cancel()
    if elector:
        await asyncio.wait(elector, timeout=SHUTDOWN_GRACE_S)
    if state.work is not None:
        try:
            await asyncio.wait_for(state.work.drain(), SHUTDOWN_GRACE_S)
        except TimeoutError:
            log.warning("stopping with a pass still in progress")
    work = [task for task in state.background if task.get_name() in LEADER_WORK]
    for task in work:
        task.cancel()
    if work:
        await asyncio.wait(work, timeout=SHUTDOWN_GRACE_S)
    if state.leader is not None:
        await state.leader.release()


async def on_cleanup(memo: kopf.Memo, **_) -> None:
    # kopf gives the operator's stop flag a waiter task that it does not cancel when it stops for
    # another reason (a SIGTERM), and then waits 5 s for that task before it exits (kopf 1.45's
    # run_tasks): the flag set here, the process exits as soon as this cleanup is done.
    stop: asyncio.Event | None = getattr(memo, "crd_stop", None)
    if stop is not None:
        stop.set()
    state: OperatorState | None = getattr(memo, "state", None)
    if state is None:
        return
    # A pass in progress finishes before the client it uses is closed: closing it under a request
    # gives "connector is None" errors.
    await step_down(state)
    posting = [task for task in state.background if task.get_name() == "events"]
    for task in state.background:
        if task not in posting:
            task.cancel()
    if isinstance(state.events, EventPoster):
        state.events.close()  # what the passes said is posted, then the poster ends
    # Bounded: a task that missed its cancellation (Python 3.11's wait_for can lose one, and the
    # kubernetes client's requests use it) must not hold the process up until it is killed.
    _done, pending = await asyncio.wait(state.background, timeout=SHUTDOWN_GRACE_S)
    if pending:
        log.warning("stopping with %s still running", ", ".join(sorted(t.get_name() for t in pending)))
    if state.kubelets is not None:
        await state.kubelets.close()
    await state.api.close()


async def policy_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_) -> None:  # noqa: A002 - kopf's name
    # A shallow copy: kopf hands each event's freshly parsed body and never changes it, and the
    # operator never changes a body it keeps (a deep copy was a twentieth of its CPU at a cold start).
    worker.policy_watched(memo.state, type, dict(body))


async def validate_policy(
    body: kopf.Body, warnings: list[str], operation: str | None = None, old: kopf.Body | None = None,
    new: kopf.Body | None = None, **_: Any,
) -> None:
    if not adm.needs_review(operation, old, new):
        return
    errors, found_warnings = adm.admission_problems(_plain(body))
    metrics.admission(errors, found_warnings)
    if errors:
        # 422, as the API server answers an object that breaks its own schema.
        raise kopf.AdmissionError("; ".join(errors), code=422)
    warnings.extend(found_warnings)  # kubectl prints these as "Warning: ..."


# --- routing of opted-in pods through the operator's webhook (no MutatingAdmissionPolicy) ------


def routes_through_webhook(routing: str, admission_versions: dict[str, str]) -> bool:
    """Whether this operator's webhook routes a policy's pods: routing Webhook, or Auto on a server
    that serves no MutatingAdmissionPolicy (the MAP the operator writes otherwise does it)."""
    if routing == "Webhook":
        return True
    return routing == "Auto" and "MutatingAdmissionPolicy" not in admission_versions


async def route_pod(state: OperatorState, review: dict) -> dict:
    """The mutating webhook (failurePolicy Ignore): a pod labelled katasizing.dev/policy=<name>
    (or in a namespace so labelled) without a runtimeClassName, in that policy's namespaces, gets
    the smallest class of that policy that covers its limits (podfit.route_patch, the rule the
    MutatingAdmissionPolicy applies, with the same namespace labels its binding's selector reads).
    Answered from memory: the policies from the operator's watch, the namespaces from its cache.
    Never refuses: a pod it cannot route is let through unchanged, and the
    ValidatingAdmissionPolicy refuses it with the reason (rule pod-not-routed)."""
    found = adm.pod_to_route(review)
    if found is None:
        return adm.review_response(review, allowed=True)
    pod, namespace = found
    try:
        labels = await labels_of_namespace(state, namespace)
        patch: list[dict] = []
        # As the policies' bindings do: each policy the pod opted into routes it in its own scope.
        for name in policies_opted_into(pod["metadata"], labels):
            sizing = await sizing_routed_by_webhook(state, name)
            patch = route_patch(pod, sizing, labels) if sizing is not None else []
            if patch:
                break
    except (ApiError, PodInputError) as exc:
        log.warning("pod %s/%s not routed: %s", namespace, (pod.get("metadata") or {}).get("name"), exc)
        return adm.review_response(review, allowed=True, warnings=[f"kata-sizing could not route this pod: {exc}"])
    metrics.admission([], [], routed=bool(patch))
    return adm.review_response(review, allowed=True, patch=patch)


async def labels_of_namespace(state: OperatorState, name: str) -> dict[str, str]:
    """The namespace's labels from the cache; read from the API server only when the cache has not
    seen the namespace yet (created a moment before its first pod)."""
    if state.namespaces is not None:
        cached = state.namespaces.items.get((None, name))
        if cached is not None:
            return cached
    found = await state.api.read(("Namespace", None, name))
    return namespace_labels(found) if found is not None else {}


async def sizing_routed_by_webhook(state: OperatorState, policy_name: str) -> PolicySizing | None:
    """The sizing of the policy as the policy watch last saw it, when this webhook routes its pods.
    A policy the watch has not delivered is read (one GET): a replica is ready once its caches
    synced and its webhook listens, which can be a moment before kopf's watch has listed the
    policies, and a review then would let the pod through unrouted (to be refused as not routed: 1
    pod in 400 during one rolling update on the real node). A label naming no policy costs the same
    GET, answered 404."""
    record = state.records.get(policy_name)
    body = record.body if record is not None else await state.api.read((KIND, None, policy_name))
    sizing = gather.policy_sizing(state, body) if body is not None else None
    if sizing is None or not routes_through_webhook(sizing.policy.spec.admission.routing, state.admission_versions):
        return None
    return sizing


def install_pod_routing(settings: kopf.OperatorSettings, state: OperatorState) -> None:
    routes = getattr(settings.admission.server, "routes", None)
    state.webhook_serving = routes is not None
    if routes is not None:
        # name_key: a cluster-scoped object's key is (None, name).
        state.namespaces = Informer(state.api, "Namespace", namespace_labels, key=name_key)
        routes[adm.ROUTE_POD_PATH_ID] = lambda review: route_pod(state, review)


def build_registry(admission: bool = False) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    policies = (GROUP, VERSION, PLURAL)
    # kopf's own logins, like kubectl: the service account in a pod, else KUBECONFIG/~/.kube/config.
    kopf.on.login(registry=registry, id="service-account")(_bounded_login(login_in_cluster))
    kopf.on.login(registry=registry, id="kubeconfig")(_bounded_login(kopf.login_with_kubeconfig))
    kopf.on.startup(registry=registry)(on_startup)
    kopf.on.cleanup(registry=registry)(on_cleanup)
    # The policy watch: every event only refreshes the policy's record and, when it matters,
    # queues a pass (worker.policy_seen). The operator's own caches follow the objects it manages.
    kopf.on.event(*policies, registry=registry, id="policies")(policy_event)
    if admission:
        # Only with a webhook server: kopf refuses to start with admission handlers and no
        # server configured.
        kopf.on.validate(*policies, registry=registry, id=adm.VALIDATE_HANDLER_ID,
                         operations=["CREATE", "UPDATE"])(validate_policy)
    return registry
