"""`decide`, the one decision of the operator, as a table: every combination of who owns the
object, what the policy wants, what is live, the drift policy and why the object is looked at.

A pass and a drift event share it (a drift event runs a pass of its policy, with trigger drift),
so the table also holds the three cases where the two used to disagree (issue 17):
- an owned RuntimeClass whose handler was changed by hand under driftPolicy Report: reported,
  not re-created;
- a chart (KataDeploy) RuntimeClass whose handler changed: reported as immutable, never replaced
  and never a DriftCorrected;
- a chart RuntimeClass deleted: missing (Ready False at once), the event names what happens
  (the chart re-creates it), not "driftPolicy is Report".
"""

from __future__ import annotations

import copy
import itertools

import pytest

from kata_sizing.controller import conditions as cond
from kata_sizing.controller.execute import DONE, Outcome, Result
from kata_sizing.controller.plan import (
    Gathered,
    Ownership,
    Reason,
    Trigger,
    Verb,
    build_desired,
    decide,
    intent_of,
    key_trigger,
    plan_pass,
)
from kata_sizing.controller.status import conclude
from kata_sizing.core.model import parse_policy
from kata_sizing.core.render import CLASS_LABEL, MANAGED_BY, MANAGED_BY_LABEL, POLICY_LABEL, render_policy
from tests.support.policies import example

NAME, UID = "qemu-rs", "0e3c9a4e-0000-4000-8000-000000000001"


def _want() -> dict:
    return {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": "kata-qemu-rs-m",
        "metadata": {"name": "kata-qemu-rs-m",
                     "labels": {MANAGED_BY_LABEL: MANAGED_BY, POLICY_LABEL: NAME, CLASS_LABEL: "m"}},
        "overhead": {"podFixed": {"cpu": "250m", "memory": "1Gi"}},
        "scheduling": {"nodeSelector": {"katacontainers.io/kata-runtime": "true"}},
    }


def _live(**change) -> dict:
    obj = copy.deepcopy(_want())
    obj["metadata"].update(uid="u1", resourceVersion="7")
    if "memory" in change:
        obj["overhead"]["podFixed"]["memory"] = change["memory"]
    if "handler" in change:
        obj["handler"] = change["handler"]
    return obj


HAVE = {"none": None, "equal": _live(), "differs": _live(memory="1Mi"), "handler": _live(handler="other")}
COMBOS = [(policy, trigger) for policy in ("Correct", "Report") for trigger in (Trigger.APPLY, Trigger.DRIFT, Trigger.FIRST)]
N, C, RP, RC_, RR, D, RE, CF, M = (Verb.NOTHING, Verb.CREATE, Verb.REPLACE, Verb.RECREATE, Verb.REPORT, Verb.DELETE,
                                   Verb.REPORT, Verb.CONFLICT, Verb.MISSING)

# (ownership, wanted?, live) -> the verb for each of COMBOS:
# (Correct, APPLY), (Correct, DRIFT), (Correct, FIRST), (Report, APPLY), (Report, DRIFT), (Report, FIRST)
TABLE = {
    (Ownership.OWNED, True, "none"): (C, C, C, C, RR, RR),
    (Ownership.OWNED, True, "equal"): (N, N, N, N, N, N),
    (Ownership.OWNED, True, "differs"): (RP, RP, RP, RP, RR, RR),
    # Disagreement 1: under Report a handler changed by hand is reported, by every path.
    (Ownership.OWNED, True, "handler"): (RC_, RC_, RC_, RC_, RR, RR),
    (Ownership.OWNED, False, "none"): (N, N, N, N, N, N),
    (Ownership.OWNED, False, "equal"): (D, D, D, D, D, D),
    (Ownership.OWNED, False, "differs"): (D, D, D, D, D, D),
    (Ownership.OWNED, False, "handler"): (D, D, D, D, D, D),
    # Disagreement 3's first half: a chart RuntimeClass that is not there is the chart's to make.
    (Ownership.GUARDED, True, "none"): (M, M, M, M, M, M),
    (Ownership.GUARDED, True, "equal"): (N, N, N, N, N, N),
    (Ownership.GUARDED, True, "differs"): (RP, RP, RP, RP, RR, RR),
    # Disagreement 2: the chart's handler is immutable and the chart's: reported, never replaced.
    (Ownership.GUARDED, True, "handler"): (RE, RE, RE, RE, RE, RE),
    (Ownership.GUARDED, False, "none"): (N, N, N, N, N, N),
    (Ownership.GUARDED, False, "equal"): (N, N, N, N, N, N),
    (Ownership.GUARDED, False, "differs"): (N, N, N, N, N, N),
    (Ownership.GUARDED, False, "handler"): (N, N, N, N, N, N),
    (Ownership.FOREIGN, True, "equal"): (CF, CF, CF, CF, CF, CF),
    (Ownership.FOREIGN, True, "differs"): (CF, CF, CF, CF, CF, CF),
    (Ownership.FOREIGN, True, "handler"): (CF, CF, CF, CF, CF, CF),
    (Ownership.FOREIGN, False, "equal"): (N, N, N, N, N, N),
    (Ownership.FOREIGN, False, "differs"): (N, N, N, N, N, N),
    (Ownership.FOREIGN, False, "handler"): (N, N, N, N, N, N),
}
CASES = [(ownership, wanted, have, policy, trigger, verbs[i])
         for (ownership, wanted, have), verbs in TABLE.items() for i, (policy, trigger) in enumerate(COMBOS)]

