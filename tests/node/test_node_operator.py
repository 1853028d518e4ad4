"""The operator on the real node (tests/support/realnode.py), from its own image and chart, as a user
installs it; what the kubelet and the scheduler decide for the pods of its classes.

The node's kubelet started with the reservations (and feature gates) that the operator's node
guidance gives for this machine (tests/support/nodeoperator.py, `guided_node_config`), and containerd
maps the classes' handlers to runc, which stands in for Kata: the kubelet charges, admits and
schedules the pods exactly as on a Kata node; no VM boots.

One release for the module (the image's import and `helm install --wait` take 10 to 30 s): the
tests share it in order, the upgrade and handover tests last, and the last test reads the whole
module's audit log for a request the chart's RBAC refused.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from kata_sizing.core.podfit import SHARED_NAMES
from tests.support import image as img
from tests.support.admission import ADMISSION, put_back_in_the_installers_name, writers
from tests.support.nodeoperator import (
    NAMESPACE,
    POLICY_FILE,
    RELEASE,
    SCHEDULING_HANDLER,
    OperatorRelease,
    cached_objects,
    cli,
    events,
    informer_objects,
    installed_release,
    policy_gauges,
    policy_runtime_classes,
    rendered,
    rendered_guidance,
    total,
)
from tests.support.operator_helpers import wait_for as poll
from tests.support.realcluster import POLICIES, RUNTIME_CLASSES, WRITE_VERBS, configmaps
from tests.support.realnode import NODE_TOLERATION, Node

pytestmark = pytest.mark.node

MIB = 2**20
POLICY = yaml.safe_load(POLICY_FILE.read_text())
NAME = POLICY["metadata"]["name"]
CLASSES = {c["name"]: c for c in POLICY["spec"]["classes"]}
GUIDANCE_CM = f"{NAME}-node-guidance"


@pytest.fixture
def namespace(node_namespace: str) -> str:
    return node_namespace


@pytest.fixture(scope="module")
def release(real_node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorRelease]:
    """The chart installed once for the module, the node tests' policy applied just before it
    (the operator finds it when it starts)."""
    with installed_release(real_node, tmp_path_factory.mktemp("release"), apply_first=[POLICY]) as release:
        yield release


def policy(cp, name: str = NAME) -> dict:
    return cp.get(f"{POLICIES}/{name}") or {}


def conditions(cp, name: str = NAME) -> dict[str, dict]:
    return {c["type"]: c for c in (policy(cp, name).get("status") or {}).get("conditions") or []}


def wait_policy_ready(cp, name: str = NAME, timeout: float = 60) -> dict:
    def ready() -> dict | None:
        body = policy(cp, name)
        found = conditions(cp, name)
        current = found.get("Ready", {})
        if current.get("status") == "True" and current.get("observedGeneration") == body["metadata"]["generation"]:
            return body
        return None
    return poll(ready, timeout, lambda: f"policy {name} Ready: {json.dumps(conditions(cp, name))}", interval=0.5)


def guidance(cp) -> dict:
    data = cp.read(f"{configmaps()}/{GUIDANCE_CM}")["data"]
    (document,) = [yaml.safe_load(v) for k, v in data.items() if k.endswith(".yaml")]
    return document


def pod_file(tmp_path: Path, pod: dict) -> Path:
    path = tmp_path / f"{pod['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(pod))
    return path


def unschedulable(pod: dict) -> dict | None:
    return next((c for c in pod.get("status", {}).get("conditions", [])
                 if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"), None)


def why_unschedulable(pod: dict) -> str:
    """The scheduler's message for a pod it refused."""
    refused = unschedulable(pod)
    assert refused is not None, f"{pod['metadata']['name']} was not refused by the scheduler: {pod.get('status')}"
    return refused["message"]


def create_pod(node: Node, body: dict) -> subprocess.CompletedProcess:
    """`kubectl create` of the pod, as a user sees it: refused with the reason on stderr, or not."""
    return node.kubectl("create", "-f", "-", input=yaml.safe_dump(body), check=False)


# --- install ------------------------------------------------------------------------------------


