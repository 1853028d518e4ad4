"""Deciding, pure and synchronous: what a policy wants, and one action per object.

`decide(want, have, ownership, drift_policy, trigger)` is the one decision of the operator,
for a pass and for a drift event alike (a drift event runs a pass of its policy): desired and
live in, one action out. `plan_pass` applies it to every object a policy wants or left behind;
the executor (`execute`) only carries the actions out, and `status.conclude` turns the plan and
what the executor reports into status, events and counters. docs/operation.md has the table.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..core.labels import SHARED_ADMISSION, SHARED_LABEL
from ..core.model import API_VERSION, KIND, KataSizingPolicy, PolicyError, parse_policy
from ..core.render import Rendered, configmap_names, render_policy
from ..core.sizing import PolicySizing, Severity, size_policy
from ..core.statusmodel import KataSizingPolicyStatus, MeasurementStatus, ProposalStatus
from .compare import Installer, as_installed, corrected, differences, installer_of, is_ours, is_shared
from .kinds import ObjKey, describe, obj_key


class Ownership(enum.Enum):
    """Who the object with a wanted name belongs to."""

    OWNED = "owned"  # the operator creates, owns and deletes it
    GUARDED = "guarded"  # the kata-deploy chart's RuntimeClass (managedBy: KataDeploy): its fields are guarded
    FOREIGN = "foreign"  # somebody else's object holds the name: never written


class Trigger(enum.Enum):
    """Why this object is looked at now, as far as the difference goes."""

    APPLY = "apply"  # the policy (or what it renders) changed: its objects are written in any drift policy
    DRIFT = "drift"  # the policy wants what it wanted before; the live object changed: a hand edit
    FIRST = "first"  # nothing is known of before (the operator started, or this replica now leads)


class Verb(enum.Enum):
    NOTHING = "nothing"
    CREATE = "create"
    REPLACE = "replace"  # with `body`: live with the policy's fields put back
    RECREATE = "recreate"  # RuntimeClass.handler is immutable: delete, then create `body`
    DELETE = "delete"  # an object of the policy it no longer renders
    REPORT = "report"  # say the difference, write nothing
    CONFLICT = "conflict"  # somebody else's object has the name: say so, write nothing
    MISSING = "missing"  # the chart's RuntimeClass does not exist: the chart creates it, not the operator


WRITES = frozenset({Verb.CREATE, Verb.REPLACE, Verb.RECREATE, Verb.DELETE})


class Reason(enum.Enum):
    """Why `decide` chose its verb: what the status and the events say, from here alone."""

    IN_SYNC = "in sync"  # live is as wanted
    ABSENT = "absent"  # nothing wanted, nothing there
    MISSING = "missing"  # wanted and not there
    CHART_MISSING = "chart missing"  # the chart's RuntimeClass is not there: the chart creates it
    DIFFERS = "differs"  # fields the policy decides differ
    HANDLER_CHANGED = "handler changed"  # an owned RuntimeClass's handler differs (immutable: re-created)
    HANDLER_IMMUTABLE = "handler immutable"  # the chart's RuntimeClass's handler differs: only the chart can fix it
    NOT_WANTED = "not wanted"  # an object of the policy it no longer renders
    CHART_OWNED = "chart owned"  # the chart's RuntimeClass the policy no longer renders: never deleted
    FOREIGN = "foreign"  # somebody else's object holds the name


@dataclass(frozen=True)
class Action:
    verb: Verb
    key: ObjKey
    reason: Reason
    want: dict | None = None
    have: dict | None = None
    body: dict | None = None  # what CREATE, REPLACE and RECREATE write
    differences: tuple[str, ...] = ()
    guarded: bool = False
    # The difference was made by somebody else while the policy stayed the same: a write undoing
    # it is a drift correction, a report of it a drift detection.
    drift: bool = False
    trigger: Trigger = Trigger.APPLY
    # Writes of the same pass this one waits for: a binding's admission policy (the API server
    # refuses a binding with a paramRef whose policy it cannot find, 422) and its parameters.
    after: tuple[ObjKey, ...] = ()
    # Of those, what must have landed for this write to be made: the parameters (a binding whose
    # parameters do not exist denies every pod it matches). A refused policy is no reason to hold
    # the binding back: the server says why it refuses that too.
    needs: tuple[ObjKey, ...] = ()
    # One of the install's shared admission objects: written in its installer's name (compare.Installer).
    installer: Installer | None = None

    @property
    def writes(self) -> bool:
        return self.verb in WRITES


def binding_refs(want: dict | None) -> tuple[ObjKey | None, ObjKey | None]:
    """(the admission policy, the parameters ConfigMap) a binding names; (None, None) otherwise."""
    kind = (want or {}).get("kind") or ""
    if want is None or not kind.endswith("PolicyBinding"):
        return None, None
    spec = want.get("spec") or {}
    ref = spec.get("paramRef") or {}
    policy = (kind.removesuffix("Binding"), None, spec["policyName"]) if spec.get("policyName") else None
    return policy, (("ConfigMap", ref.get("namespace"), ref["name"]) if ref.get("name") else None)


def decide(want: dict | None, have: dict | None, ownership: Ownership, drift_policy: str, trigger: Trigger,
           installer: Installer | None = None) -> Action:
    """The action for one object, and why: `want` is what the policy renders for the name (None:
    it renders nothing there), `have` the live object (None: none exists). `installer`: for one of
    the install's shared admission objects, who installed it; what is written is then what that
    installer would write (its labels and annotations, the policy's spec), in its name."""
    key = obj_key(want if want is not None else have or {})
    guarded = ownership is Ownership.GUARDED

    def action(verb: Verb, reason: Reason, **more) -> Action:
        return Action(verb, key, reason, want=want, have=have, guarded=guarded, trigger=trigger,
                      drift=trigger is Trigger.DRIFT and verb is not Verb.DELETE, installer=installer, **more)

    if ownership is Ownership.FOREIGN:
        return action(Verb.CONFLICT if want is not None else Verb.NOTHING, Reason.FOREIGN)
    if want is None:
        if have is None:
            return action(Verb.NOTHING, Reason.ABSENT)
        if guarded:
            return action(Verb.NOTHING, Reason.CHART_OWNED)
        return action(Verb.DELETE, Reason.NOT_WANTED)
    write = trigger is Trigger.APPLY or drift_policy == "Correct"
    if have is None:
        if guarded:
            return action(Verb.MISSING, Reason.CHART_MISSING, differences=("(missing)",))
        if write:
            # The rendered object itself: nothing changes what a pass renders, and it goes out as JSON.
            body = as_installed(want, installer) if installer is not None else want
            return action(Verb.CREATE, Reason.MISSING, body=body, differences=("(missing)",))
        return action(Verb.REPORT, Reason.MISSING, differences=("(missing)",))
    found = tuple(differences(want, have, guarded))
    if not found:
        return action(Verb.NOTHING, Reason.IN_SYNC)
    if key[0] == "RuntimeClass" and want.get("handler") != have.get("handler"):
        if guarded:
            # The chart made it from the values overlay: only the chart can make it again.
            return action(Verb.REPORT, Reason.HANDLER_IMMUTABLE, differences=found)
        if write:
            return action(Verb.RECREATE, Reason.HANDLER_CHANGED, body=want, differences=found)
        return action(Verb.REPORT, Reason.HANDLER_CHANGED, differences=found)
    if write:
        # A server-side installer's fields go back in its name (an apply of its configuration), so
        # its next apply finds them its own; a whole-object writer's, by a replace.
        body = as_installed(want, installer) if installer is not None and installer.server_side \
            else corrected(want, have, guarded)
        return action(Verb.REPLACE, Reason.DIFFERS, body=body, differences=found)
    return action(Verb.REPORT, Reason.DIFFERS, differences=found)


def shared_installer(have: dict | None, remembered: dict | None, live: Mapping[ObjKey, dict]) -> Installer:
    """Who installed a shared admission object: from the live object; for one that is gone, from
    the copy the operator's watch last held of it; for one it never saw, from another object of
    the install's shared set; otherwise nobody known (it is written as the render prints it)."""
    if have is not None:
        return installer_of(have)
    if remembered is not None:
        return installer_of(remembered)
    siblings = sorted((o for o in live.values() if is_shared(o)), key=lambda o: o["metadata"]["name"])
    return installer_of(siblings[0], same_object=False) if siblings else Installer()


# --- what a policy wants ---------------------------------------------------------------------


def policy_ref(body: Mapping) -> dict:
    meta = body.get("metadata") or {}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": meta.get("name"), "uid": meta.get("uid")}}


@dataclass(frozen=True)
class Desired:
    """The objects a policy's generation wants, by name."""

    policy_name: str
    policy_uid: str | None
    drift_policy: str
    ref: dict
    namespace: str
    # Objects the operator creates and owns.
    owned: Mapping[ObjKey, dict]
    # KataDeploy mode: RuntimeClasses the chart creates; the operator guards their fields.
    guarded: Mapping[ObjKey, dict]
    # Rendered admission objects of a kind (or version) the API server does not serve.
    unserved: tuple[str, ...] = ()
    routing: str = "Auto"
    guidance_rendered: bool = False

    def unserved_expected(self, what: str) -> bool:
        """A MutatingAdmissionPolicy the server does not serve is expected with routing Auto: the
        operator's webhook routes instead; not a warning."""
        return what.startswith("MutatingAdmissionPolicy") and self.routing == "Auto"

    def lookup(self, key: ObjKey) -> tuple[dict, Ownership] | None:
        if key in self.owned:
            return self.owned[key], Ownership.OWNED
        if key in self.guarded:
            return self.guarded[key], Ownership.GUARDED
        return None

    def wanted(self, key: ObjKey) -> tuple[dict, Ownership]:
        """`lookup` of a key of `keys()`."""
        found = self.lookup(key)
        assert found is not None, key
        return found

    def keys(self) -> list[ObjKey]:
        return [*self.owned, *self.guarded]

    def runtime_class_names(self) -> set[str]:
        return {key[2] for key in self.keys() if key[0] == "RuntimeClass"}


def _without_owner_references(obj: dict) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("ownerReferences", None)
    return obj


def admission_objects(
    rendered: Rendered, admission_versions: Mapping[str, str] | None,
) -> tuple[dict[ObjKey, dict], list[dict]]:
    """(the rendered admission objects the server can store, those it cannot): the policy's
    bindings and the shared admission policies they name, which the install creates and the
    operator guards like its own (puts them back, never deletes them: they are not labelled for
    the policy). With `admission_versions` None (no discovery: unit tests) every one is kept;
    otherwise an object is kept when the server serves its kind at the version it is rendered with."""
    kept: dict[ObjKey, dict] = {}
    left_out: list[dict] = []
    for obj in [*rendered.shared, *rendered.admission]:
        version = (obj.get("apiVersion") or "").rpartition("/")[2]
        if admission_versions is None or admission_versions.get(obj["kind"]) == version:
            kept[obj_key(obj)] = obj
        else:
            left_out.append(obj)
    return kept, left_out


def build_desired(
    policy: KataSizingPolicy, rendered: Rendered, body: Mapping, admission_versions: Mapping[str, str] | None = None,
) -> Desired:
    runtime_classes = {obj_key(o): o for o in rendered.runtime_classes}
    owned = {obj_key(o): o for o in rendered.configmaps}
    guarded: dict[ObjKey, dict] = {}
    if rendered.creates_runtime_classes:
        owned.update(runtime_classes)
    else:
        # The chart's objects: never owned by the policy, or deleting the policy would make
        # the garbage collector delete them (and drift correction would add the reference).
        guarded = {key: _without_owner_references(o) for key, o in runtime_classes.items()}
    admission, left_out = admission_objects(rendered, admission_versions)
    owned.update(admission)
    guidance = configmap_names(policy.name)["guidance"]
    return Desired(
        policy_name=policy.name,
        policy_uid=policy.metadata.uid,
        drift_policy=policy.spec.drift_policy,
        ref=policy_ref(body),
        namespace=policy.spec.output.namespace,
        owned=owned,
        guarded=guarded,
        unserved=tuple(f"{o['kind']} {o['metadata']['name']} ({o.get('apiVersion')})" for o in left_out),
        routing=policy.spec.admission.routing,
        guidance_rendered=any(k[0] == "ConfigMap" and k[2] == guidance for k in owned),
    )


@dataclass(frozen=True)
class Intent:
    """What a policy's generation wants, or why it wants nothing (it is invalid)."""

    invalid: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # the sizing's warnings (status, a PolicyWarning event)
    guidance_errors: tuple[str, ...] = ()
    policy: KataSizingPolicy | None = None
    sizing: PolicySizing | None = None
    rendered: Rendered | None = None
    desired: Desired | None = None


def intent_of(body: Mapping, nodes: list | None = None, admission_versions: Mapping[str, str] | None = None,
              sizing: PolicySizing | None = None) -> Intent:
    """Parse, size and render a policy (`nodes`: node facts, None while unknown; `sizing`: the
    policy's, when it is known to be valid)."""
    try:
        policy = sizing.policy if sizing is not None else parse_policy(dict(body))
        sizing = sizing or size_policy(policy)
    except PolicyError as exc:
        return Intent(invalid=tuple(exc.problems))
    if sizing.errors:
        return Intent(invalid=tuple(str(p) for p in sizing.errors), policy=policy)
    rendered = render_policy(policy, nodes=nodes, sizing=sizing)
    guidance_errors = tuple(str(p) for p in rendered.problems
                            if p.severity == Severity.ERROR and p not in sizing.errors)
    return Intent(warnings=tuple(str(p) for p in sizing.warnings), guidance_errors=guidance_errors, policy=policy,
                  sizing=sizing, rendered=rendered, desired=build_desired(policy, rendered, body, admission_versions))


# --- a pass -----------------------------------------------------------------------------------


# Why a pass runs (the log's and the metrics' `trigger`), the strongest first: a policy's queued
# pass runs once, for the strongest reason asked (docs/operation.md, Reconcile).
DELETED = "deleted"  # the policy is gone: its record is forgotten, no pass
APPLY = "apply"  # its generation is not yet the one its status observed: a new policy, a spec change
DRIFT = "drift"  # one of its objects changed
LEADER = "leader"  # this replica became the leader
RESYNC = "resync"  # the periodic resync, and the first pass after the operator started
RETRY = "retry"  # a failed pass, after its back-off
GUIDANCE = "guidance"  # what the node guidance or the audits read changed (the survey is not read again)
PASS_TRIGGERS = (DELETED, APPLY, DRIFT, LEADER, RESYNC, RETRY, GUIDANCE)


def stronger_trigger(a: str, b: str) -> str:
    return min(a, b, key=PASS_TRIGGERS.index)


def key_trigger(pass_trigger: str, previous: Desired | None, key: ObjKey, want: dict | None) -> Trigger:
    """APPLY when the policy changed (its generation is not yet observed) or renders something new
    for this name; DRIFT when it wants what it wanted at its last pass; FIRST when that is not
    known."""
    if pass_trigger == APPLY:
        return Trigger.APPLY
    if previous is None:
        return Trigger.FIRST
    before = previous.lookup(key)
    if before is None or want is None:
        return Trigger.APPLY
    return Trigger.DRIFT if before[0] == want else Trigger.APPLY


@dataclass(frozen=True)
class PassInputs:
    """What a pass read besides its policy and the policy's objects, as one frozen value: the
    guidance check compares it with the present to tell whether a pass would find anything new."""

    # The caches' versions: nodes, pods, every RuntimeClass (the audit), the policies' classes.
    versions: tuple[int, int, int, int]
    measured: int | None  # the measurement's version of the policy (None: nothing measures)
    facts: tuple | None  # node facts (None until the node and pod caches synced)
    unmanaged: tuple | None  # the audit of the Kata RuntimeClasses no policy manages
    pod_findings: tuple | None  # the audit of the policy's pods


@dataclass(frozen=True)
class Gathered:
    """What a pass knows before it decides anything (gather.gather builds it): the policy, its
    status, what it wants, the live objects, what the last pass wanted, and what was already said."""

    body: Mapping
    trigger: str  # one of PASS_TRIGGERS
    intent: Intent
    status: KataSizingPolicyStatus | None = None  # as last written (None: no status yet)
    inputs: PassInputs | None = None  # what it read from the caches besides its objects
    # The object holding each wanted name (a name missing here has no object), and the objects
    # labelled for the policy.
    live: Mapping[ObjKey, dict] = field(default_factory=dict)
    live_of_policy: Mapping[ObjKey, dict] = field(default_factory=dict)
    previous: Desired | None = None
    nodes_known: bool = False
    unmanaged: tuple | None = None  # audit findings on Kata RuntimeClasses no policy manages
    pod_findings: tuple | None = None
    # status.measurement and status.proposal as the status is to hold them (docs/measurement.md).
    measurement: MeasurementStatus | None = None
    proposal: ProposalStatus | None = None
    webhook_serving: bool | None = None
    # Shared admission objects the policy wants that are gone, as the watch last held them.
    remembered: Mapping[ObjKey, dict] = field(default_factory=dict)
    # Drift already reported, as (key, resourceVersion); events already posted, by reason.
    reported: frozenset = frozenset()
    announced: Mapping[str, object] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return (self.body.get("metadata") or {}).get("name") or ""


@dataclass(frozen=True)
class Plan:
    intent: Intent
    actions: tuple[Action, ...] = field(default=())

    @property
    def writes(self) -> tuple[Action, ...]:
        return tuple(a for a in self.actions if a.writes)

    def of(self, *verbs: Verb) -> list[Action]:
        return [a for a in self.actions if a.verb in verbs]


def plan_objects(intent: Intent, live: Mapping[ObjKey, dict], live_of_policy: Mapping[ObjKey, dict],
                 pass_trigger: str, previous: Desired | None, remembered: Mapping[ObjKey, dict] | None = None) -> Plan:
    """One action per object the policy wants, and per object of the policy it no longer renders.
    `live` holds the object with each wanted name (absent: none exists); `live_of_policy` the
    objects labelled for the policy; `remembered` the last copies of shared objects that are gone."""
    desired = intent.desired
    if desired is None:
        return Plan(intent)  # invalid: the objects of the last valid generation stay as they were
    owner = (desired.policy_name, desired.policy_uid)
    actions = []
    for key in desired.keys():
        want, role = desired.wanted(key)
        have = live.get(key)
        ownership = Ownership.FOREIGN if have is not None and not is_ours(have, *owner) else role
        trigger = key_trigger(pass_trigger, previous, key, want)
        installer = shared_installer(have, (remembered or {}).get(key), live) if is_shared(want) else None
        action = decide(want, have, ownership, desired.drift_policy, trigger, installer)
        if ownership is Ownership.FOREIGN and role is Ownership.GUARDED:
            action = replace(action, guarded=True)  # the chart's object, without our labels
        policy, params = binding_refs(want)
        if action.writes and (policy or params):
            action = replace(action, after=tuple(k for k in (policy, params) if k),
                             needs=(params,) if params else ())
        actions.append(action)
    guidance_name = configmap_names(desired.policy_name)["guidance"]
    for key, have in live_of_policy.items():
        if key in desired.owned or key in desired.guarded or not is_ours(have, *owner):
            continue
        if key[0] == "ConfigMap" and key[2] == guidance_name and key[1] == desired.namespace \
                and not desired.guidance_rendered:
            continue  # node facts not known yet (informers syncing): keep the last guidance
        role = Ownership.GUARDED if key[0] == "RuntimeClass" and desired.guarded else Ownership.OWNED
        actions.append(decide(None, have, role, desired.drift_policy, Trigger.APPLY))
    return Plan(intent, tuple(a for a in actions if a.verb is not Verb.NOTHING))


def plan_pass(gathered: Gathered) -> Plan:
    return plan_objects(gathered.intent, gathered.live, gathered.live_of_policy, gathered.trigger, gathered.previous,
                        gathered.remembered)


def conflict_text(action: Action) -> str:
    if action.guarded:
        return f"{describe(action.key)} is not labelled for this policy; left untouched"
    if is_shared(action.want):
        return (f"{describe(action.key)} exists and is not the install's shared admission object (no label "
                f"{SHARED_LABEL}={SHARED_ADMISSION}); left untouched")
    return f"{describe(action.key)} exists and is not managed by this policy; left untouched"
