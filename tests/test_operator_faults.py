"""The operator when the API server misbehaves: server errors back off and retry, lost races
re-read and retry, broken watches reconnect, slow requests time out and retry."""

from __future__ import annotations

import pytest

from kata_sizing import conditions as cond
from kata_sizing import kube
from tests.operator_helpers import (
    RC_PATH, RUNTIME_CLASSES, config_maps, counter, edit, event_messages, example, pod_fixed, runtime_classes,
    settle, wait_for, wait_observed,
)

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
    assert len(config_maps(emu)) == 3
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
    slow = emu.add_latency(2.0, method="POST", path="/runtimeclasses", count=1)
    cluster.start()
    cluster.create(example())

    wait_observed(emu, NAME, timeout=10, Ready="True")
    settle(emu)
    assert slow.hits == 1
    assert set(runtime_classes(emu)) == RC_NAMES