def test_helm_install_runs_two_ready_replicas_in_cluster_and_one_holds_the_lease(release: OperatorRelease) -> None:
    node = release.node
    assert release.image_name == img.IMAGE_REF  # ctr named it as the chart's image
    pods = release.wait_ready(2)
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert (container["image"], container["imagePullPolicy"]) == (img.IMAGE_REF, "Never")
        assert pod["spec"]["serviceAccountName"] == RELEASE and pod["spec"]["nodeName"] == node.name
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": "HTTP"}
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        (status,) = pod["status"]["containerStatuses"]
        assert status["restartCount"] == 0 and "running" in status["state"], status
        assert release.readyz(pod["metadata"]["name"]) == "ok\n"
    names = [p["metadata"]["name"] for p in pods]
    leader = poll(release.leader, 30, f"one of {names} holds the Lease")
    assert leader in names

    # In-cluster configuration: every request of the ServiceAccount came from a pod's IP
    # (through the kubernetes Service), and kopf did not try the DNS name (no cluster DNS here).
    pod_ips = {p["status"]["podIP"] for p in pods}
    requests = release.requests(release.audit_start)
    assert requests, "the operator's ServiceAccount made no request"
    assert {ip for e in requests for ip in e.source_ips} <= pod_ips, {e.source_ips for e in requests}
    for name in names:
        log = release.log(name)
        assert "Traceback" not in log and "kubernetes.default.svc" not in log, log[-3000:]
    # No request on a policy failed: its status patches do not go to the webhook, whose Service
    # answers only once a replica is Ready (before matchConditions: 500 until then).
    failed = [(e.verb, e.resource, e.code) for e in requests if e.resource.startswith("katasizingpolicies") and e.code >= 400]
    assert failed == [], failed


def test_the_policy_applied_before_the_install_is_written_by_the_operator_in_its_pod(release: OperatorRelease) -> None:
    cp = release.cp
    wait_policy_ready(cp)
    want = policy_runtime_classes()  # what `kata-sizing render` prints for the same file
    live = cp.items(RUNTIME_CLASSES, f"katasizing.dev/policy={NAME}")
    assert sorted(live) == sorted(want)
    for name, rc in want.items():
        assert (live[name]["handler"], live[name]["overhead"], live[name]["scheduling"]) == \
            (rc["handler"], rc["overhead"], rc["scheduling"])
    writers = {e.user_agent for e in release.requests(release.audit_start)
               if e.resource == "runtimeclasses" and e.verb == "create"}
    assert writers == {f"kata-sizing/{release.lease()['holderIdentity']}"}, writers


