"""The operator's Prometheus metrics, its readiness endpoint and its one log line per reconcile.

Everything observable lives here; the handlers, reconcile and kube modules call one small
hook each (`reconcile_pass`, `drift`, `api_error`, `policy_status`, `admission`), so their
logic stays free of instrumentation. The metrics are kept in a registry of their own
(`REGISTRY`, with the process collector), served by `serve()` next to `/readyz`:

    kata_sizing_reconciles_total{trigger, result}       ok | invalid | conflict | error
    kata_sizing_reconcile_duration_seconds{trigger}     histogram
    kata_sizing_reconcile_writes_total{trigger}         objects created, replaced or deleted
    kata_sizing_drift_detected_total{kind}              hand edits found by the drift watch
    kata_sizing_drift_corrected_total{kind}             ... of them put back (driftPolicy Correct)
    kata_sizing_api_errors_total{status}                404, 409, 422, 500..., "none" (no answer)
    kata_sizing_policies{condition, status}             policies per condition type and status (the
                                                        leader's only: a replica that does not lead has none)
    kata_sizing_webhook_admissions_total{result}        allowed | warned | denied
    kata_sizing_informer_objects{collection}            objects held by the list+watch caches
    kata_sizing_summary_reads_total{result}             kubelet Summaries read (ok) or not (error)
    kata_sizing_task_failures_total{task}               raises in background tasks (said at ERROR; the task goes on)
    kata_sizing_pods_headroom_low{policy, class}        pods whose headroom is under the threshold
    kata_sizing_pod_headroom_min_bytes{policy, class}   the least headroom over the window
    kata_sizing_pod_overhead_bytes{policy, class, quantile}   overhead used: 0.5, 0.99, 1 (the max)

The counters are process-wide, as Prometheus clients keep them; tests read deltas.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("kata_sizing.reconcile")

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)

RECONCILES = Counter(
    "kata_sizing_reconciles", "Reconcile passes by trigger and result.",
    ["trigger", "result"], registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "kata_sizing_reconcile_duration_seconds", "Wall time of one reconcile pass.",
    ["trigger"], registry=REGISTRY,
    # A pass that writes nothing takes a few ms against a local API server; one that
    # rewrites every object of a large policy, or waits out a slow server, takes seconds.
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
RECONCILE_WRITES = Counter(
    "kata_sizing_reconcile_writes", "Objects created, replaced or deleted by reconcile passes.",
    ["trigger"], registry=REGISTRY,
)
DRIFT_DETECTED = Counter(
    "kata_sizing_drift_detected", "Hand edits of managed objects seen by the drift watch, per kind.",
    ["kind"], registry=REGISTRY,
)
DRIFT_CORRECTED = Counter(
    "kata_sizing_drift_corrected", "Hand edits of managed objects put back (driftPolicy Correct), per kind.",
    ["kind"], registry=REGISTRY,
)
API_ERRORS = Counter(
    "kata_sizing_api_errors", "Kubernetes API calls that failed, by HTTP status ('none': no answer).",
    ["status"], registry=REGISTRY,
)
ADMISSIONS = Counter(
    "kata_sizing_webhook_admissions",
    "Admission reviews answered by the webhook: policies allowed, warned or denied; pods routed.",
    ["result"], registry=REGISTRY,
)

SUMMARY_READS = Counter(
    "kata_sizing_summary_reads", "kubelet Summaries read by the measurement: ok, or error (the node skipped).",
    ["result"], registry=REGISTRY,
)

TASK_FAILURES = Counter(
    "kata_sizing_task_failures",
    "Unexpected raises in the operator's background tasks (the guidance check, the measurement, the watches...), "
    "each logged at ERROR with its traceback; the task goes on after a back-off.",
    ["task"], registry=REGISTRY,
)

RESULT_OK, RESULT_INVALID, RESULT_CONFLICT, RESULT_ERROR = "ok", "invalid", "conflict", "error"


class _ClusterState(Collector):
    """Gauges read at scrape time: the policies' conditions and the informers' sizes."""

    def __init__(self) -> None:
        self.conditions: dict[str, dict[str, str]] = {}  # policy -> {type: status}
        self.informers: list[Any] = []  # objects with .collection and .items
        self.measurement: Any = None  # the measurement loop (controller/measurement.py), only on the leader

    def collect(self) -> Iterator[GaugeMetricFamily]:
        policies = GaugeMetricFamily(
            "kata_sizing_policies", "Policies by condition type and status.",
            labels=["condition", "status"],
        )
        counts: dict[tuple[str, str], int] = {}
        for by_type in self.conditions.values():
            for type_, status in by_type.items():
                counts[type_, status] = counts.get((type_, status), 0) + 1
        for (type_, status), count in sorted(counts.items()):
            policies.add_metric([type_, status], count)
        yield policies
        cached = GaugeMetricFamily(
            "kata_sizing_informer_objects", "Objects held by the operator's list+watch caches.",
            labels=["collection"],
        )
        for informer in self.informers:
            cached.add_metric([informer.collection], len(informer.items))
        yield cached
        yield from self._measurement()

    def _measurement(self) -> Iterator[GaugeMetricFamily]:
        low = GaugeMetricFamily(
            "kata_sizing_pods_headroom_low",
            "Pods whose headroom (cgroup limit - working set) is under the policy's headroomWarning: "
            "their VMM is close to an OOM kill.", labels=["policy", "class"])
        headroom = GaugeMetricFamily(
            "kata_sizing_pod_headroom_min_bytes", "The least headroom of a pod of the class over the window.",
            labels=["policy", "class"])
        overhead = GaugeMetricFamily(
            "kata_sizing_pod_overhead_bytes",
            "Overhead used (pod working set - containers' working sets) over the window; quantile 1 is the max.",
            labels=["policy", "class", "quantile"])
        for policy, class_name, figures in (self.measurement.gauges() if self.measurement is not None else []):
            low.add_metric([policy, class_name], figures["under_threshold"])
            if figures["min_headroom"] is not None:
                headroom.add_metric([policy, class_name], figures["min_headroom"])
            for quantile, key in (("0.5", "p50"), ("0.99", "p99"), ("1", "max")):
                if figures[key] is not None:
                    overhead.add_metric([policy, class_name, quantile], figures[key])
        yield low
        yield headroom
        yield overhead


STATE = _ClusterState()
REGISTRY.register(STATE)


# --- hooks ------------------------------------------------------------------------------


@dataclass
class Pass:
    """What one reconcile pass did; `reconcile_pass` fills in the rest. The executor appends to
    `writes` as each write lands, so a pass that fails still counts the writes it made."""

    policy: str
    trigger: str
    result: str = RESULT_ERROR
    writes: list[str] = field(default_factory=list)
    status_written: bool = False

    def done(self, outcome: Any) -> None:
        """Record a finished pass from its conclusion (reconcile.run_pass)."""
        self.result = {"invalid": RESULT_INVALID, "conflict": RESULT_CONFLICT}.get(outcome.result, RESULT_OK)


# The reconcile line names at most this many writes (the JSON log's `written` has them all).
NAMED_WRITES = 4


@contextlib.contextmanager
def reconcile_pass(policy: str, trigger: str) -> Iterator[Pass]:
    """Time one pass, count it by result, and log one line (one JSON object with --log-format json):
    at INFO when the pass changed something or failed, at DEBUG when it found everything as it
    should be (a resync, a guidance check of a policy in sync)."""
    current = Pass(policy, trigger)
    start = time.perf_counter()
    try:
        yield current
    finally:
        seconds = time.perf_counter() - start
        RECONCILES.labels(trigger, current.result).inc()
        RECONCILE_SECONDS.labels(trigger).observe(seconds)
        RECONCILE_WRITES.labels(trigger).inc(len(current.writes))
        changed = [*current.writes[:NAMED_WRITES]]
        if len(current.writes) > NAMED_WRITES:
            changed.append(f"{len(current.writes) - NAMED_WRITES} more")
        if current.status_written:
            changed.append("status written")
        log.log(
            logging.INFO if changed or current.result == RESULT_ERROR else logging.DEBUG,
            "reconciled %s: trigger=%s result=%s writes=%d duration=%.3fs%s",
            policy, trigger, current.result, len(current.writes), seconds,
            f" ({'; '.join(changed)})" if changed else "",
            extra={
                "policy": policy, "trigger": trigger, "result": current.result,
                "writes": len(current.writes), "written": current.writes,
                "status_written": current.status_written, "duration_s": round(seconds, 6),
            },
        )


def drift(kind: str, corrected: bool) -> None:
    DRIFT_DETECTED.labels(kind).inc()
    if corrected:
        DRIFT_CORRECTED.labels(kind).inc()


def api_error(status: int | None) -> None:
    API_ERRORS.labels(str(status) if status else "none").inc()


def admission(errors: list[str], warnings: list[str], routed: bool = False) -> None:
    ADMISSIONS.labels("denied" if errors else "warned" if warnings else "routed" if routed else "allowed").inc()


def policy_status(policy: str, status: Any) -> None:
    """The conditions a pass computed for a policy (a KataSizingPolicyStatus, written or already in place)."""
    STATE.conditions[policy] = {c.type: c.status for c in status.conditions}


def forget_policy(policy: str) -> None:
    STATE.conditions.pop(policy, None)


def forget_all_policies() -> None:
    """This replica stopped leading: the leader exports the policy gauges now."""
    STATE.conditions.clear()


def track_informers(informers: list[Any]) -> None:
    STATE.informers = list(informers)


def track_measurement(loop: Any) -> None:
    STATE.measurement = loop


def summary_read(ok: bool) -> None:
    SUMMARY_READS.labels("ok" if ok else "error").inc()


def track_task(task: str) -> None:
    """The task's failure count exists from its start, at 0: an alert sees its first increase."""
    TASK_FAILURES.labels(task)


def task_failed(task: str) -> None:
    TASK_FAILURES.labels(task).inc()


# --- the HTTP endpoint ------------------------------------------------------------------


async def serve(
    host: str, port: int, ready: Any = lambda: True,
) -> tuple[Any, int]:
    """Serve /metrics and /readyz (200 once `ready()` is true, else 503) on the running loop.

    Returns the aiohttp runner (to `await runner.cleanup()`) and the bound port (useful
    with port 0). aiohttp comes with kopf, so this adds no dependency and no thread.
    """
    from aiohttp import web

    async def metrics(_: web.Request) -> web.Response:
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok\n")
        return web.Response(status=503,
                            text="not ready: the caches have not synced or the webhook does not listen yet\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = next((address[1] for address in runner.addresses if isinstance(address, tuple)), port)
    return runner, bound
