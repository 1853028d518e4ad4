"""Beside the kata-deploy chart, beside GitOps tools, and as two replicas, on both API tiers: the
operator guards exactly the fields a policy decides and leaves every key other writers add alone
(re-applying the chart or a GitOps sync makes it write nothing, a hand edit of podFixed is still put
back); one leader-elected replica writes while the other waits, a clean stop hands over at once, a
killed leader's Lease expires and the other replica finishes its work with nothing made twice, the
waiting replica answers admission through a handover, and status, events and metrics follow the
Lease moved by hand. Which replica sent a request is in its User-Agent (`kata-sizing/<identity>`),
in the emulator's request log or the real API server's audit log alike."""

from __future__ import annotations

import signal
import threading
import time

from kata_sizing.controller import conditions as cond
from kata_sizing.controller.policy_webhook import admission_problems
from kata_sizing.core.render import POLICY_LABEL
from tests.support.kata_deploy_chart import FACTS, chart_runtime_classes, instance_marker
from tests.support.metrics import get, samples
from tests.support.policies import example, explicit_classes_policy
from tests.support.realcluster import free_port
from tests.support.tiers import (
    CONFIG_MAPS,
    LEASES,
    OUTPUT_NAMESPACE,
    POLICIES,
    RUNTIME_CLASSES,
    ApiError,
    Kube,
    LeaseTimings,
    Write,
)
from tests.support.webhook import Webhook, invalid_body, write_self_signed_cert

NAME = "qemu-rs"
RC_NAMES = {f"kata-qemu-rs-{c}" for c in ("s", "m", "l", "xl")}
CM_NAMES = {f"{NAME}-kata-deploy-values", f"{NAME}-dropins", f"{NAME}-node-guidance"}
SHARED_GATE = FACTS["sharedGateLabel"]
HELM_LABEL = next(iter(FACTS["helm"]["labels"].items()))
# Short, to keep the tests quick; the order (retry < renew deadline < duration) is client-go's.
LEASE = LeaseTimings(duration_s=4.0, renew_deadline_s=3.0, retry_period_s=0.25)


# --- beside the chart and GitOps tools -------------------------------------------------------


def kata_deploy_policy(**runtime_class) -> dict:
    body = example()
    body["spec"]["runtimeClass"].update(managedBy="KataDeploy", **runtime_class)
    return body


def helm_upgrade(kube: Kube) -> list[dict]:
    """`helm upgrade -f values.yaml` with the operator's overlay: every custom RuntimeClass is
    written exactly as the chart renders it (the strictest re-apply: a whole replace, whatever
    else is on the live object goes)."""
    values = kube.read(CONFIG_MAPS, f"{NAME}-kata-deploy-values")["data"]["values.yaml"]
    rendered = chart_runtime_classes(values)
    for obj in rendered:
        live = kube.get(RUNTIME_CLASSES, obj["metadata"]["name"])
        if live is None:
            kube.create(RUNTIME_CLASSES, obj)
        else:
            kube.replace(RUNTIME_CLASSES, {**obj, "metadata": {
                **obj["metadata"], "resourceVersion": live["metadata"]["resourceVersion"]}})
    return rendered


def chart_keys_kept(obj: dict) -> bool:
    selector = obj["scheduling"]["nodeSelector"]
    meta = obj["metadata"]
    return (selector.get(instance_marker()) == "true" and selector.get(SHARED_GATE) == "true"
            and meta["labels"].get(HELM_LABEL[0]) == HELM_LABEL[1]
            and meta.get("annotations", {}).get("meta.helm.sh/release-name") == "kata-deploy")


def pod_fixed(kube: Kube, name: str) -> dict:
    return kube.read(RUNTIME_CLASSES, name)["overhead"]["podFixed"]


