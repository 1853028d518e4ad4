"""A pass, in three stages: gather what is known, plan (pure), execute; then the status written
once (only when it changed), the events posted and the drift counters updated, all from the
one conclusion of the plan. Every path runs this: kopf's create/update/resume handlers, the
resync and guidance timers, a drift event on a managed object, a replica that became leader.

No kopf here: the handlers module calls these with the operator's state and an event sink.
"""

from __future__ import annotations

import logging
from typing import Protocol

from . import metrics
from .api_errors import Conflict, Invalid, NotFound
from .execute import DONE, execute
from .gather import gather, policy_sizing
from .measurement import measured_policy
from .kinds import describe, policy_key
from .plan import plan_deletion, plan_pass, policy_ref
from .retry import CONFLICT_ATTEMPTS
from .state import OperatorState
from .status import Conclusion, conclude, status_changed, status_patch

log = logging.getLogger("kata_sizing.reconcile")


class EventSink(Protocol):
    def __call__(self, policy_ref: dict, type_: str, reason: str, message: str) -> None: ...


class RetryLater(Exception):
    """The pass did what it could and said so in status; it must run again after a back-off
    (a ConfigMap's namespace does not exist yet)."""


async def run_pass(
    state: OperatorState, body: dict, trigger: str, sink: EventSink, *, facts: tuple | None = None,
    findings: list | None = None, pods: list[dict] | None = None, landed: list[str] | None = None,
    reread_survey: bool = True,
) -> Conclusion:
    """One pass of one policy. `landed` collects the writes as they land (the metrics' record of
    the pass, complete even when the pass fails). API errors propagate after the pass is
    concluded (the callers retry); RetryLater when only a back-off can help."""
    name = body["metadata"]["name"]
    remember_body(state, body)
    if name in state.written_status:
        # What this replica last wrote is the status (nobody else writes these fields), even
        # when the body kopf hands a timer is older than that write.
        body = {**body, "status": state.written_status[name]}
    sizing = policy_sizing(state, body)
    if sizing is not None and state.measurement is not None:
        # What to measure follows the policy's last valid generation (an invalid one goes on
        # measuring what its last valid one asked for).
        state.measurement.configure(measured_policy(sizing, policy_ref(body)), name)
    gathered = await gather(state, body, trigger, facts, findings, pods, reread_survey=reread_survey)
    plan = plan_pass(gathered)
    if plan.intent.desired is not None:
        state.desired.put(plan.intent.desired)  # before writing, so our own writes never look like drift
    owner = (name, (body.get("metadata") or {}).get("uid"))
    outcome = await execute(state.api, plan.writes, owner, state.children, landed)
    conclusion = conclude(gathered, plan, outcome)
    state.attention[name] = {action.key for action in plan.actions
                             if not action.writes or outcome.results.get(action.key) is None
                             or outcome.results[action.key].status != DONE}
    ref = plan.intent.desired.ref if plan.intent.desired is not None else policy_ref(body)
    state.reported[name] = set(conclusion.reported)
    state.announced[name] = dict(conclusion.announced)
    for type_, reason, message in conclusion.events:
        sink(ref, type_, reason, message)
    for kind, corrected in conclusion.drift_seen:
        metrics.drift(kind, corrected)
    counts = state.pending_counts.setdefault(name, {})
    for field_name, increment in conclusion.counts.items():
        counts[field_name] = counts.get(field_name, 0) + increment
    if outcome.error is not None:
        await write_status(state, name, None)  # the drift counts of what did land
        raise outcome.error
    metrics.policy_status(name, conclusion.status)
    await write_status(state, name, conclusion.status if status_changed(body, conclusion.status) else None)
    if conclusion.retry_reason:
        raise RetryLater(conclusion.retry_reason)
    return conclusion


def remember_body(state: OperatorState, body: dict) -> None:
    name = (body.get("metadata") or {}).get("name")
    if name:
        state.policies[name] = body


async def write_status(state: OperatorState, name: str, status: dict | None) -> None:
    """Write a pass's status (None: unchanged) and its pending drift counts in one request: a
    merge patch when there is nothing to count, else status.status_patch's JSON patch, which
    tests the counters it read and is re-read and rebuilt on a lost race. The counts stay
    pending (and the caller's pass is retried) rather than lost."""
    pending = {k: v for k, v in (state.pending_counts.get(name) or {}).items() if v}
    if not pending and status is None:
        return
    body = state.policies.get(name)
    for _ in range(CONFLICT_ATTEMPTS):
        if pending and body is None:
            body = await state.api.read(policy_key(name))
            if body is None:
                state.pending_counts.pop(name, None)  # the policy is gone
                return
        patch = status_patch(body, status, pending) if pending else {"status": status}
        try:
            written = await state.api.patch_status(policy_key(name), patch)
        except (Conflict, Invalid):
            if not pending:
                raise
            body = None  # somebody else wrote the status since it was read
            continue
        except NotFound:
            state.pending_counts.pop(name, None)
            return  # the policy is gone; nothing to report on
        state.pending_counts.pop(name, None)
        remember_body(state, written)
        if status is not None:
            state.written_status[name] = written.get("status") or status
        return
    raise Conflict(409, f"{describe(policy_key(name))}: the drift counters kept changing; "
                        f"{pending} kept for the next try")


async def delete_children(state: OperatorState, body: dict, sink: EventSink | None = None) -> list[str]:
    """On policy deletion: remove what the operator created, nothing else."""
    meta = body.get("metadata") or {}
    name = meta.get("name")
    desired = state.desired.by_policy.get(name)
    # Forgotten first: a drift event of the deletions below must find no policy to pass for.
    state.forget_policy(name)
    chart_owned = bool(desired and desired.guarded) or (
        ((body.get("spec") or {}).get("runtimeClass") or {}).get("managedBy") == "KataDeploy")
    plan = plan_deletion(body, state.children.of_policy(name), chart_owned)
    outcome = await execute(state.api, plan.writes, (name, meta.get("uid")), state.children)
    if outcome.error is not None:
        raise outcome.error
    return [describe(a.key) for a in plan.writes if outcome.results.get(a.key, None) and
            outcome.results[a.key].status == DONE]
