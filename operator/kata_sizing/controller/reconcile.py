"""A pass, in three stages: gather what is known, plan (pure), execute; then the status written
once (only when it changed), the events posted and the drift counters updated, all from the
one conclusion of the plan. `worker.process` is the one caller: every pass is an item of the
work queue, whatever asked for it (docs/operation.md, Reconcile).

No kopf here: a pass reads the policy's record and the operator's caches, and posts its events
through the operator's own emitter (`state.events`).
"""

from __future__ import annotations

import logging

from ..core.labels import OLD_ANNOTATIONS, OLD_FINALIZER
from ..core.statusmodel import KataSizingPolicyStatus
from . import metrics
from .api_errors import Conflict, Invalid, NotFound
from .execute import DONE, execute
from .gather import gather, policy_sizing
from .kinds import describe, policy_key
from .measurement import measured_policy
from .plan import APPLY, plan_pass, policy_ref
from .retry import CONFLICT_ATTEMPTS, RetryLater
from .state import OperatorState, PolicyRecord
from .status import Conclusion, conclude, read_status, status_changed, status_fields, status_patch

log = logging.getLogger("kata_sizing.reconcile")



async def run_pass(state: OperatorState, name: str, trigger: str) -> Conclusion:
    """One pass of policy `name` (a PASS_TRIGGERS reason), reading everything it needs itself:
    the policy's record and the operator's caches. API errors propagate after the pass is
    concluded (the queue retries); RetryLater when only a back-off can help."""
    record = state.records[name]
    body = record.body
    assert body is not None
    if record.status is None:
        record.status = read_status(body)
    if record.generation != record.status.observed_generation:
        trigger = APPLY  # the status has not said this generation yet, whatever else queued the pass
    with metrics.reconcile_pass(name, trigger) as current:
        conclusion = await _pass(state, record, trigger, current)
        current.done(conclusion)
    return conclusion


async def _pass(state: OperatorState, record: PolicyRecord, trigger: str, current: metrics.Pass) -> Conclusion:
    name, body = record.name, record.body
    assert body is not None
    sizing = policy_sizing(state, body)
    if sizing is not None and state.measurement is not None:
        # What to measure follows the policy's last valid generation (an invalid one goes on
        # measuring what its last valid one asked for).
        state.measurement.configure(measured_policy(sizing, policy_ref(body)), name)
    gathered = await gather(state, record, trigger)
    plan = plan_pass(gathered)
    if plan.intent.desired is not None:
        state.desired.put(plan.intent.desired)  # before writing, so our own writes never look like drift
    owner = (name, (body.get("metadata") or {}).get("uid"))
    outcome = await execute(state.api, plan.writes, owner, state.children, current.writes)
    conclusion = conclude(gathered, plan, outcome)
    record.attention = frozenset(action.key for action in plan.actions
                                 if not action.writes or outcome.results.get(action.key) is None
                                 or outcome.results[action.key].status != DONE)
    record.reported, record.announced = conclusion.reported, dict(conclusion.announced)
    ref = plan.intent.desired.ref if plan.intent.desired is not None else policy_ref(body)
    for type_, reason, message in conclusion.events:
        state.events(ref, type_, reason, message)
    for kind, corrected in conclusion.drift_seen:
        metrics.drift(kind, corrected)
    for field_name, increment in conclusion.counts.items():
        record.pending_counts[field_name] = record.pending_counts.get(field_name, 0) + increment
    if outcome.error is not None:
        await write_status(state, record, None)  # the drift counts of what did land
        raise outcome.error
    metrics.policy_status(name, conclusion.status)
    assert gathered.status is not None
    current.status_written = await write_status(
        state, record, conclusion.status if status_changed(gathered.status, conclusion.status) else None)
    record.inputs = gathered.inputs  # only now: a failed pass is retried, not taken as done
    if conclusion.retry_reason:
        raise RetryLater(conclusion.retry_reason)
    return conclusion


async def write_status(state: OperatorState, record: PolicyRecord, status: KataSizingPolicyStatus | None) -> bool:
    """Write a pass's status (None: unchanged) and its pending drift counts in one request: a
    merge patch when there is nothing to count, else status.status_patch's JSON patch, which
    tests the counters it read and is re-read and rebuilt on a lost race. The counts stay
    pending (and the caller's pass is retried) rather than lost. Whether it wrote."""
    pending = {k: v for k, v in record.pending_counts.items() if v}
    if not pending and status is None:
        return False
    key = policy_key(record.name)
    fields = status_fields(status) if status is not None else None
    body = record.body
    for _ in range(CONFLICT_ATTEMPTS):
        if pending and body is None:
            body = await state.api.read(key)
            if body is None:
                record.pending_counts.clear()  # the policy is gone
                return False
        patch = status_patch(body, fields, pending) if pending and body is not None else {"status": fields}
        try:
            written = await state.api.patch_status(key, patch)
        except (Conflict, Invalid):
            if not pending:
                raise
            body = None  # somebody else wrote the status since it was read
            continue
        except NotFound:
            record.pending_counts.clear()
            return False  # the policy is gone; nothing to report on
        record.pending_counts.clear()
        record.body = written
        if status is not None:
            record.status = status
        return True
    raise Conflict(409, f"{describe(key)}: the drift counters kept changing; {pending} kept for the next try")


async def release_old_finalizer(state: OperatorState, record: PolicyRecord) -> None:
    """Take the finalizer and kopf's annotations of an operator before this one off the policy
    (the garbage collector removes what the operator made, through the objects' ownerReferences):
    a policy deleted while no operator runs is then never stuck. A JSON patch that tests the
    finalizers as read; a lost race reads the policy again."""
    key = policy_key(record.name)
    body = record.body
    for _ in range(CONFLICT_ATTEMPTS):
        if body is None:
            return  # gone
        meta = body.get("metadata") or {}
        finalizers = list(meta.get("finalizers") or [])
        annotations = meta.get("annotations") or {}
        ops: list[dict] = []
        if OLD_FINALIZER in finalizers:
            ops += [{"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                    {"op": "replace", "path": "/metadata/finalizers",
                     "value": [f for f in finalizers if f != OLD_FINALIZER]}]
        ops += [{"op": "remove", "path": "/metadata/annotations/" + name.replace("~", "~0").replace("/", "~1")}
                for name in OLD_ANNOTATIONS if name in annotations]
        if not ops:
            return
        try:
            record.body = await state.api.patch(key, ops)
        except (Conflict, Invalid):
            body = record.body = await state.api.read(key)
            continue
        except NotFound:
            return
        if OLD_FINALIZER in finalizers:
            log.info("policy %s: removed the finalizer %s an older kata-sizing set (the garbage collector "
                     "removes what the operator made)", record.name, OLD_FINALIZER)
        return
    raise Conflict(409, f"{describe(key)}: its finalizers kept changing")


def has_old_bookkeeping(body: dict) -> bool:
    meta = body.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return OLD_FINALIZER in (meta.get("finalizers") or []) or any(name in annotations for name in OLD_ANNOTATIONS)
