"""Two replicas of the operator against the emulator: one holds the Lease and writes, the other
waits; a clean stop hands over at once, a killed leader's Lease expires and the other replica
finishes its work with no object made twice. Which replica sent a request is in its
User-Agent (`kata-sizing/<identity>`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import kopf
import pytest

from kata_sizing.controller import conditions as cond
from kata_sizing.controller import handlers
from kata_sizing.controller.leader import LeaseOptions
from tests.support.harness import KopfThread
from tests.support.operator_helpers import (
    CM_PATH,
    LEASE_PATH,
    RC_PATH,
    RUNTIME_CLASSES,
    config_maps,
    counter,
    edit,
    event_messages,
    pod_fixed,
    runtime_classes,
    settle,
    stays,
    terminate,
    wait_for,
    wait_observed,
)
from tests.support.policies import example

pytestmark = pytest.mark.emulator

NAME = "qemu-rs"
RC_NAMES = {f"kata-qemu-rs-{c}" for c in ("s", "m", "l", "xl")}
CM_NAMES = {f"{NAME}-kata-deploy-values", f"{NAME}-dropins", f"{NAME}-node-guidance"}
LEASE_NS = "kata-sizing"
# Short, to keep the tests quick; the order (retry < renew deadline < duration) is client-go's.
# Two operators in one process share the GIL, so a busy pass can delay the other's renewal.
LEASE_S, RENEW_S, RETRY_S = 4.0, 3.0, 0.25


def lease_holder(emu) -> str | None:
    lease = emu.objects("leases").get("kata-sizing", LEASE_NS)
    return ((lease or {}).get("spec") or {}).get("holderIdentity")


def replica(emu, identity: str) -> KopfThread:
    options = LeaseOptions(namespace=LEASE_NS, identity=identity, lease_duration_s=LEASE_S,
                           renew_deadline_s=RENEW_S, retry_period_s=RETRY_S)
    return KopfThread(emu.kubeconfig, registry=handlers.build_registry(), memo=kopf.Memo(lease=options))


def by(identity: str):
    return lambda r: r.user_agent == f"kata-sizing/{identity}"


def test_one_replica_writes_while_the_other_waits_and_a_clean_stop_hands_over_at_once(cluster):
    emu = cluster.emu  # the emulator only; the replicas are started here
    first = replica(emu, "a")
    first.start()
    second = None
    try:
        wait_for(lambda: lease_holder(emu) == "a", 5)
        second = replica(emu, "b")
        second.start()
        stays(lambda: lease_holder(emu) == "a", 1.0, "the second replica took a Lease that was being renewed")

        emu.objects("katasizingpolicies").create(example())
        wait_observed(emu, NAME, Ready="True")
        settle(emu)
        assert set(runtime_classes(emu)) == RC_NAMES and set(config_maps(emu)) == CM_NAMES
        creates = [r for r in emu.write_requests(RC_PATH) if r.method == "POST"]
        assert sorted(r.status for r in creates) == [201] * 4, "a RuntimeClass was created twice"
        # The follower wrote nothing at all: not a child, not the Lease.
        assert emu.write_requests(), "nothing was written at all"
        assert [r for r in emu.write_requests() if by("b")(r)] == []

        name = "kata-qemu-rs-m"
        original = pod_fixed(emu, name)
        emu.reset_request_log()
        edit(emu, RUNTIME_CLASSES, name, lambda o: o["overhead"]["podFixed"].update(memory="1Mi"))
        wait_for(lambda: pod_fixed(emu, name) == original, 5)
        wait_for(lambda: counter(emu, NAME, "driftCorrections") == 1, 5)
        settle(emu)
        puts = [r for r in emu.write_requests(f"/runtimeclasses/{name}")]
        assert [(r.method, r.user_agent) for r in puts] == [("PUT", "kata-sizing/a")]
        # The event is posted by kopf's poster, after the status write.
        wait_for(lambda: event_messages(emu, cond.EVENT_DRIFT_CORRECTED), 5)
        assert len(event_messages(emu, cond.EVENT_DRIFT_CORRECTED)) == 1

        # A rolling update: the old leader stops cleanly and releases; the other takes over within
        # a retry period or two, not after the lease duration, and corrects drift from then on.
        stopped = time.monotonic()
        first.stop()
        wait_for(lambda: lease_holder(emu) == "b", LEASE_S)
        assert time.monotonic() - stopped < LEASE_S
        emu.reset_request_log()
        edit(emu, RUNTIME_CLASSES, name, lambda o: o["overhead"]["podFixed"].update(memory="2Mi"))
        wait_for(lambda: pod_fixed(emu, name) == original, 5)
        settle(emu)
        assert {r.user_agent for r in emu.write_requests(RC_PATH)} == {"kata-sizing/b"}
        assert set(runtime_classes(emu)) == RC_NAMES
    finally:
        first.stop()
        if second is not None:
            second.stop()


def _spawn(kubeconfig: Path, identity: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_NAME": identity, "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kata_sizing.cli", "operator", "--standalone", "--leader-elect",
             "--lease-duration", str(LEASE_S), "--renew-deadline", str(RENEW_S), "--retry-period", str(RETRY_S)],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def test_a_leader_killed_mid_reconcile_is_replaced_and_nothing_is_made_twice(cluster, tmp_path):
    emu = cluster.emu  # the emulator only; the replicas are started here
    # Slow creates, so the kill lands in the middle of the first pass (a pass writes a few of
    # its objects at once, so the pass needs more of them than it writes at once).
    emu.add_latency(0.4, method="POST", path="/runtimeclasses|/configmaps")
    procs = []
    try:
        procs.append(_spawn(emu.kubeconfig, "a", tmp_path / "a.log"))
        wait_for(lambda: (lease_holder(emu) or "").startswith("a_"), 20, "the first replica never led")
        leader = lease_holder(emu)
        procs.append(_spawn(emu.kubeconfig, "b", tmp_path / "b.log"))
        wait_for(lambda: any(by_prefix(r, "b") for r in emu.request_log), 20, "the second replica never started")

        emu.objects("katasizingpolicies").create(example())
        wait_for(lambda: any(r.status == 201 for path in (RC_PATH, CM_PATH) for r in emu.requests("POST", path)), 10)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        at_kill = len(emu.request_log)
        created_by_a = {r.body["metadata"]["name"] for r in emu.request_log
                        if r.method == "POST" and r.status == 201 and r.body
                        and r.body.get("kind") in ("RuntimeClass", "ConfigMap")}
        assert 0 < len(created_by_a) < len(RC_NAMES | CM_NAMES), "the kill did not land mid-pass"

        wait_for(lambda: (lease_holder(emu) or "").startswith("b_"), 3 * LEASE_S, "the Lease was not taken over")
        assert lease_holder(emu) != leader
        wait_observed(emu, NAME, timeout=15, Ready="True")
        settle(emu)
        assert set(runtime_classes(emu)) == RC_NAMES and set(config_maps(emu)) == CM_NAMES
        creates = [r for r in emu.requests("POST", RC_PATH) if r.status == 201]
        assert sorted(r.body["metadata"]["name"] for r in creates) == sorted(RC_NAMES), "made twice or lost"
        assert not emu.requests("DELETE", RC_PATH), "an object was deleted and made again"
        # While the first replica lived the second wrote nothing; afterwards it wrote only once it
        # held the Lease (its Lease PUT comes before its first other write).
        log = emu.request_log
        b_writes = [i for i, r in enumerate(log) if r.is_write and by_prefix(r, "b")]
        assert b_writes and min(b_writes) >= at_kill
        lease_taken = min(i for i in b_writes if LEASE_PATH.search(log[i].path))
        assert all(i > lease_taken for i in b_writes if not LEASE_PATH.search(log[i].path))
    finally:
        for proc in procs:
            terminate(proc, 15)
    for _, name in zip(procs[1:], ["b"]):
        text = (tmp_path / f"{name}.log").read_text()
        assert "connector is None" not in text and "Traceback" not in text, text[-3000:]


def by_prefix(record, identity: str) -> bool:
    return record.user_agent.startswith(f"kata-sizing/{identity}_")


def test_the_waiting_replica_serves_the_webhook_and_keeps_serving_through_a_handover(cluster, tmp_path):
    """A rolling update stops the leader while the other pod serves admission: every review
    posted to the other replica during the handover is answered, before and after it leads."""
    import threading

    from kata_sizing.controller.operator_main import WebhookOptions, configure_webhook
    from kata_sizing.controller.policy_webhook import admission_problems
    from tests.support.webhook import Webhook, free_port, invalid_body, write_self_signed_cert

    emu = cluster.emu
    cert, key = write_self_signed_cert(tmp_path)

    def serving(identity: str) -> tuple[KopfThread, Webhook]:
        port = free_port()
        options = WebhookOptions(port=port, certfile=str(cert), pkeyfile=str(key), addr="127.0.0.1")
        lease = LeaseOptions(namespace=LEASE_NS, identity=identity, lease_duration_s=LEASE_S,
                             renew_deadline_s=RENEW_S, retry_period_s=RETRY_S)
        thread = KopfThread(emu.kubeconfig, registry=handlers.build_registry(admission=True),
                            settings_hook=lambda s: configure_webhook(s, options), memo=kopf.Memo(lease=lease))
        return thread, Webhook(emu, port, cert)

    leader, _ = serving("a")
    follower, hook = serving("b")
    leader.start()
    try:
        wait_for(lambda: lease_holder(emu) == "a", 5)
        follower.start()
        hook.wait_until_serving()
        errors, _ = admission_problems(invalid_body())
        refused = hook.review("CREATE", invalid_body())
        assert refused["allowed"] is False and refused["status"]["message"] == "; ".join(errors)
        assert hook.review("CREATE", example())["allowed"] is True
        assert lease_holder(emu) == "a", "answering admission made the follower take the Lease"

        answers: list[bool] = []
        stop = threading.Event()

        def keep_reviewing() -> None:
            while not stop.is_set():
                answers.append(hook.review("CREATE", invalid_body())["allowed"] is False)

        reviewer = threading.Thread(target=keep_reviewing)
        reviewer.start()
        try:
            leader.stop()
            wait_for(lambda: lease_holder(emu) == "b", LEASE_S)
            time.sleep(0.3)
        finally:
            stop.set()
            reviewer.join(10)
        assert len(answers) >= 5 and all(answers), answers
    finally:
        leader.stop()
        follower.stop()
