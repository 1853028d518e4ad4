"""Gathering: everything a pass knows before it decides, read from the operator's caches (and,
for a wanted name the caches cannot vouch for, from the API), into one frozen `plan.Gathered`.

Node facts and the audit of unmanaged RuntimeClasses are computed once per change of what they
read and shared by every pass (`memoized`: one slot each, replaced when what it read moved); a
policy's sizing once per generation and its intent (parse, size, render) once per generation and
node facts, both in its record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Mapping

from ..core import defaults
from ..core.audit import audit_runtime_classes
from ..core.model import PolicyError, parse_policy
from ..core.podfit import check_limits
from ..core.proposal import proposal_status
from ..core.sizing import PolicySizing, size_policy
from ..core.statusmodel import KataSizingPolicyStatus, ProposalStatus
from . import cluster
from .compare import is_ours
from .kinds import ObjKey
from .plan import GUIDANCE, Gathered, Intent, PassInputs, intent_of
from .state import OperatorState, PolicyRecord

# How long a pass waits for the node and pod caches' first list before it goes on without
# node facts (the guidance ConfigMap is then left as it was). Seconds.
INFORMER_SYNC_TIMEOUT_S = 20
# More slots than this (node facts are one slot per node selector): all are dropped and computed
# again on demand. Per-policy values live in the policy's record, so this bounds selectors only.
DERIVED_SLOTS = 256


def versions(state: OperatorState) -> tuple[int, int, int, int]:
    """Versions of everything a pass reads besides the policy: nodes, pods, every RuntimeClass
    (for the audit) and the set of policies (which classes are Kata ones)."""
    return state.nodes.version, state.pods.version, state.children.runtime_classes.version, state.desired.version


def measured(state: OperatorState, name: str) -> int | None:
    """The measurement's version of a policy: it moves about once per interval, and at once when
    the pods under the headroom threshold change."""
    return state.measurement.version(name) if state.measurement is not None else None


async def pass_inputs(state: OperatorState, body: Mapping) -> PassInputs:
    """Everything a pass of `body` reads from the caches besides its objects, now."""
    name = body["metadata"]["name"]
    now = versions(state)
    facts, unmanaged, pods = await node_facts(state, body), unmanaged_audit(state), pod_findings(state, body)
    return PassInputs(versions=now, measured=measured(state, name), facts=facts,
                      unmanaged=tuple(unmanaged) if unmanaged is not None else None,
                      pod_findings=tuple(pods) if pods is not None else None)


def memoized(state: OperatorState, slot: Hashable, version: Hashable, compute: Callable[[], object]):
    """The value in `slot` computed from `version` of what it reads; computed again (and the
    slot's old value dropped) when the version moved. One slot per kind of value, not one entry
    per version: a bounded cache of (kind, version) entries with a policy's intent among them was
    cleared every 64 passes at 200 policies, and every shared value computed again after it."""
    found = state.derived.get(slot)
    if found is None or found[0] != version:
        if found is None and len(state.derived) >= DERIVED_SLOTS:
            state.derived.clear()
        found = state.derived[slot] = (version, compute())
    return found[1]


def _facts_key(state: OperatorState, body: Mapping) -> tuple:
    """(the facts' slot: their node selector, the versions they read)."""
    selector = ((body.get("spec") or {}).get("nodes") or {}).get("selector")
    if selector is None:
        selector = dict(defaults.KATA_NODE_LABEL)
    return ("facts", tuple(sorted(selector.items()))), (state.nodes.version, state.pods.version, state.desired.version)


async def node_facts(state: OperatorState, body: Mapping) -> tuple | None:
    """Facts of the policy's nodes from the informers; None until they have synced once."""
    if not (state.nodes.synced.is_set() and state.pods.synced.is_set()):
        try:
            async with asyncio.timeout(INFORMER_SYNC_TIMEOUT_S):
                await asyncio.gather(state.nodes.synced.wait(), state.pods.synced.wait())
        except TimeoutError:
            return None
    slot, version = _facts_key(state, body)
    selector = dict(slot[-1])
    pods_by_node = memoized(state, "pods-by-node", state.pods.version, lambda: _pods_by_node(state))
    kata_classes = state.desired.runtime_class_names()
    return memoized(state, slot, version, lambda: tuple(
        cluster.facts_for_nodes(state.nodes.items.values(), pods_by_node, selector, kata_classes)))


def _pods_by_node(state: OperatorState) -> dict[str, list]:
    pods_by_node: dict[str, list] = {}
    for request in state.pods.items.values():
        if request.node is not None:
            pods_by_node.setdefault(request.node, []).append(request)
    return pods_by_node


def _pods_by_class(state: OperatorState) -> dict[str, list]:
    """The pods the audit looks at, by runtimeClassName (a routed-by label: by that policy)."""
    by_class: dict[str, list] = {}
    for request in state.pods.items.values():
        if request.limits is None:
            continue
        key = request.runtime_class or f"routed-by:{request.routed_by}"
        by_class.setdefault(key, []).append(request)
    return by_class


def policy_sizing(state: OperatorState, body: Mapping) -> PolicySizing | None:
    """The policy's sizing, memoized per generation in its record; None when the policy is invalid."""
    meta = body.get("metadata") or {}
    record = state.records.get(meta.get("name") or "")
    key = (meta.get("uid"), meta.get("generation"))
    if record is not None and record.sizing is not None and record.sizing[0] == key:
        return record.sizing[1]
    try:
        sizing = size_policy(parse_policy(dict(body)))
        found = None if sizing.errors else sizing
    except PolicyError:
        found = None
    if record is not None:
        record.sizing = (key, found)
    return found


def pod_findings(state: OperatorState, body: Mapping) -> list[dict] | None:
    """The pod audit of one policy (docs/admission.md): pods on its classes outside their class's
    envelope or without a memory limit, and pods it was asked to route that have no class, by
    the rule of the admission policies (podfit.check_limits). None until the pod cache synced,
    or for an invalid policy (status keeps the last audit)."""
    if not state.pods.synced.is_set():
        return None
    sizing = policy_sizing(state, body)
    if sizing is None:
        return None
    by_class = memoized(state, "pods-by-class", state.pods.version, lambda: _pods_by_class(state))
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


def unmanaged_audit(state: OperatorState) -> list | None:
    """The audit of the Kata RuntimeClasses no policy manages, computed again only when one of
    those changed: at a cold start every pass writes RuntimeClasses of its own, and auditing all
    of them again on each pass cost O(policies²) (docs/performance.md)."""
    if not state.children.runtime_classes.synced.is_set():
        return None
    unmanaged = memoized(state, "unmanaged", (state.children.runtime_classes.version, state.desired.version),
                         lambda: _unmanaged_runtime_classes(state))
    return memoized(state, "audit", unmanaged[0], lambda: audit_runtime_classes(list(unmanaged[1]), set()))


def _unmanaged_runtime_classes(state: OperatorState) -> tuple[frozenset, tuple[dict, ...]]:
    """(a fingerprint of them: names and resourceVersions, them) of the RuntimeClasses no policy renders."""
    found = tuple(state.children.runtime_classes_except(state.desired.runtime_class_names()))
    return frozenset((rc["metadata"].get("name"), rc["metadata"].get("resourceVersion")) for rc in found), found


def intent(state: OperatorState, body: Mapping, facts: tuple | None) -> Intent:
    """What the policy wants with these node facts, computed once per generation and facts (in
    its record; a body with no record, computed each time)."""
    meta = body.get("metadata") or {}
    record = state.records.get(meta.get("name") or "")
    key = (meta.get("uid"), meta.get("generation"), facts, state.admission_versions)
    if record is not None and record.intent is not None and record.intent[0] == key:
        return record.intent[1]
    found = intent_of(body, nodes=list(facts) if facts is not None else None,
                      admission_versions=state.admission_versions, sizing=policy_sizing(state, body))
    if record is not None:
        record.intent = (key, found)
    return found


async def current(state: OperatorState, key: ObjKey, owner: tuple[str, str | None]) -> dict | None:
    """The live object with this name, whoever's it is: from the cache, unless the name was last
    found held by somebody else's object the cache does not hold (a ConfigMap without our label):
    then one read. Any other miss is an absent object; a create that finds the name taken reads
    it then (execute)."""
    cached = state.children.get(key)
    if cached is not None or not state.children.hides(key):
        return cached
    found = await state.api.read(key)
    state.children.held(key, found is not None and not is_ours(found, *owner))
    return found


async def survey_proposal(state: OperatorState, sizing: PolicySizing) -> ProposalStatus | None:
    """status.proposal: the refit of the survey CSV spec.overhead.survey names (None without one),
    read from its ConfigMap (docs/measurement.md)."""
    survey = sizing.policy.spec.overhead.survey
    if survey is None:
        return None
    namespace = survey.namespace or sizing.policy.spec.output.namespace
    source = f"ConfigMap {namespace}/{survey.config_map} key {survey.key}"
    found = await state.api.read(("ConfigMap", namespace, survey.config_map))
    return proposal_status(sizing.policy, ((found or {}).get("data") or {}).get(survey.key), source)


async def gather(state: OperatorState, record: PolicyRecord, trigger: str) -> Gathered:
    """What a pass of the policy of `record` knows, all read now: the caches (node facts, audits,
    the live objects), its status, the measurement and, unless the guidance check asked for the
    pass, the survey of spec.overhead.survey (a change of the policy and each resync read it)."""
    body = record.body
    assert body is not None
    name = body["metadata"]["name"]
    previous = record.status if record.status is not None else KataSizingPolicyStatus()
    inputs = await pass_inputs(state, body)
    wanted = intent(state, body, inputs.facts)
    of_policy = state.children.of_policy(name)
    owner = (name, (body.get("metadata") or {}).get("uid"))

    async def look_up(key: ObjKey) -> dict | None:
        return of_policy[key] if key in of_policy else await current(state, key, owner)

    keys = wanted.desired.keys() if wanted.desired is not None else []
    found = await asyncio.gather(*(look_up(key) for key in keys))
    sizing = policy_sizing(state, body)
    # An invalid generation keeps what the last valid one measured and proposed.
    measurement, proposal = previous.measurement, previous.proposal
    if sizing is not None:
        if state.measurement is not None:
            measurement = state.measurement.report(name, previous.measurement)
        if trigger != GUIDANCE:
            proposal = await survey_proposal(state, sizing)
    return Gathered(
        body=body, trigger=trigger, intent=wanted, status=previous, inputs=inputs,
        live={key: obj for key, obj in zip(keys, found) if obj is not None}, live_of_policy=of_policy,
        previous=state.desired.by_policy.get(name), nodes_known=inputs.facts is not None,
        unmanaged=inputs.unmanaged, pod_findings=inputs.pod_findings,
        measurement=measurement, proposal=proposal, webhook_serving=state.webhook_serving,
        remembered={key: state.children.remembered[key] for key in keys if key in state.children.remembered},
        reported=record.reported, announced=dict(record.announced),
    )
