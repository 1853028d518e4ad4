"""Every kopf decorator of the operator, in one place; a pass is `reconcile.run_pass` (gather,
plan, execute), and the operator's state is one typed object, `memo.state` (`state.py`).

`build_registry()` returns a fresh registry so tests run each operator with its own; the
`operator` subcommand runs kopf with it. `build_registry(admission=True)` adds the validating
admission handler, for operators started with a webhook server (`operator --webhook-port`).
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import dataclasses
import logging
import os

import aiohttp
import kopf

from . import gather, metrics
from . import policy_webhook as adm
from . import reconcile as rc
from .api_errors import ApiError, Conflict, TransientApiError
from .cluster import summarize_node, summarize_pod
from .compare import differences, is_ours
from .informer import ChildCache, Informer
from .kinds import policy_key
from .kube import KubeApi
from .kubelet import DirectKubelets, KubeletOptions
from .measurement import Clock, MeasurementLoop
from .leader import LeaderElector, gate_kopf, install_kopf_gate, kopf_event_context, ungate_kopf
from .plan import Ownership
from .retry import REFUSED_RETRY_S, RETRY_BASE_S, RETRY_CAP_S, backoff_s
from .state import OperatorState
from .workqueue import Retry, WorkQueue
from ..core.model import GROUP, KIND, PLURAL, VERSION
from ..core.podfit import POLICY_LABEL, PodInputError, route_patch

log = logging.getLogger("kata_sizing")

# A resync re-reads every managed object (from the watch-fed cache) and writes nothing when
# all is in sync; it catches what a watch may have missed. Seconds.
RESYNC_INTERVAL_S = float(os.environ.get("KATA_SIZING_RESYNC_SECONDS", "300"))
# Node guidance is recomputed from the watch-fed indexes at most this often per policy, so
# a storm of pod events turns into one recompute. Seconds.
GUIDANCE_INTERVAL_S = float(os.environ.get("KATA_SIZING_GUIDANCE_SECONDS", "10"))
ANNOTATION_PREFIX = "katasizing.dev"
FINALIZER = "katasizing.dev/cleanup"
INFORMER_SYNC_TIMEOUT_S = gather.INFORMER_SYNC_TIMEOUT_S
# Passes queued by drift events and by a new leader run concurrently for different policies
# (one policy's are serialized by its lock).
QUEUE_WORKERS = 4
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
    api = await KubeApi.connect()
    options = getattr(memo, "lease", None)
    leader = None
    if options is not None:
        # Two replicas: only the Lease holder's kopf runs handlers and its queue runs passes.
        api.identify(options.identity)
        leader = LeaderElector(api, options)
        gate_kopf(settings, leader)
    # Which admission kinds (ValidatingAdmissionPolicy, MutatingAdmissionPolicy and their
    # bindings) this server serves, at which version: only those are written and followed.
    admission_versions = await _discover_admission(api)
    state = OperatorState(
        api=api, admission_versions=admission_versions,
        children=ChildCache(api, on_change=lambda key, before, after: _child_changed(memo.state, key, before, after),
                            admission_versions=admission_versions),
        nodes=Informer(api, "Node", summarize_node), pods=Informer(api, "Pod", summarize_pod), leader=leader,
    )
    memo.state = state
    state.work = WorkQueue(
        lambda item: _process(state, item), workers=QUEUE_WORKERS, retry_base_s=RETRY_BASE_S,
        retry_cap_s=RETRY_CAP_S, name="passes", gate=leader.wait_leading if leader else None,
    )
    if leader is not None:
        leader.listen(lambda leading: _leadership_changed(state, leading, settings))
    install_pod_routing(settings, state)
    state.measurement = _measurement_loop(state, memo)
    metrics.track_measurement(state.measurement)
    state.background = [
        *([asyncio.create_task(leader.run(), name="leader-election")] if leader else []),
        *(asyncio.create_task(i.run(), name=f"{i.collection}-informer") for i in state.informers()),
    ]


def _measurement_loop(state: OperatorState, memo: kopf.Memo) -> MeasurementLoop:
    """The loop that reads kubelet Summaries (controller/measurement.py), directly from each
    kubelet or through the API server's node proxy (memo.kubelet, a KubeletOptions); only the
    leader's runs."""
    options = getattr(memo, "kubelet", None) or KubeletOptions()
    state.kubelets = DirectKubelets(state.api.configuration, options) if options.access == "direct" else None

    async def read(node: str) -> object:
        if state.kubelets is None:
            return await state.api.read_node_summary(node, options.timeout_s)
        found = gather.memoized(state, ("nodes-by-name", state.nodes.version),
                                lambda: {n.name: n for n in state.nodes.items.values()}).get(node)
        return await state.kubelets.read(node, found.kubelet_address if found else None,
                                         found.kubelet_port if found else None)

    return MeasurementLoop(read, state.pods, events=_event_sink, clock=getattr(memo, "measurement_clock", None) or Clock(),
                           gate=state.leader.wait_leading if state.leader else None)


