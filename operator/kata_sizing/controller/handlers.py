"""Every kopf decorator of the operator, in one place; the logic lives in `reconcile`.

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

import aiohttp
import kopf

from . import policy_webhook as adm
from ..core import defaults
from . import metrics
from . import reconcile as rc
from .cluster import facts_for_nodes, summarize_node, summarize_pod
from ..core.audit import audit_runtime_classes
from .informer import ChildCache, Informer, backoff_s
from .kube import ApiError, KubeApi, TransientApiError
from .leader import LeaderElector, gate_kopf, install_kopf_gate, ungate_kopf
from ..core.model import GROUP, PLURAL, VERSION, PolicyError, parse_policy
from ..core.podfit import POLICY_LABEL, PodInputError, check_limits, route_patch
from ..core.sizing import size_policy
from .workqueue import Retry, WorkQueue

log = logging.getLogger("kata_sizing")

# A resync re-reads every managed object (from the watch-fed cache) and writes nothing when
# all is in sync; it catches what a watch may have missed. Seconds.
RESYNC_INTERVAL_S = float(os.environ.get("KATA_SIZING_RESYNC_SECONDS", "300"))
# Node guidance is recomputed from the watch-fed indexes at most this often per policy, so
# a storm of pod events turns into one recompute. Seconds.
GUIDANCE_INTERVAL_S = float(os.environ.get("KATA_SIZING_GUIDANCE_SECONDS", "10"))
# Retries of a failed reconcile: capped exponential back-off with jitter, never given up.
RETRY_BASE_S = 0.2
RETRY_CAP_S = 30.0
ANNOTATION_PREFIX = "katasizing.dev"
FINALIZER = "katasizing.dev/cleanup"
INFORMER_SYNC_TIMEOUT_S = 20
# Drift corrections run concurrently for different objects (one policy's are serialized by its lock).
DRIFT_WORKERS = 4
# How long cleanup waits for a pass in progress before closing the client under it.
SHUTDOWN_GRACE_S = 5
# Connections kopf may hold to the API server (its own session has no limit). Over TLS each
# connection costs about 300 KiB (asyncio's 256 KiB read buffer plus OpenSSL's state): a cold
# start of 200 policies opened about 70 of them, all kept alive afterwards. kopf holds one
# watch (the policies) and posts events one at a time; the rest are status and annotation
# patches, which queue for a free connection instead.
KOPF_CONNECTIONS = 8


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


def _event_sink(ref: dict, type_: str, reason: str, message: str) -> None:
    # Events carry at most 1 KiB of message in practice; the full text is in status.
    kopf.event(ref, type=type_, reason=reason, message=message[:1000])


def _plain(body: kopf.Body) -> dict:
    return copy.deepcopy(dict(body))


async def on_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    # Progress and diff-base in annotations: the CRD's structural schema would prune status.kopf.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.INFO
    # A policy deleted while one of its timers runs is released (finalizer removed) only when
    # kopf checks the stopped timer again: every 60 s by default, so `kubectl delete ksp` could
    # hang for a minute (seen on the real API server). The check is cheap; do it often.
    settings.background.cancellation_polling = 0.5
    memo.api = await KubeApi.connect()
    options = getattr(memo, "lease", None)
    memo.leader = None
    if options is not None:
        # Two replicas: only the Lease holder's kopf runs handlers and its drift queue writes.
        memo.api.identify(options.identity)
        memo.leader = LeaderElector(memo.api, options)
        gate_kopf(settings, memo.leader)
    memo.cache = rc.DesiredCache()
    memo.locks = {}
    # Per policy: the inputs (informer versions), node facts and audit rows of its last
    # successful pass; the guidance timer compares against them.
    memo.last_pass = {}
    memo.derived = {}  # memoized node facts and audit, shared by every policy
    memo.tombstones = {}  # the last state of a deleted child, until its deletion is handled
    # Which admission kinds (ValidatingAdmissionPolicy, MutatingAdmissionPolicy and their
    # bindings) this server serves, at which version: only those are written and followed.
    memo.admission_versions = await _discover_admission(memo.api)
    memo.children = ChildCache(
        memo.api, on_change=lambda key, before, after: _child_changed(memo, key, before, after),
        admission_versions=memo.admission_versions)
    memo.nodes = Informer(memo.api, "nodes", summarize_node)
    memo.pods = Informer(memo.api, "pods", summarize_pod)
    # Also in the memo itself, where the metrics and readiness endpoint looks for informers.
    memo.runtime_classes, memo.config_maps = memo.children.runtime_classes, memo.children.config_maps
    for kind, informer in memo.children.admission.items():
        memo[f"admission_{kind}"] = informer
    memo.work = WorkQueue(
        lambda item: _process(memo, item), workers=DRIFT_WORKERS, retry_base_s=RETRY_BASE_S,
        retry_cap_s=RETRY_CAP_S, name="drift", gate=memo.leader.wait_leading if memo.leader else None,
    )
    install_pod_routing(settings, memo)
    memo.background = [
        *([asyncio.create_task(memo.leader.run(), name="leader-election")] if memo.leader else []),
        asyncio.create_task(memo.nodes.run(), name="nodes-informer"),
        asyncio.create_task(memo.pods.run(), name="pods-informer"),
        *(asyncio.create_task(i.run(), name=f"{i.collection}-informer") for i in memo.children.informers()),
    ]


async def _discover_admission(api: KubeApi) -> dict[str, str]:
    """Discovery, retried with back-off until it answers (an API server starting up)."""
    failures = 0
    while True:
        try:
            return await api.served_admission_versions()
        except TransientApiError as exc:
            delay = _retry_delay_s(failures)
            failures += 1
            log.warning("discovery of the admission kinds failed: %s; retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)


async def on_cleanup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    ungate_kopf(settings)
    tasks = getattr(memo, "background", [])
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # A pass kopf started may still hold its policy's lock: let it finish before the client
    # it uses is closed (closing it under a request gives "connector is None" errors).
    locks = list(getattr(memo, "locks", {}).values())
    try:
        await asyncio.wait_for(_all_released(locks), SHUTDOWN_GRACE_S)
    except asyncio.TimeoutError:
        log.warning("closing the API client with a pass still in progress")
    if getattr(memo, "leader", None) is not None:
        await memo.leader.release()  # the other replica takes over now, not after the lease expires
    api = getattr(memo, "api", None)
    if api is not None:
        await api.close()


async def _all_released(locks: list[asyncio.Lock]) -> None:
    for lock in locks:
        async with lock:
            pass


def _retry_delay_s(retry: int) -> float:
    return backoff_s(retry, RETRY_BASE_S, RETRY_CAP_S)


def _lock(memo: kopf.Memo, name: str) -> asyncio.Lock:
    return memo.locks.setdefault(name, asyncio.Lock())


# --- inputs shared by every policy, computed once per change --------------------------------


def _inputs(memo: kopf.Memo) -> tuple[int, int, int, int]:
    """Versions of everything a pass reads besides the policy: nodes, pods, every RuntimeClass
    (for the audit) and the set of policies (which classes are Kata ones)."""
    return memo.nodes.version, memo.pods.version, memo.children.runtime_classes.version, memo.cache.version


def _memoized(memo: kopf.Memo, key: tuple, compute):
    found = memo.derived.get(key)
    if found is None:
        if len(memo.derived) > 64:
            memo.derived.clear()
        found = memo.derived[key] = (compute(),)
    return found[0]


async def _node_facts(body: dict, memo: kopf.Memo) -> tuple | None:
    """Facts of the policy's nodes from the informers; None until they have synced once."""
    try:
        await asyncio.wait_for(
            asyncio.gather(memo.nodes.synced.wait(), memo.pods.synced.wait()), INFORMER_SYNC_TIMEOUT_S
        )
    except asyncio.TimeoutError:
        return None
    selector = ((body.get("spec") or {}).get("nodes") or {}).get("selector")
    if selector is None:
        selector = dict(defaults.KATA_NODE_LABEL)
    pods_by_node = _memoized(memo, ("pods-by-node", memo.pods.version), lambda: _pods_by_node(memo))
    kata_classes = _memoized(memo, ("kata-classes", memo.cache.version), memo.cache.runtime_class_names)
    return _memoized(
        memo, ("facts", memo.nodes.version, memo.pods.version, memo.cache.version, tuple(sorted(selector.items()))),
        lambda: tuple(facts_for_nodes(memo.nodes.items.values(), pods_by_node, selector, kata_classes)),
    )


