"""The operator when the API server misbehaves: server errors back off and retry, lost races
re-read and retry, broken watches reconnect, slow requests time out and retry."""

from __future__ import annotations

import time

import pytest

from kata_sizing.controller import conditions as cond
from kata_sizing.controller import kube
from tests.support.operator_helpers import (
    CONFIG_MAPS,
    OUTPUT_NAMESPACE,
    RC_PATH,
    RUNTIME_CLASSES,
    config_maps,
    counter,
    edit,
    event_messages,
    get_cm,
    pod_fixed,
    runtime_classes,
    settle,
    stays,
    wait_for,
    wait_observed,
)
from tests.support.policies import example

pytestmark = pytest.mark.emulator

NAME = "qemu-rs"
RC_NAMES = {f"kata-qemu-rs-{c}" for c in ("s", "m", "l", "xl")}


def _rc_memory(obj):
    obj["overhead"]["podFixed"]["memory"] = "1Mi"


def test_a_burst_of_server_errors_on_runtime_class_writes_backs_off_and_then_applies_everything(cluster):
    emu = cluster.emu
    burst = emu.fail_next(3, status=500, method="POST", path="/runtimeclasses")
    cluster.start()
    cluster.create(example())

    wait_observed(emu, NAME, timeout=10, Ready="True", InSync="True")
    settle(emu)
    assert burst.hits == 3
    assert set(runtime_classes(emu)) == RC_NAMES
    assert len(config_maps(emu)) == 3  # values, drop-ins (with the admission parameters), guidance
    failed = [r for r in emu.requests("POST", RC_PATH) if r.status == 500]
    assert len(failed) == 3
    # One retry per failure, through the back-off, not a tight loop.
    assert len(emu.requests("POST", RC_PATH)) == 3 + len(RC_NAMES)


def test_a_lost_race_while_correcting_drift_rereads_and_retries(cluster):
    emu = cluster.emu
    cluster.start()
    cluster.create(example())
    wait_observed(emu, NAME, Ready="True")
    settle(emu)
    name = "kata-qemu-rs-m"
    original = pod_fixed(emu, name)
    race = emu.conflict_next(1, method="PUT", path=f"/runtimeclasses/{name}")

    edit(emu, RUNTIME_CLASSES, name, _rc_memory)

    wait_for(lambda: pod_fixed(emu, name) == original, 5)
    wait_for(lambda: counter(emu, NAME, "driftCorrections") == 1, 5)
    settle(emu)
    assert race.hits == 1
    puts = [(r.status) for r in emu.requests("PUT", f"/runtimeclasses/{name}")]
    assert puts == [409, 200]
    assert emu.requests("GET", f"^/apis/node.k8s.io/v1/runtimeclasses/{name}$"), "no re-read after the 409"
    # The event is posted by kopf's poster, after the status write.
    wait_for(lambda: event_messages(emu, cond.EVENT_DRIFT_CORRECTED), 5)
    assert len(event_messages(emu, cond.EVENT_DRIFT_CORRECTED)) == 1


def test_a_conflict_on_the_drift_counter_is_retried_without_losing_the_count(cluster):
    emu = cluster.emu
    cluster.start()
    cluster.create(example())
    wait_observed(emu, NAME, Ready="True")
    settle(emu)
    race = emu.conflict_next(1, method="PATCH", path=r"/katasizingpolicies/qemu-rs/status")

    edit(emu, RUNTIME_CLASSES, "kata-qemu-rs-s", _rc_memory)
    wait_for(lambda: counter(emu, NAME, "driftCorrections") == 1, 5)
    edit(emu, RUNTIME_CLASSES, "kata-qemu-rs-l", _rc_memory)
    wait_for(lambda: counter(emu, NAME, "driftCorrections") == 2, 5)
    assert race.hits == 1


def test_after_a_dropped_watch_a_hand_edit_is_still_corrected(cluster):
    emu = cluster.emu
    cluster.start()
    cluster.create(example())
    wait_observed(emu, NAME, Ready="True")
    settle(emu)
    watches_before = len([r for r in emu.request_log if r.is_watch and RC_PATH.search(r.path)])

    assert emu.drop_watches() >= 3
    name = "kata-qemu-rs-xl"
    original = pod_fixed(emu, name)
    edit(emu, RUNTIME_CLASSES, name, _rc_memory)

    wait_for(lambda: pod_fixed(emu, name) == original, 5)
    wait_for(lambda: len([r for r in emu.request_log if r.is_watch and RC_PATH.search(r.path)]) > watches_before,
             5, "kopf did not watch RuntimeClasses again")
    wait_for(lambda: counter(emu, NAME, "driftCorrections") == 1, 5)


def test_a_request_slower_than_the_client_timeout_is_retried(cluster, monkeypatch):
    emu = cluster.emu
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT_S", 0.5)
    monkeypatch.setattr(kube, "WRITE_TIMEOUT_S", 0.5)
    slow = emu.add_latency(2.0, method="POST", path="/runtimeclasses", count=1)
    cluster.start()
    cluster.create(example())

    wait_observed(emu, NAME, timeout=10, Ready="True")
    settle(emu)
    assert slow.hits == 1
    assert set(runtime_classes(emu)) == RC_NAMES