def test_the_charts_shared_admission_policies_carry_helms_marks_and_one_deleted_comes_back_as_helm_applied_it(
        release: OperatorRelease) -> None:
    """With the chart's default admissionPolicies, Helm stamps its managed-by label and release
    annotations on the shared admission policies: every policy is Ready all the same (each was
    Ready False, UnmanagedRuntimeClass). One deleted is put back in Helm's name, as Helm applied
    it, and `helm upgrade` (Helm 4 applies server-side; no --force-conflicts) succeeds."""
    cp = release.cp
    wait_policy_ready(cp)
    path = f"{ADMISSION}/validatingadmissionpolicies/{SHARED_NAMES['envelope']}"
    before = cp.read(path)
    assert before["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert writers(before) == {("helm", "Apply")}
    put_back_in_the_installers_name(cp, path, ("helm", "Apply"))
    release.upgrade(release.values())  # fails the test on a conflict
    for name in cp.items(POLICIES):
        wait_policy_ready(cp, name)


def test_metrics_of_both_replicas_through_the_api_server(release: OperatorRelease) -> None:
    cp = release.cp
    wait_policy_ready(cp)
    leader = release.leader()
    pods = [p["metadata"]["name"] for p in release.wait_ready(2)]
    want = cached_objects(cp)
    for pod in pods:
        samples = poll(lambda: (lambda s: s if informer_objects(s) == want else None)(release.scrape(pod)), 20,
                       lambda: f"{pod}'s caches hold {want}: {informer_objects(release.scrape(pod))}")
        gauges = policy_gauges(samples)
        if pod == leader:
            assert gauges[("Ready", "True")] == 1 and gauges[("Valid", "True")] == 1, gauges
        else:  # only the leader exports what the alerts read
            assert gauges == {}, f"the replica that does not lead exports {gauges}"
    # The metrics Service (what a ServiceMonitor scrapes) answers too, through services/proxy.
    text = release.raw(f"/api/v1/namespaces/{NAMESPACE}/services/{RELEASE}-metrics:8081/proxy/metrics")
    assert "kata_sizing_informer_objects" in text


# --- the webhook behind its Service -------------------------------------------------------------


def test_the_webhook_behind_its_service_refuses_a_broken_policy_naming_the_rule(
        release: OperatorRelease, tmp_path: Path) -> None:
    cp = release.cp
    broken = copy.deepcopy(POLICY)
    broken["metadata"]["name"] = "node-broken"
    broken["spec"]["classes"][0].update(overheadMemory="256Mi", podFixed={"cpu": "300m", "memory": "200Mi"})
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    # What `kata-sizing validate` says of the file: one error line per rule broken.
    said = [line.removeprefix("error: node-broken: ") for line in cli("validate", str(path), check=False).stderr.splitlines()
            if line.startswith("error: ")]
    assert said == ["spec.classes[0] (s): podFixed.memory 200Mi must be above overhead_memory 256Mi: "
                    "podFixed covers the guest side (overhead_memory) plus the host side"], said

    before = sum(release.scrape(p["metadata"]["name"]).get(
        ("kata_sizing_webhook_admissions_total", (("result", "denied"),)), 0) for p in release.pods())
    # The Service's endpoints are the Ready replicas; kube-proxy may take a moment after the
    # install to program them (the API server then gets "connection refused").
    refused = poll(lambda: (lambda r: r if "denied the request" in r.stderr else None)(
        cp.kubectl("apply", "-f", str(path), check=False)), 30, "the webhook answers through its Service")
    assert refused.returncode != 0 and cp.get(f"{POLICIES}/node-broken") is None
    assert f'admission webhook "validate-policy.katasizing.dev" denied the request: {said[0]}' in refused.stderr, \
        refused.stderr
    after = sum(release.scrape(p["metadata"]["name"]).get(
        ("kata_sizing_webhook_admissions_total", (("result", "denied"),)), 0) for p in release.pods())
    assert after == before + 1

    valid = copy.deepcopy(POLICY)
    valid["metadata"]["name"] = "node-valid"
    admitted = cp.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(valid), check=False)
    assert admitted.returncode == 0 and "created (server dry run)" in admitted.stdout, admitted.stderr


def test_with_no_replica_running_a_policy_still_takes_everything_but_a_spec_change(
        release: OperatorRelease) -> None:
    """failurePolicy Fail refuses what the webhook cannot review; its matchConditions keep kopf's
    metadata changes (a user's labels, the removal of an older operator's finalizer) away from it,
    so with no replica running a policy can still be labelled, or its finalizer removed."""
    cp = release.cp
    changed = copy.deepcopy(POLICY)
    changed["spec"]["driftPolicy"] = "Report"
    cp.kubectl("scale", "-n", NAMESPACE, f"deployment/{RELEASE}", "--replicas=0")
    try:
        poll(lambda: not release.all_pods(), 60, "no operator pod left")
        refused = cp.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(changed), check=False)
        assert 'failed calling webhook "validate-policy.katasizing.dev"' in refused.stderr, refused.stderr
        cp.kubectl("label", "ksp", NAME, "kata-sizing.test/touched=yes")
        assert policy(cp)["metadata"]["labels"]["kata-sizing.test/touched"] == "yes"
    finally:
        cp.kubectl("scale", "-n", NAMESPACE, f"deployment/{RELEASE}", "--replicas=2")
        release.wait_ready(2)
        cp.kubectl("label", "ksp", NAME, "kata-sizing.test/touched-")
    poll(lambda: cp.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(changed),
                            check=False).returncode == 0, 30, "the webhook answers again")
    wait_policy_ready(cp)


# --- pods of the classes on the kubelet -----------------------------------------------------------


def edge_pod(node: Node, cls: str, namespace: str, name: str | None = None) -> dict:
    """A pod at the edge of the class's envelope: its limits are the class's cpu and memory."""
    envelope = CLASSES[cls]
    return node.pod(name or f"edge-{cls}", namespace=namespace, runtime_class=f"kata-sizing-node-{cls}",
                    limits={"cpu": envelope["cpu"], "memory": envelope["memory"]})