def test_chart_runtime_classes_applied_again_and_again_get_no_operator_write_and_a_pod_fixed_edit_is_put_back(kube):
    kube.start(resync_s=0.5)
    tolerations = [{"key": "kata", "operator": "Exists", "effect": "NoSchedule"}]
    kube.create(POLICIES, kata_deploy_policy(tolerations=tolerations))
    kube.wait_observed(NAME, InSync="False", Valid="True")

    rendered = helm_upgrade(kube)  # helm install
    assert {o["metadata"]["name"] for o in rendered} == RC_NAMES
    # What the chart made of our strings: Helm's managed-by over ours, the per-install gate added.
    assert all(o["metadata"]["labels"][HELM_LABEL[0]] == HELM_LABEL[1] for o in rendered)
    assert all(o["scheduling"]["nodeSelector"] == {SHARED_GATE: "true", instance_marker(): "true"} for o in rendered)
    kube.wait_observed(NAME, InSync="True", Ready="True", Conflict="False")
    kube.settle()

    mark = kube.mark()
    for _ in range(4):  # helm upgrades, Flux reconciles: the same objects written again
        helm_upgrade(kube)
        kube.settle(quiet_s=0.3)
    kube.stays(lambda: not kube.writes(mark, RUNTIME_CLASSES), 1.2, "the operator wrote a chart RuntimeClass")
    assert not kube.event_messages(cond.EVENT_DRIFT_CORRECTED)
    live = kube.objects(RUNTIME_CLASSES)
    assert set(live) == RC_NAMES and all(chart_keys_kept(o) for o in live.values()), live
    assert kube.counter(NAME, "driftCorrections") == 0

    name = "kata-qemu-rs-m"
    want = next(o for o in rendered if o["metadata"]["name"] == name)["overhead"]["podFixed"]
    kube.edit(RUNTIME_CLASSES, name, lambda o: o["overhead"]["podFixed"].update(memory="1Mi"))
    kube.wait_for(lambda: pod_fixed(kube, name) == want)
    kube.wait_for(lambda: kube.counter(NAME, "driftCorrections") == 1)
    kube.settle()
    assert chart_keys_kept(kube.get(RUNTIME_CLASSES, name)), kube.get(RUNTIME_CLASSES, name)
    assert kube.read(RUNTIME_CLASSES, name)["scheduling"]["tolerations"] == tolerations
    assert [(w.verb, w.name) for w in kube.writes(mark, RUNTIME_CLASSES)] == [("update", name)]

    # A selector key the policy sets, removed by hand, is put back; the chart's stay.
    kube.edit(RUNTIME_CLASSES, name, lambda o: o["scheduling"]["nodeSelector"].pop(SHARED_GATE))
    kube.wait_for(lambda: kube.read(RUNTIME_CLASSES, name)["scheduling"]["nodeSelector"].get(SHARED_GATE) == "true")
    assert chart_keys_kept(kube.get(RUNTIME_CLASSES, name))


def test_a_chart_class_with_a_tee_key_in_pod_fixed_keeps_it(kube):
    """The chart may request an extended resource (a TEE key slot) in podFixed: the policy
    decides cpu and memory only."""
    kube.start()
    kube.create(POLICIES, kata_deploy_policy())
    kube.wait_observed(NAME, InSync="False")
    for obj in chart_runtime_classes(kube.read(CONFIG_MAPS, f"{NAME}-kata-deploy-values")["data"]["values.yaml"]):
        obj["overhead"]["podFixed"]["sev-snp.amd.com/esids"] = "1"
        kube.create(RUNTIME_CLASSES, obj)
    kube.wait_observed(NAME, InSync="True", Ready="True")
    kube.settle()
    assert not [w for w in kube.writes(kind=RUNTIME_CLASSES)]
    assert all(o["overhead"]["podFixed"]["sev-snp.amd.com/esids"] == "1" for o in kube.objects(RUNTIME_CLASSES).values())


