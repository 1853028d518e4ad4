"""The admission objects of issue 10 when the API server misbehaves (the emulator: faults on
demand), and on a server that serves no MutatingAdmissionPolicy. What the real server decides about
them (defaults, ownerReferences, the garbage collector, RBAC) is tests/api/test_real_admission_operator.py's."""

from __future__ import annotations

import re

import pytest

from kata_sizing.controller import conditions as cond
from kata_sizing.core.podfit import KEEP_ALIVE_NAMES, SHARED_NAMES
from tests.support.fixtures import operator_cluster
from tests.support.harness.emulator import default_resources
from tests.support.operator_helpers import (
    counter,
    edit,
    event_messages,
    settle,
    status,
    wait_for,
    wait_observed,
)
from tests.support.policies import explicit_classes_policy

pytestmark = pytest.mark.emulator

NAME = "gate"
ADMISSION = "admissionregistration.k8s.io/v1"
VAP = f"{ADMISSION}/validatingadmissionpolicies"
VAPB = f"{ADMISSION}/validatingadmissionpolicybindings"
MAP = f"{ADMISSION}/mutatingadmissionpolicies"
MAPB = f"{ADMISSION}/mutatingadmissionpolicybindings"
VAP_PATH = re.compile(r"^/apis/admissionregistration\.k8s\.io/v1/validatingadmissionpolicies")
# The shared admission policies, and the policy's bindings of them (and the install's keep-alive
# bindings, which the operator puts back like the shared policies).
NAMES = {VAP: {SHARED_NAMES["envelope"], SHARED_NAMES["memory"]},
         VAPB: {"kata-sizing-gate-envelope", "kata-sizing-gate-memory-limit",
                KEEP_ALIVE_NAMES["envelope"], KEEP_ALIVE_NAMES["memory"]},
         MAP: {SHARED_NAMES["route"]}, MAPB: {"kata-sizing-gate-route", KEEP_ALIVE_NAMES["route"]}}


def admission_names(emu, policy: str = NAME) -> dict[str, set[str]]:
    found = {}
    for kind in NAMES:
        try:
            found[kind] = {o["metadata"]["name"] for selector in (f"katasizing.dev/policy={policy}",
                                                                  "katasizing.dev/shared=admission")
                           for o in emu.objects(kind).list(label_selector=selector)}
        except Exception:  # noqa: BLE001 - a kind this emulator does not serve
            continue
    return {k: v for k, v in found.items() if v}


def test_a_burst_of_server_errors_on_admission_policy_writes_backs_off_and_then_writes_them_all(cluster):
    emu = cluster.emu
    burst = emu.fail_next(3, status=500, method="POST", path="/validatingadmissionpolicies")
    cluster.start()
    cluster.create(explicit_classes_policy(NAME))
    wait_observed(emu, NAME, timeout=15, Ready="True")
    settle(emu)
    assert burst.hits == 3
    assert admission_names(emu) == NAMES
    # One retry per failure, through the back-off: 3 failed + 2 created.
    assert [r.status for r in emu.requests("POST", VAP_PATH)].count(201) == 2
    assert len(emu.requests("POST", VAP_PATH)) == 5


def test_a_lost_race_while_correcting_an_admission_binding_rereads_and_retries(cluster):
    emu = cluster.emu
    cluster.start()
    cluster.create(explicit_classes_policy(NAME))
    wait_observed(emu, NAME, Ready="True")
    settle(emu)
    name = "kata-sizing-gate-envelope"
    race = emu.conflict_next(1, method="PUT", path=f"/validatingadmissionpolicybindings/{name}")
    edit(emu, VAPB, name, lambda o: o["spec"].update(validationActions=["Audit"]))
    wait_for(lambda: emu.objects(VAPB).get(name)["spec"]["validationActions"] == ["Deny"], 5)
    wait_for(lambda: counter(emu, NAME, "driftCorrections") == 1, 5)
    settle(emu)
    assert race.hits == 1
    assert [r.status for r in emu.requests("PUT", f"/validatingadmissionpolicybindings/{name}")] == [409, 200]
    # The event is posted by kopf's poster, after the status write.
    wait_for(lambda: event_messages(emu, cond.EVENT_DRIFT_CORRECTED), 5)
    assert len(event_messages(emu, cond.EVENT_DRIFT_CORRECTED)) == 1


def test_after_a_dropped_watch_a_deleted_admission_policy_is_still_recreated(cluster):
    emu = cluster.emu
    cluster.start()
    cluster.create(explicit_classes_policy(NAME))
    wait_observed(emu, NAME, Ready="True")
    settle(emu)
    assert emu.drop_watches(MAP) >= 1
    # The routing policy every policy binds: a pass of the policy that binds it puts it back.
    emu.objects(MAP).delete(SHARED_NAMES["route"])
    wait_for(lambda: emu.objects(MAP).get(SHARED_NAMES["route"]), 10)
    wait_for(lambda: counter(emu, NAME, "driftCorrections") == 1, 5)


@pytest.fixture
def cluster_without_mutating_admission_policy(tmp_path, monkeypatch):
    """A server as Kubernetes 1.30 to 1.33 serve: ValidatingAdmissionPolicy, no MutatingAdmissionPolicy."""
    resources = {k: v for k, v in default_resources().items() if "mutatingadmissionpolic" not in k}
    yield from operator_cluster(tmp_path, monkeypatch, resources=resources)


def test_without_a_mutating_admission_policy_served_auto_routing_leaves_it_to_the_webhook(
        cluster_without_mutating_admission_policy):
    cluster = cluster_without_mutating_admission_policy
    emu = cluster.emu
    cluster.start()
    cluster.create(explicit_classes_policy(NAME))
    cluster.create(explicit_classes_policy("insists", admission={"routing": "MutatingAdmissionPolicy"}))
    wait_observed(emu, NAME, Ready="True")
    # The validating policies are written; the routing is the webhook's, which this operator
    # (started without --webhook-port) does not serve: the status says so, once.
    assert admission_names(emu) == {VAP: NAMES[VAP], VAPB: NAMES[VAPB]}
    assert [w for w in status(emu, NAME).get("warnings") or [] if "--webhook-port" in w] == [
        w for w in status(emu, NAME)["warnings"] if w.startswith("admission:")]
    assert len(status(emu, NAME)["warnings"]) == 1
    # A policy that asks for the MutatingAdmissionPolicy by name is told it cannot have one.
    wait_observed(emu, "insists", Ready="True")
    warnings = status(emu, "insists").get("warnings") or []
    assert any(f"does not serve MutatingAdmissionPolicy {SHARED_NAMES['route']}" in w for w in warnings), warnings
    assert any("does not serve MutatingAdmissionPolicyBinding kata-sizing-insists-route" in w for w in warnings)
