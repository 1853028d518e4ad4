"""Gathering: everything a pass knows before it decides, read from the operator's caches (and,
for a wanted name the caches cannot vouch for, from the API), into one frozen `plan.Gathered`.

Node facts, the audit of unmanaged RuntimeClasses, a policy's pod audit and its intent (parse,
size, render) are computed once per change of what they read and shared by every pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Mapping

from . import cluster
from .compare import is_ours
from .kinds import ObjKey
from .plan import Gathered, Intent, intent_of
from .state import OperatorState
from ..core import defaults
from ..core.audit import audit_runtime_classes
from ..core.model import PolicyError, parse_policy
from ..core.podfit import check_limits
from ..core.proposal import proposal_status
from ..core.sizing import PolicySizing, size_policy

# How long a pass waits for the node and pod caches' first list before it goes on without
# node facts (the guidance ConfigMap is then left as it was). Seconds.
INFORMER_SYNC_TIMEOUT_S = 20
DERIVED_ENTRIES = 64


def inputs(state: OperatorState) -> tuple[int, int, int, int]:
    """Versions of everything a pass reads besides the policy: nodes, pods, every RuntimeClass
    (for the audit) and the set of policies (which classes are Kata ones)."""
    return state.nodes.version, state.pods.version, state.children.runtime_classes.version, state.desired.version


def memoized(state: OperatorState, key: Hashable, compute: Callable[[], object]):
    found = state.derived.get(key)
    if found is None:
        if len(state.derived) > DERIVED_ENTRIES:
            state.derived.clear()
        found = state.derived[key] = (compute(),)
    return found[0]


def _facts_key(state: OperatorState, body: Mapping) -> tuple:
    selector = ((body.get("spec") or {}).get("nodes") or {}).get("selector")
    if selector is None:
        selector = dict(defaults.KATA_NODE_LABEL)
    return ("facts", state.nodes.version, state.pods.version, state.desired.version, tuple(sorted(selector.items())))


async def node_facts(state: OperatorState, body: Mapping) -> tuple | None:
    """Facts of the policy's nodes from the informers; None until they have synced once."""
    try:
        await asyncio.wait_for(
            asyncio.gather(state.nodes.synced.wait(), state.pods.synced.wait()), INFORMER_SYNC_TIMEOUT_S)
    except asyncio.TimeoutError:
        return None
    key = _facts_key(state, body)
    selector = dict(key[-1])
    pods_by_node = memoized(state, ("pods-by-node", state.pods.version), lambda: _pods_by_node(state))
    kata_classes = memoized(state, ("kata-classes", state.desired.version), state.desired.runtime_class_names)
    return memoized(state, key, lambda: tuple(
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
    """The policy's sizing, memoized per generation; None when the policy is invalid."""
    meta = body.get("metadata") or {}
    name, key = meta.get("name"), (meta.get("uid"), meta.get("generation"))
    found = state.sizings.get(name)
    if found is not None and found[0] == key:
        return found[1]
    try:
        sizing = size_policy(parse_policy(dict(body)))
        sizing = None if sizing.errors else sizing
    except PolicyError:
        sizing = None
    state.sizings[name] = (key, sizing)
    return sizing


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
    by_class = memoized(state, ("pods-by-class", state.pods.version), lambda: _pods_by_class(state))
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
    if not state.children.runtime_classes.synced.is_set():
        return None
    return memoized(
        state, ("audit", state.children.runtime_classes.version, state.desired.version),
        lambda: audit_runtime_classes(list(state.children.all_runtime_classes()),
                                      state.desired.runtime_class_names()))


def intent(state: OperatorState, body: Mapping, facts: tuple | None) -> Intent:
    """What the policy wants with these node facts, computed once per generation and facts."""
    meta = body.get("metadata") or {}
    key = ("intent", meta.get("name"), meta.get("uid"), meta.get("generation"),
           _facts_key(state, body) if facts is not None else None)
    return memoized(state, key, lambda: intent_of(
        body, nodes=list(facts) if facts is not None else None, admission_versions=state.admission_versions,
        sizing=policy_sizing(state, body)))


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


async def survey_proposal(state: OperatorState, sizing: PolicySizing) -> dict:
    """status.proposal: the refit of the survey CSV spec.overhead.survey names ({} without one),
    read from its ConfigMap (docs/measurement.md)."""
    survey = sizing.policy.spec.overhead.survey
    if survey is None:
        return {}
    namespace = survey.namespace or sizing.policy.spec.output.namespace
    source = f"ConfigMap {namespace}/{survey.config_map} key {survey.key}"
    found = await state.api.read(("ConfigMap", namespace, survey.config_map))
    return proposal_status(sizing.policy, ((found or {}).get("data") or {}).get(survey.key), source)


async def gather(state: OperatorState, body: dict, trigger: str, facts: tuple | None = None,
                 findings: list | None = None, pods: list[dict] | None = None,
                 reread_survey: bool = True) -> Gathered:
    """What a pass of `body` knows. `facts`, `findings` and `pods` are given when the caller has
    just computed them (the guidance timer); otherwise they are computed from the caches. The
    survey of spec.overhead.survey is read again unless `reread_survey` is false (the guidance
    timer's passes: a change of the policy and each resync read it)."""
    name = body["metadata"]["name"]
    if facts is None:
        facts = await node_facts(state, body)
    if findings is None:
        findings = unmanaged_audit(state)
    if pods is None:
        pods = pod_findings(state, body)
    wanted = intent(state, body, facts)
    of_policy = state.children.of_policy(name)

    owner = (name, (body.get("metadata") or {}).get("uid"))

    async def look_up(key: ObjKey) -> dict | None:
        return of_policy[key] if key in of_policy else await current(state, key, owner)

    keys = wanted.desired.keys() if wanted.desired is not None else []
    found = await asyncio.gather(*(look_up(key) for key in keys))
    sizing = policy_sizing(state, body)
    measurement = proposal = None
    if sizing is not None:
        if state.measurement is not None:
            measurement = state.measurement.report(name)
        if reread_survey:
            proposal = await survey_proposal(state, sizing)
    return Gathered(
        body=body, trigger=trigger, intent=wanted,
        live={key: obj for key, obj in zip(keys, found) if obj is not None}, live_of_policy=of_policy,
        previous=state.desired.by_policy.get(name), nodes_known=facts is not None,
        unmanaged=tuple(findings) if findings is not None else None,
        pod_findings=tuple(pods) if pods is not None else None,
        measurement=measurement, proposal=proposal,
        webhook_serving=state.webhook_serving,
        reported=frozenset(state.reported.get(name, ())), announced=dict(state.announced.get(name, {})),
    )