def test_operator_mode_leaves_labels_and_annotations_of_gitops_tools_alone(kube):
    kube.start(resync_s=0.4)
    kube.applied(example())
    mark = kube.mark()

    def gitops(obj: dict) -> None:
        meta = obj["metadata"]
        meta.setdefault("labels", {})["kustomize.toolkit.fluxcd.io/name"] = "kata"
        meta.setdefault("annotations", {})["argocd.argoproj.io/tracking-id"] = "kata:node.k8s.io/RuntimeClass:x"

    for name in RC_NAMES:
        kube.edit(RUNTIME_CLASSES, name, gitops)
    kube.edit(CONFIG_MAPS, f"{NAME}-dropins", gitops)
    kube.stays(lambda: not kube.writes(mark), 1.5, "the operator wrote after a GitOps tool labelled its objects")
    for name in RC_NAMES:
        meta = kube.read(RUNTIME_CLASSES, name)["metadata"]
        assert meta["labels"]["kustomize.toolkit.fluxcd.io/name"] == "kata"
        assert meta["labels"][POLICY_LABEL] == NAME
        assert "argocd.argoproj.io/tracking-id" in meta["annotations"]

    # A real edit next to them is corrected, and their keys survive the correction.
    kube.edit(CONFIG_MAPS, f"{NAME}-dropins", lambda o: o["data"].update({"m.toml": "#"}))
    kube.wait_for(lambda: kube.read(CONFIG_MAPS, f"{NAME}-dropins")["data"]["m.toml"] != "#")
    meta = kube.read(CONFIG_MAPS, f"{NAME}-dropins")["metadata"]
    assert meta["labels"]["kustomize.toolkit.fluxcd.io/name"] == "kata"
    assert "argocd.argoproj.io/tracking-id" in meta["annotations"]
    assert [w.verb for w in kube.writes(mark, CONFIG_MAPS)] == ["update"]


# --- two replicas ----------------------------------------------------------------------------


def lease_holder(kube: Kube) -> str:
    return ((kube.get(LEASES, "kata-sizing", OUTPUT_NAMESPACE) or {}).get("spec") or {}).get("holderIdentity") or ""


def by(identity: str):
    """Requests of the replica started as `identity` (its Lease identity is `identity`_<suffix>)."""
    return lambda w: w.user_agent.startswith(f"kata-sizing/{identity}_")


def test_one_replica_writes_while_the_other_waits_and_a_clean_stop_hands_over_at_once(kube):
    first = kube.replica("a", lease=LEASE)
    kube.wait_for(lambda: lease_holder(kube).startswith("a_"), 20, "the first replica never took the Lease")
    kube.replica("b", lease=LEASE)
    kube.stays(lambda: lease_holder(kube).startswith("a_"), 1.0, "the second replica took a Lease being renewed")

    mark = kube.mark()
    kube.create(POLICIES, example())
    kube.wait_observed(NAME, Ready="True")
    kube.settle()
    assert set(kube.objects(RUNTIME_CLASSES)) == RC_NAMES
    assert set(kube.objects(CONFIG_MAPS, OUTPUT_NAMESPACE, "katasizing.dev/policy=" + NAME)) == CM_NAMES
    creates = [w for w in kube.writes(mark, RUNTIME_CLASSES) if w.verb == "create"]
    assert sorted(w.code for w in creates) == [201] * 4, "a RuntimeClass was created twice"
    # The follower wrote nothing at all: not a child, not the Lease.
    assert kube.writes(mark), "nothing was written at all"
    assert [w for w in kube.writes(mark) if by("b")(w)] == []

    name = "kata-qemu-rs-m"
    original = pod_fixed(kube, name)
    mark = kube.mark()
    kube.edit(RUNTIME_CLASSES, name, lambda o: o["overhead"]["podFixed"].update(memory="1Mi"))
    kube.wait_for(lambda: pod_fixed(kube, name) == original)
    kube.wait_for(lambda: kube.counter(NAME, "driftCorrections") == 1)
    kube.settle()
    assert [(w.verb, by("a")(w)) for w in kube.writes(mark, RUNTIME_CLASSES, name)] == [("update", True)]
    # The event is posted by kopf's poster, after the status write.
    kube.wait_for(lambda: kube.event_messages(cond.EVENT_DRIFT_CORRECTED))
    assert len(kube.event_messages(cond.EVENT_DRIFT_CORRECTED)) == 1

    # A rolling update: the old leader stops cleanly and releases; the other takes over within
    # a retry period or two, not after the lease duration, and corrects drift from then on.
    stopped = time.monotonic()
    assert first.stop() == 0, first.log()[-3000:]
    kube.wait_for(lambda: lease_holder(kube).startswith("b_"), LEASE.duration_s)
    assert time.monotonic() - stopped < LEASE.duration_s
    mark = kube.mark()
    kube.edit(RUNTIME_CLASSES, name, lambda o: o["overhead"]["podFixed"].update(memory="2Mi"))
    kube.wait_for(lambda: pod_fixed(kube, name) == original)
    kube.settle()
    assert {by("b")(w) for w in kube.writes(mark, RUNTIME_CLASSES)} == {True}
    assert set(kube.objects(RUNTIME_CLASSES)) == RC_NAMES