def _pods_by_node(memo: kopf.Memo) -> dict[str, list]:
    pods_by_node: dict[str, list] = {}
    for request in memo.pods.items.values():
        if request.node is not None:
            pods_by_node.setdefault(request.node, []).append(request)
    return pods_by_node


def _pods_by_class(memo: kopf.Memo) -> dict[str, list]:
    """The pods the audit looks at, by runtimeClassName (a routed-by label: by that policy)."""
    by_class: dict[str, list] = {}
    for request in memo.pods.items.values():
        if request.limits is None:
            continue
        key = request.runtime_class or f"routed-by:{request.routed_by}"
        by_class.setdefault(key, []).append(request)
    return by_class


def _sizing(memo: kopf.Memo, body: dict):
    """The policy's sizing, memoized per generation; None when the policy is invalid."""
    meta = body.get("metadata") or {}
    key = ("sizing", meta.get("name"), meta.get("uid"), meta.get("generation"))

    def compute():
        try:
            sizing = size_policy(parse_policy(body))
        except PolicyError:
            return None
        return None if sizing.errors else sizing

    return _memoized(memo, key, compute)


def _pod_findings(memo: kopf.Memo, body: dict) -> list[dict] | None:
    """The pod audit of one policy (issue 10, item 4): pods on its classes outside their class's
    envelope or without a memory limit, and pods it was asked to route that have no class, by
    the rule of the admission policies (podfit.check_limits). None until the pod cache synced,
    or for an invalid policy (status keeps the last audit)."""
    if not memo.pods.synced.is_set():
        return None
    sizing = _sizing(memo, body)
    if sizing is None:
        return None
    by_class = _memoized(memo, ("pods-by-class", memo.pods.version), lambda: _pods_by_class(memo))
    candidates = [p for c in sizing.classes for p in by_class.get(c.runtime_class, ())]
    candidates += by_class.get(f"routed-by:{sizing.policy.name}", ())
    findings = []
    # Most pods share a few shapes of limits: judge each shape once, name only the pods that break a rule.
    breaks: dict[tuple, bool] = {}
    for request in candidates:
        opted_in = request.routed_by == sizing.policy.name
        shape = (request.runtime_class, request.limits, opted_in)
        if shape not in breaks:
            breaks[shape] = bool(check_limits(request.limits, request.runtime_class or "", sizing, opted_in=opted_in))
        if not breaks[shape]:
            continue
        namespace, _, name = request.pod.partition("/")
        for finding in check_limits(request.limits, request.runtime_class or "", sizing, namespace, name,
                                    opted_in=opted_in):
            findings.append({
                "pod": request.pod, "runtimeClass": finding.runtime_class, "class": finding.class_name or "none",
                "rule": finding.rule, "action": finding.action, "message": finding.message,
            })
    return findings


