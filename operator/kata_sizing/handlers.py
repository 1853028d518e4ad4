"""Every kopf decorator of the operator, in one place; the logic lives in `reconcile`.

`build_registry()` returns a fresh registry so tests run each operator with its own; the
`operator` subcommand runs kopf with it. `build_registry(admission=True)` adds the validating
admission handler, for operators started with a webhook server (`operator --webhook-port`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os

import kopf

from . import admission as adm
from . import defaults
from . import metrics
from . import reconcile as rc
from .cluster import facts_for_nodes, summarize_node, summarize_pod
from .audit import audit_runtime_classes
from .informer import Informer
from .kube import ApiError, KubeApi, TransientApiError
from .model import GROUP, PLURAL, VERSION
from .render import MANAGED_BY, MANAGED_BY_LABEL

log = logging.getLogger("kata_sizing")

# A resync re-reads every managed object and writes nothing when all is in sync; it catches
# what a watch may have missed (and retries conflicts that cleared up). Seconds.
RESYNC_INTERVAL_S = float(os.environ.get("KATA_SIZING_RESYNC_SECONDS", "300"))
# Node guidance is recomputed from the watch-fed indexes at most this often per policy, so
# a storm of pod events turns into one recompute. Seconds.
GUIDANCE_INTERVAL_S = float(os.environ.get("KATA_SIZING_GUIDANCE_SECONDS", "10"))
TRANSIENT_BACKOFF_S = (0.2, 0.5, 1, 2, 5, 10, 30)
DRIFT_RETRIES = 4
ANNOTATION_PREFIX = "katasizing.dev"
FINALIZER = "katasizing.dev/cleanup"


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
    # ConfigMaps are many in a real cluster: let the API server filter them for the watch.
    settings.watching.label_selectors["", "v1", "configmaps"] = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
    settings.posting.level = logging.INFO
    # A policy deleted while one of its timers runs is released (finalizer removed) only when
    # kopf checks the stopped timer again: every 60 s by default, so `kubectl delete ksp` could
    # hang for a minute (seen on the real API server). The check is cheap; do it often.
    settings.background.cancellation_polling = 0.5
    memo.api = await KubeApi.connect()
    memo.cache = rc.DesiredCache()
    memo.locks = {}
    memo.node_facts = {}
    memo.nodes = Informer(memo.api, "nodes", summarize_node)
    memo.pods = Informer(memo.api, "pods", summarize_pod)
    # Every RuntimeClass, not only ours: the audit looks for Kata ones nobody manages.
    memo.runtime_classes = Informer(memo.api, "runtimeclasses", lambda obj: obj)
    memo.informer_tasks = [
        asyncio.create_task(memo.nodes.run(), name="nodes-informer"),
        asyncio.create_task(memo.pods.run(), name="pods-informer"),
        asyncio.create_task(memo.runtime_classes.run(), name="runtimeclasses-informer"),
    ]


async def on_cleanup(memo: kopf.Memo, **_) -> None:
    for task in getattr(memo, "informer_tasks", []):
        task.cancel()
    await asyncio.gather(*getattr(memo, "informer_tasks", []), return_exceptions=True)
    api = getattr(memo, "api", None)
    if api is not None:
        await api.close()


def _backoff_s(retry: int) -> float:
    return TRANSIENT_BACKOFF_S[min(retry, len(TRANSIENT_BACKOFF_S) - 1)]


def _lock(memo: kopf.Memo, name: str) -> asyncio.Lock:
    return memo.locks.setdefault(name, asyncio.Lock())


INFORMER_SYNC_TIMEOUT_S = 20


async def _node_facts(body: kopf.Body, memo: kopf.Memo) -> list | None:
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
    kata_classes = memo.cache.runtime_class_names()
    pods_by_node: dict[str, list] = {}
    for node_name, request in memo.pods.items.values():
        pods_by_node.setdefault(node_name, []).append(request)
    return facts_for_nodes(memo.nodes.items.values(), pods_by_node, selector, kata_classes)


def _versions(memo: kopf.Memo) -> tuple[int, int, int]:
    return memo.nodes.version, memo.pods.version, memo.runtime_classes.version


def _audit(memo: kopf.Memo) -> list | None:
    if not memo.runtime_classes.synced.is_set():
        return None
    return audit_runtime_classes(list(memo.runtime_classes.items.values()), memo.cache.runtime_class_names())


async def _reconcile(
    memo: kopf.Memo, body: kopf.Body, trigger: rc.Trigger, retry: int, facts: list | None = None,
) -> None:
    name = body["metadata"]["name"]
    async with _lock(memo, name):
        if facts is None:
            facts = await _node_facts(body, memo)
        memo.node_facts[name] = (_versions(memo), tuple(facts or ()))
        try:
            with metrics.reconcile_pass(name, trigger) as current:
                current.done(await rc.reconcile(
                    memo.api, _plain(body), trigger, memo.cache, _event_sink, nodes=facts,
                    audit_findings=_audit(memo),
                ))
        except (TransientApiError, rc.Conflict) as exc:
            delay = _backoff_s(retry)
            raise kopf.TemporaryError(f"{exc}; retrying in {delay}s", delay=delay) from None
        except ApiError as exc:
            # 4xx other than 409 (a refused object, a lost permission): retrying soon won't help.
            raise kopf.TemporaryError(f"{exc}; retrying in 60s", delay=60) from None


async def apply_policy(body: kopf.Body, memo: kopf.Memo, retry: int, **_) -> None:
    await _reconcile(memo, body, "apply", retry)


async def resume_policy(body: kopf.Body, memo: kopf.Memo, retry: int, **_) -> None:
    await _reconcile(memo, body, "resync", retry)


async def resync_policy(body: kopf.Body, memo: kopf.Memo, **_) -> None:
    if body.get("metadata", {}).get("deletionTimestamp"):
        return
    try:
        await _reconcile(memo, body, "resync", 0)
    except kopf.TemporaryError as exc:
        log.warning("resync of %s failed: %s", body["metadata"]["name"], exc)


async def refresh_guidance(body: kopf.Body, memo: kopf.Memo, **_) -> None:
    """Debounced: at most once per interval, and only when the policy's node facts or the
    cluster's RuntimeClasses (for the audit) changed."""
    name = body["metadata"]["name"]
    if body.get("metadata", {}).get("deletionTimestamp") or name not in memo.node_facts:
        return
    versions, facts = memo.node_facts[name]
    if versions == _versions(memo):
        return
    fresh = await _node_facts(body, memo)
    if fresh is not None and tuple(fresh) == facts and versions[2] == memo.runtime_classes.version:
        memo.node_facts[name] = (_versions(memo), facts)
        return
    try:
        await _reconcile(memo, body, "resync", 0, facts=fresh)
    except kopf.TemporaryError as exc:
        log.warning("node guidance of %s not refreshed: %s", name, exc)


