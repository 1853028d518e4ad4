"""Where every pass starts (docs/operation.md, Reconcile): one work queue of policy names, one
processor (`process`), and what feeds the queue.

- The policy watch (kopf's event handler, `policy_watched`): a policy this replica has not seen, a
  new generation, a policy being deleted, a policy gone.
- A managed object that changed or vanished (`child_changed`): drift.
- The guidance check (`watch_guidance`), one task for every policy: what a pass of a policy reads
  besides its objects (node facts, the audits, the measurement) changed since its last pass.
- Leadership (`leadership_changed`): a replica that becomes the leader passes every policy.
- The queue itself: a pass that succeeded comes back for the resync after RESYNC_INTERVAL_S; one
  that failed after the delay `retry.retry_delay_s` gives, the same whatever queued it.

A policy's item runs for the strongest reason asked (`plan.PASS_TRIGGERS`), never two at once.
Nothing else runs `reconcile.run_pass` (tests/unit/test_layers.py holds it).
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace

from ..core.labels import MANAGED_BY, MANAGED_BY_LABEL, POLICY_LABEL
from . import gather, metrics, retry
from .api_errors import TransientApiError
from .compare import differences, is_ours
from .kinds import ObjKey
from .plan import APPLY, DELETED, DRIFT, GUIDANCE, LEADER, RESYNC, RETRY, Ownership, stronger_trigger
from .reconcile import has_old_bookkeeping, release_old_finalizer, run_pass
from .retry import EXPECTED_FAILURES, retry_delay_s
from .state import OperatorState, PolicyRecord
from .workqueue import WorkQueue

log = logging.getLogger("kata_sizing.worker")

# A resync re-reads every managed object (from the watch-fed cache) and writes nothing when
# all is in sync; it catches what a watch may have missed. Seconds.
RESYNC_INTERVAL_S = float(os.environ.get("KATA_SIZING_RESYNC_SECONDS", "300"))
# The guidance check looks at every policy this often, so a storm of pod events turns into at
# most one pass per policy per interval, and none for a policy whose inputs did not change. Seconds.
GUIDANCE_INTERVAL_S = float(os.environ.get("KATA_SIZING_GUIDANCE_SECONDS", "10"))
# How long a pass waits for the RuntimeClass, ConfigMap and admission caches' first list. Seconds.
CHILDREN_SYNC_TIMEOUT_S = gather.INFORMER_SYNC_TIMEOUT_S
# Passes of different policies run concurrently (one policy's never do).
QUEUE_WORKERS = 4
# The policy watch's name in logs and in kata_sizing_task_failures_total.
POLICY_WATCH = "policy-watch"


def new_queue(state: OperatorState) -> WorkQueue[str, str]:
    return WorkQueue(
        lambda name, trigger: process(state, name, trigger), retry_delay=retry_delay_s, retry_reason=RETRY,
        merge=stronger_trigger, expected=EXPECTED_FAILURES, workers=QUEUE_WORKERS, name="passes",
        gate=state.leader.wait_leading if state.leader is not None else None)


async def process(state: OperatorState, name: str, trigger: str) -> None:
    """The queue's item for policy `name`: forget a deleted policy, take an older operator's
    finalizer off, or run a pass; then the resync comes back after RESYNC_INTERVAL_S. Failures
    propagate to the queue, which retries after `retry.retry_delay_s`."""
    record = state.records.get(name)
    if record is None:
        return
    if record.body is not None:
        try:
            async with asyncio.timeout(CHILDREN_SYNC_TIMEOUT_S):
                await state.children.wait_synced()
        except TimeoutError:
            raise TransientApiError(None, "the RuntimeClass, ConfigMap and admission caches have not synced yet") from None
    if record.body is None:  # deleted, perhaps while the caches synced (every policy goes with its CRD)
        state.forget_policy(name)
        metrics.forget_policy(name)
        log.info("policy %s deleted; the garbage collector removes what the operator made for it", name)
        return
    if has_old_bookkeeping(record.body):
        await release_old_finalizer(state, record)
    if record.body is None or (record.body.get("metadata") or {}).get("deletionTimestamp"):
        log.debug("policy %s is being deleted; no pass", name)
        return
    await run_pass(state, name, trigger)
    if state.work is not None:
        state.work.add_after(name, RESYNC_INTERVAL_S, RESYNC)


# --- what feeds the queue -----------------------------------------------------------------------


def policy_watched(state: OperatorState, event_type: str | None, body: dict, failures: int = 0) -> None:
    """A watch event of a policy, which a raise must not lose: `policy_seen`, and when it raises,
    the raise is said (`retry.task_failed`) and the policy's newest event is taken again after
    `retry.backoff_s` (an event of it taken meanwhile makes that moot)."""
    name = (body.get("metadata") or {}).get("name")
    state.unseen.pop(name, None)
    try:
        policy_seen(state, event_type, body)
    except Exception:  # noqa: BLE001 - said and counted; taken again
        delay_s = retry.backoff_s(failures)
        retry.task_failed(POLICY_WATCH, delay_s)
        state.unseen[name] = (event_type, body)
        asyncio.get_running_loop().call_later(delay_s, _watched_again, state, name, failures + 1)


def _watched_again(state: OperatorState, name: str | None, failures: int) -> None:
    event = state.unseen.pop(name, None)
    if event is not None:
        policy_watched(state, *event, failures=failures)


def policy_seen(state: OperatorState, event_type: str | None, body: dict) -> None:
    """A watch event of a policy (`event_type` None: kopf's first listing). Only what can change
    what a pass does queues one: a policy seen first, a generation its status has not observed
    (a new policy, a spec change), a deletion starting or done. Status and metadata changes (the
    echo of the operator's own status write among them) only refresh the record."""
    meta = body.get("metadata") or {}
    name = meta.get("name")
    if not name:
        return
    record = state.records.get(name)
    if event_type == "DELETED":
        if record is not None:
            record.body = None
            state.enqueue(name, DELETED)
        return
    before = record.body if record is not None else None
    if record is None or before is None or (before.get("metadata") or {}).get("uid") != meta.get("uid"):
        # First seen, or a new policy of a name whose last one was deleted: nothing of it is known.
        before = None
        record = state.records[name] = PolicyRecord(name, body)
    else:
        record.body = body
    observed = ((body.get("status") or {}).get("observedGeneration"))
    if before is None:
        trigger = APPLY if meta.get("generation") != observed else RESYNC
    elif (before.get("metadata") or {}).get("generation") != meta.get("generation"):
        trigger = APPLY
    elif meta.get("deletionTimestamp") and not (before.get("metadata") or {}).get("deletionTimestamp"):
        trigger = DELETED
    else:
        return
    log.debug("policy %s queued (%s)", name, trigger)
    state.enqueue(name, trigger)


def child_changed(state: OperatorState, key: ObjKey, before: dict | None, after: dict | None) -> None:
    """A managed object changed or vanished (or somebody else's with one of our names): its
    policy's pass decides what to do, as every pass does. Not for an object that is now as the
    policy wants it when its last pass had nothing to say about it (the echo of a write)."""
    desired = state.desired.for_child(key, after or before)
    if desired is None:
        # No pass of this replica has said what it wants yet: a follower, or one just made the
        # leader whose first pass read the caches before this change came. An object labelled
        # as one of the known policies' goes to that policy's pass (held until this replica
        # leads), which decides; dropping it would leave a hand edit in place until the resync.
        owner = labelled_policy(after or before)
        if owner is not None and owner in state.records:
            state.enqueue(owner, DRIFT)
        return
    record = state.records.get(desired.policy_name)
    if after is not None and key not in (record.attention if record is not None else ()):
        found = desired.lookup(key)
        if found is not None and is_ours(after, desired.policy_name, desired.policy_uid) and not differences(
                found[0], after, found[1] is Ownership.GUARDED):
            return
    state.enqueue(desired.policy_name, DRIFT)


def labelled_policy(obj: dict | None) -> str | None:
    """The policy an object's labels say made it (with the operator's managed-by label), or None."""
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
        return None
    name = labels.get(POLICY_LABEL)
    return name if isinstance(name, str) else None


async def leadership_changed(state: OperatorState, leading: bool) -> None:
    if leading:
        # Status, events and the policy gauges are this replica's to say now, at once, not at the
        # next resync: every policy the watch holds is passed.
        for name in list(state.records):
            state.enqueue(name, LEADER)
        return
    # Not the leader: it exports no policy gauges (the alerts sum them over replicas) and
    # forgets what it said, which the leader says from now on.
    metrics.forget_all_policies()
    state.forget_leadership()


async def watch_guidance(state: OperatorState) -> None:
    """Every GUIDANCE_INTERVAL_S, queue a pass of each policy whose inputs changed (`guidance_due`)."""
    while True:
        await asyncio.sleep(GUIDANCE_INTERVAL_S)
        if state.leader is not None:
            await state.leader.wait_leading()
        due = [name for name, record in list(state.records.items()) if await guidance_due(state, record)]
        if due:
            log.debug("guidance check: %d of %d policies queued", len(due), len(state.records))
        for name in due:
            state.enqueue(name, GUIDANCE)


async def guidance_due(state: OperatorState, record: PolicyRecord) -> bool:
    """Whether a pass of the policy would read something its last pass did not: the node facts,
    the audit of unmanaged RuntimeClasses, its pod audit, or a measurement the status does not
    say yet. Cheap when nothing moved (the caches' versions); otherwise the facts and audits are
    computed once per change for every policy, and a change that leaves them as they were (a pod
    of some other policy, another policy's RuntimeClass) queues nothing."""
    last, body = record.inputs, record.body
    if last is None or body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return False  # not passed yet (its first pass is queued), or going
    versions, measured = gather.versions(state), gather.measured(state, record.name)
    if last.versions == versions and last.measured == measured:
        return False
    if not (last.measured == measured or _measurement_as_written(state, record)):
        return True
    if last.versions == versions:
        # Only the measurement moved (once per interval for every policy), to what the status says.
        record.inputs = replace(last, measured=measured)
        return False
    now = await gather.pass_inputs(state, body)
    if (now.facts, now.unmanaged, now.pod_findings) == (last.facts, last.unmanaged, last.pod_findings):
        record.inputs = now  # nothing a pass reads changed: the next check compares with this
        return False
    return True


def _measurement_as_written(state: OperatorState, record: PolicyRecord) -> bool:
    """The measurement's version moved (it does once per interval, measured or not), but the
    status it gives is the one this replica last wrote: a pass would write nothing. Without this,
    every policy ran a whole pass once per interval: 200 policies' passes in a burst after a
    cold start, with nothing to write (docs/performance.md)."""
    if state.measurement is None:
        return True
    if record.status is None:
        return False
    return state.measurement.report(record.name, record.status.measurement) == record.status.measurement