def test_a_pod_at_the_edge_of_every_class_is_charged_what_explain_says(
        release: OperatorRelease, namespace: str, tmp_path: Path) -> None:
    node = release.node
    wait_policy_ready(node.cp)
    bodies = {cls: edge_pod(node, cls, namespace) for cls in CLASSES}
    for body in bodies.values():  # together they fit the node (the counts below fill it)
        node.cp.create(f"/api/v1/namespaces/{namespace}/pods", body)
    for cls, body in bodies.items():
        running = node.wait_pod(body, lambda p: p.get("status", {}).get("phase") == "Running", "Running")
        explained = json.loads(cli("explain", "--pod", str(pod_file(tmp_path, body)), "--policy", str(POLICY_FILE),
                                   "-o", "json").stdout)
        assert explained["class"] == cls and explained["admission"]["allowed"] is True
        assert running["spec"]["overhead"] == explained["podFixed"]
        accounted_bytes = int(explained["accounted"]["memory"].removesuffix("Mi")) * MIB
        accounted_millicores = int(explained["accounted"]["cpu"].removesuffix("m"))
        memory = node.pod_cgroup(running, "memory")
        assert int((memory / "memory.limit_in_bytes").read_text()) == accounted_bytes, cls
        cpu = node.pod_cgroup(running, "cpu")
        period_us = int((cpu / "cpu.cfs_period_us").read_text())
        assert int((cpu / "cpu.cfs_quota_us").read_text()) == accounted_millicores * period_us // 1000, cls


def test_a_pod_over_every_envelope_is_refused_at_admission(release: OperatorRelease, namespace: str,
                                                           tmp_path: Path) -> None:
    node = release.node
    wait_policy_ready(node.cp)
    too_big = node.pod("too-big", namespace=namespace, runtime_class="kata-sizing-node-xl",
                       limits={"cpu": "4", "memory": "16Gi"})
    opted_in = node.pod("too-big-opted-in", namespace=namespace, limits={"cpu": "4", "memory": "16Gi"})
    opted_in["metadata"]["labels"] = {"katasizing.dev/policy": NAME}
    for body in (too_big, opted_in):
        explained = json.loads(cli("explain", "--pod", str(pod_file(tmp_path, body)), "--policy", str(POLICY_FILE),
                                   "-o", "json", check=False).stdout)
        (finding,) = explained["admission"]["findings"]
        refused = create_pod(node, body)
        assert refused.returncode != 0, refused.stdout
        envelope = f"ValidatingAdmissionPolicy '{SHARED_NAMES['envelope']}' with binding 'kata-sizing-{NAME}-envelope'"
        assert envelope in refused.stderr, \
            refused.stderr
        assert finding["message"] in refused.stderr, (finding, refused.stderr)
        assert node.cp.get(node.pod_path(body)) is None


def test_an_opted_in_pod_is_routed_to_its_class_and_scheduled_by_the_scheduler(
        release: OperatorRelease, namespace: str, tmp_path: Path) -> None:
    node = release.node
    wait_policy_ready(node.cp)
    body = node.pod("opted-in", namespace=namespace, limits={"cpu": "200m", "memory": "800Mi"})
    body["metadata"]["labels"] = {"katasizing.dev/policy": NAME}
    body["spec"]["tolerations"] = []  # the class's RuntimeClass brings the node's toleration
    explained = json.loads(cli("explain", "--pod", str(pod_file(tmp_path, body)), "--policy", str(POLICY_FILE),
                               "-o", "json").stdout)
    assert explained["routed"] is True and explained["class"] == "m"
    running = node.run_pod(body)
    assert running["spec"]["runtimeClassName"] == explained["runtimeClass"] == "kata-sizing-node-m"
    assert running["spec"]["overhead"] == explained["podFixed"]
    assert NODE_TOLERATION in running["spec"]["tolerations"]
    scheduled = next(c for c in running["status"]["conditions"] if c["type"] == "PodScheduled")
    assert scheduled["status"] == "True" and running["spec"]["nodeName"] == node.name
    assert any(e.startswith("Normal Scheduled: Successfully assigned") for e in node.events(running).splitlines())


# --- RuntimeClass scheduling and the pod audit ----------------------------------------------------


