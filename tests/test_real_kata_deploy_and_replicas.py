"""Beside the kata-deploy chart and with two replicas, against the real kube-apiserver: the API
server's audit log (with each replica's User-Agent) shows who wrote what.

- RuntimeClasses shaped as the chart and Helm make them from the operator's values overlay,
  applied with the real kubectl again and again: the operator writes nothing to them, the
  chart's keys stay, and a hand edit of podFixed is still put back.
- Two leader-elected replicas: one writes, the other does not; the leader killed in the middle
  of its work is replaced once its Lease expires, and no object is created twice.
"""

from __future__ import annotations

import signal

import pytest

from tests.kata_deploy_chart import FACTS, chart_runtime_classes, instance_marker
from tests.realcluster import RUNTIME_CLASSES, WRITE_VERBS, ControlPlane, RealOperator, poll
from tests.test_real_operator import (
    NAMESPACE, cm_path, create_ready, pod_fixed, qemu_rs, quiet, rc_path, runtime_classes, wait_observed,
)

pytestmark = pytest.mark.realserver

LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/kata-sizing"
LEASE_ARGS = ("--leader-elect", "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.25")


def chart_keys_kept(obj: dict) -> bool:
    selector = obj["scheduling"]["nodeSelector"]
    meta = obj["metadata"]
    return (selector.get(instance_marker()) == "true" and selector.get(FACTS["sharedGateLabel"]) == "true"
            and meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
            and meta["annotations"]["meta.helm.sh/release-name"] == "kata-deploy")


def test_chart_runtime_classes_applied_again_and_again_get_no_operator_write(control_plane, real_operator):
    cp: ControlPlane = control_plane
    real_operator.start()
    body = qemu_rs("chart")
    body["spec"]["runtimeClass"]["managedBy"] = "KataDeploy"
    cp.apply(body)
    wait_observed(cp, "chart", InSync="False", Valid="True")
    values = cp.get(cm_path("chart-kata-deploy-values"))["data"]["values.yaml"]

    rendered = chart_runtime_classes(values)
    cp.apply(*rendered)  # helm install
    wait_observed(cp, "chart", InSync="True", Ready="True")
    quiet(cp)
    mark = cp.audit_offset()
    for _ in range(3):  # helm upgrade, Flux reconciles: the same objects applied again
        cp.apply(*chart_runtime_classes(values))
    quiet(cp)
    assert cp.operator_writes(mark, "runtimeclasses") == []
    live = runtime_classes(cp, "chart")
    assert set(live) == {o["metadata"]["name"] for o in rendered}
    assert all(chart_keys_kept(o) for o in live.values()), live

    name = sorted(live)[0]
    want = pod_fixed(cp, name)
    mark = cp.audit_offset()
    cp.edit(rc_path(name), lambda o: o["overhead"]["podFixed"].update(memory="1Mi"))
    poll(lambda: pod_fixed(cp, name) == want, 10, "the podFixed edit was not put back")
    quiet(cp)
    assert chart_keys_kept(cp.get(rc_path(name)))
    assert [(e.verb, e.name) for e in cp.operator_writes(mark, "runtimeclasses")] == [("update", name)]


def lease_holder(cp: ControlPlane) -> str:
    return ((cp.get(LEASE) or {}).get("spec") or {}).get("holderIdentity") or ""


def test_two_replicas_one_writes_and_a_leader_killed_mid_work_is_replaced_with_nothing_made_twice(
        control_plane, real_operator, tmp_path):
    cp: ControlPlane = control_plane
    mark = cp.audit_offset()
    first = real_operator.start(*LEASE_ARGS, POD_NAME="first")
    poll(lambda: lease_holder(cp).startswith("first_"), 20, "the first replica never took the Lease")
    (tmp_path / "second").mkdir()
    second = RealOperator(cp, tmp_path / "second")
    try:
        second.start(*LEASE_ARGS, POD_NAME="second")
        policies = [qemu_rs(f"fleet-{i}") for i in range(8)]
        for body in policies:
            body["spec"]["runtimeClass"]["namePrefix"] = f"kata-fleet-{body['metadata']['name'][-1]}"
        cp.apply(*policies)
        # Kill the leader once some, not all, of the 32 RuntimeClasses exist.
        poll(lambda: len(cp.items(RUNTIME_CLASSES)) >= 2, 20, "the leader created nothing", interval=0.01)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(10)
        at_kill = cp.audit_offset()
        assert len(cp.items(RUNTIME_CLASSES)) < 32, "the kill came after the leader had finished"

        poll(lambda: lease_holder(cp).startswith("second_"), 15, "the Lease was not taken over")
        for body in policies:
            wait_observed(cp, body["metadata"]["name"], timeout=30, Ready="True")
        quiet(cp)
        assert len(cp.items(RUNTIME_CLASSES)) == 32

        requests = cp.operator_requests(mark)
        creates = [e.name for e in requests if e.resource == "runtimeclasses" and e.verb == "create" and e.code == 201]
        assert sorted(creates) == sorted(cp.items(RUNTIME_CLASSES)), "a RuntimeClass was created twice or lost"
        assert not [e for e in requests if e.resource == "runtimeclasses" and e.verb == "delete"]
        # The second replica wrote nothing while the first lived, and afterwards only once it
        # held the Lease.
        after = cp.operator_requests(at_kill)
        before = requests[: len(requests) - len(after)]
        by_second = lambda e: e.user_agent.startswith("kata-sizing/second_") and e.verb in WRITE_VERBS
        assert [e for e in before if by_second(e)] == []
        writes = [(i, e) for i, e in enumerate(after) if by_second(e)]
        took = min(i for i, e in writes if e.resource == "leases")
        assert all(i > took for i, e in writes if e.resource != "leases")
    finally:
        code = second.stop()
    log = second.log()
    assert "connector is None" not in log and "Traceback" not in log, log[-3000:]
    assert code == 0, log[-3000:]