async def _discover_admission(api: KubeApi) -> dict[str, str]:
    """Discovery, retried with back-off until it answers (an API server starting up)."""
    failures = 0
    while True:
        try:
            return await api.served_admission_versions()
        except TransientApiError as exc:
            delay = backoff_s(failures)
            failures += 1
            log.warning("discovery of the admission kinds failed: %s; retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)


async def on_cleanup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    ungate_kopf(settings)
    state: OperatorState | None = getattr(memo, "state", None)
    if state is None:
        return
    for task in state.background:
        task.cancel()
    await asyncio.gather(*state.background, return_exceptions=True)
    # A pass kopf started may still hold its policy's lock: let it finish before the client
    # it uses is closed (closing it under a request gives "connector is None" errors).
    try:
        await asyncio.wait_for(_all_released(list(state.locks.values())), SHUTDOWN_GRACE_S)
    except asyncio.TimeoutError:
        log.warning("closing the API client with a pass still in progress")
    if state.kubelets is not None:
        await state.kubelets.close()
    if state.leader is not None:
        await state.leader.release()  # the other replica takes over now, not after the lease expires
    await state.api.close()


async def _all_released(locks: list[asyncio.Lock]) -> None:
    for lock in locks:
        async with lock:
            pass


# --- one pass for one policy ----------------------------------------------------------------


async def _pass(state: OperatorState, body: dict, trigger: str, facts: tuple | None = None,
                queued: bool = False, reread_survey: bool = True) -> None:
    """Reconcile one policy; API errors propagate (the callers decide how to retry). A `queued`
    pass (a drift event's, a new leader's) runs on the latest body known once it holds the
    policy's lock, and not at all for a policy deleted meanwhile. The guidance timer's passes
    do not read spec.overhead.survey's ConfigMap again (`reread_survey`)."""
    name = body["metadata"]["name"]
    _start_queue(state)
    try:
        await asyncio.wait_for(state.children.wait_synced(), INFORMER_SYNC_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise TransientApiError(None, "the RuntimeClass and ConfigMap caches have not synced yet") from None
    async with state.lock(name):
        if queued:
            body = state.policies.get(name)
            if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
                return
        inputs = gather.inputs(state)
        if facts is None:
            facts = await gather.node_facts(state, body)
        findings = gather.unmanaged_audit(state)
        pods = gather.pod_findings(state, body)
        measured = _measured(state, name)
        with metrics.reconcile_pass(name, trigger) as current:
            current.done(await rc.run_pass(
                state, body, trigger, _event_sink, facts=facts, findings=findings, pods=pods,
                landed=current.writes, reread_survey=reread_survey))
        # Only after success: a failed pass is retried, not taken as done.
        state.last_pass[name] = (inputs, facts, findings, pods, measured)


def _measured(state: OperatorState, name: str) -> int | None:
    """The measurement's version of a policy: it moves about once per interval, and at once when
    the pods under the headroom threshold change (the guidance timer then writes the status)."""
    return state.measurement.version(name) if state.measurement is not None else None


def _measurement_as_written(state: OperatorState, name: str) -> bool:
    """The measurement's version moved (it does once per interval, measured or not), but the
    status it gives is the one this replica last wrote: a pass would write nothing. Without this,
    every policy ran a whole pass once per interval: 200 policies' passes in a burst after a
    cold start, with nothing to write (docs/performance.md)."""
    if state.measurement is None:
        return True
    report = state.measurement.report(name)
    if report is None:
        return True  # no node read yet: the status keeps what it says
    written = state.written_status.get(name)
    return written is not None and (written.get("measurement") or {}) == report


async def _reconcile(state: OperatorState, body: kopf.Body, trigger: str, retry: int,
                     facts: tuple | None = None, reread_survey: bool = True) -> None:
    try:
        await _pass(state, _plain(body), trigger, facts, reread_survey=reread_survey)
    except rc.RetryLater as exc:
        # The status says what is wrong; the queue runs the pass again with a growing back-off
        # (one retry loop per policy, whoever started the pass).
        log.info("policy %s: %s; queued to run again", body["metadata"]["name"], exc)
        state.enqueue_pass(body["metadata"]["name"], "retry")
    except (TransientApiError, Conflict) as exc:
        delay = backoff_s(retry)
        raise kopf.TemporaryError(f"{exc}; retrying in {delay:.1f}s", delay=delay) from None
    except ApiError as exc:
        # 4xx other than 409 (a refused object, a lost permission): retrying soon won't help.
        raise kopf.TemporaryError(f"{exc}; retrying in {REFUSED_RETRY_S:.0f}s", delay=REFUSED_RETRY_S) from None


async def apply_policy(body: kopf.Body, memo: kopf.Memo, retry: int, **_) -> None:
    await _reconcile(memo.state, body, "apply", retry)


async def resume_policy(body: kopf.Body, memo: kopf.Memo, retry: int, **_) -> None:
    await _reconcile(memo.state, body, "resync", retry)


async def resync_policy(body: kopf.Body, memo: kopf.Memo, retry: int, **_) -> None:
    """A failure is retried by kopf after the back-off (TemporaryError), not at the next interval."""
    if body.get("metadata", {}).get("deletionTimestamp"):
        return
    await _reconcile(memo.state, body, "resync", retry)


async def refresh_guidance(body: kopf.Body, memo: kopf.Memo, retry: int, **_) -> None:
    """Debounced: at most once per interval, and only when this policy's node facts, the
    audit of unmanaged RuntimeClasses or the audit of its pods changed. A change to some other
    policy's RuntimeClass changes neither, so it does not make every policy reconcile."""
    state: OperatorState = memo.state
    name = body["metadata"]["name"]
    if body.get("metadata", {}).get("deletionTimestamp") or name not in state.last_pass:
        return
    inputs, facts, findings, pods, measured = state.last_pass[name]
    now_inputs = gather.inputs(state)
    same_measurement = measured == _measured(state, name) or _measurement_as_written(state, name)
    if inputs == now_inputs and same_measurement:
        state.last_pass[name] = (inputs, facts, findings, pods, _measured(state, name))
        return
    plain = _plain(body)
    fresh = await gather.node_facts(state, plain)
    fresh_findings = gather.unmanaged_audit(state)
    fresh_pods = gather.pod_findings(state, plain)
    if fresh == facts and fresh_findings == findings and fresh_pods == pods and same_measurement:
        state.last_pass[name] = (now_inputs, facts, findings, pods, _measured(state, name))
        return
    await _reconcile(state, body, "resync", retry, facts=fresh, reread_survey=False)


async def delete_policy(body: kopf.Body, memo: kopf.Memo, retry: int, **_) -> None:
    state: OperatorState = memo.state
    name = body["metadata"]["name"]
    async with state.lock(name):
        try:
            removed = await rc.delete_children(state, _plain(body))
        except ApiError as exc:
            delay = backoff_s(retry)
            raise kopf.TemporaryError(f"{exc}; retrying in {delay:.1f}s", delay=delay) from None
    metrics.forget_policy(name)
    if removed:
        log.info("policy %s deleted; removed %s", name, ", ".join(removed))


# --- the queue: passes for drift events and for a new leader ----------------------------------


def _start_queue(state: OperatorState, context: contextvars.Context | None = None) -> None:
    """Started from the first pass, inside a kopf handler, or when this replica becomes the
    leader, in `context` (leader.kopf_event_context): the queue's tasks run where kopf.event()
    posts. Before either there is no desired state to correct towards."""
    if state.work is not None and not any(t.get_name() == "pass-queue" for t in state.background):
        state.background.append(asyncio.create_task(state.work.run(), name="pass-queue", context=context))
        if state.measurement is not None:
            # The same context: the measurement's HeadroomLow events are posted through it.
            state.background.append(asyncio.create_task(state.measurement.run(), name="measurement", context=context))


def _child_changed(state: OperatorState, key, before: dict | None, after: dict | None) -> None:
    """A managed object changed or vanished (or somebody else's with one of our names): its
    policy's pass decides what to do, as every pass does. Not for an object that is now as the
    policy wants it when its last pass had nothing to say about it (the echo of a write)."""
    desired = state.desired.for_child(key, after or before)
    if desired is None:
        return
    if after is not None and key not in state.attention.get(desired.policy_name, ()):
        found = desired.lookup(key)
        if found is not None and is_ours(after, desired.policy_name, desired.policy_uid) and not differences(
                found[0], after, found[1] is Ownership.GUARDED):
            return
    state.enqueue_pass(desired.policy_name, "drift")


async def _leadership_changed(state: OperatorState, leading: bool, settings: kopf.OperatorSettings) -> None:
    if leading:
        # kopf resumes only policies it has not seen in this process (a validating webhook call
        # counts as seeing one): a replica that leads again, or that served the webhook while it
        # followed, would otherwise wait for the next resync to say what changed, and one that
        # has never passed would have no queue running to pass at all.
        if state.work is not None:
            context = kopf_event_context(settings)
            if context is not None:
                _start_queue(state, context)
            state.work.add(("leader",))
        return
    # Not the leader: it exports no policy gauges (the alerts sum them over replicas) and
    # forgets what it said, which the leader says from now on.
    metrics.forget_all_policies()
    state.forget_leadership()


async def _process(state: OperatorState, item: tuple) -> None:
    if item[0] == "leader":
        try:
            policies = await state.api.list(KIND)
        except (TransientApiError, Conflict) as exc:
            raise Retry(str(exc)) from None
        for body in policies:
            if not (body.get("metadata") or {}).get("deletionTimestamp"):
                rc.remember_body(state, body)
                state.enqueue_pass(body["metadata"]["name"], "leader")
        return
    name = item[1]
    trigger = state.queued.pop(name, "retry")
    try:
        if name not in state.policies:
            body = await state.api.read(policy_key(name))
            if body is None or body["metadata"].get("deletionTimestamp"):
                return
            rc.remember_body(state, body)
        await _pass(state, state.policies[name], trigger, queued=True)
    except (TransientApiError, Conflict, rc.RetryLater) as exc:
        state.queued.setdefault(name, "retry")
        raise Retry(str(exc)) from None
    except ApiError as exc:
        log.error("policy %s not passed: %s; the next resync retries", name, exc)


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


async def route_pod(state: OperatorState, review: dict) -> dict:
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
            namespace_obj = await state.api.read(("Namespace", None, namespace))
            namespace_labels = ((namespace_obj or {}).get("metadata") or {}).get("labels") or {}
            name = namespace_labels.get(POLICY_LABEL)
        body = await state.api.read(policy_key(name)) if name else None
        sizing = gather.policy_sizing(state, body) if body is not None else None
        if sizing is None or not routes_through_webhook(sizing.policy.spec.admission.routing, state.admission_versions):
            return adm.review_response(review, allowed=True)
        patch = route_patch(pod, sizing, namespace_labels)
    except (ApiError, PodInputError) as exc:
        log.warning("pod %s/%s not routed: %s", namespace, (pod.get("metadata") or {}).get("name"), exc)
        return adm.review_response(review, allowed=True, warnings=[f"kata-sizing could not route this pod: {exc}"])
    metrics.admission([], [], routed=bool(patch))
    return adm.review_response(review, allowed=True, patch=patch)


def install_pod_routing(settings: kopf.OperatorSettings, state: OperatorState) -> None:
    routes = getattr(settings.admission.server, "routes", None)
    state.webhook_serving = routes is not None
    if routes is not None:
        routes[adm.ROUTE_POD_PATH_ID] = lambda review: route_pod(state, review)


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
    # Drift is not watched through kopf: the operator's own caches of RuntimeClasses, managed
    # ConfigMaps and admission objects queue a pass of the policy concerned (see on_startup), so
    # the same watch serves both the reconcile's reads and drift, and a failed pass is retried
    # until it succeeds.
    if admission:
        # Only with a webhook server: kopf refuses to start with admission handlers and no
        # server configured.
        kopf.on.validate(*policies, registry=registry, id=adm.VALIDATE_HANDLER_ID,
                         operations=["CREATE", "UPDATE"])(validate_policy)
    return registry
