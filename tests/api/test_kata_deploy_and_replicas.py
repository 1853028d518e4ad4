"""Beside the kata-deploy chart and with two replicas, against the real kube-apiserver: the API
server's audit log (with each replica's User-Agent) shows who wrote what.

- RuntimeClasses shaped as the chart and Helm make them from the operator's values overlay,
  applied with the real kubectl again and again: the operator writes nothing to them, the
  chart's keys stay, and a hand edit of podFixed is still put back.
- Two leader-elected replicas: one writes, the other does not; the leader killed in the middle
  of its work is replaced once its Lease expires, and no object is created twice.
- The Lease moved A -> B -> A while a chart RuntimeClass is deleted and re-created: status,
  events and metrics right on both replicas after each move.
"""

from __future__ import annotations

import signal

import pytest

from tests.support.kata_deploy_chart import FACTS, chart_runtime_classes, instance_marker
from tests.support.metrics import get, samples
from tests.support.realcluster import (
    OPERATOR_NAMESPACE,
    RUNTIME_CLASSES,
    WRITE_VERBS,
    ApiError,
    ControlPlane,
    RealOperator,
    cm_path,
    free_port,
    pod_fixed,
    poll,
    qemu_rs,
    quiet,
    rc_path,
    runtime_classes,
    wait_observed,
)

pytestmark = pytest.mark.realserver

LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases/kata-sizing"
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
        creates = [e for e in requests if e.resource == "runtimeclasses" and e.verb == "create"]
        created = [e.name for e in creates if e.code == 201]
        assert len(created) == len(set(created)), "a RuntimeClass was created twice"
        # Creates in flight when the leader was killed may have landed with no 201 in the audit
        # log (its client was gone before the answer): each object was asked for, none twice.
        assert set(created) <= set(cp.items(RUNTIME_CLASSES)) <= {e.name for e in creates}
        assert not [e for e in requests if e.resource == "runtimeclasses" and e.verb == "delete"]
        # The second replica wrote nothing while the first lived, and afterwards only once it
        # held the Lease.
        after = cp.operator_requests(at_kill)
        before = requests[: len(requests) - len(after)]
        def by_second(e) -> bool:
            return e.user_agent.startswith("kata-sizing/second_") and e.verb in WRITE_VERBS
        assert [e for e in before if by_second(e)] == []
        writes = [(i, e) for i, e in enumerate(after) if by_second(e)]
        took = min(i for i, e in writes if e.resource == "leases")
        assert all(i > took for i, e in writes if e.resource != "leases")
    finally:
        code = second.stop()
    log = second.log()
    assert "connector is None" not in log and "Traceback" not in log, log[-3000:]
    assert code == 0, log[-3000:]


# --- the Lease moved A -> B -> A around a chart RuntimeClass deleted and re-created ------------------


def _identity(cp: ControlPlane, since: int, pod_name: str) -> str:
    """A replica's Lease identity, from the User-Agent it names itself with (kata-sizing/<identity>)."""
    def found() -> str:
        for event in cp.operator_requests(since):
            agent = event.user_agent.removeprefix("kata-sizing/")
            if event.user_agent.startswith("kata-sizing/") and agent.startswith(f"{pod_name}_"):
                return agent
        return ""
    return poll(found, 20, f"replica {pod_name} made no request")


def _policy_gauges(port: int) -> dict[tuple[str, str], float]:
    status, text = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200, status
    return {(dict(labels)["condition"], dict(labels)["status"]): v for (name, labels), v in samples(text).items()
            if name == "kata_sizing_policies"}


def _move_lease(cp: ControlPlane, to: str) -> None:
    """Hand the Lease over while both replicas run: the holder sees somebody else's renewal and
    steps down; the named replica finds itself the holder and renews (client-go's rules)."""
    def moved() -> bool:
        try:
            cp.edit(LEASE, lambda lease: lease["spec"].update(holderIdentity=to))
        except ApiError as err:
            if err.status != 409:  # the holder renewed between the read and the write
                raise
            return False
        return True
    poll(moved, 10, "the Lease could not be written")
    poll(lambda: lease_holder(cp) == to, 10, f"the Lease did not stay with {to}")


def _events(cp: ControlPlane, reason: str, name: str) -> list[str]:
    found = cp.items("/api/v1/namespaces/default/events")
    return [e["message"] for e in found.values() if e.get("reason") == reason and name in e.get("message", "")]