def test_a_leader_killed_mid_work_is_replaced_and_nothing_is_made_twice(kube):
    if kube.emu is not None:
        # Slow creates, so the kill lands in the middle of the work (the real server's take long
        # enough by themselves).
        kube.emu.add_latency(0.1, method="POST", path="/runtimeclasses|/configmaps")
    mark = kube.mark()
    first = kube.replica("first", lease=LEASE)
    kube.wait_for(lambda: lease_holder(kube).startswith("first_"), 20, "the first replica never took the Lease")
    leader = lease_holder(kube)
    second = kube.replica("second", lease=LEASE)

    policies = [explicit_classes_policy(f"fleet-{i}", runtimeClass={"namePrefix": f"kata-fleet-{i}"}) for i in range(8)]
    for body in policies:
        kube.create(POLICIES, body)
    # Kill the leader once some, not all, of the 32 RuntimeClasses exist.
    kube.wait_for(lambda: len(kube.objects(RUNTIME_CLASSES)) >= 2, 20, "the leader created nothing")
    first.kill()
    at_kill = kube.mark()
    assert len(kube.objects(RUNTIME_CLASSES)) < 32, "the kill came after the leader had finished"

    kube.wait_for(lambda: lease_holder(kube).startswith("second_"), 3 * LEASE.duration_s, "the Lease was not taken over")
    assert lease_holder(kube) != leader
    for body in policies:
        kube.wait_observed(body["metadata"]["name"], timeout=30, Ready="True")
    kube.settle()
    live = set(kube.objects(RUNTIME_CLASSES))
    assert len(live) == 32

    writes = kube.writes(mark)
    creates = [w for w in writes if w.resource == "runtimeclasses" and w.verb == "create"]
    created = [w.name for w in creates if w.code == 201]
    assert len(created) == len(set(created)), "a RuntimeClass was created twice"
    # Creates in flight when the leader was killed may have landed with no 201 in the audit log
    # (its client was gone before the answer): each object was asked for, none twice. The
    # emulator's log records every answer, sent or not: there each has its one 201.
    assert set(created) <= live <= {w.name for w in creates}
    if kube.emu is not None:
        assert set(created) == live
    assert not [w for w in writes if w.resource == "runtimeclasses" and w.verb == "delete"], "deleted and made again"
    # The second replica wrote nothing while the first lived, and afterwards only once it held
    # the Lease (its Lease write comes before its first other write).
    after = kube.writes(at_kill)
    before = writes[: len(writes) - len(after)]
    assert [w for w in before if by("second")(w)] == []
    seconds: list[tuple[int, Write]] = [(i, w) for i, w in enumerate(after) if by("second")(w)]
    took = min(i for i, w in seconds if w.resource == "leases")
    assert all(i > took for i, w in seconds if w.resource != "leases")
    code = second.stop()
    log = second.log()
    assert "connector is None" not in log and "Traceback" not in log, log[-3000:]
    assert code == 0, log[-3000:]


def test_the_waiting_replica_serves_the_webhook_and_keeps_serving_through_a_handover(kube, tmp_path):
    """A rolling update stops the leader while the other pod serves admission: every review
    posted to the other replica during the handover is answered, before and after it leads."""
    cert, key = write_self_signed_cert(tmp_path)
    ports = {"a": free_port(), "b": free_port()}
    leader = kube.replica("a", lease=LEASE, webhook=(ports["a"], cert, key))
    kube.wait_for(lambda: lease_holder(kube).startswith("a_"), 20)
    kube.replica("b", lease=LEASE, webhook=(ports["b"], cert, key))
    hook = Webhook(kube.emu, ports["b"], cert)
    hook.wait_until_serving()
    errors, _ = admission_problems(invalid_body())
    refused = hook.review("CREATE", invalid_body())
    assert refused["allowed"] is False and refused["status"]["message"] == "; ".join(errors)
    assert hook.review("CREATE", example())["allowed"] is True
    assert lease_holder(kube).startswith("a_"), "answering admission made the follower take the Lease"

    answers: list[bool] = []
    stop = threading.Event()

    def keep_reviewing() -> None:
        while not stop.is_set():
            answers.append(hook.review("CREATE", invalid_body())["allowed"] is False)

    reviewer = threading.Thread(target=keep_reviewing)
    reviewer.start()
    try:
        leader.stop()
        kube.wait_for(lambda: lease_holder(kube).startswith("b_"), LEASE.duration_s)
        time.sleep(0.3)
    finally:
        stop.set()
        reviewer.join(10)
    assert len(answers) >= 5 and all(answers), answers