# Why, for each row whatever the drift policy and the trigger: what status and events say comes
# from here (tests/unit/test_events.py), never from looking at the object again.
R = Reason
REASONS = {
    (Ownership.OWNED, True, "none"): R.MISSING, (Ownership.OWNED, True, "equal"): R.IN_SYNC,
    (Ownership.OWNED, True, "differs"): R.DIFFERS, (Ownership.OWNED, True, "handler"): R.HANDLER_CHANGED,
    (Ownership.OWNED, False, "none"): R.ABSENT, (Ownership.OWNED, False, "equal"): R.NOT_WANTED,
    (Ownership.OWNED, False, "differs"): R.NOT_WANTED, (Ownership.OWNED, False, "handler"): R.NOT_WANTED,
    (Ownership.GUARDED, True, "none"): R.CHART_MISSING, (Ownership.GUARDED, True, "equal"): R.IN_SYNC,
    (Ownership.GUARDED, True, "differs"): R.DIFFERS, (Ownership.GUARDED, True, "handler"): R.HANDLER_IMMUTABLE,
    (Ownership.GUARDED, False, "none"): R.ABSENT, (Ownership.GUARDED, False, "equal"): R.CHART_OWNED,
    (Ownership.GUARDED, False, "differs"): R.CHART_OWNED, (Ownership.GUARDED, False, "handler"): R.CHART_OWNED,
    **{(Ownership.FOREIGN, wanted, have): R.FOREIGN for wanted in (True, False) for have in ("equal", "differs", "handler")},
}


def test_the_table_holds_every_combination():
    every = {(o, w, h) for o, w, h in itertools.product(Ownership, (True, False), HAVE)
             if not (o is Ownership.FOREIGN and h == "none")}  # somebody else's object exists, or it is not foreign
    assert set(TABLE) == every == set(REASONS) and len(CASES) == len(every) * len(COMBOS) == 132


@pytest.mark.parametrize("ownership, wanted, have, drift_policy, trigger, verb", CASES,
                         ids=[f"{o.value}-{'want' if w else 'unwanted'}-{h}-{p}-{t.value}" for o, w, h, p, t, _ in CASES])
def test_decide(ownership, wanted, have, drift_policy, trigger, verb):
    want = _want() if wanted else None
    action = decide(want, copy.deepcopy(HAVE[have]), ownership, drift_policy, trigger)
    assert action.verb is verb
    assert action.reason is REASONS[ownership, wanted, have]
    if want is not None or HAVE[have] is not None:
        assert action.key == ("RuntimeClass", None, "kata-qemu-rs-m")
    if verb is Verb.REPLACE:
        assert action.body["overhead"] == want["overhead"]
        assert action.body["metadata"]["resourceVersion"] == "7"  # a concurrent edit is a 409, never lost
    if verb in (Verb.CREATE, Verb.RECREATE):
        assert action.body == want
    assert action.drift is (trigger is Trigger.DRIFT and verb is not Verb.DELETE)