def test_the_lease_moved_a_b_a_around_a_chart_runtime_class_deleted_and_recreated(
        control_plane, real_operator, tmp_path):
    """Status, events and the policy gauges follow the Lease within seconds: a new leader passes
    at once (not at the 300 s resync), Ready turns False the moment the chart's RuntimeClass goes
    and True when the chart makes it again, the event says the chart makes it (the drift policy
    is Correct), and the replica that does not lead exports no policy gauge."""
    cp = control_plane
    ports = {"a": free_port(), "b": free_port()}
    mark = cp.audit_offset()
    metrics_args = ("--metrics-addr", "127.0.0.1")
    a = real_operator.start(*LEASE_ARGS, "--metrics-port", str(ports["a"]), *metrics_args, POD_NAME="alpha")
    poll(lambda: lease_holder(cp).startswith("alpha_"), 20, "the first replica never took the Lease")
    (tmp_path / "b").mkdir()
    b = RealOperator(cp, tmp_path / "b")
    try:
        b.start(*LEASE_ARGS, "--metrics-port", str(ports["b"]), *metrics_args, POD_NAME="beta")
        identity = {"a": _identity(cp, mark, "alpha"), "b": _identity(cp, mark, "beta")}
        assert lease_holder(cp) == identity["a"]

        body = qemu_rs("moving")
        body["spec"]["runtimeClass"]["managedBy"] = "KataDeploy"
        cp.apply(body)
        wait_observed(cp, "moving", InSync="False", Valid="True")
        values = cp.get(cm_path("moving-kata-deploy-values"))["data"]["values.yaml"]
        chart = chart_runtime_classes(values)
        cp.apply(*chart)  # helm install
        wait_observed(cp, "moving", Ready="True")
        name = chart[0]["metadata"]["name"]

        def check(leader: str, follower: str, ready: str) -> None:
            poll(lambda: _policy_gauges(ports[leader]).get(("Ready", ready)) == 1, 5,
                 lambda: f"the leader {leader} exports {_policy_gauges(ports[leader])}")
            poll(lambda: _policy_gauges(ports[follower]) == {}, 5,
                 lambda: f"the follower {follower} exports {_policy_gauges(ports[follower])}")

        def delete_and_recreate(leader: str, follower: str) -> None:
            cp.delete(rc_path(name))
            st = wait_observed(cp, "moving", timeout=5, Ready="False")
            assert {c["type"]: c["reason"] for c in st["conditions"]}["Ready"] == "RuntimeClassMissing"
            check(leader, follower, "False")
            messages = poll(lambda: _events(cp, "DriftDetected", name), 5, "no event for the deleted RuntimeClass")
            assert all("kata-deploy chart creates it" in m and "driftPolicy is Report" not in m for m in messages)
            cp.apply(*chart)  # the chart makes it again
            wait_observed(cp, "moving", timeout=5, Ready="True", InSync="True")
            check(leader, follower, "True")

        check("a", "b", "True")
        delete_and_recreate("a", "b")

        # A -> B while the RuntimeClass is missing; the chart makes it again once B leads.
        cp.delete(rc_path(name))
        wait_observed(cp, "moving", timeout=5, Ready="False")
        _move_lease(cp, identity["b"])
        check("b", "a", "False")
        cp.apply(*chart)
        wait_observed(cp, "moving", timeout=5, Ready="True")
        check("b", "a", "True")
        delete_and_recreate("b", "a")

        # B -> A: A has led before (kopf will not resume the policy again); its first pass as the
        # new leader says where things stand at once. While it is missing, then made again.
        cp.delete(rc_path(name))
        wait_observed(cp, "moving", timeout=5, Ready="False")
        _move_lease(cp, identity["a"])
        check("a", "b", "False")
        cp.apply(*chart)
        wait_observed(cp, "moving", timeout=5, Ready="True")
        check("a", "b", "True")
        delete_and_recreate("a", "b")
        assert a.running and b.running
        assert not cp.operator_writes(mark, "runtimeclasses"), "an operator wrote the chart's RuntimeClass"
    finally:
        code = b.stop()
    log = b.log()
    assert "Traceback" not in log, log[-3000:]
    assert code == 0, log[-3000:]