async def delete_policy(body: kopf.Body, memo: kopf.Memo, retry: int, **_) -> None:
    name = body["metadata"]["name"]
    async with _lock(memo, name):
        try:
            removed = await rc.delete_children(memo.api, _plain(body), memo.cache)
        except ApiError as exc:
            delay = _backoff_s(retry)
            raise kopf.TemporaryError(f"{exc}; retrying in {delay}s", delay=delay) from None
    memo.locks.pop(name, None)
    memo.node_facts.pop(name, None)
    metrics.forget_policy(name)
    if removed:
        log.info("policy %s deleted; removed %s", name, ", ".join(removed))


async def child_changed(event: kopf.RawEvent, memo: kopf.Memo, resource: kopf.Resource, **_) -> None:
    """A managed RuntimeClass or ConfigMap changed or vanished: drift."""
    obj = copy.deepcopy(dict(event["object"]))
    obj["kind"] = resource.kind
    key = rc.obj_key(obj)
    desired = memo.cache.for_child(key, obj)
    if desired is None:
        return
    async def count(policy: str, field_name: str) -> None:
        metrics.drift(resource.kind, corrected=field_name == "driftCorrections")
        await rc.increment_counter(memo.api, policy, field_name)

    for attempt in range(DRIFT_RETRIES):
        try:
            async with _lock(memo, desired.policy_name):
                message = await rc.handle_child_event(
                    memo.api, memo.cache, event.get("type"), obj, _event_sink, count
                )
            if message:
                log.info("%s", message)
            return
        except (TransientApiError, rc.Conflict) as exc:
            log.warning("drift handling of %s failed (%s); retrying", rc.describe(key), exc)
            await asyncio.sleep(TRANSIENT_BACKOFF_S[attempt])
        except ApiError as exc:
            log.error("drift of %s not corrected: %s; the next resync retries", rc.describe(key), exc)
            return
    log.error("drift of %s not handled; the next resync will", rc.describe(key))


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


def build_registry(admission: bool = False) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    policies = (GROUP, VERSION, PLURAL)
    # kopf's own logins, like kubectl: the service account in a pod, else KUBECONFIG/~/.kube/config.
    kopf.on.login(registry=registry, id="service-account")(kopf.login_with_service_account)
    kopf.on.login(registry=registry, id="kubeconfig")(kopf.login_with_kubeconfig)
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
    # No client-side label filter on the drift watches: an edit that removes our managed-by
    # label is drift too, and a filter would hide exactly that event. ConfigMaps are still
    # selected by the API server (settings.watching.label_selectors; the label's removal
    # arrives as DELETED); the cache decides which objects are ours to look at.
    kopf.on.event("node.k8s.io", "v1", "runtimeclasses", registry=registry,
                  id="runtimeclass-drift")(child_changed)
    kopf.on.event("", "v1", "configmaps", registry=registry,
                  id="configmap-drift")(child_changed)
    if admission:
        # Only with a webhook server: kopf refuses to start with admission handlers and no
        # server configured.
        kopf.on.validate(*policies, registry=registry, id=adm.VALIDATE_HANDLER_ID,
                         operations=["CREATE", "UPDATE"])(validate_policy)
    return registry