def scheduling_policy(node_selector: dict, tolerations: list, admission: dict | None = None) -> dict:
    """A one-class policy (handler SCHEDULING_HANDLER) with the scheduling the test gives it."""
    return {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy",
            "metadata": {"name": "node-scheduling"},
            "spec": {"shim": "qemu-runtime-rs", "classes": [{"name": "only", "cpu": "100m", "memory": "256Mi"}],
                     "runtimeClass": {"namePrefix": "kata-sizing-sched", "nodeSelector": node_selector,
                                      "tolerations": tolerations},
                     "nodes": {"selector": {"kata-sizing.test/none": "true"}},
                     **({"admission": admission} if admission else {})}}


@pytest.fixture
def scheduling(release: OperatorRelease) -> Iterator[Callable[[dict], dict]]:
    """Apply the scheduling policy in a shape and wait until its RuntimeClass says so; deleted
    at the end (the operator removes the RuntimeClass)."""
    cp = release.cp

    def apply(body: dict) -> dict:
        cp.apply(body)
        wait_policy_ready(cp, "node-scheduling")
        want = body["spec"]["runtimeClass"]
        return poll(lambda: (lambda rc: rc if rc and rc.get("scheduling", {}).get("nodeSelector") == want["nodeSelector"]
                             and rc["scheduling"].get("tolerations", []) == want["tolerations"] else None)(
            cp.get(f"{RUNTIME_CLASSES}/{SCHEDULING_HANDLER}")), 30, f"RuntimeClass {SCHEDULING_HANDLER} as {want}")
    try:
        yield apply
    finally:
        cp.kubectl("delete", "ksp", "node-scheduling", "--ignore-not-found", "--timeout=60s")
        poll(lambda: cp.get(f"{RUNTIME_CLASSES}/{SCHEDULING_HANDLER}") is None, 90,
             "the RuntimeClass removed (by the garbage collector)")


def test_runtime_class_scheduling_decides_pending_or_running_as_the_policy_says(
        release: OperatorRelease, namespace: str, scheduling) -> None:
    node = release.node

    def pod(name: str) -> dict:
        body = node.pod(name, namespace=namespace, runtime_class=SCHEDULING_HANDLER,
                        limits={"cpu": "100m", "memory": "256Mi"})
        body["spec"]["tolerations"] = []  # only what the RuntimeClass adds
        node.cp.create(f"/api/v1/namespaces/{namespace}/pods", body)
        return body

    labels = {"katacontainers.io/kata-runtime": "true"}
    scheduling(scheduling_policy({"kata-sizing.test/pool": "elsewhere"}, [NODE_TOLERATION]))
    elsewhere = node.wait_pod(pod("elsewhere"), unschedulable, "refused by the scheduler")
    assert "didn't match Pod's node affinity/selector" in why_unschedulable(elsewhere)

    scheduling(scheduling_policy(labels, []))
    untolerated = node.wait_pod(pod("untolerated"), unschedulable, "refused by the scheduler")
    assert "1 node(s) had untolerated taint(s)" in why_unschedulable(untolerated)

    scheduling(scheduling_policy(labels, [NODE_TOLERATION]))
    running = node.wait_pod(pod("placed"), lambda p: p.get("status", {}).get("phase") == "Running", "Running")
    assert running["spec"]["nodeSelector"] == labels and running["spec"]["nodeName"] == node.name
    # The pods admitted before the policy changed keep the scheduling they were given.
    for name in ("elsewhere", "untolerated"):
        assert node.cp.read(f"/api/v1/namespaces/{namespace}/pods/{name}")["status"]["phase"] == "Pending"