def test_a_stopping_replica_hands_the_lease_over_at_once_and_answers_reviews_through_its_drain(kube, tmp_path):
    """SIGTERM to a leader run with --webhook-drain-seconds: the other replica holds the Lease
    within a retry period or two, while the stopping one, no longer ready, answers every review
    sent to it until its drain is over (the Service and kube-proxy take a moment to stop sending
    any), and then exits 0."""
    cert, key = write_self_signed_cert(tmp_path)
    port, metrics_port, drain_s = free_port(), free_port(), 3.0
    leader = kube.replica("a", lease=LEASE, webhook=(port, cert, key), webhook_drain_s=drain_s,
                          metrics_port=metrics_port)
    kube.wait_for(lambda: lease_holder(kube).startswith("a_"), 20)
    kube.replica("b", lease=LEASE)
    hook = Webhook(kube.emu, port, cert)
    hook.wait_until_serving()
    kube.wait_for(lambda: get(f"http://127.0.0.1:{metrics_port}/readyz")[0] == 200, 20, "replica a never ready")
    assert hook.connection_header(example()) == "keep-alive"  # as the API server's client wants it

    answered: list[float] = []  # when each review came back, in seconds after the SIGTERM
    judged: list[bool] = []  # whether each refused the invalid policy, as it must
    stop = threading.Event()
    process = leader.process
    assert process is not None

    def keep_reviewing() -> None:
        while not stop.is_set():
            try:
                refused = hook.review("CREATE", invalid_body())["allowed"] is False
            except OSError:
                return  # the server is gone: the drain is over
            answered.append(time.monotonic() - sent)
            judged.append(refused)

    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    reviewer = threading.Thread(target=keep_reviewing)
    reviewer.start()
    try:
        kube.wait_for(lambda: lease_holder(kube).startswith("b_"), LEASE.duration_s)
        handed_over = time.monotonic() - sent
        kube.wait_for(lambda: get(f"http://127.0.0.1:{metrics_port}/readyz")[0] == 503, 2,
                      "the draining replica still says it is ready")
        closing = [hook.connection_header(example())]
        code = process.wait(drain_s + 20)
        exited = time.monotonic() - sent
    finally:
        stop.set()
        reviewer.join(10)
    assert handed_over < drain_s, f"the Lease moved {handed_over:.1f}s after SIGTERM, not at once"
    assert closing == ["close"], "a draining replica kept its connection open for the next review"
    assert all(judged), judged
    assert answered and answered[-1] >= drain_s - 0.5, (
        f"the last review answered {answered[-1] if answered else None}s after SIGTERM, drain {drain_s}s")
    assert exited >= drain_s and code == 0, leader.log()[-3000:]
    assert "answering admission reviews for 3s more" in leader.log()


# --- the Lease moved A -> B -> A around a chart RuntimeClass deleted and re-created -------------


def _identity(kube: Kube, since: int, pod_name: str) -> str:
    """A replica's Lease identity, from the User-Agent it names itself with (kata-sizing/<identity>)."""
    def found() -> str:
        return next((agent.removeprefix("kata-sizing/") for agent in kube.user_agents(since)
                     if agent.startswith(f"kata-sizing/{pod_name}_")), "")
    return kube.wait_for(found, 20, f"replica {pod_name} made no request")


def _policy_gauges(port: int) -> dict[tuple[str, str], float]:
    status, text = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200, status
    return {(dict(labels)["condition"], dict(labels)["status"]): v for (name, labels), v in samples(text).items()
            if name == "kata_sizing_policies"}


def _move_lease(kube: Kube, to: str) -> None:
    """Hand the Lease over while both replicas run: the holder sees somebody else's renewal and
    steps down; the named replica finds itself the holder and renews (client-go's rules)."""
    def moved() -> bool:
        try:
            kube.edit(LEASES, "kata-sizing", lambda lease: lease["spec"].update(holderIdentity=to), OUTPUT_NAMESPACE)
        except ApiError as err:
            if err.status != 409:  # the holder renewed between the read and the write
                raise
            return False
        return True
    kube.wait_for(moved, 10, "the Lease could not be written")
    kube.wait_for(lambda: lease_holder(kube) == to, 10, f"the Lease did not stay with {to}")