def test_a_guarded_write_keeps_the_keys_of_the_chart():
    have = _live(memory="1Mi")
    have["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "Helm"
    have["scheduling"]["nodeSelector"]["kata-deploy.katacontainers.io/default"] = "true"
    action = decide(_want(), have, Ownership.GUARDED, "Correct", Trigger.DRIFT)
    assert action.verb is Verb.REPLACE and action.body["overhead"]["podFixed"]["memory"] == "1Gi"
    assert action.body["scheduling"]["nodeSelector"]["kata-deploy.katacontainers.io/default"] == "true"
    assert action.body["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


# --- why an object is looked at ---------------------------------------------------------------


def _desired(body: dict, nodes: list | None = None):
    policy = parse_policy(body)
    return build_desired(policy, render_policy(policy, nodes=nodes), body)


def _body(**spec) -> dict:
    body = example()
    body["metadata"].update(uid=UID, generation=1)
    body["spec"].update(spec)
    return body


def test_key_trigger_is_drift_only_when_the_policy_wants_what_it_wanted_before():
    desired = _desired(_body())
    key = ("RuntimeClass", None, "kata-qemu-rs-m")
    want = desired.owned[key]
    assert key_trigger("apply", desired, key, want) is Trigger.APPLY
    assert key_trigger("resync", None, key, want) is Trigger.FIRST
    assert key_trigger("drift", desired, key, want) is Trigger.DRIFT
    assert key_trigger("resync", desired, key, want) is Trigger.DRIFT
    changed = copy.deepcopy(want)
    changed["overhead"]["podFixed"]["memory"] = "2Gi"
    assert key_trigger("resync", desired, key, changed) is Trigger.APPLY  # the node guidance changed, say
    assert key_trigger("drift", desired, ("RuntimeClass", None, "new"), want) is Trigger.APPLY


# --- the three disagreements, concluded: the pass and a drift event say the same ---------------------------


def _gathered(body: dict, live: dict, trigger: str, previous=None, status=None) -> Gathered:
    intent = intent_of(body)
    of_policy = {k: v for k, v in live.items() if (v["metadata"].get("labels") or {}).get(POLICY_LABEL) == NAME}
    return Gathered(body=body, trigger=trigger, intent=intent, live=live, live_of_policy=of_policy,
                    previous=previous, status=status)


def _conditions(done) -> dict:
    return {c.type: c for c in done.status.conditions}


def _live_objects(body: dict) -> dict:
    rendered = render_policy(parse_policy(body))
    objects = {}
    for obj in [*rendered.runtime_classes, *rendered.configmaps, *rendered.shared, *rendered.admission]:
        obj = copy.deepcopy(obj)
        obj["metadata"].update(uid=f"uid-{obj['metadata']['name']}", resourceVersion="5")
        objects[(obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])] = obj
    return objects


def _conclude_without_writes(gathered: Gathered):
    plan = plan_pass(gathered)
    assert not plan.writes, [a.verb for a in plan.writes]
    return plan, conclude(gathered, plan, Outcome())


@pytest.mark.parametrize("trigger", ["resync", "drift"])
def test_a_handler_changed_by_hand_under_report_is_reported_by_the_pass_and_the_drift_path(trigger):
    body = _body(driftPolicy="Report")
    live = _live_objects(body)
    key = ("RuntimeClass", None, "kata-qemu-rs-m")
    live[key]["handler"] = "changed-by-hand"
    live[key]["metadata"]["resourceVersion"] = "9"
    plan, done = _conclude_without_writes(_gathered(body, live, trigger, previous=_desired(body)))
    [action] = plan.actions
    assert action.verb is Verb.REPORT and action.drift
    assert [(t, r) for t, r, _ in done.events] == [("Warning", cond.EVENT_DRIFT_DETECTED)]
    assert "driftPolicy is Report, not corrected" in done.events[0][2]
    assert dict(done.counts) == {"driftDetected": 1}
    in_sync = _conditions(done)["InSync"]
    assert (in_sync.status, in_sync.reason) == ("False", cond.REASON_DRIFT_REPORTED)


def _chart_body() -> dict:
    body = _body()
    body["spec"]["runtimeClass"] = {**body["spec"]["runtimeClass"], "managedBy": "KataDeploy"}
    return body


@pytest.mark.parametrize("trigger", ["resync", "drift"])
def test_a_chart_runtime_class_whose_handler_changed_is_reported_immutable_by_both_paths(trigger):
    body = _chart_body()
    live = _live_objects(body)
    key = ("RuntimeClass", None, "kata-qemu-rs-m")
    live[key]["handler"] = "changed"
    live[key]["overhead"]["podFixed"]["memory"] = "1Mi"  # the podFixed too: still no replace
    plan, done = _conclude_without_writes(_gathered(body, live, trigger, previous=_desired(body)))
    [action] = plan.actions
    assert action.verb is Verb.REPORT
    assert not [e for e in done.events if e[1] == cond.EVENT_DRIFT_CORRECTED]
    [(kind, reason, message)] = done.events
    assert reason == cond.EVENT_DRIFT_DETECTED and "immutable" in message and "fix the chart" in message
    assert "handler 'changed' (immutable; fix the chart)" in _conditions(done)["InSync"].message


@pytest.mark.parametrize("trigger", ["resync", "drift"])
def test_a_deleted_chart_runtime_class_turns_ready_false_at_once_and_back_when_it_returns(trigger):
    body = _chart_body()
    live = _live_objects(body)
    previous = _desired(body)
    gone = live.pop(("RuntimeClass", None, "kata-qemu-rs-m"))
    plan, done = _conclude_without_writes(_gathered(body, live, trigger, previous=previous))
    [action] = plan.actions
    assert action.verb is Verb.MISSING
    conditions = _conditions(done)
    assert (conditions["Ready"].status, conditions["Ready"].reason) == ("False", cond.REASON_RUNTIME_CLASS_MISSING)
    [(_, reason, message)] = done.events
    assert reason == cond.EVENT_DRIFT_DETECTED
    assert "driftPolicy is Report" not in message and "the kata-deploy chart creates it" in message
    # The chart makes it again: the very next pass (the drift event of its creation) says InSync.
    live[("RuntimeClass", None, "kata-qemu-rs-m")] = gone
    _, again = _conclude_without_writes(_gathered(body, live, trigger, previous=previous, status=done.status))
    conditions = _conditions(again)
    assert (conditions["InSync"].status, conditions["Ready"].status) == ("True", "True")


def test_the_same_drift_is_reported_once_and_a_correction_counted_once_it_lands():
    body = _body(driftPolicy="Report")
    live = _live_objects(body)
    key = ("RuntimeClass", None, "kata-qemu-rs-s")
    live[key]["overhead"]["podFixed"]["memory"] = "1Mi"
    gathered = _gathered(body, live, "drift", previous=_desired(body))
    plan, first = _conclude_without_writes(gathered)
    assert dict(first.counts) == {"driftDetected": 1} and len(first.events) == 1
    again = Gathered(**{**gathered.__dict__, "reported": first.reported})
    _, second = _conclude_without_writes(again)
    assert dict(second.counts) == {} and second.events == ()

    corrected = Gathered(**{**gathered.__dict__, "body": _body()})  # driftPolicy Correct
    corrected = Gathered(**{**corrected.__dict__, "intent": intent_of(corrected.body)})
    plan = plan_pass(corrected)
    [action] = plan.writes
    assert action.verb is Verb.REPLACE and action.drift
    landed = Outcome(["updated RuntimeClass kata-qemu-rs-s"], {key: Result(DONE, "updated RuntimeClass kata-qemu-rs-s")})
    done = conclude(corrected, plan, landed)
    assert dict(done.counts) == {"driftCorrections": 1}
    assert [(t, r) for t, r, _ in done.events] == [("Normal", cond.EVENT_DRIFT_CORRECTED)]
    # Not landed (somebody else already put it back): nothing to count.
    assert dict(conclude(corrected, plan, Outcome()).counts) == {}


def test_a_chart_runtime_class_missing_until_the_chart_ran_and_deleted_later_is_news_then():
    body = _chart_body()
    live = _live_objects(body)
    key = ("RuntimeClass", None, "kata-qemu-rs-m")
    made = live.pop(key)
    _, waiting = _conclude_without_writes(_gathered(body, live, "apply"))  # before helm install
    assert not [e for e in waiting.events if e[1] == cond.EVENT_DRIFT_DETECTED] and waiting.reported
    live[key] = made
    present = Gathered(**{**_gathered(body, live, "drift", previous=_desired(body)).__dict__,
                          "reported": waiting.reported})
    _, now = _conclude_without_writes(present)
    assert now.reported == frozenset()  # nothing stands reported any more
    del live[key]
    deleted = Gathered(**{**present.__dict__, "live": dict(live), "reported": now.reported})
    _, gone = _conclude_without_writes(deleted)
    assert [(t, r) for t, r, _ in gone.events] == [("Warning", cond.EVENT_DRIFT_DETECTED)]