def test_the_pod_audit_in_status_lists_the_running_pod_over_its_envelope(
        release: OperatorRelease, namespace: str, scheduling) -> None:
    node, cp = release.node, release.cp
    scheduling(scheduling_policy({"katacontainers.io/kata-runtime": "true"}, [NODE_TOLERATION],
                                 admission={"envelopeExceeded": "Audit"}))
    over = node.pod("over", namespace=namespace, runtime_class=SCHEDULING_HANDLER,
                    limits={"cpu": "200m", "memory": "512Mi"})
    fits = node.pod("fits", namespace=namespace, runtime_class=SCHEDULING_HANDLER,
                    limits={"cpu": "100m", "memory": "256Mi"})
    # Audit: the API server admits it (the audit log carries the finding) and the kubelet runs it.
    created = poll(lambda: (lambda r: r if r.returncode == 0 else None)(create_pod(node, over)), 20,
                   "the pod over its envelope is admitted under Audit")
    assert "Warning" not in created.stderr
    node.wait_pod(over, lambda p: p.get("status", {}).get("phase") == "Running", "Running")
    node.run_pod(fits)

    def audit() -> dict:
        return (policy(cp, "node-scheduling").get("status") or {}).get("podAudit") or {}
    listed = poll(lambda: audit().get("listed"), 30, lambda: f"status.podAudit: {audit()}")
    assert [(r["pod"], r["rule"], r["action"], r["runtimeClass"]) for r in listed] == [
        (f"{namespace}/over", "pod-envelope-exceeded", "Audit", SCHEDULING_HANDLER)]
    assert "200m" in listed[0]["message"] and "512Mi" in listed[0]["message"], listed[0]["message"]

    cp.delete(node.pod_path(over))
    poll(lambda: not audit().get("listed"), 30, lambda: f"status.podAudit after the pod went: {audit()}")


# --- node guidance made real ----------------------------------------------------------------------


def test_the_node_is_as_guidance_says_and_admits_guidances_vms_per_class(
        release: OperatorRelease, namespace: str) -> None:
    node, cp = release.node, release.cp
    wait_policy_ready(cp)
    before_start = rendered_guidance()  # what `kata-sizing render` gave before the node started
    release.wait_ready(2)
    operator_pods = release.pods()
    infra_mib = sum(int(p["spec"]["containers"][0]["resources"]["requests"]["memory"].removesuffix("Mi"))
                    for p in operator_pods)
    # The operator's guidance, computed from the real Node and its pods (the two replicas are
    # the node's only non-Kata pods).
    seen = poll(lambda: (lambda g: g if g["infraPodMemory"] == f"{infra_mib}Mi" else None)(guidance(cp)), 30,
                lambda: f"guidance with {infra_mib}Mi of infra pods: {guidance(cp)}")
    assert seen["kubeletConfiguration"] == before_start["kubeletConfiguration"]
    assert seen["capacity"] == before_start["capacity"] == {
        k: node.cp.read(f"/api/v1/nodes/{node.name}")["status"]["capacity"][k] for k in ("memory", "cpu")}
    assert seen["allocatable"] == {"memory": before_start["allocatable"]["memory"],
                                   "observedMemory": node.allocatable()["memory"]}
    assert node.allocatable()["memory"] == before_start["allocatable"]["memory"]
    assert seen["warnings"] == [], seen["warnings"]

    # Pods at the edge of each class, one after the other, until the scheduler refuses one.
    for cls, fit in seen["vmsPerClass"].items():
        binding = "cpu" if fit["byCpu"] == fit["fit"] else "memory"
        assert fit["fit"] == min(fit["byCpu"], fit["byAllocatable"], fit["byDevShm"])
        admitted = 0
        for i in range(fit["fit"] + 3):
            body = edge_pod(node, cls, namespace, name=f"{cls}-{i}")
            node.cp.create(f"/api/v1/namespaces/{namespace}/pods", body)
            placed = node.wait_pod(body, lambda p: p.get("status", {}).get("phase") == "Running" or unschedulable(p),
                                   "Running or refused by the scheduler")
            if unschedulable(placed):
                assert f"Insufficient {binding}" in why_unschedulable(placed), (cls, fit, placed["status"])
                break
            admitted += 1
        assert admitted == fit["fit"], f"class {cls}: the node admitted {admitted}, guidance says {fit}"
        pods = f"/api/v1/namespaces/{namespace}/pods"
        cp.request("DELETE", pods)
        poll(lambda: not cp.request("GET", pods)["items"], 60, f"the pods of class {cls} gone")


# --- rolling the Deployment and handing over --------------------------------------------------------


def quiet(release: OperatorRelease, seconds: float = 4) -> None:
    """No write by the operator for `seconds` (the Lease and events aside)."""
    def settled() -> bool:
        mark = release.cp.audit_offset()
        time.sleep(seconds)
        return not release.writes_per_object(mark)
    poll(settled, 60, "the operator stops writing")


RESOURCES = {"RuntimeClass": "runtimeclasses", "ConfigMap": "configmaps",
             "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
             "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
             "MutatingAdmissionPolicy": "mutatingadmissionpolicies",
             "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings"}


