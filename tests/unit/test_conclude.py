"""`status.conclude` as tables (the companion of tests/unit/test_decide.py and tests/unit/test_events.py):
what one action's outcome says (`ACTION_OUTCOMES`: the verb or a write, the executor's result,
whether it undoes a hand edit), which reason InSync gives when several hold (`IN_SYNC_ORDER`),
and when an event of the pass as a whole is news (posted once, not again while the status
shows it, again once it was gone). Each table is walked row by row against what a user reads:
the status's lines and conditions, the events, the drift counters."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from pydantic import ValidationError

from kata_sizing.controller import conditions as cond
from kata_sizing.controller import execute
from kata_sizing.controller import status as st
from kata_sizing.controller.execute import (
    CONFLICTED,
    DONE,
    ERROR,
    FAILED,
    GONE,
    REFUSED,
    UNCHANGED,
    Outcome,
    Result,
)
from kata_sizing.controller.plan import WRITES, Action, Gathered, Plan, Reason, Verb, intent_of
from kata_sizing.core.audit import audit_runtime_classes
from kata_sizing.core.statusmodel import Condition, KataSizingPolicyStatus
from tests.support.policies import example

M = ("RuntimeClass", None, "kata-qemu-rs-m")
RC_M = "RuntimeClass kata-qemu-rs-m"
SAID = "RuntimeClass kata-qemu-rs-m: the server said no"  # the executor's line for a write that did not land
FOREIGN = f"{RC_M} exists and is not managed by this policy; left untouched"
W = st.WRITE
RESULTS = (None, *execute.RESULTS)  # None: no write was made


def _body(**spec) -> dict:
    body = example()
    body["metadata"].update(uid="0e3c9a4e-0000-4000-8000-000000000001", generation=1)
    body["spec"].update(spec)
    return body


BODY = _body()
INTENT = intent_of(BODY)
assert INTENT.desired is not None  # a valid policy: what it wants is known
DESIRED = INTENT.desired


def _live() -> dict:
    live = copy.deepcopy(DESIRED.owned[M])
    live["metadata"].update(uid="u1", resourceVersion="7")
    live["overhead"]["podFixed"]["memory"] = "1Mi"
    return live


def _action(what: str, drift: bool) -> Action:
    """An action on RuntimeClass m of each kind: a write (a replace of a changed podFixed), or one
    that writes nothing."""
    verb = Verb.REPLACE if what == W else Verb(what)
    reason = {Verb.REPLACE: Reason.DIFFERS, Verb.REPORT: Reason.DIFFERS, Verb.MISSING: Reason.CHART_MISSING,
              Verb.CONFLICT: Reason.FOREIGN, Verb.NOTHING: Reason.IN_SYNC}[verb]
    have = None if verb is Verb.MISSING else _live()
    return Action(verb, M, reason, want=DESIRED.owned[M], have=have, differences=("overhead.podFixed",),
                  drift=drift, guarded=verb is Verb.MISSING)


def _conclude(actions=(), results=None, **gathered) -> st.Conclusion:
    outcome = Outcome()
    for key, result in (results or {}).items():
        outcome.results[key] = result
        if result.status == DONE:
            outcome.landed.append(result.text)
    intent = gathered.pop("intent", INTENT)
    return st.conclude(Gathered(body=gathered.pop("body", BODY), trigger="resync", intent=intent, **gathered),
                       Plan(intent, tuple(actions)), outcome)


# --- one action's outcome ----------------------------------------------------------------------------

LINES = ("conflicts", "missing", "drifted", "refused", "failed")
NOTHING_SAID: tuple[dict[str, list[str]], list[tuple[str, str, str]], dict[str, int], str] = ({}, [], {}, cond.REASON_IN_SYNC)

# (a write or the verb of an action writing nothing, the executor's result, undoes a hand edit) ->
# (the status's lines, the events, the drift counters added, the InSync reason).
EXPECTED: dict[tuple[str, str | None, bool], tuple[dict[str, list[str]], list[tuple[str, str, str]], dict[str, int], str]] = {
    (W, DONE, True): ({}, [("Normal", cond.EVENT_DRIFT_CORRECTED,
                            f"{RC_M} was changed by hand (overhead.podFixed); updated from the policy")],
                      {"driftCorrections": 1}, cond.REASON_IN_SYNC),
    (W, DONE, False): ({}, [("Normal", cond.EVENT_APPLIED, f"updated {RC_M}")], {}, cond.REASON_IN_SYNC),
    **{(W, CONFLICTED, drift): ({"conflicts": [SAID]}, [("Warning", cond.EVENT_CONFLICT, SAID)], {},
                                cond.REASON_CONFLICT) for drift in (True, False)},
    **{(W, REFUSED, drift): ({"refused": [SAID]}, [], {}, cond.REASON_REFUSED) for drift in (True, False)},
    **{(W, FAILED, drift): ({"failed": [SAID]}, [("Warning", cond.EVENT_WRITE_FAILED, SAID)], {},
                            cond.REASON_OUTPUT_NAMESPACE_MISSING) for drift in (True, False)},
    **{(W, GONE, drift): ({"missing": ["kata-qemu-rs-m"]}, [], {}, cond.REASON_RUNTIME_CLASS_MISSING)
       for drift in (True, False)},
    **{(W, result, drift): NOTHING_SAID for result in (None, UNCHANGED, ERROR) for drift in (True, False)},
    **{("nothing", None, drift): NOTHING_SAID for drift in (True, False)},
    **{("conflict", None, drift): ({"conflicts": [FOREIGN]}, [("Warning", cond.EVENT_CONFLICT, FOREIGN)], {},
                                   cond.REASON_CONFLICT) for drift in (True, False)},
    ("missing", None, True): ({"missing": ["kata-qemu-rs-m"]}, [("Warning", cond.EVENT_DRIFT_DETECTED, (
        f"{RC_M} was deleted; the kata-deploy chart creates it from the values overlay (helm upgrade), not the "
        "operator (managedBy: KataDeploy)"))], {"driftDetected": 1}, cond.REASON_RUNTIME_CLASS_MISSING),
    # Not created yet (the chart has not been applied): the status says so, no event.
    ("missing", None, False): ({"missing": ["kata-qemu-rs-m"]}, [], {}, cond.REASON_RUNTIME_CLASS_MISSING),
    ("report", None, True): ({"drifted": [f"{RC_M}: overhead.podFixed"]}, [("Warning", cond.EVENT_DRIFT_DETECTED, (
        f"{RC_M} differs from the policy (overhead.podFixed); driftPolicy is Correct, not corrected"))],
        {"driftDetected": 1}, cond.REASON_DRIFT_REPORTED),
    # Found by a first pass: reported, but nothing says it was a hand edit, so not counted.
    ("report", None, False): ({"drifted": [f"{RC_M}: overhead.podFixed"]}, [("Warning", cond.EVENT_DRIFT_DETECTED, (
        f"{RC_M} differs from the policy (overhead.podFixed); driftPolicy is Correct, not corrected"))],
        {}, cond.REASON_DRIFT_REPORTED),
}


def test_the_table_holds_every_combination():
    writes = {(W, result, drift) for result in RESULTS for drift in (True, False)}
    others = {(verb.value, None, drift) for verb in Verb if verb not in WRITES for drift in (True, False)}
    assert set(st.ACTION_OUTCOMES) == writes | others == set(EXPECTED)


@pytest.mark.parametrize("row", list(EXPECTED), ids=["-".join(str(part) for part in row) for row in EXPECTED])
def test_what_an_outcome_says(row):
    what, result, drift = row
    lines, events, counts, in_sync = EXPECTED[row]
    action = _action(what, drift)
    results = {M: Result(result, f"updated {RC_M}" if result == DONE else SAID)} if result else {}
    done = _conclude([action], results)
    assert {name: getattr(done.findings, name) for name in LINES if getattr(done.findings, name)} == lines
    assert list(done.events) == events
    assert dict(done.counts) == counts
    assert [kind for kind, _ in done.drift_seen] == ["RuntimeClass"] * sum(counts.values())
    conditions = {c.type: c for c in done.status.conditions}
    assert (conditions["InSync"].reason, conditions["InSync"].status == "True") == (
        in_sync, in_sync == cond.REASON_IN_SYNC)
    assert conditions["Ready"].reason == in_sync and conditions["Valid"].status == "True"


@pytest.mark.parametrize("row", [row for row, said in st.ACTION_OUTCOMES.items() if said.stands],
                         ids=lambda row: "-".join(str(part) for part in row))
def test_a_difference_left_standing_is_said_once_per_resource_version(row):
    action = _action(row[0], row[2])
    first = _conclude([action])
    again = _conclude([action], reported=first.reported, status=first.status, announced=first.announced)
    assert again.events == () and dict(again.counts) == {} and again.reported == first.reported
    assert again.status.conditions == first.status.conditions  # still reported in status
    if action.have is not None:
        edited_again = dataclasses.replace(action, have={**action.have, "metadata": {
            **action.have["metadata"], "resourceVersion": "8"}})
        news = _conclude([edited_again], reported=first.reported, status=first.status, announced=first.announced)
        assert news.events == first.events and news.counts == first.counts


# --- the InSync reason when several hold ------------------------------------------------------------

# docs/operation.md (Status): the order in which InSync False says why.
IN_SYNC_REASONS = [cond.REASON_NOT_APPLIED, cond.REASON_CONFLICT, cond.REASON_RUNTIME_CLASS_MISSING,
                   cond.REASON_OUTPUT_NAMESPACE_MISSING, cond.REASON_REFUSED, cond.REASON_DRIFT_REPORTED]


@pytest.mark.parametrize("first", range(len(st.IN_SYNC_ORDER)))
def test_in_sync_says_the_first_reason_that_holds(first):
    assert [reason for _, reason, _ in st.IN_SYNC_ORDER] == IN_SYNC_REASONS
    holding = {name: [f"{name} line"] for name, _, _ in st.IN_SYNC_ORDER[first:]}
    status = st.compute_status(KataSizingPolicyStatus(), 1, st.Findings(**holding), None)
    conditions = {c.type: c for c in status.conditions}
    name, reason, _ = st.IN_SYNC_ORDER[first]
    assert (conditions["InSync"].status, conditions["InSync"].reason) == ("False", reason)
    assert conditions["Ready"].status == "False"
    if name == "invalid":
        assert (conditions["Valid"].reason, conditions["Ready"].reason) == (cond.REASON_INVALID, cond.REASON_INVALID)
    else:
        assert f"{name} line" in conditions["InSync"].message and conditions["Ready"].reason == reason


# --- the events of a pass as a whole: news once ------------------------------------------------------

KATA_QEMU = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "kata-qemu"},
             "handler": "kata-qemu", "overhead": {"podFixed": {"cpu": "10m", "memory": "10Mi"}}}
POD_FINDING = {"pod": "ns/big", "runtimeClass": "kata-qemu-rs-s", "class": "s", "rule": "pod-envelope-exceeded",
               "action": "Warn", "message": "memory 4Gi is above class s's 512Mi"}
ROUTED_BY_WEBHOOK = _body(admission={"routing": "Webhook"})


def _news(reason: str, present: bool) -> dict:
    """What a pass gathers and plans when the news of `reason` holds (or, not `present`, when what
    it was about is gone)."""
    if reason == cond.EVENT_UNMANAGED:
        return {"unmanaged": tuple(audit_runtime_classes([KATA_QEMU], set())) if present else ()}
    if reason == cond.EVENT_POD_AUDIT:
        return {"pod_findings": (POD_FINDING,) if present else ()}
    if reason == cond.EVENT_WARNING:
        return {"body": ROUTED_BY_WEBHOOK, "intent": intent_of(ROUTED_BY_WEBHOOK), "webhook_serving": not present}
    if reason == cond.EVENT_CONFLICT:
        return {"actions": [_action("conflict", False)] if present else []}
    action = _action(W, False)
    return {"actions": [action], "results": {M: Result(FAILED, SAID) if present else Result(DONE, f"updated {RC_M}")}}


# reason -> (the event's type and the start of its message; posted again by a replica that restarts
# while it holds, when the status already shows it)
NEWS = {
    cond.EVENT_UNMANAGED: ("Warning", "2 finding(s) on Kata RuntimeClasses no policy manages (1 error(s))", False),
    cond.EVENT_POD_AUDIT: ("Warning", "1 Kata pod(s) outside their class (1 pod-envelope-exceeded on class s)",
                           False),
    cond.EVENT_WARNING: ("Warning", "admission: opted-in pods are routed by the operator's webhook here", False),
    cond.EVENT_CONFLICT: ("Warning", FOREIGN, False),
    cond.EVENT_WRITE_FAILED: ("Warning", SAID, True),
}


def _posted(done: st.Conclusion, reason: str) -> list[tuple[str, str]]:
    return [(type_, message) for type_, said, message in done.events if said == reason]


@pytest.mark.parametrize("reason", list(NEWS))
def test_an_event_of_the_pass_is_posted_when_it_is_news(reason):
    type_, message, after_restart = NEWS[reason]
    first = _conclude(**_news(reason, True))
    [(posted_type, posted)] = _posted(first, reason)
    assert posted_type == type_ and posted.startswith(message)
    # The next pass, the status written: nothing new.
    kept = {"status": first.status, "announced": first.announced}
    assert _posted(_conclude(**_news(reason, True), **kept), reason) == []
    # A replica that restarts (or a new leader) finds the status saying it already.
    assert bool(_posted(_conclude(**_news(reason, True), status=first.status), reason)) is after_restart
    # Gone, then back: news again.
    gone = _conclude(**_news(reason, False), **kept)
    assert _posted(gone, reason) == []
    back = _conclude(**_news(reason, True), status=gone.status, announced=gone.announced)
    assert [posted_type for posted_type, _ in _posted(back, reason)] == [type_]


def test_an_invalid_generation_is_said_once_and_leaves_the_sizing_in_status():
    valid = _conclude()
    invalid = _body(classes=[{"name": "s", "cpu": "1", "memory": "512Mi", "podFixed": {"cpu": "1", "memory": "1Mi"}}])
    invalid["metadata"]["generation"] = 2
    first = _conclude(body=invalid, intent=intent_of(invalid), status=valid.status)
    [(type_, reason, message)] = first.events
    assert (type_, reason) == ("Warning", cond.EVENT_INVALID) and "podFixed.memory" in message
    assert first.status.classes == valid.status.classes and first.status.observed_generation == 2
    assert _conclude(body=invalid, intent=intent_of(invalid), status=first.status).events == ()


def test_several_landed_writes_are_one_applied_event_and_each_correction_its_own():
    other = ("RuntimeClass", None, "kata-qemu-rs-s")
    actions = [_action(W, False), dataclasses.replace(_action(W, False), key=other),
               _action(W, True), dataclasses.replace(_action(W, True), key=other)]
    keys = [M, other]
    applied = _conclude(actions[:2], {k: Result(DONE, f"updated {k[0]} {k[2]}") for k in keys})
    assert [(t, r) for t, r, _ in applied.events] == [("Normal", cond.EVENT_APPLIED)]
    assert applied.events[0][2] == "updated RuntimeClass kata-qemu-rs-m; updated RuntimeClass kata-qemu-rs-s"
    corrected = _conclude(actions[2:], {k: Result(DONE, f"updated {k[0]} {k[2]}") for k in keys})
    assert [(t, r) for t, r, _ in corrected.events] == [("Normal", cond.EVENT_DRIFT_CORRECTED)] * 2
    assert dict(corrected.counts) == {"driftCorrections": 2}


# --- the status is built through validated constructors --------------------------------------------


def test_a_status_replaced_with_a_misspelt_or_mistyped_field_fails():
    status = st.compute_status(KataSizingPolicyStatus(), 1, st.Findings(), None)
    assert status.replaced(observed_generation=2).observed_generation == 2
    with pytest.raises(ValidationError, match="obsreved_generation"):
        status.replaced(obsreved_generation=2)
    with pytest.raises(ValidationError, match="runtime"):
        status.replaced(runtime="Java")
    condition = Condition(type="Ready", status="True", reason="InSync")
    assert condition.replaced(last_transition_time="T1").last_transition_time == "T1"
    with pytest.raises(ValidationError, match="last_transtion_time"):
        condition.replaced(last_transtion_time="T1")
