"""The events a pass posts about one object, as a table (the companion of tests/unit/test_decide.py):
who owns the object, what is live, the drift policy, why the object is looked at, and what the
executor made of the write, against the Kubernetes Events posted, the drift counters and the
InSync condition. The wording comes from the reason `decide` gave with its action."""

from __future__ import annotations

import copy

import pytest

from kata_sizing.controller import conditions as cond
from kata_sizing.controller.execute import CONFLICTED, DONE, FAILED, REFUSED, Outcome, Result
from kata_sizing.controller.plan import Gathered, build_desired, intent_of, plan_pass
from kata_sizing.controller.status import conclude
from kata_sizing.core.model import parse_policy
from kata_sizing.core.render import POLICY_LABEL, render_policy
from tests.support.policies import example

NAME, UID = "qemu-rs", "0e3c9a4e-0000-4000-8000-000000000001"
M = ("RuntimeClass", None, "kata-qemu-rs-m")
RC_M = "RuntimeClass kata-qemu-rs-m"


def _body(drift_policy: str, chart: bool) -> dict:
    body = example()
    body["metadata"].update(uid=UID, generation=1)
    body["spec"]["driftPolicy"] = drift_policy
    if chart:
        body["spec"]["runtimeClass"] = {**body["spec"]["runtimeClass"], "managedBy": "KataDeploy"}
    return body


def _live(body: dict, live_m: str) -> dict:
    """Every object as the policy wants it, but RuntimeClass m: missing, differs (podFixed),
    handler (changed), foreign (somebody else's, same name) or equal."""
    objects = {}
    rendered = render_policy(parse_policy(body))
    for obj in [*rendered.runtime_classes, *rendered.configmaps, *rendered.admission, *rendered.shared]:
        obj = copy.deepcopy(obj)
        obj["metadata"].update(uid=f"uid-{obj['metadata']['name']}", resourceVersion="5")
        objects[(obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])] = obj
    m = objects[M]
    if live_m == "missing":
        del objects[M]
    elif live_m == "differs":
        m["overhead"]["podFixed"]["memory"] = "1Mi"
    elif live_m == "handler":
        m["handler"] = "other"
    elif live_m == "foreign":
        m["metadata"] = {"name": m["metadata"]["name"], "uid": "theirs", "resourceVersion": "5"}
    return objects


# (who, live m, driftPolicy, why it is looked at, what the executor made of the write) ->
# (the events: type, reason, message; the drift counters added; the InSync reason)
ROWS = [
    # A hand edit put back: DriftCorrected, counted, whatever the edit was.
    (("owned", "missing", "Correct", "drift", DONE),
     ([("Normal", cond.EVENT_DRIFT_CORRECTED, f"{RC_M} was deleted by hand; created again from the policy")],
      {"driftCorrections": 1}, cond.REASON_IN_SYNC)),
    (("owned", "differs", "Correct", "drift", DONE),
     ([("Normal", cond.EVENT_DRIFT_CORRECTED,
        f"{RC_M} was changed by hand (overhead.podFixed); updated from the policy")],
      {"driftCorrections": 1}, cond.REASON_IN_SYNC)),
    (("owned", "handler", "Correct", "drift", DONE),
     ([("Normal", cond.EVENT_DRIFT_CORRECTED, f"{RC_M}: handler changed by hand; re-created")],
      {"driftCorrections": 1}, cond.REASON_IN_SYNC)),
    (("guarded", "differs", "Correct", "drift", DONE),
     ([("Normal", cond.EVENT_DRIFT_CORRECTED,
        f"{RC_M} was changed by hand (overhead.podFixed); updated from the policy")],
      {"driftCorrections": 1}, cond.REASON_IN_SYNC)),
    # The policy changed, or nothing says who made the difference: Applied, not counted.
    (("owned", "missing", "Correct", "apply", DONE),
     ([("Normal", cond.EVENT_APPLIED, f"created {RC_M}")], {}, cond.REASON_IN_SYNC)),
    (("owned", "differs", "Report", "apply", DONE),
     ([("Normal", cond.EVENT_APPLIED, f"updated {RC_M}")], {}, cond.REASON_IN_SYNC)),
    (("owned", "missing", "Correct", "first", DONE),
     ([("Normal", cond.EVENT_APPLIED, f"created {RC_M}")], {}, cond.REASON_IN_SYNC)),
    # Reported, not written (driftPolicy Report): DriftDetected, counted when it is a hand edit.
    (("owned", "missing", "Report", "drift", None),
     ([("Warning", cond.EVENT_DRIFT_DETECTED, f"{RC_M} was deleted; driftPolicy is Report, not corrected")],
      {"driftDetected": 1}, cond.REASON_DRIFT_REPORTED)),
    (("owned", "differs", "Report", "drift", None),
     ([("Warning", cond.EVENT_DRIFT_DETECTED,
        f"{RC_M} differs from the policy (overhead.podFixed); driftPolicy is Report, not corrected")],
      {"driftDetected": 1}, cond.REASON_DRIFT_REPORTED)),
    (("owned", "handler", "Report", "drift", None),
     ([("Warning", cond.EVENT_DRIFT_DETECTED,
        f"{RC_M}: handler changed to 'other' (immutable: correcting it re-creates the RuntimeClass); "
        "driftPolicy is Report, not corrected")],
      {"driftDetected": 1}, cond.REASON_DRIFT_REPORTED)),
    (("owned", "differs", "Report", "first", None),
     ([("Warning", cond.EVENT_DRIFT_DETECTED,
        f"{RC_M} differs from the policy (overhead.podFixed); driftPolicy is Report, not corrected")],
      {}, cond.REASON_DRIFT_REPORTED)),
    # The chart's RuntimeClass: the chart makes it and its handler, never the operator.
    (("guarded", "missing", "Correct", "drift", None),
     ([("Warning", cond.EVENT_DRIFT_DETECTED,
        f"{RC_M} was deleted; the kata-deploy chart creates it from the values overlay (helm upgrade), "
        "not the operator (managedBy: KataDeploy)")],
      {"driftDetected": 1}, cond.REASON_RUNTIME_CLASS_MISSING)),
    (("guarded", "missing", "Correct", "apply", None), ([], {}, cond.REASON_RUNTIME_CLASS_MISSING)),
    (("guarded", "handler", "Correct", "drift", None),
     ([("Warning", cond.EVENT_DRIFT_DETECTED,
        f"{RC_M}: handler 'other' differs from the policy's and RuntimeClass.handler is immutable; the "
        "kata-deploy chart created it: fix the chart's values (helm upgrade with the overlay), the operator "
        "does not replace it")],
      {"driftDetected": 1}, cond.REASON_DRIFT_REPORTED)),
    # Somebody else's object, and what the executor could not do.
    (("owned", "foreign", "Correct", "drift", None),
     ([("Warning", cond.EVENT_CONFLICT, f"{RC_M} exists and is not managed by this policy; left untouched")],
      {}, cond.REASON_CONFLICT)),
    (("owned", "differs", "Correct", "drift", CONFLICTED),
     ([("Warning", cond.EVENT_CONFLICT, f"{RC_M} exists and is not managed by this policy; left untouched")],
      {}, cond.REASON_CONFLICT)),
    (("owned", "missing", "Correct", "apply", FAILED),
     ([("Warning", cond.EVENT_WRITE_FAILED, f"{RC_M}: the server said no")], {},
      cond.REASON_OUTPUT_NAMESPACE_MISSING)),
    (("owned", "missing", "Correct", "apply", REFUSED), ([], {}, cond.REASON_REFUSED)),
    (("owned", "equal", "Correct", "drift", None), ([], {}, cond.REASON_IN_SYNC)),
    (("guarded", "equal", "Report", "drift", None), ([], {}, cond.REASON_IN_SYNC)),
]