def test_the_lease_moved_a_b_a_around_a_chart_runtime_class_deleted_and_recreated(kube):
    """Status, events and the policy gauges follow the Lease within seconds: a new leader passes
    at once (not at the 300 s resync), Ready turns False the moment the chart's RuntimeClass goes
    and True when the chart makes it again, the event says the chart makes it (the drift policy
    is Correct), and the replica that does not lead exports no policy gauge."""
    ports = {"a": free_port(), "b": free_port()}
    mark = kube.mark()
    a = kube.replica("alpha", lease=LEASE, metrics_port=ports["a"])
    kube.wait_for(lambda: lease_holder(kube).startswith("alpha_"), 20, "the first replica never took the Lease")
    b = kube.replica("beta", lease=LEASE, metrics_port=ports["b"])
    identity = {"a": _identity(kube, mark, "alpha"), "b": _identity(kube, mark, "beta")}
    assert lease_holder(kube) == identity["a"]

    body = explicit_classes_policy("moving", runtimeClass={"managedBy": "KataDeploy"})
    kube.create(POLICIES, body)
    kube.wait_observed("moving", InSync="False", Valid="True")
    values = kube.read(CONFIG_MAPS, "moving-kata-deploy-values")["data"]["values.yaml"]
    chart = chart_runtime_classes(values)
    for obj in chart:  # helm install
        kube.create(RUNTIME_CLASSES, obj)
    kube.wait_observed("moving", Ready="True")
    name = chart[0]["metadata"]["name"]

    def check(leader: str, follower: str, ready: str) -> None:
        kube.wait_for(lambda: _policy_gauges(ports[leader]).get(("Ready", ready)) == 1, 5,
                      lambda: f"the leader {leader} exports {_policy_gauges(ports[leader])}")
        kube.wait_for(lambda: _policy_gauges(ports[follower]) == {}, 5,
                      lambda: f"the follower {follower} exports {_policy_gauges(ports[follower])}")

    def recreate() -> None:
        kube.create(RUNTIME_CLASSES, next(o for o in chart if o["metadata"]["name"] == name))  # the chart again

    def delete_and_recreate(leader: str, follower: str) -> None:
        kube.delete(RUNTIME_CLASSES, name)
        st = kube.wait_observed("moving", timeout=5, Ready="False")
        assert {c["type"]: c["reason"] for c in st["conditions"]}["Ready"] == cond.REASON_RUNTIME_CLASS_MISSING
        check(leader, follower, "False")
        messages = kube.wait_for(lambda: [m for m in kube.event_messages(cond.EVENT_DRIFT_DETECTED) if name in m], 5,
                                 "no event for the deleted RuntimeClass")
        assert all("kata-deploy chart creates it" in m and "driftPolicy is Report" not in m for m in messages)
        recreate()
        kube.wait_observed("moving", timeout=5, Ready="True", InSync="True")
        check(leader, follower, "True")

    def hand_over_while_missing(to: str, other: str) -> None:
        """The Lease moved while the RuntimeClass is missing; the chart makes it again once `to` leads."""
        kube.delete(RUNTIME_CLASSES, name)
        kube.wait_observed("moving", timeout=5, Ready="False")
        _move_lease(kube, identity[to])
        check(to, other, "False")
        recreate()
        kube.wait_observed("moving", timeout=5, Ready="True")
        check(to, other, "True")
        delete_and_recreate(to, other)

    check("a", "b", "True")
    delete_and_recreate("a", "b")
    hand_over_while_missing("b", "a")
    # B -> A: A has led before (kopf will not resume the policy again); its first pass as the
    # new leader says where things stand at once.
    hand_over_while_missing("a", "b")
    assert a.running and b.running
    assert not kube.writes(mark, RUNTIME_CLASSES), "an operator wrote the chart's RuntimeClass"
    code = b.stop()
    assert "Traceback" not in b.log(), b.log()[-3000:]
    assert code == 0, b.log()[-3000:]
