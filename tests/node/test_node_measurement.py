"""The measurement on the real node (tests/support/realnode.py: kubelet, containerd, runc standing in
for Kata), with the operator as it is installed: its ServiceAccount bound to the shipped
ClusterRole, reading each Summary on the kubelet's own port (`--kubelet-access direct`).

- The kubelet answers the operator's ServiceAccount on /stats/summary (it asks the API server:
  get nodes/stats, which the ClusterRole grants) and refuses it the rest of its API; it refuses
  a ServiceAccount without that grant.
- Pods of each class run; a host process moved into each pod's cgroup holding N MiB stands for
  the shim and the VMM, and status.measurement shows each class's overhead as N within
  TOLERANCE_MIB; `survey` reads the same pods through the API server, `calibrate --policy` refits
  the policy from the rows and its proposed podFixed covers every measured pod, `render
  --proposal` prints the diff, and the operator proposes the same from a survey in a ConfigMap.
- A stand-in that grows near its pod cgroup's limit raises the HeadroomLow warning within one
  interval of the kubelet reporting it, and the warning clears when it shrinks.
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kata_sizing.controller.kubelet import DirectKubelets, KubeletError, KubeletOptions
from tests.support.operator_helpers import wait_for as poll
from tests.support.policies import explicit_classes_policy
from tests.support.realcluster import OPERATOR_USER, ROOT, ControlPlane, wait_observed
from tests.support.realnode import NODE_TOLERATION, POD_CONTROLLERS, PODTOOL, Node

pytestmark = pytest.mark.node

MIB = 2**20
INTERVAL_S = 15
# What the pod cgroup holds besides the stand-in's N MiB and the container: the pause
# process, and the stand-in's own runtime (podtool is a static Go binary). Seen here: the
# kubelet and the operator's status both N + 4.0 to 4.6 MiB.
TOLERANCE_MIB = 8
POLICY = "node"  # its RuntimeClasses kata-node-<class> are handlers the node maps to runc
CLASSES = [{"name": "s", "cpu": "1", "memory": "512Mi"}, {"name": "m", "cpu": "2", "memory": "2Gi"}]


@pytest.fixture
def namespace(real_node: Node, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"measure-{request.node.name[5:30].replace('_', '-').strip('-')}"
    real_node.namespace(name)
    try:
        yield name
    finally:
        real_node.delete_namespace(name)


def policy(**spec) -> dict:
    body = explicit_classes_policy(POLICY, classes=CLASSES)
    body["spec"]["runtimeClass"]["tolerations"] = [NODE_TOLERATION]
    body["spec"]["measurement"] = {"intervalSeconds": INTERVAL_S, "windowSeconds": 600}
    body["spec"].update(spec)
    return body


def pod_fixed_mib(cp: ControlPlane, class_name: str, field: str = "podFixed") -> int:
    for found in cp.read(f"/apis/katasizing.dev/v1alpha1/katasizingpolicies/{POLICY}")["status"]["classes"]:
        if found["name"] == class_name:
            return int((found[field]["memory"] if field == "podFixed" else found[field]).removesuffix("Mi"))
    raise AssertionError(class_name)


def measurement(cp: ControlPlane) -> dict:
    body = cp.get(f"/apis/katasizing.dev/v1alpha1/katasizingpolicies/{POLICY}") or {}
    return (body.get("status") or {}).get("measurement") or {}


def measured_class(cp: ControlPlane, name: str) -> dict:
    return next((c for c in measurement(cp).get("classes", []) if c["name"] == name), {})


class StandIn:
    """A host process in a pod's cgroup (every controller), holding what its file says: the
    shim and VMM of a Kata sandbox sit there with sandbox_cgroup_only. It joins before it
    allocates (cgroup v1 leaves earlier charges where they were made)."""

    def __init__(self, real_node: Node, pod: dict, mib: int, workdir: Path):
        self.file = workdir / f"hold-{pod['metadata']['uid']}"
        self.file.write_text(str(mib))
        procs = [real_node.pod_cgroup(pod, controller) / "cgroup.procs" for controller in POD_CONTROLLERS]

        def join() -> None:
            for path in procs:
                path.write_text("0")
        self.process = subprocess.Popen([str(PODTOOL), "hold", "--file", str(self.file)], stdout=subprocess.PIPE,
                                        text=True, preexec_fn=join)
        assert self.process.stdout is not None and self.process.stdout.readline() == f"holding {mib} MiB\n"

    def hold(self, mib: int) -> None:
        self.file.write_text(str(mib))

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def pod_entry(real_node: Node, pod: dict) -> dict | None:
    for entry in real_node.stats_summary().get("pods", []):
        if entry["podRef"]["uid"] == pod["metadata"]["uid"]:
            return entry
    return None


def outside_mib(entry: dict) -> float:
    return (entry["memory"]["workingSetBytes"] - sum(c["memory"]["workingSetBytes"] for c in entry["containers"])) / MIB


def kubelet_port(real_node: Node) -> int:
    return real_node.cp.read(f"/api/v1/nodes/{real_node.name}")["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]


class Credentials:
    def __init__(self, ca: Path, token: str):
        self.ssl_ca_cert, self.ca_cert_data, self.cert_file, self.key_file = str(ca), None, None, None
        self.token = token

    async def get_api_key_with_prefix(self, identifier: str) -> str:
        return f"Bearer {self.token}"


def read_summary_as(real_node: Node, token: str) -> dict:
    async def read() -> dict:
        kubelets = DirectKubelets(Credentials(real_node.cp.state / "ca.crt", token), KubeletOptions())
        try:
            summary = await kubelets.read(real_node.name, real_node.ip, kubelet_port(real_node))
            assert isinstance(summary, dict), summary
            return summary
        finally:
            await kubelets.close()
    return asyncio.run(read())


def test_the_kubelet_reads_stats_to_the_operator_and_nothing_more(real_node: Node, namespace: str) -> None:
    cp = real_node.cp
    operator_token = (cp.state / "operator.token").read_text().strip()
    summary = read_summary_as(real_node, operator_token)
    assert summary["node"]["nodeName"] == real_node.name
    # The rest of the kubelet's API (here its pod list, nodes/pods or nodes/proxy) is refused.
    context = ssl.create_default_context(cafile=str(cp.state / "ca.crt"))
    request = urllib.request.Request(f"https://{real_node.ip}:{kubelet_port(real_node)}/pods",
                                     headers={"Authorization": f"Bearer {operator_token}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=context, timeout=10)
    assert refused.value.code == 403
    assert f"user={OPERATOR_USER}" in refused.value.read().decode()
    # A ServiceAccount without get nodes/stats is refused /stats/summary by the kubelet itself.
    cp.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "nobody"}})
    token = cp.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/nobody/token",
                      {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                       "spec": {"expirationSeconds": 600}})["status"]["token"]
    with pytest.raises(KubeletError) as caught:
        read_summary_as(real_node, token)
    assert caught.value.status == 403
    assert "the operator needs get nodes/stats" in str(caught.value)
    assert f"user=system:serviceaccount:{namespace}:nobody" in str(caught.value)
    assert "subresource(s)=[stats]" in str(caught.value)


def run_pods(real_node: Node, namespace: str, shapes: list[tuple[str, str, int]],
             workdir: Path) -> tuple[list[dict], list[StandIn]]:
    """Pods of the policy's classes, each container holding 64 MiB, each with a stand-in of N MiB
    joined as soon as the pod runs (within the 15 s after its start in which the operator does
    not subtract yet): (class, memory limit, N)."""
    pods, stand_ins = [], []
    try:
        for index, (class_name, limit, mib) in enumerate(shapes):
            body = real_node.pod(f"{class_name}-{index}", namespace=namespace,
                                 runtime_class=f"kata-{POLICY}-{class_name}",
                                 command=["/podtool", "hold", "64"], limits={"cpu": "50m", "memory": limit})
            pods.append(real_node.run_pod(body))
            stand_ins.append(StandIn(real_node, pods[-1], mib, workdir))
    except BaseException:
        for stand_in in stand_ins:
            stand_in.stop()
        raise
    return pods, stand_ins


def test_each_class_measures_its_stand_in_and_survey_calibrate_covers_every_pod(
        real_node: Node, namespace: str, real_operator, tmp_path: Path) -> None:
    cp = real_node.cp
    real_operator.start()
    cp.apply(policy())
    wait_observed(cp, POLICY, timeout=60, Ready="True")
    # Two pods per class at different limits (two VM sizes to fit a ratio), each with its stand-in.
    shapes = [("s", "128Mi", 40), ("s", "256Mi", 56), ("m", "1Gi", 120), ("m", "1536Mi", 160)]
    pods, stand_ins = run_pods(real_node, namespace, shapes, tmp_path)
    try:
        # What the kubelet itself says, once it has refreshed every pod's figures.
        entries = poll(lambda: (lambda found: found if all(e and outside_mib(e) >= mib for e, (_, _, mib) in
                                                           zip(found, shapes)) else None)(
            [pod_entry(real_node, p) for p in pods]), 60, "the kubelet reports each stand-in", interval=1)
        for entry, (_, _, mib) in zip(entries, shapes):
            assert entry is not None and mib <= outside_mib(entry) < mib + TOLERANCE_MIB, (mib, entry)

        # The operator's status: each class's largest overhead is its largest stand-in's N.
        def classes_measured() -> dict | None:
            found = {name: measured_class(cp, name) for name in ("s", "m")}
            done = all(found[name].get("overheadMaxBytes", 0) >= 160 * MIB * (name == "m") + 56 * MIB * (name == "s")
                       and found[name].get("podsMeasured") == 2 for name in found)
            return found if done else None
        found = poll(classes_measured, 4 * INTERVAL_S, lambda: json.dumps(measurement(cp)), interval=1)
        for name, smallest, largest in (("s", 40, 56), ("m", 120, 160)):
            measured = found[name]["overheadMaxBytes"] / MIB
            assert largest <= measured < largest + TOLERANCE_MIB, (name, measured)
            # Every reading counted is one of the two stand-ins (the sketch: within 0.5%).
            for quantile in ("overheadP50Bytes", "overheadP99Bytes"):
                value = found[name][quantile] / MIB
                assert smallest * 0.995 <= value < largest + TOLERANCE_MIB, (name, quantile, value)
            assert found[name]["overheadMaxPod"] == f"{namespace}/{name}-{1 if name == 's' else 3}"
            assert found[name]["minHeadroomBytes"] > 0 and found[name]["podsWithoutLimit"] == 0
        assert measurement(cp)["nodes"] == 1 and measurement(cp)["nodesSkipped"] == 0

        # survey -> calibrate -> a proposal that covers every measured pod.
        policy_file = tmp_path / "policy.yaml"
        policy_file.write_text(yaml.safe_dump(policy()))
        survey = cli(cp, "survey", policy_file)
        assert survey.returncode == 0, survey.stderr
        csv_path = tmp_path / "survey.csv"
        csv_path.write_text(survey.stdout)
        from kata_sizing.core.calibrate import parse_samples_csv
        parsed = parse_samples_csv(survey.stdout)
        assert all(row.pod and row.overhead_used_mib is not None and row.pod_working_set_bytes is not None
                   for row in parsed), parsed  # a live survey's rows say the pod and what it measured
        rows = {row.pod: row for row in parsed if row.pod}
        assert sorted(rows) == sorted(f"{namespace}/{p['metadata']['name']}" for p in pods)
        for pod, (_, _, mib) in zip(pods, shapes):
            row = rows[f"{namespace}/{pod['metadata']['name']}"]
            assert mib <= float(row.overhead_used_mib or 0) < mib + TOLERANCE_MIB
        calibrated = cli(cp, "calibrate", csv_path, "--policy", policy_file, "-o", "json")
        assert calibrated.returncode == 0, calibrated.stderr
        report = json.loads(calibrated.stdout)
        proposed = {c["name"]: int(c["podFixed"]["memory"].removesuffix("Mi")) for c in report["classes"]}
        for row in rows.values():  # checked here from the rows themselves, not only by calibrate
            limit_bytes = math.ceil(row.container_limit_mib * MIB) + proposed[row.class_name] * MIB
            assert (row.pod_working_set_bytes or 0) <= limit_bytes, (row.pod, row.pod_working_set_bytes, limit_bytes)
        diff = cli(cp, "render", policy_file, "--proposal", csv_path)
        assert diff.returncode == 0, diff.stderr
        assert f"--- {POLICY}-kata-deploy-values/values.yaml (now)" in diff.stdout

        # The same survey in a ConfigMap: the operator proposes the same, and applies nothing.
        cp.create("/api/v1/namespaces/kata-sizing/configmaps", {
            "metadata": {"name": "node-survey"}, "data": {"survey.csv": survey.stdout}})
        before = {c["name"]: c["podFixed"] for c in cp.read(
            f"/apis/katasizing.dev/v1alpha1/katasizingpolicies/{POLICY}")["status"]["classes"]}
        cp.apply(policy(overhead={"survey": {"configMap": "node-survey"}}))
        proposal = poll(lambda: (cp.read(f"/apis/katasizing.dev/v1alpha1/katasizingpolicies/{POLICY}")["status"]
                                 .get("proposal")), 30, "status.proposal")
        assert proposal["overhead"] == report["overhead"]
        assert {c["name"]: c["podFixed"]["memory"] for c in proposal["classes"]} == \
            {c["name"]: c["podFixed"]["memory"] for c in report["classes"]}
        assert {c["name"]: c["podFixed"] for c in cp.read(
            f"/apis/katasizing.dev/v1alpha1/katasizingpolicies/{POLICY}")["status"]["classes"]} == before
        cp.delete("/api/v1/namespaces/kata-sizing/configmaps/node-survey")
    finally:
        for stand_in in stand_ins:
            stand_in.stop()


def cli(cp: ControlPlane, *args) -> subprocess.CompletedProcess:
    """`kata-sizing` as an administrator runs it (kubectl's admin kubeconfig: nodes/proxy)."""
    return subprocess.run([sys.executable, "-m", "kata_sizing.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=120, env={"KUBECONFIG": str(cp.admin_kubeconfig), "PATH": "/usr/bin:/bin"},
                          cwd=ROOT)


def events(cp: ControlPlane, reason: str, namespace: str) -> list[str]:
    """The policy's events of this reason about pods of this test's namespace (the events of
    earlier tests' pods stay in `default` for an hour)."""
    items = cp.request("GET", f"/api/v1/namespaces/default/events?fieldSelector=reason%3D{reason}")["items"]
    return [e["message"] for e in sorted(items, key=lambda e: e["metadata"]["creationTimestamp"])
            if (e.get("involvedObject") or {}).get("name") == POLICY
            and e.get("message", "").startswith(f"pod {namespace}/")]


def test_a_stand_in_near_its_cgroup_limit_raises_the_warning_within_one_interval_and_it_clears(
        real_node: Node, namespace: str, real_operator, tmp_path: Path) -> None:
    cp = real_node.cp
    real_operator.start()
    # The line is a share of what podFixed holds beyond the guest budget (90 MiB here: the 256 MiB fallback
    # beyond the 216 MiB guest budget, and the 50 MiB host side): at 40% (36 MiB) the stand-in, grown to
    # half the line under the cgroup limit, stays 18 MiB short of an OOM kill.
    cp.apply(policy(measurement={"intervalSeconds": INTERVAL_S, "windowSeconds": 600, "headroomWarning": "40%"}))
    wait_observed(cp, POLICY, timeout=60, Ready="True")
    pod_fixed = pod_fixed_mib(cp, "s")
    threshold_mib = (pod_fixed - pod_fixed_mib(cp, "s", "overheadMemory")) * 0.4
    [pod], [stand_in] = run_pods(real_node, namespace, [("s", "256Mi", 32)], tmp_path)
    try:
        entry = poll(lambda: (lambda e: e if e and outside_mib(e) >= 32 else None)(pod_entry(real_node, pod)), 60,
                     "the kubelet reports the stand-in", interval=1)
        poll(lambda: measured_class(cp, "s").get("samples"), 3 * INTERVAL_S, "a reading", interval=1)
        assert events(cp, "HeadroomLow", namespace) == []
        # Grow until half the threshold is left under the cgroup limit (256Mi + podFixed).
        headroom_mib = (256 + pod_fixed) - entry["memory"]["workingSetBytes"] / MIB
        stand_in.hold(int(32 + headroom_mib - threshold_mib / 2))

        def kubelet_sees(low: bool) -> bool:
            found = pod_entry(real_node, pod)
            assert found is not None, "the kubelet reports no such pod"
            headroom = (256 + pod_fixed) - found["memory"]["workingSetBytes"] / MIB
            return (headroom < threshold_mib) == low
        poll(lambda: kubelet_sees(True), 60, "the kubelet reports the pod under its threshold", interval=0.5)
        seen = time.monotonic()
        warned = poll(lambda: events(cp, "HeadroomLow", namespace), INTERVAL_S + 5, "HeadroomLow within one interval",
                      interval=0.5)
        assert time.monotonic() - seen <= INTERVAL_S + 5
        assert warned[0].startswith(f"pod {namespace}/s-0 (class s) on node {real_node.name}: working set ")
        assert warned[0].endswith(f"under {threshold_mib:.1f}Mi (40% of podFixed.memory beyond the guest budget): its "
                                  "VMM is close to an OOM kill")
        listed = poll(lambda: measurement(cp).get("underThreshold"), 10, "status.measurement.underThreshold")
        assert [p["pod"] for p in listed] == [f"{namespace}/s-0"]

        stand_in.hold(8)
        poll(lambda: kubelet_sees(False), 60, "the kubelet reports the pod above its threshold again", interval=0.5)
        seen = time.monotonic()
        cleared = poll(lambda: events(cp, "HeadroomRecovered", namespace), INTERVAL_S + 5, "HeadroomRecovered", interval=0.5)
        assert time.monotonic() - seen <= INTERVAL_S + 5
        assert cleared == [f"pod {namespace}/s-0 (class s) on node {real_node.name}: headroom no longer under "
                           f"{threshold_mib:.1f}Mi (40%)"]
        poll(lambda: measurement(cp).get("underThreshold") == [], 10, "the list emptied")
    finally:
        stand_in.stop()