def _audit(memo: kopf.Memo) -> list | None:
    if not memo.children.runtime_classes.synced.is_set():
        return None
    return _memoized(
        memo, ("audit", memo.children.runtime_classes.version, memo.cache.version),
        lambda: audit_runtime_classes(list(memo.children.all_runtime_classes()), memo.cache.runtime_class_names()),
    )


# --- one pass for one policy ----------------------------------------------------------------


async def _pass(memo: kopf.Memo, body: dict, trigger: rc.Trigger, facts: tuple | None = None) -> None:
    """Reconcile one policy; API errors propagate (the callers decide how to retry)."""
    name = body["metadata"]["name"]
    _start_drift_queue(memo)
    try:
        await asyncio.wait_for(memo.children.wait_synced(), INFORMER_SYNC_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise TransientApiError(None, "the RuntimeClass and ConfigMap caches have not synced yet") from None
    async with _lock(memo, name):
        inputs = _inputs(memo)
        if facts is None:
            facts = await _node_facts(body, memo)
        findings = _audit(memo)
        pod_findings = _pod_findings(memo, body)
        with metrics.reconcile_pass(name, trigger) as current:
            current.done(await rc.reconcile(
                memo.api, body, trigger, memo.cache, _event_sink, nodes=list(facts) if facts is not None else None,
                audit_findings=findings, children=memo.children, admission_versions=memo.admission_versions,
                pod_findings=pod_findings, webhook_serving=memo.webhook_serving,
            ))
        # Only after success: a failed pass is retried, not taken as done.
        memo.last_pass[name] = (inputs, facts, findings, pod_findings)


async def _reconcile(memo: kopf.Memo, body: kopf.Body, trigger: rc.Trigger, retry: int, facts: tuple | None = None) -> None:
    try:
        await _pass(memo, _plain(body), trigger, facts)
    except (TransientApiError, rc.Conflict) as exc:
        delay = _retry_delay_s(retry)
        raise kopf.TemporaryError(f"{exc}; retrying in {delay:.1f}s", delay=delay) from None
    except ApiError as exc:
        # 4xx other than 409 (a refused object, a lost permission): retrying soon won't help.
        raise kopf.TemporaryError(f"{exc}; retrying in 60s", delay=60) from None


async def apply_policy(body: kopf.Body, memo: kopf.Memo, retry: int, **_) -> None:
    await _reconcile(memo, body, "apply", retry)


async def resume_policy(body: kopf.Body, memo: kopf.Memo, retry: int, **_) -> None:
    await _reconcile(memo, body, "resync", retry)


async def resync_policy(body: kopf.Body, memo: kopf.Memo, retry: int, **_) -> None:
    """A failure is retried by kopf after the back-off (TemporaryError), not at the next interval."""
    if body.get("metadata", {}).get("deletionTimestamp"):
        return
    await _reconcile(memo, body, "resync", retry)


async def refresh_guidance(body: kopf.Body, memo: kopf.Memo, retry: int, **_) -> None:
    """Debounced: at most once per interval, and only when this policy's node facts, the
    audit of unmanaged RuntimeClasses or the audit of its pods changed. A change to some other policy's RuntimeClass
    changes neither, so it does not make every policy reconcile."""
    name = body["metadata"]["name"]
    if body.get("metadata", {}).get("deletionTimestamp") or name not in memo.last_pass:
        return
    inputs, facts, findings, pod_findings = memo.last_pass[name]
    if inputs == _inputs(memo):
        return
    now_inputs = _inputs(memo)
    plain = _plain(body)
    fresh = await _node_facts(plain, memo)
    fresh_findings = _audit(memo)
    fresh_pod_findings = _pod_findings(memo, plain)
    if fresh == facts and fresh_findings == findings and fresh_pod_findings == pod_findings:
        memo.last_pass[name] = (now_inputs, facts, findings, pod_findings)
        return
    await _reconcile(memo, body, "resync", retry, facts=fresh)


async def delete_policy(body: kopf.Body, memo: kopf.Memo, retry: int, **_) -> None:
    name = body["metadata"]["name"]
    async with _lock(memo, name):
        try:
            removed = await rc.delete_children(memo.api, _plain(body), memo.cache, memo.children)
        except ApiError as exc:
            delay = _retry_delay_s(retry)
            raise kopf.TemporaryError(f"{exc}; retrying in {delay:.1f}s", delay=delay) from None
    memo.locks.pop(name, None)
    memo.last_pass.pop(name, None)
    metrics.forget_policy(name)
    if removed:
        log.info("policy %s deleted; removed %s", name, ", ".join(removed))


# --- drift: the child caches feed a work queue ----------------------------------------------


def _start_drift_queue(memo: kopf.Memo) -> None:
    """Started from the first pass, inside a kopf handler: the queue's tasks inherit the context
    kopf.event() posts through. Before any pass there is no desired state to correct towards."""
    if not any(t.get_name() == "drift-queue" for t in memo.background):
        memo.background.append(asyncio.create_task(memo.work.run(), name="drift-queue"))


def _child_changed(memo: kopf.Memo, key: rc.ObjKey, before: dict | None, after: dict | None) -> None:
    if after is None and before is not None:
        memo.tombstones[key] = before
    elif after is not None:
        memo.tombstones.pop(key, None)
    if memo.cache.for_child(key, after or before) is not None:
        memo.work.add(("child", key))


async def _process(memo: kopf.Memo, item: tuple) -> None:
    kind, key = item
    try:
        if kind == "child":
            await _correct_child(memo, key)
        else:
            body = await memo.api.read_policy(key)
            if body is not None and not body["metadata"].get("deletionTimestamp"):
                await _pass(memo, body, "resync")
    except (TransientApiError, rc.Conflict) as exc:
        raise Retry(str(exc)) from None
    except ApiError as exc:
        log.error("%s %s not handled: %s; the next resync retries", kind, key, exc)


async def _correct_child(memo: kopf.Memo, key: rc.ObjKey) -> None:
    """A managed RuntimeClass or ConfigMap changed or vanished: put it back or report it,
    judged on its current state in the cache (level-triggered)."""
    obj, event_type = memo.children.get(key), "MODIFIED"
    if obj is None:
        obj, event_type = memo.tombstones.get(key), "DELETED"
        if obj is None:
            return
    desired = memo.cache.for_child(key, obj)
    if desired is None:
        return
    if desired.needs_pass(key):
        # Somebody else's object that held our name is gone (a pass creates ours now), or the
        # chart created a RuntimeClass the status reports missing.
        memo.tombstones.pop(key, None)
        memo.work.add(("policy", desired.policy_name))
        return

    async def count(policy: str, field_name: str) -> None:
        metrics.drift(key[0], corrected=field_name == "driftCorrections")
        await rc.increment_counter(memo.api, policy, field_name)

    async with _lock(memo, desired.policy_name):
        message = await rc.handle_child_event(
            memo.api, memo.cache, event_type, copy.deepcopy(obj), _event_sink, count, memo.children)
    if event_type == "DELETED":
        memo.tombstones.pop(key, None)
    if message:
        log.info("%s", message)


async def validate_policy(
    body: kopf.Body, operation: str | None, old: kopf.Body | None, new: kopf.Body | None,
    warnings: list[str], **_,
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


async def route_pod(memo: kopf.Memo, review: dict) -> dict:
    """The mutating webhook (failurePolicy Ignore): a pod labelled katasizing.dev/policy=<name>
    (or in a namespace so labelled) without a runtimeClassName gets the smallest class of that
    policy that covers its limits (podfit.route_patch, the rule the MutatingAdmissionPolicy
    applies). Never refuses: a pod it cannot route is let through unchanged, and the
    ValidatingAdmissionPolicy refuses it with the reason (rule pod-not-routed)."""
    found = adm.pod_to_route(review)
    if found is None:
        return adm.review_response(review, allowed=True)
    pod, namespace = found
    try:
        name = ((pod.get("metadata") or {}).get("labels") or {}).get(POLICY_LABEL)
        namespace_labels = None
        if not name:
            namespace_obj = await memo.api.read_namespace(namespace)
            namespace_labels = ((namespace_obj or {}).get("metadata") or {}).get("labels") or {}
            name = namespace_labels.get(POLICY_LABEL)
        body = await memo.api.read_policy(name) if name else None
        sizing = _sizing(memo, body) if body is not None else None
        if sizing is None or not routes_through_webhook(sizing.policy.spec.admission.routing, memo.admission_versions):
            return adm.review_response(review, allowed=True)
        patch = route_patch(pod, sizing, namespace_labels)
    except (ApiError, PodInputError) as exc:
        log.warning("pod %s/%s not routed: %s", namespace, (pod.get("metadata") or {}).get("name"), exc)
        return adm.review_response(review, allowed=True, warnings=[f"kata-sizing could not route this pod: {exc}"])
    metrics.admission([], [], routed=bool(patch))
    return adm.review_response(review, allowed=True, patch=patch)


def install_pod_routing(settings: kopf.OperatorSettings, memo: kopf.Memo) -> None:
    routes = getattr(settings.admission.server, "routes", None)
    memo.webhook_serving = routes is not None
    if routes is not None:
        routes[adm.ROUTE_POD_PATH_ID] = lambda review: route_pod(memo, review)


def build_registry(admission: bool = False) -> kopf.OperatorRegistry:
    install_kopf_gate()  # before kopf starts; pauses only operators started with a Lease
    registry = kopf.OperatorRegistry()
    policies = (GROUP, VERSION, PLURAL)
    # kopf's own logins, like kubectl: the service account in a pod, else KUBECONFIG/~/.kube/config.
    kopf.on.login(registry=registry, id="service-account")(_bounded_login(login_in_cluster))
    kopf.on.login(registry=registry, id="kubeconfig")(_bounded_login(kopf.login_with_kubeconfig))
    kopf.on.startup(registry=registry)(on_startup)
    kopf.on.cleanup(registry=registry)(on_cleanup)
    kopf.on.create(*policies, registry=registry, id="apply")(apply_policy)
    kopf.on.update(*policies, registry=registry, id="apply", field="spec")(apply_policy)
    kopf.on.resume(*policies, registry=registry, id="resume")(resume_policy)
    kopf.timer(
        *policies, registry=registry, id="resync", interval=RESYNC_INTERVAL_S,
        initial_delay=RESYNC_INTERVAL_S, idle=None,
    )(resync_policy)
    kopf.timer(
        *policies, registry=registry, id="guidance", interval=GUIDANCE_INTERVAL_S,
        initial_delay=GUIDANCE_INTERVAL_S,
    )(refresh_guidance)
    kopf.on.delete(*policies, registry=registry, id="cleanup")(delete_policy)
    # Drift is not watched through kopf: the operator's own caches of RuntimeClasses and
    # managed ConfigMaps feed a work queue (see on_startup), so the same watch serves both
    # the reconcile's reads and drift, and a failed correction is retried until it succeeds.
    if admission:
        # Only with a webhook server: kopf refuses to start with admission handlers and no
        # server configured.
        kopf.on.validate(*policies, registry=registry, id=adm.VALIDATE_HANDLER_ID,
                         operations=["CREATE", "UPDATE"])(validate_policy)
    return registry