def rendered_objects(path: Path) -> dict[tuple[str, str, str], dict]:
    """What `kata-sizing render` prints for a policy file, by (resource, namespace, name)."""
    return {(RESOURCES[d["kind"]], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
            for d in rendered(path)}


def test_helm_upgrade_rolls_the_deployment_and_each_object_is_written_once_if_it_changed(
        release: OperatorRelease, tmp_path: Path) -> None:
    """A policy change lands while `helm upgrade` rolls the Deployment (the Lease passes from an
    old replica to a new one): every object whose rendered form changed is written once, by one
    replica, and no other object at all."""
    cp = release.cp
    wait_policy_ready(cp)
    release.wait_ready(2)
    quiet(release)
    before_pods = {p["metadata"]["name"] for p in release.pods()}
    before = policy(cp)
    changed = copy.deepcopy(POLICY)
    changed["spec"]["classes"][0]["memory"] = "900Mi"  # class s: its podFixed (334Mi), drop-in and envelope
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(changed))
    old, new = rendered_objects(POLICY_FILE), rendered_objects(path)
    assert old.keys() == new.keys()
    to_write = {key for key in new if new[key] != old[key]}
    assert ("runtimeclasses", "", "kata-sizing-node-s") in to_write and len(to_write) < len(new)

    mark = cp.audit_offset()
    upgrade = release.helm_started("upgrade", release.values(podAnnotations={"kata-sizing.test/rolled": "1"}))
    try:
        time.sleep(3)  # the surge pod starts; the old leader still leads
        cp.apply(changed)
        assert upgrade.wait(240) == 0, upgrade.stdout and upgrade.stdout.read()
    finally:
        if upgrade.poll() is None:
            upgrade.kill()
            upgrade.wait()
        if upgrade.stdout is not None:
            upgrade.stdout.close()
    after = release.wait_ready(2)
    assert not before_pods & {p["metadata"]["name"] for p in after}, "the Deployment did not roll"
    wait_policy_ready(cp)
    quiet(release)
    writes = release.writes_per_object(mark)
    # The node guidance aside: its input, the node's non-Kata pods, changed with the surge pod.
    writes.pop(("configmaps", "kata-sizing", GUIDANCE_CM), None)
    managed = {k: n for k, n in writes.items() if not k[0].startswith("katasizingpolicies")}
    assert {k: n for k, n in managed.items() if n > 1} == {}, f"written more than once across the roll: {writes}"
    assert set(managed) == to_write, writes
    # The status: written once for the policy change. Any other write may change only what the
    # node's pods decide, status.nodes (as the guidance ConfigMap above) and status.measurement
    # (the measurement timer's samples of the pods running): before the change (the old leader
    # sees the surge pod start) against the status it replaces, after it (the new leader's, or
    # the old one's) against the policy change's. A status write is a merge patch: the fields it
    # carries are compared (the drift counters are patched on their own).
    statuses = [e.request["status"] if isinstance(e.request, dict) else e.request for e in release.requests(mark)
                if e.resource == "katasizingpolicies/status" and e.name == NAME and e.verb in WRITE_VERBS]
    assert len(statuses) == writes[("katasizingpolicies/status", "", NAME)] >= 1, statuses
    generation = policy(cp)["metadata"]["generation"]
    assert generation == before["metadata"]["generation"] + 1
    generations = [status["observedGeneration"] for status in statuses]
    assert generations == sorted(generations) and generation in generations, generations
    first_new = generations.index(generation)
    for reference, others in ((before["status"], statuses[:first_new]),
                              (statuses[first_new], statuses[first_new + 1:])):
        for status in others:
            differ = sorted(k for k in status if k not in ("nodes", "measurement") and reference.get(k) != status[k])
            assert differ == [], f"a status write for no policy change changed {differ}: {status}"
    # Neither replica writes anything on the policy but its status (kopf keeps no annotation,
    # progress or finalizer on it any more).
    assert [(e.verb, e.source_ips) for e in release.requests(mark)
            if e.resource == "katasizingpolicies" and e.verb in WRITE_VERBS] == []
    assert cp.read(f"{RUNTIME_CLASSES}/kata-sizing-node-s")["overhead"] == new[
        ("runtimeclasses", "", "kata-sizing-node-s")]["overhead"]
    assert release.leader() in {p["metadata"]["name"] for p in after}
    cp.apply(POLICY)
    wait_policy_ready(cp)