# --- level-triggered recovery: nothing waits for the periodic resync ------------------------

# Functional bounds, far below the 300 s resync the tests run with: the back-off is capped
# exponential with jitter, so once a burst ends the next attempt comes within about the
# burst's own length. How fast is the bench's business.
BURST_S = 3.0
AFTER_BURST_S = 2 * BURST_S + 1


def test_a_hand_edit_during_a_burst_of_server_errors_is_restored_soon_after_the_burst(cluster):
    emu = cluster.emu
    cluster.start()  # resync every 300 s: only the retries can restore the edit in time
    cluster.create(example())
    wait_observed(emu, NAME, Ready="True")
    settle(emu)
    name = "kata-qemu-rs-m"
    original = pod_fixed(emu, name)

    burst = emu.fail_next(None, status=500, path="/runtimeclasses")  # every RuntimeClass request
    edit(emu, RUNTIME_CLASSES, name, _rc_memory)
    wait_for(lambda: burst.hits >= 3, BURST_S, "the operator did not retry during the burst")
    stays(lambda: pod_fixed(emu, name)["memory"] == "1Mi", BURST_S - 0.5, "restored while every request failed")
    emu.clear_faults()
    ended = time.monotonic()

    wait_for(lambda: pod_fixed(emu, name) == original, AFTER_BURST_S, "the edit stayed after the burst ended")
    assert time.monotonic() - ended < AFTER_BURST_S
    wait_for(lambda: counter(emu, NAME, "driftCorrections") == 1, 5)
    failed_puts = [r for r in emu.requests("PUT", RC_PATH) if r.status == 500]
    assert len(failed_puts) >= 3, "not retried while the burst lasted"
    # Backed off, not a tight loop: a few attempts a second at most.
    assert len(failed_puts) < 6 * BURST_S
    # The event is posted by kopf's poster, after the status write.
    wait_for(lambda: event_messages(emu, cond.EVENT_DRIFT_CORRECTED), 5)
    assert len(event_messages(emu, cond.EVENT_DRIFT_CORRECTED)) == 1


@pytest.mark.parametrize("status", [429, 503])
def test_throttling_and_unavailability_while_correcting_are_retried_until_they_clear(cluster, status):
    emu = cluster.emu
    cluster.start()
    cluster.create(example())
    wait_observed(emu, NAME, Ready="True")
    settle(emu)
    # Four in a row (backed off 0.2, 0.4, 0.8, 1.6 s): more than one retry's worth, within the suite's time.
    failures = emu.fail_next(4, status=status, method="PUT", path="/configmaps/")
    edit(emu, CONFIG_MAPS, f"{NAME}-dropins", lambda o: o["data"].update({"m.toml": "#"}), OUTPUT_NAMESPACE)
    wait_for(lambda: get_cm(emu, f"{NAME}-dropins")["data"]["m.toml"] != "#", 15,
             "four refusals in a row made the operator give up")
    assert failures.hits == 4


def test_a_dropped_connection_while_correcting_is_retried(cluster, monkeypatch):
    emu = cluster.emu
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT_S", 0.5)
    monkeypatch.setattr(kube, "WRITE_TIMEOUT_S", 0.5)
    cluster.start()
    cluster.create(example())
    wait_observed(emu, NAME, Ready="True")
    settle(emu)
    name = "kata-qemu-rs-s"
    original = pod_fixed(emu, name)
    slow = emu.add_latency(2.0, method="PUT", path=f"/runtimeclasses/{name}", count=3)  # client gives up each time
    edit(emu, RUNTIME_CLASSES, name, _rc_memory)
    wait_for(lambda: pod_fixed(emu, name) == original, 15)
    assert slow.hits == 3


def test_a_failed_guidance_pass_is_retried_without_waiting_for_the_next_change(cluster, monkeypatch):
    from kata_sizing.controller import worker

    monkeypatch.setattr(worker, "GUIDANCE_INTERVAL_S", 0.3)
    emu = cluster.emu
    emu.objects("nodes").create(_node("n1", "256Gi"))
    cluster.start()
    cluster.create(example())
    wait_observed(emu, NAME, Ready="True")
    wait_for(lambda: "n1" in str(get_cm(emu, f"{NAME}-node-guidance")["data"]), 5)
    settle(emu)

    burst = emu.fail_next(4, status=500, method="PUT", path=f"/configmaps/{NAME}-node-guidance")
    emu.objects("nodes").put(_node("n1", "512Gi"))
    # Nothing else changes after the node: only a retry of the failed pass can write the new guidance.
    wait_for(lambda: "512" in str(get_cm(emu, f"{NAME}-node-guidance")["data"]), 15,
             "the guidance was not rewritten after the failed pass")
    assert burst.hits == 4


def _node(name: str, capacity: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"katacontainers.io/kata-runtime": "true"}},
            "status": {"capacity": {"memory": capacity, "cpu": "64"}, "allocatable": {"memory": capacity, "cpu": "64"}}}