# The executor's text for what landed, by verb, and for what did not.
LANDED = {"create": f"created {RC_M}", "replace": f"updated {RC_M}", "recreate": f"re-created {RC_M} (handler changed)"}
NOT_LANDED = {CONFLICTED: f"{RC_M} exists and is not managed by this policy; left untouched",
              FAILED: f"{RC_M}: the server said no", REFUSED: f"{RC_M}: the server said no"}


def _pass(who: str, live_m: str, drift_policy: str, why: str, result: str | None):
    body = _body(drift_policy, chart=who == "guarded")
    live = _live(body, live_m)
    intent = intent_of(body)
    previous = None if why == "first" else build_desired(parse_policy(body), render_policy(parse_policy(body)), body)
    gathered = Gathered(
        body=body, trigger={"first": "resync"}.get(why, why), intent=intent, live=live,
        live_of_policy={k: v for k, v in live.items()
                        if (v["metadata"].get("labels") or {}).get(POLICY_LABEL) == NAME},
        previous=previous, nodes_known=True)
    plan = plan_pass(gathered)
    assert {a.key for a in plan.actions} <= {M}, plan.actions
    outcome = Outcome()
    for action in plan.writes:
        assert result is not None, "a pass that writes has a result for each write"
        text = LANDED[action.verb.value] if result == DONE else NOT_LANDED[result]
        outcome.results[action.key] = Result(result, text)
        if result == DONE:
            outcome.landed.append(text)
    assert bool(plan.writes) == (result is not None), (plan.writes, result)
    return conclude(gathered, plan, outcome)


@pytest.mark.parametrize("case, expected", ROWS, ids=["-".join(str(c) for c in case) for case, _ in ROWS])
def test_events(case, expected):
    events, counts, in_sync = expected
    done = _pass(*case)
    posted = [e for e in done.events if e[1] != cond.EVENT_UNMANAGED]
    assert posted == events
    assert dict(done.counts) == counts
    condition = {c.type: c for c in done.status.conditions}[cond.IN_SYNC]
    assert condition.reason == in_sync
    assert (condition.status == "True") == (in_sync == cond.REASON_IN_SYNC)


def test_the_table_covers_every_reason_an_event_is_worded_from():
    from kata_sizing.controller.plan import Reason

    reasons = set()
    for (who, live_m, drift_policy, _why, _result), _ in ROWS:
        body = _body(drift_policy, chart=who == "guarded")
        gathered = Gathered(body=body, trigger="drift", intent=intent_of(body), live=_live(body, live_m))
        reasons |= {a.reason for a in plan_pass(gathered).actions}
    # ABSENT, NOT_WANTED and CHART_OWNED concern objects the policy no longer renders (test_decide.py).
    assert reasons == set(Reason) - {Reason.IN_SYNC, Reason.ABSENT, Reason.NOT_WANTED, Reason.CHART_OWNED}