def test_deleting_the_leader_hands_over_within_the_lease_and_both_replicas_say_the_truth(
        release: OperatorRelease) -> None:
    cp = release.cp
    body = wait_policy_ready(cp)
    release.wait_ready(2)
    quiet(release)
    ready_since = conditions(cp)["Ready"]["lastTransitionTime"]
    old = release.leader()
    duration_s = release.lease()["leaseDurationSeconds"]
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    mark = cp.audit_offset()
    began = time.monotonic()
    cp.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{old}")
    new = poll(lambda: (lambda holder: holder if holder and holder != old else None)(release.leader()), duration_s + 5,
               f"the Lease passes from {old} to the other replica", interval=0.1)
    handover_s = time.monotonic() - began
    assert handover_s <= duration_s, f"handover took {handover_s:.1f}s, the lease is {duration_s}s"
    pods = [p["metadata"]["name"] for p in release.wait_ready(2)]
    assert new in pods and old not in pods
    quiet(release)

    # Status: unchanged and current, no flip of Ready.
    assert conditions(cp)["Ready"]["status"] == "True"
    assert conditions(cp)["Ready"]["lastTransitionTime"] == ready_since
    assert conditions(cp)["Ready"]["observedGeneration"] == policy(cp)["metadata"]["generation"] == \
        body["metadata"]["generation"]
    # Events: nothing false said about the policy by the new leader.
    said = [(e["type"], e["reason"], e["message"]) for e in events(cp, since=since)]
    assert not [s for s in said if s[0] == "Warning" or s[1].startswith("Drift")], said
    # Writes: none but the guidance's (its input, the node's pods, changed with the new pod).
    writes = release.writes_per_object(mark)
    assert {k: n for k, n in writes.items() if k != ("configmaps", "kata-sizing", GUIDANCE_CM)} == {}, writes
    # Metrics: both replicas' caches hold what the API server holds; the new leader exports the
    # policy's conditions and has reconciled without a write or an error, the other replica
    # exports no policy gauge and has reconciled nothing.
    want = cached_objects(cp)
    for pod in pods:
        # The new leader's first pass may still be running when its caches are complete: its
        # gauges are waited for (within seconds), the follower's absence of them is not.
        def scraped(pod=pod) -> dict | None:
            samples = release.scrape(pod)
            led = pod != new or ("Ready", "True") in policy_gauges(samples)
            return samples if informer_objects(samples) == want and led else None
        samples = poll(scraped, 20, lambda: f"{pod}'s caches hold {want}: {informer_objects(release.scrape(pod))}"
                                            + (", and its policy gauges say Ready" if pod == new else "")
                                            + "; its log ends:\n" + "\n".join(release.log(pod).splitlines()[-40:]))
        gauges = policy_gauges(samples)
        assert total(samples, "kata_sizing_api_errors_total", status="403") == 0
        assert total(samples, "kata_sizing_drift_detected_total") == 0
        if pod == new:
            assert gauges[("Ready", "True")] == 1 and gauges.get(("Ready", "False"), 0) == 0, gauges
            assert total(samples, "kata_sizing_reconciles_total") >= 1
            assert total(samples, "kata_sizing_reconciles_total") == total(
                samples, "kata_sizing_reconciles_total", result="ok"), samples
            # What it wrote, it wrote to the guidance ConfigMap (read from the audit log after the
            # scrape, so every write the counter holds is in it).
            after = release.writes_per_object(mark)
            assert {k: n for k, n in after.items() if k != ("configmaps", "kata-sizing", GUIDANCE_CM)} == {}, after
            assert total(samples, "kata_sizing_reconcile_writes_total") <= after[("configmaps", "kata-sizing", GUIDANCE_CM)]
        else:
            assert gauges == {}, f"{pod}, not leading, exports {gauges}"
            assert total(samples, "kata_sizing_reconciles_total") == 0


def test_the_charts_rbac_was_enough_for_everything_the_operator_did(release: OperatorRelease) -> None:
    refused = release.forbidden(release.audit_start)
    assert refused == [], f"the API server refused the operator's ServiceAccount (403): {refused}"
    assert any(e.user_agent.startswith("kata-sizing/") for e in release.requests(release.audit_start))
